import dagster as dg

from ml_assets.defs.common import asset_key, code_version, daily_partitions, step
from ml_assets.defs.features.day import build_day
from ml_assets.features import build
from ml_assets.records import SnapshotRecord, upstream
from ml_assets.resources import ArtifactStoreResource, VersionStoreResource
from ml_assets.spec import ModelSpec


def build_features_asset(spec: ModelSpec) -> dg.AssetsDefinition:
    snapshot_key = asset_key(spec, "validated_snapshot")
    # The spec's feature section and every module a feature row depends on, custom transforms included:
    # editing any of them marks features (and what is downstream) changed in the UI.
    for transform in spec.features.custom:
        build.load_custom(transform.function)  # an unloadable transform fails definitions loading, not a run
    custom = [c.function.split(":")[0] for c in spec.features.custom]
    version = code_version(spec, ("features", "target", "partitioning"), "ml_assets.features.build",
                           "ml_assets.features.state", "ml_assets.calendar", "ml_assets.defs.features", *custom)

    @dg.asset(
        key=asset_key(spec, "features"),
        deps=[snapshot_key],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"polars"},
        code_version=version,
        description=f"The day's {spec.name} feature rows (joins and target from the spec), read from main by commit id.",
    )
    def features(context: dg.AssetExecutionContext, version_store: VersionStoreResource,
                 artifacts: ArtifactStoreResource) -> dg.MaterializeResult:
        run = step(context, spec)
        snapshot = upstream(context, snapshot_key, run.partition, SnapshotRecord)
        try:
            record = build_day(run, version_store.get_store(), artifacts, snapshot, context.log.info)
        except build.FeatureError as exc:
            raise dg.Failure(description=f"features {run.partition}: {exc}") from None
        return dg.MaterializeResult(data_version=dg.DataVersion(record.sha256), metadata=record.to_metadata())

    return features
