"""Multiclass metrics against scikit-learn and hand-computed cases; bootstrap, slices and plots on
(rows x classes) probabilities."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import (
    accuracy_score,
    f1_score,
    log_loss,
    precision_score,
    recall_score,
    top_k_accuracy_score,
)

from ml_assets.evaluation import metrics as m
from ml_assets.evaluation import plots
from ml_assets.evaluation.metrics import MetricError

MC = "multiclass_classification"
CLASSES = ["on_time", "late", "very_late", "cancelled"]


def informative(rows: int, classes: int = 4, seed: int = 0, signal: float = 1.5) -> tuple[np.ndarray, np.ndarray]:
    """Class indices and softmax probabilities that favour the true class, not always enough."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, rows)
    logits = rng.normal(size=(rows, classes)) + signal * np.eye(classes)[y]
    p = np.exp(logits)
    return y, p / p.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_scikit_learn_on_random_predictions(seed):
    y, p = informative(700, seed=seed)
    hat = p.argmax(axis=1)
    out = m.multiclass_metrics(y.astype(float), p, top_k=2)
    assert set(out) == set(m.MULTICLASS_METRICS)
    assert out["accuracy"] == pytest.approx(accuracy_score(y, hat))
    assert out["macro_f1"] == pytest.approx(f1_score(y, hat, average="macro"))
    assert out["log_loss"] == pytest.approx(log_loss(y, p, labels=range(4)))
    assert out["top_k_accuracy"] == pytest.approx(top_k_accuracy_score(y, p, k=2, labels=range(4)))
    assert m.multiclass_metrics(y, p, top_k=3)["top_k_accuracy"] == pytest.approx(
        top_k_accuracy_score(y, p, k=3, labels=range(4)))
    per_class = m.per_class_metrics(y, p, CLASSES)
    assert [c["class"] for c in per_class] == CLASSES
    assert [c["precision"] for c in per_class] == pytest.approx(list(precision_score(y, hat, average=None)))
    assert [c["recall"] for c in per_class] == pytest.approx(list(recall_score(y, hat, average=None)))
    assert [c["rows"] for c in per_class] == np.bincount(y, minlength=4).tolist()
    assert sum(c["rate"] for c in per_class) == pytest.approx(1.0)


def test_macro_f1_averages_the_classes_seen_as_scikit_learn_does():
    # class 3 is neither a label nor predicted on these rows: it is not averaged in as a zero
    y = np.array([0, 0, 1, 1, 2, 2])
    p = np.eye(4)[[0, 1, 1, 1, 2, 0]] * 0.7 + 0.075
    assert m.multiclass_metrics(y, p)["macro_f1"] == pytest.approx(f1_score(y, p.argmax(axis=1), average="macro"))
    precision = {c["class"]: c["precision"] for c in m.per_class_metrics(y, p, CLASSES)}
    assert precision["cancelled"] == 0.0  # never predicted: zero, as zero_division=0


def test_top_label_calibration_error_by_hand():
    # confidences 0.9, 0.9 (right, wrong) fall in the 0.9 bin: |0.5 - 0.9| on 2 of 4 rows;
    # 0.6, 0.6 (both right) in the 0.6 bin: |1.0 - 0.6| on 2 of 4 rows.
    p = np.array([[0.9, 0.05, 0.05], [0.05, 0.9, 0.05], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    y = np.array([0, 0, 0, 2])
    assert m.multiclass_metrics(y, p)["ece"] == pytest.approx(2 / 4 * 0.4 + 2 / 4 * 0.4)
    # a perfectly confident, always right model is perfectly calibrated
    assert m.multiclass_metrics([0, 1, 2], np.eye(3))["ece"] == 0.0


def test_input_errors():
    y, p = informative(10)
    with pytest.raises(MetricError, match=r"class indices 0..3; found 4"):
        m.multiclass_metrics(np.r_[y[:-1], 4], p)
    with pytest.raises(MetricError, match="summing to 1"):
        m.multiclass_metrics(y, p * 2)
    with pytest.raises(MetricError, match="rows x classes"):
        m.multiclass_metrics(y, p[:, 0])
    with pytest.raises(MetricError, match="10 labels but 9 predictions"):
        m.multiclass_metrics(y, p[:9])
    with pytest.raises(MetricError, match="unknown multiclass metric 'roc_auc'"):
        m.metric_function(MC, "roc_auc")
    with pytest.raises(MetricError, match="3 class names for predictions of 4 classes"):
        m.per_class_metrics(y, p, CLASSES[:3])


def test_metric_function_agrees_with_compute_metrics():
    y, p = informative(300)
    every = m.compute_metrics(MC, y, p, top_k=3)
    for name in m.MULTICLASS_METRICS:
        assert m.metric_function(MC, name, top_k=3)(y, p) == pytest.approx(every[name])


def test_bootstrap_and_paired_delta_resample_rows_of_probabilities():
    y, p = informative(800)
    f1 = m.metric_function(MC, "macro_f1")
    lo, hi = m.bootstrap_ci(y, p, f1, n=300)
    assert lo < f1(y, p) < hi
    assert m.paired_bootstrap_delta(y, p, p, f1, n=100) == (0.0, 0.0, 0.0)
    _, weak = informative(800, signal=0.3, seed=9)
    delta, dlo, dhi = m.paired_bootstrap_delta(y, p, weak, f1, n=300)
    assert delta == pytest.approx(f1(y, p) - f1(y, weak))
    assert 0 < dlo <= delta <= dhi
    with pytest.raises(MetricError, match="must predict the same classes"):
        m.paired_bootstrap_delta(y, p, p[:, :3], f1, n=100)


def test_bootstrap_of_multiclass_metrics_is_fast_enough():
    import time

    y, p = informative(2000)
    start = time.perf_counter()
    m.bootstrap_ci(y, p, m.metric_function(MC, "macro_f1"), n=1000)
    assert time.perf_counter() - start < 5


def test_slices_carry_each_class_share():
    y, p = informative(400)
    group = np.where(np.arange(400) < 300, "JFK", "EWR")
    rows = m.slice_metrics({"origin": group}, y, p, m.metric_function(MC, "accuracy"), min_size=150)
    by = {r["value"]: r for r in rows}
    assert by["JFK"]["metric"] == pytest.approx(m.multiclass_metrics(y[:300], p[:300])["accuracy"])
    assert by["JFK"]["class_rates"] == pytest.approx(list(np.bincount(y[:300], minlength=4) / 300))
    assert "positive_rate" not in by["JFK"]
    assert by["EWR"]["metric"] is None and by["EWR"]["reason"] == "fewer than 150 rows"


def test_confusion_matrix_and_top_label_calibration_plots(tmp_path):
    y, p = informative(300)
    _, old = informative(300, seed=4)
    preds = {"challenger v5": p, "champion v3": old}
    written = [plots.confusion_matrix_png(y, preds, CLASSES, tmp_path / "confusion_matrix.png"),
               plots.calibration_png(y, preds, tmp_path / "calibration.png")]
    for path in written:
        data = path.read_bytes()
        assert len(data) > 100 and data.startswith(b"\x89PNG")
    with pytest.raises(MetricError, match="3 class names for predictions of 4 classes"):
        plots.confusion_matrix_png(y, preds, CLASSES[:3], tmp_path / "bad.png")
