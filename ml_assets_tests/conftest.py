"""Shared fixtures: the bundled spec's data, a temporary home, an S3 server. The plain helpers the
tests share (spec builders, package writers, data files) are in helpers.py."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ml_assets.instance import LOCAL_INSTANCE
from ml_assets_tests.helpers import free_port, spec_data


@pytest.fixture(scope="session")
def bundled_spec_dict() -> dict:
    return spec_data()


@pytest.fixture
def spec_dict(bundled_spec_dict: dict) -> dict:
    return copy.deepcopy(bundled_spec_dict)


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
