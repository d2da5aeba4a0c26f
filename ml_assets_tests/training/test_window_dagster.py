"""Several validation and test days, and a window with a day its checks stopped, through the real
assets: the spec lets the partition skip it, and the checkpoint, the report, the registered
version's tags and the audit all name the skipped day and why."""

import datetime as dt
import json

import dagster as dg
import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from ml_assets import audit
from ml_assets.definitions import build_definitions
from ml_assets.settings import load_settings
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import flights_files, small_training, write_spec

pytestmark = pytest.mark.torchrun

DAY = dt.date(2013, 3, 8)
INGEST = ("raw_data", "validated_snapshot", "features")


def test_a_window_skips_a_day_its_checks_stopped_and_every_record_says_so(home, tmp_path, spec_dict, monkeypatch):
    days = [DAY - dt.timedelta(days=n) for n in range(5, -1, -1)]
    data = small_training(spec_dict, window_days=4, epochs=1)
    data["training"].update(validation_days=2, missing_days="skip", max_missing_days=1)
    data["evaluation"]["test_days"] = 2
    data["source"] = flights_files(tmp_path / "data", days)
    write_spec(tmp_path / "models", data)
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(tmp_path / "models"))
    bad = DAY - dt.timedelta(days=3)  # the first validation day
    path = tmp_path / "data" / "flights" / f"{bad}.parquet"
    rows = pl.read_parquet(path)
    pl.concat([rows, rows.head(10)]).write_parquet(path)  # duplicate keys: its snapshot fails

    defs = build_definitions(load_settings())
    instance = dg.DagsterInstance.get()
    daily = defs.resolve_job_def("flights_delay_daily")
    key = lambda stage: dg.AssetKey(["flights_delay", stage])  # noqa: E731
    for day in days[:-1]:
        result = daily.execute_in_process(partition_key=day.isoformat(), instance=instance, raise_on_error=False,
                                          asset_selection=[key(s) for s in INGEST])
        assert result.success == (day != bad)
    result = daily.execute_in_process(partition_key=DAY.isoformat(), instance=instance)
    assert result.success

    def meta(stage: str) -> dict:
        [event] = result.asset_materializations_for_node(f"flights_delay__{stage}")
        return {k: v.value for k, v in event.metadata.items()}

    skipped = {bad.isoformat(): "ingested, but its snapshot checks never passed"}
    ckpt, report = meta("trained_checkpoint"), meta("evaluation_report")
    assert ckpt["train_days"] == [d.isoformat() for d in days[:2]]
    assert ckpt["val_days"] == [days[3].isoformat()] and ckpt["skipped_days"] == skipped
    assert ckpt["data"]["mode"] == "memory" and "training.streaming.auto_above_mb (1024)" in ckpt["data"]["reason"]
    assert report["test_days"] == [d.isoformat() for d in days[-2:]]
    assert report["validation_days"] == [days[3].isoformat()] and report["skipped_days"] == skipped
    assert report["test_rows"] == sum(pl.read_parquet(tmp_path / "data" / "flights" / f"{d}.parquet")
                                      .filter(pl.col("dep_delay").is_not_null()).height for d in days[-2:])
    assert "tested on 2013-03-07..2013-03-08 (2 days)" in report["summary"]

    settings = load_settings()
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)
    version = client.get_model_version_by_alias("flights_delay", "challenger")
    assert json.loads(version.tags["skipped_days"]) == skipped
    assert json.loads(version.tags["test_days"]) == report["test_days"]
    text = audit.render_markdown(audit.collect(client, LocalVersionStore(settings.version_store_root),
                                               "flights_delay", str(version.version)))
    assert f"Days skipped (training.missing_days: skip): 1\n- {bad}: {skipped[bad.isoformat()]}" in text
