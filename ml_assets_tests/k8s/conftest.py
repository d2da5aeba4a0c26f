import kubernetes_validate
import pytest
import yaml

# The oldest Kubernetes release docs/kubernetes.md supports, and the newest kubernetes-validate knows.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def validate(manifest: dict) -> None:
    """Strict validation against the Kubernetes schemas (unknown fields are errors too), per version."""
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


def assert_restricted(pod_spec: dict, where: str) -> None:
    """The Pod Security Standard "restricted" fields, on the pod and on every container."""
    pod_ctx = pod_spec.get("securityContext") or {}
    assert pod_ctx.get("runAsNonRoot") is True, f"{where}: pod securityContext.runAsNonRoot"
    assert (pod_ctx.get("seccompProfile") or {}).get("type") == "RuntimeDefault", f"{where}: pod seccompProfile"
    assert pod_ctx.get("runAsUser", 1) != 0, f"{where}: pod runs as root"
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    for volume in volumes.values():
        allowed = {"name", "emptyDir", "configMap", "secret", "projected", "downwardAPI", "persistentVolumeClaim",
                   "ephemeral", "csi"}
        assert set(volume) <= allowed, f"{where}: volume {volume['name']} of a kind 'restricted' forbids"
    for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        ctx = container.get("securityContext") or {}
        name = f"{where}: container {container['name']}"
        assert ctx.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation"
        assert ctx.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: capabilities.drop"
        assert not ctx.get("capabilities", {}).get("add"), f"{name}: capabilities.add"
        assert ctx.get("privileged", False) is False, f"{name}: privileged"
        assert ctx.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem"
        assert ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is True, f"{name}: runAsNonRoot"
        assert ctx.get("runAsUser", pod_ctx.get("runAsUser", 1)) != 0, f"{name}: runAsUser 0"
        seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
        assert seccomp in ("RuntimeDefault", "Localhost"), f"{name}: seccompProfile"
        for mount in container.get("volumeMounts") or []:
            assert mount["name"] in volumes, f"{name}: mounts undeclared volume {mount['name']}"
        assert "resources" in container and container["resources"].get("requests"), f"{name}: resource requests"


def pod_specs(manifest: dict) -> list[tuple[str, dict]]:
    """The pod specs inside a workload manifest."""
    kind = manifest["kind"]
    spec = manifest.get("spec") or {}
    if kind == "Pod":
        return [(manifest["metadata"]["name"], spec)]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        return [(f"{kind}/{manifest['metadata']['name']}", spec["template"]["spec"])]
    if kind == "CronJob":
        return [(f"CronJob/{manifest['metadata']['name']}", spec["jobTemplate"]["spec"]["template"]["spec"])]
    return []


def documents(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture
def kubeconfig_file(tmp_path):
    """A kubeconfig naming a cluster that is never contacted (no Kubernetes server runs here):
    dagster-k8s loads one when its run launcher and step handler are built."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "test", "user": {"token": "unused"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "ml"}}],
    }))
    return str(path)
