"""The bundled examples, each a spec only, end to end: the window's days ingested in-process, the
partition itself through the real `dagster asset materialize` CLI; each first model must beat its
evaluation's baseline to be registered, and its registered pyfunc serves in the task's shape."""

import datetime as dt
import subprocess
import sys
from pathlib import Path

import dagster as dg
import mlflow.pyfunc
import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from ml_assets.definitions import build_definitions
from ml_assets.settings import BUNDLED_MODELS_DIR, load_settings
from ml_assets.spec import load_spec
from ml_assets_tests.helpers import cli_env

pytestmark = pytest.mark.e2e
INGEST = ("raw_data", "validated_snapshot", "features")


def run_example(name: str, models_dir: Path = BUNDLED_MODELS_DIR) -> tuple[dict, object, dt.date]:
    """The example's first trainable partition, its history ingested first: (report, version, day)."""
    spec = load_spec(models_dir / f"{name}.yaml")
    before = spec.training.window_days + spec.evaluation.test_days - 1
    day = spec.partitioning.start + dt.timedelta(days=before)
    instance = dg.DagsterInstance.get()
    daily = build_definitions(load_settings()).resolve_job_def(f"{name}_daily")
    for back in range(before, 0, -1):
        result = daily.execute_in_process(partition_key=(day - dt.timedelta(days=back)).isoformat(), instance=instance,
                                          asset_selection=[dg.AssetKey([name, s]) for s in INGEST])
        assert result.success
    proc = subprocess.run([sys.executable, "-m", "dagster", "asset", "materialize", "-m", "ml_assets", "--select",
                           f"group:{name}", "--partition", day.isoformat()],
                          capture_output=True, text=True, timeout=600, env=cli_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey([name, "evaluation_report"]), asset_partitions=[day.isoformat()]),
        limit=1).records
    report = {k: v.value for k, v in records[0].asset_materialization.metadata.items()}
    settings = load_settings()
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)
    return report, client.get_model_version_by_alias(name, "challenger"), day


def beats_baseline(report: dict, spec) -> None:
    assert report["gate_passed"]
    assert report["gate_reason"].startswith(f"first model: {spec.promotion.primary_metric} ")
    assert "vs baseline linear" in report["gate_reason"]
    names = {b["name"] for b in report["baseline"]["baselines"]}
    assert names == {"base_rate", "linear"} and "| baseline: linear |" in report["summary"]


def test_the_low_volume_example_trains_on_weeks_and_beats_its_baseline(home):
    spec = load_spec(BUNDLED_MODELS_DIR / "airport_day.yaml")
    report, version, day = run_example("airport_day")
    beats_baseline(report, spec)
    assert len(report["test_days"]) == spec.evaluation.test_days and report["test_rows"] == 3 * spec.evaluation.test_days
    assert len(report["validation_days"]) == spec.training.validation_days
    assert version.tags["partition"] == day.isoformat()


def test_the_multiclass_example_serves_class_probabilities_and_beats_its_baseline(home):
    spec = load_spec(BUNDLED_MODELS_DIR / "flight_outcome.yaml")
    report, version, day = run_example("flight_outcome")
    beats_baseline(report, spec)
    assert [c["class"] for c in report["per_class"]] == spec.target.classes
    features = dg.DagsterInstance.get().fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["flight_outcome", "features"]), asset_partitions=[day.isoformat()]),
        limit=1).records[0].asset_materialization.metadata
    rows = pl.read_parquet(features["uri"].value).drop("outcome").head(50)
    mlflow.set_tracking_uri(load_settings().mlflow_tracking_uri)
    try:
        served = mlflow.pyfunc.load_model(f"models:/flight_outcome/{version.version}").predict(rows.to_pandas())
    finally:
        mlflow.set_tracking_uri(None)
    assert list(served.columns) == [*spec.target.classes, "predicted_class"]
    assert (served[spec.target.classes].sum(axis=1) - 1).abs().max() < 1e-6
    assert set(served["predicted_class"]) <= set(spec.target.classes)
