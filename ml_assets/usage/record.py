"""What ``ml-assets usage`` counts: one piece of work (a training, a tuning trial, a scoring run) and
what it held, and the team a run belongs to by its tags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ml_assets.pipeline.jobs import TEAM_TAG
from ml_assets.records.base import unwrap

WORK = ("training", "trial", "scoring")
"""The kinds of work, in the order they are reported."""
DECISIONS = ("full", "fine_tune", "skip")
"""A training's decision (ml_assets.training.decision), in the order they are reported: a record
from before decisions was a full training; a skipped partition trained nothing."""


def team_of(tags: Mapping[str, str], default: str) -> str:
    """The team a run's tags name; ``default`` (the model's team in its spec now) for a run launched
    without its job's tags (``dagster asset materialize``) or from before teams were tagged."""
    return tags.get(TEAM_TAG) or default


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """What a skipped partition's trained_checkpoint observation says it cost (nothing: a registered
    version already held the result; ml_assets.training.launch.skip_metadata)."""

    cpu_rank_seconds: float
    gpu_rank_seconds: float
    wall_seconds: float
    samples_processed: int

    @classmethod
    def from_observation(cls, metadata: Mapping[str, Any]) -> Skipped | None:
        """The skip an observation records, or None for an observation that records no skip."""
        values = {name: unwrap(value) for name, value in metadata.items()}
        if values.get("training_decision") != "skip":
            return None
        return cls(cpu_rank_seconds=float(values.get("cpu_rank_seconds") or 0.0),
                   gpu_rank_seconds=float(values.get("gpu_rank_seconds") or 0.0),
                   wall_seconds=float(values.get("wall_seconds") or 0.0),
                   samples_processed=int(values.get("samples_processed") or 0))


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
    recorded, a skipped training when its skip was, a trial when its torchrun ended."""
    cpu_rank_seconds: float | None
    gpu_rank_seconds: float | None
    wall_seconds: float | None
    decision: str | None = None
    """A training's decision: full, fine_tune or skip (DECISIONS); None for a trial or a scoring run."""
    samples_processed: int | None = None
    """A training's rows stepped through, summed over ranks and epochs (0 for a skip); None where
    not measured (a trial, a scoring run, a training recorded before it was)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
