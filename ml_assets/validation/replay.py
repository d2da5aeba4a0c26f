"""Replay the snapshot's checks over a range of days of a model's source, in memory.

This is how the checks are calibrated against real data: each day is read from the source exactly as
raw_data reads it, judged by the same ``judge`` the validated_snapshot asset runs, and, when it
passes, becomes part of the history later days are judged against, as it would on main. A failing
day never joins the history, as it would never reach main. Nothing is written anywhere.

    ml-assets replay-checks flights_delay --start 2013-01-01 --end 2013-12-31 [--json]
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import polars as pl

from ml_assets.sources import ROWS, read_day
from ml_assets.spec import ModelSpec
from ml_assets.validation.run import gather_history, judge


@dataclass
class DayVerdict:
    day: dt.date
    rows: int
    failed: dict[str, str] = field(default_factory=dict)  # check name -> its summary
    quarantined: int = 0
    waived: dict[str, str] = field(default_factory=dict)  # check name -> the waiver's reason

    @property
    def passed(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict:
        return {"day": self.day.isoformat(), "rows": self.rows, "passed": self.passed,
                "quarantined": self.quarantined, "failed": self.failed, "waived": self.waived}


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
    keep = max(spec.validation.drift.reference_days, 7 * spec.validation.volume.weeks)
    published: dict[dt.date, pl.DataFrame] = {}
    day = max(start - dt.timedelta(days=keep), min(spec.partitioning.start, start))
    while day <= end:
        history, reference = gather_history(spec, day, lambda d: published[d].lazy() if d in published else None)
        rows = read(spec, day)
        verdict = judge(spec, rows, day, history, reference)
        result = DayVerdict(day, rows.height, {o.name: o.summary for o in verdict.failed}, len(verdict.quarantined),
                            verdict.waived)
        if result.passed:
            published[day] = verdict.rows
        published.pop(day - dt.timedelta(days=keep), None)
        if day >= start:
            yield result
        day += dt.timedelta(days=1)
