"""Percentile bootstrap intervals of a metric, and of the difference between two models scored on
the same resampled rows. Predictions may be 1-D or (n, K): a resample selects rows.

A resample is the held-out rows, each taken as often as it was drawn. Every metric that
``metric_function`` returns carries a weighted form (``fn.weighted``, ml_assets.evaluation.weighted),
and the bootstrap scores the rows weighted by each resample's counts: what does not depend on the
resample (ROC-AUC's sort, each row's loss) is done once, not once per resample. Any other function
is called on each resample's rows, as before. Both ways draw the very same resamples (the indices of
``rng.integers(0, rows, size=(n, rows))``, in blocks), so they give the same interval up to float
rounding.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ml_assets.evaluation.inputs import MetricError, MetricFn, _rows

# Bootstrap indices are drawn in row blocks of at most this many cells: the same numbers as one
# ``integers(size=(n, rows))`` call (PCG64 draws them in order), without n x rows int64s in memory.
# A block's counts take as much again, twice over (int64 and float64), while the next block is drawn.
_BOOTSTRAP_CELLS = 1 << 20

Score = Callable[[np.ndarray], np.ndarray]


def _resample_indices(rows: int, n: int, seed: int):
    """Blocks of bootstrap row indices: together exactly rng.integers(0, rows, size=(n, rows))."""
    rng = np.random.default_rng(seed)
    block = max(1, _BOOTSTRAP_CELLS // rows)
    if block >= n:
        yield rng.integers(0, rows, size=(n, rows))
        return
    for start in range(0, n, block):
        yield rng.integers(0, rows, size=(min(block, n - start), rows))


def _resample_counts(rows: int, n: int, seed: int) -> Iterator[np.ndarray]:
    """The same resamples as _resample_indices, each as how often it drew each row: blocks of a
    (resamples, rows) float array."""
    for idx in _resample_indices(rows, n, seed):
        idx += np.arange(0, len(idx) * rows, rows)[:, None]  # resample r's rows counted in bins r*rows...
        counts = np.bincount(idx.ravel(), minlength=idx.size).reshape(idx.shape)
        del idx
        yield counts.astype(np.float64)


def _ahead(blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """``blocks``, the next one drawn on a second thread while this one is scored (numpy releases the
    GIL in both); as they are on one core."""
    if (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) < 2:
        yield from blocks
        return
    with ThreadPoolExecutor(1, thread_name_prefix="ml_assets-bootstrap") as pool:
        pending = pool.submit(next, blocks, None)
        while (block := pending.result()) is not None:
            pending = pool.submit(next, blocks, None)
            yield block


def _safe(fn: MetricFn, y: np.ndarray, pred: np.ndarray) -> float:
    """fn(y, pred), or NaN where the metric is undefined on these rows."""
    try:
        value = float(fn(y, pred))
    except ValueError:  # MetricError, or sklearn's own "only one class present"
        return float("nan")
    return value if np.isfinite(value) else float("nan")


def _weighted(fn: MetricFn, y: np.ndarray, pred: np.ndarray) -> Score | None:
    """fn's weighted form prepared on these rows, or None: fn has none, or rejects the rows as a
    whole (then every resample would too, and the per-resample path says so as it always has)."""
    prepare = getattr(fn, "weighted", None)
    if prepare is None:
        return None
    try:
        score = prepare(y, pred)
    except ValueError:
        return None

    def safe(w: np.ndarray) -> np.ndarray:
        values = np.asarray(score(w), dtype=np.float64)
        return np.where(np.isfinite(values), values, np.nan)

    return safe


def _each(score: Score, block: np.ndarray) -> list[float]:
    """score on each resample of a block on its own: a resample's value does not depend on the
    resamples drawn beside it (a product of a block's rows rounds differently from one row's)."""
    return [float(score(block[i:i + 1])[0]) for i in range(len(block))]


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


def bootstrap_values(y, pred, fn: MetricFn, *, n: int = 1000, seed: int = 0) -> np.ndarray:
    """fn on each of ``n`` resamples of the rows (NaN where undefined)."""
    y, pred = _rows(y, pred)
    score = _weighted(fn, y, pred)
    if score is None:
        return np.array([_safe(fn, y[i], pred[i]) for block in _resample_indices(len(y), n, seed) for i in block])
    return np.array([v for block in _ahead(_resample_counts(len(y), n, seed)) for v in _each(score, block)])


def bootstrap_ci(y, pred, fn: MetricFn, *, n: int = 1000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of fn over resampled rows; undefined resamples are skipped."""
    _check_bootstrap(n, level)
    return _interval(bootstrap_values(y, pred, fn, n=n, seed=seed), level)


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
    new, old = _weighted(fn, y, pred_new), _weighted(fn, y, pred_old)
    if new is None or old is None:
        deltas = np.array([_safe(fn, y[i], pred_new[i]) - _safe(fn, y[i], pred_old[i])
                           for block in _resample_indices(len(y), n, seed) for i in block])
    else:
        deltas = np.array([a - b for block in _ahead(_resample_counts(len(y), n, seed))
                           for a, b in zip(_each(new, block), _each(old, block), strict=True)])
    lo, hi = _interval(deltas, level)
    return point, lo, hi
