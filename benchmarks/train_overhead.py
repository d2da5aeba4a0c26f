"""The platform trainer against a bare PyTorch loop: same model, data, recipe and thread count.

    python -m benchmarks.train_overhead [--quick]

Data: the bundled model's real features (60 days of 2013 flights for training, the next day for
validation), built by the platform's feature code. Ours: ``ml_assets.trainer.train`` under torchrun
with one rank and one thread, as the ``trained_checkpoint`` asset runs it (epoch-end checkpoints,
best-weights file and progress reports included); its samples/s is rows trained / training-loop
seconds (validation and checkpoints inside the loop count). The bare loop: the same model class,
AdamW, warmup-cosine schedule, gradient clipping, autocast choice, shuffled batches and a
validation pass per epoch, written by hand, with one thread. Each run of either is a fresh process
(the trainer always is one, and a process's first epochs pay one-off costs: kernel set-up, lazy
imports), the bare loop started by this module as ``--bare CONFIG``. The runs take turns; the ratio
of medians is the RESULT (goal >= 0.97). The bare loop gets the trainer's malloc
settings (ml_assets.trainer.runtime.steady_allocator), so that the ratio measures the trainer's code.

Warm start: none here, every training is a full one (benchmarks/README.md, "Warm start").
"""

from __future__ import annotations

import argparse
import importlib
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._training import bundled_inputs, env, median, spec_training, train
from ml_assets.features.state import cardinalities
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.contract import ModelInputs
from ml_assets.trainer.data import read_frame, read_state, to_tensors
from ml_assets.trainer.model import ModelConfig, build_model, loss_fn
from ml_assets.trainer.runtime import choose_precision, steady_allocator
from ml_assets.trainer.setup import warmup_cosine


def bare_model(cfg: TrainConfig, state: dict, n_numeric: int) -> torch.nn.Module:
    """The config's model as a user would build it by hand: a built-in family, or the factory
    imported and called directly (no contract wrapper, no checks)."""
    if not cfg.model_factory:
        return build_model(ModelConfig(n_numeric=n_numeric, cardinalities=cardinalities(state),
                                       hidden_sizes=list(cfg.hidden_sizes), dropout=cfg.dropout, family=cfg.family))
    sys.path.insert(0, cfg.model_code_path)
    module, name = cfg.model_factory.split(":")
    factory = getattr(importlib.import_module(module), name)
    return factory(ModelInputs.from_state(state, cfg.task, cfg.classes), **cfg.model_params)


def bare_loop(cfg: TrainConfig, allocator: bool = True) -> float:
    """A hand-written loop of the same recipe; returns samples/s over its epochs. With ``allocator``
    the process gets the trainer's malloc settings first (runtime.steady_allocator), so the ratio
    measures the trainer's code, not glibc's allocation history."""
    if allocator:
        steady_allocator()
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    state = read_state(cfg.feature_state)
    numeric, categorical, target = to_tensors(read_frame(cfg.train_files), state)
    val = to_tensors(read_frame(cfg.val_files), state)
    model = bare_model(cfg, state, numeric.shape[1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    n, b = len(target), cfg.batch_size
    total = math.ceil(n / b) * cfg.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.warmup_steps, total, cfg.min_lr_ratio))
    dtype, _ = choose_precision(cfg.precision, torch.device("cpu"), lambda _: None)
    criterion = loss_fn(cfg.task)
    started = time.perf_counter()
    for _ in range(cfg.epochs):
        order = torch.randperm(n)
        x, c, y = numeric[order], categorical[order], target[order]
        model.train()
        for i in range(0, n, b):
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                out = model(x[i:i + b], c[i:i + b])
            loss = criterion(out.float().reshape(y[i:i + b].shape), y[i:i + b]) / b
            loss.backward()
            if cfg.grad_clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            float(criterion(model(val[0], val[1]).float().reshape(val[2].shape), val[2]))
    return n * cfg.epochs / (time.perf_counter() - started)


def bare_in_a_fresh_process(cfg: TrainConfig, tmp: str, allocator: bool = True) -> float:
    config = Path(tmp) / "bare.json"
    config.write_text(cfg.to_json())
    flags = [] if allocator else ["--glibc-defaults"]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.train_overhead", "--bare", str(config), *flags],
                          capture_output=True, text=True, timeout=1800, env=env(1))
    if proc.returncode != 0:
        raise SystemExit(f"the bare loop failed:\n{proc.stderr[-3000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 days, 1 epoch, one run each")
    parser.add_argument("--bare", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--glibc-defaults", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        print(bare_loop(TrainConfig.from_json(args.bare), allocator=not args.glibc_defaults))
        return
    days, epochs, runs = (10, 1, 1) if args.quick else (60, 4, 5)
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        inputs = bundled_inputs(Path(tmp) / "data", days)
        fields = {**spec_training(), "epochs": epochs, "threads": 1}
        cfg = TrainConfig(**inputs, output_dir=f"{tmp}/unused", **fields)
        ours, bare = [], []
        for _ in range(runs):
            ours.append(train(inputs, **fields)["accounting"]["samples_per_s"])
            bare.append(bare_in_a_fresh_process(cfg, tmp))
    print(f"platform trainer (torchrun, 1 rank, 1 thread): {median(ours):9,.0f} samples/s  runs {[round(v) for v in ours]}")
    print(f"bare PyTorch loop (same recipe, 1 thread):     {median(bare):9,.0f} samples/s  runs {[round(v) for v in bare]}")
    print(f"ratios of the runs in turn (the spread): {[round(a / b, 3) for a, b in zip(ours, bare, strict=True)]}")
    print(f"RESULT train_overhead {median(ours) / median(bare):.3f} goal >= 0.97")


if __name__ == "__main__":
    main()
