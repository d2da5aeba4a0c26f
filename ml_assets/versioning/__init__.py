"""Data versioning: one VersionStore interface, an embedded backend (lakeFS semantics) and, later, lakeFS."""

from ml_assets.versioning.base import (
    Commit,
    MergeConflict,
    NoChanges,
    NotFound,
    ObjectInfo,
    ProtectedBranch,
    VersionStore,
    VersionStoreError,
)
from ml_assets.versioning.local import LocalVersionStore

__all__ = [
    "Commit",
    "LocalVersionStore",
    "MergeConflict",
    "NoChanges",
    "NotFound",
    "ObjectInfo",
    "ProtectedBranch",
    "VersionStore",
    "VersionStoreError",
]
