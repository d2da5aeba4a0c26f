"""Data-arrival sensors: a day's files appearing (or changing) under a files source launch that
day's ingest once per set of files, for local files and for s3:// (moto's server, listed through
dagster-aws); a launched request ingests the day for real."""

import datetime as dt
import shutil

import dagster as dg
import pytest

from ml_assets.definitions import build_definitions
from ml_assets.pipeline.arrival import ARRIVAL_TAG, day_regex, watched
from ml_assets.pipeline.model import build_model_defs
from ml_assets.settings import load_settings
from ml_assets.spec import ModelSpec
from ml_assets_tests.helpers import flights_files, model_spec, spec_data, whole, write_spec

DAYS = [dt.date(2013, 3, 10), dt.date(2013, 3, 11)]


def tick(sensor, instance, cursor, defs):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    result = sensor.evaluate_tick(context)
    return result, context.cursor


def test_the_day_in_a_path_is_read_by_the_template():
    regex = day_regex("s3://bucket/flights/*/day={date}/part-?.parquet")
    assert regex.match("s3://bucket/flights/nyc/day=2013-03-10/part-0.parquet")["day"] == "2013-03-10"
    assert regex.match("s3://bucket/flights/nyc/extra/day=2013-03-10/part-0.parquet") is None
    assert regex.match("s3://bucket/flights/nyc/day=2013-03-10/part-0.parquet.tmp") is None


def test_new_local_files_launch_their_days_ingest_once_per_file_set(home, tmp_path, spec_dict, monkeypatch):
    data = spec_data(spec_dict, source=whole(flights_files(tmp_path / "src", DAYS)))
    spec = ModelSpec.model_validate(data)
    assert watched(spec)
    write_spec(tmp_path / "models", data)
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(tmp_path / "models"))
    defs = build_definitions(load_settings())
    sensor = defs.resolve_sensor_def(f"{spec.name}_data_arrival_sensor")
    with dg.DagsterInstance.get() as instance:  # the home's
        result, cursor = tick(sensor, instance, None, defs)
        assert [r.partition_key for r in result.run_requests] == [d.isoformat() for d in DAYS]
        keys = {r.partition_key: r.run_key for r in result.run_requests}
        assert all(r.tags[ARRIVAL_TAG] == r.run_key for r in result.run_requests)

        result, cursor = tick(sensor, instance, cursor, defs)  # the same files: nothing new
        assert result.run_requests == [] and "no new files" in result.skip_message

        later = dt.date(2013, 3, 12)  # a new day's file appears, and one day's file is replaced
        flights_files(tmp_path / "more", [later])
        shutil.copy(tmp_path / "more" / "flights" / f"{later}.parquet", tmp_path / "src" / "flights")
        shutil.copy(tmp_path / "src" / "flights" / f"{DAYS[1]}.parquet",
                    tmp_path / "src" / "flights" / f"{DAYS[0]}.parquet")  # other rows: other size
        result, cursor = tick(sensor, instance, cursor, defs)
        assert sorted(r.partition_key for r in result.run_requests) == [DAYS[0].isoformat(), later.isoformat()]
        replaced = next(r for r in result.run_requests if r.partition_key == DAYS[0].isoformat())
        assert replaced.run_key != keys[DAYS[0].isoformat()]

        # The request is the ingest job for that day: it ingests the new file's rows.
        ingest = defs.resolve_job_def(f"{spec.name}_ingest")
        run = ingest.execute_in_process(partition_key=later.isoformat(), instance=instance, tags=replaced.tags)
        assert run.success
        [raw] = run.asset_materializations_for_node(f"{spec.name}__raw_data")
        assert any(url.endswith(f"{later}.parquet") for url in raw.metadata["source_files"].value)


def test_s3_files_are_listed_through_dagster_aws(home, tmp_path, spec_dict, s3_endpoint, monkeypatch):
    import boto3

    flights_files(tmp_path, DAYS)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="arrivals")
    for day in DAYS[:1]:
        s3.upload_file(str(tmp_path / "flights" / f"{day}.parquet"), "arrivals", f"flights/{day}.parquet")
    s3.put_object(Bucket="arrivals", Key="flights/notes.txt", Body=b"not a day")
    data = spec_data(spec_dict, source=whole({
        "kind": "files", "rows": {"path": "s3://arrivals/flights/{date}.parquet"},
        "dimensions": {"weather": {"path": "s3://arrivals/weather.parquet", "timestamp_column": "time_hour"},
                       "planes": {"path": "s3://arrivals/planes.csv", "format": "csv"}},
        "storage_options": {"endpoint_url": s3_endpoint}}))
    spec = ModelSpec.model_validate(data)
    write_spec(tmp_path / "models", data)
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(tmp_path / "models"))
    defs = build_definitions(load_settings())
    sensor = defs.resolve_sensor_def(f"{spec.name}_data_arrival_sensor")
    with dg.instance_for_test() as instance:
        result, cursor = tick(sensor, instance, None, defs)
        assert [r.partition_key for r in result.run_requests] == [DAYS[0].isoformat()]
        s3.upload_file(str(tmp_path / "flights" / f"{DAYS[1]}.parquet"), "arrivals", f"flights/{DAYS[1]}.parquet")
        result, cursor = tick(sensor, instance, cursor, defs)
        assert [r.partition_key for r in result.run_requests] == [DAYS[1].isoformat()]
        assert tick(sensor, instance, cursor, defs)[0].run_requests == []


def test_a_source_without_the_day_in_its_path_has_no_arrival_sensor(tmp_path, spec_dict):
    source = flights_files(tmp_path, DAYS)
    source["rows"]["path"] = str(tmp_path / "flights" / "*.parquet")
    spec = model_spec(spec_dict, source=whole(source))
    assert not watched(spec)
    with pytest.raises(dg.DagsterInvalidDefinitionError):
        build_model_defs(spec).resolve_sensor_def(f"{spec.name}_data_arrival_sensor")
