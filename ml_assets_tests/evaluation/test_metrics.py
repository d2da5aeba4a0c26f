"""Evaluation metrics against hand-computed values, bootstrap behaviour, slices and plots."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from ml_assets.evaluation import bootstrap, plots
from ml_assets.evaluation import metrics as m
from ml_assets.evaluation.metrics import MetricError

CLS = "binary_classification"
REG = "regression"


def informative(rows: int, seed: int = 0, signal: float = 0.4) -> tuple[np.ndarray, np.ndarray]:
    """Labels and probabilities that rank the labels well but not perfectly."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, rows)
    return y, np.clip(y * signal + rng.random(rows) * (1 - signal), 0, 1)


# --- hand-computed values -------------------------------------------------------------------


def test_ece_by_hand():
    # bins of width 0.5: [0.1, 0.1] with labels [0, 1] -> |0.5 - 0.1| = 0.4 on 2 of 5 rows;
    # [0.8, 0.8, 0.8] with labels [1, 1, 0] -> |2/3 - 0.8| on 3 of 5 rows.
    y, p = [0, 1, 1, 1, 0], [0.1, 0.1, 0.8, 0.8, 0.8]
    expected = 2 / 5 * 0.4 + 3 / 5 * abs(2 / 3 - 0.8)
    assert m.expected_calibration_error(y, p, bins=2) == pytest.approx(expected)
    assert expected == pytest.approx(0.24)
    # one row per bin: the mean absolute gap; p = 1.0 falls in the last bin, empty bins add nothing
    assert m.expected_calibration_error([0, 1, 1, 0], [0.05, 0.15, 0.85, 1.0]) == pytest.approx(
        (0.05 + 0.85 + 0.15 + 1.0) / 4)


def test_perfect_and_inverted_rankings():
    y = [0, 0, 1, 1]
    perfect = m.classification_metrics(y, [0.1, 0.2, 0.8, 0.9], threshold=0.5)
    assert perfect["roc_auc"] == 1.0
    assert perfect["pr_auc"] == 1.0
    assert perfect["precision"] == perfect["recall"] == perfect["f1"] == 1.0
    inverted = m.classification_metrics(y, [0.9, 0.8, 0.2, 0.1], threshold=0.5)
    assert inverted["roc_auc"] == 0.0
    # positives found at ranks 3 and 4: precision 1/3 then 2/4, each for half the recall
    assert inverted["pr_auc"] == pytest.approx(0.5 * 1 / 3 + 0.5 * 2 / 4)
    assert inverted["precision"] == inverted["recall"] == inverted["f1"] == 0.0
    # all tied: chance
    assert m.classification_metrics(y, [0.5] * 4, 0.5)["roc_auc"] == 0.5


def test_threshold_metrics_by_hand_count():
    y = [1, 1, 1, 0, 0, 0, 1, 0]
    p = [0.9, 0.6, 0.4, 0.7, 0.2, 0.55, 0.5, 0.1]
    # p >= 0.5 (0.5 included): rows 0, 1, 3, 5, 6 -> TP rows 0, 1, 6; FP rows 3, 5; FN row 2
    out = m.classification_metrics(y, p, threshold=0.5)
    assert out["precision"] == pytest.approx(3 / 5)
    assert out["recall"] == pytest.approx(3 / 4)
    assert out["f1"] == pytest.approx(2 * 3 / (2 * 3 + 2 + 1))
    # nothing predicted positive: zero_division=0
    assert m.classification_metrics(y, p, threshold=0.95)["precision"] == 0.0


def test_probability_metrics_by_hand():
    out = m.classification_metrics([1, 0], [0.8, 0.4], threshold=0.5)
    assert out["brier"] == pytest.approx((0.2**2 + 0.4**2) / 2)
    assert out["log_loss"] == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)
    assert set(out) == set(m.CLASSIFICATION_METRICS)
    # a confident mistake is clipped to 1e-7, not infinite
    clipped = m.classification_metrics([0, 1], [1.0, 1.0], threshold=0.5)["log_loss"]
    assert clipped == pytest.approx(-(math.log(1e-7) + math.log(1 - 1e-7)) / 2)


