"""The contract between the platform and a model factory it did not write (ml_assets.trainer.contract),
the pin of the factory's code (ml_assets.trainer.code_pin), the training config that carries both, and
one real torchrun training of a factory's module.

Every factory here is a small package written into ``tmp_path`` under a name of its own: ``sys.modules``
caches imports by name, so two tests must never share one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import uuid
from dataclasses import asdict
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ml_assets.trainer import code_pin
from ml_assets.trainer.build import build, rebuild
from ml_assets.trainer.checkpoint import load_checkpoint
from ml_assets.trainer.code_pin import ModelContractError
from ml_assets.trainer.config import LATER_DEFAULTS, DataRef, TrainConfig
from ml_assets.trainer.contract import (
    CustomModel,
    ModelFactory,
    ModelInputs,
    check_outputs,
    factory_loss,
    load_factory,
    make_custom,
    sample_batch,
)
from ml_assets.trainer.data import read_state, to_tensors
from ml_assets_tests.helpers import cli_env, write_package
from ml_assets_tests.trainer.toy import ref, torchrun_args, toy_data, write_config

PREFIX = "byom_"

# A small factory: embeddings + one hidden layer, [rows, n_outputs] out (so [rows, 1] for one output,
# which CustomModel squeezes). A test changes what forward returns by replacing ``return out``.
FACTORY = '''
import torch
from torch import nn

MARK = "{mark}"


class Net(nn.Module):
    def __init__(self, inputs, width):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(c, 3) for c in inputs.cardinalities)
        self.hidden = nn.Linear(len(inputs.numeric) + 3 * len(inputs.cardinalities), width)
        self.head = nn.Linear(width, inputs.n_outputs)

    def forward(self, numeric, categorical):
        parts = [numeric, *(e(categorical[:, i]) for i, e in enumerate(self.emb))]
        out = self.head(torch.relu(self.hidden(torch.cat(parts, dim=1))))
        return out


def build(inputs, *, width=8):
    if width < 1:
        raise ValueError(f"width must be positive, got {{width}}")
    return Net(inputs, width)
'''

BINARY = ModelInputs(numeric=["x", "noise"], categorical=["group"], cardinalities=[4], task="binary_classification")
MULTICLASS = ModelInputs(numeric=["x", "noise"], categorical=["group"], cardinalities=[4],
                         task="multiclass_classification", classes=["a", "b", "c"])
FAKE_REF = DataRef(uri="/nowhere/f.parquet", sha256="0" * 64)


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch):
    """load_factory puts code_path on sys.path: each test gets its own copy of the list back, and
    the packages it imported are forgotten."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [n for n in sys.modules if n.startswith(PREFIX)]:
        del sys.modules[name]


def unique_name() -> str:
    return f"{PREFIX}{uuid.uuid4().hex[:12]}"


def factory(root: Path, tail: str = "return out", mark: str = "v1", **modules: str) -> tuple[str, str]:
    """A fresh package with FACTORY's model (forward ending in ``tail``); returns (package, code_path)."""
    name = unique_name()
    write_package(root, name, model=FACTORY.format(mark=mark).replace("        return out", f"        {tail}"), **modules)
    return name, str(root)


def config(name: str, code_path: str, **fields) -> TrainConfig:
    return TrainConfig(model="toy", task="binary_classification", train_files=[FAKE_REF], val_files=[FAKE_REF],
                       feature_state=FAKE_REF, output_dir="/nowhere/out", model_factory=f"{name}.model:build",
                       model_code_path=code_path, **fields)


def refused(path: str, params: dict | None = None, inputs: ModelInputs = BINARY, code_path: str = "") -> str:
    with pytest.raises(ModelContractError) as info:
        make_custom(path, params or {}, inputs, code_path)
    assert isinstance(info.value, ValueError)  # what the Dagster step and the trainer catch
    return str(info.value)


# --- bad factories -----------------------------------------------------------------------------------


def test_a_module_that_cannot_be_imported_is_refused_naming_field_and_path(tmp_path):
    name, code_path = factory(tmp_path)
    missing_module = f"{name}.absent:build"
    message = refused(missing_module, code_path=code_path)
    assert message.startswith("model.module:") and repr(missing_module) in message and "cannot import" in message
    missing_package = f"{unique_name()}.model:build"
    message = refused(missing_package)
    assert message.startswith("model.module:") and repr(missing_package) in message


