"""What hyperparameters tells training: an Optuna study's outcome."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ml_assets.records.base import Record, field


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
    window: dict[str, list[str]] = field("json")
    """{"train": [...days], "validation": [...days]}"""
    param_importances: dict[str, float] = field("json")
    trials: list[dict[str, Any]] = field("json")
    mlflow_run_url: str = field("url")
    plots: dict[str, str] = field("json", default_factory=dict)
    """Plot file name -> its MLflow artifact URL (each also shown as ``plot_<name>``)."""
    summary: str = field("md", default="")

    def to_metadata(self) -> dict[str, Any]:
        import dagster as dg

        shown = {f"plot_{Path(n).stem}": dg.MetadataValue.url(url) for n, url in self.plots.items()}
        return {**super().to_metadata(), **shown}

    @property
    def last_day(self) -> str:
        """The newest day the study saw (its validation days are its last)."""
        days = self.window.get("validation") or [""]
        return max([days] if isinstance(days, str) else days)
