"""Small learnable data and torchrun helpers for the trainer's tests."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks._processes import descendants, free_port, kill_tree  # noqa: F401 - the tests' names for them
from ml_assets.features.state import fit_state, state_bytes
from ml_assets.spec import FeaturesSpec
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets_tests.helpers import cli_env


def frame(rng: np.random.Generator, n: int) -> pl.DataFrame:
    x = rng.normal(size=n)
    group = rng.choice(["a", "b", "c"], size=n)
    logit = 2.5 * x + np.where(group == "a", 1.5, -1.0)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return pl.DataFrame({"x": x, "noise": rng.normal(size=n), "group": group, "label": y})


def ref(path: Path) -> DataRef:
    return DataRef(uri=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def toy_data(root: Path, train_rows: int = 3000, val_rows: int = 501, seed: int = 0) -> dict:
    """Files written under root; returns the TrainConfig fields that name them."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    train, val = frame(rng, train_rows), frame(rng, val_rows)
    train.write_parquet(root / "train.parquet")
    val.write_parquet(root / "val.parquet")
    state = fit_state(train, FeaturesSpec(numeric=["x", "noise"], categorical=["group"]), "label", "binary_classification")
    (root / "state.json").write_bytes(state_bytes(state))
    return {"model": "toy", "task": "binary_classification", "train_files": [ref(root / "train.parquet")],
            "val_files": [ref(root / "val.parquet")], "feature_state": ref(root / "state.json")}


def write_config(path: Path, data: dict, **fields) -> TrainConfig:
    cfg = TrainConfig(**{**data, **fields})
    path.write_text(cfg.to_json())
    return cfg


def torchrun_args(config: Path, nproc: int = 1, max_restarts: int = 0) -> list[str]:
    return [sys.executable, "-m", "ml_assets.trainer.agent", "--standalone", f"--nproc_per_node={nproc}",
            f"--max-restarts={max_restarts}", "-m", "ml_assets.trainer", "--config", str(config)]


def run(args: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          env=cli_env(OMP_NUM_THREADS="1", **env))


def start(args: list[str], log: Path, **env: str) -> subprocess.Popen:
    """In its own process group (so the whole tree can be killed), output to a file."""
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True,
                            env=cli_env(OMP_NUM_THREADS="1", **env))


def wait_for(predicate: Callable[[], bool], timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def complete_checkpoints(root: Path) -> list[dict]:
    """progress.json of every checkpoint with a manifest, oldest first."""
    out = []
    for d in sorted(root.glob("step-*")):
        try:
            if (d / "manifest.json").exists():
                out.append(json.loads((d / "progress.json").read_text()))
        except FileNotFoundError:  # pruned (keep_last) by the running trainer between the two reads
            continue
    return out


def worker_pids(agent_pid: int) -> list[int]:
    """Children of the torchrun agent (its worker processes)."""
    children = Path(f"/proc/{agent_pid}/task/{agent_pid}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def processes_started_for(home: str | Path) -> dict[int, list[str]]:
    """Every live process whose environment names ``home`` as ML_ASSETS_HOME (so: started for a
    test's home, however far down the chain), with its command line. Zombies are not live."""
    marker = f"ML_ASSETS_HOME={home}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if state not in ("Z", "X"):
            found[int(entry.name)] = cmdline
    return found


def python_module(cmd: list[str]) -> str:
    """The module a ``python [-u] -m MODULE ...`` command line runs ("" for anything else)."""
    return cmd[cmd.index("-m") + 1] if "-m" in cmd[:4] else ""


def training_ranks(home: str | Path) -> list[int]:
    return [pid for pid, cmd in processes_started_for(home).items() if python_module(cmd) == "ml_assets.trainer"]
