"""The spec's ``model`` section: a built-in family, or a factory of the team's own by import path.

    model: {family: mlp, hidden_sizes: [64, 32], dropout: 0.1}          # built in

    model:                                                             # gradient-boosted trees
      family: xgboost
      params: {max_depth: 6, learning_rate: 0.1, num_boost_round: 300}   # XGBoost's (ml_assets.trainer.boosting)

    model:                                                             # your own (docs/models.md)
      module: "ft_transformer.model:build"
      code_path: .            # searched first, relative to the spec file; unset: an installed package
      params: {d_token: 32, n_blocks: 2}

Specs written before this section set ``family``, ``hidden_sizes`` and ``dropout`` under
``training``; they still load, as if written here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ml_assets.spec.base import PositiveInt, StrictModel
from ml_assets.trainer.code_pin import IMPORT_PATH

BUILT_IN = ("family", "hidden_sizes", "dropout")
"""The built-in families' settings, which older specs put under ``training``."""


class ArchitectureSpec(StrictModel):
    family: Literal["mlp", "residual_mlp", "xgboost"] | None = Field(default=None, description=(
        "a built-in family: mlp (embeddings + MLP), residual_mlp (embeddings + pre-norm residual blocks), or "
        "xgboost (gradient-boosted trees: params are XGBoost's); mlp when module is unset"))
    hidden_sizes: list[PositiveInt] | None = Field(default=None, min_length=1, description=(
        "built-in families: the hidden layers (residual_mlp: width hidden_sizes[0], one block per entry); "
        "default [64, 32]"))
    dropout: float | None = Field(default=None, ge=0, lt=1, description="built-in families; default 0.1")
    module: str | None = Field(default=None, description=(
        "'package.module:factory': a function (inputs: ModelInputs, **params) -> torch.nn.Module, or a "
        "ModelFactory with hooks (ml_assets.trainer.contract)"))
    params: dict[str, Any] = Field(default_factory=dict, description=(
        "the factory's keyword arguments (its hyperparameters), validated by the factory; with family xgboost, "
        "XGBoost's parameters (max_depth, learning_rate, num_boost_round, subsample, ...), checked at load"))
    tracker_port: int = Field(default=0, ge=0, le=65535, description=(
        "family xgboost on several ranks: the port rank 0's XGBoost tracker listens on (0: any free port)"))
    code_path: str | None = Field(default=None, description=(
        "a directory searched for the factory's package before the installed ones, relative to the spec "
        "file; its code is pinned by sha256 and travels with the registered model"))

    @field_validator("module")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        if value is not None and not IMPORT_PATH.match(value):
            raise ValueError(f"{value!r} is not 'package.module:factory' (dotted Python names, a colon, a name)")
        return value

    @field_validator("params")
    @classmethod
    def _plain(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, item in value.items():
            if not name.isidentifier():
                raise ValueError(f"{name!r} is not a keyword argument name")
            _check_plain(item, name)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> ArchitectureSpec:
        if self.boosted:
            given = [name for name in ("hidden_sizes", "dropout", "module", "code_path") if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{given} apply to networks, not to family xgboost (its settings are params)")
            return self
        if self.tracker_port:
            raise ValueError("tracker_port applies to family xgboost")
        if self.module is None:
            if self.params or self.code_path is not None:
                raise ValueError("params and code_path apply to a factory (set module) or to family xgboost")
            return self
        given = [name for name in BUILT_IN if getattr(self, name) is not None]
        if given:
            raise ValueError(f"{given} apply to the built-in families, not to the factory {self.module!r}")
        return self

    @property
    def custom(self) -> bool:
        return self.module is not None

    @property
    def boosted(self) -> bool:
        """Gradient-boosted trees (family xgboost), not a network."""
        return self.family == "xgboost"

    @property
    def family_name(self) -> str:
        return self.family or "mlp"

    @property
    def layers(self) -> list[int]:
        return list(self.hidden_sizes or [64, 32])

    @property
    def dropout_rate(self) -> float:
        return 0.1 if self.dropout is None else self.dropout


def _check_plain(value: object, where: str) -> None:
    """Hyperparameters are plain JSON (they go into the config's fingerprint and the model's meta.json)."""
    if isinstance(value, bool | int | str) or value is None:
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not a finite number")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: key {key!r} is not a string")
            _check_plain(item, f"{where}.{key}")
        return
    raise ValueError(f"{where}: a {type(value).__name__} is not a plain JSON value")


def move_legacy(data: object) -> object:
    """A spec's mapping with ``training.family``/``hidden_sizes``/``dropout`` moved to ``model``."""
    if not isinstance(data, dict) or not isinstance(data.get("training"), dict):
        return data
    legacy = {k: data["training"][k] for k in BUILT_IN if k in data["training"]}
    if not legacy:
        return data
    if "model" in data:
        raise ValueError(f"training: {sorted(legacy)} belong in the model section, which this spec also has; "
                         "move them there")
    training = {k: v for k, v in data["training"].items() if k not in BUILT_IN}
    return {**data, "training": training, "model": legacy}


def factory_default_space(data: object) -> object:
    """A factory's spec without a tuning space searches the optimizer's settings (the built-in
    families' default space tunes their own layers, which a factory does not have); a boosted
    model's searches XGBoost's usual parameters."""
    from ml_assets.spec.tuning import BOOSTING_SPACE, OPTIMIZER_SPACE

    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return data
    if data["model"].get("family") == "xgboost":
        space = BOOSTING_SPACE
    elif data["model"].get("module"):
        space = OPTIMIZER_SPACE
    else:
        return data
    tuning = data.get("tuning")
    if tuning is None:
        tuning = {}
    if not isinstance(tuning, dict) or "space" in tuning:
        return data
    return {**data, "tuning": {**tuning, "space": space}}


def resolve_code_path(data: object, spec_file: Path) -> object:
    """``model.code_path`` made absolute against the spec file's directory (its message names the field)."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return data
    code_path = data["model"].get("code_path")
    if not isinstance(code_path, str):
        return data
    resolved = (spec_file.parent / code_path).resolve()
    if not resolved.is_dir():
        raise ValueError(f"model.code_path: {code_path!r} is not a directory (resolved against the spec file: "
                         f"{resolved})")
    return {**data, "model": {**data["model"], "code_path": str(resolved)}}
