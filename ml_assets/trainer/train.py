"""Train a tabular model with DistributedDataParallel; run by torchrun.

By hand (no Dagster needed; the ``trained_checkpoint`` asset writes the config and runs the same)::

    torchrun --standalone --nproc_per_node=2 -m ml_assets.trainer.train --config train_config.json

gloo on CPU, nccl when CUDA is available. Rank 0 alone logs, writes the checkpoint and reports to
Dagster through Pipes; every rank computes on its shard and validation metrics are all-reduced.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable

import fsspec
import torch
import torch.distributed as dist
from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ml_assets.features.state import cardinalities
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.data import read_frame, read_state, read_verified, to_tensors
from ml_assets.trainer.model import ModelConfig, build_model


def compute_init() -> tuple[int, int, torch.device]:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def compute_cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def loss_fn(task: str) -> nn.Module:
    return nn.BCEWithLogitsLoss(reduction="sum") if task == "binary_classification" else nn.MSELoss(reduction="sum")


def evaluate_loss(model: nn.Module, tensors: tuple, task: str, rank: int, world: int, device: torch.device) -> float:
    """Mean loss over ALL validation rows: each rank takes every world-th row, sums are all-reduced."""
    numeric, categorical, target = (t[rank::world].to(device) for t in tensors)
    model.eval()
    with torch.no_grad():
        total = loss_fn(task)(model(numeric, categorical), target) if len(target) else torch.zeros((), device=device)
    sums = torch.stack([total.detach().double(), torch.tensor(float(len(target)), dtype=torch.float64, device=device)])
    dist.all_reduce(sums)
    return float(sums[0] / sums[1])


def train(cfg: TrainConfig, rank: int, world: int, device: torch.device, log: Callable[[str], None]) -> dict:
    torch.manual_seed(cfg.seed)
    state = read_state(cfg.feature_state)
    train_t = to_tensors(read_frame(cfg.train_files), state)
    val_t = to_tensors(read_frame(cfg.val_files), state)
    model_cfg = ModelConfig(
        n_numeric=train_t[0].shape[1], cardinalities=cardinalities(state),
        hidden_sizes=list(cfg.hidden_sizes), dropout=cfg.dropout,
    )
    model = build_model(model_cfg).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    dataset = TensorDataset(*train_t)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(dataset, batch_size=max(1, cfg.batch_size // world), sampler=sampler)
    criterion = loss_fn(cfg.task)
    history = []
    log(f"training {cfg.model}: {len(dataset)} train rows, {len(val_t[2])} validation rows, "
        f"{world} process(es), {cfg.epochs} epochs")
    for epoch in range(cfg.epochs):
        started = time.perf_counter()
        sampler.set_epoch(epoch)
        ddp.train()
        sums = torch.zeros(2, dtype=torch.float64, device=device)
        for numeric, categorical, target in loader:
            numeric, categorical, target = numeric.to(device), categorical.to(device), target.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(ddp(numeric, categorical), target)
            (loss / len(target)).backward()
            optimizer.step()
            sums += torch.stack([loss.detach().double(), torch.tensor(float(len(target)), dtype=torch.float64, device=device)])
        dist.all_reduce(sums)
        train_loss = float(sums[0] / sums[1])
        val_loss = evaluate_loss(model, val_t, cfg.task, rank, world, device)
        seconds = time.perf_counter() - started
        history.append({"epoch": epoch + 1, "train_loss": train_loss, "val_loss": val_loss, "seconds": seconds})
        log(f"epoch {epoch + 1}/{cfg.epochs}  train_loss {train_loss:.4f}  val_loss {val_loss:.4f}  ({seconds:.1f}s)")
    return {"model": model, "model_config": model_cfg, "history": history, "state": state,
            "train_rows": len(dataset), "val_rows": len(val_t[2]), "world_size": world}


def save_checkpoint(cfg: TrainConfig, result: dict) -> dict:
    """Rank 0: weights, a meta JSON that rebuilds the model, and the feature state beside them."""
    base = cfg.output_dir.rstrip("/")
    buffer = _state_dict_bytes(result["model"])
    weights_sha = hashlib.sha256(buffer).hexdigest()
    meta = {
        "model": cfg.model, "task": cfg.task, "model_config": result["model_config"].to_dict(),
        "weights_sha256": weights_sha, "feature_state_sha256": cfg.feature_state.sha256,
        "history": result["history"], "train_rows": result["train_rows"], "val_rows": result["val_rows"],
        "world_size": result["world_size"], "torch_version": torch.__version__,
        "train_files": [ref.__dict__ for ref in cfg.train_files],
        "val_files": [ref.__dict__ for ref in cfg.val_files],
    }
    meta_bytes = json.dumps(meta, indent=1, sort_keys=True).encode()
    for name, data in (("model.pt", buffer), ("meta.json", meta_bytes),
                       ("feature_state.json", read_verified(cfg.feature_state))):
        with fsspec.open(f"{base}/{name}", "wb", auto_mkdir=True) as fh:
            fh.write(data)
    return {"uri": f"{base}/model.pt", "sha256": weights_sha, "bytes": len(buffer),
            "meta_uri": f"{base}/meta.json", "meta_sha256": hashlib.sha256(meta_bytes).hexdigest()}


def _state_dict_bytes(model: nn.Module) -> bytes:
    import io

    out = io.BytesIO()
    torch.save(model.state_dict(), out)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="path of the training config JSON")
    args = parser.parse_args(argv)
    cfg = TrainConfig.from_json(args.config)
    rank, world, device = compute_init()
    master = rank == 0
    # Only rank 0 may talk to Dagster: if every rank reported, the step would see several results.
    in_dagster = master and PipesEnvVarParamsLoader().is_dagster_pipes_process()
    try:
        with open_dagster_pipes() if in_dagster else contextlib.nullcontext() as pipes:
            def log(message: str) -> None:
                if not master:
                    return
                if pipes is not None:
                    pipes.log.info(message)
                else:
                    print(f"[trainer] {message}", file=sys.stderr, flush=True)

            result = train(cfg, rank, world, device, log)
            if master:
                saved = save_checkpoint(cfg, result)
                log(f"checkpoint {saved['uri']} sha256 {saved['sha256'][:12]}")
                if pipes is not None:
                    last = result["history"][-1]
                    pipes.report_asset_materialization(
                        metadata={
                            "checkpoint_uri": {"raw_value": saved["uri"], "type": "path"},
                            "checkpoint_sha256": saved["sha256"],
                            "checkpoint_bytes": saved["bytes"],
                            "meta_uri": {"raw_value": saved["meta_uri"], "type": "path"},
                            "meta_sha256": saved["meta_sha256"],
                            "feature_state_sha256": cfg.feature_state.sha256,
                            "train_rows": result["train_rows"],
                            "val_rows": result["val_rows"],
                            "world_size": world,
                            "final_train_loss": last["train_loss"],
                            "final_val_loss": last["val_loss"],
                            "history": {"raw_value": result["history"], "type": "json"},
                        },
                        data_version=saved["sha256"],
                    )
    finally:
        compute_cleanup()


if __name__ == "__main__":
    main()
