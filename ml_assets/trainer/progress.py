"""Where a training is, apart from its tensors: step, epoch, position in the epoch's permutation,
history, early-stopping state, and the scheduler's, optimizer groups' and grad scaler's state. It is
saved as JSON beside every checkpoint and restored when a training resumes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Progress:
    """Everything about where training is that is not a tensor (saved as JSON with the checkpoint)."""

    fingerprint: str
    step: int = 0
    epoch: int = 0
    rows_in_epoch: int = 0
    """Rows of the current epoch already trained on, over all ranks: positions of the epoch's
    permutation (data_mode memory), or rows of the ranks' streams, padding included (streaming:
    each rank replays its stream to rows_in_epoch / W, ml_assets.trainer.stream)."""
    epoch_loss: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """[sum of losses, rows] of the current epoch so far, over all ranks."""
    history: list[dict] = field(default_factory=list)
    best_val_loss: float | None = None
    best_epoch: int = 0
    bad_epochs: int = 0
    done: bool = False
    stop_reason: str = ""
    world_size: int = 1
    scheduler: dict = field(default_factory=dict)
    optimizer_groups: list[dict] = field(default_factory=list)
    scaler: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)
