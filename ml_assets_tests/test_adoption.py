"""What a team does to adopt ml_assets in its own Dagster project, done as README.md's "Use it in your
own project" says, with nothing of this checkout but the built wheel:

build the wheel from a copy of the source; install it into a fresh virtual environment; make a
project with `create-dagster`; scaffold a model with `dg scaffold defs`, declared on CSV files
generated in a folder of the project, beside an asset of the project's own; `dg check defs`,
`dg list defs`; ingest a window with `ml-assets backfill`; `dg launch` the daily job for one day
until a version is registered; promote it; serve it with `mlflow models serve` and call it over HTTP.

The venv is installed with `uv pip install` (the same resolution as pip's, from a cache: seconds
instead of pip's minutes here), with --find-links /opt/wheels where that folder holds the CPU build of
torch. Small data (8 days of 240 orders), one rank, two epochs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ml_assets_tests.helpers import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
TOOLS = Path(sys.executable).parent  # uv and create-dagster: dev dependencies of this checkout
START = dt.date(2024, 3, 1)
DAYS = 8
SPEC = """\
type: ml_assets.components.ModelComponent
attributes:
  name: late_orders
  description: Will an order be delivered late?
  owner: fulfilment
  source:
    kind: files
    rows: {path: "{{ context.project_root }}/data/orders/{date}.csv", format: csv}
  schema:
    keys: [order_id]
    columns:
      order_id: {dtype: string}
      placed_at: {dtype: string}
      region: {dtype: string, allowed: [north, south, east, west]}
      amount: {dtype: float64, min: 0}
      items: {dtype: int64, min: 1}
      late: {dtype: int64, min: 0, max: 1, after_event: true}
  partitioning: {start: 2024-03-01, end: 2024-12-31, timezone: UTC, timestamp_column: placed_at}
  target: {name: is_late, expression: late == 1, task: binary_classification}
  features:
    numeric: [amount, items]
    categorical: [region]
  training: {window_days: 3, validation_days: 1, epochs: 2, batch_size: 64, processes_per_node: 1}
  evaluation: {test_days: 1, metrics: [roc_auc, log_loss], slice_columns: [region], min_slice_size: 20}
  promotion: {primary_metric: roc_auc, min_improvement: 0.0, beat_baseline: false}
"""
OWN_ASSET = '''\
import dagster as dg


@dg.asset
def orders_summary() -> None:
    """The team's own asset, beside its model."""
