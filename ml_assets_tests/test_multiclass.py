"""Multiclass classification on the bundled flights, stage by stage without Dagster: a spec with four
delay classes, its features (class indices), torchrun DDP training of a softmax head with
cross-entropy, exact resume, the evaluation report and its plots, and the MLflow pyfunc that returns
a probability per class and the predicted class."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import hashlib
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
from mlflow.tracking import MlflowClient

from ml_assets.evaluation import report as rep
from ml_assets.evaluation.document import EvaluationReport
from ml_assets.evaluation.metrics import MULTICLASS_METRICS
from ml_assets.evaluation.summary import summary_markdown
from ml_assets.features.build import FeatureError, build_features
from ml_assets.features.state import fit_state, state_bytes
from ml_assets.ingest.sources import read_day
from ml_assets.registry.record import VersionTags
from ml_assets.serving import pyfunc
from ml_assets.serving.predict import predict
from ml_assets.spec import ModelSpec
from ml_assets.trainer.checkpoint import load_checkpoint
from ml_assets.trainer.config import DataRef
from ml_assets.trainer.data import to_tensors
from ml_assets.trainer.result import TrainingResult
from ml_assets.training.record import CheckpointRecord
from ml_assets.training.trainer_config import train_config
from ml_assets_tests.helpers import multiclass, small_training
from ml_assets_tests.trainer.toy import complete_checkpoints, run, torchrun_args

pytestmark = pytest.mark.torchrun

CLASSES = ["on_time", "late", "very_late", "cancelled"]
TEST_DAY = dt.date(2013, 7, 10)  # a stormy July week: every class is well represented
DAYS = [TEST_DAY - dt.timedelta(days=k) for k in (3, 2, 1, 0)]  # train, train, validation, test
# One thread per rank and deterministic kernels: a resumed run must give the same bits.
EXACT = dict(epochs=3, batch_size=128, learning_rate=0.01, seed=3, deterministic=True, threads=1, precision="fp32",
             checkpoint_every_steps=10, keep_last=100, report_every_steps=1000)


def _ref(path: Path, day: dt.date | None = None) -> DataRef:
    return DataRef(uri=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                   day=day.isoformat() if day else "", commit="c0ffee" if day else "")


@pytest.fixture(scope="module")
def spec(bundled_spec_dict) -> ModelSpec:
    return ModelSpec.model_validate(small_training(multiclass(copy.deepcopy(bundled_spec_dict))))


@pytest.fixture(scope="module")
def raw(spec) -> dict[dt.date, dict[str, pl.DataFrame]]:
    days = [DAYS[0] - dt.timedelta(days=k) for k in range(7, 0, -1)] + DAYS
    return {d: read_day(spec, d).tables for d in days}


def _history(raw: dict, day: dt.date) -> pl.DataFrame:
    return pl.concat([raw[day - dt.timedelta(days=k)]["rows"] for k in range(1, 8)], how="diagonal_relaxed")


@pytest.fixture(scope="module")
def files(spec, raw, tmp_path_factory) -> dict[dt.date, DataRef]:
    root = tmp_path_factory.mktemp("features")
    out = {}
    for day in DAYS:
        path = root / f"{day.isoformat()}.parquet"
        build_features(spec, raw[day], _history(raw, day)).frame.write_parquet(path)
        out[day] = _ref(path, day)
    return out


@pytest.fixture(scope="module")
def trained(spec, files, tmp_path_factory) -> tuple:
    root = tmp_path_factory.mktemp("train")
    train = pl.concat([pl.read_parquet(files[d].uri) for d in DAYS[:2]])
    (root / "state.json").write_bytes(state_bytes(fit_state(train, spec.features, spec.target.name,
                                                            spec.target.task)))
    cfg = dataclasses.replace(
        train_config(spec, [files[d] for d in DAYS[:2]], [files[DAYS[2]]], _ref(root / "state.json"),
                     str(root / "out")), **EXACT)
    (root / "config.json").write_text(cfg.to_json())
    proc = run(torchrun_args(root / "config.json", nproc=2))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cfg, root


@pytest.fixture(scope="module")
def loaded(trained):
    out = trained[1] / "out"
    return load_checkpoint(_ref(out / "model.safetensors"), _ref(out / "meta.json"))


# --- features -----------------------------------------------------------------------------------


def test_features_hold_the_class_index_of_each_row(spec, raw, files):
    frame = pl.read_parquet(files[TEST_DAY].uri)
    rows = raw[TEST_DAY]["rows"]
    expected = rows.select(pl.sql_expr(spec.target.expression).alias("c"))["c"].replace_strict(
        CLASSES, list(range(4)))
    assert frame.schema["delay_class"] == pl.Int64
    assert frame["delay_class"].to_list() == expected.to_list()  # every row has a class: none dropped
    assert set(frame["delay_class"].unique()) == {0, 1, 2, 3}


def test_a_label_outside_the_classes_fails_naming_the_model_the_value_and_the_field(spec, raw):
    data = spec.model_dump(mode="json", by_alias=True)
    data["target"]["classes"] = ["on_time", "late", "very_late"]
    narrower = ModelSpec.model_validate(data)
    with pytest.raises(FeatureError, match=r"model flights_delay: target.expression gives \['cancelled'\], not "
                                           r"among target.classes \['on_time', 'late', 'very_late'\]"):
        build_features(narrower, raw[TEST_DAY], _history(raw, TEST_DAY))


def test_class_indices_from_the_expression_build_the_same_features(spec, raw, files):
    data = spec.model_dump(mode="json", by_alias=True)
    data["target"]["expression"] = ("CASE WHEN dep_time IS NULL THEN 3 WHEN dep_delay >= 60 THEN 2 "
                                    "WHEN dep_delay >= 15 THEN 1 ELSE 0 END")
    by_index = build_features(ModelSpec.model_validate(data), raw[TEST_DAY], _history(raw, TEST_DAY)).frame
    assert by_index.equals(pl.read_parquet(files[TEST_DAY].uri))


def test_a_missing_label_drops_the_row_as_for_binary(spec, raw):
    data = spec.model_dump(mode="json", by_alias=True)
    data["target"]["expression"] = "CASE WHEN dep_delay >= 60 THEN 'very_late' WHEN dep_delay >= 15 THEN 'late' " \
                                   "WHEN dep_delay < 15 THEN 'on_time' END"
    built = build_features(ModelSpec.model_validate(data), raw[TEST_DAY], _history(raw, TEST_DAY))
    assert built.rows_without_target == raw[TEST_DAY]["rows"]["dep_delay"].null_count() > 0


# --- training -----------------------------------------------------------------------------------


def test_torchrun_trains_a_softmax_head_with_cross_entropy(trained, loaded, files):
    cfg, root = trained
    meta = loaded.meta
    assert meta["classes"] == CLASSES and meta["model_config"]["n_outputs"] == 4 and meta["world_size"] == 2
    train_losses = [e["train_loss"] for e in meta["history"]]
    assert len(train_losses) == 3 and train_losses[-1] < train_losses[0]
    # The all-reduced validation loss is the exported model's cross-entropy over the whole validation day.
    numeric, categorical, target = to_tensors(pl.read_parquet(files[DAYS[2]].uri), loaded.feature_state)
    assert target.dtype == torch.int64
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(loaded.model(numeric, categorical), target)
    assert float(loss) == pytest.approx(meta["history"][-1]["val_loss"], rel=1e-5)


def test_the_exported_model_predicts_probabilities_of_each_class(loaded, files):
    p = predict(loaded, pl.read_parquet(files[TEST_DAY].uri))
    assert p.shape == (pl.read_parquet(files[TEST_DAY].uri).height, 4)
    assert (p >= 0).all() and np.abs(p.sum(axis=1) - 1).max() < 1e-9


def test_a_resumed_run_gives_the_same_bits(trained, tmp_path):
    cfg, root = trained
    checkpoints = complete_checkpoints(root / "out" / "checkpoints")
    middle = next(c for c in checkpoints if c["epoch"] >= 1 and c["rows_in_epoch"] > 0)
    copied = tmp_path / "checkpoints"
    shutil.copytree(root / "out" / "checkpoints", copied)
    for directory in copied.glob("step-*"):  # as if the first run had died just after that checkpoint
        if int(re.sub(r"\D", "", directory.name)) > middle["step"]:
            shutil.rmtree(directory)
    again = dataclasses.replace(cfg, output_dir=str(tmp_path / "out"), checkpoint_dir=str(copied))
    (tmp_path / "config.json").write_text(again.to_json())
    proc = run(torchrun_args(tmp_path / "config.json", nproc=2))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {copied}/step-" in proc.stderr
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (root / "out" / "model.safetensors").read_bytes()


# --- evaluation ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> MlflowClient:
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    return MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}")


def test_the_evaluation_reports_multiclass_metrics_per_class_rates_and_plots(spec, trained, loaded, files, client,
                                                                          tmp_path):
    out = trained[1] / "out"
    meta = json.loads((out / "meta.json").read_text())
    ckpt = _checkpoint_record(out, meta)
    report, predictions = rep.evaluate(spec, TEST_DAY.isoformat(), ckpt, [files[TEST_DAY]], client)
    assert set(report.metrics) == set(MULTICLASS_METRICS)
    assert report.threshold is None and report.positive_rate is None
    assert report.classes == CLASSES and sum(report.class_rates.values()) == pytest.approx(1.0)
    assert [c.name for c in report.per_class] == CLASSES
    assert all(0 <= c.precision <= 1 and 0 <= c.recall <= 1 for c in report.per_class)
    lo, hi = report.primary_interval
    assert lo <= report.metrics["macro_f1"] <= hi
    assert all(s.class_rates is not None for s in report.slices)
    assert report.gate.passed and report.gate.kind == "first_model"  # floor macro_f1 0.2
    assert rep.write_plots(spec, report, predictions, tmp_path) == [
        "confusion_matrix.png", "calibration.png", "loss_curves.png", "slices.png"]
    summary = summary_markdown(spec, report, {})
    assert "| class | share of rows | precision | recall |" in summary and "| cancelled |" in summary
    ref = SimpleNamespace(uri=str(tmp_path / "report.json"), sha256="0" * 64, size=1)
    metadata = rep.evaluation_record(spec, report, ref, "run", "http://mlflow/run", {}).to_metadata()
    document = json.loads(report.to_json())  # the stored report is plain JSON, and reads back as it was
    assert metadata["per_class"].value == document["per_class"]
    assert metadata["class_rates"].value == document["class_rates"]
    assert all("class_rates" in r for r in document["slices"])
    assert EvaluationReport.from_dict(document) == report


# --- serving --------------------------------------------------------------------------------------


def test_the_registered_pyfunc_returns_class_probabilities_and_the_predicted_class(spec, trained, loaded, files,
                                                                                  client, tmp_path):
    import mlflow.pyfunc

    out = trained[1] / "out"
    exported = {name: (out / name).read_bytes() for name in ("model.safetensors", "meta.json", "feature_state.json")}
    spec_json = json.dumps(spec.model_dump(mode="json", by_alias=True), sort_keys=True).encode()
    experiment = client.create_experiment("flights_delay", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    client.log_artifacts(run_id, str(pyfunc.save(tmp_path / "model", exported, spec_json)), "model")
    client.create_registered_model("flights_delay")
    version = client.create_model_version("flights_delay", source=f"{client.get_run(run_id).info.artifact_uri}/model",
                                          run_id=run_id, tags=_class_tags(spec))
    assert json.loads(client.get_model_version("flights_delay", version.version).tags["classes"]) == CLASSES

    mlflow.set_tracking_uri(client.tracking_uri)  # what a user sets (docs/operations.md)
    try:
        model = mlflow.pyfunc.load_model(f"models:/flights_delay/{version.version}")
    finally:
        mlflow.set_tracking_uri(None)
    assert model.metadata.get_output_schema().input_names() == [*CLASSES, "predicted_class"]
    rows = pl.read_parquet(files[TEST_DAY].uri)
    served = model.predict(rows.drop("delay_class").to_pandas())
    assert list(served.columns) == [*CLASSES, "predicted_class"]
    probabilities = served[CLASSES].to_numpy()
    assert np.abs(probabilities.sum(axis=1) - 1).max() < 1e-9
    assert np.abs(probabilities - predict(loaded, rows)).max() < 1e-6
    assert served["predicted_class"].tolist() == [CLASSES[i] for i in probabilities.argmax(axis=1)]


SERVING_PROBE = """
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
import mlflow.models, mlflow.pyfunc
model = mlflow.pyfunc.load_model(sys.argv[1])
model.predict(mlflow.models.Model.load(sys.argv[1]).load_input_example(sys.argv[1]))
import ml_assets
names = {m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names) - {"ml_assets", "__main__"}
owners = md.packages_distributions()
used = {d.lower() for n in names for d in owners.get(n, [])}
closure, todo = set(), [r.split("==")[0] for r in open(sys.argv[1] + "/requirements.txt").read().split()]
while todo:
    name = todo.pop().lower().replace("_", "-")
    if name in closure:
        continue
    closure.add(name)
    for req in md.requires(name) or []:
        parsed = Requirement(req)
        if parsed.marker is None or parsed.marker.evaluate({"extra": ""}):
            todo.append(parsed.name)
