"""Run every check of a day's rows; the snapshot asset reports each and publishes only if all pass."""

from __future__ import annotations

import datetime as dt
import io

import polars as pl

from ml_assets.spec import ModelSpec
from ml_assets.validation.checks import (
    FRESHNESS,
    VOLUME,
    freshness_check,
    same_weekdays,
    volume_check,
)
from ml_assets.validation.custom import check_name, run_custom
from ml_assets.validation.drift import DAY, DRIFT, drift_check
from ml_assets.validation.outcome import CheckOutcome
from ml_assets.validation.schema import KEYS, NULLS, RANGES, SCHEMA, schema_checks
from ml_assets.versioning import NotFound, VersionStore

CHECK_DESCRIPTIONS = {
    SCHEMA: "columns and dtypes as the spec declares them (strict column set)",
    NULLS: "no nulls in non-nullable columns; nullable columns within their allowed null fraction",
    RANGES: "numeric ranges and allowed categories",
    KEYS: "no two rows share the spec's key columns",
    VOLUME: "row count within tolerance of the same weekday over recent weeks on main",
    FRESHNESS: "rows timestamped outside the partition's day, within a tolerance",
    DRIFT: "distributions against recent validated days on main: PSI, KS, Wasserstein, label rate",
}
CHECKS = tuple(CHECK_DESCRIPTIONS)
ROW_LEVEL = (NULLS, RANGES, KEYS)


def check_names(spec: ModelSpec) -> list[str]:
    return [*CHECKS, *(check_name(t) for t in spec.validation.custom_checks)]


def descriptions(spec: ModelSpec) -> dict[str, str]:
    return {**CHECK_DESCRIPTIONS, **{check_name(t): f"custom check {t}" for t in spec.validation.custom_checks}}


def history_from_main(store: VersionStore, repo: str, spec: ModelSpec, day: dt.date, rows_path
                      ) -> tuple[dict[dt.date, int], pl.DataFrame]:
    """What the day is judged against, as published on main, each past day read once: row counts of
    the same weekday in past weeks (volume), and the rows of the days just before it with their day
    in ``__day`` (drift)."""

    def read(past: dt.date) -> bytes | None:
        try:
            return store.get_object(repo, "main", rows_path(past))
        except NotFound:
            return None

    frames = {}
    for back in range(1, spec.validation.drift.reference_days + 1):
        past = day - dt.timedelta(days=back)
        if (data := read(past)) is not None:
            frames[past] = pl.read_parquet(io.BytesIO(data)).with_columns(pl.lit(past).alias(DAY))
    counts = {}
    for past in same_weekdays(day, spec.validation.volume.weeks):
        if past in frames:
            counts[past] = frames[past].height
        elif (data := read(past)) is not None:  # outside the drift window: the footer's row count is enough
            counts[past] = pl.scan_parquet(io.BytesIO(data)).select(pl.len()).collect().item()
    reference = pl.concat(list(frames.values()), how="diagonal_relaxed") if frames else pl.DataFrame()
    return counts, reference


def run_checks(spec: ModelSpec, rows: pl.DataFrame, day: dt.date, history: dict[dt.date, int],
               reference: pl.DataFrame | None = None) -> list[CheckOutcome]:
    outcomes = schema_checks(spec.data_schema, rows)
    outcomes[VOLUME] = volume_check(rows.height, history, spec.validation.volume)
    part = spec.partitioning
    outcomes[FRESHNESS] = freshness_check(rows, part.timestamp_column, part.timezone, day, spec.validation.freshness)
    # Drift describes the valid rows: rows already failing a row-level check are reported there.
    invalid = set().union(*(outcomes[k].row_indices for k in ROW_LEVEL if not outcomes[k].passed))
    valid = rows.with_row_index("__row").filter(~pl.col("__row").is_in(sorted(invalid))).drop("__row") if invalid else rows
    outcomes[DRIFT] = drift_check(spec, valid, reference if reference is not None else pl.DataFrame())
    for target in spec.validation.custom_checks:
        outcomes[check_name(target)] = run_custom(target, rows)
    return [outcomes[name] for name in check_names(spec)]


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


def failure_message(spec: ModelSpec, day: dt.date, failed: list[CheckOutcome]) -> str:
    parts = "; ".join(f"check {o.name}: {o.summary}" for o in failed)
    return f"model {spec.name}, partition {day}: {len(failed)} blocking check(s) failed: {parts}"
