"""The training decision of a partition (training.warm_start) on plain values: why each of full
and fine-tune is chosen, the data checks against the parent's fitted state, and the spec's refusals."""

import json

import polars as pl
import pytest
from pydantic import ValidationError

from ml_assets.features.state import fit_state
from ml_assets.trainer.config import DataRef
from ml_assets.training import decision as D
from ml_assets.training.trainer_config import train_config
from ml_assets_tests.helpers import model_spec

REF = DataRef(uri="/nowhere.parquet", sha256="0" * 64)
WARM = {"days": 2, "epochs": 1, "full_every_days": 7}


def _spec(**warm):
    return model_spec(training={"warm_start": {**WARM, **warm}})


def _key(spec, **model):
    return D.warm_start_key(spec, train_config(spec, [REF], [REF], REF, "", model))


def _parent(spec, partition="2013-03-09", chain_start="2013-03-05", **tags):
    return D.Parent.from_tags("4", {"partition": partition, "chain_start_partition": chain_start,
                                    "training_decision": "fine_tune", "checkpoint_sha256": "a" * 64,
                                    "warm_start_key": json.dumps(_key(spec)), **tags})


def test_without_a_warm_start_or_a_champion_a_partition_trains_from_scratch():
    plain = model_spec(training={"warm_start": None})
    assert D.decide(plain, "2013-03-10", None, _key(plain), None).reason.startswith("training.warm_start is not set")
    spec = _spec()
    assert D.decide(spec, "2013-03-10", None, _key(spec), None).kind == D.FULL


def test_a_compatible_champion_is_fine_tuned():
    spec = _spec()
    decision = D.decide(spec, "2013-03-10", _parent(spec), _key(spec), None)
    assert decision.kind == D.FINE_TUNE and "champion v4" in decision.reason
    assert decision.as_metadata()["parent"] == {"version": "4", "partition": "2013-03-09", "weights_sha256": "a" * 64,
                                                "decision": "fine_tune", "chain_start": "2013-03-05"}


def test_a_chain_as_old_as_full_every_days_is_retrained_on_schedule():
    spec = _spec(full_every_days=5)
    decision = D.decide(spec, "2013-03-10", _parent(spec), _key(spec), None)
    assert decision.kind == D.FULL and decision.reason.startswith("scheduled") and "5 days before" in decision.reason


def test_the_schedule_counts_from_the_last_full_training_even_one_that_lost_the_gate():
    spec = _spec(full_every_days=5)
    parent = _parent(spec, chain_start="2013-03-04")
    assert D.decide(spec, "2013-03-10", parent, _key(spec), None).kind == D.FULL
    # A full retrain of 03-09 lost the gate: the champion's chain is old, but the next full waits its turn.
    tried = D.decide(spec, "2013-03-10", parent, _key(spec), None, last_full="2013-03-09")
    assert tried.kind == D.FINE_TUNE
    again = D.decide(spec, "2013-03-14", parent, _key(spec), None, last_full="2013-03-09")
    assert again.kind == D.FULL and "the last full training (of 2013-03-09, not promoted) was 5 days before" in again.reason


def test_a_champion_of_a_later_partition_is_never_fine_tuned_for_an_earlier_one():
    spec = _spec()
    decision = D.decide(spec, "2013-03-08", _parent(spec, partition="2013-03-09"), _key(spec), None)
    assert decision.kind == D.FULL and "test days" in decision.reason


def test_a_champion_with_another_network_or_no_key_is_incompatible():
    spec = _spec()
    other = _key(spec, width=8)  # a tuned width: another network
    assert other["model"] != _key(spec)["model"] and other["features"] == _key(spec)["features"]
    decision = D.decide(spec, "2013-03-10", _parent(spec), other, None)
    assert decision.kind == D.FULL and "its model section differ" in decision.reason
    old = D.Parent.from_tags("2", {"partition": "2013-03-09", "checkpoint_sha256": "b" * 64})
    assert old.decision == D.FULL and old.chain_start == "2013-03-09"
    assert "registered before fine-tunes" in D.decide(spec, "2013-03-10", old, _key(spec), None).reason


def _checks(spec, fitted: pl.DataFrame, new: pl.DataFrame, window: pl.DataFrame) -> D.DataChecks:
    state = fit_state(fitted, spec.features, spec.target.name, spec.target.task)
    return D.data_checks(spec, state, new.lazy(), window.lazy())


