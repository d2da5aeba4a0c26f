"""The production services' commands, in one place for the CLI, the docs and the tests.

``ml-assets mlflow-server`` runs the MLflow tracking server the production configuration points at:
PostgreSQL as backend store (``MLFLOW_BACKEND_STORE_URI``), S3 as artifact store
(``MLFLOW_ARTIFACTS_DESTINATION``, served through the server so clients need no S3 credentials),
listening on loopback unless told otherwise, with MLflow's host-header check limited to the
addresses it serves, and MLflow's own authentication (its ``basic-auth`` app): users and
permissions in the database of ``MLFLOW_AUTH_DATABASE_URI`` (default: the backend store's), every
user READ on what it did not create, the Flask secret key from ``MLFLOW_FLASK_SERVER_SECRET_KEY``
and, on the first start, the admin from ``MLFLOW_AUTH_ADMIN_USERNAME`` (default ``admin``) and
``MLFLOW_AUTH_ADMIN_PASSWORD``, which MLflow reads from the environment itself.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from ml_assets.names import InvalidName, check_mlflow_user_name
from ml_assets.settings import public_url

BACKEND_VARIABLE = "MLFLOW_BACKEND_STORE_URI"
ARTIFACTS_VARIABLE = "MLFLOW_ARTIFACTS_DESTINATION"
AUTH_DATABASE_VARIABLE = "MLFLOW_AUTH_DATABASE_URI"
SECRET_KEY_VARIABLE = "MLFLOW_FLASK_SERVER_SECRET_KEY"
ADMIN_USERNAME_VARIABLE = "MLFLOW_AUTH_ADMIN_USERNAME"
ADMIN_PASSWORD_VARIABLE = "MLFLOW_AUTH_ADMIN_PASSWORD"
AUTH_CONFIG_VARIABLE = "MLFLOW_AUTH_CONFIG_PATH"
DEFAULT_ADMIN = "admin"
DEFAULT_PERMISSION = "READ"
MIN_PASSWORD = 12  # MLflow's own rule (mlflow.utils.validation._validate_password)
# Every request's password is checked against a scrypt hash (~0.1 s of CPU each on the project's
# machines); a successful check is remembered this long per worker. A deleted user or a changed
# password is refused at once by the worker that handled the change, by the others within this.
AUTH_CACHE_SECONDS = 60


def mlflow_executable() -> str:
    beside = Path(sys.executable).parent / "mlflow"
    return str(beside) if beside.exists() else (shutil.which("mlflow") or "mlflow")


def mlflow_server_command(backend_store_uri: str, artifacts_destination: str, host: str = "127.0.0.1",
                          port: int = 5000, workers: int = 2, allowed_hosts: list[str] | None = None) -> list[str]:
    if not backend_store_uri.startswith(("postgresql", "mysql", "sqlite")):
        raise ValueError(f"{BACKEND_VARIABLE} must be a database URL (postgresql://...); "
                         f"got scheme {backend_store_uri.split(':', 1)[0]!r}")
    # The server serves artifacts itself (--serve-artifacts): a file:// destination on its own disk is
    # valid; a bare path (relative to whatever directory the server starts in) or a bucketless URL is not.
    destination = urlsplit(artifacts_destination)
    scheme = destination.scheme.lower()
    if not scheme or (scheme == "file" and not destination.path.startswith("/")) or \
            (scheme != "file" and not destination.netloc):
        raise ValueError(f"{ARTIFACTS_VARIABLE} must be an object-store URL with a bucket, such as s3://bucket/mlflow "
                         f"(or file:///absolute/path on the server's own disk); got {public_url(artifacts_destination)!r}")
    # The Host header check (DNS rebinding) admits only the names this server is reached by.
    hosts = list(dict.fromkeys([f"{host}:{port}", f"localhost:{port}", f"127.0.0.1:{port}", *(allowed_hosts or [])]))
    # The database URL (with its password) and the destination reach mlflow through its own
    # environment variables, MLFLOW_BACKEND_STORE_URI and MLFLOW_ARTIFACTS_DESTINATION, not argv.
    return [mlflow_executable(), "server", "--serve-artifacts", "--app-name", "basic-auth",
            "--host", host, "--port", str(port), "--workers", str(workers),
            "--allowed-hosts", ",".join(hosts)]


def auth_config_text(environ: Mapping[str, str]) -> str:
    """The basic-auth app's ini: the users' database from the environment, READ for everyone on
    what they did not create. No password: MLflow reads the admin's from the environment itself."""
    database = (environ.get(AUTH_DATABASE_VARIABLE) or environ.get(BACKEND_VARIABLE) or "").strip()
    if not database.startswith(("postgresql", "mysql", "sqlite")):
        raise ValueError(f"{AUTH_DATABASE_VARIABLE} (default: {BACKEND_VARIABLE}) must be a database URL "
                         "(postgresql://...) for MLflow's users and permissions")
    if "\n" in database or "\r" in database:
        raise ValueError(f"{AUTH_DATABASE_VARIABLE}: a database URL is one line")
    try:
        admin = check_mlflow_user_name((environ.get(ADMIN_USERNAME_VARIABLE) or DEFAULT_ADMIN).strip())
    except InvalidName as exc:
        raise ValueError(f"{ADMIN_USERNAME_VARIABLE}: {exc}") from None
    # MLflow reads the file with configparser's interpolation: a '%' (URL-quoted password) is doubled.
    return "\n".join([
        "[mlflow]", f"default_permission = {DEFAULT_PERMISSION}", f"database_uri = {database.replace('%', '%%')}",
        f"admin_username = {admin}", "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
        f"auth_cache_ttl_seconds = {AUTH_CACHE_SECONDS}", ""])


