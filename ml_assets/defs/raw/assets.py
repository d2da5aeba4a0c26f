import json

import dagster as dg

from ml_assets import sources
from ml_assets.defs.common import (
    asset_key,
    code_version,
    dagster_run_url,
    daily_partitions,
    package_code_version,
    parquet_bytes,
    partition_day,
)
from ml_assets.defs.raw import paths
from ml_assets.names import check_branch_name, sanitize_branch_part
from ml_assets.resources import VersionStoreResource
from ml_assets.spec import ModelSpec
from ml_assets.versioning import NoChanges


def ingest_branch(model: str, day: str, run_id: str) -> str:
    """``ingest-<model>-<day>-<run>``: unique per run, readable, and a valid lakeFS branch id."""
    parts = (sanitize_branch_part(model), sanitize_branch_part(day), sanitize_branch_part(run_id)[:8])
    return check_branch_name("ingest-" + "-".join(parts))


def build_raw_data(spec: ModelSpec) -> dg.AssetsDefinition:
    version = code_version(spec, ("source", "partitioning"), "ml_assets.sources", "ml_assets.defs.raw.paths")

    @dg.asset(
        key=asset_key(spec, "raw_data"),
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"polars", "parquet"},
        code_version=version,
        description=f"The day's source rows of {spec.name}, committed to a fresh version-store branch (not yet on main).",
    )
    def raw_data(context: dg.AssetExecutionContext, version_store: VersionStoreResource) -> dg.MaterializeResult:
        day = partition_day(context)
        try:
            batch = sources.read_day(spec, day)
        except sources.SourceError as exc:  # nothing was written: main and every branch are untouched
            raise dg.Failure(description=f"model {spec.name}, partition {day}: {exc}") from None
        store, repo = version_store.get_store(), spec.repository
        store.ensure_repository(repo)
        branch = ingest_branch(spec.name, day.isoformat(), context.run_id)
        if branch in store.list_branches(repo):
            # An earlier attempt of this run (a step retry, or a run resumed after its worker died)
            # left its branch: it never reached main, so start it again from main.
            context.log.info(f"raw_data {day}: branch {branch} left by an earlier attempt of this run; recreating it")
            store.delete_branch(repo, branch)
        store.create_branch(repo, branch, "main")
        objects = []
        for name, path in paths.object_paths(spec, day).items():
            info = store.put_object(repo, branch, path, parquet_bytes(batch.tables[name]))
            objects.append({"table": name, "path": path, "sha256": info.sha256, "bytes": info.size,
                            "rows": batch.tables[name].height})
        commit_meta = {
            "dagster_run_id": context.run_id, "dagster_run_url": dagster_run_url(context.run_id),
            "partition": day.isoformat(), "model": spec.name, "code_version": package_code_version(),
            "source_files": json.dumps(batch.source_files, sort_keys=True),
        }
        rows = batch.tables[sources.ROWS].height
        try:
            commit = store.commit(repo, branch, f"{spec.name} raw data for {day}", commit_meta).id
            context.log.info(f"raw_data {day}: {rows} rows -> {repo}@{branch} commit {commit[:12]}")
        except NoChanges:  # the same bytes are already on main: nothing new to audit
            commit = store.branch_head(repo, branch)
            context.log.info(f"raw_data {day}: {rows} rows, byte-identical to main {commit[:12]}: no new commit")
        return dg.MaterializeResult(
            metadata={
                "repository": repo, "branch": branch, "commit": commit, "rows": rows,
                "objects": dg.MetadataValue.json(objects),
                "source_files": dg.MetadataValue.json(batch.source_files),
            }
        )

    return raw_data
