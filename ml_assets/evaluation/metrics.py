"""Held-out metrics as pure functions over numpy arrays, with bootstrap intervals and slices.

Classification predictions are probabilities of the positive class (labels 0/1); the threshold
for precision/recall/F1 is chosen on validation rows (``choose_threshold``), never on the rows
being scored. ROC-AUC and PR-AUC are computed here in numpy (rank statistic and step-wise average
precision, identical to scikit-learn's) because the bootstrap calls them about a thousand times.

Multiclass predictions are an (n, K) array of class probabilities (rows sum to 1) and labels are
class indices 0..K-1; the predicted class is the most probable one. The bootstrap and the slices
take 1-D and 2-D predictions alike: they resample or select rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sklearn.metrics import precision_recall_curve

from ml_assets.spec import (  # noqa: F401
    CLASSIFICATION_METRICS,
    HIGHER_IS_BETTER,
    MULTICLASS_METRICS,
    REGRESSION_METRICS,
)

CLASSIFICATION = "binary_classification"
REGRESSION = "regression"
MULTICLASS = "multiclass_classification"
TASKS = (CLASSIFICATION, REGRESSION, MULTICLASS)

THRESHOLD_METRICS = ("precision", "recall", "f1")

LOG_LOSS_EPS = 1e-7
ECE_BINS = 10
PROBABILITY_SUM_TOLERANCE = 1e-3  # float32 softmax outputs sum to 1 within ~1e-6
# Bootstrap indices are drawn in row blocks of at most this many cells: the same numbers as one
# ``integers(size=(n, rows))`` call (PCG64 draws them in order), without n x rows int64s in memory.
_BOOTSTRAP_CELLS = 1 << 23

MetricFn = Callable[[np.ndarray, np.ndarray], float]


class MetricError(ValueError):
    """A metric cannot be computed on the given rows; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# input checks


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


# ---------------------------------------------------------------------------------------------
# classification


