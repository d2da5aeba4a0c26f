"""The day's feature rows, built from its snapshot as published in one main commit."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import polars as pl

from ml_assets.defs.common import Step, parquet_bytes, read_parquet
from ml_assets.features import build
from ml_assets.layout import Layout
from ml_assets.records import FeaturesRecord, SnapshotRecord
from ml_assets.resources import ArtifactStoreResource
from ml_assets.versioning import NotFound, VersionStore


def history_days(spec) -> int:
    """How many days before its own a day's rolling aggregates read."""
    return max((r.days for r in spec.features.rolling), default=0)


def build_day(step: Step, store: VersionStore, artifacts: ArtifactStoreResource, snapshot: SnapshotRecord,
              log: Callable[[str], None]) -> FeaturesRecord:
    """Raises build.FeatureError when the spec's features cannot be built from the day's rows."""
    spec, day = step.spec, dt.date.fromisoformat(step.partition)
    layout, repo, commit = Layout.of(spec), snapshot.repository, snapshot.commit
    tables = {name: read_parquet(store.get_object(repo, commit, path)) for name, path in layout.object_paths(day).items()}
    # Rolling aggregates read the days before, as published in the same main commit (pinned, so a
    # re-run reads the same bytes); a day missing there is missing from the aggregate, and listed.
    wanted = [day - dt.timedelta(days=back) for back in range(1, history_days(spec) + 1)]
    past = {}
    for earlier in wanted:
        try:
            past[earlier] = read_parquet(store.get_object(repo, commit, layout.rows_path(earlier)))
        except NotFound:
            continue
    history = pl.concat(list(past.values()), how="diagonal_relaxed") if past else None
    built = build.build_features(spec, tables, history)
    ref = artifacts.put(layout.features_prefix(day), parquet_bytes(built.frame), ".parquet")
    log(f"features {day}: {built.frame.height} rows from main commit {commit[:12]}")
    return FeaturesRecord(
        data_commit=commit, repository=repo, uri=ref.uri, sha256=ref.sha256, bytes=ref.size,
        rows=built.frame.height, rows_without_target=built.rows_without_target, columns=built.frame.columns,
        rolling_days_read=sorted(d.isoformat() for d in past) if wanted else None,
        rolling_days_missing=sorted(d.isoformat() for d in wanted if d not in past) if wanted else None)
