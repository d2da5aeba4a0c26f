"""What the launchers that create Kubernetes objects from a step pod share: the API client, the
step pod's own identity and environment (passed on by reference), and deleting what they made."""

from __future__ import annotations

import os
from typing import Any

import dagster as dg

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def clients(kubeconfig_file: str | None):
    """(CoreV1Api, BatchV1Api) through ``kubeconfig_file``, or the pod's service account (in-cluster)."""
    import kubernetes

    if kubeconfig_file:
        client = kubernetes.config.new_client_from_config(kubeconfig_file)
    else:
        kubernetes.config.load_incluster_config()
        client = kubernetes.client.ApiClient()
    return kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client)


def current_namespace() -> str:
    try:
        with open(NAMESPACE_FILE) as fh:
            return fh.read().strip()
    except OSError:
        return os.environ.get("POD_NAMESPACE", "default")


def this_pod(core, namespace: str):
    """The step's own pod (``HOSTNAME`` is its name), or None outside a pod."""
    name = os.environ.get("HOSTNAME")
    if not name:
        return None
    try:
        return core.read_namespaced_pod(name, namespace)
    except Exception:
        return None


def owner_reference(pod) -> list[dict[str, str]]:
    """Owned by the step pod: Kubernetes deletes the object with it, whatever becomes of the step."""
    return [{"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}]


def _main_container(pod):
    return pod.spec.containers[0] if pod is not None and pod.spec.containers else None


def inherited_env(pod) -> list[dict[str, Any]]:
    """The step pod's plain environment (settings, service locations) and its Secret references;
    Dagster's own variables and the home stay."""
    container = _main_container(pod)
    out = []
    for var in (container.env or []) if container else []:
        if var.name.startswith("DAGSTER_") or var.name in ("HOME", "ML_ASSETS_HOME"):
            continue
        if var.value_from is not None:
            ref = var.value_from.secret_key_ref
            if ref is None:
                continue
            out.append({"name": var.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
        else:
            out.append({"name": var.name, "value": var.value or ""})
    return out


def inherited_env_from(pod) -> list[dict[str, Any]]:
    """The ConfigMaps and Secrets the step pod's environment comes from (referenced, never copied)."""
    container = _main_container(pod)
    out = []
    for source in (container.env_from or []) if container else []:
        if source.config_map_ref is not None:
            out.append({"configMapRef": {"name": source.config_map_ref.name}})
        elif source.secret_ref is not None:
            out.append({"secretRef": {"name": source.secret_ref.name}})
    return out


def run_image(context, pod) -> str:
    """The run's image (the code location's), else the step pod's."""
    origin = context.dagster_run.job_code_origin
    image = origin.repository_origin.container_image if origin is not None else None
    container = _main_container(pod)
    image = image or (container.image if container is not None else None)
    if not image:
        raise dg.Failure("no image for the pods: set the launcher's image or run from the code location's image "
                         "(DAGSTER_CURRENT_IMAGE)", allow_retries=False)
    return image


def finished(status, kind: str) -> bool:
    """Whether a Job status has the final condition ``kind`` (Complete, Failed)."""
    return any(c.type == kind and c.status == "True" for c in status.conditions or [])


def delete_job_and_service(batch, core, namespace: str, name: str, context, service: bool = True) -> None:
    import kubernetes

    calls = [("Job", lambda: batch.delete_namespaced_job(name, namespace, propagation_policy="Background"))]
    if service:
        calls.append(("Service", lambda: core.delete_namespaced_service(name, namespace)))
    for what, call in calls:
        try:
            call()
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                context.log.warning(f"could not delete {what} {namespace}/{name} ({exc.status} {exc.reason}); "
                                    "its owner reference removes it with the step pod")
