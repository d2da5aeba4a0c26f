import datetime as dt

import polars as pl
import pytest

from ml_assets.sources import read_day
from ml_assets.spec import load_spec
from ml_assets.validation.drift import DAY, drift_check, psi
from ml_assets_tests.conftest import BUNDLED_SPEC

DAY_UNDER_TEST = dt.date(2013, 3, 15)


@pytest.fixture(scope="module")
def spec():
    return load_spec(BUNDLED_SPEC)


@pytest.fixture(scope="module")
def reference(spec) -> pl.DataFrame:
    days = [DAY_UNDER_TEST - dt.timedelta(days=n) for n in range(1, 15)]
    return pl.concat([read_day(spec, d).tables["rows"].with_columns(pl.lit(d).alias(DAY)) for d in days])


@pytest.fixture(scope="module")
def rows(spec) -> pl.DataFrame:
    return read_day(spec, DAY_UNDER_TEST).tables["rows"]


def test_psi_is_zero_for_equal_and_large_for_disjoint():
    a = pl.Series("c", ["x", "y"] * 50)
    assert psi(a, a) == pytest.approx(0)
    assert psi(a, pl.Series("c", ["z"] * 100)) > 5


def test_real_day_against_its_two_weeks_passes(spec, rows, reference):
    outcome = drift_check(spec, rows, reference)
    assert outcome.passed, outcome.summary
    assert {"carrier psi", "distance ks", "distance wasserstein", "label rate"} <= set(outcome.observed)


def test_mean_shift_of_three_sd_fails_on_that_column(spec, rows, reference):
    sd = reference["distance"].std()
    shifted = rows.with_columns((pl.col("distance") + 3 * sd).round(0).cast(pl.Int64))
    outcome = drift_check(spec, shifted, reference)
    assert not outcome.passed
    assert "distance: KS" in outcome.summary and "distance: Wasserstein" in outcome.summary
    assert all(k.startswith("distance") for k in outcome.counts)


def test_category_mix_shift_fails_psi(spec, rows, reference):
    outcome = drift_check(spec, rows.with_columns(pl.lit("EWR").alias("origin")), reference)
    assert not outcome.passed and "origin: PSI" in outcome.summary


def test_flipped_labels_fail_label_rate(spec, rows, reference):
    flipped = rows.with_columns(pl.when(pl.col("dep_delay") >= 15).then(0).otherwise(30).alias("dep_delay"))
    outcome = drift_check(spec, flipped, reference)
    assert not outcome.passed and outcome.summary.startswith("label rate")
    assert list(outcome.counts) == ["label: rate"]


def test_too_little_reference_is_not_judged(spec, rows, reference):
    few = reference.filter(pl.col(DAY) >= DAY_UNDER_TEST - dt.timedelta(days=3))
    outcome = drift_check(spec, rows, few)
    assert outcome.passed and "drift not judged" in outcome.summary


def test_per_column_limits_override_defaults(spec, rows, reference):
    data = spec.model_dump(by_alias=True)
    data["validation"]["drift"]["columns"] = {"distance": {"ks": 0.0001}}
    strict = type(spec).model_validate(data)
    outcome = drift_check(strict, rows, reference)
    assert "distance: KS" in outcome.summary