def _rows(n, carrier, distance):
    return pl.DataFrame({"carrier": [carrier] * n, "distance": [float(distance)] * n})


def test_new_categories_beyond_the_fitted_rare_share_force_a_full_retrain():
    spec = model_spec(features={"numeric": ["distance"], "categorical": [{"name": "carrier", "min_frequency": 5}]},
                      training={"warm_start": {**WARM, "full_when": {"unknown_share_above": 0.1}}},
                      evaluation={"slice_columns": []})
    # ZZ is rarer than min_frequency: its 2 rows were already out of the vocabulary when fitted.
    state_frame = pl.concat([_rows(50, "AA", 100), _rows(50, "UA", 300), _rows(2, "ZZ", 200)]).with_columns(
        pl.lit(1.0).alias(spec.target.name))
    checks = _checks(spec, state_frame, pl.concat([_rows(90, "AA", 200), _rows(10, "NEW", 200)]), state_frame)
    assert checks.rows == 100
    # 10% of the new rows are unknown; about 2% already fell out of the vocabulary when fitted.
    assert checks.unknown_by_feature["carrier"] == pytest.approx(0.10 - 2 / 102, abs=1e-6)
    assert D.decide(spec, "2013-03-10", _parent(spec), _key(spec), checks).kind == D.FINE_TUNE
    moved = _checks(spec, state_frame, pl.concat([_rows(70, "AA", 200), _rows(30, "NEW", 200)]), state_frame)
    decision = D.decide(spec, "2013-03-10", _parent(spec), _key(spec), moved)
    assert decision.kind == D.FULL and "'carrier'" in decision.reason and "unknown_share_above (0.1)" in decision.reason


def test_a_numeric_mean_shifted_past_the_limit_forces_a_full_retrain():
    spec = model_spec(features={"numeric": ["distance"], "categorical": ["carrier"]},
                      training={"warm_start": {**WARM, "full_when": {"mean_shift_above": 0.5}}},
                      evaluation={"slice_columns": []})
    fitted = pl.concat([_rows(50, "AA", 100), _rows(50, "AA", 300)]).with_columns(pl.lit(1.0).alias(spec.target.name))
    same = _checks(spec, fitted, _rows(10, "AA", 200), fitted)
    assert same.mean_shift == pytest.approx(0.0)
    later = _rows(100, "AA", 400).with_columns(pl.lit(1.0).alias(spec.target.name))
    far = _checks(spec, fitted, _rows(10, "AA", 200), pl.concat([fitted, later]))
    assert far.mean_shift > 0.5
    decision = D.decide(spec, "2013-03-10", _parent(spec), _key(spec), far)
    assert decision.kind == D.FULL and "'distance'" in decision.reason


def test_the_inputs_key_changes_with_any_feature_file_and_with_the_code():
    spec = _spec()
    key = D.inputs_key(spec, {"2013-03-01": "a" * 64}, {}, "code-1")
    assert key == D.inputs_key(spec, {"2013-03-01": "a" * 64}, {}, "code-1")
    assert key != D.inputs_key(spec, {"2013-03-01": "b" * 64}, {}, "code-1")
    assert key != D.inputs_key(spec, {"2013-03-01": "a" * 64}, {}, "code-2")
    assert key != D.inputs_key(spec, {"2013-03-01": "a" * 64}, {"learning_rate": 0.01}, "code-1")


@pytest.mark.parametrize(("warm", "problem"), [
    ({"days": 30}, "training.warm_start.days: 30 is more than the window's 18 training days"),
    ({"days": 18, "replay_fraction": 0.1}, "there is no older day to replay"),
    ({"full_when": {"features": ["no_such_feature"]}}, "'no_such_feature' is not a vocabulary-encoded"),
    ({"full_when": {"features": ["plane_year"]}}, "'plane_year' is not a vocabulary-encoded"),
    ({"full_when": {"ignore": ["nope"]}}, "full_when.ignore: 'nope' is not a vocabulary-encoded"),
    ({"full_when": {"features": ["carrier"], "ignore": ["dest"]}}, "not both"),
    ({"from": "latest"}, "from"),
    ({"epochs": 0}, "epochs"),
    ({"replay_fraction": 1.0}, "that is a full window"),
    ({"warm": True}, "warm"),
])
def test_a_bad_warm_start_section_is_refused_at_load_naming_the_field(warm, problem):
    with pytest.raises(ValidationError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        model_spec(training={"warm_start": warm})

