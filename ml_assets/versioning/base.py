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
        self, repo: str, source: str, dest: str = "main", metadata: dict[str, str] | None = None
    ) -> str: ...

    def get_commit(self, repo: str, ref: str) -> Commit: ...

    def log(self, repo: str, ref: str = "main") -> list[Commit]: ...

    def list_branches(self, repo: str) -> dict[str, str]: ...

    def stat_object(self, repo: str, ref: str, path: str) -> ObjectInfo: ...

    def get_object(self, repo: str, ref: str, path: str) -> bytes: ...

    def list_objects(self, repo: str, ref: str, prefix: str = "") -> list[ObjectInfo]: ...
