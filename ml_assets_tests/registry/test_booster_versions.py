"""A gradient-boosted model (family xgboost) is a version like any other: trained by the real trainer
(torchrun, one process) on real flights, evaluated and registered as the pipeline's assets do, then
read back as MLflow's pyfunc, as the registry's own ``load_version`` (what the evaluation and the
scorer load a champion with) and by lineage's re-hash; its model directory carries ``model.ubj``,
checked by sha256 before XGBoost parses it, and no pickle."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import hashlib
import importlib.metadata as md
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import yaml

from ml_assets.features.build import build_features
from ml_assets.features.state import fit_state, state_bytes
from ml_assets.ingest.sources import read_day
from ml_assets.registry.record import RegisteredRecord, VersionTags
from ml_assets.resources import MlflowTrackingResource
from ml_assets.serving.predict import predict
from ml_assets.spec import ModelSpec
from ml_assets.step import Step
from ml_assets.trainer.config import DataRef
from ml_assets.training.record import CheckpointRecord
from ml_assets.training.trainer_config import train_config
from ml_assets_tests.helpers import small_training
from ml_assets_tests.test_multiclass import SERVING_PROBE
from ml_assets_tests.trainer.toy import run, torchrun_args

pytestmark = pytest.mark.torchrun

NAME = "flights_delay"
TEST_DAY = dt.date(2013, 7, 10)
DAYS = [TEST_DAY - dt.timedelta(days=k) for k in (3, 2, 1, 0)]  # train, train, validation, test
PARTITION = TEST_DAY.isoformat()


def _ref(path: Path, day: dt.date | None = None) -> DataRef:
    return DataRef(uri=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                   day=day.isoformat() if day else "", commit="")


@pytest.fixture(scope="module")
def spec(bundled_spec_dict) -> ModelSpec:
    data = small_training(copy.deepcopy(bundled_spec_dict))
    data["evaluation"]["bootstrap_samples"] = 100  # the interval is not what is tested here
    data["model"] = {"family": "xgboost", "params": {"max_depth": 3, "num_boost_round": 20}}
    return ModelSpec.model_validate(data)


@pytest.fixture(scope="module")
def files(spec, tmp_path_factory) -> dict[dt.date, DataRef]:
    """Each day's feature rows, built as the features asset builds them (its 7 days of history)."""
    root = tmp_path_factory.mktemp("features")
    raw = {d: read_day(spec, d).tables for d in [DAYS[0] - dt.timedelta(days=k) for k in range(7, 0, -1)] + DAYS}
    out = {}
    for day in DAYS:
        history = pl.concat([raw[day - dt.timedelta(days=k)]["rows"] for k in range(1, 8)], how="diagonal_relaxed")
        build_features(spec, raw[day], history).frame.write_parquet(root / f"{day}.parquet")
        out[day] = _ref(root / f"{day}.parquet", day)
    return out