def test_a_missing_attribute_is_refused_naming_field_and_path(tmp_path):
    name, code_path = factory(tmp_path)
    path = f"{name}.model:make_net"
    message = refused(path, code_path=code_path)
    assert message.startswith("model.module:") and repr(path) in message and "'make_net'" in message


def test_a_non_callable_is_refused_naming_field_and_path(tmp_path):
    name, code_path = factory(tmp_path)
    path = f"{name}.model:MARK"
    message = refused(path, code_path=code_path)
    assert message.startswith("model.module:") and repr(path) in message and "is a str, not a factory" in message


@pytest.mark.parametrize(("raising", "said"), [
    ("raise RuntimeError('needs a GPU driver')", "RuntimeError: needs a GPU driver"),
    ("import byom_no_such_dependency_at_all", "byom_no_such_dependency_at_all"),
])
def test_a_factory_that_raises_on_import_is_refused_with_its_own_words(tmp_path, raising, said):
    name = unique_name()
    write_package(tmp_path, name, model=raising)
    path = f"{name}.model:build"
    message = refused(path, code_path=str(tmp_path))
    assert message.startswith("model.module:") and repr(path) in message and said in message


@pytest.mark.parametrize(("params", "said"), [
    ({"depth": 3}, "unexpected keyword argument 'depth'"),  # TypeError: a name it does not take
    ({"width": 0}, "width must be positive, got 0"),  # ValueError: a value it rejects
])
def test_a_factory_that_rejects_a_param_is_refused_naming_model_params(tmp_path, params, said):
    name, code_path = factory(tmp_path)
    path = f"{name}.model:build"
    message = refused(path, params, code_path=code_path)
    assert message.startswith("model.params:") and path in message and said in message and str(params) in message


def test_a_factory_that_returns_no_module_is_refused(tmp_path):
    name = unique_name()
    write_package(tmp_path, name, model="def build(inputs):\n    return lambda numeric, categorical: numeric\n")
    path = f"{name}.model:build"
    message = refused(path, code_path=str(tmp_path))
    assert message.startswith("model.module:") and path in message and "returned a function" in message
    assert "torch.nn.Module" in message


@pytest.mark.parametrize(("tail", "inputs", "got", "want"), [
    ("return torch.cat([out] * 3, dim=1)", BINARY, "shape [4, 3]", "binary_classification needs [4]"),
    ("return out[:, 0]", MULTICLASS, "shape [4]", "multiclass_classification needs [4, 3]"),
    ("return out.sum()", BINARY, "shape []", "needs [4]"),
    ("return (out, out)", MULTICLASS, "a tuple", "needs [4, 3]"),
])
def test_a_module_with_the_wrong_output_shape_is_refused_naming_the_shapes(tmp_path, tail, inputs, got, want):
    name, code_path = factory(tmp_path, tail)
    path = f"{name}.model:build"
    message = refused(path, inputs=inputs, code_path=code_path)
    assert message.startswith("model.module:") and path in message
    assert f"returned {got} for a batch of 4 rows" in message and want in message


def test_a_module_returning_a_tuple_for_one_output_is_refused_as_returning_a_tuple(tmp_path):
    name, code_path = factory(tmp_path, "return (out, out)")
    message = refused(f"{name}.model:build", code_path=code_path)
    assert message.startswith("model.module:") and f"{name}.model:build" in message
    assert "returned a tuple for a batch of 4 rows" in message, message


def test_a_module_that_crashes_on_the_batch_is_refused_naming_the_batch_shapes(tmp_path):
    name, code_path = factory(tmp_path, "raise RuntimeError('mat1 and mat2 shapes cannot be multiplied')")
    path = f"{name}.model:build"
    message = refused(path, code_path=code_path)
    assert message.startswith("model.module:") and path in message
    assert "numeric [4, 2] float32, categorical [4, 1] int64" in message
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in message


def test_integer_outputs_are_refused(tmp_path):
    name, code_path = factory(tmp_path, "return out.round().long()")
    path = f"{name}.model:build"
    message = refused(path, code_path=code_path)
    assert message.startswith("model.module:") and path in message and "torch.int64 outputs" in message


