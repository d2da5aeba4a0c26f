"""Training configuration: one validated dataclass, written as JSON by the Dagster asset."""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

TASKS = ("binary_classification", "regression", "multiclass_classification")
FAMILIES = ("mlp", "residual_mlp", "xgboost")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
ASYNC_MODES = ("off", "thread", "process")
STRATEGIES = ("ddp", "fsdp")
FSDP_PARAM_DTYPES = ("fp32", "bf16", "fp16")
FSDP_REDUCE_DTYPES = ("fp32", "bf16")
DATA_MODES = ("memory", "streaming")


def option(default: Any = MISSING, *, spec: str = "", weights: bool = True, later: bool = False,
           streaming_only: bool = False, default_factory: Any = MISSING) -> Any:
    """A TrainConfig field, declared once with where it comes from and what it decides.

    ``spec``: the spec setting it is a view of (``training.checkpoint.keep_last``, ``model.layers``),
    read by ml_assets.training.trainer_config; without one, the caller sets it (this run's files,
    owner, data mode). ``weights=False``: where things go or how often to report, not what is
    trained: two configs that differ only in such fields train the same weights and may resume each
    other's checkpoints (left out of the fingerprint). ``later``: added after checkpoints existed,
    left out of the fingerprint while it holds its default, so configs written before it keep
    theirs (and their checkpoints). ``streaming_only``: decides the weights only when streaming.
    """
    declared = Option(spec=spec, weights=weights, later=later, streaming_only=streaming_only)
    return field(default=default, default_factory=default_factory, metadata={Option: declared})


@dataclass(frozen=True)
class Option:
    """What a TrainConfig field declares (``option``)."""

    spec: str
    weights: bool
    later: bool
    streaming_only: bool


def option_of(f: Field) -> Option:
    return f.metadata[Option]


MAX_LEASE_WAIT_SECONDS = 480.0
"""While rank 0 waits for the checkpoint lease, the other ranks wait for its verdict in a collective,
which NCCL times out after 10 minutes."""


