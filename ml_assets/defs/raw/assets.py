import dagster as dg

from ml_assets import sources
from ml_assets.defs.common import asset_key, code_version, daily_partitions, step
from ml_assets.defs.raw.ingest import ingest, ingest_branch
from ml_assets.resources import DagsterLinksResource, VersionStoreResource
from ml_assets.spec import ModelSpec

__all__ = ["build_raw_data", "ingest_branch"]


def build_raw_data(spec: ModelSpec) -> dg.AssetsDefinition:
    version = code_version(spec, ("source", "partitioning"), "ml_assets.sources", "ml_assets.defs.raw",
                           "ml_assets.layout")

    @dg.asset(
        key=asset_key(spec, "raw_data"),
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
