"""Multiclass metrics: predictions are an (n, K) array of class probabilities (rows sum to 1) and
labels are class indices 0..K-1; the predicted class is the most probable one.
"""

from __future__ import annotations

import numpy as np

from ml_assets.evaluation.binary import ECE_BINS, LOG_LOSS_EPS, _ece
from ml_assets.evaluation.inputs import MetricError, _rows, _vector

PROBABILITY_SUM_TOLERANCE = 1e-3  # float32 softmax outputs sum to 1 within ~1e-6


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
