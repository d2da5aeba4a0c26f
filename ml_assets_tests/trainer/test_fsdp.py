"""training.strategy: fsdp (FSDP2 ``fully_shard``) under real torchrun with gloo on the CPU: the
same weights as DDP, exact resume after SIGKILL, resume on another number of ranks, full exports
that load like any other, an async checkpoint of sharded state written while FSDP trains; and the
config, spec and sharding rule."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load as safetensors_load
from torch import nn

from ml_assets.spec import TrainingSpec
from ml_assets.trainer.checkpoint import load_checkpoint
from ml_assets.trainer.config import NOT_TRAINING, DataRef, TrainConfig
from ml_assets.trainer.contract import CustomModel, default_inputs
from ml_assets.trainer.model import ModelConfig, build_model
from ml_assets.trainer.parallel import shard_units
from ml_assets_tests.helpers import cli_env
from ml_assets_tests.trainer.test_resume import weights
from ml_assets_tests.trainer.toy import (
    complete_checkpoints,
    kill_tree,
    run,
    start,
    torchrun_args,
    toy_data,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.torchrun

# Deterministic, one thread per rank, fp32. Accumulation (FSDP's gradient-sync switch), activation
# checkpointing and a clipping norm that computes the sharded norm without binding: on 2 ranks the
# arithmetic is then DDP's exactly (a sum of two gradients halved), so the bits must agree. Early
# stopping (which never stops within 2 epochs) exports the best weights the ranks gathered.
RECIPE = dict(family="residual_mlp", hidden_sizes=[32, 32], epochs=2, batch_size=64, grad_accum_steps=2,
              learning_rate=0.01, grad_clip_norm=10.0, seed=1, deterministic=True, threads=1, precision="fp32",
              early_stopping_patience=3, checkpoint_every_steps=20, keep_last=100, report_every_steps=1000)
FSDP = dict(RECIPE, strategy="fsdp", activation_checkpointing=True, fsdp_reshard_after_forward=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    return toy_data(tmp_path_factory.mktemp("toy"), train_rows=2000)


def _train(root: Path, data: dict, nproc: int = 2, **fields) -> tuple[Path, str]:
    write_config(root / "config.json", data, output_dir=str(root / "out"), **fields)
    proc = run(torchrun_args(root / "config.json", nproc=nproc))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "out", proc.stderr


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> tuple[Path, str]:
    """An uninterrupted FSDP run on 2 ranks: what every interrupted one must reproduce."""
    return _train(tmp_path_factory.mktemp("fsdp"), data, **FSDP)


@pytest.fixture(scope="module")
def ddp(data, tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("ddp"), data, **RECIPE)[0]


def test_fsdp_shards_every_block_and_trains_the_weights_ddp_trains(reference, ddp):
    out, log = reference
    assert ("fsdp: 6 unit(s) sharded over 2 rank(s) (embeddings.0, stem, blocks.0, blocks.1, norm, head) and the "
            "root; parameters gathered in fp32, gradients reduced in fp32, not resharded after forward") in log
    assert "micro-batch 16 x 2 accumulation" in log
    assert weights(out) == weights(ddp)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["history"] == json.loads((ddp / "meta.json").read_text())["history"]
    assert meta["history"][-1]["val_loss"] < 0.5  # it learned (the base rate scores about 0.69)


def test_each_rank_writes_its_own_shard_of_the_checkpoint(reference):
    from ml_assets.trainer.checkpoint import SafeFsspecReader

    newest = sorted((reference[0] / "checkpoints").glob("step-*"))[-1]
    chunks = SafeFsspecReader(str(newest)).read_metadata().state_dict_metadata
    assert chunks["model.blocks.0.body.1.weight"].size == torch.Size([64, 32])
    assert [c.sizes for c in chunks["model.blocks.0.body.1.weight"].chunks] == [torch.Size([32, 32])] * 2
    assert [c.sizes for c in chunks["optim.blocks.0.body.1.weight.exp_avg"].chunks] == [torch.Size([32, 32])] * 2
    assert {p.name for p in newest.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}


def test_the_export_and_the_best_weights_are_whole_and_load_like_ddps(reference, ddp):
    out = reference[0]
    meta = json.loads((out / "meta.json").read_text())
    loaded = load_checkpoint(DataRef(uri=str(out / "model.safetensors"), sha256=meta["weights_sha256"]),
                             DataRef(uri=str(out / "meta.json"),
                                     sha256=hashlib.sha256((out / "meta.json").read_bytes()).hexdigest()))
    exported = safetensors_load(weights(out))
    ddp_exported = safetensors_load(weights(ddp))
    assert exported.keys() == ddp_exported.keys()  # (a safetensors dict's order is not its file's)
    assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in loaded.model.state_dict().items()}
    best = (out / "checkpoints" / "best" / "model.safetensors").read_bytes()
    assert best == (ddp / "checkpoints" / "best" / "model.safetensors").read_bytes()
    assert meta["weights_from"].startswith("best validation loss (epoch ")
    assert safetensors_load(best).keys() == exported.keys()
    assert all(torch.equal(safetensors_load(best)[k], v) for k, v in exported.items())


def test_sigkill_mid_epoch_then_rerun_gives_the_same_bits(data, reference, tmp_path):
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **FSDP)
    proc = start(torchrun_args(tmp_path / "config.json", nproc=2), tmp_path / "first.log")
    # The first epoch's (the resumed run then crosses an epoch's end: validation, the best weights).
    wait_for(lambda: any(c["rows_in_epoch"] > 0 for c in complete_checkpoints(tmp_path / "out" / "checkpoints")),
             what="a mid-epoch checkpoint")
    kill_tree(proc, signal.SIGKILL)
    assert not (tmp_path / "out" / "model.safetensors").exists()

    again = run(torchrun_args(tmp_path / "config.json", nproc=2))
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = re.search(r"resumed from \S+: step (\d+), epoch (\d+), (\d+) rows into it", again.stderr)
    assert resumed and int(resumed.group(3)) > 0, again.stderr[-3000:]
    assert weights(tmp_path / "out") == weights(reference[0])


def test_a_checkpoint_written_by_two_ranks_resumes_on_one(data, reference, tmp_path):
    """Resharding after forward this time, FSDP's default: a setting that changes memory, not
    weights, so the same checkpoint directory."""
    ckpts = tmp_path / "out" / "checkpoints"
    mid = next(c["step"] for c in complete_checkpoints(reference[0] / "checkpoints")
               if c["epoch"] >= 1 and c["rows_in_epoch"] > 0)
    for step in sorted((reference[0] / "checkpoints").glob("step-*")):
        if int(step.name.split("-")[1]) <= mid:  # as if the 2-rank run had died after that checkpoint
            shutil.copytree(step, ckpts / step.name)
    out, log = _train(tmp_path, data, nproc=1, **{**FSDP, "fsdp_reshard_after_forward": True})
    assert "fsdp: 6 unit(s) sharded over 1 rank(s)" in log and "resharded after forward" in log
    assert f"resumed from {ckpts}/step-{mid:09d}: step {mid}," in log
    assert "checkpoint written by 2 rank(s), resuming on 1" in log
    meta = json.loads((out / "meta.json").read_text())
    assert meta["world_size"] == 1 and meta["steps"] > mid
    assert meta["history"][-1]["val_loss"] < 0.5
    assert safetensors_load(weights(out)).keys() == safetensors_load(weights(reference[0])).keys()


ASYNC_UNDER_FSDP = """
import sys, torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
from ml_assets.trainer.checkpoint import ASYNC_MIN_BYTES, CheckpointManager
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets.trainer.model import ModelConfig, build_model
from ml_assets.trainer.parallel import full_state_dict, wrap
from ml_assets.trainer.runtime import Runtime
root = sys.argv[1]
dist.init_process_group("gloo")
rt = Runtime(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), "gloo")
ref = DataRef(uri="/unused", sha256="0" * 64)
cfg = TrainConfig(model="m", task="regression", train_files=[ref], val_files=[ref], feature_state=ref,
                  output_dir=root, strategy="fsdp")
