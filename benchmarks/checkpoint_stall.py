"""How long checkpointing holds training up: async save (thread and process) against a synchronous
save of the same >= 100 MB state, and training throughput with periodic checkpoints against none.

    python -m benchmarks.checkpoint_stall [--quick]

1. Stall: a residual MLP of width 2048 (about 8.5M parameters) with its AdamW state, about 100 MB,
   saved by the trainer's CheckpointManager to a local directory: the time ``save()`` keeps the
   caller (staging copy and planning for async; everything, including the sha256 manifest, for
   synchronous). Modes take turns; medians of several saves.
2. Throughput: the trainer under torchrun (1 rank, 1 thread) training that large model on the
   bundled features, checkpointing every few seconds (async, the default mode) versus never
   within the run. Same step budget; samples/s over the training loop; medians, taking turns.

Goals: async stall / sync stall <= 0.2; throughput with checkpoints / without >= 0.97.

``--quick`` (the suite's smoke run) uses width 1024 (a state of about 50 MB, still above the size
from which saves are async), two saves and a 24-step training: its figures are not the goals'.

Warm start: none here, every training is a full one (benchmarks/README.md, "Warm start").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks._processes import free_port
from benchmarks._training import bundled_inputs, median, spec_training, train
from ml_assets.trainer.checkpoint import CheckpointManager
from ml_assets.trainer.model import ModelConfig, build_model

WIDTH, QUICK_WIDTH = 2048, 1024


def big(width: int) -> dict:
    return {"family": "residual_mlp", "hidden_sizes": [width]}


def big_state(width: int) -> dict[str, torch.Tensor]:
    model = build_model(ModelConfig(n_numeric=16, cardinalities=[20, 100, 100], hidden_sizes=[width], dropout=0.0,
                                    family="residual_mlp"))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 16), torch.zeros(8, 3, dtype=torch.int64)).sum().backward()
    optimizer.step()
    names = [n for n, _ in model.named_parameters()]
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, entries in optimizer.state_dict()["state"].items():
        out.update({f"optim.{names[i]}.{k}": v for k, v in entries.items()})
    return out


def stalls(root: Path, saves: int, width: int) -> dict[str, list[float]]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    tensors = big_state(width)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"state: {size / 2**20:.0f} MiB in {len(tensors)} tensors")
    managers = {mode: CheckpointManager(str(root / mode), rank=0, world=1, mode=mode, keep_last=1,
                                        log=lambda _: None, warn=print) for mode in ("off", "thread", "process")}
    times: dict[str, list[float]] = {mode: [] for mode in managers}
    for step in range(1, saves + 1):
        for mode, manager in managers.items():
            held = manager.save(step, tensors, {"fingerprint": "bench"})
            manager.wait()
            times[mode].append(held)
    for manager in managers.values():
        manager.close()
    dist.destroy_process_group()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer saves, a short training run each")
    args = parser.parse_args()
    saves, runs, steps, every = (2, 1, 24, 1.0) if args.quick else (5, 3, 160, 10.0)
    width = QUICK_WIDTH if args.quick else WIDTH
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        times = stalls(Path(tmp) / "stall", saves, width)
        sync = statistics.median(times["off"])
        for mode in ("thread", "process"):
            print(f"async ({mode}) save holds training {statistics.median(times[mode]):.3f}s; synchronous save "
                  f"{sync:.3f}s  (ratio {statistics.median(times[mode]) / sync:.3f})")
        inputs = bundled_inputs(Path(tmp) / "data", 10 if args.quick else 30)
        fields = {**spec_training(), **big(width), "epochs": 100, "max_steps": steps, "threads": 1,
                  "report_every_steps": 10_000}
        with_ckpt, without, written = [], [], []
        for _ in range(runs):
            meta = train(inputs, **fields, checkpoint_every_seconds=every)
            with_ckpt.append(meta["accounting"]["samples_per_s"])
            written.append(meta["accounting"]["checkpoints_written"])
            without.append(train(inputs, **fields, checkpoint_every_seconds=0)["accounting"]["samples_per_s"])
    print(f"training, checkpoint every {every:.0f}s ({written} written): {median(with_ckpt):8,.0f} samples/s  runs {[round(v) for v in with_ckpt]}")
    print(f"training, no checkpoint in the run:        {median(without):8,.0f} samples/s  runs {[round(v) for v in without]}")
    print(f"RESULT checkpoint_stall_throughput {median(with_ckpt) / median(without):.3f} goal >= 0.97")
    print(f"RESULT checkpoint_stall {statistics.median(times['thread']) / sync:.3f} goal <= 0.2")


if __name__ == "__main__":
    main()