def test_a_good_factory_passes_for_each_task(tmp_path):
    name, code_path = factory(tmp_path)
    for inputs in (BINARY, MULTICLASS, ModelInputs(numeric=["x"], categorical=[], cardinalities=[], task="regression")):
        model, made = make_custom(f"{name}.model:build", {"width": 5}, inputs, code_path)
        assert isinstance(model, CustomModel) and isinstance(made, ModelFactory)
        assert model.net.hidden.out_features == 5  # the params reached the factory


# --- hooks and the wrapper ---------------------------------------------------------------------------

HOOKS = '''
import torch
from torch import nn

from ml_assets.trainer.contract import ModelFactory

SEEN = []


class Keyword(nn.Module):
    def __init__(self, inputs):
        super().__init__()
        self.lin = nn.Linear(len(inputs.numeric), 1)

    def forward(self, *, scaled, codes):  # keyword-only: a tuple would not reach it
        SEEN.append({"scaled": scaled, "codes": codes})
        return self.lin(scaled).squeeze(1) + codes[:, 0].float()


def as_keywords(numeric, categorical):
    return {"scaled": numeric * 10, "codes": categorical}


def summed_abs(output, target):
    return (output - target).abs().sum()


def absolute_loss(inputs):
    SEEN.append({"loss_for": inputs.task})
    return summed_abs


factory = ModelFactory(build=lambda inputs: Keyword(inputs), loss=absolute_loss, inputs=as_keywords)
'''


def test_an_inputs_hook_returning_a_dict_calls_the_module_with_keywords(tmp_path):
    name = unique_name()
    write_package(tmp_path, name, model=HOOKS)
    model, _ = make_custom(f"{name}.model:factory", {}, BINARY, str(tmp_path))
    seen = sys.modules[f"{name}.model"].SEEN
    seen.clear()
    numeric, categorical = sample_batch(BINARY, rows=6, seed=3)
    out = model(numeric, categorical)
    assert out.shape == (6,)
    assert len(seen) == 1 and set(seen[0]) == {"scaled", "codes"}
    assert torch.equal(seen[0]["scaled"], numeric * 10) and torch.equal(seen[0]["codes"], categorical)


def test_a_custom_loss_hook_is_the_factory_loss_and_the_trainers_criterion(tmp_path):
    name = unique_name()
    write_package(tmp_path, name, model=HOOKS)
    path = f"{name}.model:factory"
    made = load_factory(path, str(tmp_path))
    module = sys.modules[f"{name}.model"]
    assert factory_loss(made, path, BINARY) is module.summed_abs
    state = {"numeric": [{"name": "x"}, {"name": "noise"}],
             "categorical": [{"name": "group", "encoding": "vocabulary", "vocabulary": ["a", "b", "c"]}]}
    cfg = TrainConfig(model="toy", task="binary_classification", train_files=[FAKE_REF], val_files=[FAKE_REF],
                      feature_state=FAKE_REF, output_dir="/nowhere", model_factory=path,
                      model_code_path=str(tmp_path))
    built = build(cfg, state, sample_batch(BINARY, seed=1))
    assert built.criterion is module.summed_abs
    assert built.name == path and set(built.rebuild) == {"model_factory"}
    assert built.rebuild["model_factory"]["inputs"] == BINARY.to_dict()
    assert {"loss_for": "binary_classification"} in module.SEEN


def test_a_loss_hook_that_returns_no_function_is_refused(tmp_path):
    made = ModelFactory(build=lambda inputs: nn.Linear(2, 1), loss=lambda inputs: 0.5)
    with pytest.raises(ModelContractError, match=r"model\.module: pkg\.m:f's loss hook returned a float"):
        factory_loss(made, "pkg.m:f", BINARY)


def test_a_single_column_output_is_squeezed_to_one_per_row(tmp_path):
    name, code_path = factory(tmp_path)
    model, _ = make_custom(f"{name}.model:build", {}, BINARY, code_path)
    numeric, categorical = sample_batch(BINARY, rows=7)
    assert model.net(numeric, categorical).shape == (7, 1)  # what the factory's module gives
    assert model(numeric, categorical).shape == (7,)  # what the platform sees
    multi, _ = make_custom(f"{name}.model:build", {}, MULTICLASS, code_path)
    assert multi(numeric, categorical).shape == (7, 3)  # never squeezed when there are classes


