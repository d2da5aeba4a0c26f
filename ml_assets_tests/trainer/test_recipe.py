"""The training recipe's parts: model families, accumulation with no_sync, early stopping, the
learning-rate schedule, precision choice, the resumable sampler and the DataLoader path."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load as safetensors_load

from ml_assets.trainer.data import ResumableSampler
from ml_assets.trainer.model import ModelConfig, build_model
from ml_assets.trainer.runtime import choose_precision
from ml_assets.trainer.setup import warmup_cosine
from ml_assets_tests.trainer.toy import run, torchrun_args, toy_data, write_config

pytestmark = pytest.mark.torchrun


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    return toy_data(tmp_path_factory.mktemp("toy"), train_rows=4000)


def _train(tmp_path, data, name: str, nproc: int = 1, **fields) -> dict:
    config = tmp_path / f"{name}.json"
    write_config(config, data, output_dir=str(tmp_path / name), **fields)
    proc = run(torchrun_args(config, nproc=nproc))
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((tmp_path / name / "meta.json").read_text())
    meta["_log"] = proc.stderr
    meta["_weights"] = safetensors_load((tmp_path / name / "model.safetensors").read_bytes())
    return meta


def test_accumulating_two_micro_steps_under_no_sync_equals_one_full_batch(data, tmp_path):
    """2 ranks: accumulation skips the all-reduce on the first micro-step and the result is the
    gradient of the whole global batch, so the weights match training without accumulation."""
    same = dict(epochs=1, batch_size=128, dropout=0.0, precision="fp32", deterministic=True, seed=3,
                grad_clip_norm=0.0, learning_rate=0.01)
    plain = _train(tmp_path, data, "plain", nproc=2, **same)
    accumulated = _train(tmp_path, data, "accumulated", nproc=2, grad_accum_steps=2, **same)
    assert "micro-batch 64 x 1 accumulation" in plain["_log"]
    assert "micro-batch 32 x 2 accumulation" in accumulated["_log"]
    assert plain["steps"] == accumulated["steps"]
    for key, value in plain["_weights"].items():
        torch.testing.assert_close(accumulated["_weights"][key], value, rtol=1e-4, atol=1e-5)


def test_residual_family_with_activation_checkpointing_learns(data, tmp_path):
    meta = _train(tmp_path, data, "residual", family="residual_mlp", hidden_sizes=[32, 32],
                  activation_checkpointing=True, epochs=3, batch_size=64, learning_rate=0.005, warmup_steps=20)
    assert meta["model_config"]["family"] == "residual_mlp"
    assert meta["history"][-1]["val_loss"] < 0.5  # the base rate alone scores about 0.69


def test_early_stopping_stops_and_exports_the_best_epoch(data, tmp_path):
    # A learning rate this high makes validation loss worse after the first epochs.
    meta = _train(tmp_path, data, "early", epochs=30, batch_size=32, learning_rate=0.5, weight_decay=0.0,
                  early_stopping_patience=2, grad_clip_norm=0.0)
    assert meta["stop_reason"].startswith("early stopping")
    assert len(meta["history"]) < 30
    best = min(meta["history"], key=lambda e: e["val_loss"])
    assert meta["best_val_loss"] == best["val_loss"]
    assert meta["weights_from"] == f"best validation loss (epoch {best['epoch']})"


def test_the_dataloader_path_with_workers_trains_the_same_rows(data, tmp_path):
    inline = _train(tmp_path, data, "inline", epochs=1, deterministic=True, precision="fp32", dropout=0.0)
    workers = _train(tmp_path, data, "workers", epochs=1, deterministic=True, precision="fp32", dropout=0.0,
                     num_workers=2, prefetch_factor=4)
    for key, value in inline["_weights"].items():
        assert torch.equal(workers["_weights"][key], value), key
    assert workers["accounting"]["data_wait_fraction"] >= 0


def test_warmup_then_cosine_to_the_floor():
    factor = warmup_cosine(warmup=10, total=110, floor=0.1)
    assert [round(factor(s), 3) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert factor(10) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert factor(110) == pytest.approx(0.1) and factor(500) == pytest.approx(0.1)


def test_precision_falls_back_on_cpus_without_bf16_and_says_so(monkeypatch):
    said = []
    monkeypatch.setattr("ml_assets.trainer.runtime.cpu_supports_bf16", lambda: False)
    assert choose_precision("auto", torch.device("cpu"), said.append) == (None, False)
    assert "no native bf16" in said[-1] and "fp32" in said[-1]
    monkeypatch.setattr("ml_assets.trainer.runtime.cpu_supports_bf16", lambda: True)
    assert choose_precision("auto", torch.device("cpu"), said.append) == (torch.bfloat16, False)
    assert choose_precision("fp32", torch.device("cpu"), said.append) == (None, False)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_sampler_resumes_at_the_same_rows_on_any_number_of_ranks(world):
    rows = list(range(103))
    full = list(ResumableSampler(rows, num_replicas=1, rank=0, seed=5))
    for start in (0, 10, 64, 102):
        shards = []
        for rank in range(world):
            sampler = ResumableSampler(rows, num_replicas=world, rank=rank, seed=5)
            sampler.set_start(start)
            shards.append(list(sampler))
        assert len({len(s) for s in shards}) == 1  # every rank runs the same number of steps
        assert len(shards[0]) == math.ceil((103 - start) / world)
        taken = [shards[r][i] for i in range(len(shards[0])) for r in range(world)]
        assert taken[:103 - start] == full[start:]  # exactly the rows not yet used, in order


def test_model_families_rebuild_from_json_config():
    for family in ("mlp", "residual_mlp"):
        config = ModelConfig(n_numeric=3, cardinalities=[4, 7], hidden_sizes=[8, 8], dropout=0.0, family=family)
        model = build_model(json.loads(json.dumps(config.to_dict())))
        out = model(torch.randn(5, 3), torch.zeros(5, 2, dtype=torch.int64))
        assert out.shape == (5,)
    with pytest.raises(ValueError, match="family 'tree'"):
        build_model({**config.to_dict(), "family": "tree"})


def test_the_checkpoint_key_follows_what_decides_the_weights(data, tmp_path):
    """Same bytes reached through another commit, another output or reporting setting: same key
    (a re-run resumes). Other bytes or another hyperparameter: another key (a fresh start)."""
    from dataclasses import replace

    from ml_assets.trainer.config import DataRef, TrainConfig

    base = TrainConfig(**data, output_dir=str(tmp_path / "a"))
    recommitted = [DataRef(uri=r.uri, sha256=r.sha256, day=r.day, commit="a-later-commit") for r in base.train_files]
    same = [replace(base, train_files=recommitted), replace(base, output_dir=str(tmp_path / "b"), report_every_steps=7,
                                                           checkpoint_every_seconds=5.0, keep_last=9)]
    assert {c.fingerprint() for c in same} == {base.fingerprint()}
    changed = [replace(base, learning_rate=0.01), replace(base, seed=1),
               replace(base, train_files=[DataRef(uri=base.train_files[0].uri, sha256="0" * 64)])]
    assert len({c.fingerprint() for c in changed} | {base.fingerprint()}) == 4


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_the_allocator_thresholds_are_fixed_unless_the_environment_chose_them():
    probe = "from ml_assets.trainer.runtime import steady_allocator; print(steady_allocator())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    ours = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert ours.stdout.strip() == "True"
    theirs = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            env={**env, "MALLOC_TRIM_THRESHOLD_": "1048576"})
    assert theirs.stdout.strip() == "False"
