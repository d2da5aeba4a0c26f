"""helm/ml-assets rendered by the real Helm engine (helm-python-sdk: Helm's Go SDK, no binary), each
manifest validated strictly against the Kubernetes schemas, the restricted Pod Security Standard
asserted on every pod, values.schema.json's refusals, and the chart's commands run for real."""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from ml_assets.deploy.k8s.pods import TrainingDefaults
from ml_assets.spec import load_specs
from ml_assets.training.k8s_job import job_name, training_job_manifests
from ml_assets_tests.helpers import cli_env, spec_data
from ml_assets_tests.k8s.conftest import assert_restricted, documents, pod_specs, validate

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "ml-assets"
EXAMPLES = ROOT / "helm" / "examples"
RELEASE, NAMESPACE = "ml-assets", "ml"


def _values(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / f"values-{name}.yaml").read_text())


def _multinode_values() -> dict:
    """values-multinode.yaml plus a spec given as its comment says (--set-file models.<file>=...)."""
    spec = spec_data()
    spec["training"].update(nodes=4, pod={"cpu": "90", "memory": "900Gi", "shm_size": "256Gi"})
    return {**_values("multinode"), "models": {"flights_delay.yaml": yaml.safe_dump(spec, sort_keys=False)}}


VALUES = {"default": lambda: _values("default"), "gpu": lambda: _values("gpu"), "multinode": _multinode_values}


def render(values: dict) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml") for doc in documents(text)]


def by_kind(manifests: list[dict], kind: str) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


@pytest.mark.parametrize("case", sorted(VALUES))
def test_the_chart_lints_clean(case):
    report = helm.lint(CHART, VALUES[case](), strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    findings = [m for m in report["messages"] if m["severity"] >= 2]
    assert findings == [], findings
    # helm lint's one remark is informational: the chart has no icon URL to point at yet.
    assert [m["error"] for m in report["messages"]] in ([], ["icon is recommended"])


@pytest.mark.parametrize("case", sorted(VALUES))
def test_every_manifest_validates_and_every_pod_is_restricted(case):
    manifests = render(VALUES[case]())
    kinds = sorted({m["kind"] for m in manifests})
    assert kinds == ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Role", "RoleBinding",
                     "Service", "ServiceAccount"]
    pods = 0
    for manifest in manifests:
        validate(manifest)
        for where, pod in pod_specs(manifest):
            assert_restricted(pod, where)
            pods += 1
            for container in pod["containers"]:
                assert container["image"] == "registry.example.com/ml-assets:0.1.0"
                assert container["resources"]["limits"], f"{where}: limits"
    assert pods == 2  # code server and MLflow
    # The chart holds no credential: no Secret objects, and Secrets are only referenced.
    assert "Secret" not in kinds
    text = json.dumps(manifests)
    assert not re.search(r"(?i)(password|secret_access_key|token)\"\s*:\s*\"[^\"]", text)


def test_the_code_server_is_reached_only_by_dagsters_webserver_and_daemon():
    manifests = render(VALUES["default"]())
    policies = by_kind(manifests, "NetworkPolicy")
    code = policies[f"{RELEASE}-code-server"]["spec"]
    assert code["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "code-server"
    assert code["policyTypes"] == ["Ingress"]
    [rule] = code["ingress"]
    assert [p["podSelector"]["matchLabels"]["component"] for p in rule["from"]] == ["dagster-webserver", "dagster-daemon"]
    assert all(p["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "dagster" for p in rule["from"])
    assert all("namespaceSelector" not in p for p in rule["from"])  # this namespace only
    assert rule["ports"] == [{"protocol": "TCP", "port": 3030}]
    mlflow = policies[f"{RELEASE}-mlflow"]["spec"]
    assert mlflow["ingress"] == [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 5000}]}]
    # The code server's pods carry the labels the policy selects; only it and MLflow are covered.
    deployments = by_kind(manifests, "Deployment")
    labels = deployments[f"{RELEASE}-code-server"]["spec"]["template"]["metadata"]["labels"]
    assert code["podSelector"]["matchLabels"].items() <= labels.items()


