"""Windows larger than memory (data_mode: streaming): the row-group shards and the shuffle buffer
in process, on real Parquet files; exact resume after SIGKILL and a resume on another number of
ranks under real torchrun (gloo on the CPU)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

import fsspec
import numpy as np
import polars as pl
import pytest
import torch

from ml_assets.features.state import fit_state, state_bytes
from ml_assets.spec import FeaturesSpec
from ml_assets.storage import IntegrityError, verified_local
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets.trainer.stream import StreamedWindow
from ml_assets_tests.trainer.toy import (
    complete_checkpoints,
    frame,
    kill_tree,
    ref,
    run,
    start,
    torchrun_args,
    toy_data,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.torchrun

STREAMING = dict(data_mode="streaming", shuffle_buffer_rows=1500)
# Deterministic, one thread per rank, two ranks: two runs of the same config give the same bits.
EXACT = dict(epochs=3, batch_size=128, learning_rate=0.01, seed=1, deterministic=True, threads=1,
             checkpoint_every_steps=20, keep_last=3, report_every_steps=100, checkpoint_async="thread", **STREAMING)


def split(train: pl.DataFrame, root: Path, sizes: list[int], row_group_size: int) -> list[DataRef]:
    """``train`` as several Parquet files of ``sizes`` rows, each in row groups of ``row_group_size``."""
    refs, offset = [], 0
    for i, n in enumerate(sizes):
        train.slice(offset, n).write_parquet(root / f"part-{i}.parquet", row_group_size=row_group_size)
        refs.append(ref(root / f"part-{i}.parquet"))
        offset += n
    return refs


# -- in process: shards, padding, the shuffle buffer and its replay ----------------------------------------------
@pytest.fixture(scope="module")
def numbered(tmp_path_factory) -> tuple[TrainConfig, dict, int]:
    """Rows whose numeric input ``x`` is their number (the state leaves it as it is): a batch says
    which rows it holds. Files and row groups of uneven sizes, so shards differ in rows."""
    root = tmp_path_factory.mktemp("numbered")
    sizes = [700, 1500, 333, 2000, 90]
    rows = frame(np.random.default_rng(0), sum(sizes)).with_columns(pl.int_range(sum(sizes)).cast(pl.Float64).alias("x"))
    refs = split(rows, root, sizes, row_group_size=256)
    state = fit_state(rows, FeaturesSpec(numeric=["x"], categorical=["group"]), "label", "binary_classification")
    state["numeric"][0].update(mean=0.0, std=1.0)
    (root / "state.json").write_bytes(state_bytes(state))
    cfg = TrainConfig(model="toy", task="binary_classification", train_files=refs, val_files=refs[:1],
                      feature_state=ref(root / "state.json"), output_dir=str(root / "out"), seed=3,
                      data_mode="streaming", shuffle_buffer_rows=600)
    return cfg, state, sum(sizes)


def stream_of(window: StreamedWindow, epoch: int, start: int = 0, micro_batch: int = 64) -> list[torch.Tensor]:
    """A rank's whole stream of ``epoch`` after ``start`` rows (over all ranks): numeric, categorical, target."""
    return [torch.cat(columns) for columns in zip(*window.loader(epoch, start, micro_batch), strict=True)]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_each_epoch_streams_every_row_once_across_ranks_up_to_padding(numbered, world):
    cfg, state, total = numbered
    orders = []
    for epoch in (0, 1):
        own, padded = [], []
        for rank in range(world):
            window = StreamedWindow(cfg, state, rank, world)
            plan = window.plan(epoch)
            ids = stream_of(window, epoch)[0][:, 0].long()
            assert len(ids) == plan.rows  # every rank streams the largest shard's rows
            own.append(ids[:plan.own_rows])
            padded.append(ids[plan.own_rows:])
        rows = torch.cat(own)
        assert torch.equal(rows.sort().values, torch.arange(total))  # each row once per epoch
        shards = [len(o) for o in own]
        assert [len(p) for p in padded] == [max(shards) - n for n in shards]
        assert all(bool(((p >= 0) & (p < total)).all()) for p in padded)
        assert not torch.equal(rows, rows.sort().values)  # shuffled, not in file order
        orders.append(rows)
    assert not torch.equal(orders[0], orders[1])  # each epoch its own shards and shuffle


