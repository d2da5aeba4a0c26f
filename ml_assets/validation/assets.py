from collections.abc import Iterator

import dagster as dg

from ml_assets.code_version import code_version
from ml_assets.ingest.record import RawRecord
from ml_assets.pipeline.graph import ModelGraph, Stage, daily_partitions
from ml_assets.resources import DagsterLinksResource, VersionStoreResource
from ml_assets.spec import ModelSpec
from ml_assets.step import step
from ml_assets.validation.check_results import check_result
from ml_assets.validation.custom import load_check
from ml_assets.validation.names import (
    blocking,
    check_names,
    custom_check_name,
    descriptions,
    enabled_names,
)
from ml_assets.validation.publish import audit, publish


def calibration_metadata(spec: ModelSpec) -> dict:
    """The calibration's limits as a table on the asset's definition (the UI's asset page): per column
    and test, the limit, the natural variability it came from and the history's days it blocks."""
    from ml_assets.validation.report import calibration_rows

    cal = spec.validation.calibration
    if cal is None:
        return {}
    names = ("column", "measure", "test", "window", "limit", "natural", "blocked_days")
    types = ("string", "string", "string", "int", "float", "string", "int")
    table = dg.MetadataValue.table(
        records=[dg.TableRecord({k: row[k] for k in names}) for row in calibration_rows(cal)],
        schema=dg.TableSchema(columns=[dg.TableColumn(n, t) for n, t in zip(names, types, strict=True)]))
    return {"calibration": f"{cal.version[:12]} ({cal.start}..{cal.end}, target rate {cal.target_rate:g}, "
                           f"{cal.in_sample_rate:.2%} of the history's days blocked)",
            "calibrated_limits": table}


def build_validated_snapshot(spec: ModelSpec) -> dg.AssetsDefinition:
    wiring = ModelGraph(spec).wiring(Stage.VALIDATED_SNAPSHOT)
    key = wiring.key
    names, about = enabled_names(spec), descriptions(spec)
    for target in spec.validation.custom_checks:
        if custom_check_name(target) in names:
            load_check(target)  # an unloadable custom check fails definitions loading, not a run
    # A disabled check is not declared at all: declared, it would show in the UI as never executed on every
    # partition, which reads as a broken run rather than as the spec's choice; the description lists it.
    disabled = [n for n in check_names(spec) if n not in names]

    @dg.asset(
        key=key, deps=wiring.deps, group_name=spec.name, partitions_def=daily_partitions(spec),
        kinds={"pandera", "polars"},
        metadata=calibration_metadata(spec),
        code_version=code_version(spec, ("schema", "validation", "partitioning"), __name__),
        check_specs=[dg.AssetCheckSpec(name, asset=key, blocking=blocking(spec, name), description=about[name]
                                       + ("" if blocking(spec, name) else " (severity warn: never blocks)"))
                     for name in names],
        description=(f"The day's {spec.name} rows after every blocking check passed, merged into main "
                     "(write-audit-publish). Its data version is the main commit id."
                     + (f" Checks disabled by the spec: {', '.join(disabled)}." if disabled else "")),
    )
    def validated_snapshot(context: dg.AssetExecutionContext, version_store: VersionStoreResource,
                           links: DagsterLinksResource) -> Iterator:
        from ml_assets.validation.run import failure_message

        run, store = step(context, spec, links), version_store.get_store()
        raw = wiring.read(context, RawRecord, run.partition)
        done = audit(run, store, raw, context.log)
        for outcome in done.verdict.outcomes:  # every result is recorded before anything is published
            yield check_result(outcome, raw.repository, raw.branch, done.commit, len(done.verdict.quarantined))
        if failed := done.verdict.failed:
            raise dg.Failure(
                description=f"{failure_message(spec, context.partition_key, failed)}. Nothing reached main; branch "
                            f"{raw.branch!r} of {raw.repository!r} is kept for inspection.",
                metadata={"branch": raw.branch, "audited_commit": done.commit,
                          "failed_checks": [o.name for o in failed]})
        record = publish(run, store, raw, done, names, context.log)
        yield dg.MaterializeResult(data_version=dg.DataVersion(record.commit), metadata=record.to_metadata())

    return validated_snapshot
