"""``ml-assets doctor``: every service a production run needs, checked before a run starts.

A misconfigured URL, a missing credential or a bucket that does not exist otherwise shows up minutes
into a run, deep in a step's log. The doctor asks each one directly, in the order a run meets them:
the settings (URLs parsed, ml_assets.settings), each object store (its bucket listed, a small object
written and deleted under the configured prefix), the MLflow server (its health, then an
authenticated call), and the Dagster instance's PostgreSQL. One line per check; a failed one names
the variable to fix, and the last line says how many failed. Exit 0 when all pass, 1 otherwise.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ml_assets.settings import Settings, load_settings, public_url

STORES = (("ML_ASSETS_ARTIFACTS_URL", "artifacts_url"), ("ML_ASSETS_CHECKPOINTS_URL", "checkpoints_url"),
          ("ML_ASSETS_OBJECTS_URL", "objects_url"))
DAGSTER_POSTGRES = "ML_ASSETS_DAGSTER_POSTGRES_URL"


@dataclass(frozen=True)
class Finding:
    what: str
    problem: str = ""
    """Empty when the check passed; else what is wrong and which variable to fix."""


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def store(name: str, url: str) -> Finding:
    """The bucket exists, and this identity may write and delete under the URL's prefix."""
    import fsspec

    what = f"{name} {url}"
    try:
        fs, path = fsspec.core.url_to_fs(url)
        fs.ls(path.split("/", 1)[0])  # the bucket itself: NoSuchBucket, AccessDenied, no credentials
        probe = f"{path.rstrip('/')}/.ml-assets-doctor-{secrets.token_hex(4)}"
        fs.pipe_file(probe, b"ml-assets doctor")
        fs.rm_file(probe)
    except FileNotFoundError as exc:
        return Finding(what, f"the bucket does not exist ({_first_line(exc)}): create it, or fix {name}")
    except PermissionError as exc:
        return Finding(what, f"access denied ({_first_line(exc)}): give these credentials (AWS_ACCESS_KEY_ID / the "
                             f"role) read and write on it, or fix {name}")
    except Exception as exc:  # noqa: BLE001 (botocore's NoCredentialsError, endpoint errors: each said as it is)
        hint = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give the machine a role"
                if "credential" in str(exc).lower() else f"check {name} and the store's endpoint (AWS_ENDPOINT_URL)")
        return Finding(what, f"{type(exc).__name__}: {_first_line(exc)}: {hint}")
    return Finding(what)


def mlflow(uri: str) -> Finding:
    """The server answers, and accepts this process's identity (an authenticated read)."""
    import urllib.request

    what = f"MLFLOW_TRACKING_URI {public_url(uri)}"
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=10) as response:
            response.read()
    except OSError as exc:
        return Finding(what, f"the MLflow server does not answer ({_first_line(exc)}): start it, or fix "
                             "MLFLOW_TRACKING_URI")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except MlflowException as exc:
        user = os.environ.get("MLFLOW_TRACKING_USERNAME") or "(none)"
        if exc.get_http_status_code() in (401, 403):
            return Finding(what, f"the server refused the identity MLFLOW_TRACKING_USERNAME={user} (HTTP "
                                 f"{exc.get_http_status_code()}): fix MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD")
        return Finding(what, f"{_first_line(exc)}: check MLFLOW_TRACKING_URI")
    return Finding(what)


def dagster_postgres(url: str) -> Finding:
    """The instance's database accepts a connection."""
    import sqlalchemy

    what = f"{DAGSTER_POSTGRES} {public_url(url)}"
    try:
        engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 10}, poolclass=sqlalchemy.pool.NullPool)
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("select 1"))
    except Exception as exc:  # noqa: BLE001 (the driver's errors: refused, authentication, no database)
        return Finding(what, f"{_first_line(exc)}: fix {DAGSTER_POSTGRES}")
    return Finding(what)


def findings(settings: Settings, env: Mapping[str, str]) -> Iterator[Finding]:
    """Each check's finding, as it is made (a slow service shows which one the doctor waits on)."""
    for name, field in STORES:
        if (url := getattr(settings, field)) is not None:
            yield store(name, url)
    if settings.tracking_uri:
        yield mlflow(settings.tracking_uri)
    if url := env.get(DAGSTER_POSTGRES, "").strip():
        yield dagster_postgres(url)


def run(env: Mapping[str, str] | None = None) -> int:
    """Settings errors (ml_assets.settings.SettingsError) propagate: the CLI says them in one line."""
    env = os.environ if env is None else env
    settings = load_settings(env)
    if settings.environment == "local":
        print("ML_ASSETS_ENV=local: the embedded stores, MLflow and Dagster instance under "
              f"{settings.home}; nothing to reach. Set ML_ASSETS_ENV=production to check the services.")
        return 0
    # One attempt each: the doctor reports a server that does not answer, it does not wait it out.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    failed = 0
    for finding in findings(settings, env):
        failed += bool(finding.problem)
        print(f"{'FAILED' if finding.problem else 'ok    '} {finding.what}"
              + (f"\n       {finding.problem}" if finding.problem else ""), flush=True)
    if failed:
        print(f"ml-assets doctor: {failed} check(s) failed; a run would fail on the first of them", file=sys.stderr)
        return 1
    print("ml-assets doctor: every service answers")
    return 0
