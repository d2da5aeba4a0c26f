"""The embedded version store's refs database: one SQLite file (``refs.db``) holding repositories,
branches, tags, commits, trees, ranges and staged writes. It runs in WAL mode with one connection per
thread, and every change of refs is one ``BEGIN IMMEDIATE`` transaction, so concurrent processes
serialize instead of losing updates and a crash (even SIGKILL) leaves refs as they were before the
transaction."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ml_assets.versioning.base import StoreBusy, VersionStoreError

SCHEMA_VERSION = 4

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


def create_schema(db_path: Path) -> None:
    """Create the tables of a new database, or check that an existing one has this layout."""
    db = sqlite3.connect(db_path, timeout=60, isolation_level=None)
    try:
        _enable_wal(db, db_path)
        # Check and create under one write lock: several processes may open a new store at once,
        # and one must never see another's half-created tables (they would read as a wrong layout).
        db.execute("BEGIN IMMEDIATE")
        found = db.execute("PRAGMA user_version").fetchone()[0]
        has_tables = db.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
        if has_tables and found != SCHEMA_VERSION:
            db.execute("ROLLBACK")
            raise VersionStoreError(
                f"{db_path} has layout {found}, this version reads layout {SCHEMA_VERSION}; "
                f"move it aside (or `make clean` for a local demo home) and re-ingest"
            )
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("COMMIT")
    finally:
        db.close()


class RefsDatabase:
    """The store's hold on the refs database: a connection per thread and its transactions."""

    root: Path
    _db_path: Path
    _connections: threading.local

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
