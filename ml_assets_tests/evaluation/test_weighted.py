"""The weighted form of every metric: on integer weights it is the plain metric of the rows repeated
that many times, for each task and metric the spec knows, with ties, zero weights and the cases
where the plain metric is undefined."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from ml_assets.evaluation import metrics as m
from ml_assets.evaluation import weighted
from ml_assets.evaluation.metrics import MetricError
from ml_assets.spec.evaluation import TASK_METRICS

CLS, REG, MC = "binary_classification", "regression", "multiclass_classification"
ROWS = 300


def rows(task: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels and predictions with many tied scores (rounded), as float32 model outputs have."""
    rng = np.random.default_rng(seed)
    if task == CLS:
        y = rng.integers(0, 2, ROWS).astype(float)
        return y, np.round(np.clip(0.4 * y + 0.6 * rng.random(ROWS), 0, 1), 2)
    if task == REG:
        y = np.round(rng.normal(size=ROWS), 1)
        return y, y + np.round(rng.normal(scale=0.5, size=ROWS), 1)
    y = rng.integers(0, 4, ROWS)
    logits = np.round(rng.normal(size=(ROWS, 4)) + 1.5 * np.eye(4)[y], 1)
    p = np.exp(logits)
    return y.astype(float), p / p.sum(axis=1, keepdims=True)


def metric(task: str, name: str):
    return m.metric_function(task, name, 0.5 if task == CLS else None, top_k=2)


EVERY_METRIC = [(task, name) for task, names in TASK_METRICS.items() for name in names]


def counts(seed: int) -> np.ndarray:
    """Integer weights as a resample draws them: many 0s and 1s, some 2s and more."""
    return np.random.default_rng(seed).poisson(1.0, ROWS).astype(float)


@pytest.mark.parametrize(("task", "name"), EVERY_METRIC, ids=lambda v: v)
def test_every_metric_weighted_by_counts_is_the_metric_of_the_repeated_rows(task, name):
    y, pred = rows(task)
    fn = metric(task, name)
    score = fn.weighted(y, pred)
    w = np.stack([counts(seed) for seed in range(5)] + [np.ones(ROWS)])
    repeated = [fn(np.repeat(y, c.astype(int)), np.repeat(pred, c.astype(int), axis=0)) for c in w]
    assert score(w) == pytest.approx(repeated, rel=1e-10, abs=1e-12)
    assert score(w[1:3]) == pytest.approx(score(w)[1:3], rel=1e-12, abs=1e-15)  # a replicate is its own row


def test_every_metric_of_every_task_has_a_weighted_form():
    for task, name in EVERY_METRIC:
        assert callable(getattr(metric(task, name), "weighted", None)), (task, name)
    assert set(weighted.CLASSIFICATION) == set(TASK_METRICS[CLS])
    assert set(weighted.REGRESSION) == set(TASK_METRICS[REG])
    assert set(weighted.MULTICLASS) == set(TASK_METRICS[MC])


def test_roc_auc_counts_tied_pairs_one_half_as_scikit_learn_does():
    y = np.array([0, 1, 0, 1, 0, 1, 1, 0], dtype=float)
    s = np.array([0.2, 0.2, 0.5, 0.5, 0.5, 0.9, 0.1, 0.9])  # ties within and across the classes
    w = np.array([[1, 2, 0, 3, 1, 1, 2, 4], [2, 1, 1, 1, 3, 0, 1, 1]], dtype=float)
    expected = [roc_auc_score(y, s, sample_weight=row) for row in w]
    assert weighted.roc_auc(y, s)(w) == pytest.approx(expected, rel=1e-12)


def test_a_replicate_where_the_metric_is_undefined_scores_nan():
    y = np.array([0, 0, 1, 1], dtype=float)
    p = np.array([0.1, 0.4, 0.35, 0.8])
    one_class = np.array([[2, 2, 0, 0], [1, 1, 1, 1]], dtype=float)
    for name in ("roc_auc", "pr_auc"):
        with pytest.raises(MetricError, match="single class"):
            metric(CLS, name)(y[:2], p[:2])
        values = metric(CLS, name).weighted(y, p)(one_class)
        assert np.isnan(values[0]) and np.isfinite(values[1])
    # R² of a replicate that drew one target value only, as regression._r2 raises
    target, pred = np.array([1.5, 1.5, 2.0, 3.0]), np.array([1.4, 1.6, 2.1, 2.7])
    r2 = metric(REG, "r2").weighted(target, pred)(np.array([[3, 1, 0, 0], [1, 1, 1, 1]], dtype=float))
    assert np.isnan(r2[0]) and r2[1] == pytest.approx(metric(REG, "r2")(target, pred))


def test_r2_keeps_a_small_spread_of_targets_far_from_zero():
    y = 1e6 + np.array([0.0, 1e-3, 2e-3, 0.0])  # a spread lost to rounding in the raw moments
    pred = y + np.array([1e-4, -1e-4, 0.0, 2e-4])
    w = np.array([[1, 2, 1, 1]], dtype=float)
    expected = metric(REG, "r2")(np.repeat(y, [1, 2, 1, 1]), np.repeat(pred, [1, 2, 1, 1]))
    assert metric(REG, "r2").weighted(y, pred)(w)[0] == pytest.approx(expected, rel=1e-6)


def test_the_weighted_form_checks_its_inputs_as_the_metric_does():
    with pytest.raises(MetricError, match="labels must be 0/1"):
        metric(CLS, "roc_auc").weighted([0, 2], [0.1, 0.2])
    with pytest.raises(MetricError, match=r"probabilities in \[0, 1\]"):
        metric(CLS, "log_loss").weighted([0, 1], [0.1, 1.2])
    with pytest.raises(MetricError, match="class indices"):
        metric(MC, "accuracy").weighted([0, 5], np.full((2, 3), 1 / 3))
    with pytest.raises(MetricError, match="k of at least 1"):
        m.metric_function(MC, "top_k_accuracy", top_k=0).weighted([0, 1], np.full((2, 3), 1 / 3))
