"""The spec's ``training`` section: the training window, the optimizer and how it runs (the network
is the ``model`` section, ml_assets.spec.architecture)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ml_assets.spec.base import ORCHESTRATION, PositiveInt, StrictModel
from ml_assets.spec.pods import TrainingPodSpec
from ml_assets.spec.warm_start import WarmStartSpec


class CheckpointSpec(StrictModel):
    every_steps: int = Field(default=0, ge=0, description="checkpoint every N optimizer steps (0: off)")
    every_seconds: float = Field(default=300, ge=0, description="and every M seconds (0: off)")
    keep_last: int = Field(default=2, ge=1, le=100)
    async_mode: Literal["thread", "process", "off"] = Field(
        default="thread", alias="async", description="background writer (benchmarks/checkpoint_stall.py compares them)")
    preemption_grace_seconds: float = Field(default=20, gt=0, le=3600)
    orphan_grace_seconds: float = Field(default=5, gt=0, le=60, description=(
        "a rank whose torchrun agent died checkpoints if it can within this long, then exits"))
    lease_ttl_seconds: float = Field(default=30, ge=3, le=600, description=(
        "the checkpoint directory's lease is renewed every third of this; unrenewed this long, it is taken over"))
    lease_wait_seconds: float = Field(default=120, ge=0, le=480, description=(
        "how long a second training of the same config waits for the lease before failing (at most 8 minutes: "
        "the other ranks wait for the verdict in a collective)"))


class LoaderSpec(StrictModel):
    num_workers: int = Field(default=0, ge=0, le=64)
    pin_memory: bool = False
    prefetch_factor: int = Field(default=2, ge=1, le=64)


class StreamingSpec(StrictModel):
    shuffle_buffer_rows: int = Field(default=65_536, ge=1, le=100_000_000, description=(
        "streamed windows: rows each rank shuffles together; a rank's memory grows with it, not with the window"))
    auto_above_mb: Annotated[float, ORCHESTRATION] = Field(default=1024, gt=0, description=(
        "data: auto streams a window whose feature files (compressed Parquet, validation days included) hold "
        "more than this many MB; in memory a window takes several times its files' size"))


class EarlyStoppingSpec(StrictModel):
    patience: int = Field(default=0, ge=0, description="epochs without improvement before stopping (0: off)")
    min_delta: float = Field(default=0.0, ge=0)


class FsdpSpec(StrictModel):
    param_dtype: Literal["fp32", "bf16", "fp16"] = Field(default="fp32", description=(
        "the dtype parameters are gathered and computed in; the sharded copy the optimizer steps stays fp32"))
    reduce_dtype: Literal["fp32", "bf16"] = Field(default="fp32", description=(
        "the dtype gradients are reduce-scattered (summed across ranks) in"))
    reshard_after_forward: bool = Field(default=True, description=(
        "free each block's gathered parameters after its forward and gather them again for its backward: less "
        "memory, one more all-gather per block; the same weights either way"))


class TrainingSpec(StrictModel):
    window_days: Annotated[int, ORCHESTRATION] = Field(default=14, ge=3, le=366, description=(
        "the days before the test days that train and validate: window_days - validation_days train"))
    validation_days: Annotated[int, ORCHESTRATION] = Field(default=1, ge=1, le=365, description=(
        "the last days of the window: early stopping, the best epoch and the decision threshold are chosen on them"))
    min_validation_rows: Annotated[int, ORCHESTRATION] = Field(default=30, ge=1, description=(
        "fewer validation rows (or, for classification, a class missing from them) fail the training before it starts"))
    missing_days: Annotated[Literal["fail", "skip"], ORCHESTRATION] = Field(default="fail", description=(
        "a window day without features (its snapshot failed, or it was never ingested): fail the partition, or "
        "train and evaluate on the other days, listing the skipped ones"))
    max_missing_days: Annotated[int, ORCHESTRATION] = Field(default=0, ge=0, le=365, description=(
        "with missing_days: skip, the most days of the window and the test days that may be missing"))
    data: Annotated[Literal["memory", "streaming", "auto"], ORCHESTRATION] = Field(default="auto", description=(
        "memory: every rank reads the whole training window into memory. streaming: each rank streams its "
        "shard of the window's Parquet row groups every epoch through a shuffle buffer, so memory stays flat "
        "however long the window (docs/training.md). auto: streaming when the window's feature files exceed "
        "streaming.auto_above_mb"))
    streaming: StreamingSpec = StreamingSpec()
    epochs: PositiveInt = 8
    batch_size: PositiveInt = 256
    grad_accum_steps: PositiveInt = 1
    learning_rate: float = Field(default=3e-3, gt=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0)
    warmup_steps: int = Field(default=0, ge=0)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    grad_clip_norm: float = Field(default=1.0, ge=0)
    activation_checkpointing: bool = False
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    strategy: Literal["ddp", "fsdp"] = Field(default="ddp", description=(
        "ddp: every rank holds the whole model, its gradients and optimizer state; fsdp: FSDP2 shards all three "
        "over the ranks (1/world each), gathering a block's parameters around its forward and backward"))
    fsdp: FsdpSpec = Field(default=FsdpSpec(), description="with strategy: fsdp, its mixed precision and resharding")
    early_stopping: EarlyStoppingSpec = EarlyStoppingSpec()
    deterministic: bool = False
    processes_per_node: Annotated[int, ORCHESTRATION] = Field(default=2, ge=1, le=64, description=(
        "torchrun processes per node on CPUs (locally, and on Kubernetes when gpus_per_node is 0)"))
    nodes: Annotated[int, ORCHESTRATION] = Field(default=1, ge=1, le=256, description=(
        "Kubernetes: training pods of one DDP run (an Indexed Job with c10d rendezvous when > 1); "
        "locally the run trains on the one machine"))
    gpus_per_node: Annotated[int | None, ORCHESTRATION] = Field(default=None, ge=0, le=16, description=(
        "Kubernetes: nvidia.com/gpu limit of each training pod and its torchrun processes (0: CPU; "
        "unset: the chart's training.gpusPerNode)"))
    pod: Annotated[TrainingPodSpec, ORCHESTRATION] = TrainingPodSpec()
    max_restarts: Annotated[int, ORCHESTRATION] = Field(default=2, ge=0, le=100, description="torchrun restarts of crashed workers")
    retries: Annotated[int, ORCHESTRATION] = Field(default=2, ge=0, le=100, description="step retries after preemption (resume)")
    max_runtime_minutes: Annotated[int, ORCHESTRATION] = Field(default=360, ge=1, le=7 * 24 * 60, description=(
        "a run that trains is cancelled and failed by run monitoring after this long (dagster/max_runtime)"))
    report_every_steps: PositiveInt = 50
    checkpoint: CheckpointSpec = CheckpointSpec()
    loader: LoaderSpec = LoaderSpec()
    seed: int = 0
    warm_start: Annotated[WarmStartSpec | None, ORCHESTRATION] = Field(default=None, description=(
        "each daily partition skips (nothing changed), fine-tunes the champion on the newest days, or retrains "
        "from scratch (on a schedule, without a compatible champion, or when the data moved): docs/training.md, "
        "'Daily retraining'. Unset: every partition trains from scratch"))

    @model_validator(mode="after")
    def _fsdp_needs_its_strategy(self) -> TrainingSpec:
        if self.strategy != "fsdp" and self.fsdp != FsdpSpec():
            raise ValueError(f"training.fsdp applies with strategy: fsdp, not {self.strategy}")
        return self
