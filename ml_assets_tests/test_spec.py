import datetime as dt
from pathlib import Path

import pytest

from ml_assets.spec import SpecError, load_spec, load_specs, parse_spec
from ml_assets_tests.helpers import BUNDLED_SPEC, multiclass, write_spec


def test_bundled_spec_loads_with_its_declared_parts():
    spec = load_spec(BUNDLED_SPEC)
    assert spec.name == "flights_delay"
    assert spec.repository == "flights-delay"
    assert spec.partitioning.start == dt.date(2013, 1, 1)
    assert spec.partitioning.timezone == "America/New_York"
    assert spec.target.task == "binary_classification"
    assert spec.target.input_columns == ["dep_delay"]
    assert set(spec.features.joined_columns) == {"temp", "wind_speed", "precip", "visib", "plane_year", "seats"}


def _error(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return str(info.value)


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        (lambda d: d["training"].update(epochs=0), "training.epochs", "greater than 0"),
        (lambda d: d["training"].update(learning_rate="fast"), "training.learning_rate", "valid number"),
        (lambda d: d["training"].update(colour="red"), "training.colour", "Extra inputs are not permitted"),
        (lambda d: d.update(team="Fraud Team"), "team", "team name 'Fraud Team' is invalid"),
        (lambda d: d.update(priority="asap"), "priority", "'low', 'normal', 'high' or 'urgent'"),
        (lambda d: d.pop("target"), "target", "Field required"),
        (lambda d: d["target"].update(task="ranking"), "target.task", "binary_classification"),
        (lambda d: d["target"].update(expression="dep_delay >="), "target.expression", "does not parse"),
        (lambda d: d["target"].update(expression="departure_delay >= 15"), "target.expression", "departure_delay"),
        (lambda d: d["partitioning"].update(timezone="Mars/Olympus"), "partitioning.timezone", "unknown time zone"),
        (lambda d: d["partitioning"].update(end="2012-01-01"), "partitioning", "before start"),
        (lambda d: d["features"]["numeric"].append("wingspan"), "features.numeric", "wingspan"),
        (lambda d: d["features"]["numeric"].append("dep_delay"), "features", "leaks the label"),
        (lambda d: d["features"]["joins"][0].update(dimension="radar"), "features.joins[0].dimension", "radar"),
        (lambda d: d["evaluation"].update(metrics=["rmse"]), "evaluation.metrics", "do not apply"),
        (lambda d: d["schema"]["columns"]["distance"].update(dtype="decimal"), "schema.columns.distance.dtype", "int64"),
        (lambda d: d["schema"]["columns"]["carrier"].update(min=3), "schema.columns.carrier", "numeric columns"),
        (lambda d: d["source"].update(storage_options={"aws_secret_access_key": "x"}), "source", "look like secrets"),
        (lambda d: d["source"]["rows"].update(path="/data/x.parquet"), "source.rows", "exactly one"),
        (lambda d: d.update(name="Flights-Delay"), "name", "invalid"),
        (lambda d: d["training"].update(gpus_per_node=-1), "training.gpus_per_node", "greater than or equal to 0"),
        (lambda d: d["training"].update(nodes=0), "training.nodes", "greater than or equal to 1"),
        (lambda d: d["training"].update(pod={"memory": "8 gigs"}), "training.pod.memory", "not a Kubernetes quantity"),
        (lambda d: d["training"].update(pod={"node_selector": {"pool": "a b"}}), "training.pod.node_selector",
         "not a valid label"),
        (lambda d: d["training"].update(pod={"tolerations": [{"operator": "Equal", "value": "x"}]}),
         "training.pod.tolerations.0", "needs a key"),
    ],
)
def test_broken_spec_names_file_field_and_problem(tmp_path, spec_dict, change, field, problem):
    change(spec_dict)
    path = write_spec(tmp_path, spec_dict)
    message = _error(path)
    assert f"{path}: {field}" in message, message
    assert problem in message, message


def test_where_training_pods_run_is_not_part_of_the_training_code_version(tmp_path, spec_dict):
    base = load_spec(write_spec(tmp_path / "a", spec_dict))
    spec_dict["training"]["pod"] = {"node_selector": {"pool": "a100"}, "shm_size": "16Gi"}
    placed = load_spec(write_spec(tmp_path / "b", spec_dict))
    spec_dict["training"]["gpus_per_node"] = 4
    more_gpus = load_spec(write_spec(tmp_path / "c", spec_dict))
    assert base.fingerprint("training") == placed.fingerprint("training")
    assert more_gpus.fingerprint("training") != placed.fingerprint("training")  # world size changes training


def test_spec_name_must_match_file_name(tmp_path, spec_dict):
    path = write_spec(tmp_path, spec_dict).rename(tmp_path / "other_model.yaml")
    with pytest.raises(SpecError, match=r"other_model.yaml: name: 'flights_delay' must match the file name"):
        load_spec(path)


def test_invalid_yaml_names_line(tmp_path):
    with pytest.raises(SpecError, match=r"bad.yaml: line \d+, column \d+: not valid YAML"):
        parse_spec("name: x\ntraining: [unclosed\n", tmp_path / "bad.yaml")


def test_spec_that_is_not_a_mapping(tmp_path):
    with pytest.raises(SpecError, match=r"expected a mapping of spec fields, got list"):
        parse_spec("- a\n- b\n", tmp_path / "list.yaml")


def test_models_directory_errors(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_specs(tmp_path / "missing")
    with pytest.raises(SpecError, match="no model specs"):
        load_specs(tmp_path)


def test_a_multiclass_spec_on_the_bundled_flights_loads(tmp_path, spec_dict):
    spec = load_spec(write_spec(tmp_path, multiclass(spec_dict)))
    assert spec.target.task == "multiclass_classification"
    assert spec.target.classes == ["on_time", "late", "very_late", "cancelled"]
    assert set(spec.target.input_columns) == {"dep_time", "dep_delay"}
    assert spec.evaluation.top_k == 2


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        (lambda d: d["target"].pop("classes"), "target", "multiclass_classification needs classes"),
        (lambda d: d["target"].update(classes=["on_time", "late"]), "target", "at least 3 non-empty names"),
        (lambda d: d["target"].update(classes=["a", "b", "a", "c"]), "target", "['a'] named more than once"),
        (lambda d: d["target"].update(classes=["a", "b", "predicted_class"]), "target", "reserved"),
        (lambda d: d["target"].update(task="binary_classification", expression="dep_delay >= 15"), "target",
         "classes apply to task multiclass_classification, not binary_classification"),
        (lambda d: d["evaluation"].update(metrics=["roc_auc"]), "evaluation.metrics", "do not apply"),
        (lambda d: d["promotion"].update(floors={"f1": 0.5}), "promotion.floors", "do not apply"),
        (lambda d: d["evaluation"].update(top_k=4), "evaluation.top_k", "4 is not below the 4 target.classes"),
    ],
)
def test_multiclass_classes_and_metrics_are_checked(tmp_path, spec_dict, change, field, problem):
    data = multiclass(spec_dict)
    change(data)
    path = write_spec(tmp_path, data)
    message = _error(path)
    assert f"{path}: {field}" in message, message
    assert problem in message, message


def test_a_copy_with_changed_sections_fingerprints_its_own_sections():
    from ml_assets_tests.helpers import model_spec

    spec = model_spec()
    before = spec.fingerprint("training")
    changed = spec.model_copy(update={"training": spec.training.model_copy(update={"epochs": 99})})
    assert changed.fingerprint("training") != before and spec.fingerprint("training") == before
