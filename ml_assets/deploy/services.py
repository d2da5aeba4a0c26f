"""The production services' commands, in one place for the CLI, the docs and the tests.

``ml-assets mlflow-server`` runs the MLflow tracking server the production configuration points at:
PostgreSQL as backend store (``MLFLOW_BACKEND_STORE_URI``), S3 as artifact store
(``MLFLOW_ARTIFACTS_DESTINATION``, served through the server so clients need no S3 credentials),
listening on loopback unless told otherwise, with MLflow's host-header check limited to the
addresses it serves.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

BACKEND_VARIABLE = "MLFLOW_BACKEND_STORE_URI"
ARTIFACTS_VARIABLE = "MLFLOW_ARTIFACTS_DESTINATION"


def mlflow_executable() -> str:
    beside = Path(sys.executable).parent / "mlflow"
    return str(beside) if beside.exists() else (shutil.which("mlflow") or "mlflow")


def mlflow_server_command(backend_store_uri: str, artifacts_destination: str, host: str = "127.0.0.1",
                          port: int = 5000, workers: int = 2, allowed_hosts: list[str] | None = None) -> list[str]:
    if not backend_store_uri.startswith(("postgresql", "mysql", "sqlite")):
        raise ValueError(f"{BACKEND_VARIABLE} must be a database URL (postgresql://...); "
                         f"got scheme {backend_store_uri.split(':', 1)[0]!r}")
    if "://" not in artifacts_destination:
        raise ValueError(f"{ARTIFACTS_VARIABLE} must be an object-store URL such as s3://bucket/mlflow")
    # The Host header check (DNS rebinding) admits only the names this server is reached by.
    hosts = list(dict.fromkeys([f"{host}:{port}", f"localhost:{port}", f"127.0.0.1:{port}", *(allowed_hosts or [])]))
    # The database URL (with its password) and the destination reach mlflow through its own
    # environment variables, MLFLOW_BACKEND_STORE_URI and MLFLOW_ARTIFACTS_DESTINATION, not argv.
    return [mlflow_executable(), "server", "--serve-artifacts",
            "--host", host, "--port", str(port), "--workers", str(workers),
            "--allowed-hosts", ",".join(hosts)]


def run_mlflow_server(host: str, port: int, workers: int, allowed_hosts: list[str]) -> int:
    """Replace this process with the MLflow server; its secrets stay in the environment."""
    missing = [name for name in (BACKEND_VARIABLE, ARTIFACTS_VARIABLE) if not os.environ.get(name)]
    if missing:
        print(f"ml-assets mlflow-server: set {', '.join(missing)} (see docs/deployment.md)", file=sys.stderr)
        return 2
    try:
        command = mlflow_server_command(os.environ[BACKEND_VARIABLE], os.environ[ARTIFACTS_VARIABLE],
                                        host, port, workers, allowed_hosts)
    except ValueError as exc:
        print(f"ml-assets mlflow-server: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    sys.stdout.flush()
    os.execv(command[0], command)
    return 0  # not reached
