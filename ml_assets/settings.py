"""Where ml_assets keeps its state and which environment it runs in.

Read from the environment when definitions are built (never at import time):

- ``ML_ASSETS_ENV``: ``local`` (default; embedded, no server, no network), ``production`` (the
  services of docs/deployment.md: Dagster on PostgreSQL, an MLflow server, S3) or ``k8s`` (the same
  services, and every step a Kubernetes pod through dagster-k8s's ``k8s_job_executor``; the training
  step's pod gets the spec's GPUs; docs/kubernetes.md).
- Kubernetes only, optional: ``ML_ASSETS_K8S_TRAINING_DEFAULTS`` (JSON from the chart's ``training``
  values: ``node_selector``, ``tolerations``, ``gpu_resource``; a spec's own ``training.pod`` wins),
  ``ML_ASSETS_K8S_STEP_RESOURCES`` (JSON: the requests and limits of the other steps' pods).
- k8s also requires ``ML_ASSETS_VERSION_STORE=lakefs`` and ``ML_ASSETS_OPTUNA_STORAGE`` (PostgreSQL):
  pods share no disk for the embedded store's refs or a SQLite study.
- Production and k8s, all required (a missing one is named when definitions load):
  ``MLFLOW_TRACKING_URI`` (the MLflow server, ``http://host:port``), ``ML_ASSETS_ARTIFACTS_URL`` and
  ``ML_ASSETS_CHECKPOINTS_URL`` (fsspec URLs, ``s3://bucket/prefix``). Optional:
  ``ML_ASSETS_OBJECTS_URL`` (the embedded version store's objects, when lakeFS is not used),
  ``ML_ASSETS_MAX_CONCURRENT_STEPS`` (the multiprocess executor's limit when it is chosen, default 4),
  ``ML_ASSETS_ALERT_WEBHOOK_URL`` (run-failure alerts; read at each tick, never stored) and
  ``ML_ASSETS_ALERT_INTERVAL_SECONDS`` (how often the alert sensor looks, default 30). The Dagster instance itself is configured by
  ``$DAGSTER_HOME/dagster.yaml`` (``ml_assets/instance/production.yaml``).
- ``ML_ASSETS_EXECUTOR``: how a run executes its steps, in either environment: ``in_process``
  (default: one run worker process runs the steps in order; the training step's ranks are torchrun
  processes anyway) or ``multiprocess`` (a process per step, forked from a server that imported the
  code and libraries once per run; ``ML_ASSETS_MAX_CONCURRENT_STEPS`` at once). benchmarks/orchestration
  measures the default.
- ``ML_ASSETS_RANK_START``: ``fork`` (default: trainer ranks fork from the trainer zygote,
  docs/training.md "How a rank starts") or ``exec`` (each rank a new Python process).
- ``ML_ASSETS_HOME``: the one directory the local environment writes to (default ``.ml_assets/``
  in the project's root: the Dagster project a model component belongs to or the command runs in,
  this checkout, else the working directory). A relative value is taken from the project's root.
- ``ML_ASSETS_MODELS_DIR``: a directory of model specs, or several separated by ``:``, for the code
  location ``-m ml_assets`` and the CLI (``make demo MODEL=flights_delay_ft`` adds
  ``examples/ft_transformer``). Unset: the project's model components (a Dagster project's defs
  folder), or the bundled ``models/`` in this checkout; elsewhere none, and the message says how to
  declare one.

Inside a Dagster project (ml_assets.project), the variables may also be set in the project's
``.env``, as ``dg dev`` reads it; the process's own environment wins over that file.
- ``ML_ASSETS_VERSION_STORE``: ``local`` (default, the embedded store under the home) or ``lakefs``
  (then ``LAKEFS_ENDPOINT``, ``LAKEFS_ACCESS_KEY_ID``, ``LAKEFS_SECRET_ACCESS_KEY`` and
  ``LAKEFS_STORAGE_NAMESPACE`` are read from the environment when a run needs them).
- ``ML_ASSETS_OPTUNA_STORAGE``: the tuning studies' database URL (default: SQLite under the home,
  for one trial worker); ``postgresql+psycopg://user:password@host/db`` for several workers.
- ``ML_ASSETS_DAGSTER_URL``: the Dagster UI's address, for run links in commit metadata and
  MLflow tags (default ``http://127.0.0.1:3000``, where ``make dev`` serves it).
- ``ML_ASSETS_TEAMS``: the teams this deployment serves, comma-separated (``fraud,search``): a spec
  naming another team is refused when definitions load. Unset: any valid team name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ml_assets.project import DgProject, find_project, project_at
from ml_assets.trainer import zygote

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLED_MODELS_DIR = PACKAGE_DIR / "models"
ENVIRONMENTS = ("local", "production", "k8s")
PRODUCTION_REQUIRED = ("MLFLOW_TRACKING_URI", "ML_ASSETS_ARTIFACTS_URL", "ML_ASSETS_CHECKPOINTS_URL")
VERSION_STORES = ("local", "lakefs")
# Pods share no disk: the tuning studies need a database every trial worker and re-run can reach.
K8S_REQUIRED = ("ML_ASSETS_OPTUNA_STORAGE",)
EXECUTORS = ("in_process", "multiprocess")
LAKEFS_VARIABLES = ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY", "LAKEFS_STORAGE_NAMESPACE")


def _project(project_root: Path | None) -> DgProject | None:
    """The project settings belong to: the one given, else the one the working directory is in,
    else this checkout (when the package runs from one)."""
    if project_root is not None:
        return project_at(project_root.resolve())
    found = find_project()
    if found is None:
        checkout = project_at(PACKAGE_DIR.parent)
        found = checkout if checkout is not None and checkout.is_this_checkout else None
    return found


def _paths(value: str, base: Path) -> list[Path]:
    return [(base / Path(p).expanduser()).resolve() for p in value.split(os.pathsep) if p.strip()]


@dataclass(frozen=True, kw_only=True)
class Settings:
    environment: str
    home: Path
    models_dirs: tuple[Path, ...]
    """Where model specs are declared, searched in order (a name declared in two of them is refused);
    empty: the project's model components."""
    project: DgProject | None = None
    """The Dagster project these settings were read for (its .env, its root for relative paths)."""
    version_store: str = "local"
    # Production: service locations from the environment (None locally: everything under the home).
    tracking_uri: str | None = None
    artifacts_url: str | None = None
    checkpoints_url: str | None = None
    objects_url: str | None = None
    executor: str = "in_process"
    teams: tuple[str, ...] = ()
    """The teams this deployment knows (ML_ASSETS_TEAMS); empty: any valid team name."""
    max_concurrent_steps: int = 4
    alert_interval_seconds: int = 30
    # Kubernetes: defaults for the training pods from the chart's values, the other steps' resources.
    k8s_training_defaults: dict | None = None
    k8s_step_resources: dict | None = None

    @property
    def production(self) -> bool:
        """The shared services (PostgreSQL, an MLflow server, object storage): production and k8s."""
        return self.environment in ("production", "k8s")

    @property
    def kubernetes(self) -> bool:
        return self.environment == "k8s"

    @property
    def artifacts_location(self) -> str:
        return self.artifacts_url or str(self.artifacts_root)

    @property
    def checkpoints_location(self) -> str:
        return self.checkpoints_url or str(self.checkpoints_root)

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    @property
    def version_store_root(self) -> Path:
        return self.home / "versions"

    @property
    def artifacts_root(self) -> Path:
        return self.home / "artifacts"

    @property
    def checkpoints_root(self) -> Path:
        return self.home / "checkpoints"

    @property
    def mlflow_dir(self) -> Path:
        return self.home / "mlflow"

    @property
    def mlflow_tracking_uri(self) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        return f"sqlite:///{self.mlflow_dir / 'mlflow.db'}"

    @property
    def mlflow_artifact_root(self) -> Path:
        return self.mlflow_dir / "artifacts"

    @property
    def tuning_dir(self) -> Path:
        return self.home / "tuning"

    @property
    def optuna_storage(self) -> str:
        return f"sqlite:///{self.tuning_dir / 'optuna.db'}"


