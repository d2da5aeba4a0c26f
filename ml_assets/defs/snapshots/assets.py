from collections.abc import Iterator

import dagster as dg

from ml_assets.defs.common import (
    asset_key,
    code_version,
    dagster_run_url,
    daily_partitions,
    package_code_version,
    partition_day,
    read_parquet,
    upstream_metadata,
)
from ml_assets.defs.raw.paths import object_paths
from ml_assets.defs.snapshots.metadata import check_metadata
from ml_assets.resources import VersionStoreResource
from ml_assets.sources import ROWS
from ml_assets.spec import ModelSpec
from ml_assets.validation.run import CHECK_DESCRIPTIONS, CHECKS
from ml_assets.versioning import NotFound, merge_with_retry


def build_validated_snapshot(spec: ModelSpec) -> dg.AssetsDefinition:
    key, raw_key = asset_key(spec, "validated_snapshot"), asset_key(spec, "raw_data")
    version = code_version(spec, ("schema", "validation", "partitioning"), "ml_assets.validation.schema",
                           "ml_assets.validation.checks", "ml_assets.validation.drift", "ml_assets.validation.run")

    @dg.asset(
        key=key,
        deps=[raw_key],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"pandera", "polars"},
        code_version=version,
        check_specs=[dg.AssetCheckSpec(name, asset=key, blocking=True, description=CHECK_DESCRIPTIONS[name])
                     for name in CHECKS],
        description=(f"The day's {spec.name} rows after every blocking check passed, merged into main "
                     "(write-audit-publish). Its data version is the main commit id."),
    )
    def validated_snapshot(context: dg.AssetExecutionContext, version_store: VersionStoreResource) -> Iterator:
        from ml_assets.validation.run import (  # pandera, scipy: imported when the checks run
            failure_message,
            reference_rows,
            run_checks,
            volume_history,
        )

        day = partition_day(context)
        raw = upstream_metadata(context, raw_key, day.isoformat())
        store, repo, branch, commit = version_store.get_store(), raw["repository"], raw["branch"], raw["commit"]
        rows = read_parquet(store.get_object(repo, commit, object_paths(spec, day)[ROWS]))
        rows_path = lambda d: object_paths(spec, d)[ROWS]  # noqa: E731
        history = volume_history(store, repo, day, spec.validation.volume.weeks, rows_path)
        reference = reference_rows(store, repo, day, spec.validation.drift.reference_days, rows_path)
        outcomes = run_checks(spec, rows, day, history, reference)
        for outcome in outcomes:  # every result is recorded before anything is published
            yield dg.AssetCheckResult(check_name=outcome.name, passed=outcome.passed, description=outcome.summary,
                                      metadata=check_metadata(outcome, repo, branch, commit))
        failed = [o for o in outcomes if not o.passed]
        if failed:
            raise dg.Failure(
                description=f"{failure_message(spec, day, failed)}. Nothing reached main; branch {branch!r} of "
                            f"{repo!r} is kept for inspection.",
                metadata={"branch": branch, "audited_commit": commit, "failed_checks": [o.name for o in failed]},
            )
        try:
            store.branch_head(repo, branch)
        except NotFound:  # the ingest branch was merged and deleted by an earlier run: re-create it at the commit
            store.create_branch(repo, branch, commit)
        main_commit = merge_with_retry(store, repo, branch, "main", metadata={
            "dagster_run_id": context.run_id, "dagster_run_url": dagster_run_url(context.run_id),
            "partition": day.isoformat(), "model": spec.name, "audited_commit": commit,
            "code_version": package_code_version(),
            "checks_passed": f"{', '.join(CHECKS)} ({rows.height} rows)",
        })
        store.delete_branch(repo, branch)
        context.log.info(f"validated_snapshot {day}: {rows.height} rows pass {len(CHECKS)} checks; main is now {main_commit[:12]}")
        yield dg.MaterializeResult(
            data_version=dg.DataVersion(main_commit),
            metadata={"repository": repo, "commit": main_commit, "audited_commit": commit, "rows": rows.height,
                      "objects": dg.MetadataValue.json(raw["objects"])},
        )

    return validated_snapshot
