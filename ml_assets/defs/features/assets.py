import datetime as dt

import dagster as dg
import polars as pl

from ml_assets.defs.common import (
    asset_key,
    code_version,
    daily_partitions,
    parquet_bytes,
    partition_day,
    read_parquet,
    upstream_metadata,
)
from ml_assets.defs.raw.paths import object_paths
from ml_assets.features import build
from ml_assets.resources import ArtifactStoreResource, VersionStoreResource
from ml_assets.sources import ROWS
from ml_assets.spec import ModelSpec
from ml_assets.versioning import NotFound


def build_features_asset(spec: ModelSpec) -> dg.AssetsDefinition:
    snapshot_key = asset_key(spec, "validated_snapshot")
    # The spec's feature section and every module a feature row depends on, custom transforms included:
    # editing any of them marks features (and what is downstream) changed in the UI.
    for transform in spec.features.custom:
        build.load_custom(transform.function)  # an unloadable transform fails definitions loading, not a run
    custom = [c.function.split(":")[0] for c in spec.features.custom]
    version = code_version(spec, ("features", "target", "partitioning"), "ml_assets.features.build",
                           "ml_assets.features.state", "ml_assets.calendar", *custom)
    history_days = max((r.days for r in spec.features.rolling), default=0)

    @dg.asset(
        key=asset_key(spec, "features"),
        deps=[snapshot_key],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"polars"},
        code_version=version,
        description=f"The day's {spec.name} feature rows (joins and target from the spec), read from main by commit id.",
    )
    def features(
        context: dg.AssetExecutionContext, version_store: VersionStoreResource, artifacts: ArtifactStoreResource
    ) -> dg.MaterializeResult:
        day = partition_day(context)
        snapshot = upstream_metadata(context, snapshot_key, day.isoformat())
        store, repo, commit = version_store.get_store(), snapshot["repository"], snapshot["commit"]
        tables = {name: read_parquet(store.get_object(repo, commit, path)) for name, path in object_paths(spec, day).items()}
        # Rolling aggregates read the days before, as published in the same main commit (pinned, so a
        # re-run reads the same bytes); a day missing there is missing from the aggregate, and listed.
        past = {}
        for back in range(1, history_days + 1):
            earlier = day - dt.timedelta(days=back)
            try:
                past[earlier] = read_parquet(store.get_object(repo, commit, object_paths(spec, earlier)[ROWS]))
            except NotFound:
                continue
        history = pl.concat(list(past.values()), how="diagonal_relaxed") if past else None
        try:
            built = build.build_features(spec, tables, history)
        except build.FeatureError as exc:
            raise dg.Failure(description=f"features {day}: {exc}") from None
        ref = artifacts.put(f"{spec.name}/features/date={day.isoformat()}", parquet_bytes(built.frame), ".parquet")
        context.log.info(f"features {day}: {built.frame.height} rows from main commit {commit[:12]}")
        return dg.MaterializeResult(
            data_version=dg.DataVersion(ref.sha256),
            metadata={
                "data_commit": commit, "repository": repo, "uri": dg.MetadataValue.path(ref.uri),
                "sha256": ref.sha256, "bytes": ref.size, "rows": built.frame.height,
                "rows_without_target": built.rows_without_target,
                "columns": dg.MetadataValue.json(built.frame.columns),
                **({"rolling_days_read": dg.MetadataValue.json(sorted(d.isoformat() for d in past)),
                    "rolling_days_missing": dg.MetadataValue.json(sorted(
                        (day - dt.timedelta(days=b)).isoformat() for b in range(1, history_days + 1)
                        if day - dt.timedelta(days=b) not in past))} if history_days else {}),
            },
        )

    return features