class SettingsError(ValueError):
    """The environment does not describe a usable configuration; the message names the variable."""


def public_url(url: str) -> str:
    """``url`` without user:password, for links shown in the UI and in alerts."""
    from urllib.parse import urlunsplit

    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        # Unchanged: rebuilt, ``sqlite:////abs/path`` would lose a slash (an empty host is dropped).
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=host))


OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "az")


def object_store_url(name: str, value: str) -> str:
    """``value`` (the variable ``name``'s) without a trailing slash, once parsed as an object store's
    URL with a bucket: production's stores are shared by every machine, and a local path or
    ``file://`` URL is one machine's disk. The scheme's filesystem must be installed (s3fs is)."""
    url = value.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme.lower() not in OBJECT_STORE_SCHEMES or not parts.netloc:
        raise SettingsError(f"{name}={public_url(url)!r}: production expects an object-store URL with a bucket, such "
                            f"as s3://bucket/prefix ({', '.join(f'{s}://' for s in OBJECT_STORE_SCHEMES)}); a local "
                            "path or file:// URL is one machine's disk")
    import fsspec

    try:
        fsspec.get_filesystem_class(parts.scheme.lower())
    except (ImportError, ValueError) as exc:
        raise SettingsError(f"{name}={public_url(url)!r}: {exc}") from None
    return url


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    """``env[name]``, one of ``allowed`` (unset or empty: the first)."""
    value = env.get(name, "").strip() or allowed[0]
    if value not in allowed:
        raise SettingsError(f"{name}={value!r} is not one of {list(allowed)}")
    return value


