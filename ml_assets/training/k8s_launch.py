"""The training launcher on Kubernetes (ML_ASSETS_ENV=k8s).

One node: the step's own pod has the GPUs (ml_assets.deploy.k8s.pods), and runs the same torchrun through
Dagster Pipes as locally, one process per GPU. Several nodes: the step pod creates the headless
Service and Indexed Job of ml_assets.training.k8s_job, streams pod 0's log (where global rank 0
writes its Pipes messages), waits for the Job, and deletes both whatever happens; the Job is owned by
the step pod, so Kubernetes removes it too if the step pod itself is deleted. A step *process* that
dies without deleting its Job leaves the pod (and so the Job) behind: the next attempt of the run
deletes such a Job before it starts its own, and waits until it is gone.
"""

from __future__ import annotations

import threading
import time

import dagster as dg

from ml_assets.deploy.k8s import api
from ml_assets.deploy.k8s.pods import TrainingDefaults, processes_per_node
from ml_assets.spec import ModelSpec
from ml_assets.training.k8s_job import (
    INDEX_ANNOTATION,
    JOB_LABEL,
    job_name,
    training_job_manifests,
)
from ml_assets.training.launcher import TorchrunLauncher, TrainingOutcome

# Conditions Kubernetes sets on a pod it is taking away (preemption, eviction, node drain, taint).
DISRUPTION_CONDITION = "DisruptionTarget"
# A container waiting for one of these will not start without someone changing something.
STUCK_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError")


