"""The production switch without services: what it requires, what it builds, and the instance
configuration it ships (the services themselves are exercised in test_services.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ml_assets.deploy.run_launcher import WORKER_PRELOAD
from ml_assets.instance import PRODUCTION_INSTANCE
from ml_assets.pipeline.graph import GPU_POOL
from ml_assets.pipeline.jobs import MAX_RUNTIME_TAG, TRAINING_TEAM_TAG
from ml_assets.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = {"ML_ASSETS_ENV": "production", "MLFLOW_TRACKING_URI": "https://ml:s3cret@mlflow.internal",
              "ML_ASSETS_ARTIFACTS_URL": "s3://bucket/artifacts/", "ML_ASSETS_CHECKPOINTS_URL": "s3://bucket/ckpt"}


def test_production_names_every_missing_variable():
    with pytest.raises(ValueError, match="needs MLFLOW_TRACKING_URI, ML_ASSETS_ARTIFACTS_URL, ML_ASSETS_CHECKPOINTS_URL"):
        load_settings({"ML_ASSETS_ENV": "production"})


@pytest.mark.parametrize(("name", "value", "message"), [
    ("MLFLOW_TRACKING_URI", "sqlite:///x.db", "expects the MLflow server's http"),
    ("MLFLOW_TRACKING_URI", "http://", "expects the MLflow server's http"),
    ("ML_ASSETS_ARTIFACTS_URL", "/var/lib/artifacts", "expects an object-store URL"),
    # The check parses the URL: it once only looked for "://", so file:// (one machine's disk) passed.
    ("ML_ASSETS_CHECKPOINTS_URL", "file:///var/lib/checkpoints", "ML_ASSETS_CHECKPOINTS_URL='file:///var/lib/checkpoints': "
                                                                 "production expects an object-store URL with a bucket"),
    ("ML_ASSETS_CHECKPOINTS_URL", "s3:///no-bucket", "expects an object-store URL with a bucket"),
    ("ML_ASSETS_OBJECTS_URL", "local://objects", "ML_ASSETS_OBJECTS_URL='local://objects': production expects"),
    ("ML_ASSETS_ARTIFACTS_URL", "gs://bucket/artifacts", "ML_ASSETS_ARTIFACTS_URL='gs://bucket/artifacts': .*gcsfs"),
    ("ML_ASSETS_MAX_CONCURRENT_STEPS", "0", "is not a positive integer"),
    ("ML_ASSETS_ALERT_INTERVAL_SECONDS", "soon", "is not a positive integer"),
])
def test_production_refuses_bad_values(name, value, message):
    with pytest.raises(ValueError, match=message):
        load_settings({**PRODUCTION, name: value})


def test_a_password_in_the_tracking_uri_is_never_shown():
    with pytest.raises(ValueError) as raised:
        load_settings({**PRODUCTION, "MLFLOW_TRACKING_URI": "ftp://ml:s3cret@mlflow.internal"})
    assert "s3cret" not in str(raised.value)
    settings = load_settings(PRODUCTION)
    assert settings.artifacts_location == "s3://bucket/artifacts" and settings.checkpoints_location == "s3://bucket/ckpt"


def built_definitions(**extra: str) -> dict:
    """Production definitions built in a fresh process (definitions are cached per process)."""
    code = """
