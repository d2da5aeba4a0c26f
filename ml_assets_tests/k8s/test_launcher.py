"""The multi-node training launcher (ml_assets.training.k8s_launch) driving an Indexed Job through the
official Kubernetes client, against the API emulation of ml_assets_tests/k8s/apiserver.py (no
Kubernetes server can run here; the emulation runs the Job's pods as local processes). Real: the
client, the launcher, Dagster Pipes over pod 0's log through dagster-k8s's reader, torchrun and
the trainer on two "nodes"."""

import threading
import time

import dagster as dg
import pytest

from ml_assets.training.k8s_job import INDEX_ANNOTATION
from ml_assets.training.k8s_launch import KubernetesTorchrunLauncher
from ml_assets_tests.helpers import listen_port, model_spec
from ml_assets_tests.k8s.apiserver import FakeApiServer
from ml_assets_tests.trainer.toy import toy_data, write_config

pytestmark = pytest.mark.torchrun

STEP_POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "dagster-step-0a1b2c", "namespace": "ml", "uid": "7d0c9e2e-0000-4000-8000-00000000abcd",
                 "labels": {"dagster/op": "flights_delay__trained_checkpoint"}},
    "spec": {"serviceAccountName": "ml-assets", "containers": [{
        "name": "dagster", "image": "registry.example.com/ml-assets:0.1.0",
        "env": [{"name": "ML_ASSETS_ENV", "value": "k8s"}, {"name": "DAGSTER_RUN_JOB_NAME", "value": "daily"},
                {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "ml-assets-s3", "key": "k"}}}],
        "envFrom": [{"configMapRef": {"name": "ml-assets-env"}}, {"secretRef": {"name": "ml-assets-lakefs"}}]}]},
}


@pytest.fixture
def api(tmp_path, monkeypatch):
    (tmp_path / "api").mkdir()
    server = FakeApiServer(tmp_path / "api", STEP_POD)
    monkeypatch.setenv("HOSTNAME", STEP_POD["metadata"]["name"])  # how a pod knows its name
    yield server
    server.close()


def _train(api, tmp_path, epochs: int, during=None, before=None):
    spec = model_spec(training=dict(nodes=2, processes_per_node=1, max_restarts=0, pod={"rendezvous_port": listen_port()}))
    data = toy_data(tmp_path / "data")
    config = tmp_path / "train_config.json"
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    write_config(config, data, output_dir=str(output_dir), epochs=epochs, batch_size=64, hidden_sizes=[16],
                 checkpoint_every_seconds=0, checkpoint_every_steps=20)
    launcher = KubernetesTorchrunLauncher(namespace="ml", kubeconfig_file=api.kubeconfig(tmp_path / "kubeconfig", "ml"),
                                          poll_seconds=0.2, pod_start_timeout_seconds=60)
    outcome = {}

    @dg.asset
    def trained(context: dg.AssetExecutionContext):
        if before:
            before(context, spec, str(config))
        if during:
            threading.Thread(target=during, daemon=True).start()
        outcome["value"] = launcher.train(context, spec, str(config), str(output_dir))
        if outcome["value"].preempted is not None or outcome["value"].result is None:  # as trained_checkpoint does
            raise dg.Failure(f"not trained: {outcome['value'].preempted or outcome['value'].returncode}")
        return outcome["value"].result

    with dg.instance_for_test() as instance:
        result = dg.materialize([trained], instance=instance, raise_on_error=False)
        logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    # What each pod printed, for a failure's message: the step's log shows only what pod 0 reported.
    logs += [f"--- {log.name}:\n{log.read_text()[-3000:]}" for log in sorted(api.workdir.glob("*.log"))]
    return result, outcome["value"], output_dir, logs


