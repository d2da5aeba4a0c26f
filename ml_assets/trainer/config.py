"""Training configuration: one validated dataclass, written as JSON by the Dagster asset."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

TASKS = ("binary_classification", "regression")


@dataclass(frozen=True, kw_only=True)
class DataRef:
    """A file the trainer reads, named by URI and pinned by sha256."""

    uri: str
    sha256: str
    day: str = ""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: str
    """Model name (for logs only)."""
    task: str
    train_files: list[DataRef]
    val_files: list[DataRef]
    feature_state: DataRef
    """Fitted feature state (JSON) from the training window; copied beside the weights."""
    output_dir: str
    """Where rank 0 writes model.pt, meta.json and feature_state.json (a path or fsspec URL)."""
    epochs: int = 8
    batch_size: int = 256
    """Global batch size: each of the world's ranks takes batch_size // world_size rows a step."""
    learning_rate: float = 3e-3
    weight_decay: float = 1e-4
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 32])
    dropout: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.task not in TASKS:
            problems.append(f"task {self.task!r} is not one of {TASKS}")
        if not self.train_files:
            problems.append("train_files is empty")
        if not self.val_files:
            problems.append("val_files is empty")
        if self.epochs < 1:
            problems.append(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 < self.learning_rate < 1:
            problems.append(f"learning_rate must be in (0, 1), got {self.learning_rate}")
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            problems.append(f"hidden_sizes must be positive, got {self.hidden_sizes}")
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        data = dict(data)
        for key in ("train_files", "val_files"):
            data[key] = [DataRef(**ref) for ref in data.get(key, [])]
        data["feature_state"] = DataRef(**data["feature_state"])
        return cls(**data)

    @classmethod
    def from_json(cls, path: str | Path) -> TrainConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)
