"""Train/serve parity: the model inputs training gets through the Dagster assets (raw_data ->
validated_snapshot -> features file -> transform, as the trainer reads it) are identical to what
batch inference outside Dagster computes from the raw rows with ``ml_assets.features.serve``.
"""

import datetime as dt
import json

import dagster as dg
import numpy as np
import polars as pl
import pytest

from ml_assets.features.assets import build_features_asset
from ml_assets.features.serve import featurize
from ml_assets.features.state import fit_state, state_bytes
from ml_assets.ingest.assets import build_raw_data
from ml_assets.ingest.sources import read_day
from ml_assets.resources import (
    ArtifactStoreResource,
    DagsterLinksResource,
    LocalVersionStoreResource,
)
from ml_assets.spec import ModelSpec
from ml_assets.storage import read_verified
from ml_assets.trainer.data import to_tensors
from ml_assets.validation.assets import build_validated_snapshot

DAY = dt.date(2013, 7, 9)


@pytest.mark.torchrun
def test_training_and_batch_inference_compute_identical_inputs(tmp_path, bundled_spec_dict):
    spec = ModelSpec.model_validate(bundled_spec_dict)
    days = [DAY - dt.timedelta(days=n) for n in range(8, -1, -1)]
    assets = [build_raw_data(spec), build_validated_snapshot(spec), build_features_asset(spec)]
    resources = {"version_store": LocalVersionStoreResource(root=str(tmp_path / "versions")),
                 "links": DagsterLinksResource(),
                 "artifacts": ArtifactStoreResource(root=str(tmp_path / "artifacts"))}
    (tmp_path / "dagster").mkdir()
    instance = dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "dagster"))
    for day in days:
        assert dg.materialize(assets, partition_key=day.isoformat(), instance=instance, resources=resources).success
    record = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["flights_delay", "features"]), asset_partitions=[DAY.isoformat()]),
        limit=1).records[0]
    meta = {k: v.value for k, v in record.asset_materialization.metadata.items()}
    assert meta["rolling_days_read"] == [d.isoformat() for d in days[-8:-1]]  # the 7 days before, from main

    # The training path: the features file, pinned by sha256, through the trainer's own loader.
    trained_on = pl.read_parquet(read_verified(str(meta["uri"]), meta["sha256"]))
    state = json.loads(state_bytes(fit_state(trained_on, spec.features, spec.target.name, spec.target.task)))
    numeric, categorical, _ = to_tensors(trained_on, state)

    # The serving path: raw rows without anything known only after departure, history from the source.
    raw = read_day(spec, DAY).tables
    to_predict = raw["rows"].filter(pl.col("dep_delay").is_not_null()).drop(
        "dep_delay", "dep_time", "arr_time", "arr_delay", "air_time")
    history = pl.concat([read_day(spec, d).tables["rows"] for d in days[:-1]])
    served = featurize(spec, {**raw, "rows": to_predict}, history, state)

    assert np.array_equal(served.numeric, numeric.numpy())
    assert np.array_equal(served.categorical, categorical.numpy())
    assert served.target is None
