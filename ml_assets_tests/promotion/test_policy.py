"""The promotion policy clause by clause, on hand-made reports."""

import json

import pytest

from ml_assets.evaluation.document import EvaluationReport, Gate
from ml_assets.evaluation.policy import decide
from ml_assets.spec import PromotionSpec

POLICY = PromotionSpec(primary_metric="roc_auc", min_improvement=0.005, max_slice_regression=0.05,
                       max_calibration_worsening=0.02, floors={"roc_auc": 0.6, "log_loss": 0.5})


def challenger(new: float, old: float, *, worst_slice: float = 0.0, ece: tuple[float, float] = (0.02, 0.02)) -> dict:
    return {
        "metrics": {"roc_auc": new, "ece": ece[0]},
        "champion": {"version": "3", "metrics": {"roc_auc": old, "ece": ece[1]}, "same_weights": False},
        "primary_delta": [new - old, new - old - 0.01, new - old + 0.01],
        "slice_regressions": [{"column": "carrier", "value": "UA", "rows": 120, "new": 0.7 - worst_slice,
                               "old": 0.7, "regression": worst_slice}],
    }


def test_first_model_must_reach_every_floor():
    ok = decide(POLICY, EvaluationReport.from_dict({"metrics": {"roc_auc": 0.65, "log_loss": 0.4}, "champion": None}))
    assert ok.passed and ok.kind == "first_model"
    low = decide(POLICY, EvaluationReport.from_dict({"metrics": {"roc_auc": 0.65, "log_loss": 0.7}, "champion": None}))
    assert not low.passed
    assert [c.name for c in low.failed] == ["floor log_loss"]  # lower is better: 0.7 > ceiling 0.5
    assert "log_loss 0.7000 misses the floor <= 0.5" in low.reason()


def test_challenger_needs_the_minimum_improvement():
    assert decide(POLICY, EvaluationReport.from_dict(challenger(0.706, 0.700))).passed
    small = decide(POLICY, EvaluationReport.from_dict(challenger(0.703, 0.700)))
    assert not small.passed and [c.name for c in small.failed] == ["improvement of roc_auc"]
    assert "+0.0030" in small.reason() and "required >= +0.0050" in small.reason()
    worse = decide(POLICY, EvaluationReport.from_dict(challenger(0.650, 0.700)))
    assert not worse.passed


def test_a_slice_may_not_regress_beyond_the_bound():
    bad = decide(POLICY, EvaluationReport.from_dict(challenger(0.72, 0.70, worst_slice=0.08)))
    assert not bad.passed and [c.name for c in bad.failed] == ["slice regression of roc_auc"]
    assert "carrier=UA" in bad.reason()
    assert decide(POLICY, EvaluationReport.from_dict(challenger(0.72, 0.70, worst_slice=0.05))).passed


def test_calibration_may_not_worsen_beyond_the_bound():
    bad = decide(POLICY, EvaluationReport.from_dict(challenger(0.72, 0.70, ece=(0.06, 0.02))))
    assert not bad.passed and [c.name for c in bad.failed] == ["calibration (ECE) worsening"]


def test_lower_is_better_primary_metric():
    policy = PromotionSpec(primary_metric="rmse", min_improvement=0.1)
    report = {"metrics": {"rmse": 9.5}, "champion": {"version": "1", "metrics": {"rmse": 10.0}},
              "primary_delta": [-0.5, -0.7, -0.3], "slice_regressions": []}
    assert decide(policy, EvaluationReport.from_dict(report)).passed
    report["primary_delta"] = [0.5, 0.3, 0.7]
    report["metrics"]["rmse"] = 10.5
    assert not decide(policy, EvaluationReport.from_dict(report)).passed


def test_the_champions_own_weights_pass_as_nothing_to_promote():
    same = decide(POLICY, EvaluationReport.from_dict({"metrics": {"roc_auc": 0.7}, "champion": {"version": "2", "same_weights": True}}))
    assert same.passed and same.kind == "same_as_champion"


@pytest.mark.parametrize("kind", ["first_model", "challenger"])
def test_decisions_serialize(kind):
    report = challenger(0.71, 0.70) if kind == "challenger" else {"metrics": {"roc_auc": 0.7, "log_loss": 0.3},
                                                                   "champion": None}
    gate = decide(POLICY, EvaluationReport.from_dict(report)).as_gate()
    out = json.loads(json.dumps(gate.to_dict()))
    assert out["kind"] == kind and out["clauses"] and isinstance(out["reason"], str)
    assert Gate.from_dict(out) == gate


def test_a_multiclass_gate_on_macro_f1_with_top_label_calibration():
    policy = PromotionSpec(primary_metric="macro_f1", min_improvement=0.01, max_calibration_worsening=0.02,
                           floors={"macro_f1": 0.4, "log_loss": 1.2})
    first = decide(policy, EvaluationReport.from_dict({"metrics": {"macro_f1": 0.45, "log_loss": 1.3, "ece": 0.05}, "champion": None}))
    assert not first.passed and [c.name for c in first.failed] == ["floor log_loss"]
    report = {"metrics": {"macro_f1": 0.47, "accuracy": 0.7, "ece": 0.08},
              "champion": {"version": "4", "metrics": {"macro_f1": 0.45, "accuracy": 0.69, "ece": 0.05},
                           "same_weights": False},
              "primary_delta": [0.02, 0.005, 0.035], "slice_regressions": []}
    gated = decide(policy, EvaluationReport.from_dict(report))
    assert not gated.passed and [c.name for c in gated.failed] == ["calibration (ECE) worsening"]
    report["metrics"]["ece"] = 0.06
    assert decide(policy, EvaluationReport.from_dict(report)).passed


