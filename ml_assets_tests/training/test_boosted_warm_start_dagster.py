"""Daily retraining of a boosted model (family xgboost, training.warm_start) through the real assets,
registry and promote job: a first full training, then fine-tunes that add rounds to the champion's
registered booster; the fine-tune's lineage walks the chain, ``reproduce --chain`` rebuilds it bit
for bit, and a champion whose registered booster no longer matches its sha256 stops the next
fine-tune with both hashes, registering nothing."""

import datetime as dt
import subprocess
import sys

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from ml_assets.definitions import build_definitions
from ml_assets.lineage import trace
from ml_assets.promotion.config import promotion_run_config
from ml_assets.settings import load_settings
from ml_assets.spec.loading import load_spec
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import cli_env, flights_files, small_training, write_spec

pytestmark = pytest.mark.torchrun

FIRST = dt.date(2013, 3, 8)
PARTITIONS = [FIRST + dt.timedelta(days=n) for n in range(3)]
INGEST = ("raw_data", "validated_snapshot", "features")


def _boosted_spec(spec_dict: dict, tmp_path) -> dict:
    data = small_training(spec_dict, window_days=4)
    data["model"] = {"family": "xgboost", "params": {"num_boost_round": 30, "max_depth": 3, "learning_rate": 0.2,
                                                     "subsample": 0.8, "colsample_bytree": 0.8}}
    data.pop("tuning", None)
    data["training"].update(processes_per_node=1, checkpoint={"every_steps": 10})
    for key in ("epochs", "batch_size", "learning_rate"):
        data["training"].pop(key, None)
    data["training"]["warm_start"] = {"days": 1, "rounds": 8, "learning_rate": 0.1, "replay_fraction": 0.2,
                                      "processes_per_node": 1, "full_every_days": 7,
                                      "full_when": {"features": ["carrier", "dest", "distance", "temp"]}}
    # Models this small are near chance: every candidate is promoted, so each partition has a champion.
    data["promotion"].update(min_improvement=-1.0, max_slice_regression=1.0, max_calibration_worsening=1.0)
    data["promotion"].pop("rival", None)
    days = [FIRST - dt.timedelta(days=n) for n in range(4, 0, -1)] + PARTITIONS
    data["source"] = flights_files(tmp_path / "data", days)
    return data


def test_a_boosted_model_fine_tunes_its_champions_booster_and_rebuilds_the_chain_bit_for_bit(
        home, tmp_path, spec_dict, monkeypatch):
    spec_path = write_spec(tmp_path / "models", _boosted_spec(spec_dict, tmp_path))
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(tmp_path / "models"))
    defs = build_definitions(load_settings())
    instance = dg.DagsterInstance.get()
    daily, promote = defs.resolve_job_def("flights_delay_daily"), defs.resolve_job_def("flights_delay_promote")
    key = lambda stage: dg.AssetKey(["flights_delay", stage])  # noqa: E731
    ingest_days = [FIRST - dt.timedelta(days=n) for n in range(4, 0, -1)]
    for day in ingest_days:
        assert daily.execute_in_process(partition_key=day.isoformat(), instance=instance,
                                        asset_selection=[key(s) for s in INGEST]).success
    settings = load_settings()
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)
    spec = load_spec(spec_path)

    records = {}
    for day in PARTITIONS[:2]:
        result = daily.execute_in_process(partition_key=day.isoformat(), instance=instance)
        [event] = result.asset_materializations_for_node("flights_delay__trained_checkpoint")
        records[day] = {k: v.value for k, v in event.metadata.items()}
        [registered] = result.asset_materializations_for_node("flights_delay__registered_model")
        assert promote.execute_in_process(instance=instance, run_config=promotion_run_config(
            spec, "promote", registered.metadata["model_version"].value, "the gate passed", "pytest")).success

    kinds = [records[d]["training_decision"] for d in PARTITIONS[:2]]
    assert kinds == ["full", "fine_tune"], [records[d]["training_decision_reason"] for d in PARTITIONS[:2]]
    fine = records[PARTITIONS[1]]
    assert "adding up to 8 boosting round(s)" in fine["training_decision_reason"]
    assert fine["decision"]["rounds"] == 8 and fine["decision"]["learning_rate"] == 0.1
    assert fine["decision"]["parent"]["version"] == "1" and fine["decision"]["replay"]["rows"] > 0
    assert fine["feature_state_sha256"] == records[PARTITIONS[0]]["feature_state_sha256"]
    assert 0 < fine["samples_processed"] < records[PARTITIONS[0]]["samples_processed"]
    v2, v1 = (client.get_model_version("flights_delay", v) for v in ("2", "1"))
    assert v2.tags["training_decision"] == "fine_tune" and v2.tags["parent_checkpoint_sha256"] == v1.tags[
        "checkpoint_sha256"]

    store = LocalVersionStore(settings.version_store_root)
    lineage = trace(client, store, "flights_delay", version="2")
    assert lineage.versions == ["2", "1"] and not lineage.mismatches
    assert any(c.what == "v2 started from v1's registered weights" and c.status == "ok" for c in lineage.checks)
    chain = subprocess.run([sys.executable, "-m", "ml_assets.cli", "reproduce", "flights_delay", "--version", "2",
                            "--chain", "--workdir", str(tmp_path / "chain")],
                           capture_output=True, text=True, timeout=600, env=cli_env())
    assert chain.returncode == 0, chain.stderr[-3000:]
    for version in ("1", "2"):
        assert f"version {version}: reproduced bit for bit" in chain.stdout, chain.stdout
    assert "started from the reproduced parent" in chain.stdout

    # The champion's registered booster changed under the registry: the next fine-tune stops.
    [booster] = (home / "mlflow").rglob(f"*{v2.run_id}*/**/model.ubj")
    booster.write_bytes(booster.read_bytes() + b" ")
    broken = daily.execute_in_process(partition_key=PARTITIONS[2].isoformat(), instance=instance,
                                      raise_on_error=False)
    assert not broken.success
    [failure] = [e for e in broken.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.event_specific_data.error.message
    assert "the champion v2 cannot be fine-tuned" in message and v2.tags["checkpoint_sha256"] in message, message
    assert len(client.search_model_versions("name='flights_delay'")) == 2
