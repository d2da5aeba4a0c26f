"""Percentile bootstrap intervals of a metric, and of the difference between two models scored on
the same resampled rows. Predictions may be 1-D or (n, K): a resample selects rows.
"""

from __future__ import annotations

import numpy as np

from ml_assets.evaluation.inputs import MetricError, MetricFn, _rows

# Bootstrap indices are drawn in row blocks of at most this many cells: the same numbers as one
# ``integers(size=(n, rows))`` call (PCG64 draws them in order), without n x rows int64s in memory.
_BOOTSTRAP_CELLS = 1 << 23


def _resample_indices(rows: int, n: int, seed: int):
    """Blocks of bootstrap row indices: together exactly rng.integers(0, rows, size=(n, rows))."""
    rng = np.random.default_rng(seed)
    block = max(1, _BOOTSTRAP_CELLS // rows)
    if block >= n:
        yield rng.integers(0, rows, size=(n, rows))
        return
    for start in range(0, n, block):
        yield rng.integers(0, rows, size=(min(block, n - start), rows))


def _safe(fn: MetricFn, y: np.ndarray, pred: np.ndarray) -> float:
    """fn(y, pred), or NaN where the metric is undefined on these rows."""
    try:
        value = float(fn(y, pred))
    except ValueError:  # MetricError, or sklearn's own "only one class present"
        return float("nan")
    return value if np.isfinite(value) else float("nan")


def _check_bootstrap(n: int, level: float) -> None:
    if n < 1:
        raise MetricError(f"the bootstrap needs at least 1 resample; got n={n}")
    if not 0 < level < 1:
        raise MetricError(f"the confidence level must be between 0 and 1; got {level}")


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    undefined = int(np.isnan(values).sum())
    if undefined * 2 > len(values):
        raise MetricError(f"the metric is undefined on {undefined} of {len(values)} bootstrap "
                          "resamples (e.g. a single class); too few rows, or too few of one "
                          "class, for a confidence interval")
    alpha = (1 - level) / 2
    lo, hi = np.quantile(values[~np.isnan(values)], [alpha, 1 - alpha])
    return float(lo), float(hi)


def bootstrap_ci(y, pred, fn: MetricFn, *, n: int = 1000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of fn over resampled rows; undefined resamples are skipped."""
    _check_bootstrap(n, level)
    y, pred = _rows(y, pred)
    values = np.array([_safe(fn, y[i], pred[i])
                       for block in _resample_indices(len(y), n, seed) for i in block])
    return _interval(values, level)


def paired_bootstrap_delta(y, pred_new, pred_old, fn: MetricFn, *, n: int = 1000,
                           level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(fn(new) - fn(old), lo, hi): both models scored on the same resampled rows (paired).

    Pairing removes the row-sampling noise the two models share, so the interval is much
    narrower than the difference of two independent intervals.
    """
    _check_bootstrap(n, level)
    y, pred_new = _rows(y, pred_new, "new predictions")
    _, pred_old = _rows(y, pred_old, "old predictions")
    if pred_new.shape != pred_old.shape:
        raise MetricError(f"new predictions of shape {pred_new.shape} and old of {pred_old.shape}: the two "
                          "models must predict the same classes")
    point = float(fn(y, pred_new)) - float(fn(y, pred_old))
    deltas = np.array([_safe(fn, y[i], pred_new[i]) - _safe(fn, y[i], pred_old[i])
                       for block in _resample_indices(len(y), n, seed) for i in block])
    lo, hi = _interval(deltas, level)
    return point, lo, hi
