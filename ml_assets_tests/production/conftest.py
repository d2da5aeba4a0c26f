"""Production mode for real: PostgreSQL (ML_ASSETS_TEST_POSTGRES_URL), moto's S3 server, an MLflow
server, the Dagster daemon and webserver, each a real process on loopback.

Without ML_ASSETS_TEST_POSTGRES_URL the tests that need them are skipped with that reason (`make test`
on a machine without PostgreSQL); `.ci/run` sets it for the machines' local PostgreSQL.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from ml_assets.deploy.alerts.webhook import WEBHOOK_VARIABLE
from ml_assets.instance import PRODUCTION_INSTANCE
from ml_assets_tests.helpers import VENV_BIN, cli_env, free_port, small_training, write_spec

REPO = Path(__file__).resolve().parents[2]
POSTGRES = os.environ.get("ML_ASSETS_TEST_POSTGRES_URL")
needs_postgres = pytest.mark.skipif(
    not POSTGRES, reason="ML_ASSETS_TEST_POSTGRES_URL is not set (.ci/run sets it for the local PostgreSQL)")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Webhook:
    """A small HTTP receiver on loopback that keeps every JSON body posted to it."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.fail_next = 0  # answer this many requests with HTTP 503
        received, owner = self.received, self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if owner.fail_next > 0:
                    owner.fail_next -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                received.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/ml-assets"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


