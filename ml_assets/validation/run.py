"""Run every check of a day's rows; the snapshot asset reports each and publishes only if all pass."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import polars as pl

from ml_assets.spec import ModelSpec
from ml_assets.validation.checks import (
    freshness_check,
    same_weekdays,
    volume_check,
)
from ml_assets.validation.custom import check_name, run_custom
from ml_assets.validation.drift import DAY, drift_check
from ml_assets.validation.names import (
    DRIFT,
    FRESHNESS,
    NULLS,
    ROW_LEVEL,
    VOLUME,
    check_names,
)
from ml_assets.validation.outcome import CheckOutcome
from ml_assets.validation.schema import schema_checks
from ml_assets.versioning import NotFound, VersionStore


def gather_history(spec: ModelSpec, day: dt.date, load: Callable[[dt.date], pl.LazyFrame | None]
                   ) -> tuple[dict[dt.date, int], pl.DataFrame]:
    """What the day is judged against, each past day loaded once: row counts of the same weekday in
    past weeks (volume), and the rows of the days just before it with their day in ``__day`` (drift).
    ``load`` gives a published day's rows, or None when the day never reached main."""
    frames = {}
    for back in range(1, spec.validation.drift.reference_days + 1):
        past = day - dt.timedelta(days=back)
        if (lazy := load(past)) is not None:
            frames[past] = lazy.collect().with_columns(pl.lit(past).alias(DAY))
    counts = {}
    for past in same_weekdays(day, spec.validation.volume.weeks):
        if past in frames:
            counts[past] = frames[past].height
        elif (lazy := load(past)) is not None:  # outside the drift window: the count is enough
            counts[past] = lazy.select(pl.len()).collect().item()
    reference = pl.concat(list(frames.values()), how="diagonal_relaxed") if frames else pl.DataFrame()
    return counts, reference


def history_from_main(store: VersionStore, repo: str, spec: ModelSpec, day: dt.date,
                      rows_path: Callable[[dt.date], str]) -> tuple[dict[dt.date, int], pl.DataFrame]:
    """``gather_history`` over the days published on main of the version store."""

    def load(past: dt.date) -> pl.LazyFrame | None:
        try:  # a Parquet scan: a count reads only the footer
            return pl.scan_parquet(io.BytesIO(store.get_object(repo, "main", rows_path(past))))
        except NotFound:
            return None

    return gather_history(spec, day, load)


def run_checks(spec: ModelSpec, rows: pl.DataFrame, day: dt.date, history: dict[dt.date, int],
               reference: pl.DataFrame | None = None) -> list[CheckOutcome]:
    outcomes = schema_checks(spec.data_schema, rows)
    outcomes[VOLUME] = volume_check(rows.height, history, spec.validation.volume, day)
    part = spec.partitioning
    outcomes[FRESHNESS] = freshness_check(rows, part.timestamp_column, part.timezone, day, spec.validation.freshness,
                                         part.timestamp_format)
    # Drift describes the valid rows: rows already failing a row-level check are reported there.
    invalid = set().union(*(outcomes[k].row_indices for k in ROW_LEVEL if not outcomes[k].passed))
    valid = without_rows(rows, invalid)
    outcomes[DRIFT] = drift_check(spec, valid, reference if reference is not None else pl.DataFrame())
    for target in spec.validation.custom_checks:
        outcomes[check_name(target)] = run_custom(target, rows)
    return [_waive(spec, day, outcomes[name]) for name in check_names(spec)]


def _waive(spec: ModelSpec, day: dt.date, outcome: CheckOutcome) -> CheckOutcome:
    if outcome.passed:
        return outcome
    for waiver in spec.validation.waivers:
        if waiver.day == day and outcome.name in waiver.checks:
            return replace(outcome, passed=True, waived=waiver.reason, summary=f"waived ({waiver.reason}): {outcome.summary}")
    return outcome


def quarantinable(spec: ModelSpec, outcomes: list[CheckOutcome], rows: int) -> set[int] | None:
    """Rows to quarantine, when quarantine is on, every failure is row-level and few enough."""
    if spec.validation.quarantine is None:
        return None
    failed = [o for o in outcomes if not o.passed]
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
        return [o for o in self.outcomes if not o.passed]

    @property
    def waived(self) -> dict[str, str]:
        return {o.name: o.waived for o in self.outcomes if o.waived}


def judge(spec: ModelSpec, rows: pl.DataFrame, day: dt.date, history: dict[dt.date, int],
          reference: pl.DataFrame | None = None) -> Verdict:
    """Run the checks; with quarantine on and few enough row-level failures, set those rows aside and
    check again exactly what is left (the snapshot publishes that)."""
    outcomes = run_checks(spec, rows, day, history, reference)
    quarantined = quarantinable(spec, outcomes, rows.height)
    if not quarantined:
        return Verdict(outcomes, rows)
    clean = without_rows(rows, quarantined)
    return Verdict(run_checks(spec, clean, day, history, reference), clean, quarantined)


def failure_message(spec: ModelSpec, day: dt.date, failed: list[CheckOutcome]) -> str:
    parts = "; ".join(f"check {o.name}: {o.summary}" for o in failed)
    return f"model {spec.name}, partition {day}: {len(failed)} blocking check(s) failed: {parts}"
