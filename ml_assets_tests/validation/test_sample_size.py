"""Checks that know their sample size: one row is "not judged", never "drifted"; a sparse source pools
days into windows that do see a real shift; a high-volume day is judged by the limits as before."""

import datetime as dt

import numpy as np
import polars as pl
import pytest

from ml_assets.ingest.sources import read_day
from ml_assets.spec import ModelSpec, VolumeSpec, load_spec
from ml_assets.validation.checks import volume_check
from ml_assets.validation.drift import DAY, drift_check
from ml_assets.validation.replay import replay
from ml_assets.validation.stats import chi_square_p, pooled_counts, psi_of
from ml_assets_tests.helpers import BUNDLED_SPEC

FLIGHTS_DAY = dt.date(2013, 3, 15)
START, SHIFT = dt.date(2023, 1, 1), dt.date(2023, 9, 1)


@pytest.fixture(scope="module")
def flights() -> ModelSpec:
    return load_spec(BUNDLED_SPEC)


@pytest.fixture(scope="module")
def two_weeks(flights) -> pl.DataFrame:
    days = [FLIGHTS_DAY - dt.timedelta(days=n) for n in range(1, 15)]
    return pl.concat([read_day(flights, d).tables["rows"].with_columns(pl.lit(d).alias(DAY)) for d in days])


@pytest.fixture(scope="module")
def day_rows(flights) -> pl.DataFrame:
    return read_day(flights, FLIGHTS_DAY).tables["rows"]


def _with(spec: ModelSpec, **drift) -> ModelSpec:
    data = spec.model_dump(by_alias=True)
    data["validation"]["drift"].update(drift)
    return ModelSpec.model_validate(data)


# -- the statistics on their own ------------------------------------------------------------------


def test_one_row_against_fourteen_is_not_judged(flights, two_weeks, day_rows):
    one_a_day = two_weeks.group_by(DAY, maintain_order=True).head(1)
    assert one_a_day.height == 14
    outcome = drift_check(flights, day_rows.head(1), one_a_day)
    assert outcome.passed
    assert outcome.summary.startswith("not judged: 1 row < 30") and "nothing could be judged" in outcome.summary
    assert set(outcome.observed["not judged"]) == {"hour", "minute", "distance", "carrier", "origin", "dest",
                                                   "tailnum", "label rate", "label relationship"}
    assert outcome.counts == {}


def test_a_ks_of_one_between_one_row_and_fourteen_is_noise_and_forty_shifted_rows_are_not(
        flights, two_weeks, day_rows):
    # The case: one row above all of fourteen gives "KS 1.000"; one in 15 rows is the highest by chance.
    one_a_day = two_weeks.group_by(DAY, maintain_order=True).head(1)
    highest = day_rows.head(1).with_columns(pl.lit(one_a_day["distance"].max() + 1, pl.Int64).alias("distance"))
    lone = drift_check(_with(flights, min_rows=1), highest, one_a_day)
    assert lone.observed["distance ks"] == 1.0 and lone.observed["distance ks p-value"] > 0.1
    assert lone.passed, lone.summary
    shifted = day_rows.with_columns((pl.col("distance") + 3 * two_weeks["distance"].std()).round(0).cast(pl.Int64))
    enough = drift_check(flights, shifted.sample(40, seed=1), two_weeks)  # not head(): early flights differ
    assert not enough.passed and list(enough.counts) == ["distance: ks"]
    assert enough.summary.startswith("distance: KS") and "40 vs 13084 rows" in enough.summary


def test_on_a_high_volume_day_the_limit_decides_as_before(flights, two_weeks, day_rows):
    # Both shifts are wildly significant on ~1000 rows; only the one past the KS limit of 0.2 fails.
    below = drift_check(flights, day_rows.with_columns(pl.col("distance") + 150), two_weeks)
    assert below.passed and 0.15 < below.observed["distance ks"] < 0.2 and below.observed["distance ks p-value"] < 1e-20
    above = drift_check(flights, day_rows.with_columns(pl.col("distance") + 200), two_weeks)
    assert not above.passed and above.observed["distance ks"] > 0.2 and list(above.counts) == ["distance: ks"]


def test_categories_are_pooled_for_the_rows_at_hand(two_weeks, day_rows):
    for column in ("carrier", "dest", "tailnum"):  # ~1000 rows: the 1% share decides, as before
        ref, cur = two_weeks[column], day_rows[column]
        assert pooled_counts(ref, cur, 0.01, 5).equals(pooled_counts(ref, cur, 0.01, 0))
    # 60 rows: every category kept on its own expects at least 5 of them, and so does "(other)".
    counts = pooled_counts(two_weeks["carrier"], day_rows["carrier"].head(60), 0.01, 5)
    expected = counts["ref"] / counts["ref"].sum() * 60
    assert counts.height == 6 and (expected >= 5).all() and "(other)" in counts["category"].to_list()
    assert chi_square_p(counts) > 0.01
    # 10 rows: no carrier expects 5 of them; one pooled category, nothing a test could tell.
    assert pooled_counts(two_weeks["carrier"], day_rows["carrier"].head(10), 0.01, 5).height == 1


