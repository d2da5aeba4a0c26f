"""Assembles the code location: one asset group per model spec, resources for the environment."""

import json
import os

import dagster as dg

from ml_assets import sources
from ml_assets.defs.model import build_model_defs
from ml_assets.deploy.alerts.sensor import build_failure_alert_sensor, build_lifecycle_sensor
from ml_assets.deploy.alerts.webhook import WEBHOOK_VARIABLE
from ml_assets.model_files import load_all_model_specs
from ml_assets.resources import (
    ArtifactStoreResource,
    CheckpointStoreResource,
    DagsterLinksResource,
    LakeFSVersionStoreResource,
    LocalVersionStoreResource,
    MlflowTrackingResource,
    TorchrunLauncher,
    TuningResource,
    VersionStoreResource,
)
from ml_assets.settings import LAKEFS_VARIABLES, Settings, load_settings, public_url

# What the production executor's fork server imports once per run, so that no step process pays for
# it again: the built definitions, then the modules the stages import when they run, with their
# libraries (torch, mlflow, scikit-learn, pandera and scipy each take seconds to import).
STEP_PRELOAD = ("ml_assets.deploy.preload", "ml_assets.validation.run", "scipy.stats", "ml_assets.trainer.data",
                "ml_assets.trainer.checkpoint", "ml_assets.evaluation.report", "ml_assets.evaluation.plots",
                "ml_assets.registry", "ml_assets.serving.pyfunc")


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
        from ml_assets.deploy.k8s.torchrun import KubernetesTorchrunLauncher

        return KubernetesTorchrunLauncher(training_defaults=json.dumps(settings.k8s_training_defaults or {}))
    return TorchrunLauncher()


def tuning_resource(settings: Settings) -> TuningResource:
    # A PostgreSQL URL carries a password: it stays in the environment, never in config.
    storage = (dg.EnvVar("ML_ASSETS_OPTUNA_STORAGE") if os.environ.get("ML_ASSETS_OPTUNA_STORAGE")
               else settings.optuna_storage)
    if settings.kubernetes:  # trial workers are pods (ML_ASSETS_OPTUNA_STORAGE is required there)
        from ml_assets.deploy.k8s.tuning import KubernetesTuningResource

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


def step_executor(settings: Settings, specs: list | None = None) -> dg.ExecutorDefinition:
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
        # ML_ASSETS_MAX_CONCURRENT_STEPS at once. Steps fork from a server that built the definitions
        # and imported the heavy libraries once per run (STEP_PRELOAD), instead of each spawning,
        # importing and building them again.
        return dg.multiprocess_executor.configured(
            {"max_concurrent": settings.max_concurrent_steps,
             "start_method": {"forkserver": {"preload_modules": list(STEP_PRELOAD)}}})
    # The default: the run worker runs the steps in order. The graph is a line, the training step's
    # ranks are torchrun processes and tuning trials their own processes, so a process per step
    # would add its start-up and imports to every step and isolate nothing heavy.
    return dg.in_process_executor


def build_definitions(settings: Settings | None = None) -> dg.Definitions:
    settings = settings or load_settings()
    sources.use_cache(settings.home / "cache")
    specs = load_all_model_specs(settings.models_dirs)  # <name>.yaml specs and <name>/defs.yaml components
    models = [build_model_defs(spec) for spec in specs]
    shared = dg.Definitions(resources=local_resources(settings), executor=step_executor(settings, specs),
                            sensors=[build_failure_alert_sensor(
                                interval_seconds=settings.alert_interval_seconds,
                                webhook=dg.EnvVar(WEBHOOK_VARIABLE)),
                                build_lifecycle_sensor(
                                interval_seconds=settings.alert_interval_seconds, webhook=dg.EnvVar(WEBHOOK_VARIABLE),
                                models=[spec.name for spec in specs])] if settings.production else [])
    return dg.Definitions.merge(*models, shared)
