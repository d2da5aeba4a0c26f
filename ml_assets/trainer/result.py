"""What rank 0 reports of a finished training (no torch here: the Dagster side reads it too)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar


@dataclass(frozen=True, kw_only=True)
class TrainingResult:
    """What rank 0 reports of a finished training: the first fields of the trained_checkpoint record
    (ml_assets.training.record.CheckpointRecord), in Pipes' metadata form on the wire."""

    checkpoint_uri: str
    checkpoint_sha256: str
    checkpoint_bytes: int
    meta_uri: str
    meta_sha256: str
    feature_state_sha256: str
    train_rows: int
    val_rows: int
    world_size: int
    device: str
    backend: str
    precision: str
    steps: int
    stop_reason: str
    weights_from: str
    resumed_from_step: int
    final_train_loss: float
    final_val_loss: float
    best_val_loss: float
    samples_per_s: float
    data_wait_pct: float
    checkpoint_stall_s: float
    checkpoints_written: int
    checkpoint_dir: str
    cpu_hours: float
    gpu_hours: float
    torch_version: str
    ml_assets_version: str
    config_fingerprint: str
    history: list[dict] = field(default_factory=list)
    checkpoint_lease: dict = field(default_factory=dict)
    wall_seconds: float | None = None
    """Seconds rank 0's process lived until its report, in this attempt (a training resumed after a
    preemption counts from its resumption); None in records from before it was reported."""
    cpu_rank_seconds: float | None = None
    """``wall_seconds`` times the ranks that ran on CPU (ml_assets.trainer.result.rank_seconds)."""
    gpu_rank_seconds: float | None = None
    """``wall_seconds`` times the ranks that ran on a GPU."""
    samples_processed: int | None = None
    """Training rows the ranks stepped through in this attempt, summed over ranks and epochs."""

    PATHS: ClassVar[tuple[str, ...]] = ("checkpoint_uri", "meta_uri", "checkpoint_dir")
    JSON: ClassVar[tuple[str, ...]] = ("history", "checkpoint_lease")

    def pipes_metadata(self) -> dict:
        """Pipes' form: typed values as ``{"raw_value": ..., "type": ...}``."""
        out: dict = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:  # unset (an older report): left out, as records do
                continue
            kind = "path" if f.name in self.PATHS else "json" if f.name in self.JSON else None
            out[f.name] = {"raw_value": value, "type": kind} if kind else value
        return out


def rank_seconds(device: str, ranks: int, wall_seconds: float) -> tuple[float, float]:
    """(CPU, GPU) rank-seconds of ``ranks`` processes that ran on ``device`` (``cpu``, ``cuda``,
    ``cuda:0``) for ``wall_seconds``. A rank on a GPU holds a CPU core too, but it is the GPU it
    keeps from others: it counts as GPU time alone, so the two never add up the same seconds."""
    held = round(ranks * wall_seconds, 3)
    return (0.0, held) if device.startswith("cuda") else (held, 0.0)
