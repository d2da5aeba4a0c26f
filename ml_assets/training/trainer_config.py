"""The trainer's config (``TrainConfig``) from a spec: a view of the spec that the config's fields
declare themselves.

Each TrainConfig field names the spec setting it reads (``option(spec="training.checkpoint.keep_last")``,
ml_assets.trainer.config), or none when the caller sets it (this run's files, owner, data mode);
each training setting the trainer never sees is marked where it is declared (``ORCHESTRATION``,
ml_assets.spec.base). A new training option is one field in the spec's section and one in
TrainConfig, naming it; ml_assets_tests/test_spec_trainer_config.py holds the two sides to it.
"""

from __future__ import annotations

import copy
from dataclasses import Field, asdict, dataclass, fields

from ml_assets.spec.model import ModelSpec
from ml_assets.spec.training import TrainingSpec
from ml_assets.trainer.config import DataRef, TrainConfig, default_of, option_of
from ml_assets.tuning.space import config_overrides

# The TrainConfig fields that read the spec, by the setting they read.
FROM_SPEC = {f.name: option_of(f).spec for f in fields(TrainConfig) if option_of(f).spec}


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
    """The trainer's config from the spec, with tuned values on top; ``data_mode``: what
    ``choose_data_mode`` chose for the window."""
    values = {f.name: spec_value(spec, f) for f in fields(TrainConfig) if option_of(f).spec}
    values.update(train_files=train_refs, val_files=val_refs, feature_state=state, output_dir=output_dir,
                  owner=owner, data_mode=data_mode)
    values.update(config_overrides(overrides or {}, spec.model.layers, spec.model.params))
    return TrainConfig(**values)


def spec_value(spec: ModelSpec, f: Field) -> object:
    """The spec setting a TrainConfig field reads (unset: the field's default), the config's own copy."""
    value: object = spec
    for name in option_of(f).spec.split("."):
        value = getattr(value, name)
    return default_of(f) if value is None else copy.deepcopy(value)
