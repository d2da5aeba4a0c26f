"""The bootstrap scores resamples as counts of the rows: the same resamples, and the same intervals,
as scoring each resample's rows afresh; within Monte Carlo error of other seeds; in bounded blocks."""

from __future__ import annotations

import numpy as np
import pytest

from ml_assets.evaluation import bootstrap
from ml_assets.evaluation import metrics as m
from ml_assets.evaluation.metrics import MetricError
from ml_assets_tests.evaluation.test_weighted import CLS, EVERY_METRIC, metric, rows


def per_resample(fn):
    """fn without its weighted form: the bootstrap scores every resample's own rows (as before)."""

    def plain(y, pred):
        return fn(y, pred)

    return plain


@pytest.mark.parametrize(("task", "name"), EVERY_METRIC, ids=lambda v: v)
def test_the_interval_from_counts_is_the_interval_from_the_resampled_rows(task, name):
    y, pred = rows(task)
    fn = metric(task, name)
    fast = m.bootstrap_ci(y, pred, fn, n=200, level=0.9, seed=3)
    assert fast == pytest.approx(m.bootstrap_ci(y, pred, per_resample(fn), n=200, level=0.9, seed=3),
                                 rel=1e-10, abs=1e-12)


@pytest.mark.parametrize(("task", "name"), EVERY_METRIC, ids=lambda v: v)
def test_the_paired_delta_from_counts_is_the_delta_from_the_resampled_rows(task, name):
    y, pred = rows(task)
    _, other = rows(task, seed=1)
    fn = metric(task, name)
    fast = m.paired_bootstrap_delta(y, pred, other, fn, n=200, seed=5)
    assert fast == pytest.approx(m.paired_bootstrap_delta(y, pred, other, per_resample(fn), n=200, seed=5),
                                 rel=1e-10, abs=1e-12)


def test_the_interval_is_within_monte_carlo_error_of_the_per_resample_method_on_other_seeds():
    rng = np.random.default_rng(11)
    y = rng.integers(0, 2, 1000).astype(float)
    p = np.round(np.clip(0.3 * y + 0.7 * rng.random(1000), 0, 1), 3)
    fn = metric(CLS, "roc_auc")
    before = np.array([m.bootstrap_ci(y, p, per_resample(fn), n=200, seed=s) for s in range(16)])
    now = np.array([m.bootstrap_ci(y, p, fn, n=200, seed=s) for s in range(16, 32)])
    # Other seeds, other resamples: each bound's mean over 16 seeds agrees with the old method's
    # within 3 standard errors of the difference (the same estimate, not a biased one).
    error = np.sqrt((before.var(axis=0, ddof=1) + now.var(axis=0, ddof=1)) / 16)
    assert np.all(np.abs(now.mean(axis=0) - before.mean(axis=0)) <= 3 * error)


def test_counts_are_the_resampled_indices_in_blocks_of_bounded_size(monkeypatch):
    monkeypatch.setattr(bootstrap, "_BOOTSTRAP_CELLS", 50 * 7)  # blocks of 7 resamples of 50 rows
    blocks = list(bootstrap._resample_counts(50, 30, seed=2))
    indices = np.concatenate(list(bootstrap._resample_indices(50, 30, seed=2)))
    assert [len(b) for b in blocks] == [7, 7, 7, 7, 2]
    assert all(b.size <= bootstrap._BOOTSTRAP_CELLS for b in blocks)
    expected = np.stack([np.bincount(i, minlength=50) for i in indices])
    assert np.array_equal(np.concatenate(blocks), expected)
    assert np.concatenate(blocks).sum(axis=1).tolist() == [50] * 30  # each resample draws every row's worth


def test_blocks_and_the_second_thread_do_not_change_the_interval(monkeypatch):
    y, p = rows(CLS)
    fn = metric(CLS, "roc_auc")
    first = m.bootstrap_ci(y, p, fn, n=300, seed=7)
    assert m.bootstrap_ci(y, p, fn, n=300, seed=7) == first
    assert m.bootstrap_ci(y, p, fn, n=300, seed=8) != first
    monkeypatch.setattr(bootstrap, "_BOOTSTRAP_CELLS", len(y) * 4)
    assert m.bootstrap_ci(y, p, fn, n=300, seed=7) == first
    monkeypatch.setattr(bootstrap.os, "sched_getaffinity", lambda _: {0}, raising=False)  # one core: no thread
    assert m.bootstrap_ci(y, p, fn, n=300, seed=7) == first


def test_inputs_no_resample_accepts_fail_as_they_did():
    fn = metric(CLS, "roc_auc")
    with pytest.raises(MetricError, match="undefined on 100 of 100 bootstrap resamples"):
        m.bootstrap_ci([2, 2, 3, 5], [0.1, 0.2, 0.3, 0.4], fn, n=100)  # labels not 0/1: the per-resample path
    with pytest.raises(MetricError, match="undefined on 100 of 100 bootstrap resamples"):
        m.bootstrap_ci([0, 1, 1, 0], [0.1, 0.2, 0.3, 0.4], m.metric_function(m.MULTICLASS, "accuracy"), n=100)
