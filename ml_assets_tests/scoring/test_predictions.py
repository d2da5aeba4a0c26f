"""The predictions asset through Dagster: the champion of the moment scores a day's published rows
(labelled or not) through the transform it was trained with, the file names what scored it, a
re-run writes nothing new, and `ml-assets lineage --predictions` walks the file back."""

import datetime as dt
import io
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from ml_assets.definitions import build_definitions
from ml_assets.features.record import FeaturesRecord
from ml_assets.layout import Layout
from ml_assets.promotion import moves as promotion
from ml_assets.records.read import latest
from ml_assets.registry import versions as registry
from ml_assets.registry.record import VersionTags
from ml_assets.scoring.predictions import read_about
from ml_assets.scoring.record import PredictionsRecord
from ml_assets.serving.predict import predict
from ml_assets.settings import load_settings
from ml_assets.spec import load_spec
from ml_assets.validation.record import SnapshotRecord
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import cli_env, small_training, write_spec

pytestmark = pytest.mark.torchrun

NAME = "flights_delay"
DAY = dt.date(2013, 4, 10)
INGEST = ("raw_data", "validated_snapshot", "features")


def key(stage: str) -> dg.AssetKey:
    return dg.AssetKey([NAME, stage])


def test_the_champion_scores_the_day_and_the_file_walks_back(home, tmp_path, spec_dict, monkeypatch):
    spec_path = write_spec(tmp_path / "models", small_training(spec_dict, window_days=3, epochs=1))
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(tmp_path / "models"))
    settings = load_settings()
    defs = build_definitions(settings)
    instance = dg.DagsterInstance.get()
    daily, score = defs.resolve_job_def(f"{NAME}_daily"), defs.resolve_job_def(f"{NAME}_score")
    for back in (4, 3, 2, 1):
        assert daily.execute_in_process(partition_key=(DAY - dt.timedelta(days=back)).isoformat(), instance=instance,
                                        asset_selection=[key(s) for s in INGEST]).success
    assert daily.execute_in_process(partition_key=DAY.isoformat(), instance=instance).success

    # Nothing serves yet: the day is refused with the reason, not scored by a challenger.
    early = score.execute_in_process(partition_key=DAY.isoformat(), instance=instance, raise_on_error=False)
    assert not early.success
    [failure] = [e for e in early.all_events if e.is_step_failure]
    assert "has no @champion yet" in failure.step_failure_data.error.message

    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri)
    store = LocalVersionStore(settings.version_store_root, objects_url=settings.objects_url)
    spec = load_spec(spec_path)
    promotion.execute(client, store, spec, promotion.Request(NAME, "promote", "1", "for scoring", "pytest"))

    result = score.execute_in_process(partition_key=DAY.isoformat(), instance=instance)
    [event] = result.asset_materializations_for_node(f"{NAME}__predictions")
    record = PredictionsRecord.from_metadata(event.metadata)
    mv = client.get_model_version(NAME, "1")
    snapshot = latest(instance, key("validated_snapshot"), DAY.isoformat(), SnapshotRecord)
    assert (record.model_version, record.weights_sha256) == ("1", VersionTags.from_tags(mv.tags).checkpoint_sha256)
    assert record.data_commit == snapshot.commit and not record.reused

    # Every published row is scored, the ones without a label (cancelled flights) too.
    data = Path(record.uri).read_bytes()
    scored = pl.read_parquet(io.BytesIO(data))
    rows = pl.read_parquet(io.BytesIO(store.get_object(snapshot.repository, snapshot.commit,
                                                        Layout.of(spec).rows_path(DAY))))
    assert scored.height == record.rows == rows.height
    unlabeled = rows["dep_delay"].is_null()
    assert unlabeled.sum() > 0 and record.rows_labeled == rows.height - unlabeled.sum()
    assert scored.select(spec.data_schema.keys).equals(rows.select(spec.data_schema.keys))
    assert scored["score"].is_between(0, 1).all() and scored["decision"].dtype == pl.Boolean
    about = read_about(data)
    assert about["version"] == "1" and about["data_commit"] == snapshot.commit and about["day"] == DAY.isoformat()

    # The same transform as training: the labelled rows' scores are the champion's on the day's
    # feature rows, as the evaluation scores them.
    features = latest(instance, key("features"), DAY.isoformat(), FeaturesRecord)
    expected = predict(registry.load_version(client, mv), pl.read_parquet(features.uri))
    assert np.allclose(scored.filter(~unlabeled)["score"].to_numpy(), expected, rtol=0, atol=1e-6)

    # The same champion and the same data: nothing new is written.
    files = sorted(Path(record.uri).parent.iterdir())
    again = score.execute_in_process(partition_key=DAY.isoformat(), instance=instance)
    [second] = again.asset_materializations_for_node(f"{NAME}__predictions")
    repeat = PredictionsRecord.from_metadata(second.metadata)
    assert repeat.reused and (repeat.uri, repeat.sha256) == (record.uri, record.sha256)
    assert sorted(Path(record.uri).parent.iterdir()) == files

    walked = subprocess.run([sys.executable, "-m", "ml_assets.cli", "lineage", NAME, "--predictions", record.uri,
                             "--json"], capture_output=True, text=True, timeout=300, env=cli_env())
    assert walked.returncode == 0, walked.stderr[-3000:]
    chain = json.loads(walked.stdout)
    assert chain["version"] == "1" and chain["predictions"]["sha256"] == record.sha256
    assert chain["days"][0]["role"] == "scored" and chain["days"][0]["snapshot_commit"] == snapshot.commit
    assert [c["status"] for c in chain["checks"] if c["status"] != "ok"] == []
    assert {"predictions file named by its sha256", "weights that scored it are version 1's"} <= {
        c["what"] for c in chain["checks"]}

    not_ours = tmp_path / "other.parquet"
    pl.DataFrame({"x": [1]}).write_parquet(not_ours)
    refused = subprocess.run([sys.executable, "-m", "ml_assets.cli", "lineage", NAME, "--predictions", str(not_ours)],
                             capture_output=True, text=True, timeout=300, env=cli_env())
    assert refused.returncode == 2 and "not a predictions file" in refused.stderr
