"""Daily retraining through the real assets, registry and promote job (training.warm_start): a
first full training, fine-tunes of the champion that start from its registered weights and keep its
feature state, a scheduled full retrain, and a re-run partition that skips; each decision recorded
on the checkpoint and the version; lineage walks the chain and reproduce rebuilds a fine-tune bit
for bit from its parent, and with --chain from the last full training."""

import datetime as dt
import json
import subprocess
import sys

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from ml_assets import audit
from ml_assets.definitions import build_definitions
from ml_assets.lineage import trace
from ml_assets.promotion.config import promotion_run_config
from ml_assets.settings import load_settings
from ml_assets.spec.loading import load_spec
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import cli_env, flights_files, small_training, write_spec

pytestmark = pytest.mark.torchrun

FIRST = dt.date(2013, 3, 8)
PARTITIONS = [FIRST + dt.timedelta(days=n) for n in range(4)]
INGEST = ("raw_data", "validated_snapshot", "features")


def test_partitions_fine_tune_the_champion_then_retrain_on_schedule_and_rebuild_bit_for_bit(
        home, tmp_path, spec_dict, monkeypatch):
    data = small_training(spec_dict, window_days=4, epochs=2)
    # A 3-day window has not seen every weekday: its vocabulary would send the next day to a full retrain.
    data["training"]["warm_start"] = {"days": 1, "epochs": 1, "replay_fraction": 0.2, "full_every_days": 3,
                                      "processes_per_node": 1,
                                      "full_when": {"features": ["carrier", "dest", "distance", "temp"]}}
    # Models this small are near chance: every candidate is promoted, so each partition has a champion.
    data["promotion"].update(min_improvement=-1.0, max_slice_regression=1.0, max_calibration_worsening=1.0)
    days = [FIRST - dt.timedelta(days=n) for n in range(4, 0, -1)] + PARTITIONS
    data["source"] = flights_files(tmp_path / "data", days)
    spec_path = write_spec(tmp_path / "models", data)
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(tmp_path / "models"))
    defs = build_definitions(load_settings())
    instance = dg.DagsterInstance.get()
    daily, promote = defs.resolve_job_def("flights_delay_daily"), defs.resolve_job_def("flights_delay_promote")
    key = lambda stage: dg.AssetKey(["flights_delay", stage])  # noqa: E731
    for day in days[:4]:
        assert daily.execute_in_process(partition_key=day.isoformat(), instance=instance,
                                        asset_selection=[key(s) for s in INGEST]).success
    settings = load_settings()
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)
    spec = load_spec(spec_path)

    records, baselines = {}, {}
    for day in PARTITIONS:
        result = daily.execute_in_process(partition_key=day.isoformat(), instance=instance)
        [event] = result.asset_materializations_for_node("flights_delay__trained_checkpoint")
        records[day] = {k: v.value for k, v in event.metadata.items()}
        [report] = result.asset_materializations_for_node("flights_delay__evaluation_report")
        baselines[day] = report.metadata["baseline"].value
        [registered] = result.asset_materializations_for_node("flights_delay__registered_model")
        version = registered.metadata["model_version"].value
        assert promote.execute_in_process(instance=instance, run_config=promotion_run_config(
            spec, "promote", version, "the gate passed", "pytest")).success

    kinds = [records[d]["training_decision"] for d in PARTITIONS]
    assert kinds == ["full", "fine_tune", "fine_tune", "full"], [records[d]["training_decision_reason"] for d in PARTITIONS]
    assert "no @champion" in records[PARTITIONS[0]]["training_decision_reason"]
    assert "scheduled" in records[PARTITIONS[3]]["training_decision_reason"]
    fine = records[PARTITIONS[2]]
    # The parent's feature state, unchanged: its inputs mean what they meant.
    assert fine["feature_state_sha256"] == records[PARTITIONS[1]]["feature_state_sha256"] \
        == records[PARTITIONS[0]]["feature_state_sha256"]
    assert records[PARTITIONS[3]]["feature_state_sha256"] != fine["feature_state_sha256"]
    assert fine["decision"]["parent"]["version"] == "2" and fine["decision"]["fine_tune_days"] == [
        (PARTITIONS[2] - dt.timedelta(days=2)).isoformat()]
    assert fine["decision"]["replay"]["rows"] > 0 and fine["world_size"] == 1
    assert fine["samples_processed"] < records[PARTITIONS[0]]["samples_processed"]
    # Its baselines are fitted on the whole window's training days, as a full training's would be.
    assert baselines[PARTITIONS[2]]["sample"]["window_rows"] > fine["train_rows"]
    for record in records.values():
        assert record["cpu_rank_seconds"] > 0 and record["samples_processed"] > 0

    v3 = client.get_model_version("flights_delay", "3")
    assert v3.tags["training_decision"] == "fine_tune" and v3.tags["parent_version"] == "2"
    assert v3.tags["parent_checkpoint_sha256"] == client.get_model_version("flights_delay", "2").tags["checkpoint_sha256"]
    assert v3.tags["chain_start_partition"] == PARTITIONS[0].isoformat()
    run = client.get_run(v3.run_id)
    assert run.data.metrics["training_samples_processed"] == fine["samples_processed"]

    # A re-run of a trained partition: the same inputs, nothing trained, evaluated or registered.
    again = daily.execute_in_process(partition_key=PARTITIONS[3].isoformat(), instance=instance)
    assert not again.asset_materializations_for_node("flights_delay__trained_checkpoint")
    assert not again.asset_materializations_for_node("flights_delay__registered_model")
    [observed] = [e for e in again.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert observed.event_specific_data.asset_observation.metadata["holder_version"].value == "4"
    assert len(client.search_model_versions("name='flights_delay'")) == 4
    # The monitor's evidence that the champion degraded is a reason to train from scratch, never to skip.
    evidence = daily.execute_in_process(partition_key=PARTITIONS[3].isoformat(), instance=instance, tags={
        "ml_assets/retrain": "degradation", "ml_assets/retrain_reason": "model_monitor 2013-03-11: blocked"})
    [event] = evidence.asset_materializations_for_node("flights_delay__trained_checkpoint")
    assert event.metadata["training_decision"].value == "full"
    assert "retraining on evidence" in event.metadata["training_decision_reason"].value
    # The registry ahead of Dagster (a run killed after MLflow made the version, before Dagster recorded
    # it): the re-run does not skip, and the same bytes are recorded as the version that holds them.
    versions = {v.version for v in client.search_model_versions("name='flights_delay'")}
    holder = str(min(int(v.version) for v in client.search_model_versions(
        f"name='flights_delay' and tags.partition='{PARTITIONS[3].isoformat()}'")))
    instance.wipe_assets([key("registered_model")])  # SQLite's event log wipes whole assets only
    recovered = daily.execute_in_process(partition_key=PARTITIONS[3].isoformat(), instance=instance)
    assert recovered.asset_materializations_for_node("flights_delay__trained_checkpoint")
    [registered] = recovered.asset_materializations_for_node("flights_delay__registered_model")
    assert registered.metadata["model_version"].value == holder
    assert {v.version for v in client.search_model_versions("name='flights_delay'")} == versions

    store = LocalVersionStore(settings.version_store_root)
    lineage = trace(client, store, "flights_delay", version="3")
    assert lineage.versions == ["3", "2", "1"]
    assert not lineage.mismatches and not [c for c in lineage.checks if c.status == "unreachable"]
    assert any(c.what == "v3 started from v2's registered weights" and c.status == "ok" for c in lineage.checks)
    text = audit.render_markdown(audit.collect(client, store, "flights_delay", "3"))
    assert "## Training: fine_tune" in text and "| 2 | 2013-03-09 | fine_tune |" in text
    assert {d["role"] for d in lineage.chain["days"]} == {"train", "replay", "validation"}

    workdir = tmp_path / "reproduce"
    single = audit.reproduce(client, "flights_delay", "3", workdir, "unused")
    assert single.identical, single.reasons
    # The chain through the command line, as a user rebuilds it.
    chain = subprocess.run([sys.executable, "-m", "ml_assets.cli", "reproduce", "flights_delay", "--version", "3",
                            "--chain", "--workdir", str(tmp_path / "chain")],
                           capture_output=True, text=True, timeout=600, env=cli_env())
    assert chain.returncode == 0, chain.stderr[-3000:]
    assert [line.split(":")[0] for line in chain.stdout.splitlines()] == [
        f"flights_delay version {v}" for v in ("1", "2", "3")]
    assert "version 3: reproduced bit for bit" in chain.stdout and "started from the reproduced parent" in chain.stdout
    shown = subprocess.run([sys.executable, "-m", "ml_assets.cli", "lineage", "flights_delay", "--version", "3"],
                           capture_output=True, text=True, timeout=300, env=cli_env())
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "chain: version 3 <- 2 <- 1, back to the full training of partition 2013-03-08" in shown.stdout
    assert json.loads(v3.tags["warm_start_key"]).keys() == {"features", "target", "model"}