def test_rbac_is_the_least_the_executor_and_training_launcher_need():
    manifests = render(VALUES["default"]())
    [role] = by_kind(manifests, "Role").values()
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("batch",), ("jobs",)): {"create", "get", "list", "delete"},
        (("batch",), ("jobs/status",)): {"get"},
        (("",), ("pods",)): {"get", "list", "delete"},
        (("",), ("pods/log",)): {"get"},
        (("",), ("events",)): {"list"},
        (("",), ("services",)): {"create", "delete"},
    }
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])
    [binding] = by_kind(manifests, "RoleBinding").values()
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    [account] = by_kind(manifests, "ServiceAccount").values()
    assert account["automountServiceAccountToken"] is False
    for deployment in by_kind(manifests, "Deployment").values():  # neither calls the API
        assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_mlflow_authenticates_and_its_clients_carry_the_platform_identity():
    """The server gets its authentication's secrets, the code server and (through the Dagster overlay)
    every run and step pod the platform's MLflow identity; neither gets the other's."""
    deployments = by_kind(render(VALUES["default"]()), "Deployment")
    [mlflow] = deployments[f"{RELEASE}-mlflow"]["spec"]["template"]["spec"]["containers"]
    [code] = deployments[f"{RELEASE}-code-server"]["spec"]["template"]["spec"]["containers"]
    assert mlflow["command"] == ["ml-assets", "mlflow-server"]  # which turns MLflow's basic-auth app on
    assert {"secretRef": {"name": "ml-assets-mlflow-auth"}} in mlflow["envFrom"]
    assert {"secretRef": {"name": "ml-assets-mlflow-platform"}} in code["envFrom"]
    assert "ml-assets-mlflow-platform" not in json.dumps(mlflow) and "ml-assets-mlflow-auth" not in json.dumps(code)
    overlay = yaml.safe_load((ROOT / "helm" / "dagster-values.yaml").read_text())
    secrets = [s["name"] for s in overlay["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"]]
    assert "ml-assets-mlflow-platform" in secrets and "ml-assets-mlflow-auth" not in secrets


def test_disruption_budgets_keep_the_code_server_up():
    manifests = render(VALUES["default"]())
    budgets = by_kind(manifests, "PodDisruptionBudget")
    assert budgets[f"{RELEASE}-code-server"]["spec"]["minAvailable"] == 1
    # One MLflow replica: its budget may not block node drains.
    assert budgets[f"{RELEASE}-mlflow"]["spec"]["maxUnavailable"] == 1


def test_gpu_values_reach_the_training_defaults_and_multinode_specs_the_configmap():
    gpu = by_kind(render(VALUES["gpu"]()), "ConfigMap")[f"{RELEASE}-env"]["data"]
    defaults = TrainingDefaults.parse(json.loads(gpu["ML_ASSETS_K8S_TRAINING_DEFAULTS"]))
    assert defaults.gpus_per_node == 1 and defaults.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert "ML_ASSETS_MODELS_DIR" not in gpu  # no specs given: the image's bundled ones

    manifests = render(VALUES["multinode"]())
    configmaps = by_kind(manifests, "ConfigMap")
    env = configmaps[f"{RELEASE}-env"]["data"]
    assert env["ML_ASSETS_MODELS_DIR"] == "/etc/ml_assets/models"
    code_server = by_kind(manifests, "Deployment")[f"{RELEASE}-code-server"]["spec"]["template"]["spec"]
    assert {"name": "models", "configMap": {"name": f"{RELEASE}-models"}} in code_server["volumes"]


