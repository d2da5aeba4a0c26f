from abc import ABC, abstractmethod

import dagster as dg

from ml_assets.versioning import LocalVersionStore, VersionStore


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
