import dagster as dg

from ml_assets.code_version import code_version
from ml_assets.features import build
from ml_assets.features.day import build_day
from ml_assets.pipeline.graph import ModelGraph, Stage, daily_partitions
from ml_assets.resources import ArtifactStoreResource, VersionStoreResource
from ml_assets.spec import ModelSpec
from ml_assets.step import step
from ml_assets.validation.record import SnapshotRecord


def build_features_asset(spec: ModelSpec) -> dg.AssetsDefinition:
    wiring = ModelGraph(spec).wiring(Stage.FEATURES)
    # The spec's feature section and every module a feature row depends on, custom transforms included:
    # editing any of them marks features (and what is downstream) changed in the UI.
    for transform in spec.features.custom:
        build.load_custom(transform.function)  # an unloadable transform fails definitions loading, not a run
    custom = [c.function.split(":")[0] for c in spec.features.custom]
    version = code_version(spec, ("features", "target", "partitioning"), __name__, *custom)

    @dg.asset(
        key=wiring.key,
        deps=wiring.deps,
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"polars"},
        code_version=version,
        description=f"The day's {spec.name} feature rows (joins and target from the spec), read from main by commit id.",
    )
    def features(context: dg.AssetExecutionContext, version_store: VersionStoreResource,
                 artifacts: ArtifactStoreResource) -> dg.MaterializeResult:
        run = step(context, spec)
        snapshot = wiring.read(context, SnapshotRecord, run.partition)
        try:
            record = build_day(run, version_store.get_store(), artifacts, snapshot, context.log.info)
        except build.FeatureError as exc:
            raise dg.Failure(description=f"features {run.partition}: {exc}") from None
        return dg.MaterializeResult(data_version=dg.DataVersion(record.sha256), metadata=record.to_metadata())

    return features
