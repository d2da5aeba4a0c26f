"""Data versioning: one VersionStore interface, an embedded backend (lakeFS semantics) and, later, lakeFS."""

from ml_assets.versioning.base import (
    Change,
    Commit,
    MergeConflict,
    NoChanges,
    NotFound,
    ObjectInfo,
    ProtectedBranch,
    StoreBusy,
    VersionStore,
    VersionStoreError,
    merge_with_retry,
)
from ml_assets.versioning.local import LocalVersionStore

__all__ = [
    "Change",
    "Commit",
    "LocalVersionStore",
    "MergeConflict",
    "NoChanges",
    "NotFound",
    "ObjectInfo",
    "ProtectedBranch",
    "StoreBusy",
    "VersionStore",
    "VersionStoreError",
    "merge_with_retry",
]
