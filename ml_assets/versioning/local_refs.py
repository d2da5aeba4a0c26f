"""The embedded version store's commit graph: refs (branches, tags, commit ids) resolved to
commits, staged writes seen through a branch, new commits, ancestry, and the three-way merge that
merge and revert share. Every method runs inside a transaction of the refs database the caller
holds."""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3

from ml_assets.names import check_branch_name, check_repo_name
from ml_assets.versioning.base import (
    Commit,
    MergeConflict,
    NotFound,
    ProtectedBranch,
    VersionStoreError,
)
from ml_assets.versioning.local_objects import digest
from ml_assets.versioning.local_trees import Entry, Tree, TreeStorage

COMMIT_ID = re.compile(r"^[0-9a-f]{64}$")


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


class CommitGraph(TreeStorage):
    """Refs and commits, on top of the trees they point to."""

    @staticmethod
    def _repo(db: sqlite3.Connection, repo: str) -> str:
        """The repository's default (protected) branch."""
        check_repo_name(repo)
        row = db.execute("SELECT default_branch FROM repos WHERE name = ?", (repo,)).fetchone()
        if row is None:
            raise NotFound(f"repository {repo!r} does not exist")
        return row[0]

    @staticmethod
    def _head(db: sqlite3.Connection, repo: str, branch: str) -> str:
        row = db.execute("SELECT head FROM branches WHERE repo = ? AND name = ?", (repo, branch)).fetchone()
        if row is None:
            raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")
        return row[0]

    @staticmethod
    def _commit_row(db: sqlite3.Connection, repo: str, commit_id: str) -> tuple:
        row = db.execute(
            "SELECT id, parents, tree, message, metadata, created_at FROM commits WHERE repo = ? AND id = ?",
            (repo, commit_id),
        ).fetchone()
        if row is None:
            raise NotFound(f"commit {commit_id!r} does not exist in repository {repo!r}")
        return row

    @staticmethod
    def _as_commit(repo: str, row: tuple) -> Commit:
        return Commit(row[0], repo, tuple(json.loads(row[1])), row[3], json.loads(row[4]), row[5])

    def _resolve(self, db: sqlite3.Connection, repo: str, ref: str) -> tuple[str, str | None]:
        """A ref (commit id, branch or tag) -> (commit id, branch name if it was a branch)."""
        self._repo(db, repo)
        if COMMIT_ID.match(ref):
            self._commit_row(db, repo, ref)
            return ref, None
        check_branch_name(ref)
        row = db.execute("SELECT head FROM branches WHERE repo = ? AND name = ?", (repo, ref)).fetchone()
        if row is not None:
            return row[0], ref
        row = db.execute("SELECT commit_id FROM tags WHERE repo = ? AND name = ?", (repo, ref)).fetchone()
        if row is not None:
            return row[0], None
        raise NotFound(f"ref {ref!r} (branch, tag or commit id) does not exist in repository {repo!r}")

    def _commit_tree(self, db: sqlite3.Connection, repo: str, commit_id: str) -> Tree:
        return self._tree(db, self._commit_row(db, repo, commit_id)[2])

    def _staged(self, db: sqlite3.Connection, repo: str, branch: str) -> dict[str, Entry | None]:
        return {
            p: (s, n) if s is not None else None
            for p, s, n in db.execute("SELECT path, sha256, size FROM staging WHERE repo = ? AND branch = ?", (repo, branch))
        }

    def _entry_at(self, db: sqlite3.Connection, repo: str, ref: str, path: str) -> Entry | None:
        commit_id, branch = self._resolve(db, repo, ref)
        if branch is not None:  # reads on a branch see its uncommitted writes, as in lakeFS
            row = db.execute(
                "SELECT sha256, size FROM staging WHERE repo = ? AND branch = ? AND path = ?", (repo, branch, path)
            ).fetchone()
            if row is not None:
                return (row[0], row[1]) if row[0] is not None else None
        return self._t_lookup(db, self._commit_tree(db, repo, commit_id), path)

    def _new_commit(self, db: sqlite3.Connection, repo: str, parents: list[str], tree: Tree,
                    message: str, metadata: dict[str, str]) -> Commit:
        bad = {k: v for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)}
        if bad:
            raise VersionStoreError(f"commit metadata must map strings to strings; got {bad!r}")
        tree_id = self._save_tree(db, tree)
        created = utc_now()
        commit_id = digest(json.dumps([repo, parents, tree_id, message, sorted(metadata.items()), created]).encode())
        db.execute(
            "INSERT INTO commits (repo, id, parents, tree, message, metadata, created_at) VALUES (?,?,?,?,?,?,?)",
            (repo, commit_id, json.dumps(parents), tree_id, message, json.dumps(metadata), created),
        )
        return Commit(commit_id, repo, tuple(parents), message, dict(metadata), created)

    def _ancestors(self, db: sqlite3.Connection, repo: str, commit_id: str) -> list[str]:
        """Breadth-first ancestors of a commit, itself first."""
        seen, order, frontier = set(), [], [commit_id]
        while frontier:
            nxt = []
            for cid in frontier:
                if cid not in seen:
                    seen.add(cid)
                    order.append(cid)
                    nxt.extend(json.loads(self._commit_row(db, repo, cid)[1]))
            frontier = nxt
        return order

    def _writable(self, db: sqlite3.Connection, repo: str, branch: str) -> str:
        check_branch_name(branch)
        if branch == self._repo(db, repo):
            raise ProtectedBranch(f"branch {branch!r} of repository {repo!r} is protected: write on a branch and merge")
        return self._head(db, repo, branch)

    def _three_way(self, db: sqlite3.Connection, repo: str, base: str, src: str, dst: str,
                   what: str, dest: str) -> Tree | None:
        """dst's tree plus src's changes since base; None when src adds nothing; conflicts raise."""
        base_tree, src_tree, dst_tree = (self._commit_tree(db, repo, c) for c in (base, src, dst))
        ours, theirs = self._t_diff(db, base_tree, dst_tree), self._t_diff(db, base_tree, src_tree)
        conflicts = sorted(p for p, (_, new) in theirs.items() if p in ours and ours[p][1] != new)
        if conflicts:
            raise MergeConflict(repo, what, dest, conflicts)
        changes = {p: new for p, (_, new) in theirs.items() if p not in ours}
        return self._t_apply(db, dst_tree, changes) if changes else None