def load_settings(environ: Mapping[str, str] | None = None, project_root: Path | None = None) -> Settings:
    """The settings of ``environ`` (default: the process's environment over the project's ``.env``)
    for the project at ``project_root`` (default: the one the working directory is in)."""
    project = _project(project_root)
    if environ is None:
        environ = {**(project.env_file() if project else {}), **os.environ}
    env = environ
    base = project.root if project else Path.cwd()
    environment = env.get("ML_ASSETS_ENV", "local").strip() or "local"
    if environment not in ENVIRONMENTS:
        raise SettingsError(
            f"ML_ASSETS_ENV={environment!r} is not supported; expected one of {list(ENVIRONMENTS)} "
            "(docs/deployment.md, docs/kubernetes.md)"
        )
    home = (base / Path(env.get("ML_ASSETS_HOME") or ".ml_assets").expanduser()).resolve()
    models = env.get("ML_ASSETS_MODELS_DIR", "").strip()
    models_dirs = tuple(_paths(models, base)) if models else (
        (BUNDLED_MODELS_DIR,) if project is not None and project.is_this_checkout else ())
    version_store = _choice(env, "ML_ASSETS_VERSION_STORE", VERSION_STORES)
    executor = _choice(env, "ML_ASSETS_EXECUTOR", EXECUTORS)
    _choice(env, zygote.RANK_START_ENV, zygote.RANK_STARTS)  # read where ranks start
    teams = _teams(env.get("ML_ASSETS_TEAMS", ""))
    counts = {}
    for name, default in (("ML_ASSETS_MAX_CONCURRENT_STEPS", "4"), ("ML_ASSETS_ALERT_INTERVAL_SECONDS", "30")):
        value = env.get(name, default).strip() or default
        if not value.isdigit() or int(value) < 1:
            raise SettingsError(f"{name}={value!r} is not a positive integer")
        counts[name] = int(value)
    if environment == "local":
        return Settings(environment=environment, home=home, models_dirs=models_dirs, project=project,
                        version_store=version_store, executor=executor, teams=teams,
                        max_concurrent_steps=counts["ML_ASSETS_MAX_CONCURRENT_STEPS"])
    required = PRODUCTION_REQUIRED + (K8S_REQUIRED if environment == "k8s" else ())
    missing = [name for name in required if not env.get(name, "").strip()]
    if missing:
        raise SettingsError(f"ML_ASSETS_ENV={environment} needs {', '.join(missing)} in the environment "
                         "(see docs/deployment.md)")
    if environment == "k8s" and version_store != "lakefs":
        # The embedded store keeps its refs in SQLite on one machine's disk; pods have none to share.
        raise SettingsError("ML_ASSETS_ENV=k8s needs ML_ASSETS_VERSION_STORE=lakefs: the embedded store's refs live "
                            "on one machine's disk (docs/kubernetes.md)")
    tracking = env["MLFLOW_TRACKING_URI"].strip()
    parsed = urlsplit(tracking)
    if parsed.scheme.lower() not in ("http", "https") or not parsed.hostname:
        raise SettingsError(f"MLFLOW_TRACKING_URI={public_url(tracking)!r}: production expects the MLflow server's "
                         "http(s):// address (see docs/deployment.md)")
    urls = {name: object_store_url(name, env[name]) for name in ("ML_ASSETS_ARTIFACTS_URL", "ML_ASSETS_CHECKPOINTS_URL")}
    objects = (env.get("ML_ASSETS_OBJECTS_URL") or "").strip()
    return Settings(environment=environment, home=home, models_dirs=models_dirs, project=project,
                    version_store=version_store, tracking_uri=tracking, artifacts_url=urls["ML_ASSETS_ARTIFACTS_URL"],
                    checkpoints_url=urls["ML_ASSETS_CHECKPOINTS_URL"],
                    objects_url=object_store_url("ML_ASSETS_OBJECTS_URL", objects) if objects else None,
                    executor=executor, teams=teams, max_concurrent_steps=counts["ML_ASSETS_MAX_CONCURRENT_STEPS"],
                    alert_interval_seconds=counts["ML_ASSETS_ALERT_INTERVAL_SECONDS"],
                    k8s_training_defaults=_json_object(env, "ML_ASSETS_K8S_TRAINING_DEFAULTS"),
                    k8s_step_resources=_json_object(env, "ML_ASSETS_K8S_STEP_RESOURCES"))


def _teams(value: str) -> tuple[str, ...]:
    from ml_assets.names import InvalidName, check_team_name

    teams = tuple(t.strip() for t in value.split(",") if t.strip())
    for team in teams:
        try:
            check_team_name(team)
        except InvalidName as exc:
            raise SettingsError(f"ML_ASSETS_TEAMS: {exc}") from None
    return teams


def _json_object(env, name: str) -> dict | None:
    import json

    raw = (env.get(name) or "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise SettingsError(f"{name}: expected a JSON object, got {type(value).__name__}")
    return value