class KubernetesTorchrunLauncher(TorchrunLauncher):
    """torchrun on Kubernetes: in the step pod for one node, as an Indexed Job for several."""

    training_defaults: str = "{}"
    """The chart's training values (ML_ASSETS_K8S_TRAINING_DEFAULTS) as JSON."""
    namespace: str | None = None
    """Where the training Job goes; default: the step pod's own namespace."""
    image: str | None = None
    """The training pods' image; default: the run's image (the code location's)."""
    kubeconfig_file: str | None = None
    """Talk to the cluster through this kubeconfig instead of the pod's service account (in-cluster)."""
    poll_seconds: float = 5.0
    pod_start_timeout_seconds: float = 1800.0
    """How long pod 0 may stay pending (a GPU node pool scaling up from zero) before the attempt fails."""

    @property
    def spreads_nodes(self) -> bool:
        return True

    def processes(self, spec: ModelSpec) -> int:
        return self.nproc_per_node or processes_per_node(spec, self.defaults())

    def defaults(self) -> TrainingDefaults:
        return TrainingDefaults.parse(self.training_defaults)

    def train(self, context: dg.AssetExecutionContext, spec: ModelSpec, config_path: str, output_dir: str) -> TrainingOutcome:
        if spec.training.nodes == 1:
            return self.run(context, config_path, self.processes(spec), spec.training.max_restarts)
        return self._train_indexed_job(context, spec, config_path, output_dir)

    # -- several nodes ------------------------------------------------------------------------------

    def _train_indexed_job(self, context, spec: ModelSpec, config_path: str, output_dir: str) -> TrainingOutcome:
        import fsspec
        from dagster_k8s.pipes import PipesK8sPodLogsMessageReader

        core, batch = api.clients(self.kubeconfig_file)
        namespace = self.namespace or api.current_namespace()
        me = api.this_pod(core, namespace)
        config_uri = f"{output_dir.rstrip('/')}/train_config.json"
        with open(config_path, "rb") as src, fsspec.open(config_uri, "wb") as dst:
            dst.write(src.read())
        name = job_name(spec.name, context.run_id, context.retry_number)
        self._end_earlier_attempts(core, batch, namespace, spec, context)
        defaults = self.defaults()
        reader = PipesK8sPodLogsMessageReader()
        with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                                   message_reader=reader) as session:
            pipes_env = [{"name": k, "value": v} for k, v in session.get_bootstrap_env_vars().items()]
            service, job = training_job_manifests(
                spec, defaults, name=name, namespace=namespace, image=self.image or api.run_image(context, me),
                config_uri=config_uri, labels={"dagster/run-id": context.run_id},
                env=[*api.inherited_env(me), *pipes_env], env_from=api.inherited_env_from(me),
                service_account=me.spec.service_account_name if me else None)
            if me is not None:
                service["metadata"]["ownerReferences"] = job["metadata"]["ownerReferences"] = api.owner_reference(me)
            try:
                core.create_namespaced_service(namespace, service)
                batch.create_namespaced_job(namespace, job)
                context.log.info(f"training: Indexed Job {namespace}/{name}, {spec.training.nodes} pods x "
                                 f"{self.processes(spec)} processes, rendezvous {name}-0.{name}")
                pod0 = self._wait_for_pod0(core, batch, namespace, name)
                logs = threading.Thread(target=reader.consume_pod_logs, daemon=True,
                                        args=(context, core, pod0, namespace))
                logs.start()
                succeeded, disrupted = self._wait_for_job(batch, core, namespace, name)
                logs.join(timeout=60)
            finally:
                api.delete_job_and_service(batch, core, namespace, name, context)
        results = session.get_results()
        result = next((r for r in results if isinstance(r, dg.MaterializeResult)), None)
        messages = list(session.get_custom_messages())
        if disrupted and not any(isinstance(m, dict) and m.get("kind") == "preempted" for m in messages):
            messages.append({"kind": "preempted", "signal": f"pod {disrupted} disrupted ({DISRUPTION_CONDITION})"})
        return TrainingOutcome(0 if succeeded else 1, result, messages)

    def _end_earlier_attempts(self, core, batch, namespace: str, spec: ModelSpec, context) -> None:
        """Delete this run's training Jobs of this and earlier attempts that are still there (a resumed
        run re-executes the step under the same attempt number, so the same name), and wait until
        they are gone: their ranks checkpoint on SIGTERM and release the checkpoint lease, which this
        attempt's rank 0 then takes and resumes from."""
        for attempt in range(context.retry_number + 1):
            name = job_name(spec.name, context.run_id, attempt)
            if not _job_exists(batch, namespace, name):
                continue
            context.log.warning(f"training Job {namespace}/{name} of an earlier attempt of this run is still there "
                                "(its step process died without deleting it): deleting it before training again")
            api.delete_job_and_service(batch, core, namespace, name, context)
            deadline = time.monotonic() + spec.training.checkpoint.preemption_grace_seconds + 60
            # The Job goes first (propagation Background), its pods after: wait for both, so that no
            # dying pod of it is taken for this attempt's (the same Job name, the same labels).
            while _job_exists(batch, namespace, name) or core.list_namespaced_pod(
                    namespace, label_selector=f"{JOB_LABEL}={name}").items:
                if time.monotonic() > deadline:
                    raise dg.Failure(f"training Job {namespace}/{name} of an earlier attempt is still being deleted "
                                     f"(`kubectl describe job -n {namespace} {name}`)")
                time.sleep(self.poll_seconds)

    def _wait_for_pod0(self, core, batch, namespace: str, name: str) -> str:
        """Pod 0's name once its container started; fails fast on what will not fix itself."""
        deadline = time.monotonic() + self.pod_start_timeout_seconds
        selector = f"{JOB_LABEL}={name},{INDEX_ANNOTATION}=0"
        while time.monotonic() < deadline:
            for pod in core.list_namespaced_pod(namespace, label_selector=selector).items:
                if pod.status.phase in ("Running", "Succeeded", "Failed"):
                    return pod.metadata.name
                for status in pod.status.container_statuses or []:
                    waiting = status.state.waiting if status.state else None
                    if waiting is not None and waiting.reason in STUCK_REASONS:
                        raise dg.Failure(f"training Job {namespace}/{name}: pod {pod.metadata.name} cannot start: "
                                         f"{waiting.reason}: {waiting.message or ''}", allow_retries=False)
            if api.finished(batch.read_namespaced_job_status(name, namespace).status, "Failed"):
                raise dg.Failure(f"training Job {namespace}/{name} failed before pod 0 started "
                                 f"(`kubectl describe job -n {namespace} {name}`)")
            time.sleep(self.poll_seconds)
        raise dg.Failure(f"training Job {namespace}/{name}: pod 0 did not start within "
                         f"{self.pod_start_timeout_seconds:.0f} s (GPUs available? `kubectl describe pod -n {namespace} -l {selector}`)")

    def _wait_for_job(self, batch, core, namespace: str, name: str) -> tuple[bool, str | None]:
        """(succeeded, name of a pod Kubernetes took away or None) once the Job is finished."""
        while True:
            status = batch.read_namespaced_job_status(name, namespace).status
            if api.finished(status, "Complete"):
                return True, None
            if api.finished(status, "Failed"):
                for pod in core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}").items:
                    if any(c.type == DISRUPTION_CONDITION and c.status == "True" for c in pod.status.conditions or []):
                        return False, pod.metadata.name
                return False, None
            time.sleep(self.poll_seconds)


def _job_exists(batch, namespace: str, name: str) -> bool:
    import kubernetes

    try:
        batch.read_namespaced_job_status(name, namespace)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