print(json.dumps({"ml_assets": ml_assets.__file__, "outside": sorted(
    d for d in used if d.replace("_", "-") not in closure)}))
"""


def test_the_registered_pyfunc_carries_its_code_an_example_and_requirements_an_index_serves(spec, trained, files,
                                                                                              tmp_path):
    """What `mlflow models serve` needs: required feature columns (a missing one is named), an input
    example of real rows, the library's code inside the model, requirements that only name published
    packages and cover everything loading and predicting imports."""
    import subprocess
    import sys

    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    out = trained[1] / "out"
    exported = {name: (out / name).read_bytes() for name in ("model.safetensors", "meta.json", "feature_state.json")}
    spec_json = json.dumps(spec.model_dump(mode="json", by_alias=True), sort_keys=True).encode()
    rows = pl.read_parquet(files[TEST_DAY].uri)
    saved = pyfunc.save(tmp_path / "model", exported, spec_json, pyfunc.input_example(spec, rows))
    inputs = {c.name: c.required for c in mlflow.models.Model.load(str(saved)).get_input_schema().inputs}
    assert all(inputs[c] for c in [*spec.features.numeric_names, "carrier", "origin"])
    assert not inputs["local_day_of_week"] and not inputs["time_hour"]  # or derived from the timestamp
    example = json.loads((saved / "input_example.json").read_text())
    assert len(example["data"]) == pyfunc.EXAMPLE_ROWS and set(example["columns"]) <= set(inputs)
    requirements = (saved / "requirements.txt").read_text().split()
    assert not [r for r in requirements if "+" in r or r.startswith("ml-assets")]
    assert {r.split("==")[0] for r in requirements} >= {"mlflow", "torch", "polars"}
    code = saved / "code" / "ml_assets"
    assert (code / "serving" / "pyfunc.py").is_file() and not list(code.rglob("__pycache__"))
    assert not (code / "models").exists()  # the demo's specs stay out

    model = mlflow.pyfunc.load_model(str(saved))
    with pytest.raises(MlflowException, match=r"Model is missing inputs \['distance'\]"):
        model.predict(rows.drop("distance").to_pandas())
    probe = subprocess.run([sys.executable, "-c", SERVING_PROBE, str(saved)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["ml_assets"].startswith(str(code)), "the model runs the code registered with it"
    # pytz and tqdm: imported when present by pandas and by torch's and mlflow's utilities, which do
    # not require them; anything else would be a requirement the model's requirements.txt misses.
    assert set(found["outside"]) <= {"pytz", "tqdm"}, "loading and predicting import packages not required"


def _checkpoint_record(out, meta: dict) -> CheckpointRecord:
    """The record of a checkpoint trained outside Dagster: what the evaluation reads of it."""
    numbers = {f.name: 0 for f in dataclasses.fields(TrainingResult) if f.type in ("int", "float")}
    texts = {f.name: "" for f in dataclasses.fields(TrainingResult) if f.type == "str"}
    result = TrainingResult(**{**numbers, **texts, "checkpoint_uri": str(out / "model.safetensors"),
                               "checkpoint_sha256": meta["weights_sha256"], "meta_uri": str(out / "meta.json"),
                               "meta_sha256": _ref(out / "meta.json").sha256, "history": meta["history"]})
    return CheckpointRecord(result=result, repository="", train_days=[], val_days=[], skipped_days={},
                            data_commits={}, feature_files=(), feature_state_uri="", features=[],
                            training_config={}, hyperparameters={}, progress=[])


def _class_tags(spec) -> dict[str, str]:
    """The registered version's tags that say what a multiclass model predicts."""
    tags = dataclasses.replace(VersionTags.from_tags({}), task=spec.target.task,
                               classes=list(spec.target.classes)).to_tags()
    return {k: tags[k] for k in ("task", "classes")}
