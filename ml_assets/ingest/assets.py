import dagster as dg

from ml_assets.code_version import code_version
from ml_assets.ingest import sources
from ml_assets.ingest.write import ingest, ingest_branch
from ml_assets.pipeline.graph import ModelGraph, Stage, daily_partitions
from ml_assets.resources import DagsterLinksResource, VersionStoreResource
from ml_assets.spec import ModelSpec
from ml_assets.step import step

__all__ = ["build_raw_data", "ingest_branch"]


def build_raw_data(spec: ModelSpec) -> dg.AssetsDefinition:
    version = code_version(spec, ("source", "partitioning"), __name__)

    @dg.asset(
        key=ModelGraph(spec).wiring(Stage.RAW_DATA).key,
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"polars", "parquet"},
        code_version=version,
        description=f"The day's source rows of {spec.name}, committed to a fresh version-store branch (not yet on main).",
    )
    def raw_data(context: dg.AssetExecutionContext, version_store: VersionStoreResource,
                 links: DagsterLinksResource) -> dg.MaterializeResult:
        run = step(context, spec, links)
        try:
            record = ingest(run, version_store.get_store(), context.log.info)
        except sources.SourceError as exc:  # nothing was written: main and every branch are untouched
            raise run.failure(exc, retry=True) from None
        return dg.MaterializeResult(metadata=record.to_metadata())

    return raw_data
