"""What hyperparameters tells training: an Optuna study's outcome."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self

from ml_assets.records.base import Record, field
from ml_assets.trainer.result import rank_seconds

COMPUTE_ATTR = "compute"
"""The Optuna user attribute a trial's worker records its ``TrialCompute`` in."""
FINISHED_STATES = ("COMPLETE", "PRUNED", "FAIL")


@dataclass(frozen=True, kw_only=True)
class TrialCompute:
    """What one trial held: its torchrun's ranks, from the start of torchrun to its exit (or to
    its pruning), on the device its trainer reported; measured by the worker that ran it."""

    run_id: str
    """The Dagster run whose worker ran the trial."""
    device: str
    ranks: int
    wall_seconds: float
    cpu_rank_seconds: float
    gpu_rank_seconds: float
    finished: str
    """ISO time (UTC) the trial's torchrun ended."""

    @classmethod
    def measured(cls, run_id: str, device: str, ranks: int, wall_seconds: float) -> Self:
        cpu, gpu = rank_seconds(device, ranks, wall_seconds)
        return cls(run_id=run_id, device=device, ranks=ranks, wall_seconds=round(wall_seconds, 3),
                   cpu_rank_seconds=cpu, gpu_rank_seconds=gpu,
                   finished=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    def as_attr(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class SpentTrial:
    """A finished trial as the study's record lists it: its number, state, when it finished and what
    it held (None for a trial from before it was measured, or whose worker died)."""

    number: int
    state: str
    finished: str | None
    """ISO time (UTC) the trial finished."""
    compute: TrialCompute | None

    def as_entry(self) -> dict[str, Any]:
        """Its keys in a record's ``trials`` entry."""
        return {"finished": self.finished, COMPUTE_ATTR: self.compute.as_attr() if self.compute else None}

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> Self:
        compute = entry.get(COMPUTE_ATTR)
        return cls(number=int(entry["trial"]), state=str(entry["state"]), finished=entry.get("finished"),
                   compute=TrialCompute(**compute) if compute else None)


def run_totals(trials: Sequence[SpentTrial], run_id: str) -> dict[str, Any]:
    """TunedRecord's per-run fields: how many trials ``run_id`` ran and their seconds added up."""
    mine = [t.compute for t in trials if t.compute is not None and t.compute.run_id == run_id]
    return {"trials_run": len(mine), **{name: round(sum(getattr(c, name) for c in mine), 3)
                                        for name in ("wall_seconds", "cpu_rank_seconds", "gpu_rank_seconds")}}


@dataclass(frozen=True, kw_only=True)
class TunedRecord(Record):
    """hyperparameters: an Optuna study's outcome; its best parameters become training's defaults."""

    study_name: str
    storage: str
    best_value: float
    best_trial: int
    best_params: dict[str, Any] = field("json")
    trials_completed: int
    trials_pruned: int
    trials_failed: int
    trials_retried: int
    epochs_spent: int
    """Epochs the trials trained, added up; a boosted model's: its pruning reports (tuning.max_epochs'
    unit), its rounds in ``rounds_spent``."""
    window: dict[str, list[str]] = field("json")
    """{"train": [...days], "validation": [...days]}"""
    param_importances: dict[str, float] = field("json")
    trials: list[dict[str, Any]] = field("json")
    mlflow_run_url: str = field("url")
    plots: dict[str, str] = field("json", default_factory=dict)
    """Plot file name -> its MLflow artifact URL (each also shown as ``plot_<name>``)."""
    summary: str = field("md", default="")
    trials_run: int | None = None
    """The trials this run's workers ran (a study continued by a later run lists earlier ones too)."""
    wall_seconds: float | None = None
    """The wall seconds of the trials this run ran, added up (parallel workers' overlap: each counts)."""
    cpu_rank_seconds: float | None = None
    gpu_rank_seconds: float | None = None
    rounds_spent: int | None = None
    """A boosted model's study: the boosting rounds its trials trained, added up (None: networks)."""

    def to_metadata(self) -> dict[str, Any]:
        import dagster as dg

        shown = {f"plot_{Path(n).stem}": dg.MetadataValue.url(url) for n, url in self.plots.items()}
        return {**super().to_metadata(), **shown}

    def spent(self) -> list[SpentTrial]:
        """Each finished trial of the study and what it held (``compute`` None: not measured)."""
        return [SpentTrial.from_entry(entry) for entry in self.trials
                if entry.get("state") in FINISHED_STATES]

    @property
    def last_day(self) -> str:
        """The newest day the study saw (its validation days are its last)."""
        days = self.window.get("validation") or [""]
        return max([days] if isinstance(days, str) else days)
