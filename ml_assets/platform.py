"""What every model's assets share, chosen per environment from the settings: the resources (version
store, artifact and checkpoint stores, MLflow, the training launcher, tuning storage, run links)
and how a run executes its steps.

Two ways in. This repository's code location (``-m ml_assets``, ml_assets.definitions) sets them once
for all its models. In a Dagster project, each ``ModelComponent`` brings them with its model: the
resources come from ``shared_resources``, the same objects for every model of a process (Dagster
merges definitions that share a resource key only when it is the very same object), and the model's
jobs carry the executor, so the project's own default executor and assets stay as they were.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import dagster as dg

from ml_assets.resources import (
    ArtifactStoreResource,
    CheckpointStoreResource,
    DagsterLinksResource,
    LakeFSVersionStoreResource,
    LocalVersionStoreResource,
    MlflowTrackingResource,
    VersionStoreResource,
)
from ml_assets.settings import LAKEFS_VARIABLES, Settings, public_url
from ml_assets.training.launcher import TorchrunLauncher
from ml_assets.tuning.resource import TuningResource

# What the multiprocess executor's fork server imports once per run, so that no step process pays
# for it again: the modules the stages import when they run, with their libraries (torch, mlflow,
# scikit-learn, pandera and scipy each take seconds to import). This repository's code location
# also builds its definitions there first (ml_assets.deploy.preload).
HEAVY_MODULES = ("ml_assets.validation.run", "scipy.stats", "ml_assets.trainer.data", "ml_assets.trainer.checkpoint",
                 "ml_assets.evaluation.report", "ml_assets.evaluation.plots", "ml_assets.registry",
                 "ml_assets.serving.pyfunc")
STEP_PRELOAD = ("ml_assets.deploy.preload", *HEAVY_MODULES)


def version_store_resource(settings: Settings) -> VersionStoreResource:
    if settings.version_store == "lakefs":
        endpoint, key, secret, namespace = (dg.EnvVar(name) for name in LAKEFS_VARIABLES)
        return LakeFSVersionStoreResource(
            endpoint=endpoint, access_key_id=key, secret_access_key=secret, storage_namespace=namespace
        )
    return LocalVersionStoreResource(root=str(settings.version_store_root), objects_url=settings.objects_url)


def tracking_resource(settings: Settings) -> MlflowTrackingResource:
    if settings.production:
        # The server owns the artifact store (--artifacts-destination) and proxies uploads, so no
        # process but the server needs S3 credentials for MLflow; the URL may carry a password.
        return MlflowTrackingResource(tracking_uri=dg.EnvVar("MLFLOW_TRACKING_URI"), artifact_root="",
                                      ui_url=public_url(settings.mlflow_tracking_uri))
    return MlflowTrackingResource(tracking_uri=settings.mlflow_tracking_uri,
                                  artifact_root=str(settings.mlflow_artifact_root))


def launcher_resource(settings: Settings) -> TorchrunLauncher:
    if settings.kubernetes:
        from ml_assets.training.k8s_launch import KubernetesTorchrunLauncher

        return KubernetesTorchrunLauncher(training_defaults=json.dumps(settings.k8s_training_defaults or {}))
    return TorchrunLauncher()


def tuning_resource(settings: Settings) -> TuningResource:
    # A PostgreSQL URL carries a password: it stays in the environment, never in config.
    storage = (dg.EnvVar("ML_ASSETS_OPTUNA_STORAGE") if os.environ.get("ML_ASSETS_OPTUNA_STORAGE")
               else settings.optuna_storage)
    if settings.kubernetes:  # trial workers are pods (ML_ASSETS_OPTUNA_STORAGE is required there)
        from ml_assets.tuning.k8s_job import KubernetesTuningResource

        return KubernetesTuningResource(storage_url=storage, workdir=str(settings.tuning_dir),
                                        job_store_url=settings.artifacts_location,
                                        training_defaults=json.dumps(settings.k8s_training_defaults or {}))
    return TuningResource(storage_url=storage, workdir=str(settings.tuning_dir))


def dagster_url() -> str:
    """The Dagster UI's public address, for the run links that records carry."""
    return public_url(os.environ.get("ML_ASSETS_DAGSTER_URL", "http://127.0.0.1:3000"))