def test_check_outputs_draws_nothing_from_the_global_rng(tmp_path):
    # A module that draws from the global generator on every call (noise, sampling, ...).
    name, code_path = factory(tmp_path, "return out + 0 * torch.rand(out.shape)")
    model, _ = make_custom(f"{name}.model:build", {}, BINARY, code_path)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    check_outputs(model, f"{name}.model:build", BINARY)
    assert torch.equal(torch.get_rng_state(), before)
    assert model.training  # its mode is given back too


# --- the code pin ------------------------------------------------------------------------------------


def test_the_pin_is_stable_for_the_same_files(tmp_path):
    name, code_path = factory(tmp_path / "a")
    path = f"{name}.model:build"
    first, second = code_pin.pin(path, code_path), code_pin.pin(path, code_path)
    assert first == second
    assert first["module"] == path and first["package"] == name
    assert set(first["files"]) == {f"{name}/__init__.py", f"{name}/model.py"}
    assert first["files"][f"{name}/model.py"] == hashlib.sha256((tmp_path / "a" / name / "model.py").read_bytes()).hexdigest()
    shutil.copytree(tmp_path / "a" / name, tmp_path / "b" / name)
    assert code_pin.pin(path, str(tmp_path / "b")) == first  # content, not location


def test_changed_names_edited_added_and_removed_files(tmp_path):
    name, code_path = factory(tmp_path, helpers="X = 1\n")
    path = f"{name}.model:build"
    pinned = code_pin.pin(path, code_path)
    package = tmp_path / name
    (package / "model.py").write_text((package / "model.py").read_text() + "\n# tuned\n")
    (package / "layers").mkdir()
    (package / "layers" / "attention.py").write_text("HEADS = 4\n")
    (package / "helpers.py").unlink()
    current = code_pin.pin(path, code_path)
    assert current["sha256"] != pinned["sha256"]
    assert code_pin.changed(pinned, current) == sorted(
        [f"{name}/model.py", f"{name}/layers/attention.py", f"{name}/helpers.py"])


def test_verify_raises_naming_the_changed_file(tmp_path):
    name, code_path = factory(tmp_path, helpers="X = 1\n")
    pinned = code_pin.pin(f"{name}.model:build", code_path)
    code_pin.verify(pinned, code_path)  # the same code: nothing to say
    (tmp_path / name / "helpers.py").write_text("X = 2\n")
    with pytest.raises(ModelContractError) as info:
        code_pin.verify(pinned, code_path)
    message = str(info.value)
    assert message.startswith("model.module:") and f"{name}.model:build" in message
    assert f"{name}/helpers.py" in message and f"{name}/model.py" not in message


def test_pycache_is_not_part_of_the_pin(tmp_path):
    name, code_path = factory(tmp_path)
    path = f"{name}.model:build"
    pinned = code_pin.pin(path, code_path)
    make_custom(path, {}, BINARY, code_path)  # an import writes __pycache__
    cache = tmp_path / name / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "stray.py").write_text("anything = 1\n")  # even a .py file there does not count
    assert code_pin.pin(path, code_path) == pinned


def test_a_package_in_code_path_wins_over_one_of_the_same_name_on_sys_path(tmp_path, monkeypatch):
    name = unique_name()
    write_package(tmp_path / "installed", name, model=FACTORY.format(mark="installed"))
    write_package(tmp_path / "spec_dir", name, model=FACTORY.format(mark="spec_dir"))
    monkeypatch.syspath_prepend(str(tmp_path / "installed"))
    path = f"{name}.model:build"
    assert code_pin.package_root(path) == (tmp_path / "installed" / name).resolve()
    assert code_pin.package_root(path, str(tmp_path / "spec_dir")) == (tmp_path / "spec_dir" / name).resolve()
    assert code_pin.pin(path, str(tmp_path / "spec_dir"))["sha256"] != code_pin.pin(path)["sha256"]
    load_factory(path, str(tmp_path / "spec_dir"))
    assert sys.modules[f"{name}.model"].MARK == "spec_dir"


