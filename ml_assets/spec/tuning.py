"""The spec's ``tuning`` section: the hyperparameter search and its space."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ml_assets.spec.base import PositiveInt, StrictModel

TUNABLE = ("learning_rate", "weight_decay", "batch_size", "dropout", "width", "depth", "warmup_steps",
           "grad_clip_norm", "family")
BUILT_IN_TUNABLE = frozenset({"dropout", "width", "depth", "family"})
"""What tunes a built-in family's network; a factory's hyperparameters are ``params.<name>``."""
PARAMS_PREFIX = "params."
OPTIMIZER_SPACE = {
    "learning_rate": {"low": 1e-4, "high": 3e-2, "log": True},
    "weight_decay": {"low": 1e-6, "high": 1e-2, "log": True},
    "batch_size": {"choices": [128, 256, 512]},
}
"""The default space of a model of your own: the optimizer's settings (its params are its own to declare)."""
BOOSTING_SPACE = {
    "params.max_depth": {"low": 3, "high": 10, "integer": True},
    "params.learning_rate": {"low": 0.02, "high": 0.3, "log": True},
    "params.min_child_weight": {"low": 1.0, "high": 20.0, "log": True},
    "params.subsample": {"low": 0.6, "high": 1.0},
    "params.colsample_bytree": {"low": 0.6, "high": 1.0},
}
"""The default space of a boosted model (family xgboost): XGBoost's parameters, by name."""


class RangeSpec(StrictModel):
    """One search dimension: a numeric range (``low``..``high``, ``log`` scale, ``step``) or ``choices``."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[str | int | float] | None = None
    integer: bool = Field(default=False, description=(
        "draw whole numbers (batch_size, width, depth and warmup_steps always do): for a factory's params"))

    @model_validator(mode="after")
    def _one_kind(self) -> RangeSpec:
        if self.choices is not None:
            if self.low is not None or self.high is not None or not self.choices:
                raise ValueError("give either choices (non-empty) or low/high, not both")
            return self
        if self.low is None or self.high is None or not self.low < self.high:
            raise ValueError("a range needs low < high (or give choices)")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("step and log cannot be combined")
        return self


class PrunerSpec(StrictModel):
    kind: Literal["hyperband", "successive_halving", "median", "none"] = "hyperband"
    min_resource: PositiveInt = Field(default=1, description=(
        "hyperband, successive_halving: epochs (a boosted model's pruning reports) before the first rung"))
    reduction_factor: int = Field(default=3, ge=2)
    warmup_epochs: int = Field(default=1, ge=0, description=(
        "median: epochs (a boosted model's pruning reports) before pruning starts"))


class TuningSpec(StrictModel):
    trials: PositiveInt = Field(default=20, description="the study's total; re-materializing continues to it")
    workers: PositiveInt = Field(default=1, le=64, description="parallel trial processes (several need PostgreSQL)")
    max_epochs: PositiveInt = Field(default=9, description=(
        "epochs of a trial that is never pruned, hyperband's largest resource. Family xgboost: the "
        "trial's pruning reports instead, one every num_boost_round / max_epochs rounds (rounded up; "
        "the last at its last round); a trial trains all its num_boost_round"))
    processes_per_trial: PositiveInt = Field(default=1, le=64, description="torchrun ranks of one trial")
    window_days: int | None = Field(default=None, ge=3, le=366, description="default: training.window_days")
    sampler_seed: int = 0
    startup_trials: int = Field(default=5, ge=0, description="random trials before TPE models the space")
    pruner: PrunerSpec = PrunerSpec()
    heartbeat_seconds: PositiveInt = 10
    max_retries: int = Field(default=2, ge=0, description="re-runs of a trial whose worker died")
    apply_best: bool = Field(default=True, description="training takes the best parameters when a study has them")
    space: dict[str, RangeSpec] = Field(default_factory=lambda: {  # a factory's default: OPTIMIZER_SPACE
        "learning_rate": RangeSpec(low=1e-4, high=3e-2, log=True),
        "weight_decay": RangeSpec(low=1e-6, high=1e-2, log=True),
        "batch_size": RangeSpec(choices=[128, 256, 512]),
        "width": RangeSpec(low=16, high=128, log=True),
        "depth": RangeSpec(low=1, high=3),
        "dropout": RangeSpec(low=0.0, high=0.4),
    })

    @field_validator("space")
    @classmethod
    def _known(cls, value: dict[str, RangeSpec]) -> dict[str, RangeSpec]:
        unknown = sorted(k for k in set(value) - set(TUNABLE)
                         if not (k.startswith(PARAMS_PREFIX) and k[len(PARAMS_PREFIX):].isidentifier()))
        if unknown:
            raise ValueError(f"cannot tune {unknown}; tunable: {list(TUNABLE)} and a factory's params.<name>")
        if not value:
            raise ValueError("the search space is empty")
        return value
