"""Run every enabled check of a day's rows; the snapshot asset reports each and publishes only if every
blocking one passes (a ``severity: warn`` check's failure is reported and never stops the merge)."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import polars as pl

from ml_assets.ingest.sources import dated
from ml_assets.spec import ModelSpec
from ml_assets.validation.calibrated import calibrated_drift
from ml_assets.validation.checks import (
    freshness_check,
    same_weekdays,
    volume_check,
)
from ml_assets.validation.custom import check_name, run_custom
from ml_assets.validation.drift import drift_check
from ml_assets.validation.names import (
    DRIFT,
    FRESHNESS,
    NULLS,
    ROW_LEVEL,
    VOLUME,
    blocking,
    enabled_names,
)
from ml_assets.validation.outcome import CheckOutcome
from ml_assets.validation.schema_checks import schema_checks
from ml_assets.versioning import NotFound, VersionStore


class History(NamedTuple):
    """What a day is judged against, from the days published on main."""

    counts: dict[dt.date, int]
    """Row counts of the same weekday in past weeks (volume)."""
    reference: pl.DataFrame
    """The rows of the ``reference_days`` days before the current window, their day in ``__day`` (drift)."""
    earlier: pl.DataFrame
    """The rows of the current window's ``current_days - 1`` days before the day, their day in ``__day``."""
    seasonal: pl.DataFrame | None = None
    """The rows of the seasonal reference (the same weeks a period earlier), their day in ``__day``;
    None when the spec declares no seasonal columns."""


Loaded = pl.LazyFrame | pl.DataFrame


def gather_history(spec: ModelSpec, day: dt.date, load: Callable[[dt.date], Loaded | None]) -> History:
    """The day's ``History``, each past day loaded once. ``load`` gives a published day's rows (a scan, or
    rows already in memory), or None when the day never reached main (failed, never ingested, or absent
    from the source): a gap, never an error."""
    drift, cal = spec.validation.drift, spec.validation.calibration
    frames = {}
    for back in range(1, max(drift.current_days + drift.reference_days, cal.history_days + 1 if cal else 0)):
        past = day - dt.timedelta(days=back)
        if (loaded := load(past)) is not None:
            frames[past] = loaded.collect() if isinstance(loaded, pl.LazyFrame) else loaded
    counts = {}
    for past in same_weekdays(day, spec.validation.volume.weeks):
        if past in frames:
            counts[past] = frames[past].height
        elif (loaded := load(past)) is not None:  # outside the drift window: the count is enough
            counts[past] = loaded.select(pl.len()).collect().item() if isinstance(loaded, pl.LazyFrame) else loaded.height
    start = day - dt.timedelta(days=drift.current_days - 1)  # the current window's first day
    return History(counts, dated({d: f for d, f in frames.items() if d < start}),
                   dated({d: f for d, f in frames.items() if d >= start}), _seasonal(spec, day, load, frames))


def _seasonal(spec: ModelSpec, day: dt.date, load: Callable[[dt.date], Loaded | None],
              loaded: dict[dt.date, pl.DataFrame]) -> pl.DataFrame | None:
    """The seasonal reference's rows (days already ``loaded`` for the trailing reference are reused)."""
    spans = spec.validation.drift.seasonal_reference(day)
    if not spans:
        return None
    frames = {}
    for first, last in spans:
        for offset in range((last - first).days + 1):
            past = first + dt.timedelta(days=offset)
            found = loaded.get(past)
            if found is None and (found := load(past)) is not None and isinstance(found, pl.LazyFrame):
                found = found.collect()
            if found is not None:
                frames[past] = found
    return dated(frames)


def history_from_main(store: VersionStore, repo: str, spec: ModelSpec, day: dt.date,
                      rows_path: Callable[[dt.date], str]) -> History:
    """``gather_history`` over the days published on main of the version store."""

    def load(past: dt.date) -> pl.LazyFrame | None:
        try:  # a Parquet scan: a count reads only the footer
            return pl.scan_parquet(io.BytesIO(store.get_object(repo, "main", rows_path(past))))
        except NotFound:
            return None

    return gather_history(spec, day, load)


