"""A metric on the rows of each value of each slice column, where a model fails a subgroup, and
the change per slice from an old model to a new one.
"""

from __future__ import annotations

import numpy as np

from ml_assets.evaluation.inputs import MetricError, MetricFn, _rows
from ml_assets.evaluation.multiclass import class_rates


def _slice_keys(values) -> np.ndarray:
    """Slice values as strings (None and NaN become "null"), so any column type groups alike."""
    arr = np.asarray(values)
    if arr.dtype == object:
        return np.array(["null" if v is None or (isinstance(v, float) and v != v) else str(v)
                         for v in arr], dtype=str)
    keys = arr.astype(str)
    if np.issubdtype(arr.dtype, np.floating):
        keys[np.isnan(arr)] = "null"
    return keys


def slice_metrics(columns: dict[str, np.ndarray], y, pred, fn: MetricFn, *,
                  min_size: int) -> list[dict]:
    """fn on the rows of each value of each slice column: where a model fails a subgroup.

    Slices under ``min_size`` rows, or where fn is undefined (e.g. a single class), are listed
    with metric None and the reason. Each row carries its label mix: ``positive_rate`` (the mean
    label), or ``class_rates`` (each class's share) for multiclass predictions. Sorted by column,
    then rows descending.
    """
    y, pred = _rows(y, pred)
    if min_size < 1:
        raise MetricError(f"min_size must be at least 1; got {min_size}")
    out = []
    for column, values in columns.items():
        keys = _slice_keys(values)
        if keys.ndim != 1 or len(keys) != len(y):
            raise MetricError(f"slice column {column!r} has {len(keys)} values for {len(y)} rows")
        distinct, inverse = np.unique(keys, return_inverse=True)
        for k, value in enumerate(distinct):
            mask = inverse == k
            rows = int(mask.sum())
            metric, reason = None, None
            if rows < min_size:
                reason = f"fewer than {min_size} rows"
            else:
                try:
                    metric = float(fn(y[mask], pred[mask]))
                except ValueError as exc:
                    reason = str(exc)
                else:
                    if not np.isfinite(metric):
                        metric, reason = None, "the metric is undefined on this slice"
            mix = ({"class_rates": class_rates(y[mask], pred.shape[1])} if pred.ndim == 2
                   else {"positive_rate": float(y[mask].mean())})
            out.append({"column": column, "value": str(value), "rows": rows, **mix, "metric": metric,
                        "reason": reason})
    out.sort(key=lambda r: (r["column"], -r["rows"], r["value"]))
    return out


def slice_regressions(new: list[dict], old: list[dict], higher_is_better: bool) -> list[dict]:
    """Per-slice change from old to new model; ``regression`` > 0 means the new model is worse."""
    old_by_key = {(r["column"], r["value"]): r for r in old if r.get("metric") is not None}
    out = []
    for r in new:
        before = old_by_key.get((r["column"], r["value"]))
        if r.get("metric") is None or before is None:
            continue
        new_v, old_v = float(r["metric"]), float(before["metric"])
        out.append({"column": r["column"], "value": r["value"], "rows": r["rows"],
                    "new": new_v, "old": old_v,
                    "regression": old_v - new_v if higher_is_better else new_v - old_v})
    out.sort(key=lambda r: (-r["regression"], r["column"], r["value"]))
    return out
