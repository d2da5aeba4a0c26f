"""No orphaned trainers, through the real `dagster asset materialize` CLI (the run worker: its
in-process executor runs the training step, which starts torchrun, which starts two ranks).

Each kill is a SIGKILL, as an out-of-memory killer or a crashed node delivers it, at a moment
measured from when the ranks appear: while they import torch (0 s), while they join the rendezvous
and read their data (1 s, 3 s), and mid-training (after this run's first checkpoint). Afterwards no
process of this test's home may be left: the ranks run in sessions of their own, so nothing but
their own lifeline (ml_assets.processes) ends them. Each test trains its own seed, so its own
checkpoint directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from ml_assets.instance import LOCAL_INSTANCE
from ml_assets_tests.helpers import cli_env, small_training, spec_data, write_spec
from ml_assets_tests.test_e2e_cli import ml_assets_cli
from ml_assets_tests.trainer.toy import (
    processes_started_for,
    python_module,
    training_ranks,
    wait_for,
)

pytestmark = pytest.mark.e2e
DAY = dt.date(2013, 3, 4)
LEFT_BEHIND_AFTER = 10.0
"""The issue's bound: 10 s after a kill, no trainer process may be left."""


@dataclasses.dataclass
class Home:
    root: Path
    env: dict[str, str]

    @property
    def path(self) -> Path:
        return Path(self.env["ML_ASSETS_HOME"])

    def spec(self, seed: int, epochs: int, **checkpoint) -> Path:
        """A models directory with the bundled model trained for ``epochs`` with ``seed``."""

        data = small_training(spec_data(), window_days=3, epochs=epochs)
        data["training"].update(processes_per_node=2, batch_size=32, seed=seed,
                                checkpoint={"every_steps": 20, "every_seconds": 0, **checkpoint})
        models = self.root / f"models-{seed}"
        write_spec(models, data)
        return models

    def checkpoints(self) -> Path:
        return self.path / "checkpoints" / "flights_delay" / f"date={DAY.isoformat()}"

    def start(self, models: Path, select: str = "flights_delay/trained_checkpoint") -> tuple[subprocess.Popen, Path]:
        """`dagster asset materialize` in a session of its own (its process group is the run worker's)."""
        log = self.root / f"run-{time.monotonic_ns()}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "ml_assets", "--select", select,
             "--partition", DAY.isoformat()],
            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
            env=cli_env(ML_ASSETS_MODELS_DIR=str(models), **self.env))
        return proc, log


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Home:
    """A home with the three days of a 3-day window ingested (once for the module, by one
    `ml-assets backfill`)."""
    root = tmp_path_factory.mktemp("orphans")
    dagster_home = root / "home" / "dagster"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text(LOCAL_INSTANCE.read_text())
    world = Home(root, {"ML_ASSETS_HOME": str(root / "home"), "DAGSTER_HOME": str(dagster_home),
                        "MLFLOW_DISABLE_TELEMETRY": "true"})
    models = world.spec(seed=0, epochs=1)
    filled = ml_assets_cli("backfill", "flights_delay", "--start", (DAY - dt.timedelta(days=3)).isoformat(),
                           "--end", (DAY - dt.timedelta(days=1)).isoformat(), models_dir=models, **world.env)
    assert filled.returncode == 0, filled.stderr[-4000:]
    return world


def processes_of(home: Home) -> dict[int, list[str]]:
    return processes_started_for(home.env["ML_ASSETS_HOME"])


def ranks(home: Home) -> list[int]:
    return training_ranks(home.env["ML_ASSETS_HOME"])


def agent(home: Home) -> int:
    agents = [pid for pid, cmd in processes_of(home).items() if python_module(cmd) == "ml_assets.trainer.agent"]
    assert len(agents) == 1, processes_of(home)
    return agents[0]


def trainers(home: Home) -> dict[int, list[str]]:
    """The training processes: torchrun's agent, the ranks, anything they started."""
    return {pid: cmd for pid, cmd in processes_of(home).items() if python_module(cmd) != "dagster"}


def wait_for_ranks(home: Home, proc: subprocess.Popen, log: Path) -> float:
    """When both ranks exist (the moment the clock of each kill starts)."""
    wait_for(lambda: len(ranks(home)) == 2 or proc.poll() is not None, timeout=180, what="two training ranks")
    assert proc.poll() is None, log.read_text()[-4000:]
    return time.monotonic()


def new_checkpoint(home: Home, since: float) -> bool:
    return any(p.stat().st_mtime > since for p in home.checkpoints().glob("train-*/step-*/manifest.json"))


def assert_nothing_left(home: Home) -> float:
    """Seconds until no trainer process is left; fails if one is still there after 10 s."""
    killed = time.monotonic()
    while time.monotonic() - killed < LEFT_BEHIND_AFTER:
        if not trainers(home):
            gone = time.monotonic() - killed
            print(f"no trainer process left {gone:.2f}s after the kill")
            return gone
        time.sleep(0.05)
    left = trainers(home)
    for pid in left:  # no leftovers for the next test, whatever this one found
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"{LEFT_BEHIND_AFTER:.0f}s after the kill, trainer processes are left: {left}")


