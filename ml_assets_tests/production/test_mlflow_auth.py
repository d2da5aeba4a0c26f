"""Who may move a model, against MLflow's own authentication as production runs it: `ml-assets
mlflow-server` (the basic-auth app) on loopback, its registry and its users and permissions in one
fresh PostgreSQL database, the identities made by `ml-assets mlflow-users` as the admin. A team's
user reads everything and gets MLflow's 403 for whatever moves a model; the platform's identity does
the same operations, and the product's own promotion and rollback (the function the promote job
calls, and `ml-assets promote` / `rollback`) work as the platform and fail cleanly as a team user,
writing nothing. No stand-ins: every request reaches the real server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ml_assets.deploy.mlflow_users import Credentials, acting_as
from ml_assets.deploy.services import write_auth_config
from ml_assets.promotion import moves as promotion
from ml_assets.registry import versions as registry
from ml_assets.spec import load_spec
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import (
    VENV_BIN,
    cli_env,
    free_port,
    group_commands,
    version_with_files,
    write_spec,
)
from ml_assets_tests.production.conftest import (
    POSTGRES,
    REPO,
    _admin_url,
    _http_ok,
    create_platform_identity,
    mlflow_auth_env,
    needs_postgres,
    wait_for,
)

MODEL = "flights_delay"
TEAM_USER = "fraud.analyst"
TEAM_PASSWORD = "a-team-password-of-some-length"


@dataclass
class AuthServer:
    root: Path
    env: dict[str, str]
    """What every process here gets: the server's address, no credentials."""
    admin: Credentials
    platform: Credentials
    team: Credentials

    @property
    def url(self) -> str:
        return self.env["MLFLOW_TRACKING_URI"]

    def client(self) -> MlflowClient:
        return MlflowClient(tracking_uri=self.url, registry_uri=self.url)

    def as_(self, who: Credentials, *args: str, **extra: str) -> subprocess.CompletedProcess:
        """``ml-assets ARGS`` as ``who``, the way a person or a run worker has its identity."""
        env = {**self.env, "MLFLOW_TRACKING_USERNAME": who.username, "MLFLOW_TRACKING_PASSWORD": who.password,
               **extra}
        return subprocess.run([str(VENV_BIN / "ml-assets"), *args], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=600)