def test_a_second_copy_from_another_code_path_replaces_the_first(tmp_path):
    name = unique_name()
    write_package(tmp_path / "v1", name, model=FACTORY.format(mark="v1"))
    write_package(tmp_path / "v2", name, model=FACTORY.format(mark="v2").replace("width=8", "width=6"))
    path = f"{name}.model:build"
    first, _ = make_custom(path, {}, BINARY, str(tmp_path / "v1"))
    assert sys.modules[f"{name}.model"].MARK == "v1" and first.net.hidden.out_features == 8
    second, _ = make_custom(path, {}, BINARY, str(tmp_path / "v2"))
    assert sys.modules[f"{name}.model"].MARK == "v2" and second.net.hidden.out_features == 6
    assert Path(sys.modules[name].__file__).is_relative_to(tmp_path / "v2")  # the package too, not only the module
    again, _ = make_custom(path, {}, BINARY, str(tmp_path / "v1"))  # and back
    assert sys.modules[f"{name}.model"].MARK == "v1" and again.net.hidden.out_features == 8


# --- the training config -----------------------------------------------------------------------------


def test_a_config_with_a_factory_and_no_pin_is_pinned_when_made(tmp_path):
    name, code_path = factory(tmp_path)
    cfg = config(name, code_path)
    assert cfg.model_code == code_pin.pin(f"{name}.model:build", code_path)
    loaded = TrainConfig.from_dict(json.loads(cfg.to_json()))
    assert loaded.model_code == cfg.model_code and loaded.fingerprint() == cfg.fingerprint()


def test_the_fingerprint_changes_with_the_factorys_code_and_params(tmp_path):
    name, code_path = factory(tmp_path)
    base = config(name, code_path, model_params={"width": 8})
    pinned = base.model_code  # (the same pin, given: only the params differ)
    assert config(name, code_path, model_params={"width": 8}, model_code=pinned).fingerprint() == base.fingerprint()
    assert config(name, code_path, model_params={"width": 16}, model_code=pinned).fingerprint() != base.fingerprint()
    assert config(name, code_path, model_code=pinned).fingerprint() != base.fingerprint()
    model_py = tmp_path / name / "model.py"
    model_py.write_text(model_py.read_text().replace("nn.Embedding(c, 3)", "nn.Embedding(c, 4)"))
    assert config(name, code_path, model_params={"width": 8}).fingerprint() != base.fingerprint()


def test_the_fingerprint_ignores_where_the_same_code_lies(tmp_path):
    name, code_path = factory(tmp_path / "checkout_a")
    shutil.copytree(tmp_path / "checkout_a" / name, tmp_path / "checkout_b" / name)
    a = config(name, code_path)
    b = config(name, str(tmp_path / "checkout_b"))
    assert a.model_code_path != b.model_code_path
    assert a.fingerprint() == b.fingerprint()


# The fingerprint's formula before model factories existed: NOT_TRAINING as it was then, and
# classes (an earlier addition) left out at its default.
OLD_NOT_TRAINING = {
    "output_dir", "checkpoint_dir", "report_every_steps", "checkpoint_every_steps", "checkpoint_every_seconds",
    "keep_last", "checkpoint_async", "preemption_grace_seconds", "num_workers", "pin_memory",
    "prefetch_factor", "threads", "epoch_log", "owner", "orphan_grace_seconds", "lease_ttl_seconds",
    "lease_wait_seconds",
}
NEW_KEYS = {"model_factory", "model_params", "model_code", "model_code_path",  # the model contract
            "strategy", "fsdp_param_dtype", "fsdp_reduce_dtype", "fsdp_reshard_after_forward",  # FSDP
            "data_mode", "shuffle_buffer_rows", "stream_cache_dir",  # streaming
            "init_weights",  # fine-tunes
            "tracker_port"}  # gradient-boosted trees