@dataclass(frozen=True, kw_only=True)
class DataRef:
    """A file the trainer reads, named by URI and pinned by sha256 (and by the version-store commit
    it was built from, when it has one)."""

    uri: str
    sha256: str
    day: str = ""
    commit: str = ""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: str = option(spec="name")
    """Model name (for logs only)."""
    task: str = option(spec="target.task")
    classes: list[str] = option(spec="target.classes", later=True, default_factory=list)
    """multiclass_classification: the class names, in the order of the labels' indices (the model
    has one output per class); empty for the other tasks."""
    train_files: list[DataRef] = option()
    val_files: list[DataRef] = option()
    feature_state: DataRef = option()
    """Fitted feature state (JSON) from the training window; copied beside the weights."""
    output_dir: str = option(weights=False)
    """Where rank 0 exports the final model: model.safetensors, meta.json, feature_state.json (a
    path or fsspec URL)."""
    checkpoint_dir: str = option("", weights=False)
    """Where training checkpoints go (path or fsspec URL); empty: ``<output_dir>/checkpoints``. A
    restarted run with the same config resumes from the newest complete checkpoint here."""

    family: str = option("mlp", spec="model.family_name")
    """``mlp`` (embeddings + MLP), ``residual_mlp`` (embeddings + pre-norm residual blocks), or
    ``xgboost`` (gradient-boosted trees, ml_assets.trainer.boost: model_params are XGBoost's)."""
    epochs: int = option(8, spec="training.epochs")
    batch_size: int = option(256, spec="training.batch_size")
    """Global batch per optimizer step: each of W ranks takes batch_size // (W * grad_accum_steps)
    rows per micro-step."""
    grad_accum_steps: int = option(1, spec="training.grad_accum_steps")
    learning_rate: float = option(3e-3, spec="training.learning_rate")
    weight_decay: float = option(1e-4, spec="training.weight_decay")
    warmup_steps: int = option(0, spec="training.warmup_steps")
    """Linear warmup, then cosine decay to min_lr_ratio * learning_rate at the last step."""
    min_lr_ratio: float = option(0.0, spec="training.min_lr_ratio")
    grad_clip_norm: float = option(1.0, spec="training.grad_clip_norm")
    """0 turns clipping off."""
    hidden_sizes: list[int] = option(spec="model.layers", default_factory=lambda: [64, 32])
    """MLP: the hidden layers. residual_mlp: width hidden_sizes[0], one block per entry."""
    dropout: float = option(0.1, spec="model.dropout_rate")
    model_factory: str = option("", spec="model.module", later=True)
    """A factory's import path, ``package.module:build`` (ml_assets.trainer.contract), instead of a
    built-in family; family, hidden_sizes and dropout then do not apply."""
    model_params: dict = option(spec="model.params", later=True, default_factory=dict)
    """The factory's keyword arguments (its hyperparameters), or XGBoost's parameters (family xgboost,
    ml_assets.trainer.boosting)."""
    tracker_port: int = option(0, spec="model.tracker_port", weights=False)
    """family xgboost, several ranks: the port rank 0's XGBoost tracker listens on (0: any free one)."""
    model_code: dict = option(later=True, default_factory=dict)
    """The factory's code pin (ml_assets.trainer.code_pin.pin); computed when left empty."""
    model_code_path: str = option("", spec="model.code_path", weights=False)
    """A directory searched for the factory's package before the installed packages."""
    activation_checkpointing: bool = option(False, spec="training.activation_checkpointing")
    """Recompute hidden blocks in backward instead of storing activations (less memory, more time)."""
    strategy: str = option("ddp", spec="training.strategy", later=True)
    """``ddp``: every rank holds the whole model, its gradients and optimizer state (one rank: the bare
    model). ``fsdp``: FSDP2 ``fully_shard``, every rank holds 1/world of each (ml_assets.trainer.parallel)."""
    fsdp_param_dtype: str = option("fp32", spec="training.fsdp.param_dtype", later=True)
    """fsdp: the dtype parameters are all-gathered and computed in (the sharded copy the optimizer
    steps stays fp32)."""
    fsdp_reduce_dtype: str = option("fp32", spec="training.fsdp.reduce_dtype", later=True)
    """fsdp: the dtype gradients are reduce-scattered in."""
    fsdp_reshard_after_forward: bool = option(True, spec="training.fsdp.reshard_after_forward", weights=False)
    """fsdp: free each block's gathered parameters after its forward and gather them again for its
    backward (less memory, one more all-gather per block); the same weights either way."""
    precision: str = option("auto", spec="training.precision")
    """auto: bf16 autocast on CUDA with bf16 (else fp16 + GradScaler), bf16 on CPUs with native
    bf16 (AVX512-BF16 or AMX), fp32 otherwise. An impossible request falls back and says so."""
    early_stopping_patience: int = option(0, spec="training.early_stopping.patience")
    """Stop after this many epochs without a validation-loss improvement; 0 turns it off."""
    early_stopping_min_delta: float = option(0.0, spec="training.early_stopping.min_delta")
    seed: int = option(0, spec="training.seed")
    deterministic: bool = option(False, spec="training.deterministic")
    """torch.use_deterministic_algorithms: bit-for-bit repeatable runs (and resumes), on CPU and CUDA
    (where the trainer sets CUBLAS_WORKSPACE_CONFIG for cuBLAS)."""
    init_weights: DataRef | None = option(None, later=True)
    """A fine-tune: the parent model's exported weights (model.safetensors, pinned by sha256), loaded
    into the model before the first step (a resume then loads its own checkpoint over them); for
    family xgboost the parent's booster (model.ubj), which the rounds of model_params add trees to.
    The feature state is then the parent's, so every input means what it meant. None: from scratch."""
    max_steps: int = option(0)
    """Stop after this many optimizer steps in all (0: run every epoch)."""
    data_mode: str = option("memory", streaming_only=True)
    """memory: every rank reads the whole window into memory once. streaming: each rank streams
    its shard of the window's Parquet row groups each epoch through a shuffle buffer
    (ml_assets.trainer.stream); memory stays flat as the window grows. The validation rows are in
    memory either way."""
    shuffle_buffer_rows: int = option(65_536, spec="training.streaming.shuffle_buffer_rows", streaming_only=True)
    """streaming: rows a rank shuffles together; more mixes further and costs memory."""
    stream_cache_dir: str = option("", weights=False)
    """streaming: where feature files that are not local are copied (verified, named by sha256)
    before they are streamed; empty: ``ml_assets-stream-cache`` in the system's temporary directory."""

    num_workers: int = option(0, spec="training.loader.num_workers", weights=False)
    pin_memory: bool = option(False, spec="training.loader.pin_memory", weights=False)
    prefetch_factor: int = option(2, spec="training.loader.prefetch_factor", weights=False)
    threads: int = option(0, weights=False)
    """torch intra-op threads per rank; 0 leaves torch's default (OMP_NUM_THREADS)."""
    report_every_steps: int = option(50, spec="training.report_every_steps", weights=False)
    checkpoint_every_steps: int = option(0, spec="training.checkpoint.every_steps", weights=False)
    checkpoint_every_seconds: float = option(300.0, spec="training.checkpoint.every_seconds", weights=False)
    """Checkpoint every N optimizer steps and/or every M seconds (0 turns either off); epoch ends
    and preemption always checkpoint."""
    keep_last: int = option(2, spec="training.checkpoint.keep_last", weights=False)
    checkpoint_async: str = option("thread", spec="training.checkpoint.async_mode", weights=False)
    preemption_grace_seconds: float = option(20.0, spec="training.checkpoint.preemption_grace_seconds", weights=False)
    """After SIGTERM: finish the step, checkpoint, exit 75; give up checkpointing after this long."""
    orphan_grace_seconds: float = option(5.0, spec="training.checkpoint.orphan_grace_seconds", weights=False)
    """A rank whose torchrun agent died (SIGKILL, out of memory) checkpoints if it can within this
    long, then exits regardless (ml_assets.processes)."""
    lease_ttl_seconds: float = option(30.0, spec="training.checkpoint.lease_ttl_seconds", weights=False)
    """The checkpoint directory's lease (ml_assets.trainer.lease) is renewed every third of this; a
    holder that stops renewing it for this long loses it to a waiting trainer."""
    lease_wait_seconds: float = option(120.0, spec="training.checkpoint.lease_wait_seconds", weights=False)
    """How long to wait for another training of the same config to release the lease before failing
    with a message naming it."""
    owner: str = option("", weights=False)
    """Who started this training (e.g. ``Dagster run <id>``): named to a trainer that finds the lease
    held."""
    epoch_log: str = option("", weights=False)
    """A local file rank 0 appends one JSON line to after each epoch ({"epoch", "train_loss",
    "val_loss"}; a boosted model: every report_every_steps rounds, "epoch" being the round): how a
    tuning trial's pruner sees the validation loss while the trainer runs."""

    def __post_init__(self) -> None:
        problems = []

        def need(ok: bool, message: str) -> None:
            if not ok:
                problems.append(message)

        need(self.task in TASKS, f"task {self.task!r} is not one of {TASKS}")
        multiclass = self.task == "multiclass_classification"
        need(not multiclass or len(set(self.classes)) == len(self.classes) >= 3,
             f"multiclass_classification needs at least 3 distinct classes, got {self.classes}")
        need(multiclass or not self.classes, f"classes apply to multiclass_classification, not {self.task}")
        need(self.family in FAMILIES, f"family {self.family!r} is not one of {FAMILIES}")
        need(self.precision in PRECISIONS, f"precision {self.precision!r} is not one of {PRECISIONS}")
        need(self.strategy in STRATEGIES, f"strategy {self.strategy!r} is not one of {STRATEGIES}")
        need(self.fsdp_param_dtype in FSDP_PARAM_DTYPES,
             f"fsdp_param_dtype {self.fsdp_param_dtype!r} is not one of {FSDP_PARAM_DTYPES}")
        need(self.fsdp_reduce_dtype in FSDP_REDUCE_DTYPES,
             f"fsdp_reduce_dtype {self.fsdp_reduce_dtype!r} is not one of {FSDP_REDUCE_DTYPES}")
        fsdp_set = [name for name, default in (("fsdp_param_dtype", "fp32"), ("fsdp_reduce_dtype", "fp32"),
                                               ("fsdp_reshard_after_forward", True)) if getattr(self, name) != default]
        need(self.strategy == "fsdp" or not fsdp_set, f"{', '.join(fsdp_set)} apply to strategy fsdp, not {self.strategy}")
        need(self.checkpoint_async in ASYNC_MODES, f"checkpoint_async {self.checkpoint_async!r} is not one of {ASYNC_MODES}")
        need(bool(self.train_files), "train_files is empty")
        need(bool(self.val_files), "val_files is empty")
        need(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        need(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        need(self.grad_accum_steps >= 1, f"grad_accum_steps must be >= 1, got {self.grad_accum_steps}")
        need(0 < self.learning_rate < 1, f"learning_rate must be in (0, 1), got {self.learning_rate}")
        need(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        need(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        need(self.grad_clip_norm >= 0, f"grad_clip_norm must be >= 0, got {self.grad_clip_norm}")
        need(0 <= self.dropout < 1, f"dropout must be in [0, 1), got {self.dropout}")
        need(bool(self.hidden_sizes) and all(h >= 1 for h in self.hidden_sizes),
             f"hidden_sizes must be positive, got {self.hidden_sizes}")
        need(self.early_stopping_patience >= 0, f"early_stopping_patience must be >= 0, got {self.early_stopping_patience}")
        need(self.max_steps >= 0, f"max_steps must be >= 0, got {self.max_steps}")
        need(self.data_mode in DATA_MODES, f"data_mode {self.data_mode!r} is not one of {DATA_MODES}")
        need(self.shuffle_buffer_rows >= 1, f"shuffle_buffer_rows must be >= 1, got {self.shuffle_buffer_rows}")
        need(self.num_workers >= 0, f"num_workers must be >= 0, got {self.num_workers}")
        need(self.prefetch_factor >= 1, f"prefetch_factor must be >= 1, got {self.prefetch_factor}")
        need(self.threads >= 0, f"threads must be >= 0, got {self.threads}")
        need(self.report_every_steps >= 1, f"report_every_steps must be >= 1, got {self.report_every_steps}")
        need(self.checkpoint_every_steps >= 0, f"checkpoint_every_steps must be >= 0, got {self.checkpoint_every_steps}")
        need(self.checkpoint_every_seconds >= 0, f"checkpoint_every_seconds must be >= 0, got {self.checkpoint_every_seconds}")
        need(self.keep_last >= 1, f"keep_last must be >= 1, got {self.keep_last}")
        need(self.preemption_grace_seconds > 0, f"preemption_grace_seconds must be > 0, got {self.preemption_grace_seconds}")
        need(self.orphan_grace_seconds > 0, f"orphan_grace_seconds must be > 0, got {self.orphan_grace_seconds}")
        need(self.lease_ttl_seconds >= 3, f"lease_ttl_seconds must be >= 3, got {self.lease_ttl_seconds}")
        need(0 <= self.lease_wait_seconds <= MAX_LEASE_WAIT_SECONDS,
             f"lease_wait_seconds must be in [0, {MAX_LEASE_WAIT_SECONDS:g}], got {self.lease_wait_seconds}")
        need(self.init_weights is None or len(self.init_weights.sha256) == 64,
             "init_weights needs the parent weights' sha256")
        need(0 <= self.tracker_port <= 65535, f"tracker_port must be in [0, 65535], got {self.tracker_port}")
        self._check_model(problems)
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))

    def _check_model(self, problems: list[str]) -> None:
        if self.family == "xgboost":
            from ml_assets.trainer.boosting import problems as boosting_problems

            problems.extend(f"model_params.{p}" for p in boosting_problems(self.model_params, self.task))
            if self.model_factory or self.strategy != "ddp":
                problems.append("family xgboost trains no network: model_factory and strategy fsdp do not apply")
        elif self.model_factory:
            self._pin_code(problems)
        elif self.model_params or self.model_code:
            problems.append("model_params and model_code apply with model_factory")

    def _pin_code(self, problems: list[str]) -> None:
        from ml_assets.trainer.code_pin import IMPORT_PATH

        if not IMPORT_PATH.match(self.model_factory):
            problems.append(f"model_factory {self.model_factory!r} is not 'package.module:factory'")
        elif not self.model_code:
            from ml_assets.trainer.code_pin import pin

            try:  # frozen: the pin is part of what the config is, filled in once here
                object.__setattr__(self, "model_code", pin(self.model_factory, self.model_code_path))
            except ValueError as exc:
                problems.append(str(exc))
        elif not isinstance(self.model_code.get("sha256"), str):
            problems.append("model_code has no sha256")

    @property
    def n_outputs(self) -> int:
        """The model's outputs: a logit per class (multiclass), else one."""
        return len(self.classes) if self.task == "multiclass_classification" else 1

    @property
    def checkpoint_root(self) -> str:
        return (self.checkpoint_dir or f"{self.output_dir.rstrip('/')}/checkpoints").rstrip("/")

    def fingerprint(self) -> str:
        """sha256 of everything that decides the weights: data bytes, state, model, optimizer, seed.
        A file's version-store commit is lineage, not content: the same bytes reached through a
        later commit train the same weights and may resume the same checkpoints."""
        kept = {k: v for k, v in asdict(self).items() if k not in NOT_TRAINING}
        for name, default in LATER_DEFAULTS.items():
            if kept[name] == default:
                del kept[name]
        if "model_code" in kept:  # the content's digest; the file list is what it digests
            kept["model_code"] = kept["model_code"]["sha256"]
        if self.data_mode == "memory":  # and configs from before streaming keep theirs
            for key in STREAMING_ONLY:
                del kept[key]
        for key in ("train_files", "val_files"):
            kept[key] = [{k: v for k, v in ref.items() if k != "commit"} for ref in kept[key]]
        kept["feature_state"] = {k: v for k, v in kept["feature_state"].items() if k != "commit"}
        if kept.get("init_weights") is not None:  # the parent's bytes, wherever a copy of them is read
            kept["init_weights"] = kept["init_weights"]["sha256"]
        return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        data = dict(data)
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"invalid training config: unknown field(s) {unknown}")
        for key in ("train_files", "val_files"):
            data[key] = [DataRef(**ref) for ref in data.get(key, [])]
        data["feature_state"] = DataRef(**data["feature_state"])
        if data.get("init_weights") is not None:
            data["init_weights"] = DataRef(**data["init_weights"])
        return cls(**data)

    @classmethod
    def from_json(cls, path: str | Path) -> TrainConfig:
        """From a file path or an fsspec URL (multi-node pods read it from object storage)."""
        try:
            if "://" in str(path):
                import fsspec

                with fsspec.open(str(path), "r") as fh:
                    data = json.loads(fh.read())
            else:
                data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"training config {path}: {exc}") from None
        return cls.from_dict(data)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


def default_of(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


# What the fields declare, gathered: the fingerprint reads these.
NOT_TRAINING = frozenset(f.name for f in fields(TrainConfig) if not option_of(f).weights)
LATER_DEFAULTS = {f.name: default_of(f) for f in fields(TrainConfig) if option_of(f).later}
STREAMING_ONLY = tuple(f.name for f in fields(TrainConfig) if option_of(f).streaming_only)
