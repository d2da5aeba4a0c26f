"""Checks of a whole day: volume against weekly history, and rows dated outside the day."""

from __future__ import annotations

import datetime as dt
import statistics

import polars as pl

from ml_assets.calendar import holiday_near
from ml_assets.sources import local_day
from ml_assets.spec import FreshnessSpec, VolumeSpec
from ml_assets.validation.names import FRESHNESS, VOLUME
from ml_assets.validation.outcome import MAX_FAILING_ROWS, CheckOutcome


def same_weekdays(day: dt.date, weeks: int) -> list[dt.date]:
    """The same weekday in each of the past ``weeks`` weeks, nearest first (weekly seasonality)."""
    return [day - dt.timedelta(weeks=k) for k in range(1, weeks + 1)]


def volume_check(rows: int, history: dict[dt.date, int], spec: VolumeSpec, day: dt.date | None = None) -> CheckOutcome:
    if rows == 0:
        return CheckOutcome(VOLUME, False, "the partition is empty: 0 rows", {"empty": 1},
                            {"rows": 0}, {"rows": "> 0"})
    tolerance, holiday = spec.tolerance, None
    if spec.holidays is not None and day is not None:
        cal = spec.holidays
        near = lambda d: holiday_near(d, cal.country, cal.subdivision, cal.window_days)  # noqa: E731
        if (found := near(day)) is not None:
            tolerance, holiday = cal.tolerance, f"{found[1]} {found[0]}"
        ordinary = {d: n for d, n in history.items() if near(d) is None}
        if len(ordinary) >= spec.min_history:  # holidays make a poor expectation for other days
            history = ordinary
    past = sorted(history.items())
    if len(past) < spec.min_history:
        return CheckOutcome(VOLUME, True, f"{rows} rows; only {len(past)} past same-weekday day(s) on main, "
                            f"fewer than {spec.min_history}: volume not judged",
                            observed={"rows": rows, "history_days": len(past)},
                            expected={"history_days": f">= {spec.min_history}"})
    expected = statistics.median(n for _, n in past)
    change = rows / expected - 1
    passed = abs(change) <= tolerance
    detail = ", ".join(f"{d}: {n}" for d, n in past)
    summary = (f"{rows} rows vs {expected:.0f} expected (median of the same weekday: {detail}): "
               f"{change:+.1%}, {'within' if passed else 'beyond'} ±{tolerance:.0%}"
               + (f" (the tolerance near a holiday: {holiday})" if holiday else ""))
    expectation = {"rows": round(expected), "tolerance": tolerance, "history": {str(d): n for d, n in past}}
    if holiday:
        expectation["holiday"] = holiday
    return CheckOutcome(VOLUME, passed, summary, {} if passed else {"volume_change": 1},
                        {"rows": rows, "change": round(change, 4)}, expectation)


def freshness_check(frame: pl.DataFrame, column: str, timezone: str, day: dt.date, spec: FreshnessSpec,
                    fmt: str | None = None) -> CheckOutcome:
    if frame.height == 0 or column not in frame.columns:
        return CheckOutcome(FRESHNESS, True, "no rows or no timestamp column: nothing to date (see schema and volume)")
    try:
        dated = frame.with_columns(local_day(column, frame.schema[column], timezone, fmt).alias("__day"))
    except (pl.exceptions.PolarsError, ValueError) as exc:
        return CheckOutcome(FRESHNESS, False, f"{column}: timestamps cannot be read: {exc}", {"unreadable": frame.height},
                            {"rows": frame.height}, {"readable": frame.height})
    outside = dated.filter(pl.col("__day").is_null() | (pl.col("__day") != day))
    fraction = outside.height / frame.height
    passed = fraction <= spec.max_outside_fraction
    other_days = outside.group_by("__day").len().sort("len", descending=True).head(5)
    where = ", ".join(f"{d or 'undated'}: {n}" for d, n in other_days.iter_rows())
    summary = (f"{column}: {outside.height} of {frame.height} rows ({fraction:.1%}) dated outside {day}"
               + (f" ({where})" if outside.height else "")
               + f", {'within' if passed else 'beyond'} the tolerated {spec.max_outside_fraction:.1%}")
    return CheckOutcome(
        FRESHNESS, passed, summary, {"outside_day": outside.height} if outside.height else {},
        {"rows_outside_day": outside.height, "fraction": round(fraction, 4)},
        {"max_fraction": spec.max_outside_fraction},
        outside.head(MAX_FAILING_ROWS).with_columns(
            pl.lit(f"{column}: dated outside {day}").alias("failed")).drop("__day") if outside.height else None,
    )
