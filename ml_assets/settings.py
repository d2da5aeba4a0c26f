"""Where ml_assets keeps its state and which environment it runs in.

Read from the environment when definitions are built (never at import time):

- ``ML_ASSETS_ENV``: ``local`` (default; embedded, no server, no network). ``k8s`` is reserved for
  the production configuration and refused until it exists.
- ``ML_ASSETS_HOME``: the one directory the local environment writes to (default ``.ml_assets/``
  in the checkout, or in the working directory when the package is installed elsewhere).
- ``ML_ASSETS_MODELS_DIR``: the directory of model specs (default: the bundled ``models/``).
- ``ML_ASSETS_VERSION_STORE``: ``local`` (default, the embedded store under the home) or ``lakefs``
  (then ``LAKEFS_ENDPOINT``, ``LAKEFS_ACCESS_KEY_ID``, ``LAKEFS_SECRET_ACCESS_KEY`` and
  ``LAKEFS_STORAGE_NAMESPACE`` are read from the environment when a run needs them).
- ``ML_ASSETS_OPTUNA_STORAGE``: the tuning studies' database URL (default: SQLite under the home,
  for one trial worker); ``postgresql+psycopg://user:password@host/db`` for several workers.
- ``ML_ASSETS_DAGSTER_URL``: the Dagster UI's address, for run links in commit metadata and
  MLflow tags (default ``http://127.0.0.1:3000``, where ``make dev`` serves it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLED_MODELS_DIR = PACKAGE_DIR / "models"
ENVIRONMENTS = ("local",)
VERSION_STORES = ("local", "lakefs")
LAKEFS_VARIABLES = ("LAKEFS_ENDPOINT", "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY", "LAKEFS_STORAGE_NAMESPACE")


def _default_home() -> Path:
    checkout = PACKAGE_DIR.parent
    base = checkout if (checkout / "pyproject.toml").exists() else Path.cwd()
    return base / ".ml_assets"


@dataclass(frozen=True, kw_only=True)
class Settings:
    environment: str
    home: Path
    models_dir: Path
    version_store: str = "local"

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


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    environment = env.get("ML_ASSETS_ENV", "local").strip() or "local"
    if environment not in ENVIRONMENTS:
        raise ValueError(
            f"ML_ASSETS_ENV={environment!r} is not supported; expected one of {list(ENVIRONMENTS)}. "
            "The k8s/production configuration is not built yet (see docs/architecture.md)."
        )
    home = Path(env.get("ML_ASSETS_HOME") or _default_home()).expanduser().resolve()
    models_dir = Path(env.get("ML_ASSETS_MODELS_DIR") or BUNDLED_MODELS_DIR).expanduser().resolve()
    version_store = env.get("ML_ASSETS_VERSION_STORE", "local").strip() or "local"
    if version_store not in VERSION_STORES:
        raise ValueError(f"ML_ASSETS_VERSION_STORE={version_store!r} is not one of {list(VERSION_STORES)}")
    return Settings(environment=environment, home=home, models_dir=models_dir, version_store=version_store)