@pytest.fixture(scope="module")
def server(tmp_path_factory, postgres_database) -> AuthServer:
    """One `ml-assets mlflow-server` for the module, as docs/deployment.md starts it, with the
    platform's identity and a team's user made by `ml-assets mlflow-users`."""
    if not POSTGRES:
        pytest.skip("ML_ASSETS_TEST_POSTGRES_URL is not set (.ci/run sets it for the local PostgreSQL)")
    root = tmp_path_factory.mktemp("mlflow-auth")
    platform, admin = mlflow_auth_env()
    env = cli_env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{free_port()}", MLFLOW_DISABLE_TELEMETRY="true",
                  DO_NOT_TRACK="1")
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD"):
        env.pop(name, None)
    database = _admin_url(postgres_database("mlflow_auth"), driver="psycopg")
    log = open(root / "mlflow.log", "wb")  # noqa: SIM115 (kept open for the server's life)
    port = env["MLFLOW_TRACKING_URI"].rsplit(":", 1)[1]
    proc = subprocess.Popen(
        [str(VENV_BIN / "ml-assets"), "mlflow-server", "--port", port, "--workers", "1"],
        env={**env, **admin, "MLFLOW_BACKEND_STORE_URI": database, "TMPDIR": str(root),  # its auth ini goes there
             "MLFLOW_ARTIFACTS_DESTINATION": (root / "mlflow-artifacts").as_uri()},
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or _http_ok(f"{env['MLFLOW_TRACKING_URI']}/health"), 120,
                 "the MLflow server")
        assert proc.poll() is None, (root / "mlflow.log").read_text()[-3000:]
        # No job runner beside the server (MLflow starts eight workers for jobs nobody here runs).
        assert not [cmd for cmd in group_commands(proc.pid) if "huey" in cmd or "_job_runner" in cmd]
        create_platform_identity({**env, **platform}, admin)
        made = subprocess.run([str(VENV_BIN / "ml-assets"), "mlflow-users", "create-user", TEAM_USER],
                              env={**env, **admin, "ML_ASSETS_NEW_USER_PASSWORD": TEAM_PASSWORD}, cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert made.returncode == 0 and f"'{TEAM_USER}' created" in made.stdout, made.stderr
        yield AuthServer(root=root, env=env, admin=Credentials("admin", admin["MLFLOW_AUTH_ADMIN_PASSWORD"]),
                         platform=Credentials(platform["MLFLOW_TRACKING_USERNAME"],
                                              platform["MLFLOW_TRACKING_PASSWORD"]),
                         team=Credentials(TEAM_USER, TEAM_PASSWORD))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


def registered(client: MlflowClient, name: str, partition: str, against: str = "none") -> str:
    """A version of ``name`` as the pipeline registers it: a run in the model's experiment, the
    version's source in that run, the gate's tags."""
    mv = version_with_files(client, name, {
        "partition": partition, "gate": "passed", "gate_champion_version": against,
        "gate_reason": f"passed against {against}", "primary_metric": "roc_auc", "test_roc_auc": "0.7"})
    return str(mv.version)


def refused(call) -> MlflowException:
    with pytest.raises(MlflowException) as raised:
        call()
    assert raised.value.get_http_status_code() == 403, raised.value
    return raised.value


def aliases(client: MlflowClient, name: str) -> dict[str, str]:
    return {alias: str(version) for alias, version in client.get_registered_model(name).aliases.items()}


@needs_postgres
@pytest.mark.e2e
def test_a_team_user_reads_but_gets_403_for_what_the_platform_identity_may_do(server):
    client, name = server.client(), "scratch_model"
    with acting_as(server.platform):
        client.create_registered_model(name)
        v1, v2 = registered(client, name, "2013-01-15"), registered(client, name, "2013-01-16")
        source = client.get_model_version(name, v1)
    with acting_as(server.team):
        assert client.get_model_version(name, v2).tags["partition"] == "2013-01-16"  # READ on every model
        refused(lambda: client.set_registered_model_alias(name, registry.CHAMPION, v1))
        refused(lambda: client.set_registered_model_alias(name, registry.CHALLENGER, v2))
        refused(lambda: client.create_model_version(name, source=source.source, run_id=source.run_id))
        refused(lambda: client.delete_model_version(name, v2))
    with acting_as(server.platform):
        assert aliases(client, name) == {} and len(client.search_model_versions(f"name='{name}'")) == 2
        client.set_registered_model_alias(name, registry.CHAMPION, v1)
        client.set_registered_model_alias(name, registry.CHALLENGER, v2)
        v3 = client.create_model_version(name, source=source.source, run_id=source.run_id).version
        client.delete_model_version(name, v2)
        assert aliases(client, name) == {registry.CHAMPION: v1}  # deleting v2 took its alias
        assert sorted(str(v.version) for v in client.search_model_versions(f"name='{name}'")) == sorted([v1, str(v3)])


@needs_postgres
@pytest.mark.e2e
def test_promotion_and_rollback_work_as_the_platform_and_fail_cleanly_as_a_team_user(server, bundled_spec_dict,
                                                                                      s3_endpoint):
    import boto3

    root, client = server.root, server.client()
    spec = load_spec(write_spec(root / "models", bundled_spec_dict))
    home = root / "home"
    store = LocalVersionStore(home / "versions")  # the store `ml-assets promote` uses with this home
    with acting_as(server.platform):
        registry.ensure_registered_model(client, MODEL, spec.description, spec.owner, spec.team)
        v1 = registered(client, MODEL, "2013-01-15")
        v2 = registered(client, MODEL, "2013-01-16", against=v1)

    # The function the promote job calls: refused before the pending record or the log is written.
    with acting_as(server.team), pytest.raises(registry.PermissionDenied) as denied:
        promotion.execute(client, store, spec, promotion.Request(MODEL, "promote", v1, "mine now", "team"))
    assert str(denied.value).startswith(f"model '{MODEL}': set alias champion: permission denied (HTTP 403) "
                                        f"for MLflow user '{TEAM_USER}'")
    with acting_as(server.platform):
        assert aliases(client, MODEL) == {} and promotion.pending(client, MODEL) is None
        assert promotion.history(store, MODEL) == []
        record, outcome = promotion.execute(client, store, spec,
                                            promotion.Request(MODEL, "promote", v1, "first champion", "platform"))
    assert outcome == "done" and record["version"] == v1

    # `ml-assets promote` and `rollback` themselves, in production mode against this server.
    cli = {"ML_ASSETS_ENV": "production", "ML_ASSETS_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"),
           "ML_ASSETS_MODELS_DIR": str(root / "models"), "ML_ASSETS_ARTIFACTS_URL": "s3://ml-assets-auth/artifacts",
           "ML_ASSETS_CHECKPOINTS_URL": "s3://ml-assets-auth/checkpoints", "AWS_ENDPOINT_URL": s3_endpoint}
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="ml-assets-auth")
    for args in (("promote", MODEL, v2, "--reason", "mine now"), ("rollback", MODEL, "--reason", "mine before")):
        team = server.as_(server.team, *args, **cli)
        assert team.returncode == 1, team.stdout + team.stderr
        assert team.stderr.strip().splitlines()[-1] == (
            f"ml-assets {args[0]}: model '{MODEL}': set alias champion: permission denied (HTTP 403) for MLflow "
            f"user '{TEAM_USER}': only the platform's identity registers versions and moves @champion and "
            "@challenger (docs/deployment.md, \"Who can do what\")")
        assert "Traceback" not in team.stderr
    with acting_as(server.platform):
        assert aliases(client, MODEL) == {registry.CHAMPION: v1} and promotion.pending(client, MODEL) is None
        assert "promotion.last" not in client.get_model_version(MODEL, v2).tags
    assert [r["version"] for r in promotion.history(store, MODEL)] == [v1]
    assert not (home / "dagster").exists()  # refused before any Dagster run was made

    promoted = server.as_(server.platform, "promote", MODEL, v2, "--reason", "reviewed", **cli)
    assert promoted.returncode == 0, promoted.stderr[-3000:]
    with acting_as(server.platform):
        assert aliases(client, MODEL) == {registry.CHAMPION: v2}
        assert json.loads(client.get_model_version(MODEL, v2).tags["promotion.last"])["reason"] == "reviewed"
    rolled = server.as_(server.platform, "rollback", MODEL, "--reason", "v2 misbehaves", **cli)
    assert rolled.returncode == 0, rolled.stderr[-3000:]
    with acting_as(server.platform):
        assert aliases(client, MODEL) == {registry.CHAMPION: v1}
    log = promotion.history(store, MODEL)
    assert [(r["action"], r["version"]) for r in log] == [("promote", v1), ("promote", v2), ("rollback", v1)]
    assert log[1]["actor"].startswith("cli ")