def write_auth_config(environ: Mapping[str, str]) -> str:
    """``auth_config_text`` in a new file only this user can read (0600), for MLFLOW_AUTH_CONFIG_PATH.

    It outlives this process: the server's workers read it when they start (and again when one is
    restarted). It holds the database URL, which the server's environment holds anyway."""
    text = auth_config_text(environ)
    fd, path = tempfile.mkstemp(prefix="ml-assets-mlflow-auth-", suffix=".ini")  # mode 0600
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return path


def check_auth_environment(environ: Mapping[str, str]) -> None:
    """What MLflow's auth app would refuse later with a stack trace, refused now by name."""
    if not environ.get(SECRET_KEY_VARIABLE):
        # Static across workers and restarts, or the UI's forms (CSRF) fail on another worker.
        raise ValueError(f"set {SECRET_KEY_VARIABLE} (a random string, the same on every start and replica)")
    password = environ.get(ADMIN_PASSWORD_VARIABLE)
    if password is not None and len(password) < MIN_PASSWORD:
        raise ValueError(f"{ADMIN_PASSWORD_VARIABLE} must be at least {MIN_PASSWORD} characters")


def run_mlflow_server(host: str, port: int, workers: int, allowed_hosts: list[str]) -> int:
    """Replace this process with the MLflow server; its secrets stay in the environment."""
    missing = [name for name in (BACKEND_VARIABLE, ARTIFACTS_VARIABLE) if not os.environ.get(name)]
    if missing:
        print(f"ml-assets mlflow-server: set {', '.join(missing)} (see docs/deployment.md)", file=sys.stderr)
        return 2
    try:
        command = mlflow_server_command(os.environ[BACKEND_VARIABLE], os.environ[ARTIFACTS_VARIABLE],
                                        host, port, workers, allowed_hosts)
        check_auth_environment(os.environ)
        os.environ[AUTH_CONFIG_VARIABLE] = write_auth_config(os.environ)
    except ValueError as exc:
        print(f"ml-assets mlflow-server: {exc} (see docs/deployment.md)", file=sys.stderr)
        return 2
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow's job runner (GenAI jobs: prompt optimization, trace rollups; nothing this platform
    # asks of it) starts eight huey worker processes beside the server, each importing mlflow: about
    # 2.4 GB of memory and 35 s of CPU per start here. An operator who wants it sets the variable.
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    sys.stdout.flush()
    os.execv(command[0], command)
    return 0  # not reached
