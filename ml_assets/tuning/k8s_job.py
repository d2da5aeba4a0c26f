"""Tuning on Kubernetes: the study's trial workers as pods of one Indexed Job.

Each pod runs ``python -m ml_assets.tuning.study <job.json URL>``, the same worker a local process
runs, against the study's PostgreSQL storage (the URL stays in the Secret: the job file in object
storage says ``env:ML_ASSETS_OPTUNA_STORAGE``). A pod that dies mid-trial stops that trial's
heartbeat; another worker fails it and runs it again (Optuna's RetryHeartbeatStaleTrialCallback),
and Kubernetes restarts the pod (``restartPolicy: OnFailure``). The hyperparameters step's own pod
only launches, waits and deletes the Job.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import dagster as dg

from ml_assets.deploy.k8s import api
from ml_assets.deploy.k8s.pods import (
    TrainingDefaults,
    dns_label,
    gpus_per_node,
    trainer_pod_spec,
    training_resources,
)
from ml_assets.spec import ModelSpec
from ml_assets.tuning.resource import TuningResource

STORAGE_VARIABLE = "ML_ASSETS_OPTUNA_STORAGE"
JOB_LABEL = "ml-assets/tuning-job"


def tuning_job_manifest(spec: ModelSpec, defaults: TrainingDefaults, *, name: str, namespace: str, image: str,
                        job_uri: str, workers: int, env: list[dict] | None = None,
                        env_from: list[dict] | None = None, service_account: str | None = None) -> dict[str, Any]:
    """The Indexed Job of ``workers`` trial-worker pods. Each pod is sized like a training pod, with
    one GPU per torchrun process of a trial when the model trains on GPUs."""
    gpus = spec.tuning.processes_per_trial if gpus_per_node(spec, defaults) else 0
    labels = {"app.kubernetes.io/name": "ml-assets", "app.kubernetes.io/component": "tuning",
              "ml-assets/component": "tuning", "ml-assets/model": spec.name, JOB_LABEL: name}
    container = {
        "name": "trial-worker", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "ml_assets.tuning.study"], "args": [job_uri], "env": env or [],
        "resources": training_resources(spec, defaults, gpus),
    }
    # A crashed worker comes back (OnFailure); the trial it was running is retried by heartbeat.
    pod_spec = trainer_pod_spec(spec, defaults, container, restart_policy="OnFailure", grace_seconds=30,
                                env_from=env_from, service_account=service_account)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"completionMode": "Indexed", "completions": workers, "parallelism": workers,
                 "backoffLimit": 2 * workers, "ttlSecondsAfterFinished": 3600,
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }


class KubernetesTuningResource(TuningResource):
    """Tuning studies on Kubernetes: trial workers are pods (see the module's docstring)."""

    job_store_url: str
    """Object storage the worker pods read the study's job file from (the artifacts URL)."""
    training_defaults: str = "{}"
    namespace: str | None = None
    kubeconfig_file: str | None = None
    image: str | None = None
    poll_seconds: float = 5.0

    def run_workers(self, context: dg.AssetExecutionContext, spec: ModelSpec, job, workers: int) -> list[int]:
        import fsspec

        core, batch = api.clients(self.kubeconfig_file)
        namespace = self.namespace or api.current_namespace()
        me = api.this_pod(core, namespace)
        # The pods read the storage URL from their Secret; the file in object storage holds no password.
        shared = dataclasses.replace(job, storage_url=f"env:{STORAGE_VARIABLE}")
        job_uri = f"{self.job_store_url.rstrip('/')}/tuning/{job.study_name}/job.json"
        with fsspec.open(job_uri, "w") as fh:
            fh.write(json.dumps(dataclasses.asdict(shared), indent=1, sort_keys=True))
        name = dns_label(f"{spec.name[:30]}-tune-{context.run_id[:8]}-{context.retry_number}", max_length=52)
        manifest = tuning_job_manifest(
            spec, TrainingDefaults.parse(self.training_defaults), name=name, namespace=namespace,
            image=self.image or api.run_image(context, me), job_uri=job_uri, workers=workers,
            env=api.inherited_env(me), env_from=api.inherited_env_from(me),
            service_account=me.spec.service_account_name if me else None)
        if me is not None:
            manifest["metadata"]["ownerReferences"] = api.owner_reference(me)
        try:
            batch.create_namespaced_job(namespace, manifest)
            context.log.info(f"hyperparameters: {workers} trial-worker pod(s) in Job {namespace}/{name}")
            while True:
                status = batch.read_namespaced_job_status(name, namespace).status
                if api.finished(status, "Complete"):
                    return [0] * workers
                if api.finished(status, "Failed"):
                    pods = core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}").items
                    context.log.warning(f"hyperparameters: Job {namespace}/{name} failed; pods: " + ", ".join(
                        f"{p.metadata.name} {p.status.phase}" for p in pods))
                    return [1] * workers
                time.sleep(self.poll_seconds)
        finally:
            api.delete_job_and_service(batch, core, namespace, name, context, service=False)