def test_a_resumed_stream_is_the_rest_of_the_uninterrupted_one(numbered):
    """Resuming at row k (of each of 2 ranks) replays the buffer on row ids, reads only the row
    groups whose rows are still to come, and gives the same tensors as the uninterrupted stream."""
    cfg, state, _ = numbered
    for rank in range(2):
        window = StreamedWindow(cfg, state, rank, 2)
        whole = stream_of(window, 1)
        plan = window.plan(1)
        starts = np.cumsum([0] + [sum(g.rows for g in window.groups if g.file == f) for f in range(len(cfg.train_files))])
        index = {(g.file, g.index): i for i, g in enumerate(window.groups)}

        def group_of(row: int, starts=starts, index=index) -> int:
            file = int(np.searchsorted(starts, row, side="right")) - 1
            return index[(file, (row - int(starts[file])) // 256)]

        read: list[int] = []
        window.read = lambda groups, read=read, original=window.read: read.extend(groups) or original(groups)
        for k in (64, 640, 1024, plan.own_rows - plan.own_rows % 64, plan.rows - plan.rows % 64):
            read.clear()
            rest = stream_of(window, 1, start=2 * k)
            assert all(torch.equal(a, b[k:]) for a, b in zip(rest, whole, strict=True)), (rank, k)
            if plan.rows == plan.own_rows:  # no padding: what is read is what is still to come
                assert set(read) == {group_of(int(x)) for x in whole[0][k:, 0]}, (rank, k)


def test_streaming_refuses_bad_files_by_name(numbered, tmp_path):
    cfg, state, _ = numbered
    good = cfg.train_files[0]
    tampered = DataRef(uri=good.uri, sha256="0" * 64)
    with pytest.raises(IntegrityError, match=re.escape(f"{good.uri}: sha256 is")):
        StreamedWindow(replace(cfg, **{"train_files": [tampered]}), state, 0, 1)
    pl.DataFrame({"x": [1.0], "label": [0.0]}).write_parquet(tmp_path / "narrow.parquet")
    narrow = ref(tmp_path / "narrow.parquet")
    with pytest.raises(ValueError, match=re.escape(f"{narrow.uri}: lacks the column(s) ['group']")):
        StreamedWindow(replace(cfg, **{"train_files": [good, narrow]}), state, 0, 1)
    (tmp_path / "text.parquet").write_text("not parquet")
    text = ref(tmp_path / "text.parquet")
    with pytest.raises(ValueError, match=re.escape(f"{text.uri}: not a readable Parquet file")):
        StreamedWindow(replace(cfg, **{"train_files": [text]}), state, 0, 1)


def test_a_remote_file_is_copied_verified_into_the_cache(numbered, tmp_path):
    cfg, _, _ = numbered
    data = Path(cfg.train_files[0].uri).read_bytes()
    with fsspec.open("memory://bucket/day.parquet", "wb") as fh:
        fh.write(data)
    sha = cfg.train_files[0].sha256
    cached = verified_local("memory://bucket/day.parquet", sha, tmp_path / "cache")
    assert cached == tmp_path / "cache" / f"{sha}.parquet" and cached.read_bytes() == data
    with pytest.raises(IntegrityError, match="memory://bucket/day.parquet: sha256 is"):
        verified_local("memory://bucket/day.parquet", "1" * 64, tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [cached.name]  # no partial copy left
    cached.write_bytes(data[:-1] + b"\0")  # a damaged cache entry is fetched again, never used
    assert verified_local("memory://bucket/day.parquet", sha, tmp_path / "cache").read_bytes() == data


def test_opening_a_window_prunes_cached_copies_unused_for_a_week(numbered, tmp_path):
    cfg, state, _ = numbered
    data = Path(cfg.train_files[0].uri).read_bytes()
    with fsspec.open("memory://bucket/window.parquet", "wb") as fh:
        fh.write(data)
    cache = tmp_path / "cache"
    cache.mkdir()
    old, stale, recent = cache / f"{'a' * 64}.parquet", cache / f"{'b' * 64}.parquet.tmp-1-x", cache / f"{'c' * 64}.parquet"
    for path in (old, stale, recent):
        path.write_bytes(b"x")
    week_ago = time.time() - 8 * 86400
    for path in (old, stale):
        os.utime(path, (week_ago, week_ago))
    ours = cache / f"{cfg.train_files[0].sha256}.parquet"
    ours.write_bytes(data)
    os.utime(ours, (week_ago, week_ago))  # ours, unused for as long: reused, so touched and kept
    remote = replace(cfg, train_files=[DataRef(uri="memory://bucket/window.parquet", sha256=cfg.train_files[0].sha256)],
                     stream_cache_dir=str(cache))
    StreamedWindow(remote, state, 0, 1)
    assert sorted(p.name for p in cache.iterdir()) == sorted([recent.name, ours.name])
    assert ours.stat().st_mtime > time.time() - 60


def test_configs_in_memory_keep_their_fingerprint():
    refs = {n: DataRef(uri=f"/f/{n}", sha256=n * 64, day="2013-01-01", commit="c") for n in "abvs"}
    cfg = TrainConfig(model="m", task="binary_classification", train_files=[refs["a"], refs["b"]],
                      val_files=[refs["v"]], feature_state=refs["s"], output_dir="/o")
    # What this config's fingerprint was before streaming existed: its checkpoints still resume.
    assert cfg.fingerprint() == "cee326cf877c7bcf6d6e53c1707dbe2b080f6246639c6807740890390bf87f4d"
    same = replace(cfg, **{"shuffle_buffer_rows": 10, "stream_cache_dir": "/cache"})
    assert same.fingerprint() == cfg.fingerprint()  # streaming settings mean nothing in memory
    streamed = replace(cfg, **{"data_mode": "streaming"})
    assert streamed.fingerprint() != cfg.fingerprint()
    assert replace(streamed, **{"shuffle_buffer_rows": 10}).fingerprint() != streamed.fingerprint()
    assert replace(streamed, **{"stream_cache_dir": "/c"}).fingerprint() == streamed.fingerprint()
    with pytest.raises(ValueError, match="data_mode 'disk' is not one of .*shuffle_buffer_rows must be >= 1, got 0"):
        replace(cfg, **{"data_mode": "disk", "shuffle_buffer_rows": 0})


# -- under torchrun ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("toy")
    fields = toy_data(root, train_rows=12_000)
    train = pl.read_parquet(root / "train.parquet")
    return {**fields, "train_files": split(train, root, [4000, 4000, 2500, 1500], row_group_size=700)}


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    """An uninterrupted streaming run on 2 ranks: what every interrupted one must reproduce."""
    root = tmp_path_factory.mktemp("reference")
    write_config(root / "config.json", data, output_dir=str(root / "out"), **EXACT)
    proc = run(torchrun_args(root / "config.json", nproc=2))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "streaming 19 row groups of 4 file(s), shuffle buffer 1500 rows" in proc.stderr
    return root / "out"


def mid_epoch_checkpoint(ckpts: Path) -> bool:
    return any(c["rows_in_epoch"] > 0 and c["epoch"] >= 1 for c in complete_checkpoints(ckpts))


def test_sigkill_mid_epoch_then_rerun_gives_the_same_bits(data, reference, tmp_path):
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **EXACT)
    proc = start(torchrun_args(tmp_path / "config.json", nproc=2), tmp_path / "first.log")
    wait_for(lambda: mid_epoch_checkpoint(tmp_path / "out" / "checkpoints"), what="a mid-epoch checkpoint")
    kill_tree(proc, signal.SIGKILL)  # torchrun and both ranks, no chance to clean up
    assert not (tmp_path / "out" / "model.safetensors").exists()

    again = run(torchrun_args(tmp_path / "config.json", nproc=2))
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = re.search(r"resumed from \S+: step (\d+), epoch (\d+), (\d+) rows into it", again.stderr)
    assert resumed, again.stderr[-3000:]
    assert int(resumed.group(2)) >= 2 and int(resumed.group(3)) > 0  # mid-epoch, not from scratch
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()
    history = json.loads((tmp_path / "out" / "meta.json").read_text())["history"]
    expected = json.loads((reference / "meta.json").read_text())["history"]
    assert [(h["step"], h["val_loss"]) for h in history] == [(h["step"], h["val_loss"]) for h in expected]
    # The interrupted epoch's loss sums both ranks' shares from before and after the checkpoint, in
    # another order than the uninterrupted run: equal but for rounding.
    assert [h["train_loss"] for h in history] == pytest.approx([h["train_loss"] for h in expected], rel=1e-12)
    # Run again: the training is found finished while epoch 0's reader has started; the exit is clean.
    rerun = run(torchrun_args(tmp_path / "config.json", nproc=2))
    assert rerun.returncode == 0 and "the checkpoint says training already finished" in rerun.stderr, rerun.stderr[-3000:]
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()


def test_a_stream_checkpointed_by_two_ranks_resumes_on_one(data, reference, tmp_path):
    """The reference's newest mid-epoch checkpoint (2 ranks), resumed on 1 rank: the rest of the
    epoch comes from other shards; it resumes there, keeps learning and finishes."""
    shutil.copytree(reference / "checkpoints", tmp_path / "out" / "checkpoints")
    ckpts = complete_checkpoints(tmp_path / "out" / "checkpoints")
    step = max(c["step"] for c in ckpts if c["rows_in_epoch"] > 0)
    for later in [c["step"] for c in ckpts if c["step"] > step]:
        shutil.rmtree(tmp_path / "out" / "checkpoints" / f"step-{later:09d}")
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **EXACT)

    again = run(torchrun_args(tmp_path / "config.json", nproc=1))
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = re.search(rf"step-{step:09d}: step {step}, epoch \d+, (\d+) rows into it", again.stderr)
    assert resumed and int(resumed.group(1)) > 0, again.stderr[-3000:]
    assert "checkpoint written by 2 rank(s), resuming on 1" in again.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["world_size"] == 1 and meta["steps"] > step and len(meta["history"]) == 3
    assert meta["train_rows"] == 12_000
    assert meta["history"][-1]["val_loss"] < 0.5  # it kept learning (the base rate scores ~0.69)