def test_the_multinode_spec_from_the_chart_becomes_a_valid_indexed_job(tmp_path):
    """The chart's models ConfigMap and training defaults, read by our own loader, make the Indexed
    Job the training launcher would create, and it validates."""
    manifests = render(VALUES["multinode"]())
    configmaps = by_kind(manifests, "ConfigMap")
    for file, text in configmaps[f"{RELEASE}-models"]["data"].items():
        (tmp_path / file).write_text(text)
    [spec] = load_specs(tmp_path)
    defaults = TrainingDefaults.parse(json.loads(configmaps[f"{RELEASE}-env"]["data"]["ML_ASSETS_K8S_TRAINING_DEFAULTS"]))
    service, job = training_job_manifests(
        spec, defaults, name=job_name(spec.name, "4f1c2a9e77d0", 1), namespace=NAMESPACE,
        image="registry.example.com/ml-assets:0.1.0", config_uri="s3://ml-assets/checkpoints/x/train_config.json",
        env_from=[{"configMapRef": {"name": f"{RELEASE}-env"}}])
    validate(service)
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert_restricted(pod, "training Job pod")
    assert job["spec"]["completions"] == 4
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "--nproc-per-node=8" in container["args"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.mark.parametrize(("change", "problem"), [
    (lambda v: v["training"].update(gpusPerNode=-1), "/training/gpusPerNode"),
    (lambda v: v["image"].pop("repository"), "/image"),
    (lambda v: v["image"].update(repository=""), "/image/repository"),
    (lambda v: v["training"].update(tolerations=[{"key": "gpu", "operator": "Sometimes"}]), "/training/tolerations/0/operator"),
    (lambda v: v.update(securityContext={**v.get("securityContext", {}), "allowPrivilegeEscalation": True,
                                         "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}),
     "/securityContext/allowPrivilegeEscalation"),
    (lambda v: v["storage"].update(checkpointsUrl="checkpoints"), "/storage/checkpointsUrl"),
    (lambda v: v.update(models={"../etc/passwd": "x"}), "invalid propertyName '../etc/passwd'"),
    (lambda v: v["codeServer"].update(replicas=0), "/codeServer/replicas"),
    (lambda v: v.update(stepResources={"requests": {"memory": "lots"}}), "/stepResources/requests/memory"),
    (lambda v: v.update(gpus=1), "gpus"),
    (lambda v: v["mlflow"].update(authSecret=""), "/mlflow/authSecret"),
    (lambda v: v.setdefault("secrets", {}).update(mlflowPlatform=""), "/secrets/mlflowPlatform"),
])
def test_the_values_schema_refuses_bad_values(change, problem):
    values = VALUES["gpu"]()
    values.setdefault("codeServer", {})
    change(values)
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as refused:
        chart.validate_schema(values)
    assert problem in str(refused.value)
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)  # `helm install` refuses them too
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_code_servers_command_and_probe_work(tmp_path):
    """The code server container's command and its readiness probe, from the rendered Deployment, run
    here with the environment the chart's ConfigMap gives (ML_ASSETS_ENV=k8s): the definitions load
    with the k8s executor and the probe answers."""
    manifests = render(VALUES["gpu"]())
    deployment = by_kind(manifests, "Deployment")[f"{RELEASE}-code-server"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = dict(by_kind(manifests, "ConfigMap")[f"{RELEASE}-env"]["data"])
    env.update({v["name"]: v["value"] for v in container["env"]})
    env["HOME"] = env["ML_ASSETS_HOME"] = str(tmp_path)  # the emptyDir mounted there
    env["DAGSTER_HOME"] = str(tmp_path)
    # What the referenced Secrets hold (the chart never does): the studies' database URL.
    env["ML_ASSETS_OPTUNA_STORAGE"] = "postgresql+psycopg://optuna@db.example/optuna"
    port = _free_port()

    def here(args: list[str]) -> list[str]:
        args = [a.replace(str(3030), str(port)) if a == "3030" else a for a in args]
        return [str(Path(sys.executable).parent / args[0]), *args[1:]]

    server = subprocess.Popen(here(container["command"] + container["args"]), env=cli_env(**env),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        probe = here(container["readinessProbe"]["exec"]["command"])
        deadline = time.monotonic() + 120
        while True:
            ok = subprocess.run(probe, env=cli_env(**env), capture_output=True, text=True)
            if ok.returncode == 0:
                break
            assert server.poll() is None, f"code server exited:\n{server.stdout.read()[-3000:]}"
            assert time.monotonic() < deadline, f"probe never passed: {ok.stdout} {ok.stderr}"
            time.sleep(1)
    finally:
        server.terminate()
        out = server.communicate(timeout=30)[0]
    assert "Started Dagster code server" in out, out[-2000:]
    assert os.environ.get("ML_ASSETS_ENV") != "k8s"  # the server's environment was its own


def test_the_render_script_a_reviewer_runs_checks_and_prints_the_manifests():
    ok = subprocess.run([sys.executable, str(ROOT / "helm" / "render.py"), str(EXAMPLES / "values-gpu.yaml")],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert len(documents(ok.stdout)) == len(render(VALUES["gpu"]()))
    refused = subprocess.run([sys.executable, str(ROOT / "helm" / "render.py"), str(EXAMPLES / "values-gpu.yaml"),
                              "/dev/stdin"],
                             input="training: {gpusPerNode: -2}\n", capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "/training/gpusPerNode" in refused.stderr
