"""The pods dagster-k8s's k8s_job_executor builds for our steps, through its own code.

No Kubernetes server runs here: the step handler is dagster-k8s's ``K8sStepHandler``, built from
the executor our definitions choose for ML_ASSETS_ENV=k8s, and the only thing replaced is the
Kubernetes client's batch API, which records the Job the handler would create. That Job is then
validated against the Kubernetes schemas and checked for what the training step needs.
"""

from pathlib import Path

import pytest
import yaml
from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository
from dagster._core.execution.api import create_execution_plan
from dagster._core.execution.context.system import PlanData, PlanOrchestrationContext
from dagster._core.execution.context_creation_job import create_context_free_log_manager
from dagster._core.execution.retries import RetryMode
from dagster._core.executor.init import InitExecutorContext
from dagster._core.executor.step_delegating.step_handler.base import StepHandlerContext
from dagster._core.system_config.objects import ResolvedRunConfig
from dagster._core.test_utils import create_run_for_test, environ, instance_for_test
from dagster._grpc.types import ExecuteStepArgs
from kubernetes.client import ApiClient

from ml_assets.definitions import build_definitions
from ml_assets.deploy.k8s.pods import K8sConfigError, TrainingDefaults
from ml_assets.settings import load_settings
from ml_assets_tests.helpers import spec_data
from ml_assets_tests.k8s.conftest import assert_restricted, validate

GPU_NODES = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
GPU_TAINT = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


class RecordingBatchApi:
    """Stands in for the Kubernetes API server only: keeps the Job the step handler submits."""

    def __init__(self):
        self.jobs = []

    def create_namespaced_job(self, body, namespace, **_):
        self.jobs.append((namespace, body))


@pytest.fixture
def k8s_env(tmp_path, kubeconfig_file):
    models = tmp_path / "models"
    models.mkdir()
    spec = spec_data()
    spec["training"].update(gpus_per_node=4, pod={"cpu": "16", "memory": "96Gi", "shm_size": "32Gi",
                                                  "node_selector": {"ml-assets/pool": "a100"}})
    (models / "flights_delay.yaml").write_text(yaml.safe_dump(spec))
    env = {"ML_ASSETS_ENV": "k8s", "ML_ASSETS_HOME": str(tmp_path / "home"), "ML_ASSETS_MODELS_DIR": str(models),
           "MLFLOW_TRACKING_URI": "http://ml-assets-mlflow:5000", "ML_ASSETS_ARTIFACTS_URL": "s3://ml/artifacts",
           "ML_ASSETS_CHECKPOINTS_URL": "s3://ml/checkpoints", "ML_ASSETS_VERSION_STORE": "lakefs",
           "ML_ASSETS_OPTUNA_STORAGE": "postgresql+psycopg://optuna@db.example/optuna",
           "LAKEFS_ENDPOINT": "http://lakefs.lakefs:8000", "LAKEFS_STORAGE_NAMESPACE": "s3://ml/lakefs",
           "LAKEFS_ACCESS_KEY_ID": "from-the-secret", "LAKEFS_SECRET_ACCESS_KEY": "from-the-secret",
           "ML_ASSETS_K8S_TRAINING_DEFAULTS": '{"node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},'
                                              ' "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",'
                                              ' "effect": "NoSchedule"}]}'}
    with environ(env):
        yield env


OVERLAY = Path(__file__).resolve().parents[2] / "helm" / "dagster-values.yaml"


