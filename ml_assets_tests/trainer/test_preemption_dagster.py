"""Preemption through Dagster: SIGTERM to the running trainer during `dagster asset materialize`
checkpoints, the asset raises a retryable failure, its RetryPolicy runs the step again, and the
retry resumes from the checkpoint instead of starting over."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from ml_assets_tests.helpers import cli_env, small_training, write_spec
from ml_assets_tests.test_e2e_cli import backfill_window, latest_metadata
from ml_assets_tests.trainer.toy import descendants, python_module, wait_for

pytestmark = pytest.mark.e2e


def trainer_workers(root: int) -> list[int]:
    """The trainer processes (torchrun's workers) under the dagster CLI process ``root``."""
    pids = []
    for pid in descendants(root):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if python_module([part.decode(errors="replace") for part in cmdline]) == "ml_assets.trainer":  # a rank
            pids.append(pid)
    return pids


def start_training(home: Path, tmp_path: Path, spec_dict: dict, **training) -> tuple[subprocess.Popen, Path, dt.date]:
    """Ingest the three days of a 3-day window (one `ml-assets backfill`, in this process), start
    `dagster asset materialize` of the training step, and wait until it has written a checkpoint.
    60 epochs of two days (~900 steps; the first checkpoint at step 20): the kill lands early, and
    what is left after the resume is a short training (300 epochs cost each test two minutes of
    training after it)."""
    models = tmp_path / "models"
    data = small_training(spec_dict, window_days=3, epochs=60)
    data["training"].update(processes_per_node=1, checkpoint={"every_steps": 20, "every_seconds": 0}, **training)
    write_spec(models, data)
    day = dt.date(2013, 3, 4)
    backfill_window(day, models)
    log = tmp_path / "materialize.log"
    cli = subprocess.Popen(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "ml_assets", "--select",
         "flights_delay/trained_checkpoint", "--partition", day.isoformat()],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), env=cli_env(ML_ASSETS_MODELS_DIR=str(models)),
    )
    ckpts = home / "checkpoints" / "flights_delay" / f"date={day.isoformat()}"
    wait_for(lambda: any(ckpts.glob("train-*/step-*/manifest.json")), timeout=300, what="a checkpoint")
    return cli, log, day


def test_sigterm_to_the_trainer_is_retried_and_resumes(home, tmp_path, spec_dict):
    cli, log, day = start_training(home, tmp_path, spec_dict, retries=2)
    workers = trainer_workers(cli.pid)
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGTERM)
    assert cli.wait(timeout=600) == 0, log.read_text()[-5000:]

    text = log.read_text()
    assert "TrainingPreempted" in text and "the retry resumes from there" in text
    assert "STEP_UP_FOR_RETRY" in text
    meta = latest_metadata(dg.DagsterInstance.get(), "trained_checkpoint", day)
    assert meta is not None and meta["resumed_from_step"] > 0, text[-3000:]
    assert meta["steps"] > meta["resumed_from_step"], text[-3000:]
    ckpts = home / "checkpoints" / "flights_delay" / f"date={day.isoformat()}"
    assert len(list(ckpts.glob("train-*"))) == 1  # the retry used the same checkpoints, not new ones


def test_a_killed_worker_is_restarted_by_torchrun_within_the_same_step(home, tmp_path, spec_dict):
    """SIGKILL (a crash, not a preemption): torchrun restarts the worker, it resumes, and the
    restarted rank 0's result still reaches Dagster; the step itself succeeds on its first attempt."""
    cli, log, day = start_training(home, tmp_path, spec_dict, max_restarts=2)
    workers = trainer_workers(cli.pid)
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGKILL)
    assert cli.wait(timeout=600) == 0, log.read_text()[-5000:]

    text = log.read_text()
    assert "STEP_UP_FOR_RETRY" not in text
    meta = latest_metadata(dg.DagsterInstance.get(), "trained_checkpoint", day)
    assert meta is not None and meta["resumed_from_step"] > 0, text[-3000:]
    assert meta["steps"] > meta["resumed_from_step"]