'''


def write_orders(folder: Path) -> None:
    """Generated orders, one CSV a day; lateness depends on the items, the region and the hour."""
    rng = np.random.default_rng(7)
    folder.mkdir(parents=True)
    for i in range(DAYS):
        day, n = START + dt.timedelta(days=i), 240
        region = rng.choice(["north", "south", "east", "west"], n)
        items, hour = rng.integers(1, 12, n), rng.integers(0, 24, n)
        logit = -1.5 + 0.15 * items + 0.8 * (region == "north") + 0.02 * (hour - 12) + rng.normal(0, 0.5, n)
        pl.DataFrame({
            "order_id": [f"{day:%Y%m%d}-{k:04d}" for k in range(n)],
            "placed_at": [f"{day.isoformat()}T{h:02d}:{m:02d}:00Z" for h, m in zip(hour, rng.integers(0, 60, n), strict=True)],
            "region": region, "amount": rng.gamma(2.0, 30.0, n).round(2), "items": items,
            "late": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int),
        }).write_csv(folder / f"{day.isoformat()}.csv")


class User:
    """A shell in the project with the fresh venv activated, as the README has the user work."""

    def __init__(self, root: Path, venv: Path) -> None:
        self.root, self.venv = root, venv
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("ML_ASSETS_", "DAGSTER_", "MLFLOW_"))}
        keep.pop("PYTHONPATH", None)
        self.env = {**keep, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{keep.get('PATH', '')}",
                    "DAGSTER_HOME": str(root / ".dagster"), "COLUMNS": "200", "NO_COLOR": "1", "DO_NOT_TRACK": "1",
                    "DAGSTER_DISABLE_TELEMETRY": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}

    def run(self, *args: str, timeout: int = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(args), cwd=cwd or self.root, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return proc


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> User:
    work = tmp_path_factory.mktemp("adoption")
    # The wheel, built from a copy of the source (the files git tracks), as a user builds one.
    source = work / "source"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(work / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (work / "dist").glob("ml_assets-*.whl")
    # A fresh venv holding that wheel and what it requires, and nothing of this checkout.
    venv = work / "venv"
    subprocess.run([str(TOOLS / "uv"), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True,
                   capture_output=True, timeout=120)
    links = ["--find-links", "/opt/wheels"] if Path("/opt/wheels").is_dir() else []
    # --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (CI
    # here) every process in the venv would then compile dagster, mlflow and torch from source.
    install = [str(TOOLS / "uv"), "pip", "install", "--quiet", "--compile-bytecode", "--python",
               str(venv / "bin" / "python"), *links]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, text=True, timeout=900)
    # The project, as create-dagster makes it, installed into the venv.
    subprocess.run([str(TOOLS / "create-dagster"), "project", "late_orders_project", "--no-uv-sync"], cwd=work,
                   check=True, capture_output=True, timeout=120)
    root = work / "late_orders_project"
    subprocess.run([*install, "-e", str(root)], check=True, capture_output=True, text=True, timeout=600)
    return User(root, venv)


def test_a_user_scaffolds_checks_ingests_launches_registers_and_serves_a_model(user):
    root, defs = user.root, user.root / "src" / "late_orders_project" / "defs"
    imported = user.run("python", "-c", "import ml_assets; print(ml_assets.__file__)").stdout
    assert str(user.venv) in imported, "the wheel, not this checkout"
    write_orders(root / "data" / "orders")
    user.run("dg", "scaffold", "defs", "ml_assets.components.ModelComponent", "late_orders")
    (defs / "late_orders" / "defs.yaml").write_text(SPEC)
    (defs / "own.py").write_text(OWN_ASSET)

    assert "All definitions loaded successfully." in user.run("dg", "check", "defs").stdout
    listed = {a["asset_key"] for a in json.loads(user.run("dg", "list", "defs", "--json").stdout)["assets"]}
    assert {"orders_summary", "late_orders/raw_data", "late_orders/registered_model"} <= listed
    assert not any(key.startswith("flights_delay/") for key in listed), "the demo's models stay out"

    paths = dict(line.split(None, 1) for line in user.run("ml-assets", "paths").stdout.splitlines())
    assert paths["home"] == str(root / ".ml_assets") and paths["project"] == str(root)
    last = START + dt.timedelta(days=3)
    filled = user.run("ml-assets", "backfill", "late_orders", "--start", START.isoformat(), "--end", last.isoformat())
    assert "late_orders: 4 day(s) ingested, validated and featurized, 0 already published" in filled.stdout
    day = (START + dt.timedelta(days=4)).isoformat()
    # From another folder: nothing in the spec depends on the working directory.
    launched = user.run("dg", "launch", "--job", "late_orders_daily", "--partition", day, "--target-path", str(root),
                        cwd=root / "data")
    assert "late_orders version 1 (@challenger)" in launched.stderr + launched.stdout
    user.run("ml-assets", "promote", "late_orders", "1", "--reason", "the first model, reviewed")

    port = free_port()
    server = subprocess.Popen(["mlflow", "models", "serve", "-m", "models:/late_orders@champion", "--env-manager",
                               "local", "--host", "127.0.0.1", "--port", str(port)], cwd=root,
                              env={**user.env, "MLFLOW_TRACKING_URI": paths["mlflow_tracking_uri"].strip()},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until_serving(server, port)
        row = {"amount": 12.5, "items": 3, "region": "north", "placed_at": "2024-03-09T10:00:00Z"}
        status, body = post(port, {"dataframe_records": [row, {**row, "items": 11}]})
        assert status == 200 and len(body["predictions"]) == 2, body
        assert all(0 < p < 1 for p in body["predictions"])
        status, body = post(port, {"dataframe_records": [{k: v for k, v in row.items() if k != "items"}]})
        assert status == 400 and "Model is missing inputs ['items']" in body["message"], body
        status, body = post(port, {"dataframe_records": [{**row, "amount": "twelve"}]})
        assert status == 400 and "column amount" in body["message"], body
    finally:
        os.killpg(server.pid, 9)
        server.wait()


def wait_until_serving(server: subprocess.Popen, port: int, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"mlflow models serve exited: {server.stderr.read()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("mlflow models serve did not answer /ping")


def post(port: int, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