def _old_fingerprint(cfg: TrainConfig) -> str:
    kept = {k: v for k, v in asdict(cfg).items() if k not in OLD_NOT_TRAINING and k not in NEW_KEYS}
    if kept["classes"] == []:
        del kept["classes"]
    for key in ("train_files", "val_files"):
        kept[key] = [{k: v for k, v in r.items() if k != "commit"} for r in kept[key]]
    kept["feature_state"] = {k: v for k, v in kept["feature_state"].items() if k != "commit"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("fields", [{}, {"family": "residual_mlp", "hidden_sizes": [32, 32], "dropout": 0.2},
                                    {"task": "multiclass_classification", "classes": ["a", "b", "c"]}])
def test_a_built_in_configs_fingerprint_is_the_one_it_had_before_factories(fields):
    data = {"model": "toy", "task": "binary_classification", "train_files": [FAKE_REF], "val_files": [FAKE_REF],
            "feature_state": FAKE_REF, "output_dir": "/nowhere", "epochs": 3, **fields}
    cfg = TrainConfig(**data)
    assert cfg.model_code == LATER_DEFAULTS["model_code"] and cfg.model_factory == ""
    assert cfg.fingerprint() == _old_fingerprint(cfg)


def test_model_params_without_a_factory_are_refused():
    with pytest.raises(ValueError, match="model_params and model_code apply with model_factory"):
        TrainConfig(model="toy", task="binary_classification", train_files=[FAKE_REF], val_files=[FAKE_REF],
                    feature_state=FAKE_REF, output_dir="/nowhere", model_params={"width": 8})


# --- rebuilding an export ----------------------------------------------------------------------------


def test_rebuild_refuses_code_that_changed_since_the_pin_naming_the_file(tmp_path):
    name, code_path = factory(tmp_path)
    path = f"{name}.model:build"
    meta = {"model_factory": {"module": path, "params": {"width": 4}, "inputs": BINARY.to_dict(),
                              "code": code_pin.pin(path, code_path)}}
    assert rebuild(meta, code_path).net.hidden.out_features == 4  # the pinned code rebuilds
    model_py = tmp_path / name / "model.py"
    model_py.write_text(model_py.read_text() + "\n# retuned\n")
    with pytest.raises(ModelContractError, match=rf"model\.module: the code of {path} changed .*{name}/model\.py"):
        rebuild(meta, code_path)


def test_preflight_refuses_a_wrong_shape_before_training_and_passes_a_good_factory(tmp_path):
    from ml_assets.training.preflight import check_model

    data = toy_data(tmp_path / "data", train_rows=200, val_rows=50)
    good, code_path = factory(tmp_path / "code")
    bad, _ = factory(tmp_path / "code", "return torch.cat([out, out], dim=1)")
    check_model(TrainConfig(**data, output_dir=str(tmp_path / "out"), model_factory=f"{good}.model:build",
                            model_code_path=code_path))
    with pytest.raises(ModelContractError, match=r"model\.module: .* returned shape \[4, 2\]"):
        check_model(TrainConfig(**data, output_dir=str(tmp_path / "out"), model_factory=f"{bad}.model:build",
                                model_code_path=code_path))


# --- one real training -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torchrun_runs(tmp_path_factory) -> dict:
    """Two real torchrun runs of one rank, started together (most of their time is importing torch):
    a small factory trained for two short epochs, and a factory whose module gives [rows, 3] for a
    binary task."""
    root = tmp_path_factory.mktemp("torchrun")
    data = toy_data(root / "data", train_rows=600, val_rows=101)
    good, code_path = factory(root / "code")
    bad, _ = factory(root / "code", "return torch.cat([out] * 3, dim=1)")
    runs = {
        "good": write_config(root / "good.json", data, output_dir=str(root / "good_out"),
                             model_factory=f"{good}.model:build", model_params={"width": 6},
                             model_code_path=code_path, epochs=2, batch_size=64, learning_rate=0.01, seed=3,
                             precision="fp32", checkpoint_async="off"),
        "bad": write_config(root / "bad.json", data, output_dir=str(root / "bad_out"),
                            checkpoint_dir=str(root / "bad_ckpt"), model_factory=f"{bad}.model:build",
                            model_code_path=code_path, epochs=1, precision="fp32"),
        # A store it may not write (sysfs refuses even root): a fault no restart fixes.
        "forbidden": write_config(root / "forbidden.json", data, output_dir=str(root / "forbidden_out"),
                                  checkpoint_dir=f"/sys/ml_assets_{root.name}", model_factory=f"{good}.model:build",
                                  model_params={"width": 6}, model_code_path=code_path, epochs=1, precision="fp32"),
    }
    procs = {}
    for which in runs:
        with (root / f"{which}.log").open("w") as log:
            procs[which] = subprocess.Popen(torchrun_args(root / f"{which}.json",
                                                          max_restarts=2 if which == "forbidden" else 0),
                                            stdout=subprocess.DEVNULL, stderr=log, env=cli_env(OMP_NUM_THREADS="1"))
    try:
        codes = {which: proc.wait(timeout=240) for which, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return {"root": root, "code_path": code_path, "good": good, "bad": bad, "configs": runs, "codes": codes,
            "logs": {which: (root / f"{which}.log").read_text() for which in runs}}


@pytest.mark.torchrun
def test_torchrun_trains_a_factorys_module_and_the_export_rebuilds_it(torchrun_runs):
    root, code_path, name = torchrun_runs["root"], torchrun_runs["code_path"], torchrun_runs["good"]
    cfg, path = torchrun_runs["configs"]["good"], f"{torchrun_runs['good']}.model:build"
    assert torchrun_runs["codes"]["good"] == 0, torchrun_runs["logs"]["good"][-3000:]

    out = root / "good_out"
    meta = json.loads((out / "meta.json").read_text())
    entry = meta["model_factory"]
    assert "model_config" not in meta
    assert entry["module"] == path and entry["params"] == {"width": 6}
    assert entry["code"] == cfg.model_code == code_pin.pin(path, code_path)
    assert entry["inputs"]["numeric"] == ["x", "noise"] and entry["inputs"]["categorical"] == ["group"]
    assert meta["config_fingerprint"] == cfg.fingerprint()

    loaded = load_checkpoint(ref(out / "model.safetensors"), ref(out / "meta.json"), code_path)
    assert isinstance(loaded.model, CustomModel) and not loaded.model.training
    numeric, categorical, target = to_tensors(pl.read_parquet(root / "data" / "val.parquet"),
                                              read_state(cfg.feature_state))
    with torch.no_grad():
        predicted = loaded.model(numeric, categorical)
    # The trained weights, put by hand into the factory's own module: the same outputs.
    weights = load_file(out / "model.safetensors")
    assert weights and all(k.startswith("net.") for k in weights)
    net = sys.modules[f"{name}.model"].build(ModelInputs(**entry["inputs"]), **entry["params"])
    net.load_state_dict({k.removeprefix("net."): v for k, v in weights.items()})
    net.eval()
    with torch.no_grad():
        assert torch.equal(predicted, net(numeric, categorical).squeeze(1))
        loss = nn.functional.binary_cross_entropy_with_logits(predicted, target)
    assert float(loss) == pytest.approx(meta["history"][-1]["val_loss"], rel=1e-5)


def test_torchrun_refuses_a_wrong_output_shape_naming_it_and_writes_nothing(torchrun_runs):
    root, log = torchrun_runs["root"], torchrun_runs["logs"]["bad"]
    assert torchrun_runs["codes"]["bad"] != 0, log[-3000:]
    assert f"model.module: {torchrun_runs['bad']}.model:build's module returned shape [4, 3]" in log, log[-3000:]
    assert "binary_classification needs [4]" in log
    assert not (root / "bad_out").exists() and not (root / "bad_ckpt").exists()


@pytest.mark.torchrun
def test_a_store_the_rank_may_not_write_fails_at_once_with_its_reason_and_no_restart(torchrun_runs):
    log = torchrun_runs["logs"]["forbidden"]
    assert torchrun_runs["codes"]["forbidden"] != 0, log[-3000:]
    assert "a storage fault at /sys/ml_assets_" in log and "a restart cannot fix it" in log, log[-3000:]
    # torchrun was allowed two restarts and used none: rank 0 said it once (each restart would meet
    # the same fault and say it again), and the agent never announced a restart.
    assert log.count("[trainer] WARNING a storage fault") == 1, log[-3000:]
    assert "will restart worker group" not in log, log[-3000:]


@pytest.mark.parametrize(("error", "said"), [
    (OSError(28, "No space left on device", "/ckpt/step-40/w.pt"), "at /ckpt/step-40/w.pt: no space left"),
    (PermissionError(13, "Permission denied"), "permission denied"),
    (FileNotFoundError("The specified bucket does not exist"), "the bucket does not exist"),
    (OSError(122, "Disk quota exceeded"), "the disk quota is exceeded"),
])
def test_permanent_storage_faults_are_recognised_through_their_causes(error, said):
    from ml_assets.trainer.faults import permanent_fault

    try:
        try:
            raise error
        except OSError as inner:
            raise RuntimeError("checkpoint save failed") from inner
    except RuntimeError as outer:
        assert said in permanent_fault(outer)
    for transient in (ConnectionResetError(104, "Connection reset by peer"), FileNotFoundError(2, "gone", "/x"),
                      TimeoutError("read timed out"), RuntimeError("NCCL error")):
        assert permanent_fault(transient) is None
