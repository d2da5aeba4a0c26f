"""What every pod of a run looks like on Kubernetes, as dagster-k8s configuration.

dagster-k8s applies ``dagster-k8s/config`` run tags to the run pod only; step pods take the
``k8s_job_executor``'s own config (``step_k8s_config``, every step) and its per-op overrides
(``per_step_k8s_config``) or op tags. We use the executor config: the training op's pod is built from
the spec here, in one place, and the asset definitions (and their code versions) stay the same in
every environment.

Every pod meets the Pod Security Standard "restricted": non-root user 10001, no privilege
escalation, all capabilities dropped, seccomp RuntimeDefault, a read-only root filesystem with
emptyDirs where the processes write (/tmp, the home, /dev/shm for the trainer).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ml_assets.spec import ModelSpec, TolerationSpec, TrainingPodSpec

RUN_AS = 10001
HOME = "/var/lib/ml_assets"  # ML_ASSETS_HOME in the image; an emptyDir in every pod
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_STEP_RESOURCES = {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}

POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT = {
    "runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}
# The root filesystem is read-only: these are the only places a step writes (Dagster's temporary
# files, the trainer's config, MLflow's and matplotlib's caches under HOME).
WRITABLE_VOLUMES = [{"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}},
                    {"name": "home", "emptyDir": {"sizeLimit": "4Gi"}}]
WRITABLE_MOUNTS = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "home", "mountPath": HOME}]


class K8sConfigError(ValueError):
    """Kubernetes settings that cannot be used; the message names the variable or spec field."""


class TrainingDefaults(BaseModel):
    """The chart's ``training`` values (ML_ASSETS_K8S_TRAINING_DEFAULTS): cluster-wide placement of the
    training pods, under each spec's own ``training.pod``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    node_selector: dict[str, str] = {}
    tolerations: list[TolerationSpec] = []
    gpu_resource: str = Field(default=GPU_RESOURCE, pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$")
    gpus_per_node: int = Field(default=0, ge=0, le=16, description="for specs that leave training.gpus_per_node unset")

    @classmethod
    def parse(cls, raw: dict | str | None) -> TrainingDefaults:
        """From the settings' dict or the launchers' JSON config field."""
        try:
            return cls.model_validate_json(raw or "{}") if isinstance(raw, str) else cls.model_validate(raw or {})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise K8sConfigError(f"ML_ASSETS_K8S_TRAINING_DEFAULTS: {problems}") from None


def gpus_per_node(spec: ModelSpec, defaults: TrainingDefaults) -> int:
    """The spec's GPUs per training pod, or the chart's when the spec leaves it unset."""
    gpus = spec.training.gpus_per_node
    return defaults.gpus_per_node if gpus is None else gpus


def processes_per_node(spec: ModelSpec, defaults: TrainingDefaults) -> int:
    """torchrun's --nproc_per_node on Kubernetes: one process per GPU, else the spec's CPU processes."""
    return gpus_per_node(spec, defaults) or spec.training.processes_per_node


def step_k8s_config(step_resources: dict | None = None) -> dict[str, Any]:
    """Every step pod: small requests, the restricted security context, writable emptyDirs."""
    return {
        "container_config": {
            "resources": step_resources or DEFAULT_STEP_RESOURCES,
            "security_context": CONTAINER_SECURITY_CONTEXT,
            "volume_mounts": WRITABLE_MOUNTS,
            "env": [{"name": "ML_ASSETS_HOME", "value": HOME}, {"name": "HOME", "value": HOME}],
        },
        "pod_spec_config": {
            "security_context": POD_SECURITY_CONTEXT,
            "volumes": WRITABLE_VOLUMES,
            "automount_service_account_token": True,  # the executor and the training launcher call the API
        },
    }


def training_placement(pod: TrainingPodSpec, defaults: TrainingDefaults) -> dict[str, Any]:
    """Node selector and tolerations of a training pod: the chart's defaults, the spec's on top."""
    tolerations = pod.tolerations or defaults.tolerations
    out: dict[str, Any] = {}
    selector = {**defaults.node_selector, **pod.node_selector}
    if selector:
        out["nodeSelector"] = selector
    if tolerations:
        out["tolerations"] = [t.manifest() for t in tolerations]
    return out


def training_resources(spec: ModelSpec, defaults: TrainingDefaults, gpus: int | None = None) -> dict[str, Any]:
    """A training-sized pod's requests and limits; ``gpus`` default: the spec's GPUs per node."""
    pod = spec.training.pod
    limits: dict[str, Any] = {"cpu": pod.cpu, "memory": pod.memory}
    gpus = gpus_per_node(spec, defaults) if gpus is None else gpus
    if gpus:
        limits[defaults.gpu_resource] = str(gpus)  # extended resources: limits only
    return {"requests": {"cpu": pod.cpu, "memory": pod.memory}, "limits": limits}


SHM_VOLUME = "dshm"


def shm_volume(pod: TrainingPodSpec) -> dict[str, Any]:
    """A memory-backed /dev/shm: the container runtime's default is 64 MiB, too small for DataLoader
    workers' shared tensors and NCCL."""
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": pod.shm_size}}


def training_step_k8s_config(spec: ModelSpec, defaults: TrainingDefaults, *, launches_only: bool | None = None) -> dict[str, Any]:
    """The training step's pod (per_step_k8s_config of its op), merged by dagster-k8s over
    :func:`step_k8s_config`: the spec's GPUs as ``nvidia.com/gpu`` limits, /dev/shm, placement.

    With nodes > 1 this pod only launches and watches the Indexed Job (ml_assets.training.k8s_launch), so it
    asks for no GPU itself."""
    pod = spec.training.pod
    single = not (spec.training.nodes > 1 if launches_only is None else launches_only)
    resources = training_resources(spec, defaults) if single else DEFAULT_STEP_RESOURCES
    config: dict[str, Any] = {
        "container_config": {
            "resources": resources,
            "volume_mounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}] if single else [],
        },
        "pod_spec_config": {"volumes": [shm_volume(pod)] if single else []},
        "pod_template_spec_metadata": {"labels": {"ml-assets/component": "training",
                                                  "ml-assets/model": spec.name}},
    }
    if single:
        config["pod_spec_config"].update(training_placement(pod, defaults))
    return config


def trainer_pod_spec(spec: ModelSpec, defaults: TrainingDefaults, container: dict[str, Any], *, restart_policy: str,
                     grace_seconds: int, env_from: list[dict] | None = None,
                     service_account: str | None = None) -> dict[str, Any]:
    """The pod spec of pods the launchers create (training nodes, trial workers): the restricted
    security context, the writable emptyDirs and /dev/shm, the spec's placement, no API token."""
    pod = spec.training.pod
    container = {
        **container,
        "env": [{"name": "ML_ASSETS_HOME", "value": HOME}, {"name": "HOME", "value": HOME},
                {"name": "PYTHONUNBUFFERED", "value": "1"}, *container.get("env", [])],
        "securityContext": CONTAINER_SECURITY_CONTEXT,
        "volumeMounts": [*WRITABLE_MOUNTS, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
    }
    if env_from:
        container["envFrom"] = env_from
    pod_spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "automountServiceAccountToken": False,  # they call no Kubernetes API
        "securityContext": POD_SECURITY_CONTEXT,
        "terminationGracePeriodSeconds": grace_seconds,
        "containers": [container],
        "volumes": [*WRITABLE_VOLUMES, shm_volume(pod)],
        **training_placement(pod, defaults),
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    return pod_spec


def training_op_name(spec: ModelSpec) -> str:
    """The op name Dagster gives the ``<model>/trained_checkpoint`` asset (per_step_k8s_config's key)."""
    return f"{spec.name}__trained_checkpoint"


def tuning_op_name(spec: ModelSpec) -> str:
    return f"{spec.name}__hyperparameters"


def executor_config(specs: list[ModelSpec], defaults: TrainingDefaults, step_resources: dict | None = None) -> dict:
    """The k8s_job_executor's config for the code location's specs. The tuning step's trial workers
    are pods of their own (ml_assets.tuning.k8s_job): its pod only launches them, like a multi-node
    training step's."""
    per_step = {}
    for spec in specs:
        per_step[training_op_name(spec)] = training_step_k8s_config(spec, defaults)
        per_step[tuning_op_name(spec)] = training_step_k8s_config(spec, defaults, launches_only=True)
    return {"step_k8s_config": step_k8s_config(step_resources), "per_step_k8s_config": per_step}


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def dns_label(text: str, max_length: int = 63) -> str:
    """``text`` as a DNS-1123 label (Kubernetes object names): lower case, [-a-z0-9], trimmed."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:max_length].rstrip("-")
    if not DNS_LABEL.match(label):
        raise K8sConfigError(f"cannot make a Kubernetes name of {text!r}")
    return label
