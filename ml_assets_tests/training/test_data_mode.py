"""training.data: the window's feature bytes choose memory or streaming (auto), the choice reaches
the trainer's config and the checkpoint record, and a streamed window's feature state is fitted
out of core (polars' streaming engine over verified files) to the state the in-memory fit gives."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
from pathlib import Path

import fsspec
import polars as pl
import pytest
from pydantic import ValidationError

from ml_assets.features.build import build_features
from ml_assets.features.record import FeaturesRecord
from ml_assets.features.window import scan_verified
from ml_assets.ingest.sources import _bundled_table, local_day
from ml_assets.resources import ArtifactStoreResource
from ml_assets.spec import ModelSpec
from ml_assets.storage import IntegrityError
from ml_assets.trainer.config import DataRef
from ml_assets.trainer.result import TrainingResult
from ml_assets.training.prepare import prepare
from ml_assets.training.record import CheckpointRecord
from ml_assets.training.trainer_config import choose_data_mode, train_config
from ml_assets_tests.helpers import model_spec

DAYS = [f"2013-01-0{d}" for d in range(2, 7)]


@pytest.fixture(scope="module")
def records(tmp_path_factory, bundled_spec_dict) -> dict[str, FeaturesRecord]:
    """Five days of the bundled model's real features, one file per day, as the features asset records them."""
    spec = ModelSpec.model_validate(bundled_spec_dict)
    root = tmp_path_factory.mktemp("features")
    flights, _ = _bundled_table("flights")
    rows = flights.filter(pl.date(pl.col("year"), pl.col("month"), pl.col("day")) <= dt.date(2013, 1, 6))
    tables = {"rows": rows, **{n: _bundled_table(t.table)[0] for n, t in spec.source.dimensions.items()}}
    built = build_features(spec, tables).frame
    day_of = local_day("__timestamp", built.schema["__timestamp"], spec.partitioning.timezone)
    out = {}
    for day in DAYS:
        path = root / f"{day}.parquet"
        built.filter(day_of == dt.date.fromisoformat(day)).write_parquet(path, compression="zstd", statistics=True)
        data = path.read_bytes()
        out[day] = FeaturesRecord(data_commit="c", repository="r", uri=str(path), sha256=hashlib.sha256(data).hexdigest(),
                                  bytes=len(data), rows=0, rows_without_target=0, columns=built.columns)
    return out


def test_auto_streams_above_the_size_and_the_spec_can_say_either(spec_dict):
    spec = model_spec(spec_dict, training=dict(streaming={"auto_above_mb": 5}))
    assert spec.training.data == "auto"  # the default
    small, large = choose_data_mode(spec.training, 5_000_000), choose_data_mode(spec.training, 5_000_001)
    assert (small.mode, large.mode) == ("memory", "streaming")
    assert large.reason == ("training.data is auto and the window's feature files hold 5.0 MB, more than "
                            "training.streaming.auto_above_mb (5)")
    assert "at most training.streaming.auto_above_mb (5)" in small.reason
    for asked in ("memory", "streaming"):
        spec = model_spec(spec_dict, training=dict(data=asked, streaming={"auto_above_mb": 5}))
        assert {choose_data_mode(spec.training, n).mode for n in (1, 10**12)} == {asked}
    with pytest.raises(ValidationError, match="training.data\n  Input should be 'memory', 'streaming' or 'auto'"):
        model_spec(spec_dict, training=dict(data="disk"))


def test_the_mode_reaches_the_config_and_the_streaming_settings_with_it(spec_dict):
    spec = model_spec(spec_dict, training=dict(data="streaming", streaming={"shuffle_buffer_rows": 4096}))
    ref = DataRef(uri="/f.parquet", sha256="a" * 64)
    streamed = train_config(spec, [ref], [ref], ref, "/out", data_mode="streaming")
    memory = train_config(spec, [ref], [ref], ref, "/out")
    assert (streamed.data_mode, streamed.shuffle_buffer_rows, memory.data_mode) == ("streaming", 4096, "memory")
    assert streamed.fingerprint() != memory.fingerprint()


def test_a_streamed_window_is_fitted_out_of_core_to_the_in_memory_state(spec_dict, records, tmp_path):
    artifacts = ArtifactStoreResource(root=str(tmp_path / "artifacts"))
    total = sum(r.bytes for r in records.values())
    fitted = {}
    for threshold in (total / 1e6, (total - 1) / 1e6):  # the window's bytes: at the threshold, then just over it
        spec = model_spec(spec_dict, training=dict(validation_days=1, min_validation_rows=10, streaming={"auto_above_mb": threshold}))
        prepared = prepare(spec, records, DAYS[:-1], DAYS[-1:], artifacts, "state")
        assert prepared.data.window_bytes == total
        fitted[prepared.data.mode] = json.loads(Path(prepared.state.uri).read_bytes())
    memory, streamed = fitted["memory"], fitted["streaming"]
    assert streamed["rows_fitted"] == memory["rows_fitted"] > 2000
    assert streamed["categorical"] == memory["categorical"]  # vocabularies, hash buckets, bucket edges
    for a, b in zip(streamed["numeric"], memory["numeric"], strict=True):
        assert a["name"] == b["name"] and a["mean"] == pytest.approx(b["mean"], rel=1e-12)
        assert a["std"] == pytest.approx(b["std"], rel=1e-12)


def test_a_changed_feature_file_stops_the_out_of_core_fit_by_name(spec_dict, records, tmp_path):
    day = DAYS[1]
    changed = tmp_path / "changed.parquet"
    changed.write_bytes(Path(records[day].uri).read_bytes() + b"\0")
    bad = {**records, day: FeaturesRecord(**{**records[day].__dict__, "uri": str(changed)})}
    spec = model_spec(spec_dict, training=dict(data="streaming", validation_days=1, min_validation_rows=10))
    with pytest.raises(IntegrityError, match=re.escape(f"{changed}: sha256 is")):
        prepare(spec, bad, DAYS[:-1], DAYS[-1:], ArtifactStoreResource(root=str(tmp_path / "a")), "state")


def test_a_remote_file_is_scanned_from_its_verified_copy(records, tmp_path):
    record = records[DAYS[0]]
    with fsspec.open("memory://features/day.parquet", "wb") as fh:
        fh.write(Path(record.uri).read_bytes())
    scanned = scan_verified([DataRef(uri="memory://features/day.parquet", sha256=record.sha256)], tmp_path)
    assert scanned.collect().equals(pl.read_parquet(record.uri))
    assert [p.name for p in tmp_path.iterdir()] == [f"{record.sha256}.parquet"]


def test_a_checkpoint_record_says_whether_its_window_was_streamed():
    numbers = {f.name: 0 for f in dataclasses.fields(TrainingResult) if f.type in ("int", "float")}
    texts = {f.name: "" for f in dataclasses.fields(TrainingResult) if f.type == "str"}
    result = TrainingResult(**numbers, **texts)
    window = dict(result=result, repository="", train_days=[], val_days=[], skipped_days={}, data_commits={},
                  feature_files=(), feature_state_uri="", features=[], training_config={}, hyperparameters={},
                  progress=[])
    assert CheckpointRecord(**window, data={"mode": "streaming"}).streamed
    assert not CheckpointRecord(**window, data={"mode": "memory"}).streamed
    assert not CheckpointRecord(**window).streamed  # a record from before streaming
