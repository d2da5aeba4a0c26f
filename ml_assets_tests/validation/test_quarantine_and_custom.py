import datetime as dt

import polars as pl
import pytest

from ml_assets.ingest.sources import read_day
from ml_assets.spec import ModelSpec
from ml_assets.validation.custom import CustomCheckError, load_check, run_custom
from ml_assets.validation.run import quarantinable, run_checks

DAY = dt.date(2013, 6, 3)
MODULE = "ml_assets_tests.validation.example_checks"


@pytest.fixture
def spec(spec_dict) -> ModelSpec:
    spec_dict["validation"]["quarantine"] = {"max_fraction": 0.01}
    spec_dict["validation"]["custom_checks"] = [f"{MODULE}:no_long_taxi", f"{MODULE}:at_least_one_airport"]
    return ModelSpec.model_validate(spec_dict)


@pytest.fixture(scope="module")
def rows(bundled_spec_dict) -> pl.DataFrame:
    return read_day(ModelSpec.model_validate(bundled_spec_dict), DAY).tables["rows"]


def _with_bad_rows(rows: pl.DataFrame, n: int) -> pl.DataFrame:
    i = pl.int_range(pl.len())
    return rows.with_columns(pl.when(i < n).then(pl.lit("ZZ")).otherwise(pl.col("carrier")).alias("carrier"),
                             pl.when(i == n).then(2000).otherwise(pl.col("air_time")).alias("air_time"))


def test_custom_checks_report_per_row_or_per_day(spec, rows):
    outcomes = {o.name: o for o in run_checks(spec, _with_bad_rows(rows, 3), DAY, {})}
    assert not outcomes["custom_no_long_taxi"].passed
    assert outcomes["custom_no_long_taxi"].row_indices == {3}
    assert "1 of" in outcomes["custom_no_long_taxi"].summary
    assert outcomes["custom_at_least_one_airport"].passed


def test_few_row_level_failures_are_quarantinable(spec, rows):
    bad = _with_bad_rows(rows, 3)
    assert quarantinable(spec, run_checks(spec, bad, DAY, {}), bad.height) == {0, 1, 2, 3}


def test_too_many_or_day_level_failures_are_not(spec, rows):
    many = _with_bad_rows(rows, 200)
    assert quarantinable(spec, run_checks(spec, many, DAY, {}), many.height) is None
    no_column = rows.drop("minute")
    assert quarantinable(spec, run_checks(spec, no_column, DAY, {}), rows.height) is None
    nulls = rows.with_columns(pl.lit(None, pl.Int64).alias("dep_time"))
    assert quarantinable(spec, run_checks(spec, nulls, DAY, {}), rows.height) is None
    off = ModelSpec.model_validate({**spec.model_dump(by_alias=True), "validation": {}})
    assert quarantinable(off, run_checks(off, _with_bad_rows(rows, 3), DAY, {}), rows.height) is None


def test_custom_check_errors_are_clear(rows):
    with pytest.raises(CustomCheckError, match="cannot be loaded"):
        load_check(f"{MODULE}:does_not_exist")
    with pytest.raises(CustomCheckError, match="must return a bool or a Boolean Series"):
        run_custom(f"{MODULE}:wrong_shape", rows)


def test_custom_check_names_are_validated(spec_dict):
    spec_dict["validation"]["custom_checks"] = ["not a target"]
    with pytest.raises(ValueError, match="are not 'package.module:function'"):
        ModelSpec.model_validate(spec_dict)
