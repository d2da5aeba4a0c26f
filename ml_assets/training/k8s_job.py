"""Multi-node training on Kubernetes: an Indexed Job of ``nodes`` pods and a headless Service.

Why an Indexed Job and not a Kubeflow TrainJob: it needs nothing installed in the cluster beyond
Kubernetes itself (batch/v1, GA since 1.24), the platform's service account can be granted exactly
what it needs (create/watch/delete Jobs and Services in one namespace), and the pods run the very
torchrun command a single node runs. A cluster with the Kubeflow Trainer gains its gang scheduling;
docs/kubernetes.md says how to swap it in.

Each pod ``i`` is ``<job>-<i>.<service>`` in cluster DNS (the Service is the pods' ``subdomain``) and
runs::

    torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d --rdzv-endpoint=<job>-0.<service>:PORT
             --rdzv-id=<job> --local-addr=<job>-$(NODE_INDEX).<service> -m ml_assets.trainer --config URI

c10d's rendezvous orders the nodes by their address (``--local-addr``), so pod 0 is node rank 0 and
hosts global rank 0: the only rank that talks to Dagster Pipes, on pod 0's stderr, which the step
reads as a log stream. The trainer's config lies in object storage beside the run's checkpoints.
"""

from __future__ import annotations

from typing import Any

from ml_assets.deploy.k8s.pods import (
    TrainingDefaults,
    dns_label,
    gpus_per_node,
    processes_per_node,
    trainer_pod_spec,
    training_resources,
)
from ml_assets.spec import ModelSpec

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOB_LABEL = "ml-assets/training-job"
CONTAINER = "trainer"


def job_name(model: str, run_id: str, attempt: int) -> str:
    """``<model>-train-<run>-<attempt>``: unique per step attempt, short enough that ``<name>-<index>``
    stays a valid pod hostname (63 characters)."""
    return dns_label(f"{model[:30]}-train-{run_id[:8]}-{attempt}", max_length=52)


def rendezvous_host(name: str, index: int) -> str:
    return f"{name}-{index}.{name}"


def torchrun_args(spec: ModelSpec, defaults: TrainingDefaults, name: str, config_uri: str) -> list[str]:
    training = spec.training
    port = training.pod.rendezvous_port
    return [
        f"--nnodes={training.nodes}", f"--nproc-per-node={processes_per_node(spec, defaults)}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous_host(name, 0)}:{port}", f"--rdzv-id={name}",
        # Pods start as nodes are found (a GPU pool may scale up from zero): wait for all of them.
        "--rdzv-conf=join_timeout=1800",
        f"--local-addr={name}-$(NODE_INDEX).{name}",
        f"--max-restarts={training.max_restarts}",
        "-m", "ml_assets.trainer", "--config", config_uri,
    ]


def training_job_manifests(
    spec: ModelSpec, defaults: TrainingDefaults, *, name: str, namespace: str, image: str, config_uri: str,
    labels: dict[str, str] | None = None, env: list[dict[str, Any]] | None = None,
    env_from: list[dict[str, Any]] | None = None, service_account: str | None = None,
    image_pull_policy: str = "IfNotPresent",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The headless Service and the Indexed Job of one multi-node training attempt, as manifests."""
    training = spec.training
    pod = training.pod
    labels = {"app.kubernetes.io/name": "ml-assets", "app.kubernetes.io/component": "training",
              "ml-assets/component": "training", "ml-assets/model": spec.name, JOB_LABEL: name, **(labels or {})}
    threads = "1" if gpus_per_node(spec, defaults) else None
    container: dict[str, Any] = {
        "name": CONTAINER, "image": image, "imagePullPolicy": image_pull_policy,
        # torchrun as the agent that names itself to its ranks (ml_assets.processes): the container's
        # first process, so nothing outlives it in the pod anyway.
        "command": ["python", "-m", "ml_assets.trainer.agent"],
        "args": torchrun_args(spec, defaults, name, config_uri),
        "env": [
            # The pod's index (0..nodes-1); torchrun's --local-addr names the pod by it.
            {"name": "NODE_INDEX",
             "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
            *([{"name": "OMP_NUM_THREADS", "value": threads}] if threads else []),
            *(env or []),
        ],
        "ports": [{"name": "rendezvous", "containerPort": pod.rendezvous_port, "protocol": "TCP"}],
        "resources": training_resources(spec, defaults),
    }
    pod_spec = trainer_pod_spec(
        spec, defaults, container, restart_policy="Never", env_from=env_from, service_account=service_account,
        # SIGTERM on preemption: the trainer checkpoints within its grace, then exits.
        grace_seconds=int(training.checkpoint.preemption_grace_seconds) + 30)
    pod_spec["subdomain"] = name  # <job>-<i>.<service> resolves to pod i
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: name},
            # DNS records exist before the pods are ready: the rendezvous is how they become ready.
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": pod.rendezvous_port, "targetPort": pod.rendezvous_port,
                       "protocol": "TCP"}],
        },
    }
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed", "completions": training.nodes, "parallelism": training.nodes,
            # A failed or preempted pod fails the attempt: Dagster's retry starts a new Job that
            # resumes from the last checkpoint in object storage (torchrun restarts crashed ranks in place).
            "backoffLimit": 0,
            "activeDeadlineSeconds": training.max_runtime_minutes * 60,
            "ttlSecondsAfterFinished": 3600,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    return service, job
