"""The spec's ``evaluation`` section, and the metrics of each task."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ml_assets.spec.base import PositiveInt, StrictModel

Metric = Literal["roc_auc", "pr_auc", "log_loss", "brier", "ece", "precision", "recall", "f1", "rmse", "mae", "r2",
                 "accuracy", "macro_f1", "top_k_accuracy"]
# Precision, recall and F1 are taken at the probability cut that maximizes F1 on the validation day.
CLASSIFICATION_METRICS = ("roc_auc", "pr_auc", "log_loss", "brier", "ece", "precision", "recall", "f1")
REGRESSION_METRICS = ("rmse", "mae", "r2")
# Multiclass: the predicted class is the most probable one; ece is the top-label calibration error
# (the predicted class's probability against how often it is right); k of top_k_accuracy is
# evaluation.top_k. Per-class precision and recall are reported beside them, not gated on.
MULTICLASS_METRICS = ("accuracy", "macro_f1", "top_k_accuracy", "log_loss", "ece")
TASK_METRICS = {"binary_classification": CLASSIFICATION_METRICS, "regression": REGRESSION_METRICS,
                "multiclass_classification": MULTICLASS_METRICS}
HIGHER_IS_BETTER = {"roc_auc": True, "pr_auc": True, "precision": True, "recall": True, "f1": True, "r2": True,
                    "accuracy": True, "macro_f1": True, "top_k_accuracy": True,
                    "log_loss": False, "brier": False, "ece": False, "rmse": False, "mae": False}


class EvaluationSpec(StrictModel):
    metrics: list[Metric] = Field(min_length=1, description="shown first; every metric of the task is computed")
    test_days: int = Field(default=1, ge=1, le=365, description=(
        "the held-out days ending with the partition's own day; training ends the day before the first of them"))
    min_test_rows: int = Field(default=30, ge=1, description=(
        "fewer test rows (or, for classification, one class only) fail the evaluation: nothing is registered"))
    slice_columns: list[str] = []
    min_slice_size: PositiveInt = 50
    bootstrap_samples: int = Field(default=1000, ge=100, le=100_000,
                                   description="resamples for the confidence intervals")
    confidence_level: float = Field(default=0.95, gt=0.5, lt=1)
    top_k: int = Field(default=2, ge=1, description=(
        "multiclass: top_k_accuracy counts a row right when its class is among the k most probable"))
