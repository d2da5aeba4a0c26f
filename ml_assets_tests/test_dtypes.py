"""The column types users' files really have: dates, datetimes with and without a time zone, and a
column of the wrong type reported once, clearly, by the schema check alone."""

import datetime as dt

import polars as pl
import pytest

from ml_assets.features.build import build_features
from ml_assets.ingest.sources import read_day
from ml_assets.spec import DataSchema, ModelSpec
from ml_assets.validation.schema_checks import NULLS, RANGES, SCHEMA, schema_checks

ZONE = "America/New_York"


def _spec(tmp_path, column: dict, values: pl.Series) -> ModelSpec:
    """A one-row-a-day source of files, dated by the column ``when`` of the given schema."""
    days = [dt.date(2024, 3, 1) + dt.timedelta(days=i) for i in range(3)]
    for i, day in enumerate(days):
        pl.DataFrame({"when": values[i:i + 1], "x": [float(i)], "y": [i % 2]}).write_parquet(tmp_path / f"{day}.parquet")
    return ModelSpec.model_validate({
        "name": "daily", "source": {"kind": "files", "rows": {"path": str(tmp_path / "*.parquet")}},
        "schema": {"columns": {"when": column, "x": {"dtype": "float64"}, "y": {"dtype": "int64"}}},
        "partitioning": {"start": "2024-03-01", "timezone": ZONE, "timestamp_column": "when"},
        "target": {"name": "label", "expression": "y = 1", "task": "binary_classification"},
        "features": {"numeric": ["x"], "categorical": ["local_day_of_week"], "time": {"parts": ["day_of_week"]}},
        "evaluation": {"metrics": ["roc_auc"]}, "promotion": {"primary_metric": "roc_auc"},
    })


@pytest.mark.parametrize(("column", "values"), [
    ({"dtype": "date"}, pl.Series([dt.date(2024, 3, 1), dt.date(2024, 3, 2), dt.date(2024, 3, 3)])),
    # 23:30 in New York is the next day in UTC: the local day decides the partition.
    ({"dtype": "datetime", "timezone": ZONE},
     pl.Series([dt.datetime(2024, 3, d, 23, 30) for d in (1, 2, 3)]).dt.replace_time_zone(ZONE)),
    ({"dtype": "datetime"}, pl.Series([dt.datetime(2024, 3, d, 12) for d in (1, 2, 3)]).dt.cast_time_unit("ns")),
])
def test_date_and_datetime_columns_partition_without_a_format(tmp_path, column, values):
    spec = _spec(tmp_path, column, values)
    rows = read_day(spec, dt.date(2024, 3, 2)).tables["rows"]
    assert rows["x"].to_list() == [1.0]
    assert not [o for o in schema_checks(spec.data_schema, rows).values() if not o.passed]
    built = build_features(spec, {"rows": rows}).frame
    assert built["local_day_of_week"].to_list() == ["6"]  # 2024-03-02 was a Saturday


def test_a_datetime_in_another_zone_or_a_string_fails_the_schema_check_only(tmp_path):
    schema = DataSchema(columns={"when": {"dtype": "datetime", "timezone": "UTC"}, "n": {"dtype": "int64", "min": 0}})
    frame = pl.DataFrame({"when": [dt.datetime(2024, 3, 1)], "n": ["12"]})
    outcomes = schema_checks(schema, frame)
    assert {name for name, o in outcomes.items() if not o.passed} == {SCHEMA}
    summary = outcomes[SCHEMA].summary
    assert "column 'n' is not Int64 (it is String): its range and category checks were not run" in summary
    assert "column 'when' is not Datetime(time_unit='us', time_zone='UTC') (it is Datetime" in summary
    assert "ComputeError" not in summary and outcomes[RANGES].passed and outcomes[NULLS].passed


def test_timezone_is_for_datetimes_and_must_exist():
    with pytest.raises(ValueError, match="timezone applies to datetime columns, not date"):
        DataSchema(columns={"d": {"dtype": "date", "timezone": "UTC"}})
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        DataSchema(columns={"d": {"dtype": "datetime", "timezone": "Mars/Olympus"}})
