"""The embedded version store: lakeFS semantics with no server.

Objects are content-addressed (``<objects>/ab/cdef…``, the file name is the sha256) under the home
or any fsspec URL, so a branch or a commit never copies data. Refs live in SQLite (``refs.db``):
repositories, branches, tags, commits and staged writes. Every ref change is one
``BEGIN IMMEDIATE`` transaction, so concurrent processes serialize instead of losing updates and a
crash (even SIGKILL) leaves refs as they were before the transaction.

A commit's tree is stored as lakeFS stores it: sorted *ranges* of (path, sha256, size) entries,
content-addressed, listed by a *metarange*. A commit rewrites only the ranges its changes fall in
and a diff skips every range both sides share, so committing 10 changed objects costs about the
same in a repository of 10 objects or 10,000, and creating a branch is one row.
"""

from __future__ import annotations

import bisect
import datetime as dt
import hashlib
import json
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ml_assets.names import check_branch_name, check_object_path, check_repo_name
from ml_assets.versioning.base import (
    Change,
    Commit,
    MergeConflict,
    NoChanges,
    NotFound,
    ObjectInfo,
    ProtectedBranch,
    StoreBusy,
    VersionStoreError,
)

COMMIT_ID = re.compile(r"^[0-9a-f]{64}$")
SCHEMA_VERSION = 4
# Entries per range (a range grown past twice this splits). A commit of k changes in n objects
# rewrites about k ranges and the metarange of n / RANGE_SIZE entries: 32 balances the two for
# tens of thousands of objects.
RANGE_SIZE = 32
Entry = tuple[str, int]  # (sha256, size)
Row = tuple[str, str, int]  # (path, sha256, size)
RangeRef = tuple[str, str, str, int]  # (range id, first path, last path, entries)
# A commit's tree is a metarange plus an overlay of the paths changed since that metarange was
# written (None: deleted). Commits and merges only add to the overlay; past OVERLAY_LIMIT entries
# it is compacted into ranges. So a commit costs what it changes, not what the repository holds.
OVERLAY_LIMIT = 4 * 32


