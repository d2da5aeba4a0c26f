"""Gradient-boosted trees through the real assets, registry and promote job: a network is champion,
the same model re-declared as XGBoost trains on two workers under torchrun, is judged against that
champion and the baselines on the same rows, registered and promoted in its place; its registered
pyfunc predicts what the evaluation scored, lineage re-hashes it, and reproduce rebuilds it bit for
bit."""

import datetime as dt

import dagster as dg
import mlflow
import numpy as np
import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from ml_assets import audit
from ml_assets.definitions import build_definitions
from ml_assets.lineage import trace
from ml_assets.promotion.config import promotion_run_config
from ml_assets.settings import load_settings
from ml_assets.spec.loading import load_spec
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import flights_files, small_training, write_spec

pytestmark = pytest.mark.torchrun

DAYS = [dt.date(2013, 3, 4) + dt.timedelta(days=n) for n in range(6)]
FIRST, SECOND = DAYS[4], DAYS[5]
INGEST = ("raw_data", "validated_snapshot", "features")
TREES = {"family": "xgboost", "params": {"num_boost_round": 40, "max_depth": 4, "learning_rate": 0.2,
                                         "colsample_bytree": 0.8}}


def _run(spec_data: dict, tmp_path, day: dt.date, ingest_days: list[dt.date]):
    spec_path = write_spec(tmp_path / "models", spec_data)
    defs = build_definitions(load_settings())
    instance = dg.DagsterInstance.get()
    daily = defs.resolve_job_def("flights_delay_daily")
    for d in ingest_days:
        assert daily.execute_in_process(partition_key=d.isoformat(), instance=instance, asset_selection=[
            dg.AssetKey(["flights_delay", s]) for s in INGEST]).success
    result = daily.execute_in_process(partition_key=day.isoformat(), instance=instance)
    [registered] = result.asset_materializations_for_node("flights_delay__registered_model")
    version = registered.metadata["model_version"].value
    promote = defs.resolve_job_def("flights_delay_promote")
    assert promote.execute_in_process(instance=instance, run_config=promotion_run_config(
        load_spec(spec_path), "promote", version, "the gate passed", "pytest")).success
    return result, version


def test_trees_replace_a_network_champion_through_the_gate_and_rebuild_bit_for_bit(
        home, tmp_path, spec_dict, monkeypatch):
    data = small_training(spec_dict, window_days=3, epochs=1)
    data["promotion"].update(min_improvement=-1.0, max_slice_regression=1.0, max_calibration_worsening=1.0)
    data["source"] = flights_files(tmp_path / "data", DAYS)
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(tmp_path / "models"))
    _, network = _run(data, tmp_path, FIRST, DAYS[:5])

    data["model"] = TREES
    data["training"].update(processes_per_node=2, checkpoint={"every_steps": 10})
    data.pop("tuning", None)
    result, trees = _run(data, tmp_path, SECOND, [SECOND])
    [ckpt] = result.asset_materializations_for_node("flights_delay__trained_checkpoint")
    assert ckpt.metadata["world_size"].value == 2 and ckpt.metadata["cpu_rank_seconds"].value > 0
    assert ckpt.metadata["checkpoint_uri"].value.endswith("/model.ubj")
    [report] = result.asset_materializations_for_node("flights_delay__evaluation_report")
    # Judged against the network champion on the same rows, and registered in its place.
    assert report.metadata["champion_version"].value == network
    assert report.metadata["primary_delta"].value is not None

    settings = load_settings()
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)
    assert str(client.get_model_version_by_alias("flights_delay", "champion").version) == str(trees)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", settings.mlflow_tracking_uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", settings.mlflow_tracking_uri)
    served = mlflow.pyfunc.load_model(f"models:/flights_delay/{trees}")
    test_rows = _test_rows(report)
    assert np.isfinite(np.asarray(served.predict(test_rows.to_pandas()))).all()

    # The champion scores a day's rows as a network champion would (the predictions asset).
    score = build_definitions(settings).resolve_job_def("flights_delay_score")
    scored = score.execute_in_process(partition_key=SECOND.isoformat(), instance=dg.DagsterInstance.get())
    [event] = scored.asset_materializations_for_node("flights_delay__predictions")
    assert event.metadata["model_version"].value == str(trees) and event.metadata["rows"].value > 0

    lineage = trace(client, LocalVersionStore(settings.version_store_root), "flights_delay", version=trees)
    assert not lineage.mismatches and not [c for c in lineage.checks if c.status == "unreachable"]
    rebuilt = audit.reproduce(client, "flights_delay", trees, tmp_path / "reproduce", "unused")
    assert rebuilt.identical, rebuilt.reasons


def _test_rows(report) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(f["uri"]) for f in report.metadata["test_files"].value])
