"""The spec's ``retrain:`` section: what starts a training of the latest partition."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ml_assets.spec.base import StrictModel


class RetrainSpec(StrictModel):
    on: Literal["schedule", "on_degradation", "both"] = Field(default="schedule", description=(
        "schedule: the daily schedule (stopped until turned on); on_degradation: a sensor launches a training "
        "when model_monitor crosses a blocking limit; both"))
    cooldown_hours: float = Field(default=24.0, gt=0, le=24 * 365, description=(
        "after a retraining on evidence, further evidence within this many hours launches nothing more"))

    @property
    def scheduled(self) -> bool:
        return self.on in ("schedule", "both")

    @property
    def on_degradation(self) -> bool:
        return self.on in ("on_degradation", "both")
