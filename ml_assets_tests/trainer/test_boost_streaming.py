"""XGBoost on windows larger than memory (data_mode: streaming): shards, batches and the sketch
sample in process on real Parquet files; streamed trainings under real torchrun (1 and 2 ranks)
against memory mode's booster."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ml_assets.features.state import transform
from ml_assets.trainer import booster_data
from ml_assets.trainer.booster_data import inputs, sketch_positions
from ml_assets.trainer.booster_stream import (
    PAGES_PREFIX,
    BoosterWindow,
    pages_dir,
    read_sketch,
    stream_shard,
)
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets.trainer.data import read_frame, read_state
from ml_assets_tests.trainer.toy import ref, run, torchrun_args, toy_data

pytestmark = pytest.mark.torchrun

# Row sampling (segments, reseeded boosters) and column sampling: the strictest comparison.
PARAMS = {"max_depth": 4, "num_boost_round": 30, "subsample": 0.8, "colsample_bytree": 0.8}


def split(train: pl.DataFrame, root: Path, sizes: list[int], row_group_size: int) -> list[DataRef]:
    """``train`` as Parquet files of ``sizes`` rows, each in row groups of ``row_group_size``."""
    refs, offset = [], 0
    for i, n in enumerate(sizes):
        train.slice(offset, n).write_parquet(root / f"part-{i}.parquet", row_group_size=row_group_size)
        refs.append(ref(root / f"part-{i}.parquet"))
        offset += n
    return refs


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """3000 toy rows in three files: row groups of 250, and one file that is a single row group."""
    root = tmp_path_factory.mktemp("xgb-window")
    data = toy_data(root, train_rows=3000, val_rows=501)
    train = pl.read_parquet(data["train_files"][0].uri)
    (root / "last").mkdir()
    files = split(train, root, [1100, 800], 250) + split(train.slice(1900), root / "last", [1100], 1100)
    return {**data, "train_files": files}


def config(window: dict, tmp: Path, **fields: object) -> TrainConfig:
    return TrainConfig(**{**window, "output_dir": str(tmp / "out"), "family": "xgboost", "model_params": PARAMS,
                          "data_mode": "streaming", "stream_cache_dir": str(tmp / "cache"),
                          "shuffle_buffer_rows": 300, **fields})


# -- in process ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_read_every_row_once_in_bounded_batches(window: dict, tmp_path: Path, world: int) -> None:
    cfg = config(window, tmp_path)
    state = read_state(cfg.feature_state)
    whole = inputs(transform(read_frame(cfg.train_files), state))
    read, pages = [], 0
    for rank in range(world):
        shard = stream_shard(cfg, state, rank, world)
        sizes = [len(shard.batch(i)[1]) for i in range(len(shard.batches))]
        # Up to shuffle_buffer_rows rows a page, or one larger row group alone (never split).
        assert all(n <= cfg.shuffle_buffer_rows or len(b) == 1 for n, b in zip(sizes, shard.batches, strict=True))
        assert sum(sizes) in (len(whole) // world, len(whole) // world + 1)
        read += [shard.batch(i)[0] for i in range(len(shard.batches))]
        pages += len(sizes)
    assert pages > world
    # In file order, rank after rank: every row once, none padded, encoded as memory mode encodes it.
    np.testing.assert_array_equal(np.vstack(read), whole)


def test_the_sketch_sample_is_memory_modes_and_read_in_batches(window: dict, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(window, tmp_path)
    state = read_state(cfg.feature_state)
    whole = inputs(transform(read_frame(cfg.train_files), state))
    np.testing.assert_array_equal(read_sketch(BoosterWindow(cfg, state, 1, 2)), whole)  # small: all of it
    monkeypatch.setattr(booster_data, "SKETCH_ROWS", 700)
    sample = read_sketch(BoosterWindow(cfg, state, 0, 2))
    np.testing.assert_array_equal(sample, whole[sketch_positions(len(whole))])
    assert len(sample) == 700


@pytest.mark.parametrize("rows", [1000, 1500, 5000, 10**9])
def test_sketch_positions_are_a_seeded_sample_of_exactly_sketch_rows(monkeypatch: pytest.MonkeyPatch,
                                                                     rows: int) -> None:
    monkeypatch.setattr(booster_data, "SKETCH_ROWS", 1000)
    pick = sketch_positions(rows)
    if rows <= 1000:
        assert pick is None
        return
    assert len(pick) == 1000 and (np.diff(pick) > 0).all() and pick[0] >= 0 and pick[-1] < rows
    np.testing.assert_array_equal(pick, sketch_positions(rows))


def test_pages_of_dead_trainers_are_removed(tmp_path: Path) -> None:
    host = socket.gethostname()
    dead = tmp_path / f"{PAGES_PREFIX}{2**22 + 12345}@{host}-abc"  # above Linux's pid_max default
    alive = tmp_path / f"{PAGES_PREFIX}{os.getppid()}@{host}-abc"
    elsewhere = tmp_path / f"{PAGES_PREFIX}{2**22 + 12345}@another-host-abc"
    for d in (dead, alive, elsewhere):
        d.mkdir()
    pages = pages_dir(str(tmp_path))
    assert not dead.exists() and alive.exists() and elsewhere.exists()
    assert pages.is_dir() and pages.name.startswith(f"{PAGES_PREFIX}{os.getpid()}@{host}-")


# -- under torchrun ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_streamed_training_trains_memory_modes_booster(window: dict, tmp_path: Path, nproc: int) -> None:
    models, metas = {}, {}
    for mode in ("memory", "streaming"):
        cfg = config(window, tmp_path / mode, data_mode=mode, checkpoint_every_steps=10, report_every_steps=5)
        (tmp_path / mode).mkdir()
        (tmp_path / mode / "config.json").write_text(cfg.to_json())
        proc = run(torchrun_args(tmp_path / mode / "config.json", nproc))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "external memory" not in proc.stderr  # XGBoost's warning if its pages went before it
        models[mode] = (tmp_path / mode / "out" / "model.ubj").read_bytes()
        metas[mode] = json.loads((tmp_path / mode / "out" / "meta.json").read_text())
    assert models["streaming"] == models["memory"]
    assert metas["streaming"]["history"] == metas["memory"]["history"]
    assert metas["streaming"]["train_rows"] == 3000 and metas["streaming"]["world_size"] == nproc
    # The pages' directory went with the training.
    assert not list((tmp_path / "streaming" / "cache").glob(f"{PAGES_PREFIX}*"))