def local_resources(settings: Settings) -> dict[str, dg.ConfigurableResource]:
    return {
        "version_store": version_store_resource(settings),
        "artifacts": ArtifactStoreResource(root=settings.artifacts_location),
        "checkpoints": CheckpointStoreResource(root=settings.checkpoints_location),
        "tracking": tracking_resource(settings),
        "launcher": launcher_resource(settings),
        "tuning_store": tuning_resource(settings),
        "links": DagsterLinksResource(base_url=dagster_url()),
    }


def step_executor(settings: Settings, specs: list | None = None,
                  preload: tuple[str, ...] = STEP_PRELOAD) -> dg.ExecutorDefinition:
    if settings.kubernetes:
        # Every step a Kubernetes Job (dagster-k8s); the training op's pod from its spec: GPUs,
        # /dev/shm, placement (ml_assets.deploy.k8s.pods). Image, namespace, service account and environment
        # come from the K8sRunLauncher's configuration (helm/dagster-values.yaml).
        from dagster_k8s import k8s_job_executor

        from ml_assets.deploy.k8s.pods import TrainingDefaults, executor_config

        defaults = TrainingDefaults.parse(settings.k8s_training_defaults)
        return k8s_job_executor.configured(executor_config(specs or [], defaults, settings.k8s_step_resources),
                                           name="k8s_training_executor")
    if settings.executor == "multiprocess":
        # One process per step (the `gpu` pool, step retries and a crash act per step), at most
        # ML_ASSETS_MAX_CONCURRENT_STEPS at once. Steps fork from a server that imported the heavy
        # libraries once per run (``preload``), instead of each spawning and importing them again.
        return dg.multiprocess_executor.configured(
            {"max_concurrent": settings.max_concurrent_steps,
             "start_method": {"forkserver": {"preload_modules": list(preload)}}})
    # The default: the run worker runs the steps in order. The graph is a line, the training step's
    # ranks are torchrun processes and tuning trials their own processes, so a process per step
    # would add its start-up and imports to every step and isolate nothing heavy.
    return dg.in_process_executor


_SHARED: dict[str, dict[str, dg.ConfigurableResource]] = {}


def _key(settings: Settings) -> str:
    return json.dumps(asdict(settings), sort_keys=True, default=str)


def shared_resources(settings: Settings) -> dict[str, dg.ConfigurableResource]:
    """The resources of ``settings``, the same objects on every call with equal settings (see the
    module's docstring)."""
    key = _key(settings)
    if key not in _SHARED:
        _SHARED[key] = local_resources(settings)
    return _SHARED[key]


def model_executor(settings: Settings, spec) -> dg.ExecutorDefinition:
    """The executor a model component's jobs run with: the settings' choice, for this model's steps."""
    return step_executor(settings, [spec], preload=HEAVY_MODULES)


def alert_sensors(settings: Settings, models: list[str]) -> list[dg.SensorDefinition]:
    """Production's run-failure alerts and lifecycle notifications of ``models`` (none locally)."""
    if not settings.production:
        return []
    from ml_assets.deploy.alerts.sensor import build_failure_alert_sensor, build_lifecycle_sensor
    from ml_assets.deploy.alerts.webhook import WEBHOOK_VARIABLE

    webhook = dg.EnvVar(WEBHOOK_VARIABLE)
    return [build_failure_alert_sensor(interval_seconds=settings.alert_interval_seconds, webhook=webhook),
            build_lifecycle_sensor(interval_seconds=settings.alert_interval_seconds, webhook=webhook, models=models)]


def model_definitions(spec, settings: Settings) -> dg.Definitions:
    """One model's definitions on its own: its assets, checks, jobs (with the executor), schedules
    and sensors, with the platform's resources. What a model component brings to its project, and
    what the CLI runs a model's jobs with."""
    from ml_assets.ingest import sources
    from ml_assets.model_files import check_team
    from ml_assets.pipeline.model import build_model_defs

    check_team(spec, settings)
    sources.use_cache(settings.home / "cache")
    model = build_model_defs(spec, executor=model_executor(settings, spec))
    return dg.Definitions.merge(model, dg.Definitions(resources=shared_resources(settings)))