def test_regression_by_hand():
    # errors 1, 0, -1, -2: MSE 6/4; mean target 2.5 -> total sum of squares 5
    out = m.regression_metrics([1, 2, 3, 4], [2, 2, 2, 2])
    assert out == pytest.approx({"rmse": math.sqrt(1.5), "mae": 1.0, "r2": 1 - 6 / 5})
    assert m.compute_metrics(REG, [1, 2, 3, 4], [2, 2, 2, 2]) == out


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 300)
    p = np.round(rng.random(300), 1)  # many ties
    out = m.classification_metrics(y, p, 0.5)
    assert out["roc_auc"] == pytest.approx(roc_auc_score(y, p))
    assert out["pr_auc"] == pytest.approx(average_precision_score(y, p))


def test_metric_function_agrees_with_compute_metrics():
    y, p = informative(200)
    every = m.compute_metrics(CLS, y, p, threshold=0.5)
    for name in m.CLASSIFICATION_METRICS:
        assert m.metric_function(CLS, name, threshold=0.5)(y, p) == pytest.approx(every[name])
    assert set(m.HIGHER_IS_BETTER) == (set(m.CLASSIFICATION_METRICS) | set(m.REGRESSION_METRICS)
                                       | set(m.MULTICLASS_METRICS))


# --- threshold ------------------------------------------------------------------------------


def test_choose_threshold_maximizes_f1():
    # cuts: 0.8 -> F1 1/2, 0.6 -> 4/5, 0.4 -> 2/3, 0.3 -> 6/7 (best), 0.2 -> 3/4, 0.1 -> 2/3
    assert m.choose_threshold([0, 0, 1, 0, 1, 1], [0.1, 0.2, 0.3, 0.4, 0.6, 0.8]) == 0.3


def test_choose_threshold_tie_takes_higher_cut():
    # F1 = 2 TP / (predicted positives + positives): 0.9 -> 2/3, 0.3 -> 4/6: a tie
    assert m.choose_threshold([1, 0, 0, 1], [0.9, 0.7, 0.5, 0.3]) == 0.9


# --- errors ---------------------------------------------------------------------------------


def test_single_class_and_empty_errors():
    with pytest.raises(MetricError, match=r"held-out rows have a single class \(0\); ROC-AUC and "
                                          r"PR-AUC are undefined"):
        m.classification_metrics([0, 0, 0], [0.1, 0.2, 0.3], threshold=0.5)
    with pytest.raises(MetricError, match="no held-out rows to evaluate on"):
        m.compute_metrics(CLS, [], [], threshold=0.5)
    with pytest.raises(MetricError, match="no held-out rows"):
        m.regression_metrics([], [])
    with pytest.raises(MetricError, match=r"validation rows have a single class \(1\)"):
        m.choose_threshold([1, 1], [0.2, 0.9])
    with pytest.raises(MetricError, match="no validation rows"):
        m.choose_threshold([], [])
    with pytest.raises(MetricError, match="ROC-AUC is undefined"):
        m.metric_function(CLS, "roc_auc")([1, 1], [0.2, 0.9])
    with pytest.raises(MetricError, match="R² is undefined"):
        m.regression_metrics([3, 3], [1, 2])


def test_input_errors():
    with pytest.raises(MetricError, match="need a decision threshold"):
        m.compute_metrics(CLS, [0, 1], [0.2, 0.8])
    with pytest.raises(MetricError, match="f1 needs a decision threshold"):
        m.metric_function(CLS, "f1")
    with pytest.raises(MetricError, match="unknown task 'ranking'"):
        m.metric_function("ranking", "ndcg")
    with pytest.raises(MetricError, match="unknown regression metric 'roc_auc'"):
        m.metric_function(REG, "roc_auc")
    with pytest.raises(MetricError, match="3 labels but 2 predictions"):
        m.regression_metrics([1, 2, 3], [1, 2])
    with pytest.raises(MetricError, match="labels must be 0/1; found 2"):
        m.classification_metrics([0, 1, 2], [0.1, 0.2, 0.3], 0.5)
    with pytest.raises(MetricError, match=r"probabilities in \[0, 1\]"):
        m.classification_metrics([0, 1], [-0.5, 2.0], 0.5)
    with pytest.raises(MetricError, match="1 missing or infinite"):
        m.regression_metrics([1, 2], [1, float("nan")])


