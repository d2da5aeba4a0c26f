"""The spec's ``promotion`` section: what a candidate must show to replace the champion."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from ml_assets.spec.base import StrictModel, model_name
from ml_assets.spec.evaluation import Metric


class PromotionSpec(StrictModel):
    primary_metric: Metric
    min_improvement: float = Field(
        default=0.0, description=(
            "over the champion (a first model: over the best simple baseline), in the metric's own units "
            "(0.005 ROC-AUC = half a point)"))
    max_slice_regression: float = Field(
        default=0.05, ge=0, description="the most the primary metric may get worse on any slice")
    max_calibration_worsening: float = Field(
        default=0.02, ge=0, description="the most expected calibration error may grow (classification)")
    floors: dict[Metric, float] = Field(
        default={}, description=(
            "a first model (no champion yet) must also reach these (ceilings for lower-is-better)"))
    beat_baseline: bool = Field(default=True, description=(
        "a first model must beat the evaluation's best simple baseline by min_improvement; false: the "
        "baselines are only reported"))
    mode: Literal["automatic", "approval_required"] = "automatic"
    rival: str | None = Field(default=None, description=(
        "another model answering the same question (same target, same task): its champion is scored on "
        "this model's test rows, and this model must beat it by min_improvement as well"))

    @field_validator("rival")
    @classmethod
    def _rival_name(cls, value: str | None) -> str | None:
        return None if value is None else model_name(value)
