"""The trainer's config from the spec: every TrainConfig field names the spec setting it reads or
none, every training setting is read by one field or marked ORCHESTRATION where it is declared, and
the config is the one the hand-written copy of ~30 fields used to give."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import BaseModel

from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import ModelSpec, TrainingSpec, load_spec
from ml_assets.spec.architecture import ArchitectureSpec
from ml_assets.spec.base import ORCHESTRATION
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets.training.trainer_config import FROM_SPEC, train_config
from ml_assets.tuning.space import config_overrides
from ml_assets_tests.helpers import spec_data

TRAIN = [DataRef(uri=f"file:///features/date=2013-01-0{d}/part.parquet", sha256=f"{d}" * 64, day=f"2013-01-0{d}")
         for d in (1, 2)]
VAL = [DataRef(uri="file:///features/date=2013-01-03/part.parquet", sha256="3" * 64, day="2013-01-03", commit="c0ffee")]
STATE = DataRef(uri="file:///state/feature_state.json", sha256="f" * 64)
# Every setting that reaches the trainer, away from its default: a setting read into the wrong field shows.
EVERY_MODEL_SETTING_CHANGED = {"family": "residual_mlp", "hidden_sizes": [16, 8, 4], "dropout": 0.2}
EVERY_SETTING_CHANGED = {
    "epochs": 3, "batch_size": 64, "grad_accum_steps": 2, "learning_rate": 0.01,
    "weight_decay": 0.001, "warmup_steps": 5, "min_lr_ratio": 0.1, "grad_clip_norm": 0.5,
    "activation_checkpointing": True, "precision": "bf16", "deterministic": True, "seed": 7,
    "report_every_steps": 10, "early_stopping": {"patience": 2, "min_delta": 0.01},
    "checkpoint": {"every_steps": 100, "every_seconds": 60, "keep_last": 3, "async": "process",
                   "preemption_grace_seconds": 30, "orphan_grace_seconds": 10, "lease_ttl_seconds": 60,
                   "lease_wait_seconds": 200},
    "loader": {"num_workers": 2, "pin_memory": True, "prefetch_factor": 4},
    "strategy": "fsdp", "fsdp": {"param_dtype": "bf16", "reduce_dtype": "bf16", "reshard_after_forward": False},
    "data": "streaming", "streaming": {"shuffle_buffer_rows": 1000, "auto_above_mb": 10},
}
OVERRIDES = [
    None,
    {},
    {"learning_rate": 0.02, "weight_decay": 1e-5, "batch_size": 512.0, "warmup_steps": 10.0, "dropout": 0.3,
     "grad_clip_norm": 2.0, "family": "residual_mlp", "width": 48.0, "depth": 2},
    {"depth": 3},
    {"width": 100},
]


# The TrainConfig fields no spec setting gives: this run's files and who runs it, and what a caller
# sets itself or leaves to the trainer's default.
SET_BY_THE_CALLER = {"train_files", "val_files", "feature_state", "output_dir", "owner", "data_mode",
                     "checkpoint_dir", "max_steps", "threads", "epoch_log", "stream_cache_dir", "model_code",
                     "init_weights"}
FROM_TRAINING = {name: path.removeprefix("training.") for name, path in FROM_SPEC.items()
                 if path.startswith("training.")}


def _settings(section: type[BaseModel], prefix: str = "", marked: bool = False) -> set[str]:
    """The section's leaf settings as dotted paths: those the trainer may read, or (``marked``) those
    marked ORCHESTRATION (a marked subsection counts whole)."""
    paths = set()
    for name, info in section.model_fields.items():
        path = prefix + name
        if ORCHESTRATION in info.metadata:
            if marked:
                paths.add(path)
            continue
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            paths |= _settings(info.annotation, f"{path}.", marked)
        elif not marked:
            paths.add(path)
    return paths


def _is_setting(path: str) -> bool:
    section: type[BaseModel] | None = TrainingSpec
    for name in path.split("."):
        if section is None or name not in section.model_fields:
            return False
        annotation = section.model_fields[name].annotation
        section = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return True


def _hand_copied(spec: ModelSpec, train_refs: list[DataRef], val_refs: list[DataRef], state: DataRef,
                 output_dir: str, overrides: dict | None = None, owner: str = "") -> TrainConfig:
    """The field-by-field copy train_config replaces (ml_assets/training/assets.py), as the reference."""
    training = spec.training
    values = dict(
        model=spec.name, task=spec.target.task, classes=list(spec.target.classes or []),
        train_files=train_refs, val_files=val_refs,
        feature_state=state, output_dir=output_dir,
        family=spec.model.family_name, epochs=training.epochs, batch_size=training.batch_size,
        grad_accum_steps=training.grad_accum_steps, learning_rate=training.learning_rate,
        weight_decay=training.weight_decay, warmup_steps=training.warmup_steps, min_lr_ratio=training.min_lr_ratio,
        grad_clip_norm=training.grad_clip_norm, hidden_sizes=spec.model.layers, dropout=spec.model.dropout_rate,
        model_factory=spec.model.module or "", model_params=dict(spec.model.params),
        model_code_path=spec.model.code_path or "",
        activation_checkpointing=training.activation_checkpointing, precision=training.precision,
        early_stopping_patience=training.early_stopping.patience,
        early_stopping_min_delta=training.early_stopping.min_delta, seed=training.seed,
        deterministic=training.deterministic, num_workers=training.loader.num_workers,
        pin_memory=training.loader.pin_memory, prefetch_factor=training.loader.prefetch_factor,
        report_every_steps=training.report_every_steps, checkpoint_every_steps=training.checkpoint.every_steps,
        checkpoint_every_seconds=training.checkpoint.every_seconds, keep_last=training.checkpoint.keep_last,
        checkpoint_async=training.checkpoint.async_mode,
        preemption_grace_seconds=training.checkpoint.preemption_grace_seconds,
        orphan_grace_seconds=training.checkpoint.orphan_grace_seconds,
        lease_ttl_seconds=training.checkpoint.lease_ttl_seconds,
        lease_wait_seconds=training.checkpoint.lease_wait_seconds, owner=owner,
        strategy=training.strategy, fsdp_param_dtype=training.fsdp.param_dtype,
        fsdp_reduce_dtype=training.fsdp.reduce_dtype, fsdp_reshard_after_forward=training.fsdp.reshard_after_forward,
        shuffle_buffer_rows=training.streaming.shuffle_buffer_rows,
    )
    values.update(config_overrides(overrides or {}, spec.model.layers, spec.model.params))
    return TrainConfig(**values)


def _every_setting_changed() -> ModelSpec:
    data = spec_data()
    data["training"] = {**data.get("training", {}), **EVERY_SETTING_CHANGED}
    data["model"] = EVERY_MODEL_SETTING_CHANGED
    return ModelSpec.model_validate(data)


SPECS = {path.stem: lambda path=path: load_spec(path) for path in sorted(BUNDLED_MODELS_DIR.glob("*.yaml"))}
SPECS["every_setting_changed"] = _every_setting_changed


def test_every_trainer_field_reads_one_spec_setting_or_is_set_by_the_caller():
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert names - set(FROM_SPEC) == SET_BY_THE_CALLER
    unknown = {field: path for field, path in FROM_TRAINING.items() if not _is_setting(path)}
    assert not unknown, f"TrainConfig fields naming no training setting: {unknown}"
    assert len(set(FROM_SPEC.values())) == len(FROM_SPEC), "two TrainConfig fields read one setting"
    others = {field: path for field, path in FROM_SPEC.items() if not path.startswith("training.")}
    assert {f for f, p in others.items() if p.startswith("model.")} == {
        "family", "hidden_sizes", "dropout", "model_factory", "model_params", "model_code_path", "tracker_port"}
    for path in others.values():
        section, _, setting = path.rpartition(".")
        owner = {"model": ArchitectureSpec, "target": ModelSpec.model_fields["target"].annotation, "": ModelSpec}[section]
        assert setting in owner.model_fields or isinstance(getattr(owner, setting, None), property), path


def test_every_training_setting_reaches_the_trainer_or_is_marked_orchestration():
    unread = _settings(TrainingSpec) - set(FROM_TRAINING.values())
    assert not unread, (f"training settings {sorted(unread)} reach no TrainConfig field: add the field "
                        "(option(spec=...)), or mark the setting ORCHESTRATION where it is declared")
    marked = _settings(TrainingSpec, marked=True)
    assert marked >= {"window_days", "data", "pod", "streaming.auto_above_mb"}
    assert not {p for p in FROM_TRAINING.values() if any(p == m or p.startswith(m + ".") for m in marked)}


@pytest.mark.parametrize("overrides", OVERRIDES)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_config_is_the_hand_copied_one(name: str, overrides: dict | None):
    spec = SPECS[name]()
    if spec.model.boosted and overrides:
        pytest.skip("a tuned network's values (family, width, ...) are refused for gradient-boosted trees")
    args = (spec, TRAIN, VAL, STATE, "s3://checkpoints/flights_delay/date=2013-01-05/run", overrides)

    config = train_config(*args, owner="Dagster run 1234")

    assert config == _hand_copied(*args, owner="Dagster run 1234")
    assert config.fingerprint() == _hand_copied(*args).fingerprint()
    assert config.hidden_sizes is not spec.model.hidden_sizes


def test_each_setting_lands_in_its_own_field():
    config = train_config(_every_setting_changed(), TRAIN, VAL, STATE, "/tmp/out")
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(TrainConfig)}
    assert [f for f in FROM_TRAINING if getattr(config, f) == defaults[f]] == []
    assert len(FROM_TRAINING) >= 30
    assert (config.family, config.hidden_sizes, config.dropout) == ("residual_mlp", [16, 8, 4], 0.2)
    assert (config.checkpoint_async, config.keep_last, config.prefetch_factor) == ("process", 3, 4)
