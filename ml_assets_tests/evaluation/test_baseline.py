"""The baselines beside every evaluation: fitted on the model's training rows through its feature
state, scored on its test rows, and the bar a first model has to clear."""

import numpy as np
import pytest

from ml_assets.evaluation import metrics as M
from ml_assets.evaluation.baseline import BASE_RATE, LINEAR, fit_baselines, score_baselines
from ml_assets.evaluation.document import EvaluationReport
from ml_assets.evaluation.policy import decide
from ml_assets.features.state import Encoded
from ml_assets.spec import PromotionSpec

STATE = {"categorical": [{"name": "c", "encoding": "vocabulary", "vocabulary": ["a", "b", "c"]}]}


def rows(n: int, seed: int, task: str) -> Encoded:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)).astype(np.float32)
    c = rng.integers(0, 4, size=(n, 1))
    score = 2 * x[:, 0] - x[:, 1] + (c[:, 0] == 2)
    if task == "regression":
        y = score + rng.normal(scale=0.1, size=n)
    elif task == "binary_classification":
        y = (score + rng.logistic(size=n) * 0.3 > 0.5).astype(np.float32)
    else:
        y = np.digitize(score + rng.normal(scale=0.2, size=n), [-1.0, 1.0]).astype(np.int64)
    return Encoded(numeric=x, categorical=c, target=y)


@pytest.mark.parametrize("task", ["binary_classification", "multiclass_classification", "regression"])
def test_the_linear_baseline_learns_what_the_base_rate_cannot(task):
    train, test = rows(2000, 0, task), rows(500, 1, task)
    primary = {"binary_classification": "roc_auc", "multiclass_classification": "log_loss",
               "regression": "rmse"}[task]
    baselines = fit_baselines(task, train, STATE, n_classes=3)
    assert [b.name for b in baselines] == [BASE_RATE, LINEAR]
    y = np.asarray(test.target, dtype=np.float64)
    perfect = np.eye(3)[y.astype(int)] * 0.98 + 0.02 / 3 if task == "multiclass_classification" else y
    scored = score_baselines(task, primary, baselines, test, y, perfect, 0.5, train, top_k=2,
                             bootstrap_samples=200, confidence_level=0.9)
    by_name = {b["name"]: b["metrics"][primary] for b in scored["baselines"]}
    better = (lambda a, b: a > b) if M.HIGHER_IS_BETTER[primary] else (lambda a, b: a < b)
    assert better(by_name[LINEAR], by_name[BASE_RATE]) and scored["best"] == LINEAR
    point, lo, hi = scored["delta"]
    assert lo <= point <= hi and better(point, 0.0)  # the exact labels beat the linear fit
    if task == "binary_classification":
        assert by_name[BASE_RATE] == 0.5 and by_name[LINEAR] > 0.9


def test_a_first_model_must_beat_the_best_baseline_by_the_margin():
    policy = PromotionSpec(primary_metric="roc_auc", min_improvement=0.01)
    baseline = {"baselines": [{"name": LINEAR, "description": "logistic regression on the same features",
                               "metrics": {"roc_auc": 0.66}}], "best": LINEAR}
    report = {"metrics": {"roc_auc": 0.665}, "champion": None, "baseline": {**baseline, "delta": [0.005, 0.0, 0.01]}}
    weak = decide(policy, EvaluationReport.from_dict(report))
    assert not weak.passed and [c.name for c in weak.failed] == ["improvement of roc_auc over the baseline"]
    assert "baseline linear (logistic regression on the same features) 0.6600: +0.0050" in weak.reason()
    assert decide(policy, EvaluationReport.from_dict({**report, "baseline": {**baseline, "delta": [0.04, 0.03, 0.05]}})).passed
    assert decide(policy.model_copy(update={"beat_baseline": False}), EvaluationReport.from_dict(report)).passed
