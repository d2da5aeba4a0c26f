"""Binary classification metrics: predictions are probabilities of the positive class, labels 0/1.

The threshold for precision/recall/F1 is chosen on validation rows (``choose_threshold``), never on
the rows being scored. ROC-AUC and PR-AUC are computed here in numpy (rank statistic and step-wise
average precision, identical to scikit-learn's) because the bootstrap calls them about a thousand
times.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import precision_recall_curve

from ml_assets.evaluation.inputs import (
    MetricError,
    _binary,
    _both_classes,
    _pair,
    _probabilities,
    _vector,
)

THRESHOLD_METRICS = ("precision", "recall", "f1")

LOG_LOSS_EPS = 1e-7
ECE_BINS = 10


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
