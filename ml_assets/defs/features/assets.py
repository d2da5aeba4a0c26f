import dagster as dg

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
from ml_assets.spec import ModelSpec


def build_features_asset(spec: ModelSpec) -> dg.AssetsDefinition:
    snapshot_key = asset_key(spec, "validated_snapshot")
    version = code_version(spec, ("features", "target", "partitioning"), "ml_assets.features.build")

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
        built = build.build_features(spec, tables)
        ref = artifacts.put(f"{spec.name}/features/date={day.isoformat()}", parquet_bytes(built.frame), ".parquet")
        context.log.info(f"features {day}: {built.frame.height} rows from main commit {commit[:12]}")
        return dg.MaterializeResult(
            data_version=dg.DataVersion(ref.sha256),
            metadata={
                "data_commit": commit, "repository": repo, "uri": dg.MetadataValue.path(ref.uri),
                "sha256": ref.sha256, "bytes": ref.size, "rows": built.frame.height,
                "rows_without_target": built.rows_without_target,
                "columns": dg.MetadataValue.json(built.frame.columns),
            },
        )

    return features
