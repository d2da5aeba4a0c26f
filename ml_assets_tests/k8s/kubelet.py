"""Plays kubelet and cluster DNS for a pod manifest on this machine, and nothing else.

Resolves the container's env as Kubernetes does (``value``, the completion index from the pod's
annotation, the pod's name), expands ``$(VAR)`` in command and args as kubelet does, points the
pods' DNS names at loopback addresses (127.0.0.1 for pod 0, 127.0.0.2 for pod 1: like distinct pod
IPs) and gives the emptyDir mounts temporary directories. Command, args and rendezvous stay the
manifest's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ml_assets.deploy.k8s.pods import HOME
from ml_assets.training.k8s_job import INDEX_ANNOTATION


def pod_env(container: dict, index: int, pod_name: str, home: Path,
            secrets: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
    """``secrets``: the Secrets the namespace holds (name -> data); a reference to one not given
    becomes a stand-in value naming it."""
    secrets = secrets or {}
    env = {}
    for source in container.get("envFrom") or []:  # ConfigMaps are not emulated; Secrets given are
        if "secretRef" in source:
            env.update(secrets.get(source["secretRef"]["name"], {}))
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        if "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets.get(ref["name"], {}).get(ref["key"], f"secret:{ref['name']}/{ref['key']}")
            continue
        field = var["valueFrom"]["fieldRef"]["fieldPath"]
        if field == f"metadata.annotations['{INDEX_ANNOTATION}']":
            env[var["name"]] = str(index)
        elif field == "metadata.name":
            env[var["name"]] = pod_name
        else:
            raise AssertionError(f"the emulation does not resolve {field}")
    assert env["HOME"] == env["ML_ASSETS_HOME"] == HOME
    env["HOME"] = env["ML_ASSETS_HOME"] = str(home)  # the emptyDir mounted there
    return env


def loopback_dns(job_name: str, service_name: str, nodes: int) -> dict[str, str]:
    return {f"{job_name}-{i}.{service_name}": f"127.0.0.{i + 1}" for i in range(nodes)}


def pod_command(container: dict, env: dict[str, str], dns: dict[str, str]) -> list[str]:
    def expand(arg: str) -> str:  # kubelet's $(VAR) expansion, then the cluster's DNS
        arg = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)
        for host, address in dns.items():
            arg = arg.replace(f"={host}:", f"={address}:").replace(f"={host}", f"={address}")
        return arg

    command = [expand(a) for a in container["command"] + container["args"]]
    assert command[0] == "python", command
    return [sys.executable, *command[1:]]