def run_checks(spec: ModelSpec, rows: pl.DataFrame, day: dt.date, history: dict[dt.date, int],
               reference: pl.DataFrame | None = None, earlier: pl.DataFrame | None = None,
               seasonal: pl.DataFrame | None = None, drift: CheckOutcome | None = None,
               known_valid: bool = False) -> list[CheckOutcome]:
    """Every enabled check's outcome, in ``check_names`` order; a disabled one does not run. ``drift``:
    the drift check's outcome when the caller judged it already, ``known_valid``: pandera passed the
    day's rows already (the fast replay judges a range at once)."""
    on = set(enabled_names(spec))
    # The four pandera-based checks come from one validation; a disabled one's findings are dropped.
    outcomes = {k: o for k, o in schema_checks(spec.data_schema, rows, known_valid).items() if k in on}
    if VOLUME in on:
        outcomes[VOLUME] = volume_check(rows.height, history, spec.validation.volume, day)
    part = spec.partitioning
    if FRESHNESS in on:
        outcomes[FRESHNESS] = freshness_check(rows, part.timestamp_column, part.timezone, day,
                                             spec.validation.freshness, part.timestamp_format)
    if DRIFT in on and drift is not None:
        outcomes[DRIFT] = drift
    elif DRIFT in on:
        # Drift describes the valid rows: rows already failing a row-level check are reported there.
        invalid = set().union(*(outcomes[k].row_indices for k in ROW_LEVEL if k in on and not outcomes[k].passed))
        valid, reference = without_rows(rows, invalid), reference if reference is not None else pl.DataFrame()
        if spec.validation.calibration is not None:
            past = _dated_parts(reference, earlier)
            outcomes[DRIFT] = calibrated_drift(spec, valid, day, past)
        else:
            outcomes[DRIFT] = drift_check(spec, valid, reference, earlier, day, seasonal)
    for target in spec.validation.custom_checks:
        if check_name(target) in on:
            outcomes[check_name(target)] = run_custom(target, rows)
    return [_waive(spec, day, replace(outcomes[name], blocking=blocking(spec, name))) for name in enabled_names(spec)]


def _dated_parts(reference: pl.DataFrame, earlier: pl.DataFrame | None) -> pl.DataFrame:
    parts = [f for f in (reference, earlier) if f is not None and f.height]
    return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()


def _waive(spec: ModelSpec, day: dt.date, outcome: CheckOutcome) -> CheckOutcome:
    if outcome.passed:
        return outcome
    for waiver in spec.validation.waivers:
        if waiver.day == day and outcome.name in waiver.checks:
            return replace(outcome, passed=True, waived=waiver.reason, summary=f"waived ({waiver.reason}): {outcome.summary}")
    return outcome


def quarantinable(spec: ModelSpec, outcomes: list[CheckOutcome], rows: int) -> set[int] | None:
    """Rows to quarantine, when quarantine is on, every blocking failure is row-level and few enough (a
    warning's rows are reported, never set aside)."""
    if spec.validation.quarantine is None:
        return None
    failed = [o for o in outcomes if not o.passed and o.blocking]
    row_level = set(ROW_LEVEL) | {check_name(t) for t in spec.validation.custom_checks}
    if not failed or any(o.name not in row_level or not o.row_indices for o in failed):
        return None
    if any(o.name == NULLS and any(k.endswith("null_fraction") for k in o.counts) for o in failed):
        return None  # too many nulls is a property of the day, not of rows
    bad = set().union(*(o.row_indices for o in failed))
    return bad if len(bad) / max(rows, 1) <= spec.validation.quarantine.max_fraction else None


def without_rows(rows: pl.DataFrame, drop: set[int]) -> pl.DataFrame:
    if not drop:
        return rows
    return rows.with_row_index("__row").filter(~pl.col("__row").is_in(sorted(drop))).drop("__row")


@dataclass
class Verdict:
    """Every check's outcome on what would be published: the day's rows less any quarantined ones."""

    outcomes: list[CheckOutcome]
    rows: pl.DataFrame
    quarantined: set[int] = field(default_factory=set)

    @property
    def failed(self) -> list[CheckOutcome]:
        """The blocking checks that failed: any keeps the day from main."""
        return [o for o in self.outcomes if not o.passed and o.blocking]

    @property
    def warnings(self) -> list[CheckOutcome]:
        """The ``severity: warn`` checks that failed: reported, and the day is still published."""
        return [o for o in self.outcomes if not o.passed and not o.blocking]

    @property
    def waived(self) -> dict[str, str]:
        return {o.name: o.waived for o in self.outcomes if o.waived}


def judge(spec: ModelSpec, rows: pl.DataFrame, day: dt.date, history: dict[dt.date, int],
          reference: pl.DataFrame | None = None, earlier: pl.DataFrame | None = None,
          seasonal: pl.DataFrame | None = None, drift: CheckOutcome | None = None,
          known_valid: bool = False) -> Verdict:
    """Run the checks; with quarantine on and few enough row-level failures, set those rows aside and
    check again exactly what is left (the snapshot publishes that)."""
    outcomes = run_checks(spec, rows, day, history, reference, earlier, seasonal, drift, known_valid)
    quarantined = quarantinable(spec, outcomes, rows.height)
    if not quarantined:
        return Verdict(outcomes, rows)
    clean = without_rows(rows, quarantined)
    return Verdict(run_checks(spec, clean, day, history, reference, earlier, seasonal, drift), clean, quarantined)


def failure_message(spec: ModelSpec, day: dt.date, failed: list[CheckOutcome]) -> str:
    parts = "; ".join(f"check {o.name}: {o.summary}" for o in failed)
    return f"model {spec.name}, partition {day}: {len(failed)} blocking check(s) failed: {parts}"
