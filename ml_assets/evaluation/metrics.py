"""Held-out metrics as pure functions over numpy arrays, with bootstrap intervals and slices.

Each task's metrics live in a module of their own (``binary``, ``regression``, ``multiclass``),
the interval and slice helpers in ``bootstrap`` and ``slices``, the input checks in ``inputs``;
here every task is reached by name (``compute_metrics``, ``metric_function``), and every name the
platform uses is importable. The bootstrap and the slices take 1-D and 2-D predictions alike: they
resample or select rows. A function from ``metric_function`` also carries the metric's weighted form
(``fn.weighted(y, pred)``, ml_assets.evaluation.weighted), with which the bootstrap scores resamples
as counts of the rows.
"""

from __future__ import annotations

from collections.abc import Callable

from ml_assets.evaluation import weighted as W
from ml_assets.evaluation.binary import (
    ECE_BINS,
    LOG_LOSS_EPS,
    THRESHOLD_METRICS,
    _brier,
    _ece,
    _f1,
    _log_loss,
    _pr_auc,
    _precision,
    _recall,
    _roc_auc,
    choose_threshold,
    classification_metrics,
    expected_calibration_error,
)
from ml_assets.evaluation.bootstrap import bootstrap_ci, paired_bootstrap_delta
from ml_assets.evaluation.inputs import (
    MetricError,
    MetricFn,
    _binary,
    _both_classes,
    _pair,
    _probabilities,
)
from ml_assets.evaluation.multiclass import (
    PROBABILITY_SUM_TOLERANCE,
    _accuracy,
    _macro_f1,
    _multiclass,
    _multiclass_log_loss,
    _predicted,
    _top_k_accuracy,
    _top_label_ece,
    class_rates,
    multiclass_metrics,
    per_class_metrics,
)
from ml_assets.evaluation.regression import _mae, _r2, _rmse, regression_metrics
from ml_assets.evaluation.slices import slice_metrics, slice_regressions
from ml_assets.spec import (
    CLASSIFICATION_METRICS,
    HIGHER_IS_BETTER,
    MULTICLASS_METRICS,
    REGRESSION_METRICS,
)

# What the platform imports from here, wherever it is defined (the plots use the private helpers).
__all__ = [
    "CLASSIFICATION", "CLASSIFICATION_METRICS", "ECE_BINS", "HIGHER_IS_BETTER", "LOG_LOSS_EPS", "MULTICLASS",
    "MULTICLASS_METRICS", "PROBABILITY_SUM_TOLERANCE", "REGRESSION", "REGRESSION_METRICS", "TASKS",
    "THRESHOLD_METRICS", "MetricError", "MetricFn", "_binary", "_both_classes", "_ece", "_multiclass", "_pair",
    "_pr_auc", "_predicted", "_probabilities", "_roc_auc", "bootstrap_ci", "choose_threshold", "class_rates",
    "classification_metrics", "compute_metrics", "expected_calibration_error", "metric_function",
    "multiclass_metrics", "paired_bootstrap_delta", "per_class_metrics", "regression_metrics", "slice_metrics",
    "slice_regressions",
]

CLASSIFICATION = "binary_classification"
REGRESSION = "regression"
MULTICLASS = "multiclass_classification"
TASKS = (CLASSIFICATION, REGRESSION, MULTICLASS)

_CLASSIFICATION_FNS: dict[str, Callable[..., float]] = {
    "roc_auc": _roc_auc, "pr_auc": _pr_auc, "log_loss": _log_loss, "brier": _brier,
    "ece": _ece,
    "precision": _precision, "recall": _recall, "f1": _f1,
}
_REGRESSION_FNS: dict[str, MetricFn] = {"rmse": _rmse, "mae": _mae, "r2": _r2}
_MULTICLASS_FNS: dict[str, Callable[..., float]] = {
    "accuracy": _accuracy, "macro_f1": _macro_f1, "top_k_accuracy": _top_k_accuracy,
    "log_loss": _multiclass_log_loss, "ece": _top_label_ece,
}


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise MetricError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")


def _named(fn: MetricFn, name: str, weighted: Callable[..., W.Score]) -> MetricFn:
    """fn named after its metric, with its weighted form as ``fn.weighted`` (checking the same inputs)."""
    fn.__name__ = name
    fn.weighted = weighted  # type: ignore[attr-defined]
    return fn


def _multiclass_function(name: str, top_k: int) -> MetricFn:
    if name not in _MULTICLASS_FNS:
        raise MetricError(f"unknown multiclass metric {name!r}; expected one of {', '.join(MULTICLASS_METRICS)}")
    base = _MULTICLASS_FNS[name]
    args = (top_k,) if name == "top_k_accuracy" else (ECE_BINS,) if name == "ece" else ()

    def multiclass_fn(y, p) -> float:
        return base(*_multiclass(y, p), *args)

    def weighted(y, p) -> W.Score:
        return W.MULTICLASS[name](*_multiclass(y, p), *args)

    return _named(multiclass_fn, name, weighted)


def metric_function(task: str, name: str, threshold: float | None = None, *, top_k: int = 2) -> MetricFn:
    """One metric as a function of (y, pred), checking its inputs: for bootstraps and slices."""
    _check_task(task)
    if task == MULTICLASS:
        return _multiclass_function(name, top_k)
    if task == REGRESSION:
        if name not in _REGRESSION_FNS:
            raise MetricError(f"unknown regression metric {name!r}; expected one of "
                              f"{', '.join(REGRESSION_METRICS)}")
        raw = _REGRESSION_FNS[name]

        def regression_fn(y, pred) -> float:
            return raw(*_pair(y, pred))

        def regression_weighted(y, pred) -> W.Score:
            return W.REGRESSION[name](*_pair(y, pred))

        return _named(regression_fn, name, regression_weighted)
    if name not in _CLASSIFICATION_FNS:
        raise MetricError(f"unknown classification metric {name!r}; expected one of "
                          f"{', '.join(CLASSIFICATION_METRICS)}")
    if name in THRESHOLD_METRICS and threshold is None:
        raise MetricError(f"{name} needs a decision threshold; choose one on validation rows "
                          "with choose_threshold")
    base = _CLASSIFICATION_FNS[name]
    args = (threshold,) if name in THRESHOLD_METRICS else (ECE_BINS,) if name == "ece" else ()

    def classification_fn(y, p) -> float:
        y, p = _pair(y, p)
        return base(_binary(y), _probabilities(p), *args)

    def classification_weighted(y, p) -> W.Score:
        y, p = _pair(y, p)
        return W.CLASSIFICATION[name](_binary(y), _probabilities(p), *args)

    return _named(classification_fn, name, classification_weighted)


def compute_metrics(task: str, y, pred, threshold: float | None = None, *, top_k: int = 2) -> dict[str, float]:
    """Every metric of the task; binary classification needs the validation-chosen threshold."""
    _check_task(task)
    if task == REGRESSION:
        return regression_metrics(y, pred)
    if task == MULTICLASS:
        return multiclass_metrics(y, pred, top_k)
    if threshold is None:
        raise MetricError("classification metrics need a decision threshold; choose one on "
                          "validation rows with choose_threshold")
    return classification_metrics(y, pred, threshold)
