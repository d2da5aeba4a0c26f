"""Gradient-boosted trees (family xgboost) under real torchrun (gloo, XGBoost's own tracker): one and
two workers, SIGKILL mid-training and exact resume, tampered checkpoints, early stopping, a tracker
that cannot start."""

from __future__ import annotations

import json
import shutil
import signal
import socket
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ml_assets_tests.trainer.toy import (
    kill_tree,
    run,
    start,
    torchrun_args,
    toy_data,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.torchrun

# Row and column sampling on: the resume must replay the draws, not only the trees, and two workers
# must leave out the rows one worker leaves out.
BOOST = dict(family="xgboost", seed=3, threads=1, report_every_steps=10, checkpoint_every_steps=10, keep_last=3,
             model_params={"max_depth": 5, "learning_rate": 0.05, "num_boost_round": 100, "subsample": 0.8,
                           "colsample_bytree": 0.7})


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    return toy_data(tmp_path_factory.mktemp("toy"), train_rows=40_000, val_rows=2_000)


def train(root: Path, data: dict, nproc: int = 1, **fields) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_config(root / "config.json", data, output_dir=str(root / "out"), **{**BOOST, **fields})
    proc = run(torchrun_args(root / "config.json", nproc=nproc))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "out"


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    """An uninterrupted one-worker run: what an interrupted run must reproduce."""
    return train(tmp_path_factory.mktemp("reference"), data)


def predictions(out: Path, data: dict) -> np.ndarray:
    from ml_assets.serving.predict import predict
    from ml_assets.trainer.checkpoint import load_checkpoint
    from ml_assets.trainer.config import DataRef

    meta = json.loads((out / "meta.json").read_text())
    loaded = load_checkpoint(DataRef(uri=str(out / "model.ubj"), sha256=meta["weights_sha256"]),
                             DataRef(uri=str(out / "meta.json"), sha256=_sha(out / "meta.json")))
    return predict(loaded, pl.read_parquet(data["val_files"][0].uri))


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_workers_train_the_model_one_worker_trains(data, reference, tmp_path):
    two, one = train(tmp_path, data, nproc=2), reference
    meta_one, meta_two = (json.loads((o / "meta.json").read_text()) for o in (one, two))
    assert (meta_two["world_size"], meta_one["world_size"]) == (2, 1)
    assert meta_two["rounds"] == meta_one["rounds"] == 100
    # The same cuts on every worker count: the same splits; leaves differ only by float32 rounding
    # of the all-reduced sums (docs/models.md).
    np.testing.assert_allclose(predictions(two, data), predictions(one, data), rtol=0, atol=1e-6)
    losses = [[h["val_loss"] for h in m["history"]] for m in (meta_one, meta_two)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)


def test_sigkill_mid_training_then_rerun_gives_the_same_bits(data, reference, tmp_path):
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **BOOST)
    proc = start(torchrun_args(tmp_path / "config.json"), tmp_path / "first.log")
    ckpts = tmp_path / "out" / "checkpoints"
    wait_for(lambda: any((d / "manifest.json").exists() and int(d.name.split("-")[1]) >= 20
                         for d in ckpts.glob("round-*")), timeout=180, what="a checkpoint at round 20 or later")
    kill_tree(proc, signal.SIGKILL)  # torchrun and its worker, no chance to clean up
    assert not (tmp_path / "out" / "model.ubj").exists()
    again = run(torchrun_args(tmp_path / "config.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from round" in again.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["resumed_from_step"] >= 20
    assert (tmp_path / "out" / "model.ubj").read_bytes() == (reference / "model.ubj").read_bytes()


def test_a_tampered_booster_checkpoint_is_refused_by_its_sha256_and_the_previous_one_resumes(data, tmp_path):
    # Per-node column sampling is XGBoost's own draw: training runs in reloaded segments, and the
    # resume from the previous segment's end must still give the same bytes.
    fields = {**BOOST, "model_params": {**BOOST["model_params"], "colsample_bynode": 0.7}}
    reference = train(tmp_path / "reference", data, **fields)
    shutil.copytree(reference.parent, tmp_path / "run")
    out = tmp_path / "run" / "out"
    write_config(tmp_path / "run" / "config.json", data, output_dir=str(out), **fields)
    newest = sorted((out / "checkpoints").glob("round-*"))[-1]
    booster = newest / "booster.ubj"
    booster.write_bytes(booster.read_bytes()[:-64] + b"\x00" * 64)
    (out / "model.ubj").unlink()
    again = run(torchrun_args(tmp_path / "run" / "config.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"checkpoint {newest} is unusable (booster.ubj has" in again.stderr
    assert (out / "model.ubj").read_bytes() == (reference / "model.ubj").read_bytes()


def test_early_stopping_exports_the_best_round(data, tmp_path):
    out = train(tmp_path, data, early_stopping_patience=4,
                model_params={"max_depth": 8, "learning_rate": 0.9, "num_boost_round": 200})
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stop_reason"] == "early stopping: 4 rounds without improvement"
    assert meta["rounds_trained"] == meta["rounds"] + 4
    import xgboost

    assert xgboost.Booster(model_file=str(out / "model.ubj")).num_boosted_rounds() == meta["rounds"]


def test_a_tracker_that_cannot_start_fails_every_rank_with_the_reason(data, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"),
                     **{**BOOST, "tracker_port": port})
        proc = start(torchrun_args(tmp_path / "config.json", nproc=2), tmp_path / "log")
        code = proc.wait(timeout=120)  # every rank ended: the agent returns only then
    log = (tmp_path / "log").read_text()
    assert code != 0
    assert f"XGBoost's tracker could not start on 127.0.0.1:{port}" in log
    assert not (tmp_path / "out" / "checkpoints").exists() or not any((tmp_path / "out" / "checkpoints").glob("round-*"))
