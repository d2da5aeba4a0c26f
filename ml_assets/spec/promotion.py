"""The spec's ``promotion`` section: what a candidate must show to replace the champion."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ml_assets.spec.base import StrictModel, model_name
from ml_assets.spec.evaluation import Metric

UNIT_METRICS = ("roc_auc", "pr_auc", "precision", "recall", "f1", "accuracy", "macro_f1", "top_k_accuracy", "brier",
                "ece")
"""Metrics between 0 and 1: a margin of 1 or more on them is not in their units (a percentage?)."""


class SuccessorBar(StrictModel):
    """The bar for a fine-tuned successor of the champion: non-inferiority within a margin, with the
    same slice and calibration guards as any challenger."""

    max_regression: float = Field(ge=0, description=(
        "the most the primary metric may be worse than the champion's on the same rows, in the metric's "
        "own units (0.002 ROC-AUC = a fifth of a point)"))


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

    successor: SuccessorBar | None = Field(default=None, description=(
        "the bar for a candidate fine-tuned from the champion (training.warm_start): no more than "
        "max_regression worse on the primary metric, instead of min_improvement better. Unset: a successor "
        "is held to min_improvement like any challenger"))
    max_champion_age_days: int | None = Field(default=None, ge=1, description=(
        "past this many days between the champion's partition and a candidate's, the candidate (a fine-tune "
        "or a full training) is held to the successor's bar: a fresher model as good as the champion "
        "replaces it. Needs successor"))

    @model_validator(mode="after")
    def _successor_in_units(self) -> PromotionSpec:
        if self.successor and self.primary_metric in UNIT_METRICS and self.successor.max_regression >= 1:
            raise ValueError(f"successor.max_regression {self.successor.max_regression} is not in {self.primary_metric}'s "
                             f"units (0 to 1): 0.002 is a fifth of a point")
        if self.max_champion_age_days is not None and self.successor is None:
            raise ValueError("max_champion_age_days needs successor: {max_regression: ...}, the bar a replacement "
                             "of an aged champion must pass")
        return self

    @field_validator("rival")
    @classmethod
    def _rival_name(cls, value: str | None) -> str | None:
        return None if value is None else model_name(value)
