"""The resources every stage shares (version store, tracking, artifacts, links), chosen per
environment in ml_assets.platform. A stage's own resource lives with it: the training launcher in
ml_assets.training.launcher, the tuning workers in ml_assets.tuning.resource."""

from ml_assets.resources.artifacts import ArtifactStoreResource, CheckpointStoreResource
from ml_assets.resources.links import DagsterLinksResource
from ml_assets.resources.tracking import MlflowTrackingResource
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
    "VersionStoreResource",
]
