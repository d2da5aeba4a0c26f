"""What ``ml-assets usage`` counts: one piece of work (a training, a tuning trial, a scoring run) and
what it held, and the team a run belongs to by its tags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ml_assets.pipeline.jobs import TEAM_TAG

WORK = ("training", "trial", "scoring")
"""The kinds of work, in the order they are reported."""


def team_of(tags: Mapping[str, str], default: str) -> str:
    """The team a run's tags name; ``default`` (the model's team in its spec now) for a run launched
    without its job's tags (``dagster asset materialize``) or from before teams were tagged."""
    return tags.get(TEAM_TAG) or default


@dataclass(frozen=True, kw_only=True)
class Spent:
    """One piece of work and what it held. The seconds are None for work whose record is from before
    they were measured: it is counted, without seconds."""

    team: str
    model: str
    work: str
    """training, trial or scoring."""
    ref: str
    """What it is: the Dagster run id (a training, a scoring run), or ``<study>#<trial number>``."""
    partition: str
    """The day it was for (a training's, a scoring run's); empty for a trial."""
    finished: str
    """ISO time (UTC) it finished: a training or a scoring run when its checkpoint or predictions were
    recorded, a trial when its torchrun ended."""
    cpu_rank_seconds: float | None
    gpu_rank_seconds: float | None
    wall_seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