def _admin_url(database: str | None = None, driver: str = "") -> str:
    from sqlalchemy.engine import make_url

    url = make_url(POSTGRES)
    url = url.set(drivername="postgresql" + (f"+{driver}" if driver else ""))
    if database:
        url = url.set(database=database)
    return url.render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_database() -> Iterator:
    """A factory of fresh databases on the test server, dropped at the end of the session."""
    import psycopg

    created: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(_admin_url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return name

    yield make
    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def dagster_yaml(postgres_env: str = "ML_ASSETS_DAGSTER_POSTGRES_URL", poll_seconds: int = 2) -> str:
    """ml_assets/instance/production.yaml as shipped, with run monitoring polling every few seconds."""
    config = yaml.safe_load(PRODUCTION_INSTANCE.read_text())
    assert config["storage"]["custom"]["config"]["postgres_url"] == {"env": postgres_env}
    config["run_monitoring"].update(poll_interval_seconds=poll_seconds, start_timeout_seconds=120,
                                    cancel_timeout_seconds=60)
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class Services:
    home: Path
    env: dict[str, str]
    alerts: Webhook
    mlflow_url: str
    webserver_port: int
    s3_endpoint: str
    logs: Path
    processes: list[subprocess.Popen] = field(default_factory=list)
    named: dict[str, tuple[subprocess.Popen, list[str], dict[str, str]]] = field(default_factory=dict)

    def start(self, name: str, args: list[str], **extra_env: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (kept open for the process's life)
        proc = subprocess.Popen(args, env={**self.env, **extra_env}, stdout=log, stderr=subprocess.STDOUT,
                                cwd=REPO, start_new_session=True)
        self.processes.append(proc)
        self.named[name] = (proc, args, extra_env)
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL a service and everything it started (its process group)."""
        proc = self.named[name][0]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()

    def restart(self, name: str) -> subprocess.Popen:
        """The service started again as it was first started (same command, port and environment)."""
        _, args, extra_env = self.named[name]
        return self.start(name, args, **extra_env)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def instance(self):
        """The same instance from this process (its dagster.yaml reads the URL from the environment)."""
        from dagster import DagsterInstance

        os.environ["ML_ASSETS_DAGSTER_POSTGRES_URL"] = self.env["ML_ASSETS_DAGSTER_POSTGRES_URL"]
        return DagsterInstance.from_config(str(self.home / "dagster"))

    @property
    def mlflow_auth(self) -> tuple[str, str]:
        """The platform identity's MLflow credentials, for a plain HTTP client (requests' auth=)."""
        return self.env["MLFLOW_TRACKING_USERNAME"], self.env["MLFLOW_TRACKING_PASSWORD"]

    def graphql(self):
        from dagster_graphql import DagsterGraphQLClient

        return DagsterGraphQLClient("127.0.0.1", port_number=self.webserver_port, timeout=60)


PLATFORM_USER = "ml-platform"


def mlflow_auth_env() -> tuple[dict[str, str], dict[str, str]]:
    """Fresh secrets for one MLflow server with authentication: the platform identity's credentials
    (every client process), and what only the server and its admin command get."""
    import secrets

    platform = {"MLFLOW_TRACKING_USERNAME": PLATFORM_USER, "MLFLOW_TRACKING_PASSWORD": secrets.token_urlsafe(18)}
    admin = {"MLFLOW_AUTH_ADMIN_PASSWORD": secrets.token_urlsafe(18),
             "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)}
    return platform, admin


def create_platform_identity(env: dict[str, str], admin: dict[str, str]) -> None:
    """`ml-assets mlflow-users create-platform`, as docs/deployment.md has it run once."""
    made = subprocess.run([str(VENV_BIN / "ml-assets"), "mlflow-users", "create-platform"], env={**env, **admin},
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-3000:]


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def private_postgres() -> Iterator[tuple]:
    """A PostgreSQL cluster of a production world's own (``pg_ctl`` on another port, ~2.5 s to make):
    ``(make a database, its URL)`` for ``start_services``. One world holds up to ~65 connections at
    once (a 24-day backfill's eight run workers, the daemon, the webserver, MLflow); two worlds on
    the shared server at once, one per pytest worker, passed its 100 and failed their runs with
    "too many clients already"."""
    from ml_assets_tests.faults.services import PrivateCluster

    cluster = PrivateCluster()
    cluster.start()
    try:
        yield (lambda prefix: cluster.create_database(f"{prefix}_{uuid.uuid4().hex[:8]}")), cluster.url
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def services(tmp_path_factory, s3_endpoint, bundled_spec_dict) -> Iterator[Services]:
    """The production configuration on loopback: PostgreSQL databases for Dagster and MLflow, S3
    buckets on moto, `ml-assets mlflow-server`, `dagster-daemon run` and `dagster-webserver`."""
    import copy

    if not POSTGRES:
        pytest.skip("ML_ASSETS_TEST_POSTGRES_URL is not set (.ci/run sets it for the local PostgreSQL)")
    spec = small_training(copy.deepcopy(bundled_spec_dict))
    # Runs here evaluate side by side: with automatic promotion, whichever registered first could be
    # champion before another's evaluation and fail its gate (timing decides). Promotion has its own tests.
    spec["promotion"]["mode"] = "approval_required"
    with private_postgres() as (make, url), \
            start_services(tmp_path_factory.mktemp("production"), make, s3_endpoint, [spec], postgres_url=url) as svc:
        yield svc


@contextlib.contextmanager
def start_services(root: Path, postgres_database, s3_endpoint: str, specs: list[dict],
                   instance: str | None = None, postgres_url=_admin_url) -> Iterator[Services]:
    """The services of ``services`` for the model ``specs``, with ``instance`` as dagster.yaml
    (default: the production instance as shipped, polling faster). ``postgres_database`` makes a
    database and ``postgres_url(database, driver)`` is its URL (default: on the shared server)."""
    import boto3

    home, logs = root / "home", root / "logs"
    (home / "dagster").mkdir(parents=True)
    logs.mkdir()
    (home / "dagster" / "dagster.yaml").write_text(instance or dagster_yaml())
    for spec in specs:
        write_spec(root / "models", spec)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    for bucket in ("ml-assets", "mlflow"):
        s3.create_bucket(Bucket=bucket)
    dagster_db, mlflow_db = postgres_database("dagster"), postgres_database("mlflow")
    mlflow_port, webserver_port = free_port(), free_port()
    env = cli_env(
        ML_ASSETS_ENV="production", ML_ASSETS_HOME=str(home), DAGSTER_HOME=str(home / "dagster"),
        ML_ASSETS_MODELS_DIR=str(root / "models"),
        ML_ASSETS_DAGSTER_POSTGRES_URL=postgres_url(dagster_db, driver="psycopg2"),
        MLFLOW_BACKEND_STORE_URI=postgres_url(mlflow_db, driver="psycopg"),
        MLFLOW_ARTIFACTS_DESTINATION="s3://mlflow/artifacts",
        MLFLOW_TRACKING_URI=f"http://127.0.0.1:{mlflow_port}",
        MLFLOW_S3_ENDPOINT_URL=s3_endpoint, AWS_ENDPOINT_URL=s3_endpoint,
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
        ML_ASSETS_ARTIFACTS_URL="s3://ml-assets/artifacts", ML_ASSETS_CHECKPOINTS_URL="s3://ml-assets/checkpoints",
        ML_ASSETS_OBJECTS_URL="s3://ml-assets/objects", ML_ASSETS_MAX_CONCURRENT_STEPS="2",
        ML_ASSETS_COMPUTE_LOGS_BUCKET="ml-assets",
        ML_ASSETS_DAGSTER_URL=f"http://127.0.0.1:{webserver_port}", ML_ASSETS_ALERT_INTERVAL_SECONDS="2",
        MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="1", DAGSTER_DISABLE_TELEMETRY="true",
    )
    # Every process (the run workers too) is the platform's MLflow identity; the admin's password and
    # the Flask secret key go to the MLflow server and the command that creates that identity only.
    platform, admin = mlflow_auth_env()
    env.update(platform)
    hook = Webhook()
    env[WEBHOOK_VARIABLE] = hook.url
    svc = Services(home=home, env=env, alerts=hook, mlflow_url=env["MLFLOW_TRACKING_URI"], webserver_port=webserver_port,
                   s3_endpoint=s3_endpoint, logs=logs)
    try:
        # The instance's schema first: the daemon and webserver would race to create it.
        subprocess.run([str(VENV_BIN / "dagster"), "instance", "migrate"], env=env, cwd=REPO, check=True,
                       capture_output=True)
        # The pool's limit set once, as docs/deployment.md says: two runs that reach an unset pool at
        # the same moment both insert its default limit, and one fails on the unique key (seen here).
        subprocess.run([str(VENV_BIN / "dagster"), "instance", "concurrency", "set", "gpu", "1"], env=env, cwd=REPO,
                       check=True, capture_output=True)
        svc.start("mlflow", [str(VENV_BIN / "ml-assets"), "mlflow-server", "--port", str(mlflow_port), "--workers", "1"],
                  TMPDIR=str(root), **admin)  # its private auth ini in the test's directory, not /tmp
        svc.start("daemon", [str(VENV_BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"])
        svc.start("webserver", [str(VENV_BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1",
                                "-p", str(webserver_port)])
        wait_for(lambda: _http_ok(f"{svc.mlflow_url}/health"), 120, "the MLflow server")
        create_platform_identity(env, admin)
        os.environ.update(platform)  # the tests' own MLflow clients read it, as the services' do
        wait_for(lambda: _http_ok(f"http://127.0.0.1:{webserver_port}/server_info"), 120, "the Dagster webserver")
        yield svc
    finally:
        for proc in svc.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
        for proc in svc.processes:
            try:  # the webserver's code server waits up to 60 s for RPCs: nothing here tests that wait
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        # Run workers the launcher started live in their own sessions: stop any still running.
        kill_run_workers(svc)
        hook.close()
        for name in ("ML_ASSETS_DAGSTER_POSTGRES_URL", *platform):
            os.environ.pop(name, None)


def kill_run_workers(svc: Services) -> None:
    import contextlib
    import signal

    from ml_assets.records.runs import PID_TAG

    with contextlib.suppress(Exception), svc.instance() as instance:
        for run in instance.get_runs():
            if PID_TAG in run.tags:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(run.tags[PID_TAG]), signal.SIGKILL)