torch.manual_seed(0)
model = build_model(ModelConfig(n_numeric=8, cardinalities=[5], hidden_sizes=[512, 512], dropout=0.0,
                                family="residual_mlp"))
bare_keys = list(model.state_dict())
wrap(model, cfg, rt, print)
opt = torch.optim.AdamW(model.parameters())
names = [n for n, _ in model.named_parameters()]
def step():
    model(torch.randn(16, 8), torch.zeros(16, 1, dtype=torch.int64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
step()
tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
for i, entries in opt.state_dict()["state"].items():
    tensors.update({f"optim.{names[i]}.{k}": v for k, v in entries.items()})
local = lambda t: t.to_local() if isinstance(t, DTensor) else t
assert sum(t.numel() * t.element_size() for t in tensors.values()) >= ASYNC_MIN_BYTES  # the background writer
saved = {k: local(v).clone() for k, v in tensors.items()}
manager = CheckpointManager(root, rank=rt.rank, world=rt.world, mode="thread", keep_last=2, log=print, warn=print)
manager.save(1, tensors, {"fingerprint": "f", "step": 1})
for _ in range(3):  # FSDP's all-gathers and reduce-scatters while the checkpoint group writes
    step()
manager.wait()
targets = {k: torch.zeros_like(v) for k, v in tensors.items()}
manager.load(manager.latest("f"), targets)
assert all(torch.equal(local(targets[k]), saved[k]) for k in saved), "restored shards differ"
whole = full_state_dict(model)  # every rank joins the gather; rank 0 alone receives it
if rt.rank == 0:
    assert list(whole) == bare_keys and whole["blocks.0.body.1.weight"].shape == (1024, 512)
    manager.save_best(whole, {"step": 4})
else:
    assert whole == {}
manager.close()
dist.destroy_process_group()
open(f"{root}/ok-{rt.rank}", "w").close()  # (the ranks' stdout interleaves)
"""


def test_an_async_checkpoint_of_sharded_state_is_written_while_fsdp_trains(tmp_path):
    script = tmp_path / "async_under_fsdp.py"
    script.write_text(ASYNC_UNDER_FSDP)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=180,
                          env=cli_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "ckpt" / "ok-0").exists() and (tmp_path / "ckpt" / "ok-1").exists()
    assert (tmp_path / "ckpt" / "step-000000001" / "manifest.json").exists()
    assert (tmp_path / "ckpt" / "best" / "model.safetensors").exists()


# -- config, spec and the sharding rule (no processes) ------------------------------------------
REF = DataRef(uri="/data/train.parquet", sha256="1" * 64, commit="c0ffee")
BASE = dict(model="m", task="binary_classification", train_files=[REF], val_files=[REF], feature_state=REF,
            output_dir="/tmp/out")
NEW_FIELDS = {"strategy", "fsdp_param_dtype", "fsdp_reduce_dtype", "fsdp_reshard_after_forward",
              # and those added beside FSDP: a model's factory, streaming
              "model_factory", "model_params", "model_code", "model_code_path", "data_mode", "shuffle_buffer_rows",
              "stream_cache_dir", "init_weights"}  # and a fine-tune's parent


def test_a_config_from_before_fsdp_keeps_its_fingerprint():
    """Computed as the fingerprint was before these fields existed: their checkpoints still resume."""
    cfg = TrainConfig(**BASE)
    kept = {k: v for k, v in asdict(cfg).items() if k not in NOT_TRAINING | NEW_FIELDS | {"classes"}}
    for key in ("train_files", "val_files"):
        kept[key] = [{k: v for k, v in ref.items() if k != "commit"} for ref in kept[key]]
    kept["feature_state"] = {k: v for k, v in kept["feature_state"].items() if k != "commit"}
    assert cfg.fingerprint() == hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def test_what_fsdp_computes_differently_changes_the_fingerprint_and_resharding_does_not():
    fsdp = TrainConfig(**BASE, strategy="fsdp")
    changed = [fsdp, replace(fsdp, fsdp_param_dtype="bf16"), replace(fsdp, fsdp_reduce_dtype="bf16")]
    assert len({c.fingerprint() for c in changed} | {TrainConfig(**BASE).fingerprint()}) == 4
    assert replace(fsdp, fsdp_reshard_after_forward=False).fingerprint() == fsdp.fingerprint()


@pytest.mark.parametrize(("change", "problem"), [
    ({"strategy": "zero3"}, "strategy 'zero3' is not one of ('ddp', 'fsdp')"),
    ({"strategy": "fsdp", "fsdp_param_dtype": "fp8"}, "fsdp_param_dtype 'fp8' is not one of"),
    ({"strategy": "fsdp", "fsdp_reduce_dtype": "fp16"}, "fsdp_reduce_dtype 'fp16' is not one of ('fp32', 'bf16')"),
    ({"fsdp_param_dtype": "bf16", "fsdp_reshard_after_forward": False},
     "fsdp_param_dtype, fsdp_reshard_after_forward apply to strategy fsdp, not ddp"),
])
def test_a_bad_fsdp_setting_is_refused_by_name(change, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        TrainConfig(**BASE, **change)


def test_the_spec_refuses_fsdp_settings_without_the_fsdp_strategy():
    with pytest.raises(ValidationError, match="training.fsdp applies with strategy: fsdp, not ddp"):
        TrainingSpec(fsdp={"param_dtype": "bf16"})
    assert TrainingSpec(strategy="fsdp", fsdp={"param_dtype": "bf16"}).fsdp.param_dtype == "bf16"


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)])
        self.out = nn.Linear(4, 10)
        self.out.weight = self.embed.weight  # tied: one parameter in two modules
        self.scale = nn.Parameter(torch.ones(1))


def test_the_units_are_the_module_list_elements_and_direct_children_that_hold_parameters():
    model = build_model(ModelConfig(n_numeric=2, cardinalities=[3, 4], hidden_sizes=[8, 8], dropout=0.1))
    assert [n for n, _ in shard_units(model)] == ["embeddings.0", "embeddings.1", "blocks.0", "blocks.1", "head"]
    # Any module: a Sequential's children; tied modules are left to the root, which gathers them once.
    assert [n for n, _ in shard_units(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1)))] == ["0", "2"]
    assert [n for n, _ in shard_units(_Tied())] == ["layers.0", "layers.2"]
    # A factory's module inside the contract's wrapper: its own blocks are the units.
    wrapped = CustomModel(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1)), default_inputs, 1)
    assert [n for n, _ in shard_units(wrapped)] == ["net.0", "net.2"]
