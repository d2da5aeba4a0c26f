"""Shared by the training benchmarks: the bundled model's real features as trainer inputs, and the
trainer run through torchrun as the ``trained_checkpoint`` asset runs it, with one difference: the
ranks here are exec'd (``-m ml_assets.trainer``, the asset's path under ``ML_ASSETS_RANK_START=exec``)
where the asset forks them from the trainer zygote. The training code is the same; only a rank's
start differs (seconds of imports instead of milliseconds), which no loop figure here counts.
benchmarks/retrain_cost.py and benchmarks/orphans.py run the forked path."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

from ml_assets.features.build import build_features
from ml_assets.features.state import fit_state, state_bytes
from ml_assets.ingest.sources import _bundled_table, local_day
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import load_spec
from ml_assets.trainer.config import DataRef, TrainConfig

SPEC = load_spec(BUNDLED_MODELS_DIR / "flights_delay.yaml")


def ref(path: Path) -> DataRef:
    """A local file pinned by its sha256, as the trainer reads it."""
    return DataRef(uri=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def bundled_inputs(root: Path, train_days: int) -> dict:
    """Features of the first ``train_days`` days of 2013 (train) and the next day (validation),
    built by the platform's own feature code, as TrainConfig fields."""
    flights, _ = _bundled_table("flights")
    day = pl.date(pl.col("year"), pl.col("month"), pl.col("day"))
    rows = flights.filter(day <= dt.date(2013, 1, 1) + dt.timedelta(days=train_days))
    tables = {"rows": rows, **{n: _bundled_table(t.table)[0] for n, t in SPEC.source.dimensions.items()}}
    features = build_features(SPEC, tables).frame.sort("__timestamp")
    # The day a flight belongs to is its local day (the spec's partitions), not its UTC day: split by
    # UTC day, the "validation day" would be the previous evening's flights past midnight UTC.
    day_of = local_day("__timestamp", features.schema["__timestamp"], SPEC.partitioning.timezone)
    last = features.select(day_of.max()).item()
    train = features.filter(day_of < last)
    val = features.filter(day_of == last)
    root.mkdir(parents=True, exist_ok=True)
    train.write_parquet(root / "train.parquet")
    val.write_parquet(root / "val.parquet")
    state = fit_state(train, SPEC.features, SPEC.target.name, SPEC.target.task)
    (root / "state.json").write_bytes(state_bytes(state))
    return {"model": SPEC.name, "task": SPEC.target.task, "train_files": [ref(root / "train.parquet")],
            "val_files": [ref(root / "val.parquet")], "feature_state": ref(root / "state.json")}


def spec_training() -> dict:
    """The bundled spec's training hyperparameters as TrainConfig fields."""
    t, m = SPEC.training, SPEC.model
    return {"batch_size": t.batch_size, "learning_rate": t.learning_rate, "weight_decay": t.weight_decay,
            "hidden_sizes": m.layers, "dropout": m.dropout_rate, "seed": t.seed, "family": m.family_name,
            "grad_clip_norm": t.grad_clip_norm, "warmup_steps": t.warmup_steps}


def env(threads: int = 1) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def torchrun(config: Path, nproc: int = 1, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "ml_assets.trainer.agent", "--standalone", f"--nproc_per_node={nproc}",
            "--max-restarts=0", *(extra or []), "-m", "ml_assets.trainer", "--config", str(config)]


def train(inputs: dict, nproc: int = 1, **fields) -> dict:
    """Run the trainer once under torchrun in a fresh directory; returns its meta.json."""
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        cfg = TrainConfig(**{**inputs, "output_dir": f"{tmp}/out", **fields})
        (Path(tmp) / "config.json").write_text(cfg.to_json())
        proc = subprocess.run(torchrun(Path(tmp) / "config.json", nproc), capture_output=True, text=True,
                              timeout=1800, env=env(fields.get("threads", 1) or 1))
        if proc.returncode != 0:
            raise SystemExit(f"the trainer failed:\n{proc.stderr[-4000:]}")
        return json.loads((Path(tmp) / "out" / "meta.json").read_text())


def median(values: list[float]) -> float:
    return statistics.median(values)
