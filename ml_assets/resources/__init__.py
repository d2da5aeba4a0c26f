"""ConfigurableResources, chosen per environment in ml_assets.definitions."""

from ml_assets.resources.artifacts import ArtifactStoreResource, CheckpointStoreResource
from ml_assets.resources.links import DagsterLinksResource
from ml_assets.resources.tracking import MlflowTrackingResource
from ml_assets.resources.training import TorchrunLauncher
from ml_assets.resources.tuning import TuningResource
from ml_assets.resources.version_store import (
    LakeFSVersionStoreResource,
    LocalVersionStoreResource,
    VersionStoreResource,
)

__all__ = [
    "ArtifactStoreResource",
    "CheckpointStoreResource",
    "DagsterLinksResource",
    "LakeFSVersionStoreResource",
    "LocalVersionStoreResource",
    "MlflowTrackingResource",
    "TorchrunLauncher",
    "TuningResource",
    "VersionStoreResource",
]
