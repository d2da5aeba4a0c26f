"""The spec's ``model`` section (ml_assets.spec.architecture): a built-in family or a factory by import
path, legacy specs that set the family under ``training``, the factory's tuning space, and what the
factory's code does to fingerprints and code versions.

Factories are small packages written into ``tmp_path`` under a name of their own (``sys.modules``
caches imports by name)."""

from __future__ import annotations

import datetime as dt
import shutil
import sys
import uuid
from pathlib import Path

import optuna
import pytest
import yaml

from ml_assets.spec import SpecError, load_spec
from ml_assets.trainer import code_pin
from ml_assets.trainer.config import DataRef
from ml_assets.training.trainer_config import FROM_SPEC, train_config
from ml_assets.tuning.space import config_overrides, suggest
from ml_assets_tests.helpers import write_package, write_spec

PREFIX = "byom_"
EXAMPLE_SPEC = Path(__file__).resolve().parents[1] / "examples" / "ft_transformer" / "flights_delay_ft.yaml"
TRAINED_CHECKPOINT_SECTIONS = ("model", "training", "features", "target")
REF = DataRef(uri="/nowhere/f.parquet", sha256="0" * 64)
FACTORY = '''
from torch import nn


def build(inputs, *, d_token=32, n_blocks=2, dropout_rate=0.1):
    return nn.Linear(len(inputs.numeric), inputs.n_outputs)
'''
# A factory's tuning space has no built-in dimension (the default space tunes width, depth, dropout).
FACTORY_SPACE = {"learning_rate": {"low": 0.0001, "high": 0.01, "log": True}}


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [n for n in sys.modules if n.startswith(PREFIX) or n.split(".")[0] == "ft_transformer"]:
        del sys.modules[name]


def as_factory(data: dict, root: Path, params: dict | None = None, code_path: str = "code") -> str:
    """``data`` (a spec's dict, to be written in ``root``) made to name a fresh factory in ``root/code``."""
    name = f"{PREFIX}{uuid.uuid4().hex[:12]}"
    write_package(root / "code", name, model=FACTORY)
    data["model"] = {"module": f"{name}.model:build", "code_path": code_path,
                     "params": {"d_token": 32, "n_blocks": 2} if params is None else params}
    data["tuning"]["space"] = dict(FACTORY_SPACE)
    return name