def test_chi_square_and_psi_flag_a_real_mix_change_only_with_enough_rows():
    rng = np.random.default_rng(3)
    reference = pl.Series("c", rng.choice(["a", "b", "c"], 2000, p=[0.6, 0.3, 0.1]))
    changed = pl.Series("c", rng.choice(["a", "b", "c"], 400, p=[0.2, 0.3, 0.5]))
    big = pooled_counts(reference, changed, 0.01, 5)
    assert psi_of(big) > 0.25 and chi_square_p(big) < 1e-10
    small = pooled_counts(reference, changed.head(4), 0.01, 5)
    assert small.height == 1 and chi_square_p(small) == 1.0  # four rows cannot show a mix


def test_volume_of_a_sparse_source_is_judged_as_a_count():
    ones = {dt.date(2023, 3, d): 1 for d in (1, 8, 15, 22)}
    assert volume_check(1, ones, VolumeSpec()).passed
    doubled = volume_check(2, ones, VolumeSpec())
    assert doubled.passed and "+100.0%, beyond ±20% but not unlikely for a count (Poisson p 0.53" in doubled.summary
    burst = volume_check(9, ones, VolumeSpec())
    assert not burst.passed and "beyond ±20% (Poisson p" in burst.summary
    empty = volume_check(0, ones, VolumeSpec())
    assert not empty.passed and empty.summary == "the partition is empty: 0 rows"
    assert volume_check(0, ones, VolumeSpec(min_rows=0)).passed  # an empty day of a sparse source is ordinary
    assert not volume_check(3, {}, VolumeSpec(min_rows=5)).passed  # fewer than the minimum, whatever the history


# -- a source of one row a day, judged over a year ------------------------------------------------


def _series_spec(**drift) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "daily_series",
        "source": {"kind": "files", "rows": {"path": "unused/{date}.parquet"}},  # the replay reads the rows below
        "schema": {"columns": {
            "ts": {"dtype": "string"}, "level": {"dtype": "float64"}, "visits": {"dtype": "int64", "min": 0},
            "kind": {"dtype": "string", "allowed": ["a", "b", "c"]}, "outcome": {"dtype": "int64", "min": 0, "max": 1}}},
        "partitioning": {"start": START.isoformat(), "timestamp_column": "ts", "timestamp_format": "%Y-%m-%dT%H:%M:%S%#z"},
        "target": {"name": "converted", "expression": "outcome = 1", "task": "binary_classification"},
        "features": {"numeric": ["level", "visits"], "categorical": ["kind"]},
        "validation": {"drift": drift},
        "evaluation": {"metrics": ["roc_auc"]},
        "promotion": {"primary_metric": "roc_auc"},
    })


@pytest.fixture(scope="module")
def one_row_a_day() -> dict[dt.date, pl.DataFrame]:
    """A year of one row a day from a fixed-seed process; from SHIFT on, ``level`` is 3 sd higher."""
    rng = np.random.default_rng(7)
    days = {}
    for k in range(365):
        day = START + dt.timedelta(days=k)
        level = rng.normal(50, 5) + (15 if day >= SHIFT else 0)
        converts = rng.random() < 1 / (1 + np.exp(1 - 0.1 * (level - 50)))
        days[day] = pl.DataFrame({"ts": [f"{day}T12:00:00+0000"], "level": [level], "visits": [int(rng.poisson(4))],
                                  "kind": [str(rng.choice(["a", "b", "c"], p=[0.5, 0.3, 0.2]))],
                                  "outcome": [int(converts)]})
    return days


def test_one_row_a_day_is_not_judged_day_by_day(one_row_a_day):
    # The defaults compare one day with the 14 before it: one row says nothing, so nothing fails.
    verdicts = list(replay(_series_spec(), START, START + dt.timedelta(days=59), read=lambda s, d: one_row_a_day[d]))
    assert [v.day for v in verdicts if not v.passed] == []


def test_pooled_windows_pass_ordinary_days_and_catch_a_level_shift(one_row_a_day):
    # Five weeks against the twenty weeks before them.
    spec = _series_spec(current_days=35, reference_days=140, min_reference_days=28)
    verdicts = list(replay(spec, START, dt.date(2023, 12, 31), read=lambda s, d: one_row_a_day[d]))
    failed = {v.day: v.failed for v in verdicts if not v.passed}
    assert [d for d in failed if d < SHIFT] == []
    first = min(failed)
    assert first - SHIFT <= dt.timedelta(days=21), failed
    assert all(set(f) == {"drift"} and f["drift"].startswith("level: KS") for f in failed.values()), failed
