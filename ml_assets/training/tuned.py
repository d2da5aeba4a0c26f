"""The tuning study whose best parameters a training applies, if any."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import dagster as dg

from ml_assets.pipeline.graph import Stage, Wiring
from ml_assets.records.read import latest_event
from ml_assets.tuning.record import TunedRecord


@dataclass(frozen=True)
class Tuned:
    params: dict[str, Any]
    source: str
    """Which study and trial, in words (recorded with the checkpoint and the registered version)."""
    last_day: str
    """The newest day the study validated on."""
    study_name: str
    best_trial: int
    dagster_run_id: str

    def as_metadata(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def tuned_parameters(instance: dg.DagsterInstance, wiring: Wiring) -> Tuned | None:
    """The best parameters of the model's latest tuning study, if it has one and the spec applies it."""
    if not wiring.graph.spec.tuning.apply_best:
        return None
    # The event, not only its record: the record is recorded with the run that made it.
    event = latest_event(instance, wiring.key_of(Stage.HYPERPARAMETERS), None)
    if event is None:
        return None
    study = TunedRecord.from_metadata(event.asset_materialization.metadata)
    return Tuned(params=study.best_params, last_day=study.last_day, study_name=study.study_name,
                 best_trial=study.best_trial, dagster_run_id=event.run_id, source=(
                     f"tuning study {study.study_name} trial {study.best_trial} (best val_loss "
                     f"{study.best_value:.4f}, Dagster run {event.run_id})"))
