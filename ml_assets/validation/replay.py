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
from dataclasses import dataclass, field

import polars as pl

from ml_assets.ingest.sources import ROWS, SourceError, read_day
from ml_assets.spec import ModelSpec
from ml_assets.validation.run import gather_history, judge


@dataclass
class DayVerdict:
    day: dt.date
    rows: int
    failed: dict[str, str] = field(default_factory=dict)  # check name -> its summary
    quarantined: int = 0
    waived: dict[str, str] = field(default_factory=dict)  # check name -> the waiver's reason
    warned: dict[str, str] = field(default_factory=dict)  # severity-warn check name -> its summary
    absent: str | None = None
    """Why the source could not give the day (then nothing was judged), or None."""

    @property
    def passed(self) -> bool:
        """No blocking check failed (an absent day fails none: it was never judged)."""
        return not self.failed

    def as_dict(self) -> dict:
        return {"day": self.day.isoformat(), "rows": self.rows, "passed": self.passed, "absent": self.absent,
                "quarantined": self.quarantined, "failed": self.failed, "warned": self.warned, "waived": self.waived}


def replay(spec: ModelSpec, start: dt.date, end: dt.date, *, ignore_waivers: bool = False,
           read: Callable[[ModelSpec, dt.date], pl.DataFrame] | None = None) -> Iterator[DayVerdict]:
    """Judge every day from ``start`` to ``end`` in order; ``read`` gives a day's rows (default: the source).
    ``ignore_waivers``: judge as if the spec waived nothing (what calibration measures)."""
    if end < start:
        raise ValueError(f"replay: end {end} is before start {start}")
    if ignore_waivers:
        data = spec.model_dump(by_alias=True)
        data["validation"]["waivers"] = []
        spec = type(spec).model_validate(data)
    read = read or (lambda s, d: read_day(s, d).tables[ROWS])
    drift = spec.validation.drift
    keep = max(drift.current_days + drift.reference_days, 7 * spec.validation.volume.weeks,
               drift.seasonal_lookback_days())
    published: dict[dt.date, pl.DataFrame] = {}
    day = max(start - dt.timedelta(days=keep), min(spec.partitioning.start, start))
    while day <= end:
        result, rows = _judge_day(spec, day, read, published)
        if result.passed and rows is not None:
            published[day] = rows
        published.pop(day - dt.timedelta(days=keep), None)
        if day >= start:
            yield result
        day += dt.timedelta(days=1)


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
