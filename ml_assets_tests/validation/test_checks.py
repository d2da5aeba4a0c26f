import datetime as dt

import polars as pl

from ml_assets.spec import FreshnessSpec, HolidaySpec, VolumeSpec
from ml_assets.validation.checks import freshness_check, same_weekdays, volume_check

DAY = dt.date(2013, 3, 15)  # a Friday


def test_history_is_the_same_weekday():
    assert same_weekdays(DAY, 3) == [dt.date(2013, 3, 8), dt.date(2013, 3, 1), dt.date(2013, 2, 22)]
    assert {d.weekday() for d in same_weekdays(DAY, 4)} == {DAY.weekday()}


def test_volume_within_and_beyond_tolerance():
    history = {dt.date(2013, 3, 8): 1000, dt.date(2013, 3, 1): 980, dt.date(2013, 2, 22): 1010}
    ok = volume_check(1100, history, VolumeSpec(tolerance=0.2))
    assert ok.passed and "+10.0%, within ±20%" in ok.summary
    drop = volume_check(500, history, VolumeSpec(tolerance=0.2))
    assert not drop.passed
    assert "500 rows vs 1000 expected" in drop.summary and "-50.0%, beyond ±20%" in drop.summary
    assert drop.expected["rows"] == 1000 and drop.observed["change"] == -0.5


def test_volume_without_history_is_not_judged_but_empty_always_fails():
    sparse = volume_check(10, {dt.date(2013, 3, 8): 1000}, VolumeSpec(min_history=2))
    assert sparse.passed and "volume not judged" in sparse.summary
    empty = volume_check(0, {}, VolumeSpec())
    assert not empty.passed and "empty" in empty.summary


def test_days_near_a_holiday_get_the_holiday_tolerance():
    thanksgiving = dt.date(2013, 11, 28)  # real counts of the bundled data: 634 flights vs ~990 on Thursdays
    history = {dt.date(2013, 11, 21): 1000, dt.date(2013, 11, 14): 988, dt.date(2013, 11, 7): 991, dt.date(2013, 10, 31): 922}
    plain = volume_check(634, history, VolumeSpec(), thanksgiving)
    assert not plain.passed and "beyond ±20%" in plain.summary
    spec = VolumeSpec(holidays=HolidaySpec(country="US", window_days=1, tolerance=0.5))
    near = volume_check(634, history, spec, thanksgiving)
    assert near.passed and "Thanksgiving Day 2013-11-28" in near.summary and "within ±50%" in near.summary
    assert volume_check(634, history, spec, dt.date(2013, 11, 29)).passed  # the day after: within the window
    assert not volume_check(400, history, spec, thanksgiving).passed  # a collapse still fails
    assert not volume_check(634, history, spec, dt.date(2013, 11, 14)).passed  # an ordinary Thursday


def test_holidays_leave_the_expectation_of_ordinary_days():
    spec = VolumeSpec(holidays=HolidaySpec(country="US", window_days=1))
    # The Friday after Thanksgiving in the history would drag the median of an ordinary Friday down.
    history = {dt.date(2013, 11, 29): 661, dt.date(2013, 11, 22): 999, dt.date(2013, 11, 15): 985, dt.date(2013, 11, 8): 986}
    outcome = volume_check(990, history, spec, dt.date(2013, 12, 6))
    assert outcome.expected["rows"] == 986 and "2013-11-29" not in outcome.expected["history"]
    # Without enough ordinary days left, the holidays stay in.
    few = volume_check(990, {dt.date(2013, 11, 29): 661, dt.date(2013, 11, 22): 999}, spec, dt.date(2013, 12, 6))
    assert "2013-11-29" in few.expected["history"]


def test_freshness_counts_rows_from_other_days():
    stamps = ["2013-03-15T14:00:00Z"] * 98 + ["2013-03-17T14:00:00Z", "2013-03-14T10:00:00Z"]
    frame = pl.DataFrame({"ts": stamps})
    lenient = freshness_check(frame, "ts", "America/New_York", DAY, FreshnessSpec(max_outside_fraction=0.05))
    assert lenient.passed
    strict = freshness_check(frame, "ts", "America/New_York", DAY, FreshnessSpec(max_outside_fraction=0.01))
    assert not strict.passed
    assert "2 of 100 rows (2.0%) dated outside 2013-03-15" in strict.summary
    assert strict.failing_rows.height == 2


def test_freshness_uses_the_partition_time_zone():
    # 02:00Z on the 16th is 22:00 on the 15th in New York.
    frame = pl.DataFrame({"ts": ["2013-03-16T02:00:00Z"]})
    assert freshness_check(frame, "ts", "America/New_York", DAY, FreshnessSpec(max_outside_fraction=0)).passed
    assert not freshness_check(frame, "ts", "UTC", DAY, FreshnessSpec(max_outside_fraction=0)).passed
