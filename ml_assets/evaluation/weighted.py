"""Every metric of rows weighted by how often each row was drawn: what the bootstrap scores.

A bootstrap resample takes each held-out row some number of times (0, 1, 2, ...); its metric is the
metric of the rows weighted by those counts. Scored that way, the work that does not depend on the
resample is done once: the sort of ROC-AUC and PR-AUC, each row's loss, its bin, its predicted
class. A resample then costs a few passes over its counts instead of a copy of the rows and a
fresh sort.

Each form here is ``prepare(y, pred, *args) -> score``: ``y`` and ``pred`` are the checked arrays
the plain metric takes (ml_assets.evaluation.binary, multiclass, regression) and ``score(w)`` takes
a (replicates, rows) array of non-negative weights and returns one value per replicate, NaN where
the metric is undefined on that replicate (e.g. a single class), as the plain metric would raise.
On integer weights, ``score`` equals the plain metric on the rows repeated that many times, up to
float rounding (ml_assets_tests/evaluation/test_weighted.py holds every form to it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import sparse

from ml_assets.evaluation.binary import LOG_LOSS_EPS
from ml_assets.evaluation.inputs import MetricError
from ml_assets.evaluation.multiclass import _predicted

Score = Callable[[np.ndarray], np.ndarray]


def _ratio(num: np.ndarray, den: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
    """num / den, NaN where ``where`` is False (default: where den is 0)."""
    ok = den != 0 if where is None else where
    return np.divide(num, den, out=np.full(np.shape(num), np.nan), where=ok)


def _totals(w: np.ndarray) -> np.ndarray:
    return w.sum(axis=1)


def _mean_of(per_row: np.ndarray) -> Score:
    """The weighted mean of a per-row quantity (a loss, a hit)."""
    per_row = np.ascontiguousarray(per_row, dtype=np.float64)

    def score(w: np.ndarray) -> np.ndarray:
        return _ratio(w @ per_row, _totals(w))

    return score


def _sums(columns: sparse.csr_matrix, w: np.ndarray) -> np.ndarray:
    """(replicates, k): the weighted sum of each column of a sparse (rows, k) matrix."""
    return np.asarray(columns.T @ w.T).T


def _one_hot(groups: np.ndarray, k: int, values: np.ndarray | None = None) -> sparse.csr_matrix:
    """(rows, k): row i holds ``values[i]`` (default 1) in column ``groups[i]``."""
    n = len(groups)
    data = np.ones(n) if values is None else np.asarray(values, dtype=np.float64)
    return sparse.csr_matrix((data, (np.arange(n), groups)), shape=(n, k))


# --- binary classification ------------------------------------------------------------------


def roc_auc(y: np.ndarray, s: np.ndarray) -> Score:
    """The Mann-Whitney statistic of weighted rows: each (positive, negative) pair counts the
    product of their weights, 1 when the positive scores higher and 1/2 when tied (as
    scikit-learn's roc_auc_score). Scores are sorted once; a replicate is a cumulative sum of the
    negatives' weights in score order, read at each positive's place."""
    order = np.argsort(s, kind="mergesort")
    neg = order[y[order] == 0]  # the negatives, by ascending score
    pos = np.flatnonzero(y == 1)  # the positives in row order (their order does not matter)
    below = np.searchsorted(s[neg], s[pos], side="left")  # negatives scoring lower than each positive
    upto = np.searchsorted(s[neg], s[pos], side="right")  # ... lower or tied
    tied = bool((below != upto).any())

    def score(w: np.ndarray) -> np.ndarray:
        cum = np.empty((len(w), len(neg) + 1))
        cum[:, 0] = 0.0
        np.cumsum(np.take(w, neg, axis=1), axis=1, out=cum[:, 1:])
        wp = np.take(w, pos, axis=1)
        under = np.take(cum, below, axis=1)
        if tied:
            under += np.take(cum, upto, axis=1)
            under /= 2
        n1, n0 = wp.sum(axis=1), cum[:, -1]
        return _ratio((wp * under).sum(axis=1), n1 * n0)

    return score


def pr_auc(y: np.ndarray, s: np.ndarray) -> Score:
    """Step-wise average precision of weighted rows (as binary._pr_auc on the repeated rows): a
    score nobody drew adds no recall, so it adds nothing."""
    order = np.argsort(-s, kind="mergesort")
    ys, ss = y[order], s[order]
    last = np.r_[np.flatnonzero(np.diff(ss)), len(ss) - 1]  # the last row of each distinct score

    def score(w: np.ndarray) -> np.ndarray:
        ws = np.take(w, order, axis=1)
        drawn = np.cumsum(ws, axis=1)[:, last]
        ws *= ys
        tps = np.cumsum(ws, axis=1)[:, last]
        precision = np.divide(tps, drawn, out=np.zeros_like(tps), where=drawn > 0)
        gained = np.diff(tps, axis=1, prepend=0.0)
        positives, negatives = tps[:, -1], drawn[:, -1] - tps[:, -1]
        return _ratio((gained * precision).sum(axis=1), positives, (positives > 0) & (negatives > 0))

    return score


def log_loss(y: np.ndarray, p: np.ndarray) -> Score:
    p = np.clip(p, LOG_LOSS_EPS, 1 - LOG_LOSS_EPS)
    return _mean_of(-(y * np.log(p) + (1 - y) * np.log1p(-p)))


def brier(y: np.ndarray, p: np.ndarray) -> Score:
    return _mean_of((p - y) ** 2)


def ece(y: np.ndarray, p: np.ndarray, bins: int) -> Score:
    """Per bin, |weighted sum of (label - probability)|, summed over bins, over the total weight."""
    if bins < 1:
        raise MetricError(f"bins must be at least 1; got {bins}")
    gaps = _one_hot(np.minimum((p * bins).astype(int), bins - 1), bins, y - p)

    def score(w: np.ndarray) -> np.ndarray:
        return _ratio(np.abs(_sums(gaps, w)).sum(axis=1), _totals(w))

    return score


def _confusion(y: np.ndarray, p: np.ndarray, threshold: float) -> Callable[[np.ndarray], tuple]:
    """Weighted true positives, predicted positives and actual positives at the cut."""
    hit = p >= threshold
    counted = np.stack([hit & (y == 1), hit, y == 1], axis=1).astype(np.float64)

    def counts(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tp, predicted, actual = (w @ counted).T
        return tp, predicted, actual

    return counts


def precision(y: np.ndarray, p: np.ndarray, threshold: float) -> Score:
    confusion = _confusion(y, p, threshold)

    def score(w: np.ndarray) -> np.ndarray:
        tp, predicted, _ = confusion(w)
        return np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)  # 0 when none predicted

    return score


def recall(y: np.ndarray, p: np.ndarray, threshold: float) -> Score:
    confusion = _confusion(y, p, threshold)

    def score(w: np.ndarray) -> np.ndarray:
        tp, _, actual = confusion(w)
        return np.divide(tp, actual, out=np.zeros_like(tp), where=actual > 0)

    return score


def f1(y: np.ndarray, p: np.ndarray, threshold: float) -> Score:
    confusion = _confusion(y, p, threshold)

    def score(w: np.ndarray) -> np.ndarray:
        tp, predicted, actual = confusion(w)
        return np.divide(2 * tp, predicted + actual, out=np.zeros_like(tp), where=tp > 0)  # 0 without a hit

    return score


# --- regression -------------------------------------------------------------------------------


def rmse(y: np.ndarray, pred: np.ndarray) -> Score:
    mse = _mean_of((pred - y) ** 2)

    def score(w: np.ndarray) -> np.ndarray:
        return np.sqrt(mse(w))

    return score


def mae(y: np.ndarray, pred: np.ndarray) -> Score:
    return _mean_of(np.abs(pred - y))


def r2(y: np.ndarray, pred: np.ndarray) -> Score:
    """1 - weighted SSE / weighted total sum of squares; undefined (NaN) where every drawn target is
    the same value, as regression._r2 raises."""
    centred = y - y.mean()  # the moments of a replicate about the rows' mean stay well conditioned
    moments = np.stack([np.ones_like(y), centred, centred**2, (y - pred) ** 2], axis=1)

    def score(w: np.ndarray) -> np.ndarray:
        total, s1, s2, sse = (w @ moments).T
        ss_tot = s2 - s1 * s1 / np.where(total > 0, total, 1.0)
        # Where that difference is lost to rounding (a replicate whose targets hardly vary), the
        # replicate's own rows decide: one distinct target leaves R² undefined.
        for i in np.flatnonzero(ss_tot <= 1e-9 * s2):
            drawn, weight = y[w[i] > 0], w[i][w[i] > 0]
            if len(drawn) == 0 or drawn.min() == drawn.max():
                ss_tot[i] = 0.0
            else:
                ss_tot[i] = weight @ (drawn - (weight @ drawn) / weight.sum()) ** 2
        return 1 - _ratio(sse, ss_tot)

    return score


# --- multiclass ---------------------------------------------------------------------------------


def accuracy(y: np.ndarray, p: np.ndarray) -> Score:
    return _mean_of(_predicted(p) == y)


def top_k_accuracy(y: np.ndarray, p: np.ndarray, k: int) -> Score:
    if k < 1:
        raise MetricError(f"top-k accuracy needs k of at least 1; got {k}")
    truth = p[np.arange(len(y)), y]
    return _mean_of((p > truth[:, None]).sum(axis=1) < k)


def multiclass_log_loss(y: np.ndarray, p: np.ndarray) -> Score:
    return _mean_of(-np.log(np.clip(p[np.arange(len(y)), y], LOG_LOSS_EPS, 1.0)))


def top_label_ece(y: np.ndarray, p: np.ndarray, bins: int) -> Score:
    return ece((_predicted(p) == y).astype(float), p.max(axis=1), bins)


def macro_f1(y: np.ndarray, p: np.ndarray) -> Score:
    """Per class, weighted true positives, predictions and actual rows; the mean F1 over the classes
    a replicate has among its labels or predictions (as multiclass._macro_f1)."""
    k, hat = p.shape[1], _predicted(p)
    columns = sparse.hstack([_one_hot(y, k, hat == y), _one_hot(hat, k), _one_hot(y, k)], format="csr")

    def score(w: np.ndarray) -> np.ndarray:
        sums = _sums(columns, w)
        tp, either = sums[:, :k], sums[:, k:2 * k] + sums[:, 2 * k:]
        seen = either > 0
        f1s = np.divide(2 * tp, either, out=np.zeros_like(tp), where=seen)
        return _ratio(f1s.sum(axis=1), seen.sum(axis=1).astype(float))

    return score


# The weighted form of each metric, by task and name (the names of ml_assets.spec's metric lists);
# a threshold metric's form takes the cut, ece's the bins, top_k_accuracy's k, as the plain ones.
CLASSIFICATION = {"roc_auc": roc_auc, "pr_auc": pr_auc, "log_loss": log_loss, "brier": brier, "ece": ece,
                  "precision": precision, "recall": recall, "f1": f1}
REGRESSION = {"rmse": rmse, "mae": mae, "r2": r2}
MULTICLASS = {"accuracy": accuracy, "macro_f1": macro_f1, "top_k_accuracy": top_k_accuracy,
              "log_loss": multiclass_log_loss, "ece": top_label_ece}