@pytest.fixture(scope="module")
def ckpt(spec, files, tmp_path_factory) -> CheckpointRecord:
    """The trained_checkpoint record of a real torchrun training, its result read as the launcher
    reads the trainer's report."""
    from ml_assets.records.base import unwrap
    from ml_assets.trainer.result import TrainingResult
    from ml_assets.training.launcher import metadata_from_pipes

    root = tmp_path_factory.mktemp("train")
    train = pl.concat([pl.read_parquet(files[d].uri) for d in DAYS[:2]])
    (root / "state.json").write_bytes(state_bytes(fit_state(train, spec.features, spec.target.name, spec.target.task)))
    cfg = dataclasses.replace(train_config(spec, [files[d] for d in DAYS[:2]], [files[DAYS[2]]],
                                           _ref(root / "state.json"), str(root / "out")), threads=1)
    (root / "config.json").write_text(cfg.to_json())
    proc = run(torchrun_args(root / "config.json", nproc=1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((root / "out" / "report.json").read_text())
    result = TrainingResult(**{k: unwrap(v) for k, v in metadata_from_pipes(report["metadata"]).items()})
    assert str(result.checkpoint_uri).endswith("/model.ubj")
    return CheckpointRecord(
        result=result, repository=spec.repository, train_days=[str(d) for d in DAYS[:2]], val_days=[str(DAYS[2])],
        # Commits a version store never held (these features were built outside one): lineage finds them unreachable.
        skipped_days={}, data_commits={str(d): f"commit-{d}" for d in DAYS[:3]},
        feature_files=tuple(files[d] for d in DAYS[:3]),
        feature_state_uri=str(root / "state.json"), features=[], training_config=json.loads(cfg.to_json()),
        hyperparameters={"source": "the spec's training section"}, progress=[])


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> MlflowTrackingResource:
    root = tmp_path_factory.mktemp("mlflow")
    return MlflowTrackingResource(tracking_uri=f"sqlite:///{root / 'mlflow.db'}", artifact_root=str(root / "artifacts"))


@pytest.fixture(scope="module")
def registered(spec, files, ckpt, tracking, tmp_path_factory) -> RegisteredRecord:
    """Evaluated (the evaluation's own report and gate) and registered as registered_model does."""
    from ml_assets.evaluation import report as rep
    from ml_assets.registry.register import register

    report, _ = rep.evaluate(spec, PARTITION, ckpt, [files[TEST_DAY]], tracking.client())
    path = tmp_path_factory.mktemp("evaluation") / "report.json"
    path.write_bytes(report.to_json())
    ref = SimpleNamespace(uri=str(path), sha256=_ref(path).sha256, size=path.stat().st_size)
    evaluation = rep.evaluation_record(spec, report, ref, "run", "http://mlflow/run", {})
    assert evaluation.gate_passed, evaluation.gate_reason
    step = Step(spec, PARTITION, "dagster-run", "http://dagster/runs/dagster-run")
    return register(step, ckpt, evaluation, tracking, lambda message: None)


@pytest.fixture(scope="module")
def rows(files) -> pl.DataFrame:
    return pl.read_parquet(files[TEST_DAY].uri)


@pytest.fixture(scope="module")
def expected(ckpt, rows) -> np.ndarray:
    """What the checkpoint itself predicts, loaded as the evaluation loads it."""
    from ml_assets.trainer.checkpoint import load_checkpoint

    return predict(load_checkpoint(ckpt.weights, ckpt.meta), rows)


def _load(tracking: MlflowTrackingResource, uri: str):
    import mlflow.pyfunc

    mlflow.set_tracking_uri(tracking.tracking_uri)  # what a user sets (docs/operations.md)
    try:
        return mlflow.pyfunc.load_model(uri)
    finally:
        mlflow.set_tracking_uri(None)


def test_the_registered_booster_serves_what_the_checkpoint_predicts(spec, ckpt, registered, tracking, rows,
                                                                      expected):
    client = tracking.client()
    mv = client.get_model_version(NAME, registered.model_version)
    assert VersionTags.from_tags(mv.tags).checkpoint_sha256 == ckpt.result.checkpoint_sha256
    model = _load(tracking, f"models:/{NAME}/{registered.model_version}")
    served = model.predict(rows.drop(spec.target.name).to_pandas())
    assert served.shape == (rows.height,) and ((served > 0) & (served < 1)).all()
    np.testing.assert_array_equal(served, expected)


def test_load_version_gives_the_booster_the_evaluation_and_the_scorer_read(registered, tracking, rows, expected):
    import xgboost

    from ml_assets.registry.versions import load_version

    client = tracking.client()
    loaded = load_version(client, client.get_model_version(NAME, registered.model_version))
    assert isinstance(loaded.model, xgboost.Booster) and loaded.meta["family"] == "xgboost"
    np.testing.assert_array_equal(predict(loaded, rows), expected)


@pytest.fixture(scope="module")
def model_dir(registered, tracking, tmp_path_factory) -> Path:
    """The registered model directory, as MLflow stores it."""
    from ml_assets.registry.versions import download_model

    client = tracking.client()
    return download_model(client, client.get_model_version(NAME, registered.model_version),
                          tmp_path_factory.mktemp("download"))


def test_the_model_directory_carries_model_ubj_code_and_no_pickle(model_dir):
    artifacts = sorted(p.name for p in (model_dir / "artifacts").iterdir())
    assert artifacts == ["feature_state.json", "meta.json", "model.ubj", "spec.json"]
    assert not [p for p in model_dir.rglob("*") if p.suffix in (".pkl", ".pickle", ".joblib", ".cloudpickle")]
    # "Models from code": MLflow runs the code file copied into the directory; no python_model.pkl.
    flavor = yaml.safe_load((model_dir / "MLmodel").read_text())["flavors"]["python_function"]
    assert flavor["loader_module"] == "mlflow.pyfunc.loaders.code_model" and "python_model" not in flavor
    assert Path(flavor["model_code_path"]).name == "mlflow_model.py" and (model_dir / "mlflow_model.py").is_file()
    # The build of XGBoost it was registered with (xgboost-cpu here, xgboost with CUDA), as an index names it.
    [dist] = md.packages_distributions()["xgboost"]
    requirements = (model_dir / "requirements.txt").read_text().split()
    assert f"{dist.lower()}=={md.version(dist)}" in requirements
    assert {r.split("==")[0] for r in requirements} >= {"mlflow", "torch", "polars"}


def test_a_tampered_model_ubj_is_refused_by_its_sha256_before_xgboost_reads_it(model_dir, tracking, registered,
                                                                                 tmp_path, monkeypatch):
    import xgboost

    from ml_assets.registry.versions import RegistryError, download_model

    tampered = tmp_path / "model"
    shutil.copytree(model_dir, tampered)
    # A valid booster with other bytes: only the sha256 can tell it from the registered one.
    booster = xgboost.Booster(model_file=str(model_dir / "artifacts" / "model.ubj"))
    booster.set_attr(tampered="yes")
    (tampered / "artifacts" / "model.ubj").write_bytes(bytes(booster.save_raw("ubj")))
    parsed = []
    monkeypatch.setattr(xgboost, "Booster", lambda *args, **kwargs: parsed.append(kwargs))
    with pytest.raises(ValueError, match="model.ubj: sha256 does not match meta.json's weights_sha256"):
        _load(tracking, str(tampered))
    assert not parsed, "XGBoost parsed the tampered bytes before they were checked"
    monkeypatch.undo()

    # The same bytes in the artifact store: downloading the version refuses them against its tag.
    client = tracking.client()
    mv = client.get_model_version(NAME, registered.model_version)
    stored = Path(client.download_artifacts(mv.run_id, "model", str(tmp_path / "stored")))
    registered_file = Path(mv.source.removeprefix("file://")) / "artifacts" / "model.ubj"
    original = registered_file.read_bytes()
    assert original == (stored / "artifacts" / "model.ubj").read_bytes()
    registered_file.write_bytes((tampered / "artifacts" / "model.ubj").read_bytes())
    try:
        with pytest.raises(RegistryError, match="weights sha256 .* differ from the registered"):
            download_model(client, mv, tmp_path / "again")
    finally:
        registered_file.write_bytes(original)


class _NoStore:
    """A version store that holds none of the days (the features here were built outside one)."""

    def log(self, repo: str, ref: str) -> list:
        from ml_assets.versioning import NotFound

        raise NotFound(f"{repo}: no version store in this test")


def test_lineage_rehashes_the_registered_model_ubj(registered, tracking):
    from ml_assets import lineage

    traced = lineage.trace(tracking.client(), _NoStore(), NAME, version=registered.model_version)
    weights = {c.what: c for c in traced.checks if "weights" in c.what or "checkpoint" in c.what}
    assert [c.status for c in weights.values()] == ["ok", "ok"], weights
    assert "registered weights (MLflow artifact model/artifacts/model.ubj)" in weights
    assert traced.chain["checkpoint"]["meta"]["xgboost_version"]


def test_a_version_whose_artifacts_are_gone_is_refused_in_one_line_naming_it(registered, tracking, tmp_path):
    """Objects lost behind the registry's back (a store restored without them): loading, lineage and
    audit say which version and where, instead of MLflow's "Failed to download artifacts" traceback."""
    from ml_assets import lineage
    from ml_assets.registry.versions import RegistryError, download_model

    client = tracking.client()
    mv = client.get_model_version(NAME, registered.model_version)
    stored = Path(mv.source.removeprefix("file://"))
    stored.rename(tmp_path / "moved")
    try:
        with pytest.raises(RegistryError) as raised:
            download_model(client, mv, tmp_path / "download")
        assert str(raised.value).startswith(f"{NAME} version {mv.version}: its artifacts ({mv.source}) cannot be read: ")
        assert "\n" not in str(raised.value)
        with pytest.raises(lineage.LineageError, match=f"{NAME} version {mv.version}: its artifacts"):
            lineage.trace(client, _NoStore(), NAME, version=registered.model_version)
    finally:
        (tmp_path / "moved").rename(stored)


def test_loading_and_predicting_import_only_what_the_requirements_name(model_dir, tmp_path):
    """What `mlflow models serve` installs (requirements.txt) covers what a booster's model imports."""
    probe = subprocess.run([sys.executable, "-c", SERVING_PROBE, str(model_dir)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["ml_assets"].startswith(str(model_dir / "code")), "the model runs the code registered with it"
    # pytz, tqdm: as for a network (test_multiclass); rich: imported when present by scikit-learn's
    # progress bars (which do not require it), itself imported by XGBoost when it is installed.
    assert set(found["outside"]) <= {"pytz", "tqdm", "rich"}, "loading and predicting import packages not required"
