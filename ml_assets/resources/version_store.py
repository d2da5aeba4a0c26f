from abc import ABC, abstractmethod

import dagster as dg

from ml_assets.versioning import LocalVersionStore, VersionStore
from ml_assets.versioning.lakefs_backend import LakeFSVersionStore


class VersionStoreResource(dg.ConfigurableResource, ABC):
    """A version store with lakeFS semantics; assets depend on this, environments pick a backend."""

    @abstractmethod
    def get_store(self) -> VersionStore: ...


class LocalVersionStoreResource(VersionStoreResource):
    """The embedded version store (no server): refs in SQLite under ``root``, objects under
    ``root/objects`` or ``objects_url`` (any fsspec URL, e.g. ``s3://bucket/prefix``)."""

    root: str
    objects_url: str | None = None

    def get_store(self) -> LocalVersionStore:
        return LocalVersionStore(self.root, objects_url=self.objects_url)


class LakeFSVersionStoreResource(VersionStoreResource):
    """lakeFS through the official SDK. Set the keys from the environment (``dg.EnvVar``), never in code."""

    endpoint: str
    access_key_id: str
    secret_access_key: str
    storage_namespace: str
    """Prefix of each model repository's storage namespace, e.g. ``s3://bucket/lakefs``."""

    def get_store(self) -> LakeFSVersionStore:
        return LakeFSVersionStore(self.endpoint, self.access_key_id, self.secret_access_key, self.storage_namespace)