def error(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return str(info.value)


def model_settings(spec) -> dict:
    """The trainer's fields the model section gives."""
    config = config_of(spec)
    return {name: getattr(config, name) for name, path in FROM_SPEC.items() if path.startswith("model.")}


def config_of(spec, overrides: dict | None = None):
    return train_config(spec, [REF], [REF], REF, "/nowhere/out", overrides=overrides)


# --- what loads --------------------------------------------------------------------------------------


def test_a_model_section_with_a_family_loads(tmp_path, spec_dict):
    spec_dict["model"] = {"family": "residual_mlp", "hidden_sizes": [48, 48, 48], "dropout": 0.25}
    spec = load_spec(write_spec(tmp_path, spec_dict))
    assert not spec.model.custom and spec.model.module is None
    assert model_settings(spec) == {"family": "residual_mlp", "hidden_sizes": [48, 48, 48], "dropout": 0.25,
                                    "model_factory": "", "model_params": {}, "model_code_path": "",
                                    "tracker_port": 0}
    cfg = config_of(spec)
    assert (cfg.family, cfg.hidden_sizes, cfg.dropout, cfg.model_factory, cfg.model_code) == (
        "residual_mlp", [48, 48, 48], 0.25, "", {})


def test_without_a_model_section_the_built_in_defaults_apply(tmp_path, spec_dict):
    spec_dict.pop("model")
    spec = load_spec(write_spec(tmp_path, spec_dict))
    assert (spec.model.family_name, spec.model.layers, spec.model.dropout_rate) == ("mlp", [64, 32], 0.1)


def test_a_factory_section_loads_with_code_path_resolved_against_the_spec_files_directory(
        tmp_path, spec_dict, monkeypatch):
    name = as_factory(spec_dict, tmp_path / "specs", params={"d_token": 16, "blocks": [1, 2], "norm": None})
    path = write_spec(tmp_path / "specs", spec_dict)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # not against the working directory
    spec = load_spec(path)
    assert spec.model.custom and spec.model.module == f"{name}.model:build"
    assert spec.model.params == {"d_token": 16, "blocks": [1, 2], "norm": None}
    assert spec.model.code_path == str((tmp_path / "specs" / "code").resolve())
    assert model_settings(spec)["model_code_path"] == spec.model.code_path

    spec_dict["model"]["code_path"] = "../specs/./code"  # any relative path, from the spec's directory
    other = load_spec(write_spec(tmp_path / "other", spec_dict))
    assert other.model.code_path == spec.model.code_path


def test_a_legacy_spec_with_the_family_under_training_loads_as_if_written_under_model(tmp_path, spec_dict):
    settings = {"family": "residual_mlp", "hidden_sizes": [32, 32], "dropout": 0.3}
    spec_dict["model"] = dict(settings)
    current = load_spec(write_spec(tmp_path / "current", spec_dict))
    spec_dict.pop("model")
    spec_dict["training"].update(settings)
    legacy = load_spec(write_spec(tmp_path / "legacy", spec_dict))
    assert legacy.model == current.model
    assert legacy.training == current.training
    assert config_of(legacy) == config_of(current)
    assert config_of(legacy).fingerprint() == config_of(current).fingerprint()
    assert legacy.fingerprint() == current.fingerprint()


def test_a_spec_with_both_forms_is_refused_naming_training(tmp_path, spec_dict):
    spec_dict["training"]["dropout"] = 0.2  # and the bundled spec's model section
    path = write_spec(tmp_path, spec_dict)
    message = error(path)
    assert f"{path}: training: ['dropout'] belong in the model section" in message, message


# --- what is refused ---------------------------------------------------------------------------------


def _set(section: str, **values):
    return lambda data: data[section].update(values)


def _pop_module(data):
    data["model"].pop("module")
    data["model"].pop("code_path")


@pytest.mark.parametrize(("change", "field", "problem"), [
    (_set("model", module="ft transformer:build"), "model.module", "is not 'package.module:factory'"),
    (_set("model", module="ft_transformer.model"), "model.module", "is not 'package.module:factory'"),
    (_set("model", module="ft_transformer.model:build()"), "model.module", "is not 'package.module:factory'"),
    (_set("model", params={"d-token": 32}), "model.params", "'d-token' is not a keyword argument name"),
    (_set("model", params={"d_token": float("nan")}), "model.params", "d_token: nan is not a finite number"),
    (_set("model", params={"blocks": [1, float("inf")]}), "model.params", "blocks[1]: inf is not a finite number"),
    (_set("model", params={"since": dt.date(2024, 1, 1)}), "model.params", "a date is not a plain JSON value"),
    (_set("model", code_path="no_such_dir"), "model.code_path", "'no_such_dir' is not a directory"),
    (_set("model", code_path="flights_delay.yaml"), "model.code_path", "is not a directory"),
    (_set("model", hidden_sizes=[64]), "model", "['hidden_sizes'] apply to the built-in families"),
    (_set("model", family="mlp", dropout=0.1), "model", "['family', 'dropout'] apply to the built-in families"),
    (_pop_module, "model", "params and code_path apply to a factory (set module) or to family xgboost"),
    (lambda d: d["tuning"]["space"].update(width={"low": 16, "high": 64}), "tuning.space",
     "['width'] tune the built-in families; the factory"),
    (lambda d: (d["model"].clear(), d["model"].update(family="mlp"),
                d["tuning"]["space"].update({"params.x": {"low": 0, "high": 1}})),
     "tuning.space", "['params.x'] tune a factory's params; set model.module"),
    (lambda d: d["tuning"]["space"].update({"params.d-token": {"low": 8, "high": 64}}), "tuning.space",
     "cannot tune ['params.d-token']"),
])
def test_a_bad_model_section_is_refused_naming_file_and_field(tmp_path, spec_dict, change, field, problem):
    as_factory(spec_dict, tmp_path)
    change(spec_dict)
    path = write_spec(tmp_path, spec_dict)
    message = error(path)
    assert f"{path}: {field}: " in message, message
    assert problem in message, message


def test_a_factory_spec_without_a_tuning_space_loads(tmp_path, spec_dict):
    as_factory(spec_dict, tmp_path)
    spec_dict["tuning"].pop("space")
    spec = load_spec(write_spec(tmp_path, spec_dict))
    assert not set(spec.tuning.space) & {"width", "depth", "dropout", "family"}


# --- tuning a factory's params -----------------------------------------------------------------------


def test_a_factorys_params_are_tuned_as_integers_and_merged_into_model_params(tmp_path, spec_dict):
    as_factory(spec_dict, tmp_path, params={"d_token": 32, "n_blocks": 2, "dropout_rate": 0.1})
    spec_dict["tuning"]["space"] = {
        "learning_rate": {"low": 0.0001, "high": 0.01, "log": True},
        "params.d_token": {"low": 8, "high": 64, "integer": True},
        "params.n_blocks": {"low": 1, "high": 4, "log": True, "integer": True},
        "params.dropout_rate": {"low": 0.0, "high": 0.3},
    }
    spec = load_spec(write_spec(tmp_path, spec_dict))
    assert spec.tuning.space["params.d_token"].integer and not spec.tuning.space["params.dropout_rate"].integer
    space = {name: dim.model_dump() for name, dim in spec.tuning.space.items()}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    for _ in range(5):
        params = suggest(study.ask(), space)
        assert type(params["params.d_token"]) is int and 8 <= params["params.d_token"] <= 64
        assert type(params["params.n_blocks"]) is int and 1 <= params["params.n_blocks"] <= 4
        assert type(params["params.dropout_rate"]) is float
        overrides = config_overrides(params, spec.model.layers, spec.model.params)
        assert overrides == {"learning_rate": params["learning_rate"], "model_params": {
            "d_token": params["params.d_token"], "n_blocks": params["params.n_blocks"],
            "dropout_rate": params["params.dropout_rate"]}}
    # The trainer's config of the last trial: the factory, its merged params and its code's pin.
    cfg = config_of(spec, params)
    assert cfg.model_params == overrides["model_params"] and cfg.learning_rate == params["learning_rate"]
    assert cfg.model_factory == spec.model.module
    assert cfg.model_code == code_pin.pin(spec.model.module, spec.model.code_path)
    assert spec.model.params == {"d_token": 32, "n_blocks": 2, "dropout_rate": 0.1}  # the spec's own, untouched


def test_tuning_one_param_keeps_the_factorys_other_params():
    overrides = config_overrides({"params.d_token": 48, "batch_size": 512.0}, [64, 32], {"d_token": 32, "n_blocks": 2})
    assert overrides == {"batch_size": 512, "model_params": {"d_token": 48, "n_blocks": 2}}
    assert config_overrides({"learning_rate": 0.01}, [64, 32], {"d_token": 32}) == {"learning_rate": 0.01}


# --- fingerprints and code versions ------------------------------------------------------------------


def test_the_spec_fingerprint_ignores_where_the_factorys_code_lies(tmp_path, spec_dict):
    name = as_factory(spec_dict, tmp_path / "a")
    shutil.copytree(tmp_path / "a" / "code", tmp_path / "b" / "code")
    a = load_spec(write_spec(tmp_path / "a", spec_dict))
    b = load_spec(write_spec(tmp_path / "b", spec_dict))
    assert a.model.code_path != b.model.code_path
    assert a.fingerprint("model") == b.fingerprint("model") and a.fingerprint() == b.fingerprint()
    assert config_of(a).fingerprint() == config_of(b).fingerprint()
    spec_dict["model"]["params"]["d_token"] = 64
    c = load_spec(write_spec(tmp_path / "b", spec_dict))
    assert c.fingerprint("model") != b.fingerprint("model")
    assert c.model.module == f"{name}.model:build"


def test_the_trained_checkpoints_code_version_changes_with_the_factorys_code(tmp_path, spec_dict):
    from ml_assets.code_version import code_version
    from ml_assets.training.assets import build_trained_checkpoint

    name = as_factory(spec_dict, tmp_path)
    spec = load_spec(write_spec(tmp_path, spec_dict))

    def versions() -> tuple[str, str]:
        asset = build_trained_checkpoint(spec)
        return (code_version(spec, TRAINED_CHECKPOINT_SECTIONS, factory=spec.model),
                next(iter(asset.code_versions_by_key.values())))

    before = versions()
    assert code_version(spec, TRAINED_CHECKPOINT_SECTIONS) != before[0]  # the factory's code counts
    model_py = tmp_path / "code" / name / "model.py"
    original = model_py.read_text()
    model_py.write_text(original.replace("nn.Linear(", "nn.Bilinear(") + "\n")
    after = versions()
    assert after[0] != before[0] and after[1] != before[1]
    model_py.write_text(original)
    assert versions() == before


# --- the example ---------------------------------------------------------------------------------------


def test_the_ft_transformer_example_loads_and_its_factory_builds_for_the_bundled_features():
    from ml_assets.trainer.contract import ModelInputs, check_outputs, make_custom

    spec = load_spec(EXAMPLE_SPEC)
    assert spec.model.module == "ft_transformer.model:build"
    assert spec.model.code_path == str(EXAMPLE_SPEC.parent.resolve())
    bucketized = [f.name for f in spec.features.numeric if f.bucketized]
    assert bucketized == ["plane_year"]
    numeric = [f.name for f in spec.features.numeric if not f.bucketized]
    categorical = [*bucketized, *spec.features.categorical_names]
    # plane_year: 8 buckets (7 edges + below + above); carrier: 16 + unknown; origin: 3 + unknown; dest:
    # ~100 airports; tailnum: 512 hash buckets + missing; day of week, month, holiday flag (+ unknown).
    cardinalities = [9, 17, 4, 101, 513, 8, 13, 3]
    assert categorical == ["plane_year", "carrier", "origin", "dest", "tailnum", "local_day_of_week",
                           "local_month", "local_holiday"]
    inputs = ModelInputs(numeric=numeric, categorical=categorical, cardinalities=cardinalities,
                         task=spec.target.task)
    model, _ = make_custom(spec.model.module, spec.model.params, inputs, spec.model.code_path)
    check_outputs(model, spec.model.module, inputs)  # make_custom tried it too: [rows] logits
    assert code_pin.pin(spec.model.module, spec.model.code_path)["package"] == "ft_transformer"

    # Every corner of the example's own search space builds too.
    space = {name: dim.model_dump() for name, dim in spec.tuning.space.items()}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(3):
        tuned = config_overrides(suggest(study.ask(), space), spec.model.layers, spec.model.params)["model_params"]
        make_custom(spec.model.module, tuned, inputs, spec.model.code_path)


# --- promotion.rival -------------------------------------------------------------------------------


def test_a_rival_must_be_another_declared_model_with_the_same_question(tmp_path, spec_dict):
    from ml_assets.model_files import load_all_model_specs
    from ml_assets.spec import SpecError

    def declare(name: str, **changes) -> None:
        data = {**spec_dict, "name": name, **changes}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    declare("alpha", promotion={**spec_dict["promotion"], "rival": "beta"})
    declare("beta")
    assert [s.promotion.rival for s in load_all_model_specs([tmp_path])] == ["beta", None]
    for rival, message in (("gamma", "is not a declared model"), ("alpha", "is this model itself")):
        declare("alpha", promotion={**spec_dict["promotion"], "rival": rival})
        with pytest.raises(SpecError, match=f"model alpha: promotion.rival: '{rival}' {message}"):
            load_all_model_specs([tmp_path])
    declare("alpha", promotion={**spec_dict["promotion"], "rival": "beta"})
    declare("beta", target={**spec_dict["target"], "name": "late"})
    with pytest.raises(SpecError, match="their metrics cannot be compared"):
        load_all_model_specs([tmp_path])


# --- gradient-boosted trees ----------------------------------------------------------------------------


def as_boosted(data: dict, **params) -> dict:
    data["model"] = {"family": "xgboost", "params": {"max_depth": 4, "num_boost_round": 50, **params}}
    data.get("training", {}).pop("warm_start", None)
    data.pop("tuning", None)
    return data


def test_a_boosted_model_fine_tunes_by_adding_rounds(tmp_path, spec_dict):
    as_boosted(spec_dict)
    spec_dict["training"]["warm_start"] = {"days": 1}
    assert load_spec(write_spec(tmp_path, spec_dict)).training.warm_start.added_rounds(50) == 5
    spec_dict["training"]["warm_start"] = {"days": 1, "rounds": 12, "learning_rate": 0.02}
    assert load_spec(write_spec(tmp_path, spec_dict)).training.warm_start.added_rounds(50) == 12


def test_a_networks_fine_tune_has_no_rounds(tmp_path, spec_dict):
    spec_dict["training"]["warm_start"] = {"days": 1, "rounds": 12}
    message = error(write_spec(tmp_path, spec_dict))
    assert "training.warm_start.rounds: boosting rounds apply to family xgboost" in message, message


def test_a_boosted_model_loads_with_xgboosts_params_and_its_own_tuning_space(tmp_path, spec_dict):
    spec = load_spec(write_spec(tmp_path, as_boosted(spec_dict, learning_rate=0.1, subsample=0.8)))
    assert spec.model.boosted and not spec.model.custom
    assert set(spec.tuning.space) == {"params.max_depth", "params.learning_rate", "params.min_child_weight",
                                      "params.subsample", "params.colsample_bytree"}
    cfg = config_of(spec, {"params.max_depth": 7})
    assert (cfg.family, cfg.model_params) == ("xgboost", {"max_depth": 7, "num_boost_round": 50,
                                                          "learning_rate": 0.1, "subsample": 0.8})


@pytest.mark.parametrize(("change", "problem"), [
    (lambda d: d["model"]["params"].update(max_depth=-1), "model.params.max_depth: -1 is out of range: it must be >= 1"),
    (lambda d: d["model"]["params"].update(learning_rate=0), "model.params.learning_rate: 0 is out of range: it must be > 0"),
    (lambda d: d["model"]["params"].update(maxdepth=3), "model.params.maxdepth: XGBoost parameter 'maxdepth' is not one"),
    (lambda d: d["model"]["params"].update(max_depth=2.5), "model.params.max_depth: 2.5 is not a whole number"),
    (lambda d: d["model"]["params"].update(objective="reg:squarederror"),
     "model.params.objective: 'reg:squarederror' cannot serve target.task binary_classification"),
    (lambda d: d["model"].update(hidden_sizes=[8]), "['hidden_sizes'] apply to networks, not to family xgboost"),
    (lambda d: d["training"].update(warm_start={"days": 1, "epochs": 2}),
     "training.warm_start.epochs: family xgboost's fine-tune adds boosting rounds, not epochs"),
    (lambda d: d["training"].update(warm_start={"days": 1, "rounds": 0}), "training.warm_start.rounds"),
    (lambda d: d["training"].update(strategy="fsdp"), "training.strategy: fsdp shards a network"),
    (lambda d: d.update(tuning={"space": {"width": {"low": 8, "high": 64}}}),
     "tuning.space: ['width'] tune a network's training; family xgboost is tuned through params.<name>"),
    (lambda d: d.update(tuning={"space": {"params.depth": {"low": 2, "high": 8}}}),
     "tuning.space: ['params.depth'] are not XGBoost parameters the platform accepts"),
])
def test_a_bad_boosted_model_is_refused_at_load_naming_the_field(tmp_path, spec_dict, change, problem):
    as_boosted(spec_dict)
    spec_dict.setdefault("training", {})
    change(spec_dict)
    path = write_spec(tmp_path, spec_dict)
    message = error(path)
    assert str(path) in message and problem in message, message
