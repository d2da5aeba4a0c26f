"""The embedded version store: lakeFS semantics with no server.

Objects are content-addressed files under ``<root>/objects`` (a branch costs no copy); repositories,
branches, commits and staged changes live in ``<root>/refs.db`` (SQLite). Every change of refs runs
in one ``BEGIN IMMEDIATE`` transaction, so concurrent runs on one machine serialize instead of
losing updates, and a failure leaves refs as they were.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ml_assets.names import check_branch_name, check_object_path, check_repo_name
from ml_assets.versioning.base import (
    Commit,
    MergeConflict,
    NoChanges,
    NotFound,
    ObjectInfo,
    ProtectedBranch,
    VersionStoreError,
)

COMMIT_ID = re.compile(r"^[0-9a-f]{64}$")
Tree = dict[str, tuple[str, int]]  # path -> (sha256, size)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS repos (name TEXT PRIMARY KEY, default_branch TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trees (id TEXT PRIMARY KEY, entries TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commits (
  repo TEXT NOT NULL, id TEXT NOT NULL, parents TEXT NOT NULL, tree TEXT NOT NULL,
  message TEXT NOT NULL, metadata TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (repo, id));
CREATE TABLE IF NOT EXISTS branches (repo TEXT NOT NULL, name TEXT NOT NULL, head TEXT NOT NULL, PRIMARY KEY (repo, name));
CREATE TABLE IF NOT EXISTS staging (
  repo TEXT NOT NULL, branch TEXT NOT NULL, path TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
  PRIMARY KEY (repo, branch, path));
"""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalVersionStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "objects").mkdir(exist_ok=True)
        self._db_path = self.root / "refs.db"
        db = sqlite3.connect(self._db_path, timeout=60)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
        finally:
            db.close()

    # -- plumbing -----------------------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self._db_path, timeout=60, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    def _object_path(self, sha256: str) -> Path:
        return self.root / "objects" / sha256[:2] / sha256[2:]

    def _write_object(self, data: bytes) -> str:
        sha = _digest(data)
        target = self._object_path(sha)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        return sha

    @staticmethod
    def _tree_id(tree: Tree) -> str:
        return _digest(json.dumps(sorted(tree.items())).encode())

    def _save_tree(self, db: sqlite3.Connection, tree: Tree) -> str:
        tree_id = self._tree_id(tree)
        db.execute(
            "INSERT OR IGNORE INTO trees (id, entries) VALUES (?, ?)",
            (tree_id, json.dumps({p: list(v) for p, v in tree.items()})),
        )
        return tree_id

    @staticmethod
    def _load_tree(db: sqlite3.Connection, tree_id: str) -> Tree:
        row = db.execute("SELECT entries FROM trees WHERE id = ?", (tree_id,)).fetchone()
        return {p: (v[0], v[1]) for p, v in json.loads(row[0]).items()}

    @staticmethod
    def _repo_row(db: sqlite3.Connection, repo: str) -> tuple[str]:
        row = db.execute("SELECT default_branch FROM repos WHERE name = ?", (repo,)).fetchone()
        if row is None:
            raise NotFound(f"repository {repo!r} does not exist")
        return row

    def _head(self, db: sqlite3.Connection, repo: str, branch: str) -> str:
        row = db.execute("SELECT head FROM branches WHERE repo = ? AND name = ?", (repo, branch)).fetchone()
        if row is None:
            raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")
        return row[0]

    def _commit_row(self, db: sqlite3.Connection, repo: str, commit_id: str) -> tuple:
        row = db.execute(
            "SELECT id, parents, tree, message, metadata, created_at FROM commits WHERE repo = ? AND id = ?",
            (repo, commit_id),
        ).fetchone()
        if row is None:
            raise NotFound(f"commit {commit_id!r} does not exist in repository {repo!r}")
        return row

    def _resolve(self, db: sqlite3.Connection, repo: str, ref: str) -> tuple[str, str | None]:
        """A ref (commit id or branch) -> (commit id, branch name if it was a branch)."""
        self._repo_row(db, repo)
        if COMMIT_ID.match(ref):
            self._commit_row(db, repo, ref)
            return ref, None
        check_branch_name(ref)
        return self._head(db, repo, ref), ref

    def _tree_at(self, db: sqlite3.Connection, repo: str, ref: str) -> Tree:
        commit_id, branch = self._resolve(db, repo, ref)
        tree = self._load_tree(db, self._commit_row(db, repo, commit_id)[2])
        if branch is not None:  # reads on a branch see its uncommitted writes, as in lakeFS
            for path, sha, size in db.execute(
                "SELECT path, sha256, size FROM staging WHERE repo = ? AND branch = ?", (repo, branch)
            ):
                tree[path] = (sha, size)
        return tree

    def _new_commit(
        self, db: sqlite3.Connection, repo: str, parents: list[str], tree: Tree, message: str,
        metadata: dict[str, str],
    ) -> Commit:
        bad = {k: v for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)}
        if bad:
            raise VersionStoreError(f"commit metadata must map strings to strings; got {bad!r}")
        tree_id = self._save_tree(db, tree)
        created = _now()
        body = json.dumps([repo, parents, tree_id, message, sorted(metadata.items()), created])
        commit_id = _digest(body.encode())
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
                if cid in seen:
                    continue
                seen.add(cid)
                order.append(cid)
                nxt.extend(json.loads(self._commit_row(db, repo, cid)[1]))
            frontier = nxt
        return order

    def _protected(self, db: sqlite3.Connection, repo: str, branch: str) -> None:
        if branch == self._repo_row(db, repo)[0]:
            raise ProtectedBranch(
                f"branch {branch!r} of repository {repo!r} is protected: write on a branch and merge"
            )

    # -- the VersionStore interface -----------------------------------------------------------

    def ensure_repository(self, repo: str, default_branch: str = "main") -> None:
        check_repo_name(repo)
        check_branch_name(default_branch)
        with self._tx() as db:
            if db.execute("SELECT 1 FROM repos WHERE name = ?", (repo,)).fetchone():
                return
            db.execute("INSERT INTO repos VALUES (?, ?, ?)", (repo, default_branch, _now()))
            root = self._new_commit(db, repo, [], {}, "Repository created", {})
            db.execute("INSERT INTO branches VALUES (?, ?, ?)", (repo, default_branch, root.id))

    def create_branch(self, repo: str, branch: str, source_ref: str = "main") -> str:
        check_branch_name(branch)
        with self._tx() as db:
            head, _ = self._resolve(db, repo, source_ref)
            if db.execute("SELECT 1 FROM branches WHERE repo = ? AND name = ?", (repo, branch)).fetchone():
                raise VersionStoreError(f"branch {branch!r} already exists in repository {repo!r}")
            db.execute("INSERT INTO branches VALUES (?, ?, ?)", (repo, branch, head))
            return head

    def branch_head(self, repo: str, branch: str) -> str:
        check_branch_name(branch)
        with self._tx() as db:
            self._repo_row(db, repo)
            return self._head(db, repo, branch)

    def delete_branch(self, repo: str, branch: str) -> None:
        with self._tx() as db:
            self._protected(db, repo, branch)
            self._head(db, repo, branch)
            db.execute("DELETE FROM staging WHERE repo = ? AND branch = ?", (repo, branch))
            db.execute("DELETE FROM branches WHERE repo = ? AND name = ?", (repo, branch))

    def put_object(self, repo: str, branch: str, path: str, data: bytes) -> ObjectInfo:
        check_object_path(path)
        check_branch_name(branch)
        with self._tx() as db:  # refuse before writing bytes
            self._protected(db, repo, branch)
            self._head(db, repo, branch)
        sha = self._write_object(data)
        with self._tx() as db:
            self._head(db, repo, branch)
            db.execute(
                "INSERT OR REPLACE INTO staging VALUES (?, ?, ?, ?, ?)", (repo, branch, path, sha, len(data))
            )
        return ObjectInfo(path, sha, len(data))

    def commit(self, repo: str, branch: str, message: str, metadata: dict[str, str]) -> Commit:
        check_branch_name(branch)
        with self._tx() as db:
            self._protected(db, repo, branch)
            head = self._head(db, repo, branch)
            base = self._load_tree(db, self._commit_row(db, repo, head)[2])
            tree = self._tree_at(db, repo, branch)
            # Staged writes are consumed either way; identical bytes leave nothing to commit.
            db.execute("DELETE FROM staging WHERE repo = ? AND branch = ?", (repo, branch))
            if tree == base:
                commit = None
            else:
                commit = self._new_commit(db, repo, [head], tree, message, metadata)
                db.execute("UPDATE branches SET head = ? WHERE repo = ? AND name = ?", (commit.id, repo, branch))
        if commit is None:  # raised after the transaction, so the cleared staging is kept
            raise NoChanges(f"nothing to commit on branch {branch!r} of repository {repo!r}")
        return commit

    def merge(
        self, repo: str, source: str, dest: str = "main", metadata: dict[str, str] | None = None
    ) -> str:
        """Merge source into dest; returns dest's head. A conflict raises and changes nothing."""
        check_branch_name(source)
        check_branch_name(dest)
        with self._tx() as db:
            if db.execute(
                "SELECT 1 FROM staging WHERE repo = ? AND branch = ? LIMIT 1", (repo, source)
            ).fetchone():
                raise VersionStoreError(f"branch {source!r} has uncommitted changes: commit them before merging")
            src, dst = self._head(db, repo, source), self._head(db, repo, dest)
            dst_ancestors = self._ancestors(db, repo, dst)
            if src in dst_ancestors:
                return dst  # already merged
            src_ancestors = set(self._ancestors(db, repo, src))
            if dst in src_ancestors:  # fast-forward: dest has nothing source lacks
                db.execute("UPDATE branches SET head = ? WHERE repo = ? AND name = ?", (src, repo, dest))
                return src
            base = next(c for c in dst_ancestors if c in src_ancestors)
            trees = [self._load_tree(db, self._commit_row(db, repo, c)[2]) for c in (base, src, dst)]
            merged, conflicts = _three_way(*trees)
            if conflicts:
                raise MergeConflict(repo, source, dest, conflicts)
            if merged == trees[2]:
                return dst  # the source changes nothing dest does not already hold
            commit = self._new_commit(
                db, repo, [dst, src], merged, f"Merge {source!r} into {dest!r}", dict(metadata or {})
            )
            db.execute("UPDATE branches SET head = ? WHERE repo = ? AND name = ?", (commit.id, repo, dest))
            return commit.id

    def get_commit(self, repo: str, ref: str) -> Commit:
        with self._tx() as db:
            commit_id, _ = self._resolve(db, repo, ref)
            cid, parents, _tree, message, metadata, created = self._commit_row(db, repo, commit_id)
            return Commit(cid, repo, tuple(json.loads(parents)), message, json.loads(metadata), created)

    def log(self, repo: str, ref: str = "main") -> list[Commit]:
        """The commits reachable from ref, newest first (breadth-first over merge parents)."""
        with self._tx() as db:
            commit_id, _ = self._resolve(db, repo, ref)
            rows = [self._commit_row(db, repo, cid) for cid in self._ancestors(db, repo, commit_id)]
        return [Commit(r[0], repo, tuple(json.loads(r[1])), r[3], json.loads(r[4]), r[5]) for r in rows]

    def list_branches(self, repo: str) -> dict[str, str]:
        with self._tx() as db:
            self._repo_row(db, repo)
            return dict(db.execute("SELECT name, head FROM branches WHERE repo = ? ORDER BY name", (repo,)))

    def stat_object(self, repo: str, ref: str, path: str) -> ObjectInfo:
        check_object_path(path)
        with self._tx() as db:
            tree = self._tree_at(db, repo, ref)
        if path not in tree:
            raise NotFound(f"object {path!r} does not exist at {ref!r} in repository {repo!r}")
        sha, size = tree[path]
        return ObjectInfo(path, sha, size)

    def get_object(self, repo: str, ref: str, path: str) -> bytes:
        info = self.stat_object(repo, ref, path)
        data = self._object_path(info.sha256).read_bytes()
        if _digest(data) != info.sha256:
            raise VersionStoreError(
                f"object {path!r} at {ref!r} in {repo!r} is corrupt: sha256 does not match {info.sha256}"
            )
        return data

    def list_objects(self, repo: str, ref: str, prefix: str = "") -> list[ObjectInfo]:
        with self._tx() as db:
            tree = self._tree_at(db, repo, ref)
        return [ObjectInfo(p, s, n) for p, (s, n) in sorted(tree.items()) if p.startswith(prefix)]


def _three_way(base: Tree, src: Tree, dst: Tree) -> tuple[Tree, list[str]]:
    merged: Tree = {}
    conflicts = []
    for path in sorted(set(base) | set(src) | set(dst)):
        b, s, d = base.get(path), src.get(path), dst.get(path)
        if s in (d, b):  # source changed nothing, or made the same change as dest
            chosen = d
        elif d == b:
            chosen = s
        else:
            conflicts.append(path)
            continue
        if chosen is not None:
            merged[path] = chosen
    return merged, conflicts
