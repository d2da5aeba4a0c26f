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
from ml_assets.defs.snapshots.metadata import check_result, verdict_metadata
from ml_assets.resources import VersionStoreResource
from ml_assets.sources import ROWS
from ml_assets.spec import ModelSpec
from ml_assets.validation.custom import load_check
from ml_assets.validation.names import (
    blocking,
    check_names,
    custom_check_name,
    descriptions,
    enabled_names,
)
from ml_assets.versioning import NotFound, merge_with_retry


def build_validated_snapshot(spec: ModelSpec) -> dg.AssetsDefinition:
    key, raw_key = asset_key(spec, "validated_snapshot"), asset_key(spec, "raw_data")
    names, about = enabled_names(spec), descriptions(spec)
    for target in spec.validation.custom_checks:
        if custom_check_name(target) in names:
            load_check(target)  # an unloadable custom check fails definitions loading, not a run
    # A disabled check is not declared at all: declared, it would show in the UI as never executed on every
    # partition, which reads as a broken run rather than as the spec's choice; the description lists it.
    disabled = [n for n in check_names(spec) if n not in names]
    version = code_version(spec, ("schema", "validation", "partitioning"), "ml_assets.validation.schema",
                           "ml_assets.validation.checks", "ml_assets.validation.drift", "ml_assets.validation.run",
                           "ml_assets.validation.label_drift", "ml_assets.validation.stats")

    @dg.asset(
        key=key,
        deps=[raw_key],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"pandera", "polars"},
        code_version=version,
        check_specs=[dg.AssetCheckSpec(name, asset=key, blocking=blocking(spec, name), description=about[name]
                                       + ("" if blocking(spec, name) else " (severity warn: never blocks)"))
                     for name in names],
        description=(f"The day's {spec.name} rows after every blocking check passed, merged into main "
                     "(write-audit-publish). Its data version is the main commit id."
                     + (f" Checks disabled by the spec: {', '.join(disabled)}." if disabled else "")),
    )
    def validated_snapshot(context: dg.AssetExecutionContext, version_store: VersionStoreResource) -> Iterator:
        from ml_assets.validation.run import (  # pandera, scipy: at run time
            failure_message,
            history_from_main,
            judge,
        )

        day = partition_day(context)
        raw = upstream_metadata(context, raw_key, day.isoformat())
        store, repo, branch, commit = version_store.get_store(), raw["repository"], raw["branch"], raw["commit"]
        rows = read_parquet(store.get_object(repo, commit, object_paths(spec, day)[ROWS]))
        rows_path = lambda d: object_paths(spec, d)[ROWS]  # noqa: E731
        verdict = judge(spec, rows, day, *history_from_main(store, repo, spec, day, rows_path))
        try:
            store.branch_head(repo, branch)
        except NotFound:  # the ingest branch was merged and deleted by an earlier run: re-create it at the commit
            store.create_branch(repo, branch, commit)
        quarantined = verdict.quarantined
        if quarantined:
            commit = _quarantine(store, repo, branch, spec, day, rows, verdict.rows, quarantined, context.run_id)
            context.log.warning(f"validated_snapshot {day}: {len(quarantined)} rows quarantined on {branch}")
            rows = verdict.rows
        for outcome in verdict.outcomes:  # every result is recorded before anything is published
            yield check_result(outcome, repo, branch, commit, len(quarantined))
        if failed := verdict.failed:
            raise dg.Failure(
                description=f"{failure_message(spec, day, failed)}. Nothing reached main; branch {branch!r} of "
                            f"{repo!r} is kept for inspection.",
                metadata={"branch": branch, "audited_commit": commit, "failed_checks": [o.name for o in failed]},
            )
        main_commit = merge_with_retry(store, repo, branch, "main", metadata={
            "dagster_run_id": context.run_id, "dagster_run_url": dagster_run_url(context.run_id),
            "partition": day.isoformat(), "model": spec.name, "audited_commit": commit,
            "code_version": package_code_version(), **verdict_metadata(verdict, names)})
        store.delete_branch(repo, branch)
        if verdict.waived:
            context.log.warning(f"validated_snapshot {day}: failures waived by the spec: {verdict.waived}")
        for outcome in verdict.warnings:
            context.log.warning(f"validated_snapshot {day}: check {outcome.name} (severity warn) failed, published "
                                f"anyway: {outcome.summary}")
        context.log.info(f"validated_snapshot {day}: {rows.height} rows pass {len(names) - len(verdict.warnings)} of "
                         f"{len(names)} checks; main is now {main_commit[:12]}")
        yield dg.MaterializeResult(
            data_version=dg.DataVersion(main_commit),
            metadata={"repository": repo, "commit": main_commit, "audited_commit": commit, "rows": rows.height,
                      "objects": dg.MetadataValue.json(raw["objects"])},
        )

    return validated_snapshot


def _quarantine(store, repo: str, branch: str, spec: ModelSpec, day, rows, clean, bad: set[int], run_id: str) -> str:
    """Move the failing rows aside on the run's branch; the day's rows object keeps the clean ones."""
    import polars as pl

    from ml_assets.defs.common import parquet_bytes

    aside = rows.with_row_index("source_row").filter(pl.col("source_row").is_in(sorted(bad)))
    store.put_object(repo, branch, object_paths(spec, day)[ROWS], parquet_bytes(clean))
    store.put_object(repo, branch, quarantine_path(day), parquet_bytes(aside))
    return store.commit(repo, branch, f"{spec.name} {day}: quarantine {len(bad)} rows", {
        "dagster_run_id": run_id, "partition": day.isoformat(), "quarantined_rows": str(len(bad))}).id


def quarantine_path(day) -> str:
    return f"quarantine/date={day.isoformat()}/part-0.parquet"
