"""Fraction of training-step time spent waiting for data: the platform trainer's loader against the
stock PyTorch loader (TensorDataset + DataLoader, row by row and collated).

    python -m benchmarks.data_wait [--quick]

Ours: the trainer under torchrun (1 rank, 1 thread) on the bundled model's real features; it times
every wait for the next batch (and each epoch's one-off gather) against the training loop's time
and reports the fraction in its metadata. Baseline: the same model and batches in this process, fed
by ``DataLoader(TensorDataset(...), batch_size, shuffle=True)`` with the wait timed the same way.
Medians of several runs, taking turns. Goal: ours <= 0.02.

Warm start: none here, every training is a full one (benchmarks/README.md, "Warm start").
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks._training import bundled_inputs, median, spec_training, train
from ml_assets.features.state import cardinalities
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.data import read_frame, read_state, to_tensors
from ml_assets.trainer.model import ModelConfig, build_model, loss_fn


def stock_loader_wait(cfg: TrainConfig) -> float:
    torch.set_num_threads(1)
    state = read_state(cfg.feature_state)
    tensors = to_tensors(read_frame(cfg.train_files), state)
    model = build_model(ModelConfig(n_numeric=tensors[0].shape[1], cardinalities=cardinalities(state),
                                    hidden_sizes=list(cfg.hidden_sizes), dropout=cfg.dropout, family=cfg.family))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    criterion = loss_fn(cfg.task)
    loader = DataLoader(TensorDataset(*tensors), batch_size=cfg.batch_size, shuffle=True)
    waited, started = 0.0, time.perf_counter()
    for _ in range(cfg.epochs):
        batches = iter(loader)
        while True:
            t = time.perf_counter()
            batch = next(batches, None)
            waited += time.perf_counter() - t
            if batch is None:
                break
            loss = criterion(model(batch[0], batch[1]), batch[2]) / len(batch[2])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return waited / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 days, 1 epoch, one run each")
    args = parser.parse_args()
    days, epochs, runs = (10, 1, 1) if args.quick else (60, 3, 5)
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        inputs = bundled_inputs(Path(tmp) / "data", days)
        fields = {**spec_training(), "epochs": epochs, "threads": 1, "precision": "fp32"}
        cfg = TrainConfig(**inputs, output_dir=f"{tmp}/unused", **fields)
        ours, stock = [], []
        for _ in range(runs):
            ours.append(train(inputs, **fields)["accounting"]["data_wait_fraction"])
            stock.append(stock_loader_wait(cfg))
    print(f"platform trainer's loader: {100 * median(ours):5.2f}% of step time waiting  runs {[round(100 * v, 2) for v in ours]}")
    print(f"stock DataLoader:          {100 * median(stock):5.2f}% of step time waiting  runs {[round(100 * v, 2) for v in stock]}")
    print(f"RESULT data_wait {median(ours):.4f} goal <= 0.02")


if __name__ == "__main__":
    main()
