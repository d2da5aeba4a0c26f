"""Multi-node training: the Indexed Job and headless Service validate, and the pods' own command,
run here as two processes with the rendezvous the manifests declare, trains to completion.

No cluster runs here, so this test plays kubelet and cluster DNS, and nothing else
(ml_assets_tests/k8s/kubelet.py). The command, its arguments and the rendezvous are the manifest's. Pod 0's stderr is read as the step reads the pod's log, into a real Dagster Pipes
session of a real materialization.
"""

import subprocess

import dagster as dg
import pytest
from dagster._core.pipes.utils import extract_message_or_forward_to_stdout
from dagster_k8s.pipes import PipesK8sPodLogsMessageReader

from ml_assets.deploy.k8s.pods import TrainingDefaults
from ml_assets.spec import ModelSpec
from ml_assets.training.k8s_job import job_name, training_job_manifests
from ml_assets_tests.helpers import cli_env, listen_port, model_spec
from ml_assets_tests.k8s.conftest import assert_restricted, validate
from ml_assets_tests.k8s.kubelet import loopback_dns, pod_command, pod_env
from ml_assets_tests.trainer.toy import toy_data, write_config

pytestmark = pytest.mark.torchrun

NODES = 2


def _manifests(spec: ModelSpec, config_uri: str, env=None):
    return training_job_manifests(
        spec, TrainingDefaults(), name=job_name(spec.name, "0123456789abcdef", 0), namespace="ml",
        image="registry.example/ml-assets:0.1.0", config_uri=config_uri, env=env,
        env_from=[{"configMapRef": {"name": "ml-assets-env"}}, {"secretRef": {"name": "ml-assets-s3"}}])


def test_the_indexed_job_and_its_service_validate_and_agree():
    spec = model_spec(training=dict(nodes=4, gpus_per_node=8, pod={"shm_size": "64Gi", "node_selector": {"pool": "h100"}}))
    service, job = _manifests(spec, "s3://ml/checkpoints/flights_delay/date=2013-02-01/run/train_config.json")
    validate(service)
    validate(job)
    name = job["metadata"]["name"]
    assert len(name) <= 52 and service["metadata"]["name"] == name
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["backoffLimit"] == 0  # a lost pod fails the attempt; Dagster's retry resumes
    pod = job["spec"]["template"]["spec"]
    assert_restricted(pod, "training Job pod")
    assert pod["subdomain"] == name and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["publishNotReadyAddresses"] is True
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "--nproc-per-node=8" in container["args"] and "--nnodes=4" in container["args"]
    assert f"--rdzv-endpoint={name}-0.{name}:29400" in container["args"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
    assert pod["nodeSelector"] == {"pool": "h100"}
    assert pod["automountServiceAccountToken"] is False


def test_the_pods_command_trains_on_two_nodes_over_the_declared_rendezvous(tmp_path):
    port = listen_port()
    spec = model_spec(training=dict(nodes=NODES, processes_per_node=1, max_restarts=0, pod={"rendezvous_port": port}))
    data = toy_data(tmp_path / "data")
    config_path = tmp_path / "run" / "train_config.json"
    config_path.parent.mkdir()
    write_config(config_path, data, output_dir=str(tmp_path / "run"), epochs=2, batch_size=128, hidden_sizes=[16],
                 checkpoint_every_seconds=0)
    outputs: dict[int, subprocess.CompletedProcess] = {}

    @dg.asset
    def multi_node_training(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        reader = PipesK8sPodLogsMessageReader()  # the reader the launcher streams pod 0's log into
        with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                                   message_reader=reader) as session:
            pipes_env = [{"name": k, "value": v} for k, v in session.get_bootstrap_env_vars().items()]
            service, job = _manifests(spec, f"file://{config_path}", env=pipes_env)
            validate(job)
            name = job["metadata"]["name"]
            container = job["spec"]["template"]["spec"]["containers"][0]
            dns = loopback_dns(name, service["metadata"]["name"], NODES)
            pods = []
            for index in range(NODES):
                env = pod_env(container, index, f"{name}-{index}", tmp_path / f"home-{index}")
                pods.append(subprocess.Popen(pod_command(container, env, dns), text=True,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             env=cli_env(**env)))
            for index, pod in enumerate(pods):
                out, err = pod.communicate(timeout=480)
                outputs[index] = subprocess.CompletedProcess(pod.args, pod.returncode, out, err)
            for line in outputs[0].stderr.splitlines():  # pod 0's log, as the launcher streams it
                extract_message_or_forward_to_stdout(session.message_handler, line)
        result = next(r for r in session.get_results() if isinstance(r, dg.MaterializeResult))
        return result

    with dg.instance_for_test() as instance:
        run = dg.materialize([multi_node_training], instance=instance, raise_on_error=False)
    for index, out in outputs.items():
        assert out.returncode == 0, f"pod {index} exited {out.returncode}:\n{out.stderr[-3000:]}"
    assert run.success
    meta = run.asset_materializations_for_node("multi_node_training")[0].metadata
    assert meta["world_size"].value == NODES  # one process on each of two nodes, one DDP group
    assert meta["stop_reason"].value == "2 epochs"
    assert (tmp_path / "run").joinpath("report.json").exists()
    # Only pod 0 hosts global rank 0: pod 1 says nothing to Dagster.
    assert '"__dagster_pipes_version"' not in outputs[1].stderr
