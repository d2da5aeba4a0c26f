"""Simple baselines fitted on the model's own training days, scored on its test rows.

A model is worth its cost only if it beats what a practitioner would try first on the same data:

- ``base_rate``: the training window's positive rate (binary), class frequencies (multiclass) or
  mean (regression), predicted for every row;
- ``linear``: a logistic (binary, multinomial for multiclass) or ridge regression on the same
  encoded features (numerics through the same fitted feature state, categoricals one-hot).

Both see the model's own training days through the transform it was trained with, so the comparison
is fair. They are fitted on at most ``SAMPLE_ROWS`` of those rows, drawn uniformly without replacement
with ``SAMPLE_SEED`` (a window with fewer rows is used whole): a logistic regression on 200,000
rows is as good a bar as on millions, at a small part of the cost, and the report records the
sample (rows, the window's rows, the seed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from ml_assets.features.state import Encoded, cardinalities

BASE_RATE, LINEAR = "base_rate", "linear"
DESCRIPTIONS = {
    "binary_classification": {BASE_RATE: "the training days' positive rate",
                              LINEAR: "logistic regression on the same features"},
    "multiclass_classification": {BASE_RATE: "the training days' class frequencies",
                                  LINEAR: "multinomial logistic regression on the same features"},
    "regression": {BASE_RATE: "the training days' mean", LINEAR: "ridge regression on the same features"},
}
# Iterations of the linear fits: enough for lbfgs to converge on standardized inputs and one-hot codes.
MAX_ITER = 500
SAMPLE_ROWS = 200_000
"""The most training rows the baselines are fitted on; a larger window is sampled."""
SAMPLE_SEED = 0
"""The seed of that sample: the same window gives the same rows, so the same baselines."""


@dataclass(frozen=True)
class Baseline:
    name: str
    description: str
    predict: Callable[[Encoded], np.ndarray]


def design(encoded: Encoded, sizes: list[int]) -> sparse.csr_matrix:
    """Numerics as they are, each categorical one-hot over its full index range (OOV included)."""
    n = encoded.numeric.shape[0]
    blocks = [sparse.csr_matrix(encoded.numeric.astype(np.float64))]
    for i, size in enumerate(sizes):
        codes = np.clip(encoded.categorical[:, i], 0, size - 1)
        blocks.append(sparse.csr_matrix((np.ones(n), (np.arange(n), codes)), shape=(n, size)))
    return sparse.hstack(blocks, format="csr")


def fit_baselines(task: str, train: Encoded, state: dict, n_classes: int = 0) -> list[Baseline]:
    """The baselines of ``task``, fitted on ``train`` (the model's training rows, encoded by its state)."""
    from sklearn.linear_model import LogisticRegression, Ridge

    y = np.asarray(train.target)
    sizes = cardinalities(state)
    x = design(train, sizes)
    about = DESCRIPTIONS[task]
    if task == "regression":
        mean = float(y.mean())
        ridge = Ridge(alpha=1.0).fit(x, y)
        return [Baseline(BASE_RATE, about[BASE_RATE], lambda e: np.full(e.numeric.shape[0], mean)),
                Baseline(LINEAR, about[LINEAR], lambda e: ridge.predict(design(e, sizes)))]
    if task == "binary_classification":
        rate = float(y.mean())
        logistic = LogisticRegression(max_iter=MAX_ITER).fit(x, y.astype(np.int64))
        return [Baseline(BASE_RATE, about[BASE_RATE], lambda e: np.full(e.numeric.shape[0], rate)),
                Baseline(LINEAR, about[LINEAR], lambda e: logistic.predict_proba(design(e, sizes))[:, 1])]
    labels = y.astype(np.int64)
    freq = np.bincount(labels, minlength=n_classes) / len(labels)
    logistic = LogisticRegression(max_iter=MAX_ITER).fit(x, labels)

    def multinomial(e: Encoded) -> np.ndarray:
        # A class absent from the training days gets probability 0 from the fit: put it in its column.
        out = np.zeros((e.numeric.shape[0], n_classes))
        out[:, logistic.classes_] = logistic.predict_proba(design(e, sizes))
        return out

    return [Baseline(BASE_RATE, about[BASE_RATE], lambda e: np.tile(freq, (e.numeric.shape[0], 1))),
            Baseline(LINEAR, about[LINEAR], multinomial)]


def score_baselines(task: str, primary: str, baselines: list[Baseline], test: Encoded, y: np.ndarray,
                    pred: np.ndarray, threshold: float | None, val: Encoded | None, *, top_k: int,
                    bootstrap_samples: int, confidence_level: float) -> dict:
    """Each baseline's metrics on the test rows (a binary baseline's cut chosen on the validation
    rows, as the model's is), the best of them by the primary metric, and the model's paired
    bootstrap change over that best one: ``{"baselines": [...], "best": name, "delta": [point, lo, hi]}``."""
    from ml_assets.evaluation import metrics as M

    higher = M.HIGHER_IS_BETTER[primary]
    rows, predictions = [], {}
    for baseline in baselines:
        out = baseline.predict(test)
        cut = None
        if task == M.CLASSIFICATION and val is not None:
            cut = M.choose_threshold(np.asarray(val.target, dtype=np.float64), baseline.predict(val))
        values = M.compute_metrics(task, y, out, cut, top_k=top_k)
        rows.append({"name": baseline.name, "description": baseline.description, "metrics": values,
                     "threshold": cut})
        predictions[baseline.name] = out
    best = max(rows, key=lambda r: r["metrics"][primary] if higher else -r["metrics"][primary])
    # At the model's cut, as the champion comparison does: the change of a threshold metric is then
    # one cut applied to both.
    fn = M.metric_function(task, primary, threshold, top_k=top_k)
    delta = M.paired_bootstrap_delta(y, pred, predictions[best["name"]], fn, n=bootstrap_samples,
                                     level=confidence_level, seed=0)
    return {"baselines": rows, "best": best["name"], "delta": list(delta)}
