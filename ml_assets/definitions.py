"""Assembles the code location: one asset group per model spec, resources for the environment."""

import os

import dagster as dg

from ml_assets.defs import build_model_defs
from ml_assets.resources import (
    ArtifactStoreResource,
    CheckpointStoreResource,
    LakeFSVersionStoreResource,
    LocalVersionStoreResource,
    MlflowTrackingResource,
    TorchrunLauncher,
    TuningResource,
    VersionStoreResource,
)
from ml_assets.settings import LAKEFS_VARIABLES, Settings, load_settings
from ml_assets.spec import load_specs


def version_store_resource(settings: Settings) -> VersionStoreResource:
    if settings.version_store == "lakefs":
        endpoint, key, secret, namespace = (dg.EnvVar(name) for name in LAKEFS_VARIABLES)
        return LakeFSVersionStoreResource(
            endpoint=endpoint, access_key_id=key, secret_access_key=secret, storage_namespace=namespace
        )
    return LocalVersionStoreResource(root=str(settings.version_store_root))


def local_resources(settings: Settings) -> dict[str, dg.ConfigurableResource]:
    return {
        "version_store": version_store_resource(settings),
        "artifacts": ArtifactStoreResource(root=str(settings.artifacts_root)),
        "checkpoints": CheckpointStoreResource(root=str(settings.checkpoints_root)),
        "tracking": MlflowTrackingResource(
            tracking_uri=settings.mlflow_tracking_uri, artifact_root=str(settings.mlflow_artifact_root)
        ),
        "launcher": TorchrunLauncher(),
        "tuning_store": TuningResource(
            # A PostgreSQL URL carries a password: it stays in the environment, never in config.
            storage_url=dg.EnvVar("ML_ASSETS_OPTUNA_STORAGE") if os.environ.get("ML_ASSETS_OPTUNA_STORAGE")
            else settings.optuna_storage,
            workdir=str(settings.tuning_dir),
        ),
    }


def build_definitions(settings: Settings | None = None) -> dg.Definitions:
    settings = settings or load_settings()
    models = [build_model_defs(spec) for spec in load_specs(settings.models_dir)]
    # In-process locally: one process per run (definitions load once) and the cores stay free for
    # the torchrun ranks the training step starts.
    return dg.Definitions.merge(
        *models, dg.Definitions(resources=local_resources(settings), executor=dg.in_process_executor)
    )
