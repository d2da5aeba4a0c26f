import datetime as dt

import polars as pl
import pytest

from ml_assets.defs.snapshots.schema import MAX_SAMPLE, validate_frame
from ml_assets.sources import read_day
from ml_assets.spec import load_spec
from ml_assets_tests.conftest import BUNDLED_SPEC


@pytest.fixture(scope="module")
def spec():
    return load_spec(BUNDLED_SPEC)


@pytest.fixture(scope="module")
def day_rows(spec) -> pl.DataFrame:
    return read_day(spec, dt.date(2013, 6, 1)).tables["rows"]


def test_real_day_passes(spec, day_rows):
    report = validate_frame(spec.data_schema, day_rows)
    assert report.passed and report.failures == 0 and report.rows == day_rows.height


def test_bad_rows_are_counted_by_column_and_check(spec, day_rows):
    bad = day_rows.with_row_index("i").with_columns(
        pl.when(pl.col("i") < 3).then(pl.lit("ZZ")).otherwise(pl.col("carrier")).alias("carrier"),
        pl.when(pl.col("i") == 5).then(None).otherwise(pl.col("distance")).alias("distance"),
        pl.when(pl.col("i") == 7).then(99).otherwise(pl.col("hour")).alias("hour"),
    ).drop("i")
    report = validate_frame(spec.data_schema, bad)
    assert not report.passed
    assert report.by_check["carrier: isin(['9E', 'AA', 'AS', 'B6', 'DL', 'EV', 'F9', 'FL', 'HA', 'MQ', 'OO', 'UA', 'US', 'VX', 'WN', 'YV'])"] == 3
    assert report.by_check["distance: not_nullable"] == 1
    assert report.by_check["hour: less_than_or_equal_to(23.0)"] == 1
    assert report.failures == 5
    assert "carrier" in report.summary("model m, partition d")


def test_wrong_dtype_and_extra_column_fail(spec, day_rows):
    report = validate_frame(spec.data_schema, day_rows.with_columns(pl.col("distance").cast(pl.Float64), pl.lit(1).alias("extra")))
    assert not report.passed
    failures = " ".join(report.by_check)
    assert "distance: dtype('Int64')" in failures
    assert "column_in_schema" in failures


def test_failure_sample_is_bounded(spec, day_rows):
    report = validate_frame(spec.data_schema, day_rows.with_columns(pl.lit("ZZ").alias("carrier")))
    assert report.failures == day_rows.height
    assert report.sample.height == MAX_SAMPLE