def run_launcher_config(kubeconfig_file: str, job_image: str) -> dict:
    """helm/dagster-values.yaml's runLauncher values as the K8sRunLauncher config the official chart
    writes into the instance's dagster.yaml (its helpers/instance/_run-launcher.tpl: names of env
    ConfigMaps and Secrets, runK8sConfig's sections in snake case). The chart's own fixed entries
    (service account, instance ConfigMap, PostgreSQL secret) are filled in as it would."""
    values = yaml.safe_load(OVERLAY.read_text())["runLauncher"]["config"]["k8sRunLauncher"]
    sections = {"containerConfig": "container_config", "podSpecConfig": "pod_spec_config",
                "podTemplateSpecMetadata": "pod_template_spec_metadata", "jobSpecConfig": "job_spec_config",
                "jobMetadata": "job_metadata"}
    return {
        "service_account_name": "dagster", "instance_config_map": "dagster-instance",
        "postgres_password_secret": "dagster-postgresql-secret", "dagster_home": "/opt/dagster/dagster_home",
        "job_namespace": "ml", "load_incluster_config": False, "kubeconfig_file": kubeconfig_file,
        "job_image": job_image, "image_pull_policy": values["imagePullPolicy"],
        "env_config_maps": [c["name"] for c in values["envConfigMaps"]],
        "env_secrets": [s["name"] for s in values["envSecrets"]],
        "resources": values["resources"], "security_context": values["securityContext"],
        "run_k8s_config": {sections[k]: v for k, v in values["runK8sConfig"].items()},
    }


def _step_job(kubeconfig_file, job_name: str, step_key: str) -> dict:
    """The Job dagster-k8s's step handler submits for ``step_key`` of ``job_name`` (as a manifest)."""
    recon_repo = ReconstructableRepository.for_module("ml_assets", "code_location", working_directory=None)
    recon_job = ReconstructableJob(recon_repo, job_name)
    job_def = build_definitions().resolve_job_def(job_name)
    launcher = {"module": "dagster_k8s", "class": "K8sRunLauncher",
                "config": run_launcher_config(kubeconfig_file, job_image="registry.example/ml-assets:0.1.0")}
    with instance_for_test(overrides={"run_launcher": launcher}) as instance:
        run = create_run_for_test(instance, job_name=job_name, job_code_origin=recon_job.get_python_origin(),
                                  tags={"dagster/partition": "2013-02-01"})
        # The executor exactly as a run of this job resolves it (the definitions' .configured(...) config).
        executor_config = ResolvedRunConfig.build(job_def, {}).execution.execution_engine_config
        executor = job_def.executor_def.executor_creation_fn(InitExecutorContext(
            job=recon_job, executor_def=job_def.executor_def, executor_config=executor_config, instance=instance))
        batch = RecordingBatchApi()
        handler = executor._step_handler  # noqa: SLF001 - the handler the executor would launch steps with
        handler._api_client.batch_api = batch  # noqa: SLF001
        plan = create_execution_plan(job_def, run_config={}, tags=run.tags)
        plan_context = PlanOrchestrationContext(
            plan_data=PlanData(job=recon_job, dagster_run=run, instance=instance, execution_plan=plan,
                               raise_on_error=True, retry_mode=RetryMode.DISABLED),
            log_manager=create_context_free_log_manager(instance, run), executor=executor, output_capture=None)
        list(handler.launch_step(StepHandlerContext(
            instance=instance, plan_context=plan_context, steps=plan.steps,
            execute_step_args=ExecuteStepArgs(recon_job.get_python_origin(), run.run_id, [step_key]))))
    assert len(batch.jobs) == 1
    namespace, body = batch.jobs[0]
    assert namespace == "ml"
    return ApiClient().sanitize_for_serialization(body)


def test_the_training_step_pod_has_the_specs_gpus_shm_and_placement(k8s_env, kubeconfig_file):
    job = _step_job(kubeconfig_file, "flights_delay_daily", "flights_delay__trained_checkpoint")
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert_restricted(pod, "training step pod")
    container = pod["containers"][0]
    assert container["image"] == "registry.example/ml-assets:0.1.0"
    assert container["args"][:3] == ["dagster", "api", "execute_step"]
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "4"
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == "96Gi"
    assert resources["requests"]["cpu"] == "16"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # The spec's node selector on top of the chart's; the chart's tolerations (the spec gives none).
    assert pod["nodeSelector"] == {**GPU_NODES, "ml-assets/pool": "a100"}
    assert pod["tolerations"] == GPU_TAINT
    # The run launcher's environment reaches the step pod (settings and S3 credentials by reference).
    assert {"configMapRef": {"name": "ml-assets-env"}} in container["envFrom"]
    assert {"secretRef": {"name": "ml-assets-s3"}} in container["envFrom"]
    # Each volume once: the run launcher's, the executor's emptyDirs and the training step's /dev/shm
    # merged, not repeated; the specs' ConfigMap and our service account come from the run launcher.
    assert sorted(volumes) == sorted(v["name"] for v in pod["volumes"])
    assert volumes["models"]["configMap"] == {"name": "ml-assets-models", "optional": True}
    assert {"name": "models", "mountPath": "/etc/ml_assets/models", "readOnly": True} in container["volumeMounts"]
    assert pod["serviceAccountName"] == "ml-assets"


