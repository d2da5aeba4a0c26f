"""How the embedded version store keeps a commit's tree, as lakeFS does: sorted *ranges* of
(path, sha256, size) entries, content-addressed, listed by a *metarange*, plus an *overlay* of the
paths changed since that metarange was written. A commit rewrites only the ranges its changes fall
in and a diff skips every range both sides share, so committing 10 changed objects costs about the
same in a repository of 10 objects or 10,000. Ranges, metaranges and trees are rows of the refs
database; being immutable, they are cached."""

from __future__ import annotations

import bisect
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from ml_assets.versioning.base import VersionStoreError
from ml_assets.versioning.local_objects import digest

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


def _chunks(rows: list[Row], size: int) -> Iterator[list[Row]]:
    if len(rows) <= 2 * size:
        if rows:
            yield rows
        return
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


class TreeStorage:
    """Reads and writes of ranges, metaranges and trees inside a transaction of the refs database."""

    range_size: int
    overlay_limit: int
    _db_path: Path
    _cache: dict[str, list]

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
        key = digest(f"{table}\n{body}".encode())
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
        tree_id = digest(f"{tree.meta_id}\n{body}".encode())
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
