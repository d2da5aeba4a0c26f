"""Write-audit-publish of one day: judge the raw commit's rows, move failing rows aside when the
spec allows, and merge what passed into main. Every check's outcome is recorded before anything
is published; a blocking failure publishes nothing and keeps the branch for inspection."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from ml_assets.ingest.record import RawRecord
from ml_assets.layout import ROWS, Layout
from ml_assets.parquet import parquet_bytes, read_parquet
from ml_assets.records.provenance import StoredObject
from ml_assets.step import Step
from ml_assets.validation.record import PublishCommit, SnapshotRecord
from ml_assets.versioning import NotFound, VersionStore, merge_with_retry

if TYPE_CHECKING:
    from ml_assets.validation.run import Verdict


@dataclass(frozen=True)
class Audit:
    """The checks' verdict on the day and the branch commit it judged."""

    verdict: Verdict
    commit: str
    objects: tuple[StoredObject, ...]
    """The day's objects as they stand on the branch (after quarantine)."""


def audit(step: Step, store: VersionStore, raw: RawRecord, log: logging.Logger) -> Audit:
    from ml_assets.validation.run import history_from_main, judge  # pandera, scipy: at run time

    spec, day = step.spec, dt.date.fromisoformat(step.partition)
    layout, repo, branch, commit = Layout.of(spec), raw.repository, raw.branch, raw.commit
    rows = read_parquet(store.get_object(repo, commit, layout.rows_path(day)))
    verdict = judge(spec, rows, day, *history_from_main(store, repo, spec, day, layout.rows_path))
    try:
        store.branch_head(repo, branch)
    except NotFound:  # the ingest branch was merged and deleted by an earlier run: re-create it at the commit
        store.create_branch(repo, branch, commit)
    objects = raw.objects
    if verdict.quarantined:
        commit, clean = quarantine(step, store, raw, rows, verdict)
        objects = tuple(clean if o.table == ROWS else o for o in objects)
        log.warning(f"validated_snapshot {day}: {len(verdict.quarantined)} rows quarantined on {branch}")
    return Audit(verdict, commit, objects)


def quarantine(step: Step, store: VersionStore, raw: RawRecord, rows: pl.DataFrame, verdict: Verdict
               ) -> tuple[str, StoredObject]:
    """Move the failing rows aside on the run's branch; the day's rows object keeps the clean ones.
    Returns the commit and the rows object as it now is."""
    bad, clean, day = verdict.quarantined, verdict.rows, step.partition
    aside = rows.with_row_index("source_row").filter(pl.col("source_row").is_in(sorted(bad)))
    path = Layout.of(step.spec).rows_path(day)
    info = store.put_object(raw.repository, raw.branch, path, parquet_bytes(clean))
    store.put_object(raw.repository, raw.branch, Layout.quarantine_path(day), parquet_bytes(aside))
    commit = store.commit(raw.repository, raw.branch, f"{step.spec.name} {day}: quarantine {len(bad)} rows", {
        "dagster_run_id": step.run_id, "partition": day, "quarantined_rows": str(len(bad))}).id
    return commit, StoredObject(table=ROWS, path=path, sha256=info.sha256, bytes=info.size, rows=clean.height)


def publish(step: Step, store: VersionStore, raw: RawRecord, done: Audit, names: list[str],
            log: logging.Logger) -> SnapshotRecord:
    """Merge the audited branch into main and delete it; the main commit is the day's data version."""
    from ml_assets.validation.check_results import verdict_metadata

    verdict, day = done.verdict, step.partition
    checks = verdict_metadata(verdict, names)
    cal = step.spec.validation.calibration
    calibration = f"{cal.version[:12]} ({cal.start}..{cal.end}, target rate {cal.target_rate:g})" if cal else ""
    meta = PublishCommit(provenance=step.provenance(), audited_commit=done.commit, calibration=calibration,
                         **checks).to_commit_metadata()
    main_commit = merge_with_retry(store, raw.repository, raw.branch, "main", metadata=meta)
    store.delete_branch(raw.repository, raw.branch)
    if verdict.waived:
        log.warning(f"validated_snapshot {day}: failures waived by the spec: {verdict.waived}")
    for outcome in verdict.warnings:
        log.warning(f"validated_snapshot {day}: check {outcome.name} (severity warn) failed, published anyway: "
                    f"{outcome.summary}")
    log.info(f"validated_snapshot {day}: {verdict.rows.height} rows pass {len(names) - len(verdict.warnings)} of "
        f"{len(names)} checks; main is now {main_commit[:12]}")
    return SnapshotRecord(repository=raw.repository, commit=main_commit, audited_commit=done.commit,
                          rows=verdict.rows.height, objects=done.objects, calibration=calibration)


__all__ = ["Audit", "audit", "publish", "quarantine"]