@needs_postgres
@pytest.mark.e2e
def test_grant_platform_gives_the_platform_what_another_identity_created(server):
    client, name = server.client(), "legacy_model"
    with acting_as(server.admin):  # e.g. made before authentication was on, or by hand
        client.create_registered_model(name)
        experiment_id = client.create_experiment(name)
    with acting_as(server.platform):
        refused(lambda: client.set_registered_model_tag(name, "owner", "platform"))
        refused(lambda: client.create_run(experiment_id))
    env = {**server.env, "MLFLOW_AUTH_ADMIN_PASSWORD": server.admin.password,
           "MLFLOW_TRACKING_USERNAME": server.platform.username}
    grant = subprocess.run([str(VENV_BIN / "ml-assets"), "mlflow-users", "grant-platform"], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert grant.returncode == 0, grant.stderr
    assert f"MANAGE for '{server.platform.username}' on registered_model {name}" in grant.stdout
    assert f"on experiment {experiment_id} ({name})" in grant.stdout
    with acting_as(server.platform):
        client.set_registered_model_tag(name, "owner", "platform")
        client.create_run(experiment_id)
    again = subprocess.run([str(VENV_BIN / "ml-assets"), "mlflow-users", "grant-platform"], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "MANAGE for" not in again.stdout, again.stdout + again.stderr


@needs_postgres
@pytest.mark.e2e
def test_the_admin_command_checks_names_and_passwords_before_the_api(server):
    from mlflow.server.auth.client import AuthServiceClient

    def create(name: str, password: str = TEAM_PASSWORD, admin: str | None = None):
        env = {**server.env, "MLFLOW_AUTH_ADMIN_PASSWORD": admin or server.admin.password,
               "ML_ASSETS_NEW_USER_PASSWORD": password}
        return subprocess.run([str(VENV_BIN / "ml-assets"), "mlflow-users", "create-user", name], env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=120)

    for name in ("bad:name", "x", "two words", ".dot-first", "name\n"):
        done = create(name)
        assert done.returncode == 2 and f"MLflow user name {name!r} is invalid" in done.stderr, done.stderr
    short = create("short-password", password="eleven-char")
    assert short.returncode == 2 and "ML_ASSETS_NEW_USER_PASSWORD to a password of at least 12" in short.stderr
    wrong = create("wrong-admin", admin="not-the-admin-password")
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1 and "Traceback" not in wrong.stderr
    with acting_as(server.admin):
        for name in ("short-password", "wrong-admin"):
            with pytest.raises(MlflowException, match="not found|does not exist"):
                AuthServiceClient(server.url).get_user(name)


def test_the_auth_config_is_private_and_holds_only_the_environments_database(tmp_path, monkeypatch):
    from mlflow.server.auth.config import read_auth_config

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkstemp puts it
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    url = "postgresql+psycopg://mlflow:p%40ss%25word@db.internal:5432/mlflow"  # '%' survives configparser
    path = write_auth_config({"MLFLOW_BACKEND_STORE_URI": url, "MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32})
    assert Path(path).parent == tmp_path and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "k" * 32 not in Path(path).read_text() and "password" not in Path(path).read_text()
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", path)
    config = read_auth_config()
    assert config.database_uri == url and config.default_permission == "READ" and config.admin_password is None
    own = write_auth_config({"MLFLOW_BACKEND_STORE_URI": url, "MLFLOW_AUTH_DATABASE_URI": "sqlite:///users.db"})
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", own)
    assert read_auth_config().database_uri == "sqlite:///users.db"
    injected = "root\nauthorization_function = attacker:auth"  # a name becomes a line of the file
    with pytest.raises(ValueError, match=re.escape(f"MLFLOW_AUTH_ADMIN_USERNAME: MLflow user name {injected!r}")):
        write_auth_config({"MLFLOW_BACKEND_STORE_URI": url, "MLFLOW_AUTH_ADMIN_USERNAME": injected})


@pytest.mark.parametrize(("extra", "message"), [
    ({}, "set MLFLOW_FLASK_SERVER_SECRET_KEY"),
    ({"MLFLOW_FLASK_SERVER_SECRET_KEY": "k" * 32, "MLFLOW_AUTH_ADMIN_PASSWORD": "short"},
     "MLFLOW_AUTH_ADMIN_PASSWORD must be at least 12 characters"),
])
def test_the_server_refuses_to_start_without_what_its_authentication_needs(tmp_path, extra, message):
    env = cli_env(MLFLOW_BACKEND_STORE_URI="postgresql+psycopg://mlflow@127.0.0.1:1/mlflow",
                  MLFLOW_ARTIFACTS_DESTINATION="s3://bucket/mlflow", TMPDIR=str(tmp_path), **extra)
    for name in ("MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_AUTH_ADMIN_PASSWORD"):
        if name not in extra:
            env.pop(name, None)
    done = subprocess.run([str(VENV_BIN / "ml-assets"), "mlflow-server", "--port", "1"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # no configuration written for a server that does not start


@pytest.mark.parametrize("destination", ["/var/lib/mlflow", "mlartifacts", "s3:///mlflow", "file:relative"])
def test_the_server_command_refuses_an_artifacts_destination_that_is_not_a_url_with_a_place(destination):
    from ml_assets.deploy.services import mlflow_server_command

    with pytest.raises(ValueError, match="MLFLOW_ARTIFACTS_DESTINATION must be an object-store URL with a bucket"):
        mlflow_server_command("postgresql+psycopg://mlflow@127.0.0.1/mlflow", destination)
    for good in ("s3://bucket/mlflow", "file:///var/lib/mlflow"):  # the server serves its own disk's files
        assert mlflow_server_command("postgresql+psycopg://mlflow@127.0.0.1/mlflow", good)[1] == "server"
