"""Checks of a whole day: volume against weekly history, and rows dated outside the day.

Volume judges a change two ways: relative to the expected rows (beyond ``tolerance``) and as a count
(a Poisson count with the expected mean would rarely land that far off, at ``significance``). The flights'
~900 rows a day make any change beyond 20% wildly unlikely as a count, so there the tolerance decides; a
source of one row a day makes +100% (2 rows where 1 is expected) ordinary, so there the count decides.
"""

from __future__ import annotations

import datetime as dt
import statistics

import polars as pl

from ml_assets.calendar import holiday_near
from ml_assets.ingest.sources import local_day
from ml_assets.spec import FreshnessSpec, VolumeSpec
from ml_assets.validation.names import FRESHNESS, VOLUME
from ml_assets.validation.outcome import MAX_FAILING_ROWS, CheckOutcome
from ml_assets.validation.stats import poisson_p

EMPTY_MEAN = 0.5  # the Poisson mean a count is judged against when the same weekdays' median is 0 rows


def same_weekdays(day: dt.date, weeks: int) -> list[dt.date]:
    """The same weekday in each of the past ``weeks`` weeks, nearest first (weekly seasonality)."""
    return [day - dt.timedelta(weeks=k) for k in range(1, weeks + 1)]


def volume_check(rows: int, history: dict[dt.date, int], spec: VolumeSpec, day: dt.date | None = None) -> CheckOutcome:
    if rows < spec.min_rows:
        return CheckOutcome(VOLUME, False, "the partition is empty: 0 rows" if rows == 0 else
                            f"{rows} row{'' if rows == 1 else 's'}, fewer than volume.min_rows ({spec.min_rows})",
                            {"empty" if rows == 0 else "too_few_rows": 1}, {"rows": rows}, {"rows": f">= {spec.min_rows}"})
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
    change = rows / expected - 1 if expected else float(rows > 0)
    beyond = abs(change) > tolerance
    p = poisson_p(rows, expected or EMPTY_MEAN)
    passed = not beyond or p >= spec.significance
    detail = ", ".join(f"{d}: {n}" for d, n in past)
    summary = (f"{rows} rows vs {expected:.{0 if expected >= 10 else 1}f} expected (median of the same weekday: "
               f"{detail}): {change:+.1%}, {'beyond' if beyond else 'within'} ±{tolerance:.0%}"
               + (f" (the tolerance near a holiday: {holiday})" if holiday else "")
               + ("" if not beyond else f" (Poisson p {p:.1e} < {spec.significance})" if not passed
                  else f" but not unlikely for a count (Poisson p {p:.2f} >= {spec.significance})"))
    expectation = {"rows": round(expected), "tolerance": tolerance, "significance": spec.significance,
                   "history": {str(d): n for d, n in past}}
    if holiday:
        expectation["holiday"] = holiday
    return CheckOutcome(VOLUME, passed, summary, {} if passed else {"volume_change": 1},
                        {"rows": rows, "change": round(change, 4), "poisson_p": float(f"{p:.3g}")}, expectation)


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
