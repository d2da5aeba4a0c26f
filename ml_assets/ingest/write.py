"""The day's source rows, committed to a fresh branch of the model's repository (not yet on main)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from ml_assets.ingest import sources
from ml_assets.ingest.record import RawCommit, RawRecord
from ml_assets.layout import ROWS, Layout
from ml_assets.names import check_branch_name, sanitize_branch_part
from ml_assets.parquet import parquet_bytes
from ml_assets.records.provenance import StoredObject
from ml_assets.step import Step
from ml_assets.versioning import NoChanges, VersionStore


def ingest_branch(model: str, day: str, run_id: str) -> str:
    """``ingest-<model>-<day>-<run>``: unique per run, readable, and a valid lakeFS branch id."""
    parts = (sanitize_branch_part(model), sanitize_branch_part(day), sanitize_branch_part(run_id)[:8])
    return check_branch_name("ingest-" + "-".join(parts))


def ingest(step: Step, store: VersionStore, log: Callable[[str], None]) -> RawRecord:
    """Read the day from the source and commit its tables on a fresh branch; nothing touches main.

    Raises sources.SourceError (nothing written) when the source cannot give the day."""
    spec, day = step.spec, dt.date.fromisoformat(step.partition)
    batch = sources.read_day(spec, day)
    repo = spec.repository
    store.ensure_repository(repo)
    branch = ingest_branch(spec.name, step.partition, step.run_id)
    if branch in store.list_branches(repo):
        # An earlier attempt of this run (a step retry, or a run resumed after its worker died)
        # left its branch: it never reached main, so start it again from main.
        log(f"raw_data {day}: branch {branch} left by an earlier attempt of this run; recreating it")
        store.delete_branch(repo, branch)
    store.create_branch(repo, branch, "main")
    objects = []
    for name, path in Layout.of(spec).object_paths(day).items():
        info = store.put_object(repo, branch, path, parquet_bytes(batch.tables[name]))
        objects.append(StoredObject(table=name, path=path, sha256=info.sha256, bytes=info.size,
                                    rows=batch.tables[name].height))
    rows = batch.tables[ROWS].height
    meta = RawCommit(provenance=step.provenance(), source_files=batch.source_files).to_commit_metadata()
    try:
        commit = store.commit(repo, branch, f"{spec.name} raw data for {day}", meta).id
        log(f"raw_data {day}: {rows} rows -> {repo}@{branch} commit {commit[:12]}")
    except NoChanges:  # the same bytes are already on main: nothing new to audit
        commit = store.branch_head(repo, branch)
        log(f"raw_data {day}: {rows} rows, byte-identical to main {commit[:12]}: no new commit")
    return RawRecord(repository=repo, branch=branch, commit=commit, rows=rows, objects=tuple(objects),
                     source_files=batch.source_files)
