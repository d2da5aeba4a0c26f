"""The embedded version store: lakeFS semantics with no server.

``LocalVersionStore`` implements the VersionStore interface on four pieces, each a module of its
own: content-addressed objects under the home or any fsspec URL (local_objects), the SQLite refs
database where every ref change is one transaction (local_db), commit trees kept as lakeFS keeps
them, so a commit costs what it changes and creating a branch is one row (local_trees), and the
commit graph with the three-way merge (local_refs). Here are the operations themselves: each
checks the refs it touches and changes them within one transaction, or raises and changes nothing.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ml_assets.names import check_branch_name, check_object_path, check_repo_name
from ml_assets.versioning.base import (
    Change,
    Commit,
    NoChanges,
    NotFound,
    ObjectInfo,
    VersionStoreError,
)
from ml_assets.versioning.local_db import RefsDatabase, create_schema
from ml_assets.versioning.local_objects import ObjectStorage
from ml_assets.versioning.local_refs import CommitGraph, utc_now
from ml_assets.versioning.local_trees import OVERLAY_LIMIT, RANGE_SIZE, Tree


class LocalVersionStore(CommitGraph, ObjectStorage, RefsDatabase):
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
        create_schema(self._db_path)

    # -- the VersionStore interface ---------------------------------------------------------------

    def ensure_repository(self, repo: str, default_branch: str = "main") -> None:
        check_repo_name(repo)
        check_branch_name(default_branch)
        with self._tx() as db:
            if db.execute("SELECT 1 FROM repos WHERE name = ?", (repo,)).fetchone():
                return
            db.execute("INSERT INTO repos VALUES (?, ?, ?)", (repo, default_branch, utc_now()))
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
