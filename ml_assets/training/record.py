"""What training and tuning tell the next stages: the trained checkpoint and the tuned parameters."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from ml_assets.records.base import Record, decode, field, unwrap
from ml_assets.trainer.config import DataRef
from ml_assets.trainer.result import TrainingResult


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord(Record):
    """trained_checkpoint: what the trainer reported (``result``) and the window it was given.

    In metadata the two are one flat mapping: the trainer's fields, then the window's."""

    result: TrainingResult
    repository: str
    train_days: list[str] = field("json")
    val_days: list[str] = field("json")
    skipped_days: dict[str, str] = field("json")
    data_commits: dict[str, str] = field("json")
    """Each window day's main commit."""
    feature_files: tuple[DataRef, ...] = field("json", of=DataRef)
    feature_state_uri: str = field("path")
    features: list[str] = field("json")
    training_config: dict[str, Any] = field("json")
    hyperparameters: dict[str, Any] = field("json")
    """Where the hyperparameters came from: {"source": ...}, and a study's best parameters."""
    progress: list[dict[str, Any]] = field("json")
    data: dict[str, Any] = field("json", default_factory=dict)
    """How the trainer read the window: {"mode": memory | streaming, "asked": training.data,
    "window_bytes", "reason"}; empty in records from before streaming."""
    decision: dict[str, Any] = field("json", default_factory=dict)
    """The partition's training decision (ml_assets.training.decision.Decision.as_metadata): kind
    (full, fine_tune), reason, the parent, the data checks, the fine-tune days; empty in records from
    before decisions (a full training)."""
    inputs_sha256: str = ""
    """What the training started from (ml_assets.training.decision.inputs_key): a later partition
    with the same key skips."""
    warm_start_key: dict[str, str] = field("json", default_factory=dict)
    """What a fine-tune of these weights must match (ml_assets.training.decision.warm_start_key)."""

    def to_metadata(self) -> dict[str, Any]:
        from ml_assets.training.launcher import metadata_from_pipes

        window = super().to_metadata()
        del window["result"]
        # The trainer's fields as the step received them through Pipes, typed the same way.
        # The decision's kind and reason first among the window's fields: what the UI's list shows.
        said = {"training_decision": self.decision_kind, "training_decision_reason": self.decision.get("reason", "")}
        return {**metadata_from_pipes(self.result.pipes_metadata()), **said, **window}

    @classmethod
    def from_metadata(cls, values: Mapping[str, Any]) -> Self:
        names = {f.name for f in dataclasses.fields(TrainingResult)}
        result = TrainingResult(**{k: unwrap(v) for k, v in values.items() if k in names})
        window = {f.name: decode(f, unwrap(values[f.name])) for f in dataclasses.fields(cls)
                  if f.name != "result" and f.name in values}
        return cls(result=result, **window)

    @property
    def decision_kind(self) -> str:
        return self.decision.get("kind", "full")

    @property
    def parent(self) -> dict[str, Any]:
        """A fine-tune's parent: {"version", "partition", "weights_sha256", "decision", "chain_start"}; else {}."""
        return self.decision.get("parent", {}) if self.decision_kind == "fine_tune" else {}

    def chain_start(self, partition: str) -> str:
        """The partition of the full training this training (of ``partition``) descends from: its own
        when it is a full training."""
        return self.parent.get("chain_start") or partition if self.parent else partition

    @property
    def streamed(self) -> bool:
        """Whether the trainer streamed the window (too large to read into memory)."""
        return self.data.get("mode") == "streaming"

    @property
    def data_commit(self) -> str:
        """The main commit of the newest training day (it holds every earlier day too)."""
        return self.data_commits[max(self.data_commits)]

    @property
    def weights(self) -> DataRef:
        return DataRef(uri=str(self.result.checkpoint_uri), sha256=self.result.checkpoint_sha256)

    @property
    def meta(self) -> DataRef:
        return DataRef(uri=str(self.result.meta_uri), sha256=self.result.meta_sha256)


