import numpy as np
import pytest

from ml_assets.defs.evaluation.metrics import MetricError, compute_metrics


def test_perfect_ranking_and_confident_errors():
    y = np.array([0, 0, 1, 1], dtype=np.float64)
    perfect = compute_metrics("binary_classification", y, np.array([0.1, 0.2, 0.8, 0.9]), ["roc_auc", "pr_auc"])
    assert perfect == {"roc_auc": 1.0, "pr_auc": 1.0}
    inverted = compute_metrics("binary_classification", y, np.array([0.9, 0.8, 0.2, 0.1]), ["roc_auc", "log_loss"])
    assert inverted["roc_auc"] == 0.0
    assert inverted["log_loss"] == pytest.approx(-np.mean(np.log([0.1, 0.2, 0.2, 0.1])))


def test_regression_metrics_by_hand():
    y, pred = np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 5.0])
    values = compute_metrics("regression", y, pred, ["rmse", "mae", "r2"])
    assert values["rmse"] == pytest.approx(np.sqrt(4 / 3))
    assert values["mae"] == pytest.approx(2 / 3)
    assert values["r2"] == pytest.approx(1 - 4 / 2)


def test_single_class_or_empty_day_is_an_error():
    with pytest.raises(MetricError, match="single class"):
        compute_metrics("binary_classification", np.zeros(5), np.full(5, 0.3), ["roc_auc"])
    with pytest.raises(MetricError, match="no held-out rows"):
        compute_metrics("binary_classification", np.zeros(0), np.zeros(0), ["roc_auc"])
