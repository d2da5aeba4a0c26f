from collections.abc import Iterator

import dagster as dg

from ml_assets.defs.common import (
    asset_key,
    code_version,
    dagster_run_url,
    daily_partitions,
    markdown_table,
    package_code_version,
    partition_day,
    read_parquet,
    upstream_metadata,
)
from ml_assets.defs.raw.paths import object_paths
from ml_assets.resources import VersionStoreResource
from ml_assets.sources import ROWS
from ml_assets.spec import ModelSpec
from ml_assets.versioning import NotFound, merge_with_retry

SCHEMA_CHECK = "schema"


def build_validated_snapshot(spec: ModelSpec) -> dg.AssetsDefinition:
    key, raw_key = asset_key(spec, "validated_snapshot"), asset_key(spec, "raw_data")
    version = code_version(spec, ("schema",), "ml_assets.defs.snapshots.schema")

    @dg.asset(
        key=key,
        deps=[raw_key],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"pandera", "polars"},
        code_version=version,
        check_specs=[dg.AssetCheckSpec(SCHEMA_CHECK, asset=key, blocking=True,
                                       description="pandera schema from the spec: columns, dtypes, nulls, ranges, categories")],
        description=(f"The day's {spec.name} rows after the schema check passed, merged into main "
                     "(write-audit-publish). Its data version is the main commit id."),
    )
    def validated_snapshot(context: dg.AssetExecutionContext, version_store: VersionStoreResource) -> Iterator:
        day = partition_day(context)
        raw = upstream_metadata(context, raw_key, day.isoformat())
        store, repo, branch, commit = version_store.get_store(), raw["repository"], raw["branch"], raw["commit"]
        rows = read_parquet(store.get_object(repo, commit, object_paths(spec, day)[ROWS]))
        from ml_assets.defs.snapshots import schema  # pandera: imported when a check runs

        report = schema.validate_frame(spec.data_schema, rows)
        where = f"model {spec.name}, partition {day}"
        check_meta = {
            "rows": report.rows, "failures": report.failures, "failures_by_check": dg.MetadataValue.json(report.by_check),
            "audited_commit": commit, "branch": branch,
        }
        if not report.passed:
            check_meta["failure_sample"] = dg.MetadataValue.md(markdown_table(report.sample))
        yield dg.AssetCheckResult(check_name=SCHEMA_CHECK, passed=report.passed, metadata=check_meta,
                                  description=report.summary(where))
        if not report.passed:
            raise dg.Failure(
                description=f"{report.summary(where)}. Nothing reached main; branch {branch!r} of {repo!r} is kept for inspection.",
                metadata=check_meta,
            )
        try:
            store.branch_head(repo, branch)
        except NotFound:  # the ingest branch was merged and deleted by an earlier run: re-create it at the commit
            store.create_branch(repo, branch, commit)
        main_commit = merge_with_retry(store, repo, branch, "main", metadata={
            "dagster_run_id": context.run_id, "dagster_run_url": dagster_run_url(context.run_id),
            "partition": day.isoformat(), "model": spec.name, "audited_commit": commit,
            "code_version": package_code_version(), "checks_passed": f"{SCHEMA_CHECK} ({report.rows} rows)",
        })
        store.delete_branch(repo, branch)
        context.log.info(f"validated_snapshot {day}: {report.rows} rows pass; main is now {main_commit[:12]}")
        yield dg.MaterializeResult(
            data_version=dg.DataVersion(main_commit),
            metadata={"repository": repo, "commit": main_commit, "audited_commit": commit, "rows": report.rows,
                      "objects": dg.MetadataValue.json(raw["objects"])},
        )

    return validated_snapshot
