"""A small emulation of the Kubernetes API, for the multi-node training launcher's tests only.

No Kubernetes server can run on the project's machines. This serves, over HTTP on loopback, the
few calls ``ml_assets.training.k8s_launch`` makes through the official Kubernetes client (create and delete
a Service and a Job, read a pod, list pods by label, read a Job's status, follow a pod's log), and
runs each Job pod's container command as a local process the way ml_assets_tests/k8s/kubelet.py
does. It is not Kubernetes: what it shows is that the launcher's calls are well formed for the
client, that it streams pod 0's log into Dagster Pipes, waits, reads disruptions, and cleans up.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import re
import secrets
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from ml_assets.training.k8s_job import INDEX_ANNOTATION
from ml_assets_tests.helpers import cli_env
from ml_assets_tests.k8s.kubelet import loopback_dns, pod_command, pod_env


class Pod:
    def __init__(self, manifest: dict, process: subprocess.Popen | None, log: Path | None):
        self.manifest, self.process, self.log = manifest, process, log
        self.disrupted = False

    @property
    def phase(self) -> str:
        if self.process is None:
            return "Running"
        code = self.process.poll()
        return "Running" if code is None else ("Succeeded" if code == 0 else "Failed")

    def as_json(self) -> dict:
        phase = self.phase
        state = {"running": {"startedAt": _now()}} if phase == "Running" else {
            "terminated": {"exitCode": self.process.returncode, "reason": "Completed" if phase == "Succeeded" else "Error"}}
        conditions = [{"type": "Ready", "status": "True" if phase == "Running" else "False"}]
        if self.disrupted:
            conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"})
        container = self.manifest["spec"]["containers"][0]
        return {**self.manifest, "status": {
            "phase": phase, "conditions": conditions,
            "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                                   "ready": phase == "Running", "restartCount": 0, "state": state}]}}


class FakeApiServer:
    """Serves the emulated API on 127.0.0.1; ``objects`` holds what was created and not deleted."""

    def __init__(self, workdir: Path, step_pod: dict, secrets: dict[str, dict[str, str]] | None = None):
        self.workdir = workdir
        self.secrets = secrets or {}
        self.services: dict[str, dict] = {}
        self.jobs: dict[str, dict] = {}
        self.pods: dict[str, Pod] = {step_pod["metadata"]["name"]: Pod(step_pod, None, None)}
        self.deleted: list[tuple[str, str]] = []
        self.created: dict[str, dict] = {}  # kind -> the last manifest created
        self.requests: set[tuple[str, str, str]] = set()  # (RBAC verb, API group, resource) of each call
        self.lock = threading.Lock()
        # Pods start from one thread that lives as long as the server, as kubelet's processes outlive
        # any API request. A process asks the kernel for SIGTERM when its parent dies
        # (PR_SET_PDEATHSIG), and the kernel's "parent" is the thread that started it: a pod started
        # from a request's thread got SIGTERM when that thread ended, whenever the pod had got as far
        # as asking before the response was sent (seen under load: a Job's pods gone in 0.5 s, silent).
        self.kubelet = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kubelet")
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

            def _record(self, method: str) -> None:
                url = urlsplit(self.path)
                m = re.fullmatch(r"/(?:api/v1|apis/(\w+)/v1)/namespaces/[^/]+/(\w+)(/[^/]+)?(?:/(\w+))?", url.path)
                if m:
                    group, resource, named, sub = m.group(1) or "", m.group(2), m.group(3), m.group(4)
                    verb = {"POST": "create", "DELETE": "delete"}.get(method) or ("get" if named else "list")
                    server.requests.add((verb, group, f"{resource}/{sub}" if sub else resource))

            def do_POST(self):
                self._record("POST")
                path = urlsplit(self.path).path
                if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/services", path):
                    body = self._body()
                    server.services[body["metadata"]["name"]] = server.created["Service"] = body
                    return self._send(201, body)
                if m := re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs", path):
                    body = server.created["Job"] = self._body()
                    server.start_job(m.group(1), body)
                    return self._send(201, body)
                self._send(404, _status(404, path))

            def do_GET(self):
                self._record("GET")
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", url.path):
                    items = [p.as_json() for p in server.pods.values() if _selects(query.get("labelSelector", ""), p)]
                    return self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
                if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", url.path):
                    return server.stream_log(self, m.group(2))
                if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", url.path):
                    pod = server.pods.get(m.group(2))
                    return self._send(200, pod.as_json()) if pod else self._send(404, _status(404, url.path))
                if m := re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)/status", url.path):
                    job = server.jobs.get(m.group(2))
                    return self._send(200, server.job_status(job)) if job else self._send(404, _status(404, url.path))
                self._send(404, _status(404, url.path))

            def do_DELETE(self):
                self._record("DELETE")
                path = urlsplit(self.path).path
                if m := re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)", path):
                    found = server.delete_job(m.group(2))
                elif m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/services/([^/]+)", path):
                    found = server.services.pop(m.group(2), None) is not None
                    server.deleted.append(("Service", m.group(2)))
                else:
                    found = False
                self._send(200, _status(200, "deleted")) if found else self._send(404, _status(404, path))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    # -- the emulated control plane and kubelet ----------------------------------------------------

    def start_job(self, namespace: str, job: dict) -> None:
        name = job["metadata"]["name"]
        # Pods belong to one Job object (controller-uid), not to its name: after a Job is deleted
        # (propagation Background: the Job goes first) a new Job of the same name must not count the
        # old Job's dying pods, as Kubernetes' Job controller does not.
        uid = job["metadata"].setdefault("uid", secrets.token_hex(8))
        self.jobs[name] = job
        template = job["spec"]["template"]
        container = template["spec"]["containers"][0]
        nodes = job["spec"]["completions"]
        subdomain = template["spec"].get("subdomain")
        dns = loopback_dns(name, subdomain, nodes) if subdomain else {}
        for index in range(nodes):
            pod_name = f"{name}-{index}-{secrets.token_hex(3)}"
            labels = {**template["metadata"]["labels"], "job-name": name, "controller-uid": uid,
                      INDEX_ANNOTATION: str(index)}
            manifest = {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod_name, "namespace": namespace, "labels": labels,
                                     "annotations": {INDEX_ANNOTATION: str(index)}},
                        "spec": {**template["spec"], "hostname": f"{name}-{index}"}}
            env = pod_env(container, index, pod_name, self.workdir / pod_name, self.secrets)
            env["HOSTNAME"] = f"{name}-{index}" if subdomain else pod_name  # as kubelet sets it
            log = self.workdir / f"{pod_name}.log"
            process = self.kubelet.submit(
                subprocess.Popen, pod_command(container, env, dns), stdout=log.open("w"),
                stderr=subprocess.STDOUT, env=cli_env(**env), start_new_session=True).result()
            self.pods[pod_name] = Pod(manifest, process, log)

    def job_pods(self, name: str) -> list[Pod]:
        """The pods of the Job ``name`` that exists now (none when there is no such Job)."""
        job = self.jobs.get(name)
        uid = job["metadata"].get("uid") if job else None
        return [p for p in list(self.pods.values())
                if uid is not None and (p.manifest["metadata"].get("labels") or {}).get("controller-uid") == uid]

    def job_status(self, job: dict) -> dict:
        pods = self.job_pods(job["metadata"]["name"])
        phases = [p.phase for p in pods]
        conditions = []
        if "Failed" in phases:
            conditions.append({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"})
        elif phases and all(p == "Succeeded" for p in phases):
            conditions.append({"type": "Complete", "status": "True"})
        return {**job, "status": {"active": phases.count("Running"), "succeeded": phases.count("Succeeded"),
                                  "failed": phases.count("Failed"), "conditions": conditions}}

    def delete_job(self, name: str) -> bool:
        self.deleted.append(("Job", name))
        pods = self.job_pods(name)
        if self.jobs.pop(name, None) is None:
            return False
        for pod in pods:  # propagation: the Job's pods go too
            if pod.process.poll() is None:
                pod.process.kill()
                pod.process.wait()
            del self.pods[pod.manifest["metadata"]["name"]]
        return True

    def preempt(self, pod_name: str) -> None:
        """What Kubernetes does to a pod it takes away: the DisruptionTarget condition, then SIGTERM."""
        pod = self.pods[pod_name]
        pod.disrupted = True
        pod.process.terminate()

    def stream_log(self, handler: BaseHTTPRequestHandler, pod_name: str) -> None:
        pod = self.pods.get(pod_name)
        if pod is None or pod.log is None:
            return handler._send(404, _status(404, pod_name))
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.end_headers()
        with pod.log.open("rb") as fh:
            pending = b""
            while True:
                chunk = fh.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:  # kubelet prefixes each line with its timestamp
                        handler.wfile.write(_now().encode() + b" " + line + b"\n")
                    handler.wfile.flush()
                elif pod.process.poll() is not None:
                    if pending:
                        handler.wfile.write(_now().encode() + b" " + pending + b"\n")
                    return
                else:
                    time.sleep(0.05)

    def close(self) -> None:
        for pod in self.pods.values():
            if pod.process is not None and pod.process.poll() is None:
                pod.process.kill()
                pod.process.wait()
        self.kubelet.shutdown()
        self.httpd.shutdown()

    def kubeconfig(self, path: Path, namespace: str) -> str:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulated",
            "clusters": [{"name": "emulated", "cluster": {"server": self.url}}],
            "users": [{"name": "emulated", "user": {"token": "unused"}}],
            "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "emulated",
                                                          "namespace": namespace}}]}))
        return str(path)


def _selects(selector: str, pod: Pod) -> bool:
    labels = pod.manifest["metadata"].get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _status(code: int, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "status": "Success" if code < 400 else "Failure",
            "message": message, "code": code}