def _roc_auc(y: np.ndarray, s: np.ndarray) -> float:
    """Mann-Whitney U / (n1 n0) with average ranks for ties: equals sklearn's roc_auc_score."""
    n1 = _both_classes(y, "ROC-AUC is")
    n0 = len(y) - n1
    order = np.argsort(s, kind="mergesort")
    ordered = s[order]
    starts_group = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(starts_group)
    ends = np.r_[starts[1:], len(s)]
    ranks = np.empty(len(s))
    ranks[order] = ((starts + 1 + ends) / 2)[np.cumsum(starts_group) - 1]
    return float((ranks[y == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _pr_auc(y: np.ndarray, s: np.ndarray) -> float:
    """Average precision (step-wise, no interpolation): equals sklearn's average_precision_score."""
    _both_classes(y, "PR-AUC is")
    order = np.argsort(-s, kind="mergesort")
    ys, ss = y[order], s[order]
    last = np.r_[np.flatnonzero(np.diff(ss)), len(ss) - 1]  # last row of each distinct score
    tps = np.cumsum(ys)[last]
    precision = tps / (last + 1)
    recall = tps / tps[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def _log_loss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, LOG_LOSS_EPS, 1 - LOG_LOSS_EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def _brier(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean((p - y) ** 2))


def _ece(y: np.ndarray, p: np.ndarray, bins: int) -> float:
    if bins < 1:
        raise MetricError(f"bins must be at least 1; got {bins}")
    idx = np.minimum((p * bins).astype(int), bins - 1)
    gap = np.abs(np.bincount(idx, y, minlength=bins) - np.bincount(idx, p, minlength=bins))
    return float(gap.sum() / len(y))  # sum_b (n_b/n) |mean_b(y) - mean_b(p)|; empty bins add 0


def _confusion(y: np.ndarray, p: np.ndarray, threshold: float) -> tuple[int, int, int]:
    hit = p >= threshold
    tp = int(np.sum(hit & (y == 1)))
    return tp, int(hit.sum()) - tp, int(y.sum()) - tp


def _precision(y: np.ndarray, p: np.ndarray, threshold: float) -> float:
    tp, fp, _ = _confusion(y, p, threshold)
    return tp / (tp + fp) if tp + fp else 0.0


def _recall(y: np.ndarray, p: np.ndarray, threshold: float) -> float:
    tp, _, fn = _confusion(y, p, threshold)
    return tp / (tp + fn) if tp + fn else 0.0


def _f1(y: np.ndarray, p: np.ndarray, threshold: float) -> float:
    tp, fp, fn = _confusion(y, p, threshold)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def expected_calibration_error(y, p, bins: int = ECE_BINS) -> float:
    """ECE over ``bins`` equal-width bins on [0, 1]: the row-weighted mean |rate - mean prob|."""
    y, p = _pair(y, p)
    return _ece(_binary(y), _probabilities(p), bins)


def choose_threshold(y_val, p_val) -> float:
    """The probability cut maximizing F1 on validation rows (ties: the higher cut).

    Chosen on validation rows so the held-out precision/recall/F1 are not tuned on themselves.
    Rows with ``p >= threshold`` are predicted positive.
    """
    y, p = _vector(y_val, "validation labels"), _vector(p_val, "validation predictions")
    if len(y) != len(p):
        raise MetricError(f"{len(y)} validation labels but {len(p)} validation predictions")
    if len(y) == 0:
        raise MetricError("no validation rows to choose a threshold on")
    y, p = _binary(y), _probabilities(p)
    if y.min() == y.max():
        raise MetricError(f"validation rows have a single class ({int(y[0])}); no threshold can be "
                          "chosen to maximize F1")
    precision, recall, thresholds = precision_recall_curve(y, p)
    precision, recall = precision[:-1], recall[:-1]  # the last point has no threshold
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(denom), where=denom > 0)
    best = np.flatnonzero(f1 >= f1.max() - 1e-12)
    return float(thresholds[best].max())


def classification_metrics(y, p, threshold: float) -> dict[str, float]:
    """Every metric in CLASSIFICATION_METRICS; precision/recall/F1 predict positive at p >= threshold."""
    y, p = _pair(y, p)
    y, p = _binary(y), _probabilities(p)
    _both_classes(y, "ROC-AUC and PR-AUC are", "held-out rows")
    return {
        "roc_auc": _roc_auc(y, p),
        "pr_auc": _pr_auc(y, p),
        "log_loss": _log_loss(y, p),
        "brier": _brier(y, p),
        "ece": _ece(y, p, ECE_BINS),
        "precision": _precision(y, p, threshold),
        "recall": _recall(y, p, threshold),
        "f1": _f1(y, p, threshold),
    }


# ---------------------------------------------------------------------------------------------
# regression


def _rmse(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def _mae(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y)))


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0:
        raise MetricError(f"every target is the same value ({y[0]:g}); R² is undefined")
    return float(1 - np.sum((y - pred) ** 2) / ss_tot)


def regression_metrics(y, pred) -> dict[str, float]:
    """RMSE, MAE and R² (R² raises MetricError when every target is the same value)."""
    y, pred = _pair(y, pred)
    return {"rmse": _rmse(y, pred), "mae": _mae(y, pred), "r2": _r2(y, pred)}


# ---------------------------------------------------------------------------------------------
# multiclass


def _multiclass(y, p) -> tuple[np.ndarray, np.ndarray]:
    """Labels as int64 class indices and probabilities as an (n, K) array, both checked."""
    y, p = _rows(y, p)
    if p.ndim != 2 or p.shape[1] < 2:
        raise MetricError(f"multiclass predictions must be rows x classes (at least 2); got shape {p.shape}")
    k = p.shape[1]
    bad = (y != np.round(y)) | (y < 0) | (y >= k)
    if bad.any():
        found = ", ".join(f"{v:g}" for v in np.unique(y[bad])[:5])
        raise MetricError(f"multiclass labels must be class indices 0..{k - 1}; found {found}")
    sums = p.sum(axis=1)
    if p.min() < 0 or p.max() > 1 or np.abs(sums - 1).max() > PROBABILITY_SUM_TOLERANCE:
        raise MetricError(f"multiclass predictions must be class probabilities summing to 1 per row; got values "
                          f"from {p.min():g} to {p.max():g}, row sums from {sums.min():g} to {sums.max():g} "
                          "(apply a softmax to scores first)")
    return y.astype(np.int64), p


def _predicted(p: np.ndarray) -> np.ndarray:
    return p.argmax(axis=1)  # ties: the first class, as scikit-learn's argmax-based scorers


def _accuracy(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean(_predicted(p) == y))


def _class_counts(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class: true positives, predicted rows, actual rows."""
    k, hat = p.shape[1], _predicted(p)
    tp = np.bincount(y[hat == y], minlength=k)
    return tp, np.bincount(hat, minlength=k), np.bincount(y, minlength=k)


def _macro_f1(y: np.ndarray, p: np.ndarray) -> float:
    """The mean F1 over the classes that occur among the labels or the predictions (as
    scikit-learn's default): a class absent from a slice and never predicted there is not a zero."""
    tp, predicted, actual = _class_counts(y, p)
    seen = (predicted + actual) > 0
    return float(np.mean(2 * tp[seen] / (predicted[seen] + actual[seen])))


def _top_k_accuracy(y: np.ndarray, p: np.ndarray, k: int) -> float:
    """Share of rows whose class is among the k most probable (a tie with the k-th counts as in)."""
    if k < 1:
        raise MetricError(f"top-k accuracy needs k of at least 1; got {k}")
    truth = p[np.arange(len(y)), y]
    above = (p > truth[:, None]).sum(axis=1)
    return float(np.mean(above < k))


def _multiclass_log_loss(y: np.ndarray, p: np.ndarray) -> float:
    truth = np.clip(p[np.arange(len(y)), y], LOG_LOSS_EPS, 1.0)
    return float(-np.mean(np.log(truth)))


def _top_label_ece(y: np.ndarray, p: np.ndarray, bins: int) -> float:
    """Top-label (confidence) calibration error: the binary ECE of "the predicted class is right"
    against the predicted class's probability. One number that reads like the binary ECE; the
    classwise variant would average K such errors, most of them over near-zero probabilities."""
    confidence = p.max(axis=1)
    return _ece((_predicted(p) == y).astype(float), confidence, bins)


def multiclass_metrics(y, p, top_k: int = 2) -> dict[str, float]:
    """Every metric in MULTICLASS_METRICS; labels are class indices, p is (n, K) probabilities."""
    y, p = _multiclass(y, p)
    return {
        "accuracy": _accuracy(y, p),
        "macro_f1": _macro_f1(y, p),
        "top_k_accuracy": _top_k_accuracy(y, p, top_k),
        "log_loss": _multiclass_log_loss(y, p),
        "ece": _top_label_ece(y, p, ECE_BINS),
    }


def per_class_metrics(y, p, classes: list[str]) -> list[dict]:
    """Per class: its rows and share of them, how often it is predicted, precision and recall of
    predicting it (0.0 where undefined: never predicted, or no rows of it, as zero_division=0)."""
    y, p = _multiclass(y, p)
    if len(classes) != p.shape[1]:
        raise MetricError(f"{len(classes)} class names for predictions of {p.shape[1]} classes")
    tp, predicted, actual = _class_counts(y, p)
    return [{"class": name, "rows": int(actual[i]), "rate": float(actual[i] / len(y)), "predicted": int(predicted[i]),
             "precision": float(tp[i] / predicted[i]) if predicted[i] else 0.0,
             "recall": float(tp[i] / actual[i]) if actual[i] else 0.0}
            for i, name in enumerate(classes)]


def class_rates(y, classes: int) -> list[float]:
    """The share of rows of each class index 0..classes-1."""
    y = _vector(y, "labels")
    if len(y) == 0:
        raise MetricError("no rows to count classes on")
    return [float(v) for v in np.bincount(y.astype(np.int64), minlength=classes)[:classes] / len(y)]


# ---------------------------------------------------------------------------------------------
# dispatch


_CLASSIFICATION_FNS: dict[str, Callable[..., float]] = {
    "roc_auc": _roc_auc, "pr_auc": _pr_auc, "log_loss": _log_loss, "brier": _brier,
    "ece": lambda y, p: _ece(y, p, ECE_BINS),
    "precision": _precision, "recall": _recall, "f1": _f1,
}
_REGRESSION_FNS: dict[str, MetricFn] = {"rmse": _rmse, "mae": _mae, "r2": _r2}
_MULTICLASS_FNS: dict[str, Callable[..., float]] = {
    "accuracy": _accuracy, "macro_f1": _macro_f1, "top_k_accuracy": _top_k_accuracy,
    "log_loss": _multiclass_log_loss, "ece": lambda y, p: _top_label_ece(y, p, ECE_BINS),
}


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise MetricError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")


def _multiclass_function(name: str, top_k: int) -> MetricFn:
    if name not in _MULTICLASS_FNS:
        raise MetricError(f"unknown multiclass metric {name!r}; expected one of {', '.join(MULTICLASS_METRICS)}")
    base = _MULTICLASS_FNS[name]
    args = (top_k,) if name == "top_k_accuracy" else ()

    def multiclass_fn(y, p) -> float:
        return base(*_multiclass(y, p), *args)

    multiclass_fn.__name__ = name
    return multiclass_fn


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

        regression_fn.__name__ = name
        return regression_fn
    if name not in _CLASSIFICATION_FNS:
        raise MetricError(f"unknown classification metric {name!r}; expected one of "
                          f"{', '.join(CLASSIFICATION_METRICS)}")
    if name in THRESHOLD_METRICS and threshold is None:
        raise MetricError(f"{name} needs a decision threshold; choose one on validation rows "
                          "with choose_threshold")
    base = _CLASSIFICATION_FNS[name]
    args = (threshold,) if name in THRESHOLD_METRICS else ()

    def classification_fn(y, p) -> float:
        y, p = _pair(y, p)
        return base(_binary(y), _probabilities(p), *args)

    classification_fn.__name__ = name
    return classification_fn


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


# ---------------------------------------------------------------------------------------------
# bootstrap


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


# ---------------------------------------------------------------------------------------------
# slices


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