@pytest.mark.parametrize("after_seconds", [0.0, 1.0, 3.0])
def test_killing_the_run_workers_process_group_as_the_ranks_start_leaves_no_trainer(home, after_seconds):
    proc, log = home.start(home.spec(seed=100 + int(after_seconds), epochs=200))
    start = wait_for_ranks(home, proc, log)
    time.sleep(max(0.0, start + after_seconds - time.monotonic()))
    os.killpg(proc.pid, signal.SIGKILL)  # the run worker and its torchrun agent, not the ranks' sessions
    proc.wait()
    assert_nothing_left(home)


def kill_the_group_mid_training(home: Home, models: Path) -> None:
    proc, log = home.start(models)
    started = time.time()
    wait_for_ranks(home, proc, log)
    wait_for(lambda: new_checkpoint(home, started), timeout=180, what="a checkpoint of this run")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_nothing_left(home)


def test_killing_the_run_workers_process_group_mid_training_leaves_no_trainer(home):
    kill_the_group_mid_training(home, home.spec(seed=110, epochs=200))


@pytest.mark.parametrize("moment", ["ranks starting", "mid-training"])
def test_killing_torchrun_alone_leaves_no_trainer_and_fails_the_step(home, moment):
    proc, log = home.start(home.spec(seed=120 if moment == "ranks starting" else 121, epochs=200))
    started = time.time()
    wait_for_ranks(home, proc, log)
    if moment == "mid-training":
        wait_for(lambda: new_checkpoint(home, started), timeout=180, what="a checkpoint of this run")
    os.kill(agent(home), signal.SIGKILL)
    assert_nothing_left(home)
    assert proc.wait(timeout=120) != 0
    assert "torchrun was killed by SIGKILL" in log.read_text()


def test_a_rerun_after_a_kill_resumes_from_the_last_checkpoint_and_registers_one_version(home):
    models = home.spec(seed=130, epochs=12)
    kill_the_group_mid_training(home, models)

    again, log = home.start(models, select="group:flights_delay")
    assert again.wait(timeout=600) == 0, log.read_text()[-5000:]
    text = log.read_text()
    assert "resumed from" in text, text[-5000:]
    with dg.DagsterInstance.from_config(home.env["DAGSTER_HOME"]) as instance:
        record = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["flights_delay", "trained_checkpoint"]),
                                  asset_partitions=[DAY.isoformat()]), limit=1).records[0]
        meta = {k: v.value for k, v in record.asset_materialization.metadata.items()}
    assert meta["resumed_from_step"] > 0 and meta["steps"] > meta["resumed_from_step"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home.path}/mlflow/mlflow.db")
    versions = client.search_model_versions("name='flights_delay'")
    assert len(versions) == 1
    assert versions[0].tags["checkpoint_sha256"] == meta["checkpoint_sha256"]


def test_two_trainings_of_one_partition_at_once_never_write_its_checkpoints_together(home):
    models = home.spec(seed=140, epochs=25)
    (first, first_log), (second, second_log) = home.start(models), home.start(models)
    assert first.wait(timeout=600) == 0, first_log.read_text()[-5000:]
    assert second.wait(timeout=600) == 0, second_log.read_text()[-5000:]
    with dg.DagsterInstance.from_config(home.env["DAGSTER_HOME"]) as instance:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["flights_delay", "trained_checkpoint"]),
                                  asset_partitions=[DAY.isoformat()]), limit=2).records
        runs = [(r.run_id, {k: v.value for k, v in r.asset_materialization.metadata.items()}) for r in records]
    assert len(runs) == 2
    (earlier_run, earlier), (_, later) = sorted(runs, key=lambda run: run[1]["checkpoint_lease"]["acquired_at"])
    # One after the other, never together: the second took the lease after the first released it.
    assert earlier["checkpoint_lease"]["released_at"] <= later["checkpoint_lease"]["acquired_at"]
    assert later["checkpoint_lease"]["waited_s"] > 0
    assert earlier["checkpoint_dir"] == later["checkpoint_dir"]
    assert earlier["checkpoint_sha256"] == later["checkpoint_sha256"]  # the same training, once
    assert later["resumed_from_step"] == later["steps"]  # it found the training finished: nothing to write
    waited = next(log for log in (first_log, second_log) if "is held by" in log.read_text()).read_text()
    assert f"Dagster run {earlier_run}" in waited and "waiting up to" in waited
    assert not trainers(home)


def test_a_second_training_that_may_not_wait_fails_naming_the_one_that_holds_the_lease(home):
    models = home.spec(seed=150, epochs=200, lease_wait_seconds=0)
    runs = [home.start(models), home.start(models)]
    wait_for(lambda: any(proc.poll() is not None for proc, _ in runs), timeout=300, what="one run to end")
    (loser, loser_log), (winner, _) = sorted(runs, key=lambda run: run[0].poll() is None)
    assert loser.wait() != 0
    text = loser_log.read_text()
    assert "is being written by another training" in text and "lease_wait_seconds 0" in text, text[-4000:]
    holder = text.split("another training: pid ")[1].split(",")[0]  # "<pid> on <host> (Dagster run <id>)"
    assert "(Dagster run " in holder
    assert winner.poll() is None  # the holder trains on, untouched
    os.killpg(winner.pid, signal.SIGKILL)
    winner.wait()
    assert_nothing_left(home)
