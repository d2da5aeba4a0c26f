"""The VersionStore interface: repositories of objects with branches, commits and merges (lakeFS's model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class VersionStoreError(Exception):
    pass


class NotFound(VersionStoreError):
    pass


class ProtectedBranch(VersionStoreError):
    pass


class StoreBusy(VersionStoreError):
    """The store could not take its lock in time (another writer held it); safe to retry."""


class NoChanges(VersionStoreError):
    """A commit with nothing staged (lakeFS refuses these too)."""


class MergeConflict(VersionStoreError):
    def __init__(self, repo: str, source: str, dest: str, paths: list[str]) -> None:
        self.paths = paths
        shown = ", ".join(paths[:10]) + (" …" if len(paths) > 10 else "")
        super().__init__(
            f"merge of {source!r} into {dest!r} in repository {repo!r} conflicts on {len(paths)} "
            f"path(s): {shown}; nothing was merged"
        )


@dataclass(frozen=True)
class ObjectInfo:
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Change:
    """One difference between two refs: added, removed or changed; sha256/size of the newer side
    (of the older side for a removal)."""

    path: str
    type: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Commit:
    id: str
    repo: str
    parents: tuple[str, ...]
    message: str
    metadata: dict[str, str] = field(default_factory=dict)
    created_at: str = ""


class VersionStore(Protocol):
    """What the assets need of a version store; main is protected: only merges reach it."""

    def ensure_repository(self, repo: str) -> None: ...

    def create_branch(self, repo: str, branch: str, source_ref: str = "main") -> str: ...

    def branch_head(self, repo: str, branch: str) -> str: ...

    def delete_branch(self, repo: str, branch: str) -> None: ...

    def put_object(self, repo: str, branch: str, path: str, data: bytes) -> ObjectInfo: ...

    def commit(self, repo: str, branch: str, message: str, metadata: dict[str, str]) -> Commit: ...

    def merge(
        self, repo: str, source: str, dest: str = "main", metadata: dict[str, str] | None = None,
        fast_forward: bool = False,
    ) -> str: ...

    def get_commit(self, repo: str, ref: str) -> Commit: ...

    def log(self, repo: str, ref: str = "main", limit: int | None = None) -> list[Commit]: ...

    def list_branches(self, repo: str) -> dict[str, str]: ...

    def delete_object(self, repo: str, branch: str, path: str) -> None: ...

    def revert(
        self, repo: str, branch: str, ref: str, parent_number: int = 1, metadata: dict[str, str] | None = None
    ) -> Commit: ...

    def create_tag(self, repo: str, tag: str, ref: str) -> str: ...

    def list_tags(self, repo: str) -> dict[str, str]: ...

    def delete_tag(self, repo: str, tag: str) -> None: ...

    def diff(self, repo: str, left_ref: str, right_ref: str, prefix: str = "") -> list[Change]: ...

    def stat_object(self, repo: str, ref: str, path: str) -> ObjectInfo: ...

    def get_object(self, repo: str, ref: str, path: str) -> bytes: ...

    def list_objects(self, repo: str, ref: str, prefix: str = "") -> list[ObjectInfo]: ...


def merge_with_retry(
    store: VersionStore, repo: str, source: str, dest: str = "main", metadata: dict[str, str] | None = None,
    attempts: int = 6, first_wait: float = 0.5,
) -> str:
    """Merge, retrying when the store was busy (a concurrent merge held it): a race is retried, not lost.

    Conflicts and other errors are not retried: they need a person.
    """
    import random
    import time

    for attempt in range(1, attempts + 1):
        try:
            return store.merge(repo, source, dest, metadata=metadata)
        except StoreBusy:
            if attempt == attempts:
                raise
            time.sleep(first_wait * 2 ** (attempt - 1) * (0.5 + random.random()))
    raise AssertionError("unreachable")
