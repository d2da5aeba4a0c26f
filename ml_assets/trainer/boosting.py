"""What the platform knows of XGBoost's parameters, without importing xgboost: which are accepted and
in what range, and the objective and evaluation metric each task trains with.

    model:
      family: xgboost
      params: {max_depth: 6, learning_rate: 0.1, num_boost_round: 300, subsample: 0.8, tree_method: hist}

A spec's ``model.params`` is checked here when it loads (ml_assets.spec.architecture), and the trainer
turns the same mapping into ``xgboost.train``'s parameters (``booster_params``). Parameters outside
this list are refused rather than passed through: XGBoost itself warns about an unknown key and trains
on, and a typo would then silently train the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OBJECTIVES = {
    "binary_classification": "binary:logistic",
    "multiclass_classification": "multi:softprob",
    "regression": "reg:squarederror",
}
"""The objective each task trains with: what the evaluation scores (probabilities, or values)."""

EVAL_METRICS = {
    "binary_classification": "logloss",
    "multiclass_classification": "mlogloss",
    "regression": "rmse",
}
"""The validation loss early stopping, the best round and tuning's pruner read (the PyTorch families'
val_loss is the same quantity: BCE, cross-entropy, and the RMSE's square)."""

ROUNDS = "num_boost_round"
DEFAULT_ROUNDS = 200


@dataclass(frozen=True)
class Param:
    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    help: str = ""

    def check(self, name: str, value: object) -> str:
        """A problem with ``value`` ("" when it is fine)."""
        if self.choices:
            if value not in self.choices:
                return f"{name}: {value!r} is not one of {list(self.choices)}"
            return ""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{name}: {value!r} is not a number"
        if self.kind is int and not float(value).is_integer():
            return f"{name}: {value!r} is not a whole number"
        if not math.isfinite(value):
            return f"{name}: {value} is not a finite number"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"{name}: {value} is out of range: it must be {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None and value > self.high:
            return f"{name}: {value} is out of range: it must be <= {self.high:g}"
        return ""


PARAMS: dict[str, Param] = {
    ROUNDS: Param(int, 1, 100_000, help="boosting rounds (trees per output); early stopping may keep fewer"),
    "learning_rate": Param(float, 0, 1, low_open=True, help="shrinkage of each tree (eta)"),
    "max_depth": Param(int, 1, 64),
    "min_child_weight": Param(float, 0),
    "subsample": Param(float, 0, 1, low_open=True, help="rows sampled per tree"),
    "colsample_bytree": Param(float, 0, 1, low_open=True),
    "colsample_bylevel": Param(float, 0, 1, low_open=True),
    "colsample_bynode": Param(float, 0, 1, low_open=True),
    "reg_lambda": Param(float, 0),
    "reg_alpha": Param(float, 0),
    "gamma": Param(float, 0, help="min_split_loss"),
    "max_delta_step": Param(float, 0),
    "max_bin": Param(int, 2, 65_536, help="histogram bins per numeric feature"),
    "max_leaves": Param(int, 0, 2**31 - 1),
    "max_cat_to_onehot": Param(int, 1, 2**31 - 1),
    "max_cat_threshold": Param(int, 1, 2**31 - 1),
    "scale_pos_weight": Param(float, 0, low_open=True),
    "grow_policy": Param(str, choices=("depthwise", "lossguide")),
    "tree_method": Param(str, choices=("hist", "approx")),
    "device": Param(str, choices=("cpu", "cuda"), help="cuda: each rank trains on its own GPU"),
    "objective": Param(str, choices=tuple(OBJECTIVES.values())),
}
"""The accepted parameters (XGBoost's names); anything else in ``model.params`` is refused."""

INTEGER = frozenset(name for name, p in PARAMS.items() if p.kind is int)
SAMPLING = ("subsample", "colsample_bytree", "colsample_bylevel", "colsample_bynode")
DRAWN_HERE = ("subsample", "colsample_bytree")
"""Sampling the trainer draws itself, from (seed, round) alone (ml_assets.trainer.boost): a resumed
run draws what the first drew without any state. XGBoost draws the per-level and per-node column
samples from a generator that lives in its process, never in a saved model."""


def problems(params: dict, task: str) -> list[str]:
    """What is wrong with ``params`` for ``task``: unknown names, values out of range, an objective
    the task cannot be served by, a parameter that does not apply to it. Empty when they are fine."""
    out = []
    for name in sorted(params):
        if name not in PARAMS:
            out.append(f"{name}: XGBoost parameter {name!r} is not one the platform accepts (accepted: "
                       f"{', '.join(sorted(PARAMS))})")
            continue
        if problem := PARAMS[name].check(name, params[name]):
            out.append(problem)
    objective = params.get("objective")
    if isinstance(objective, str) and objective in OBJECTIVES.values() and objective != OBJECTIVES[task]:
        out.append(f"objective: {objective!r} cannot serve target.task {task} (it trains with "
                   f"{OBJECTIVES[task]!r}; leave objective out)")
    if "scale_pos_weight" in params and task != "binary_classification":
        out.append(f"scale_pos_weight: applies to binary_classification, not {task}")
    return out


def booster_params(params: dict, task: str, n_classes: int, *, seed: int, threads: int, device: str) -> dict:
    """``xgboost.train``'s parameters for a checked ``model.params``: the task's objective and
    metric, whole numbers where XGBoost wants them (a tuned value may come as a float), the seed, and
    the threads and device of this rank. Not among them: the rounds (the trainer loops over them) and
    ``DRAWN_HERE`` (the trainer draws those samples itself, ``Sampler``)."""
    out = {k: (int(v) if k in INTEGER else v) for k, v in params.items() if k != ROUNDS and k not in DRAWN_HERE}
    out.update(objective=OBJECTIVES[task], eval_metric=EVAL_METRICS[task], seed=seed, device=device,
               tree_method=params.get("tree_method", "hist"), validate_parameters=True)
    if n_classes:
        out["num_class"] = n_classes
    if threads:
        out["nthread"] = threads
    return out


def rounds(params: dict) -> int:
    return int(params.get(ROUNDS, DEFAULT_ROUNDS))


def samples(params: dict) -> bool:
    """Whether XGBoost itself draws random columns per level or node (whose random state no saved
    model holds); the rows and each tree's columns are drawn by the trainer (``DRAWN_HERE``)."""
    return any(float(params.get(name, 1.0)) < 1.0 for name in SAMPLING if name not in DRAWN_HERE)
