"""The trainer's config (``TrainConfig``) from a spec: each of its fields has one declared source.

A TrainConfig field is either the training setting of the same name, a nested training setting
named in ``NESTED``, a model setting named in ``FROM_MODEL``, or one of ``FROM_ELSEWHERE``; a
training setting either reaches the trainer or is one of ``NOT_FOR_TRAINER``. ml_assets_tests/test_spec_trainer_config.py holds both sides to it.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields

from ml_assets.spec.model import ModelSpec
from ml_assets.spec.training import TrainingSpec
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets.tuning.space import config_overrides

# TrainConfig fields that do not come from the training section: the spec's name and target, this
# run's files, owner and data mode (train_config's arguments; the mode is training.data resolved
# against the window's size, ``choose_data_mode``), and what a caller sets itself or leaves to the
# trainer's default (checkpoint_dir is keyed by the config's fingerprint, epoch_log is a trial's).
FROM_ELSEWHERE = frozenset({
    "model", "task", "classes",
    "train_files", "val_files", "feature_state", "output_dir", "owner", "data_mode",
    "checkpoint_dir", "max_steps", "threads", "epoch_log", "stream_cache_dir",
    "model_code",  # the factory's code pin, taken when the config is made
})
# TrainConfig fields the model section gives (ml_assets.spec.architecture; model_settings).
FROM_MODEL = frozenset({"family", "hidden_sizes", "dropout", "model_factory", "model_params", "model_code_path"})
# TrainConfig field -> its training setting in a subsection (``training.<path>``).
NESTED = {
    "early_stopping_patience": "early_stopping.patience",
    "early_stopping_min_delta": "early_stopping.min_delta",
    "checkpoint_every_steps": "checkpoint.every_steps",
    "checkpoint_every_seconds": "checkpoint.every_seconds",
    "keep_last": "checkpoint.keep_last",
    "checkpoint_async": "checkpoint.async_mode",
    "preemption_grace_seconds": "checkpoint.preemption_grace_seconds",
    "orphan_grace_seconds": "checkpoint.orphan_grace_seconds",
    "lease_ttl_seconds": "checkpoint.lease_ttl_seconds",
    "lease_wait_seconds": "checkpoint.lease_wait_seconds",
    "num_workers": "loader.num_workers",
    "pin_memory": "loader.pin_memory",
    "prefetch_factor": "loader.prefetch_factor",
    "fsdp_param_dtype": "fsdp.param_dtype",
    "fsdp_reduce_dtype": "fsdp.reduce_dtype",
    "fsdp_reshard_after_forward": "fsdp.reshard_after_forward",
    "shuffle_buffer_rows": "streaming.shuffle_buffer_rows",
}
# Training settings the trainer never sees: they choose the days it trains on, or how and where
# Dagster launches, retries and places it (a whole subsection, such as pod, by its name), or how it
# reads them (data and its threshold become the config's data_mode).
NOT_FOR_TRAINER = frozenset({
    "window_days", "validation_days", "min_validation_rows", "missing_days", "max_missing_days",
    "processes_per_node", "nodes", "gpus_per_node", "pod", "max_restarts", "retries", "max_runtime_minutes",
    "data", "streaming.auto_above_mb",
})
# Every TrainConfig field read from the training section -> where it is read there.
FROM_TRAINING = {f.name: NESTED.get(f.name, f.name) for f in fields(TrainConfig)
                 if f.name not in FROM_ELSEWHERE and f.name not in FROM_MODEL}


@dataclass(frozen=True)
class DataChoice:
    """How the trainer reads a window, and why (recorded with the trained checkpoint)."""

    mode: str
    """memory or streaming: the config's data_mode."""
    asked: str
    """The spec's training.data: memory, streaming or auto."""
    window_bytes: int
    reason: str

    def as_metadata(self) -> dict:
        return asdict(self)


def choose_data_mode(training: TrainingSpec, window_bytes: int) -> DataChoice:
    """training.data for a window whose feature files hold ``window_bytes``: auto streams above
    training.streaming.auto_above_mb."""
    mb, limit = window_bytes / 1e6, training.streaming.auto_above_mb
    if training.data != "auto":
        return DataChoice(training.data, training.data, window_bytes, f"training.data is {training.data}")
    mode = "streaming" if mb > limit else "memory"
    side = "more than" if mode == "streaming" else "at most"
    return DataChoice(mode, "auto", window_bytes, f"training.data is auto and the window's feature files hold "
                                                  f"{mb:,.1f} MB, {side} training.streaming.auto_above_mb ({limit:g})")


def train_config(spec: ModelSpec, train_refs: list[DataRef], val_refs: list[DataRef], state: DataRef,
                 output_dir: str, overrides: dict | None = None, owner: str = "",
                 data_mode: str = "memory") -> TrainConfig:
    """The trainer's config from the spec's training section, with tuned values on top;
    ``data_mode``: what ``choose_data_mode`` chose for the window."""
    values = {name: training_setting(spec.training, path) for name, path in FROM_TRAINING.items()}
    values.update(model_settings(spec))
    values.update(model=spec.name, task=spec.target.task, classes=list(spec.target.classes or []),
                  train_files=train_refs, val_files=val_refs, feature_state=state, output_dir=output_dir,
                  owner=owner, data_mode=data_mode)
    values.update(config_overrides(overrides or {}, spec.model.layers, spec.model.params))
    return TrainConfig(**values)


def model_settings(spec: ModelSpec) -> dict:
    """The TrainConfig fields the model section gives (FROM_MODEL names them)."""
    model = spec.model
    values = {"family": model.family_name, "hidden_sizes": model.layers, "dropout": model.dropout_rate,
              "model_factory": model.module or "", "model_params": copy.deepcopy(model.params),
              "model_code_path": model.code_path or ""}
    return values


def training_setting(training: TrainingSpec, path: str) -> object:
    """``training.<path>``, e.g. ``checkpoint.keep_last``; a list is copied (the config's own, not the spec's)."""
    value: object = training
    for name in path.split("."):
        value = getattr(value, name)
    return copy.copy(value)
