"""What rank 0 reports of a finished training: the materialization metadata (in Dagster Pipes'
form) and ``report.json`` beside the export, for runs without Dagster."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch

from ml_assets import processes
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.result import TrainingResult, rank_seconds
from ml_assets.trainer.runtime import Runtime

if TYPE_CHECKING:
    from ml_assets.trainer.boost import BoostTrainer
    from ml_assets.trainer.loop import Trainer

REPORT_FILE = "report.json"
"""Written by rank 0 beside the export: {"data_version": ..., "metadata": {...}} in Pipes' metadata form."""


def write_report(output_dir: str, metadata: dict, data_version: str) -> str:
    import fsspec

    uri = f"{output_dir.rstrip('/')}/{REPORT_FILE}"
    with fsspec.open(uri, "w", auto_mkdir=True) as fh:
        json.dump({"data_version": data_version, "metadata": metadata}, fh, indent=1, allow_nan=True)
    return uri


def result_metadata(cfg: TrainConfig, rt: Runtime, trainer: Trainer | BoostTrainer, saved: dict, acct: dict, which: str,
                    lease: dict | None = None) -> dict:
    """The trained checkpoint's materialization metadata (Pipes' form: typed values as raw_value/type)."""
    p = trainer.progress
    last = p.history[-1] if p.history else {}
    held = held_seconds(acct["wall_s"])
    cpu_rank_s, gpu_rank_s = rank_seconds(trainer.device_type, rt.world, held)
    return TrainingResult(
        checkpoint_uri=saved["uri"], checkpoint_sha256=saved["sha256"], checkpoint_bytes=saved["bytes"],
        meta_uri=saved["meta_uri"], meta_sha256=saved["meta_sha256"],
        feature_state_sha256=cfg.feature_state.sha256,
        train_rows=trainer.train_rows, val_rows=trainer.val_rows,
        world_size=rt.world, device=str(rt.device), backend=rt.backend,
        precision=trainer.precision_name,
        steps=p.step, stop_reason=p.stop_reason, weights_from=which,
        resumed_from_step=trainer.resumed_from if trainer.resumed_from is not None else -1,
        final_train_loss=last.get("train_loss", float("nan")), final_val_loss=last.get("val_loss", float("nan")),
        best_val_loss=p.best_val_loss if p.best_val_loss is not None else float("nan"),
        samples_per_s=round(acct["samples_per_s"], 1),
        data_wait_pct=round(100 * acct["data_wait_fraction"], 2),
        checkpoint_stall_s=round(acct["checkpoint_stall_s"], 3), checkpoints_written=acct["checkpoints_written"],
        checkpoint_dir=cfg.checkpoint_root,
        cpu_hours=round(acct["cpu_hours"], 5), gpu_hours=round(acct["gpu_hours"], 5),
        torch_version=torch.__version__, ml_assets_version=_project_version(),
        config_fingerprint=p.fingerprint, history=p.history, checkpoint_lease=lease or {},
        wall_seconds=round(held, 3), cpu_rank_seconds=cpu_rank_s, gpu_rank_seconds=gpu_rank_s,
        samples_processed=acct["samples"],
    ).pipes_metadata()


def held_seconds(training_wall: float) -> float:
    """How long the ranks have held their devices: since this process started, so that its imports
    and the process group's setup count too, which the training's own wall (``gpu_hours``) leaves
    out. That wall where /proc cannot say."""
    alive = processes.seconds_alive()
    return alive if alive is not None else training_wall


def _project_version() -> str:
    try:
        from importlib.metadata import version

        return version("ml-assets")
    except Exception:
        return "unknown"
