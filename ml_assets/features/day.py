"""The day's feature rows, built from its snapshot as published in one main commit."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from ml_assets.features import build
from ml_assets.features.record import FeaturesRecord
from ml_assets.layout import Layout
from ml_assets.parquet import parquet_bytes, read_parquet
from ml_assets.resources import ArtifactStoreResource
from ml_assets.step import Step
from ml_assets.validation.record import SnapshotRecord
from ml_assets.versioning import NotFound, VersionStore


def history_days(spec) -> int:
    """How many days before its own a day's rolling aggregates read."""
    return max((r.days for r in spec.features.rolling), default=0)


@dataclass(frozen=True)
class DayTables:
    """What a day's feature rows are built from, read from one main commit."""

    tables: dict[str, pl.DataFrame]
    history: pl.DataFrame | None
    wanted: list[dt.date]
    """The days before it that the rolling aggregates read."""
    read: list[dt.date]
    """Those of them found in the commit."""

    def rolling_days(self) -> tuple[list[str] | None, list[str] | None]:
        """(read, missing) as ISO days, or (None, None) when the spec has no rolling aggregate."""
        if not self.wanted:
            return None, None
        return sorted(d.isoformat() for d in self.read), sorted(d.isoformat() for d in self.wanted if d not in self.read)


def day_tables(spec, store: VersionStore, repo: str, commit: str, day: dt.date) -> DayTables:
    """The day's tables and the raw rows of the days its rolling aggregates read, as published in
    main commit ``commit`` of ``repo`` (pinned, so a re-run reads the same bytes); a day missing there
    is missing from the aggregate, and listed."""
    layout = Layout.of(spec)
    tables = {name: read_parquet(store.get_object(repo, commit, path)) for name, path in layout.object_paths(day).items()}
    wanted = [day - dt.timedelta(days=back) for back in range(1, history_days(spec) + 1)]
    past = {}
    for earlier in wanted:
        try:
            past[earlier] = read_parquet(store.get_object(repo, commit, layout.rows_path(earlier)))
        except NotFound:
            continue
    history = pl.concat(list(past.values()), how="diagonal_relaxed") if past else None
    return DayTables(tables, history, wanted, list(past))


def build_day(step: Step, store: VersionStore, artifacts: ArtifactStoreResource, snapshot: SnapshotRecord,
              log: Callable[[str], None]) -> FeaturesRecord:
    """Raises build.FeatureError when the spec's features cannot be built from the day's rows."""
    spec, day = step.spec, dt.date.fromisoformat(step.partition)
    inputs = day_tables(spec, store, snapshot.repository, snapshot.commit, day)
    built = build.build_features(spec, inputs.tables, inputs.history)
    ref = artifacts.put(Layout.of(spec).features_prefix(day), parquet_bytes(built.frame), ".parquet")
    log(f"features {day}: {built.frame.height} rows from main commit {snapshot.commit[:12]}")
    read, missing = inputs.rolling_days()
    return FeaturesRecord(
        data_commit=snapshot.commit, repository=snapshot.repository, uri=ref.uri, sha256=ref.sha256, bytes=ref.size,
        rows=built.frame.height, rows_without_target=built.rows_without_target, columns=built.frame.columns,
        rolling_days_read=read, rolling_days_missing=missing)
