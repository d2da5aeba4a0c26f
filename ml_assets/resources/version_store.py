from abc import ABC, abstractmethod

import dagster as dg

from ml_assets.versioning import LocalVersionStore, VersionStore


class VersionStoreResource(dg.ConfigurableResource, ABC):
    """A version store with lakeFS semantics; assets depend on this, environments pick a backend."""

    @abstractmethod
    def get_store(self) -> VersionStore: ...


class LocalVersionStoreResource(VersionStoreResource):
    """The embedded version store (no server) under a local directory."""

    root: str

    def get_store(self) -> LocalVersionStore:
        return LocalVersionStore(self.root)