# --- bootstrap ------------------------------------------------------------------------------


def test_bootstrap_ci_contains_point_and_narrows_with_rows():
    auc = m.metric_function(CLS, "roc_auc")
    widths = []
    for rows in (200, 2000):
        y, p = informative(rows, seed=rows)
        lo, hi = m.bootstrap_ci(y, p, auc, n=300)
        assert lo <= auc(y, p) <= hi
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 2  # ~ 1 / sqrt(rows)


def test_bootstrap_is_seeded_and_blocking_does_not_change_it(monkeypatch):
    y, p = informative(500)
    brier = m.metric_function(CLS, "brier")
    first = m.bootstrap_ci(y, p, brier, n=200, seed=7)
    assert m.bootstrap_ci(y, p, brier, n=200, seed=7) == first
    assert m.bootstrap_ci(y, p, brier, n=200, seed=8) != first
    monkeypatch.setattr(bootstrap, "_BOOTSTRAP_CELLS", 500 * 3)  # index blocks of 3 resamples
    assert m.bootstrap_ci(y, p, brier, n=200, seed=7) == first


def test_bootstrap_skips_undefined_resamples_but_not_most():
    y = np.r_[np.ones(3), np.zeros(27)]  # a resample has no positive ~4% of the time
    p = np.linspace(0.0, 1.0, 30)
    lo, hi = m.bootstrap_ci(y, p, m.metric_function(CLS, "roc_auc"), n=200)
    assert 0 <= lo <= hi <= 1

    def undefined(y, p):
        raise MetricError("never defined")

    with pytest.raises(MetricError, match="undefined on 200 of 200 bootstrap resamples"):
        m.bootstrap_ci(y, p, undefined, n=200)


def test_bootstrap_is_fast_enough():
    import time

    y, p = informative(1000)
    start = time.perf_counter()
    m.bootstrap_ci(y, p, m.metric_function(CLS, "roc_auc"), n=1000)
    assert time.perf_counter() - start < 3


def test_paired_delta():
    y, p = informative(400)
    auc = m.metric_function(CLS, "roc_auc")
    assert m.paired_bootstrap_delta(y, p, p, auc, n=200) == (0.0, 0.0, 0.0)
    noise = np.random.default_rng(1).random(400)
    delta, lo, hi = m.paired_bootstrap_delta(y, p, noise, auc, n=200)
    assert delta == pytest.approx(auc(y, p) - auc(y, noise))
    assert 0 < lo <= delta <= hi


# --- slices ---------------------------------------------------------------------------------


def test_slice_metrics_sizes_single_class_and_order():
    y = np.array([1, 0, 1, 0, 1, 0, 0, 0, 1])
    p = np.array([0.9, 0.1, 0.8, 0.3, 0.7, 0.2, 0.6, 0.4, 0.95])
    columns = {
        "origin": np.array(["JFK"] * 6 + ["LGA"] * 2 + ["EWR"]),
        "carrier": np.array(["AA", "AA", "AA", "AA", "UA", "UA", "UA", "UA", "DL"], dtype=object),
    }
    rows = m.slice_metrics(columns, y, p, m.metric_function(CLS, "roc_auc"), min_size=2)
    assert [(r["column"], r["value"], r["rows"]) for r in rows] == [
        ("carrier", "AA", 4), ("carrier", "UA", 4), ("carrier", "DL", 1),
        ("origin", "JFK", 6), ("origin", "LGA", 2), ("origin", "EWR", 1),
    ]
    by = {(r["column"], r["value"]): r for r in rows}
    assert by["carrier", "AA"]["metric"] == 1.0 and by["carrier", "AA"]["reason"] is None
    assert by["carrier", "AA"]["positive_rate"] == 0.5
    small = by["carrier", "DL"]
    assert small["metric"] is None and small["reason"] == "fewer than 2 rows"
    single = by["origin", "LGA"]  # two rows, both negative
    assert single["metric"] is None and "single class (0)" in single["reason"]
    assert single["positive_rate"] == 0.0


