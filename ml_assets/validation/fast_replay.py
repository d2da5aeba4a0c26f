"""The replay of a calibrated spec, vectorized over days.

Today's replay re-reads the source and re-gathers each day's history to judge it from scratch
(about 100 ms a day for one row a day of 50 columns). Here the range is read once, every signal of
every day comes from one ``group_by``, and each day then costs its row checks and one step of the
gate: the gate's history is the days already judged, those that passed becoming "on main".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import numpy as np
import polars as pl

from ml_assets.ingest.sources import RangeRows
from ml_assets.spec import ModelSpec
from ml_assets.validation.calibrated import outcome
from ml_assets.validation.checks import same_weekdays
from ml_assets.validation.day_verdict import DayVerdict
from ml_assets.validation.gate import Gate
from ml_assets.validation.label_drift import DAY
from ml_assets.validation.pandera_schema import build_schema
from ml_assets.validation.run import judge
from ml_assets.validation.signals import daily
from ml_assets.validation.verdict import passes

CHUNK_DAYS = 64


def valid_days(spec: ModelSpec, by_day: dict[dt.date, pl.DataFrame]) -> set[dt.date]:
    """The days whose rows pandera passes, found a chunk of days at a time (a chunk that fails is
    halved until its failing days are alone): on ordinary history, one validation per ``CHUNK_DAYS``.
    A chunk's keys are unique only if each day's are; each day's share of nulls is judged per day."""
    if spec.validation.custom_checks:
        return set()  # a custom check may judge the day as a whole: every day is judged on its own
    schema = spec.data_schema
    valid: set[dt.date] = set()

    def check(days: list[dt.date]) -> None:
        frame = pl.concat([by_day[d] for d in days], how="vertical") if len(days) > 1 else by_day[days[0]]
        if passes(schema, build_schema(schema, frame=frame), frame):
            valid.update(days)
        elif len(days) > 1:
            check(days[:len(days) // 2])
            check(days[len(days) // 2:])

    days = sorted(by_day)
    for i in range(0, len(days), CHUNK_DAYS):
        try:
            check(days[i:i + CHUNK_DAYS])
        except pl.exceptions.PolarsError:  # frames that cannot even be joined: each day on its own
            continue
    return valid


def judged_days(spec: ModelSpec, first: dt.date, end: dt.date, read: RangeRows) -> Iterator[DayVerdict]:
    """Every day from ``first`` to ``end`` judged in order, from the range's rows (``read``)."""
    cal = spec.validation.calibration
    assert cal is not None
    days = [first + dt.timedelta(days=i) for i in range((end - first).days + 1)]
    rows, absent = read.rows, read.absent
    by_day = ({key[0]: part for key, part in rows.partition_by(DAY, as_dict=True, include_key=False).items()}
              if rows.height else {})
    by_day.update(read.odd)  # as read: their dtypes are the schema check's to judge
    valid = valid_days(spec, {d: f for d, f in by_day.items() if d not in read.odd})
    empty = rows.drop(DAY).clear() if DAY in rows.columns else pl.DataFrame()
    data = daily(spec, cal.signals, rows, days)
    counts: dict[dt.date, int] = {}
    weeks = spec.validation.volume.weeks
    found: list[DayVerdict] = []

    def decide(t: int, stats: np.ndarray) -> bool:
        day = days[t]
        if day in absent:
            found.append(DayVerdict(day, 0, absent=absent[day]))
            return False
        frame = by_day.get(day, empty)
        history = {d: counts[d] for d in same_weekdays(day, weeks) if d in counts}
        verdict = judge(spec, frame, day, history, drift=outcome(cal, day, stats), known_valid=day in valid)
        found.append(DayVerdict(day, frame.height, {o.name: o.summary for o in verdict.failed},
                                len(verdict.quarantined), verdict.waived,
                                {o.name: o.summary for o in verdict.warnings}))
        if verdict.failed:
            return False
        counts[day] = verdict.rows.height
        return True

    for _ in Gate(cal).run(data, np.zeros(len(days), dtype=bool), 0, decide):
        yield found.pop()
