import datetime as dt

import polars as pl
import pytest

from ml_assets.ingest.sources import read_day
from ml_assets.spec import load_spec
from ml_assets.validation.drift import DAY, drift_check
from ml_assets.validation.stats import pooled_counts, psi_of
from ml_assets_tests.helpers import BUNDLED_SPEC

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
    assert psi_of(pooled_counts(a, a)) == pytest.approx(0)
    assert psi_of(pooled_counts(a, pl.Series("c", ["z"] * 100))) > 5


def test_real_day_against_its_two_weeks_passes(spec, rows, reference):
    outcome = drift_check(spec, rows, reference)
    assert outcome.passed, outcome.summary
    assert {"carrier psi", "distance ks", "distance wasserstein", "label rate", "label relationship auc"} <= set(
        outcome.observed)


def test_mean_shift_of_three_sd_fails_on_that_column(spec, rows, reference):
    sd = reference["distance"].std()
    shifted = rows.with_columns((pl.col("distance") + 3 * sd).round(0).cast(pl.Int64))
    outcome = drift_check(spec, shifted, reference)
    assert not outcome.passed
    assert "distance: KS" in outcome.summary and list(outcome.counts) == ["distance: ks"]
    # Wasserstein is an effect size beside KS; it blocks only where the spec sets a limit.
    assert outcome.observed["distance wasserstein"] > 2 and "Wasserstein" not in outcome.summary
    data = spec.model_dump(by_alias=True)
    data["validation"]["drift"]["columns"] = {"distance": {"wasserstein": 0.5}}
    limited = drift_check(type(spec).model_validate(data), shifted, reference)
    assert "distance: Wasserstein" in limited.summary
    assert set(limited.counts) == {"distance: ks", "distance: wasserstein"}


def test_category_mix_shift_fails_psi(spec, rows, reference):
    outcome = drift_check(spec, rows.with_columns(pl.lit("EWR").alias("origin")), reference)
    assert not outcome.passed and "origin: PSI" in outcome.summary


def test_flipped_labels_fail_the_label_relationship(spec, rows, reference):
    flipped = rows.with_columns(pl.when(pl.col("dep_delay") >= 15).then(0).otherwise(30).alias("dep_delay"))
    outcome = drift_check(spec, flipped, reference)
    assert not outcome.passed and outcome.summary.startswith("label relationship")
    assert list(outcome.counts) == ["label: relationship"]
    assert outcome.observed["label relationship auc"] < 0.4
    # the same day unflipped ranks its labels well above chance
    assert drift_check(spec, rows, reference).observed["label relationship auc"] > 0.6


def test_a_constant_label_fails_the_label_rate(spec, rows, reference):
    # Every flight delayed: one class only, so the ranking cannot be judged; the rate check catches it.
    constant = rows.with_columns(pl.when(pl.col("dep_delay").is_not_null()).then(45).alias("dep_delay"))
    outcome = drift_check(spec, constant, reference)
    assert not outcome.passed and outcome.summary.startswith("label rate 1.000")
    assert list(outcome.counts) == ["label: rate"]
    assert "not judged" in outcome.observed["label relationship"]


def test_a_stormy_day_keeps_its_label_relationship(spec, reference):
    # 2013-03-08: a nor'easter, 69% of departures delayed (the year's worst day), judged against the
    # two weeks before it. The rate is extreme but the ranking holds: the drift check passes.
    storm = dt.date(2013, 3, 8)
    past = pl.concat([read_day(spec, storm - dt.timedelta(days=n)).tables["rows"]
                      .with_columns(pl.lit(storm - dt.timedelta(days=n)).alias(DAY)) for n in range(1, 15)])
    outcome = drift_check(spec, read_day(spec, storm).tables["rows"], past)
    assert outcome.observed["label rate"] > 0.6
    assert outcome.passed, outcome.summary


def test_too_little_reference_is_not_judged(spec, rows, reference):
    few = reference.filter(pl.col(DAY) >= DAY_UNDER_TEST - dt.timedelta(days=3))
    outcome = drift_check(spec, rows, few)
    assert outcome.passed and "drift not judged" in outcome.summary


def test_per_column_limits_override_defaults(spec, rows, reference):
    nudged = rows.with_columns((pl.col("distance") * 1.1).round(0).cast(pl.Int64))  # a small, real shift
    assert drift_check(spec, nudged, reference).passed  # KS under the default 0.2
    data = spec.model_dump(by_alias=True)
    data["validation"]["drift"]["columns"] = {"distance": {"ks": 0.005}}
    strict = type(spec).model_validate(data)
    assert "distance: KS" in drift_check(strict, nudged, reference).summary
    # Over a limit set under the sampling noise is not enough: the KS test must reject too.
    unmoved = drift_check(strict, rows, reference)
    assert unmoved.passed and unmoved.observed["distance ks"] > 0.005 and unmoved.observed["distance ks p-value"] > 0.5