def test_the_launcher_trains_on_an_indexed_job_streams_pod_0_and_deletes_what_it_made(api, tmp_path):
    result, outcome, output_dir, logs = _train(api, tmp_path, epochs=2)
    assert outcome.returncode == 0 and result.success, "\n".join(logs[-30:])
    meta = result.asset_materializations_for_node("trained")[0].metadata
    assert meta["world_size"].value == 2 and meta["stop_reason"].value == "2 epochs"
    # Created: a headless Service and an Indexed Job, both owned by the step pod; both deleted after.
    [(kind_a, name), (kind_b, name_b)] = api.deleted
    assert {kind_a, kind_b} == {"Job", "Service"} and name == name_b
    assert api.jobs == {} and api.services == {}
    assert (output_dir / "train_config.json").exists()  # what the pods read, kept beside the run
    # The trainer's log lines arrived through Pipes from pod 0's log.
    assert any("Indexed Job ml/" in line for line in logs)
    assert any("2 rank(s) on cpu" in line for line in logs), logs[-30:]
    # Owned by the step pod (Kubernetes deletes them with it), in the step pod's image, environment
    # and service account; Secrets referenced, never copied; Dagster's own variables not passed on.
    job, service = api.created["Job"], api.created["Service"]
    owner = {"apiVersion": "v1", "kind": "Pod", "name": STEP_POD["metadata"]["name"], "uid": STEP_POD["metadata"]["uid"]}
    assert job["metadata"]["ownerReferences"] == [owner] == service["metadata"]["ownerReferences"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/ml-assets:0.1.0"
    assert container["envFrom"] == STEP_POD["spec"]["containers"][0]["envFrom"]
    env = {e["name"]: e for e in container["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY",
                                            "valueFrom": {"secretKeyRef": {"name": "ml-assets-s3", "key": "k"}}}
    assert "DAGSTER_RUN_JOB_NAME" not in env and "DAGSTER_PIPES_CONTEXT" in env
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "ml-assets"
    # Every call the launcher made is one the chart's Role allows its service account.
    allowed = {(verb, group, resource) for rule in _chart_role()["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert api.requests and api.requests <= allowed, api.requests - allowed


def _chart_role() -> dict:
    from ml_assets_tests.k8s.test_chart import VALUES, by_kind, render

    [role] = by_kind(render(VALUES["default"]()), "Role").values()
    return role


def test_a_preempted_pod_fails_the_attempt_as_a_preemption_and_cleans_up(api, tmp_path):
    def preempt_pod_1():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = [p for p in api.pods.values() if p.manifest["metadata"]["labels"].get(INDEX_ANNOTATION) == "1"]
            logs0 = [p.log for p in api.pods.values() if p.manifest["metadata"]["labels"].get(INDEX_ANNOTATION) == "0"]
            if pods and logs0 and "epoch 1" in logs0[0].read_text(errors="replace"):
                api.preempt(pods[0].manifest["metadata"]["name"])
                return
            time.sleep(0.1)

    result, outcome, _, logs = _train(api, tmp_path, epochs=400, during=preempt_pod_1)
    assert not result.success
    assert outcome.preempted is not None, (outcome.messages, logs[-20:])
    assert outcome.returncode != 0
    # The pod the scheduler took away is what the launcher names (its DisruptionTarget condition),
    # or the trainer's own report when SIGTERM reached rank 0's side first; either way the retry resumes.
    assert any("checkpoint at step" in line for line in logs), logs[-20:]
    assert api.jobs == {} and api.services == {}


def test_a_job_left_by_a_dead_step_process_is_deleted_before_the_attempt_trains(api, tmp_path):
    """A resumed run re-executes the step under the same attempt number: the leftover Job has this
    attempt's very name, trains on the same checkpoints, and must be gone before the new one starts."""
    from ml_assets.deploy.k8s.pods import TrainingDefaults
    from ml_assets.training.k8s_job import job_name, training_job_manifests

    leftover = {}

    def leave_a_job(context, spec, config):
        name = leftover["name"] = job_name(spec.name, context.run_id, context.retry_number)
        _, job = training_job_manifests(spec, TrainingDefaults.parse("{}"), name=name, namespace="ml",
                                        image="registry.example.com/ml-assets:0.1.0", config_uri=config)
        api.start_job("ml", job)
        leftover["pods"] = [p.process for p in api.job_pods(name)]

    result, outcome, _, logs = _train(api, tmp_path, epochs=2, before=leave_a_job)
    assert result.success and outcome.returncode == 0, "\n".join(logs[-20:])
    assert any(f"training Job ml/{leftover['name']} of an earlier attempt" in line for line in logs)
    assert api.deleted[0] == ("Job", leftover["name"])  # deleted before the new Job was created
    assert all(process.poll() is not None for process in leftover["pods"])
