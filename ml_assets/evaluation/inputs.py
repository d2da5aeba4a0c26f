"""The checks every metric's inputs pass: labels and predictions of the same rows, as finite
numbers, with a MetricError that says what is wrong and what to do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

MetricFn = Callable[[np.ndarray, np.ndarray], float]


class MetricError(ValueError):
    """A metric cannot be computed on the given rows; the message says why and what to do."""


def _numbers(values, what: str, ndim: int) -> np.ndarray:
    """``values`` as finite floats of ``ndim`` dimensions (1: one per row; 2: rows x classes)."""
    arr = np.asarray(values)
    if arr.ndim != ndim:
        shape = "one-dimensional" if ndim == 1 else "two-dimensional (rows x classes)"
        raise MetricError(f"{what} must be {shape}; got shape {arr.shape}")
    try:
        arr = arr.astype(float, copy=False)
    except (TypeError, ValueError) as exc:
        raise MetricError(f"{what} must be numeric; got dtype {arr.dtype}") from exc
    bad = ~np.isfinite(arr)
    if bad.any():
        raise MetricError(f"{what} contain {int(bad.sum())} missing or infinite value(s); "
                          "drop or impute them before evaluating")
    return arr


def _vector(values, what: str) -> np.ndarray:
    return _numbers(values, what, 1)


def _same_rows(y: np.ndarray, pred: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    if len(y) != len(pred):
        raise MetricError(f"{len(y)} labels but {len(pred)} {what}; they must be the same rows")
    if len(y) == 0:
        raise MetricError("no held-out rows to evaluate on")
    return y, pred


def _pair(y, pred, what: str = "predictions") -> tuple[np.ndarray, np.ndarray]:
    """Labels and one prediction per row."""
    return _same_rows(_vector(y, "labels"), _vector(pred, what), what)


def _rows(y, pred, what: str = "predictions") -> tuple[np.ndarray, np.ndarray]:
    """Labels and predictions of the same rows: one prediction per row, or one row of class
    probabilities per row (multiclass)."""
    return _same_rows(_vector(y, "labels"), _numbers(pred, what, 2 if np.ndim(pred) == 2 else 1), what)


def _binary(y: np.ndarray) -> np.ndarray:
    bad = (y != 0) & (y != 1)
    if bad.any():
        found = ", ".join(f"{v:g}" for v in np.unique(y[bad])[:5])
        raise MetricError(f"classification labels must be 0/1; found {found}")
    return y


def _probabilities(p: np.ndarray) -> np.ndarray:
    if p.min() < 0 or p.max() > 1:
        raise MetricError(f"predictions must be probabilities in [0, 1]; got values from "
                          f"{p.min():g} to {p.max():g} (apply a sigmoid to scores first)")
    return p


def _both_classes(y: np.ndarray, undefined: str, rows: str = "the rows") -> int:
    """The number of positives; MetricError when all rows are one class."""
    positives = int(y.sum())
    if positives in (0, len(y)):
        raise MetricError(f"{rows} have a single class ({int(y[0])}); {undefined} undefined")
    return positives