def test_other_step_pods_get_small_requests_and_no_gpu(k8s_env, kubeconfig_file):
    job = _step_job(kubeconfig_file, "flights_delay_daily", "flights_delay__features")
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert_restricted(pod, "features step pod")
    resources = pod["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert all(v["name"] != "dshm" for v in pod["volumes"])


def test_the_tuning_step_pod_only_launches_its_trial_worker_pods(k8s_env, kubeconfig_file):
    job = _step_job(kubeconfig_file, "flights_delay_tune", "flights_delay__hyperparameters")
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert_restricted(pod, "tuning step pod")
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"].get("limits", {})
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == "250m"


def test_multi_node_training_step_pod_only_launches_and_asks_for_no_gpu(k8s_env, kubeconfig_file, tmp_path):
    models = tmp_path / "models"
    spec = yaml.safe_load((models / "flights_delay.yaml").read_text())
    spec["training"]["nodes"] = 2
    (models / "flights_delay.yaml").write_text(yaml.safe_dump(spec))
    job = _step_job(kubeconfig_file, "flights_delay_daily", "flights_delay__trained_checkpoint")
    validate(job)
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in resources.get("limits", {})


def test_k8s_settings_name_what_is_wrong():
    base = {"ML_ASSETS_ENV": "k8s", "MLFLOW_TRACKING_URI": "http://mlflow:5000", "ML_ASSETS_VERSION_STORE": "lakefs",
            "ML_ASSETS_ARTIFACTS_URL": "s3://b/a", "ML_ASSETS_CHECKPOINTS_URL": "s3://b/c",
            "ML_ASSETS_OPTUNA_STORAGE": "postgresql+psycopg://optuna@db/optuna"}
    with pytest.raises(ValueError, match="ML_ASSETS_ENV=k8s needs MLFLOW_TRACKING_URI, ML_ASSETS_ARTIFACTS_URL, "
                       "ML_ASSETS_CHECKPOINTS_URL, ML_ASSETS_OPTUNA_STORAGE"):
        load_settings({"ML_ASSETS_ENV": "k8s"})
    with pytest.raises(ValueError, match="ML_ASSETS_ENV=k8s needs ML_ASSETS_VERSION_STORE=lakefs"):
        load_settings({**base, "ML_ASSETS_VERSION_STORE": "local"})
    with pytest.raises(ValueError, match="ML_ASSETS_K8S_TRAINING_DEFAULTS: not JSON"):
        load_settings({**base, "ML_ASSETS_K8S_TRAINING_DEFAULTS": "{node_selector"})
    settings = load_settings({**base, "ML_ASSETS_K8S_TRAINING_DEFAULTS": '{"tolerations": [{"operator": "Sometimes"}]}'})
    with pytest.raises(K8sConfigError, match=r"ML_ASSETS_K8S_TRAINING_DEFAULTS: tolerations\.0\.operator"):
        TrainingDefaults.parse(settings.k8s_training_defaults)


def test_on_kubernetes_torchrun_runs_one_process_per_gpu():
    from ml_assets.spec import ModelSpec
    from ml_assets.training.k8s_launch import KubernetesTorchrunLauncher

    raw = spec_data()
    launcher = KubernetesTorchrunLauncher(training_defaults='{"gpus_per_node": 8}')
    chart_default = ModelSpec.model_validate(raw)
    raw["training"]["gpus_per_node"] = 2
    own = ModelSpec.model_validate(raw)
    raw["training"]["gpus_per_node"] = 0
    cpu = ModelSpec.model_validate(raw)
    assert [launcher.processes(s) for s in (chart_default, own, cpu)] == [8, 2, cpu.training.processes_per_node]
    command = launcher.command("/tmp/train_config.json", launcher.processes(chart_default), 2)
    assert "--standalone" in command and "--nproc_per_node=8" in command
