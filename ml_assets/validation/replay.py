"""Replay the snapshot's checks over a range of days of a model's source, in memory.

This is how the checks are calibrated against real data: each day is read from the source exactly as
raw_data reads it, judged by the same ``judge`` the validated_snapshot asset runs, and, when it
passes, becomes part of the history later days are judged against, as it would on main. A failing
day never joins the history, as it would never reach main. A day the source cannot give (its file is
missing or unreadable: raw_data would fail on it) is reported absent with the reason, and is a gap in
the history like a failing day; the replay goes on. Nothing is written anywhere.

    ml-assets replay-checks flights_delay --start 2013-01-01 --end 2013-12-31 [--json]
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator

import polars as pl

from ml_assets.ingest.sources import ROWS, RangeRows, SourceError, read_day, read_range
from ml_assets.spec import ModelSpec
from ml_assets.validation.day_verdict import DayVerdict
from ml_assets.validation.fast_replay import judged_days
from ml_assets.validation.label_drift import DAY
from ml_assets.validation.run import gather_history, judge


def replay(spec: ModelSpec, start: dt.date, end: dt.date, *, ignore_waivers: bool = False,
           read: Callable[[ModelSpec, dt.date], pl.DataFrame] | None = None,
           rows: pl.DataFrame | None = None) -> Iterator[DayVerdict]:
    """Judge every day from ``start`` to ``end`` in order; ``read`` gives a day's rows (default: the source).
    ``ignore_waivers``: judge as if the spec waived nothing (what calibration measures).

    A spec with a calibration is replayed by the fast path (``fast_replay``): the range is read once
    and its signals computed for all days together; ``rows`` (every row of the range and the days before
    it, dated in ``__day``) stands in for the source there."""
    if end < start:
        raise ValueError(f"replay: end {end} is before start {start}")
    if ignore_waivers:
        data = spec.model_dump(by_alias=True)
        data["validation"]["waivers"] = []
        spec = type(spec).model_validate(data)
    if spec.validation.calibration is not None and read is None:
        yield from fast_replay(spec, start, end, _first_day(spec, start), rows)
        return
    read = read or (lambda s, d: read_day(s, d).tables[ROWS])
    keep = _kept_days(spec)
    published: dict[dt.date, pl.DataFrame] = {}
    day = _first_day(spec, start)
    while day <= end:
        result, kept = _judge_day(spec, day, read, published)
        if result.passed and kept is not None:
            published[day] = kept
        published.pop(day - dt.timedelta(days=keep), None)
        if day >= start:
            yield result
        day += dt.timedelta(days=1)


def _kept_days(spec: ModelSpec) -> int:
    """How many days before a day its judgement reads."""
    drift, cal = spec.validation.drift, spec.validation.calibration
    return max(drift.current_days + drift.reference_days, 7 * spec.validation.volume.weeks,
               drift.seasonal_lookback_days(), cal.history_days + 1 if cal else 0)


def _first_day(spec: ModelSpec, start: dt.date) -> dt.date:
    """The first day a replay from ``start`` judges (unreported), so the first reported have their history."""
    return max(start - dt.timedelta(days=_kept_days(spec)), min(spec.partitioning.start, start))


def fast_replay(spec: ModelSpec, start: dt.date, end: dt.date, first: dt.date,
                rows: pl.DataFrame | None = None) -> Iterator[DayVerdict]:
    """The calibrated replay: signals of every day at once, then each day judged in order."""
    read = read_range(spec, first, end) if rows is None else RangeRows(rows.filter(pl.col(DAY).is_between(first, end)))
    for verdict in judged_days(spec, first, end, read):
        if verdict.day >= start:
            yield verdict


def _judge_day(spec: ModelSpec, day: dt.date, read: Callable[[ModelSpec, dt.date], pl.DataFrame],
               published: dict[dt.date, pl.DataFrame]) -> tuple[DayVerdict, pl.DataFrame | None]:
    """The day's verdict, and the rows it would publish (None when the source could not give the day)."""
    try:
        rows = read(spec, day)
    except SourceError as exc:
        return DayVerdict(day, 0, absent=str(exc)), None
    history = gather_history(spec, day, published.get)
    verdict = judge(spec, rows, day, *history)
    return DayVerdict(day, rows.height, {o.name: o.summary for o in verdict.failed}, len(verdict.quarantined),
                      verdict.waived, {o.name: o.summary for o in verdict.warnings}), verdict.rows