import json
from ml_assets.definitions import build_definitions
defs = build_definitions()
repo = defs.get_repository_def()
daily = repo.get_job("flights_delay_daily")
ckpt = next(a for a in repo.assets_defs_by_key.values() if a.key.path[-1] == "trained_checkpoint")
print(json.dumps({
    "executor": daily.executor_def.name, "executor_config": getattr(daily.executor_def.config_schema, "_config_fn", lambda _: None)({}),
    "sensors": sorted(s.name for s in repo.sensor_defs),
    "pool": ckpt.op.pool, "tags": dict(daily.tags), "ingest_tags": dict(repo.get_job("flights_delay_ingest").tags),
    "tracking": repr(str.__str__(defs.resources["tracking"].tracking_uri)), "artifacts": defs.resources["artifacts"].root,
}))
"""
    env = {**os.environ, **PRODUCTION, **extra}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def test_production_definitions():
    """Executor, sensor, pools, tags."""
    built = built_definitions()
    assert built["executor"] == "in_process"  # the default in production too (benchmarks/orchestration)
    assert "run_failure_alerts" in built["sensors"]
    assert built["pool"] == GPU_POOL
    assert built["tags"][TRAINING_TEAM_TAG] == "ml-platform" and built["tags"][MAX_RUNTIME_TAG] == str(360 * 60)
    assert TRAINING_TEAM_TAG not in built["ingest_tags"] and MAX_RUNTIME_TAG not in built["ingest_tags"]
    # An EnvVar: the URL with its password is resolved in the run, never written into the config.
    assert built["tracking"] == "'MLFLOW_TRACKING_URI'"
    assert built["artifacts"] == "s3://bucket/artifacts"


def test_the_multiprocess_executor_when_chosen_forks_steps_from_a_preloaded_server():
    from ml_assets.platform import STEP_PRELOAD

    built = built_definitions(ML_ASSETS_EXECUTOR="multiprocess", ML_ASSETS_MAX_CONCURRENT_STEPS="3")
    assert built["executor"] == "multiprocess" and built["executor_config"]["max_concurrent"] == 3
    assert built["executor_config"]["start_method"] == {"forkserver": {"preload_modules": list(STEP_PRELOAD)}}
    assert STEP_PRELOAD[0] == "ml_assets.deploy.preload"
    with pytest.raises(ValueError, match="ML_ASSETS_EXECUTOR='threads' is not one of"):
        load_settings({**PRODUCTION, "ML_ASSETS_EXECUTOR": "threads"})


def test_the_shipped_instance_configuration_is_valid(tmp_path, monkeypatch):
    from dagster._core.instance.config import dagster_instance_config

    (tmp_path / "dagster.yaml").write_text(PRODUCTION_INSTANCE.read_text())
    monkeypatch.setenv("ML_ASSETS_DAGSTER_POSTGRES_URL", "postgresql://user@db.internal/dagster")
    monkeypatch.setenv("ML_ASSETS_COMPUTE_LOGS_BUCKET", "logs")
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["compute_logs"]["module"] == "dagster_aws.s3.compute_log_manager"
    assert config["run_launcher"] == {"module": "ml_assets.deploy.run_launcher", "class": "LocalProcessRunLauncher",
                                      "config": {"start_method": "forkserver"}}
    assert config["run_monitoring"]["enabled"] and config["run_monitoring"]["max_resume_run_attempts"] > 0
    assert config["run_retries"]["retry_on_asset_or_op_failure"] is False
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert limits == [{"key": TRAINING_TEAM_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 2}]
    raw = yaml.safe_load(PRODUCTION_INSTANCE.read_text())
    assert raw["storage"]["custom"] == {"module": "ml_assets.deploy.pg_storage", "class": "PooledPostgresStorage",
                                        "config": {"postgres_url": {"env": "ML_ASSETS_DAGSTER_POSTGRES_URL"}}}  # no secret


@pytest.mark.slow
def test_the_launchers_preload_is_installed_libraries_only_and_starts_no_thread():
    """The launcher's server forks run workers after importing WORKER_PRELOAD: a thread alive at the
    fork would be lost (or hold a lock) in every worker, and a module of the project would be stale
    after an edit. Each name must also import, or it silently preloads nothing."""
    script = ("import importlib, json, sys, threading\n"
              "for name in json.loads(sys.argv[1]): importlib.import_module(name)\n"
              "print(json.dumps([threading.active_count(), sorted(m for m in sys.modules if m.startswith('ml_assets'))]))")
    out = subprocess.run([sys.executable, "-c", script, json.dumps(list(WORKER_PRELOAD))],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [1, []]


def test_the_cli_names_a_bad_environment_in_one_line():
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION}
    out = subprocess.run([sys.executable, "-m", "ml_assets.cli", "paths"], env={**env, "ML_ASSETS_ENV": "production"},
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == ("ml-assets: ML_ASSETS_ENV=production needs MLFLOW_TRACKING_URI, ML_ASSETS_ARTIFACTS_URL, "
                                  "ML_ASSETS_CHECKPOINTS_URL in the environment (see docs/deployment.md)")