class Tree(NamedTuple):
    meta_id: str
    meta: list[RangeRef]
    overlay: dict[str, Entry | None]

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS repos (name TEXT PRIMARY KEY, default_branch TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ranges (id TEXT PRIMARY KEY, entries TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS metaranges (id TEXT PRIMARY KEY, ranges TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trees (id TEXT PRIMARY KEY, metarange TEXT NOT NULL, overlay TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commits (
  repo TEXT NOT NULL, id TEXT NOT NULL, parents TEXT NOT NULL, tree TEXT NOT NULL,
  message TEXT NOT NULL, metadata TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (repo, id));
CREATE TABLE IF NOT EXISTS branches (repo TEXT NOT NULL, name TEXT NOT NULL, head TEXT NOT NULL, PRIMARY KEY (repo, name));
CREATE TABLE IF NOT EXISTS tags (repo TEXT NOT NULL, name TEXT NOT NULL, commit_id TEXT NOT NULL, PRIMARY KEY (repo, name));
CREATE TABLE IF NOT EXISTS staging (
  repo TEXT NOT NULL, branch TEXT NOT NULL, path TEXT NOT NULL, sha256 TEXT, size INTEGER NOT NULL,
  PRIMARY KEY (repo, branch, path));
PRAGMA user_version = {SCHEMA_VERSION};
"""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _chunks(rows: list[Row], size: int) -> Iterator[list[Row]]:
    if len(rows) <= 2 * size:
        if rows:
            yield rows
        return
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _enable_wal(db: sqlite3.Connection, path) -> None:
    """WAL is set once per database file; switching needs a moment alone with it, and SQLite does not
    wait for that on its own (busy timeout does not apply): retry while other openers hold it."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if db.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise VersionStoreError(f"{path}: cannot switch to WAL journaling: {exc}") from exc
        if time.monotonic() > deadline:
            raise VersionStoreError(f"{path}: SQLite would not switch to WAL journaling")
        time.sleep(0.01)


class LocalVersionStore:
    def __init__(self, root: str | os.PathLike[str], objects_url: str | None = None,
                 storage_options: dict | None = None, range_size: int = RANGE_SIZE,
                 overlay_limit: int = OVERLAY_LIMIT) -> None:
        self.root = Path(root)
        self.range_size = range_size
        self.overlay_limit = overlay_limit
        self.root.mkdir(parents=True, exist_ok=True)
        self.objects_url = objects_url or str(self.root / "objects")
        self._fs, self._objects = fsspec.core.url_to_fs(self.objects_url, **(storage_options or {}))
        self._local = isinstance(self._fs, LocalFileSystem)
        if self._local:
            self._fs.makedirs(self._objects, exist_ok=True)
        self._db_path = self.root / "refs.db"
        self._cache: dict[str, list] = {}  # ranges and metaranges are immutable: safe to cache
        self._connections = threading.local()
        db = sqlite3.connect(self._db_path, timeout=60, isolation_level=None)
        try:
            _enable_wal(db, self._db_path)
            # Check and create under one write lock: several processes may open a new store at once,
            # and one must never see another's half-created tables (they once read as a wrong layout).
            db.execute("BEGIN IMMEDIATE")
            found = db.execute("PRAGMA user_version").fetchone()[0]
            has_tables = db.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
            if has_tables and found != SCHEMA_VERSION:
                db.execute("ROLLBACK")
                raise VersionStoreError(
                    f"{self._db_path} has layout {found}, this version reads layout {SCHEMA_VERSION}; "
                    f"move it aside (or `make clean` for a local demo home) and re-ingest"
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute("COMMIT")
        finally:
            db.close()

    # -- transactions and objects --------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        # One connection per thread, kept open: closing the last connection checkpoints the WAL,
        # which would make every operation pay for the log's size.
        db = getattr(self._connections, "db", None)
        if db is None:
            db = sqlite3.connect(self._db_path, timeout=60, isolation_level=None)
            self._connections.db = db
        return db

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self._connection()
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreBusy(f"version store {self.root} is busy: {exc}") from exc
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        db = getattr(self._connections, "db", None)
        if db is not None:
            db.close()
            self._connections.db = None

    def _object_key(self, sha256: str) -> str:
        return f"{self._objects}/{sha256[:2]}/{sha256[2:]}"

    def _store_bytes(self, key: str, data: bytes) -> None:
        if self._local:  # write aside, then rename: a reader never sees half an object
            self._fs.makedirs(self._fs._parent(key), exist_ok=True)
            tmp = f"{key}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, key)
        else:  # object stores publish a PUT atomically
            self._fs.pipe_file(key, data)

    def _write_object(self, data: bytes) -> str:
        sha = _digest(data)
        key = self._object_key(sha)
        if not self._fs.exists(key):
            self._store_bytes(key, data)
        return sha

    def _read_object(self, sha256: str, where: str) -> bytes:
        try:
            data = self._fs.cat_file(self._object_key(sha256))
        except FileNotFoundError:
            raise VersionStoreError(f"{where}: object {sha256} is missing from {self.objects_url}") from None
        if _digest(data) != sha256:
            raise VersionStoreError(f"{where} is corrupt: its bytes do not hash to {sha256}")
        return data

    # -- ranges and metaranges -----------------------------------------------------------------

    # Ranges and metaranges are stored as lines of tab-separated fields (object paths hold neither
    # tabs nor newlines): several times cheaper to write and read than JSON on every commit.

    def _cached(self, db: sqlite3.Connection, table: str, column: str, key: str, parse) -> list:
        value = self._cache.get(key)
        if value is None:
            row = db.execute(f"SELECT {column} FROM {table} WHERE id = ?", (key,)).fetchone()
            if row is None:
                raise VersionStoreError(f"{table} {key} is missing from {self._db_path}")
            value = [parse(line.split("\t")) for line in row[0].split("\n")] if row[0] else []
            if len(self._cache) > 50_000:
                self._cache.clear()
            self._cache[key] = value
        return value

    def _range(self, db: sqlite3.Connection, range_id: str) -> list[Row]:
        return self._cached(db, "ranges", "entries", range_id, lambda f: (f[0], f[1], int(f[2])))

    def _meta(self, db: sqlite3.Connection, meta_id: str) -> list[RangeRef]:
        return self._cached(db, "metaranges", "ranges", meta_id, lambda f: (f[0], f[1], f[2], int(f[3])))

    def _save(self, db: sqlite3.Connection, table: str, column: str, items: list, body: str) -> str:
        key = _digest(f"{table}\n{body}".encode())
        db.execute(f"INSERT OR IGNORE INTO {table} (id, {column}) VALUES (?, ?)", (key, body))
        self._cache.setdefault(key, list(items))
        return key

    def _save_range(self, db: sqlite3.Connection, rows: list[Row]) -> RangeRef:
        body = "\n".join([f"{p}\t{s}\t{n}" for p, s, n in rows])
        return (self._save(db, "ranges", "entries", rows, body), rows[0][0], rows[-1][0], len(rows))

    def _save_meta(self, db: sqlite3.Connection, meta: list[RangeRef]) -> str:
        body = "\n".join([f"{r}\t{first}\t{last}\t{n}" for r, first, last, n in meta])
        return self._save(db, "metaranges", "ranges", meta, body)

    def _lookup(self, db: sqlite3.Connection, meta: list[RangeRef], path: str, firsts: list[str] | None = None) -> Entry | None:
        firsts = firsts if firsts is not None else [m[1] for m in meta]
        i = bisect.bisect_right(firsts, path) - 1
        if i < 0:
            return None
        rows = self._range(db, meta[i][0])
        j = bisect.bisect_left(rows, (path,))
        return (rows[j][1], rows[j][2]) if j < len(rows) and rows[j][0] == path else None

    def _apply(self, db: sqlite3.Connection, meta: list[RangeRef], changes: dict[str, Entry | None]) -> list[RangeRef]:
        """Rewrite only the ranges the changed paths fall in (None deletes a path)."""
        if not changes:
            return meta
        firsts = [m[1] for m in meta]
        groups: dict[int, dict[str, Entry | None]] = {}
        for path, entry in changes.items():
            groups.setdefault(max(bisect.bisect_right(firsts, path) - 1, 0), {})[path] = entry
        result: list[RangeRef] = []
        for i, ref in enumerate(meta or [None]):
            if i not in groups:
                result.append(ref)
                continue
            entries = {p: (s, n) for p, s, n in self._range(db, ref[0])} if ref else {}
            for path, entry in groups[i].items():
                if entry is None:
                    entries.pop(path, None)
                else:
                    entries[path] = entry
            rows = sorted((p, s, n) for p, (s, n) in entries.items())
            result.extend(self._save_range(db, chunk) for chunk in _chunks(rows, self.range_size))
        return result

    def _rows(self, db: sqlite3.Connection, meta: list[RangeRef], prefix: str = "") -> Iterator[Row]:
        for range_id, first, last, _ in meta:
            if last < prefix or (prefix and first > prefix and not first.startswith(prefix)):
                continue
            for row in self._range(db, range_id):
                if row[0].startswith(prefix):
                    yield row

    def _diff(self, db: sqlite3.Connection, a: list[RangeRef], b: list[RangeRef]) -> dict[str, tuple[Entry | None, Entry | None]]:
        # A path lives in exactly one range of a tree, so a range both trees hold holds the same
        # entries in both: only ranges on one side alone can differ.
        ids_a, ids_b = {m[0] for m in a}, {m[0] for m in b}
        left = {p: (s, n) for m in a if m[0] not in ids_b for p, s, n in self._range(db, m[0])}
        right = {p: (s, n) for m in b if m[0] not in ids_a for p, s, n in self._range(db, m[0])}
        return {p: (left.get(p), right.get(p)) for p in left.keys() | right.keys() if left.get(p) != right.get(p)}

    # -- trees: a metarange and an overlay -------------------------------------------------------

    def _tree(self, db: sqlite3.Connection, tree_id: str) -> Tree:
        cached = self._cache.get(f"tree:{tree_id}")
        if cached is None:
            row = db.execute("SELECT metarange, overlay FROM trees WHERE id = ?", (tree_id,)).fetchone()
            if row is None:
                raise VersionStoreError(f"tree {tree_id} is missing from {self._db_path}")
            overlay = {}
            for line in filter(None, row[1].split("\n")):
                path, sha, size = line.split("\t")
                overlay[path] = None if sha == "-" else (sha, int(size))
            cached = Tree(row[0], self._meta(db, row[0]), overlay)
            self._cache[f"tree:{tree_id}"] = cached
        return cached

    def _save_tree(self, db: sqlite3.Connection, tree: Tree) -> str:
        if len(tree.overlay) > self.overlay_limit:  # compact: fold the overlay into ranges
            meta = self._apply(db, tree.meta, tree.overlay)
            tree = Tree(self._save_meta(db, meta), meta, {})
        body = "\n".join(f"{p}\t{e[0]}\t{e[1]}" if e else f"{p}\t-\t0" for p, e in sorted(tree.overlay.items()))
        tree_id = _digest(f"{tree.meta_id}\n{body}".encode())
        db.execute("INSERT OR IGNORE INTO trees (id, metarange, overlay) VALUES (?, ?, ?)", (tree_id, tree.meta_id, body))
        self._cache[f"tree:{tree_id}"] = tree
        return tree_id

    def _t_lookup(self, db: sqlite3.Connection, tree: Tree, path: str, firsts: list[str] | None = None) -> Entry | None:
        if path in tree.overlay:
            return tree.overlay[path]
        return self._lookup(db, tree.meta, path, firsts)

    def _t_rows(self, db: sqlite3.Connection, tree: Tree, prefix: str = "") -> dict[str, Entry]:
        entries = {p: (s, n) for p, s, n in self._rows(db, tree.meta, prefix) if p not in tree.overlay}
        entries.update({p: e for p, e in tree.overlay.items() if e is not None and p.startswith(prefix)})
        return entries

    def _t_diff(self, db: sqlite3.Connection, a: Tree, b: Tree) -> dict[str, tuple[Entry | None, Entry | None]]:
        candidates = set(self._diff(db, a.meta, b.meta) if a.meta_id != b.meta_id else ())
        candidates |= a.overlay.keys() | b.overlay.keys()
        fa, fb = [m[1] for m in a.meta], [m[1] for m in b.meta]
        out = {}
        for path in candidates:
            old, new = self._t_lookup(db, a, path, fa), self._t_lookup(db, b, path, fb)
            if old != new:
                out[path] = (old, new)
        return out

    def _t_apply(self, db: sqlite3.Connection, tree: Tree, changes: dict[str, Entry | None]) -> Tree:
        overlay = dict(tree.overlay)
        firsts = [m[1] for m in tree.meta]
        for path, entry in changes.items():
            if entry == self._lookup(db, tree.meta, path, firsts):
                overlay.pop(path, None)  # back to what the metarange holds
            else:
                overlay[path] = entry
        return Tree(tree.meta_id, tree.meta, overlay)

    # -- refs -----------------------------------------------------------------------------------

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
        created = _now()
        commit_id = _digest(json.dumps([repo, parents, tree_id, message, sorted(metadata.items()), created]).encode())
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

    # -- the VersionStore interface ---------------------------------------------------------------

    def ensure_repository(self, repo: str, default_branch: str = "main") -> None:
        check_repo_name(repo)
        check_branch_name(default_branch)
        with self._tx() as db:
            if db.execute("SELECT 1 FROM repos WHERE name = ?", (repo,)).fetchone():
                return
            db.execute("INSERT INTO repos VALUES (?, ?, ?)", (repo, default_branch, _now()))
            root = self._new_commit(db, repo, [], Tree(self._save_meta(db, []), [], {}), "Repository created", {})
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
            self._repo(db, repo)
            return self._head(db, repo, branch)

    def list_branches(self, repo: str) -> dict[str, str]:
        with self._tx() as db:
            self._repo(db, repo)
            return dict(db.execute("SELECT name, head FROM branches WHERE repo = ? ORDER BY name", (repo,)))

    def delete_branch(self, repo: str, branch: str) -> None:
        with self._tx() as db:
            self._writable(db, repo, branch)
            db.execute("DELETE FROM staging WHERE repo = ? AND branch = ?", (repo, branch))
            db.execute("DELETE FROM branches WHERE repo = ? AND name = ?", (repo, branch))

    def put_object(self, repo: str, branch: str, path: str, data: bytes) -> ObjectInfo:
        check_object_path(path)
        with self._tx() as db:  # refuse before writing any bytes
            self._writable(db, repo, branch)
        sha = self._write_object(data)
        with self._tx() as db:
            self._writable(db, repo, branch)
            db.execute("INSERT OR REPLACE INTO staging VALUES (?, ?, ?, ?, ?)", (repo, branch, path, sha, len(data)))
        return ObjectInfo(path, sha, len(data))

    def put_objects(self, repo: str, branch: str, objects: dict[str, bytes]) -> list[ObjectInfo]:
        """Several writes staged in one transaction (the bytes are written first, as in put_object)."""
        for path in objects:
            check_object_path(path)
        with self._tx() as db:
            self._writable(db, repo, branch)
        infos = [ObjectInfo(path, self._write_object(data), len(data)) for path, data in objects.items()]
        with self._tx() as db:
            self._writable(db, repo, branch)
            db.executemany("INSERT OR REPLACE INTO staging VALUES (?, ?, ?, ?, ?)",
                           [(repo, branch, i.path, i.sha256, i.size) for i in infos])
        return infos

    def delete_object(self, repo: str, branch: str, path: str) -> None:
        check_object_path(path)
        with self._tx() as db:
            self._writable(db, repo, branch)
            if self._entry_at(db, repo, branch, path) is None:
                raise NotFound(f"object {path!r} does not exist on branch {branch!r} of repository {repo!r}")
            db.execute("INSERT OR REPLACE INTO staging VALUES (?, ?, ?, NULL, 0)", (repo, branch, path))

    def commit(self, repo: str, branch: str, message: str, metadata: dict[str, str]) -> Commit:
        with self._tx() as db:
            head = self._writable(db, repo, branch)
            tree = self._commit_tree(db, repo, head)
            firsts = [m[1] for m in tree.meta]
            changes = {p: e for p, e in self._staged(db, repo, branch).items() if self._t_lookup(db, tree, p, firsts) != e}
            # Staged writes are consumed either way; identical bytes leave nothing to commit.
            db.execute("DELETE FROM staging WHERE repo = ? AND branch = ?", (repo, branch))
            commit = None
            if changes:
                commit = self._new_commit(db, repo, [head], self._t_apply(db, tree, changes), message, metadata)
                db.execute("UPDATE branches SET head = ? WHERE repo = ? AND name = ?", (commit.id, repo, branch))
        if commit is None:  # raised after the transaction, so the cleared staging is kept
            raise NoChanges(f"nothing to commit on branch {branch!r} of repository {repo!r}")
        return commit

    def merge(self, repo: str, source: str, dest: str = "main", metadata: dict[str, str] | None = None,
              fast_forward: bool = False) -> str:
        """Merge source (a branch, tag or commit) into dest; returns dest's head. Conflicts change nothing.

        A merge commit (carrying ``metadata``) is made even when dest could fast-forward, as lakeFS
        does: on main it records who published the data and after which checks. ``fast_forward=True``
        moves dest to source's commit instead when that is possible.
        """
        check_branch_name(dest)
        with self._tx() as db:
            src, src_branch = self._resolve(db, repo, source)
            if src_branch and db.execute(
                "SELECT 1 FROM staging WHERE repo = ? AND branch = ? LIMIT 1", (repo, src_branch)
            ).fetchone():
                raise VersionStoreError(f"branch {source!r} has uncommitted changes: commit them before merging")
            dst = self._head(db, repo, dest)
            dst_ancestors = self._ancestors(db, repo, dst)
            if src in dst_ancestors:
                return dst  # already merged
            src_ancestors = set(self._ancestors(db, repo, src))
            if fast_forward and dst in src_ancestors:  # dest has nothing source lacks
                db.execute("UPDATE branches SET head = ? WHERE repo = ? AND name = ?", (src, repo, dest))
                return src
            base = next(c for c in dst_ancestors if c in src_ancestors)
            merged = self._three_way(db, repo, base, src, dst, source, dest)
            if merged is None:
                return dst  # the source changes nothing dest does not already hold
            commit = self._new_commit(db, repo, [dst, src], merged, f"Merge {source!r} into {dest!r}", dict(metadata or {}))
            db.execute("UPDATE branches SET head = ? WHERE repo = ? AND name = ?", (commit.id, repo, dest))
            return commit.id

    def revert(self, repo: str, branch: str, ref: str, parent_number: int = 1,
               metadata: dict[str, str] | None = None) -> Commit:
        """A new commit on branch undoing what commit ``ref`` changed against its parent."""
        with self._tx() as db:
            head = self._writable(db, repo, branch)
            if db.execute("SELECT 1 FROM staging WHERE repo = ? AND branch = ? LIMIT 1", (repo, branch)).fetchone():
                raise VersionStoreError(f"branch {branch!r} has uncommitted changes: commit them before reverting")
            target, _ = self._resolve(db, repo, ref)
            parents = json.loads(self._commit_row(db, repo, target)[1])
            if not 1 <= parent_number <= len(parents):
                raise VersionStoreError(f"commit {target[:12]} has {len(parents)} parent(s); parent {parent_number} does not exist")
            undone = self._three_way(db, repo, target, parents[parent_number - 1], head, f"revert of {target[:12]}", branch)
            if undone is None:
                raise NoChanges(f"reverting {target[:12]} on {branch!r} changes nothing")
            commit = self._new_commit(db, repo, [head], undone, f"Revert {target}", dict(metadata or {}))
            db.execute("UPDATE branches SET head = ? WHERE repo = ? AND name = ?", (commit.id, repo, branch))
            return commit

    def create_tag(self, repo: str, tag: str, ref: str) -> str:
        check_branch_name(tag)
        with self._tx() as db:
            commit_id, _ = self._resolve(db, repo, ref)
            if db.execute("SELECT 1 FROM tags WHERE repo = ? AND name = ?", (repo, tag)).fetchone():
                raise VersionStoreError(f"tag {tag!r} already exists in repository {repo!r}")
            if db.execute("SELECT 1 FROM branches WHERE repo = ? AND name = ?", (repo, tag)).fetchone():
                raise VersionStoreError(f"{tag!r} is a branch of repository {repo!r}; a tag needs another name")
            db.execute("INSERT INTO tags VALUES (?, ?, ?)", (repo, tag, commit_id))
            return commit_id

    def list_tags(self, repo: str) -> dict[str, str]:
        with self._tx() as db:
            self._repo(db, repo)
            return dict(db.execute("SELECT name, commit_id FROM tags WHERE repo = ? ORDER BY name", (repo,)))

    def delete_tag(self, repo: str, tag: str) -> None:
        with self._tx() as db:
            self._repo(db, repo)
            if db.execute("DELETE FROM tags WHERE repo = ? AND name = ?", (repo, tag)).rowcount == 0:
                raise NotFound(f"tag {tag!r} does not exist in repository {repo!r}")

    def get_commit(self, repo: str, ref: str) -> Commit:
        with self._tx() as db:
            commit_id, _ = self._resolve(db, repo, ref)
            return self._as_commit(repo, self._commit_row(db, repo, commit_id))

    def log(self, repo: str, ref: str = "main", limit: int | None = None) -> list[Commit]:
        """Commits reachable from ref, newest first."""
        with self._tx() as db:
            commit_id, _ = self._resolve(db, repo, ref)
            rows = [self._commit_row(db, repo, cid) for cid in self._ancestors(db, repo, commit_id)]
        commits = sorted((self._as_commit(repo, r) for r in rows), key=lambda c: c.created_at, reverse=True)
        return commits[:limit] if limit else commits

    def diff(self, repo: str, left_ref: str, right_ref: str, prefix: str = "") -> list[Change]:
        """What changes from the committed tree of left_ref to that of right_ref."""
        with self._tx() as db:
            left, _ = self._resolve(db, repo, left_ref)
            right, _ = self._resolve(db, repo, right_ref)
            changes = self._t_diff(db, self._commit_tree(db, repo, left), self._commit_tree(db, repo, right))
        out = []
        for path in sorted(p for p in changes if p.startswith(prefix)):
            old, new = changes[path]
            kind = "added" if old is None else "removed" if new is None else "changed"
            out.append(Change(path, kind, (new or old)[0], (new or old)[1]))
        return out

    def stat_object(self, repo: str, ref: str, path: str) -> ObjectInfo:
        check_object_path(path)
        with self._tx() as db:
            entry = self._entry_at(db, repo, ref, path)
        if entry is None:
            raise NotFound(f"object {path!r} does not exist at {ref!r} in repository {repo!r}")
        return ObjectInfo(path, entry[0], entry[1])

    def get_object(self, repo: str, ref: str, path: str) -> bytes:
        info = self.stat_object(repo, ref, path)
        return self._read_object(info.sha256, f"object {path!r} at {ref!r} in {repo!r}")

    def list_objects(self, repo: str, ref: str, prefix: str = "") -> list[ObjectInfo]:
        with self._tx() as db:
            commit_id, branch = self._resolve(db, repo, ref)
            entries = self._t_rows(db, self._commit_tree(db, repo, commit_id), prefix)
            if branch is not None:
                for path, entry in self._staged(db, repo, branch).items():
                    if not path.startswith(prefix):
                        continue
                    if entry is None:
                        entries.pop(path, None)
                    else:
                        entries[path] = entry
        return [ObjectInfo(p, s, n) for p, (s, n) in sorted(entries.items())]

    def verify(self, check_bytes: bool = True) -> list[str]:
        """Problems found: refs database integrity, and objects referenced by commits or staging
        that are missing or (with check_bytes) corrupt. Also removes leftovers of interrupted writes."""
        problems = []
        with self._tx() as db:
            result = db.execute("PRAGMA integrity_check").fetchone()[0]
            if result != "ok":
                problems.append(f"refs database: {result}")
            referenced = {line.split("\t")[1] for (body,) in db.execute("SELECT entries FROM ranges")
                          for line in body.split("\n") if line}
            referenced |= {s for (s,) in db.execute("SELECT sha256 FROM staging WHERE sha256 IS NOT NULL")}
            referenced |= {line.split("\t")[1] for (body,) in db.execute("SELECT overlay FROM trees")
                           for line in body.split("\n") if line and line.split("\t")[1] != "-"}
        for sha in sorted(referenced):
            try:
                if check_bytes:
                    self._read_object(sha, f"object {sha}")
                elif not self._fs.exists(self._object_key(sha)):
                    problems.append(f"object {sha} is missing")
            except VersionStoreError as exc:
                problems.append(str(exc))
        if self._local:
            for leftover in Path(self._objects).glob("*/*.tmp-*"):
                leftover.unlink(missing_ok=True)
        return problems
