"""Append-only JSON-lines logs on main of a repository (promotions, refused candidates): each append
is a branch, a commit and a merge, so a log line is on main whole or not at all, and a record already
there (by its ``id``) is never written twice."""

from __future__ import annotations

import json
from typing import Any

from ml_assets.versioning.base import MergeConflict, NotFound, VersionStore, merge_with_retry


def read_log(store: VersionStore, repo: str, path: str, ref: str = "main") -> list[dict[str, Any]]:
    """Every record of the log at ``path``, oldest first ([] when there is none)."""
    try:
        data = store.get_object(repo, ref, path)
    except NotFound:
        return []
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def append_record(store: VersionStore, repo: str, path: str, record: dict[str, Any], message: str,
                  meta: dict[str, str], attempts: int = 5) -> str | None:
    """Append ``record`` to the log at ``path`` on main; nothing if a record with its id is already
    there. Returns the main commit, or None when nothing was written."""
    store.ensure_repository(repo)
    for _ in range(attempts):
        records = read_log(store, repo, path)
        if any(r.get("id") == record["id"] for r in records):
            return None
        branch = f"log-{record['id'][:16]}"
        if branch in store.list_branches(repo):
            store.delete_branch(repo, branch)
        store.create_branch(repo, branch, "main")
        try:
            lines = [json.dumps(r, sort_keys=True) for r in [*records, record]]
            store.put_object(repo, branch, path, ("\n".join(lines) + "\n").encode())
            store.commit(repo, branch, message, meta)
            return merge_with_retry(store, repo, branch, "main", metadata=meta)
        except MergeConflict:
            continue  # another writer appended meanwhile: re-read and append again
        finally:
            store.delete_branch(repo, branch)
    raise RuntimeError(f"could not append {record['id']} to {repo}:{path} after {attempts} attempts "
                       "(concurrent writers)")