def rival(new: float, old: float | None) -> dict:
    if old is None:
        return {"model": "flights_delay", "version": None}
    return {"model": "flights_delay", "version": "2", "metrics": {"roc_auc": old},
            "primary_delta": [new - old, new - old - 0.01, new - old + 0.01]}


@pytest.mark.parametrize("first", [True, False])
def test_a_rivals_champion_must_be_beaten_as_a_champion_is(first):
    report = ({"metrics": {"roc_auc": 0.72, "log_loss": 0.4}, "champion": None} if first
              else challenger(0.72, 0.70))
    assert decide(POLICY, EvaluationReport.from_dict({**report, "rival": rival(0.72, 0.71)})).passed
    lost = decide(POLICY, EvaluationReport.from_dict({**report, "rival": rival(0.72, 0.74)}))
    assert not lost.passed and [c.name for c in lost.failed] == ["improvement of roc_auc over the rival flights_delay"]
    assert "vs rival flights_delay v2 0.7400: -0.0200" in lost.reason()
    waiting = decide(POLICY, EvaluationReport.from_dict({**report, "rival": rival(0.72, None)}))
    assert waiting.passed and "rival flights_delay has no champion yet: not compared" in waiting.reason()


SUCCESSOR = POLICY.model_copy(update={"successor": {"max_regression": 0.002}, "max_champion_age_days": 7})
SUCCESSOR = PromotionSpec.model_validate(SUCCESSOR.model_dump())
FINE_TUNE = {"kind": "fine_tune", "parent": {"version": "3", "partition": "2013-01-20"}}


def aged(report: dict, candidate: str, champion: str) -> EvaluationReport:
    report = {**report, "partition": candidate, "champion": {**report["champion"], "partition": champion}}
    return EvaluationReport.from_dict(report)


def test_a_fine_tune_of_the_champion_is_held_to_non_inferiority_and_the_report_says_why():
    fresh = aged(challenger(0.6995, 0.700), "2013-01-21", "2013-01-20")
    kept = decide(SUCCESSOR, fresh, FINE_TUNE)
    assert kept.passed and kept.kind == "successor"
    assert kept.clauses[0].name == "bar" and "fine-tuned from champion v3" in kept.clauses[0].detail
    assert "no more than 0.002 worse" in kept.reason() and "required >= -0.0020" in kept.reason()
    # The same candidate from a full training, or a fine-tune of another version: the challenger's bar.
    assert decide(SUCCESSOR, fresh, {"kind": "full"}).kind == "challenger"
    other = decide(SUCCESSOR, fresh, {**FINE_TUNE, "parent": {"version": "2"}})
    assert not other.passed and other.kind == "challenger" and "required >= +0.0050" in other.reason()
    # Worse than the margin: refused, and the reason names the bar it missed.
    worse = decide(SUCCESSOR, aged(challenger(0.697, 0.700), "2013-01-21", "2013-01-20"), FINE_TUNE)
    assert not worse.passed and worse.reason().startswith("successor's bar (fine-tuned from champion v3)")
    assert [c.name for c in worse.failed] == ["non-inferiority of roc_auc"]
    # Never above the challenger's bar: with a lower min_improvement, that one applies.
    lenient = PromotionSpec.model_validate({**SUCCESSOR.model_dump(), "min_improvement": -0.01})
    assert decide(lenient, aged(challenger(0.695, 0.700), "2013-01-21", "2013-01-20"), FINE_TUNE).passed
    # The guards still hold.
    sliced = decide(SUCCESSOR, aged(challenger(0.70, 0.70, worst_slice=0.08), "2013-01-21", "2013-01-20"), FINE_TUNE)
    assert not sliced.passed and [c.name for c in sliced.failed] == ["slice regression of roc_auc"]


def test_past_the_champions_age_any_candidate_passing_the_successors_bar_replaces_it():
    report = challenger(0.6995, 0.700)
    young = decide(SUCCESSOR, aged(report, "2013-01-27", "2013-01-20"), {"kind": "full"})
    assert not young.passed and young.kind == "challenger"  # 7 days: not past 7
    old = decide(SUCCESSOR, aged(report, "2013-01-28", "2013-01-20"), {"kind": "full"})
    assert old.passed and old.kind == "successor"
    assert "champion v3 (partition 2013-01-20) is 8 days old, past max_champion_age_days 7" in old.reason()
    assert decide(POLICY, aged(report, "2013-03-01", "2013-01-20"), FINE_TUNE).kind == "challenger"  # not asked for


@pytest.mark.parametrize(("promotion", "problem"), [
    ({"successor": {"max_regression": -0.001}}, "successor.max_regression"),
    ({"successor": {"max_regression": 2}}, "is not in roc_auc's units"),
    ({"successor": {"max_regression": 0.002}, "max_champion_age_days": 0}, "max_champion_age_days"),
    ({"max_champion_age_days": 7}, "max_champion_age_days needs successor"),
])
def test_a_bad_successors_bar_is_refused_naming_the_field(promotion, problem):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as refused:
        PromotionSpec.model_validate({"primary_metric": "roc_auc", **promotion})
    assert problem in str(refused.value)
    # A margin in another metric's units is fine where the metric has no such bound.
    assert PromotionSpec.model_validate({"primary_metric": "rmse", "successor": {"max_regression": 2.5}})