def test_slice_metrics_null_values_and_length_check():
    rows = m.slice_metrics({"x": np.array([1.0, np.nan, np.nan])}, [1.0, 2.0, 4.0],
                           [1.0, 2.0, 3.0], m.metric_function(REG, "mae"), min_size=1)
    assert [(r["value"], r["rows"], r["metric"]) for r in rows] == [("null", 2, 0.5), ("1.0", 1, 0.0)]
    with pytest.raises(MetricError, match="slice column 'x' has 2 values for 3 rows"):
        m.slice_metrics({"x": np.array([1, 2])}, [1, 2, 3], [1, 2, 3], lambda y, p: 0.0, min_size=1)


def test_slice_regressions_sign_convention():
    def row(value, metric):
        return {"column": "c", "value": value, "rows": 10, "metric": metric}

    new = [row("a", 0.70), row("b", 0.90), row("c", None), row("d", 0.5)]
    old = [row("a", 0.80), row("b", 0.85), row("c", 0.9)]  # "d" is new: not matched
    worse_first = m.slice_regressions(new, old, higher_is_better=True)  # e.g. AUC
    assert [(r["value"], r["regression"]) for r in worse_first] == [
        ("a", pytest.approx(0.10)), ("b", pytest.approx(-0.05))]
    assert worse_first[0]["new"] == 0.70 and worse_first[0]["old"] == 0.80
    lower = m.slice_regressions(new, old, higher_is_better=False)  # e.g. log loss
    assert [(r["value"], r["regression"]) for r in lower] == [
        ("b", pytest.approx(0.05)), ("a", pytest.approx(-0.10))]


# --- plots ----------------------------------------------------------------------------------


def _is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 100 and data.startswith(b"\x89PNG")


def test_every_plot_writes_a_png(tmp_path):
    y, p = informative(300)
    old = np.random.default_rng(5).random(300)
    preds = {"challenger v5": p, "champion v3": old}
    slices = m.slice_metrics({"g": np.arange(300) % 4}, y, p, m.metric_function(CLS, "roc_auc"),
                             min_size=80)
    for s in slices:
        s["champion"] = 0.5
    reg_y = np.linspace(0, 10, 50)
    written = [
        plots.roc_curve_png(y, preds, tmp_path / "roc.png"),
        plots.pr_curve_png(y, preds, tmp_path / "pr.png"),
        plots.calibration_png(y, preds, tmp_path / "cal.png", bins=5),
        plots.loss_curves_png([{"epoch": e, "train_loss": 1 / e, "val_loss": 1.2 / e}
                               for e in range(1, 6)], tmp_path / "loss.png"),
        plots.slice_metrics_png(slices, "roc_auc", tmp_path / "slices.png"),
        plots.slice_metrics_png([{**s, "champion": None} for s in slices[:2]], "roc_auc",
                                tmp_path / "nested" / "slices_single.png"),
        plots.slice_metrics_png([{"column": "g", "value": "1", "rows": 1, "metric": None}],
                                "roc_auc", tmp_path / "slices_empty.png"),
        plots.residuals_png(reg_y, {"v2": reg_y + np.sin(reg_y)}, tmp_path / "resid.png"),
    ]
    assert [path.name for path in written] == [
        "roc.png", "pr.png", "cal.png", "loss.png", "slices.png", "slices_single.png",
        "slices_empty.png", "resid.png"]
    assert all(_is_png(path) for path in written)


def test_plot_errors(tmp_path):
    with pytest.raises(MetricError, match="single class"):
        plots.roc_curve_png([0, 0], {"m": [0.1, 0.2]}, tmp_path / "roc.png")
    with pytest.raises(MetricError, match="no model predictions"):
        plots.pr_curve_png([0, 1], {}, tmp_path / "pr.png")
    assert not list(tmp_path.iterdir())
