"""The spec's ``promotion`` section: what a candidate must show to replace the champion."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ml_assets.spec.base import StrictModel
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
