"""The spec's search space as Optuna suggestions, and tuned values as trainer config fields."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ml_assets.spec.tuning import PARAMS_PREFIX

INTEGER = frozenset({"batch_size", "width", "depth", "warmup_steps"})
BOOSTED = "xgboost"


def integer_dims(family: str) -> frozenset[str]:
    """The dimensions a family takes only as whole numbers, beyond ``INTEGER``: a boosted model's
    integer XGBoost parameters (``params.max_depth``, ...), even where the spec left out
    ``integer: true``. Drawn as ints, the study's best values are ints too, and training applies them
    as they are (a float such as 6.4 would fail the trainer's check of ``max_depth``)."""
    if family != BOOSTED:
        return frozenset()
    from ml_assets.trainer.boosting import INTEGER as BOOSTING_INTEGER

    return frozenset(PARAMS_PREFIX + name for name in BOOSTING_INTEGER)


def suggest(trial, space: dict[str, dict[str, Any]], integer: Collection[str] = ()) -> dict[str, Any]:
    """One value per dimension (``space``: the spec's ``tuning.space`` as plain dicts); ``integer``:
    more dimensions drawn as whole numbers (``integer_dims``)."""
    params = {}
    for name, dim in sorted(space.items()):
        if dim.get("choices") is not None:
            params[name] = trial.suggest_categorical(name, list(dim["choices"]))
        elif name in INTEGER or name in integer or dim.get("integer"):
            # A float step (the spec's type) of an integer dimension: at least 1.
            step = max(1, round(dim["step"])) if dim.get("step") else 1
            params[name] = trial.suggest_int(name, int(dim["low"]), int(dim["high"]), step=step, log=dim["log"])
        else:
            params[name] = trial.suggest_float(name, dim["low"], dim["high"], step=dim.get("step"), log=dim["log"])
    return params


def config_overrides(params: dict[str, Any], hidden_sizes: list[int],
                     model_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Trainer config fields for tuned values: ``width`` and ``depth`` reshape ``hidden_sizes``
    (``depth`` layers of ``width``, or the spec's layers scaled to ``width`` when only it is tuned);
    ``params.<name>`` replaces a factory's hyperparameter in ``model_params``."""
    factory = {k[len(PARAMS_PREFIX):]: v for k, v in params.items() if k.startswith(PARAMS_PREFIX)}
    out = {k: v for k, v in params.items() if k not in ("width", "depth") and not k.startswith(PARAMS_PREFIX)}
    if factory:
        out["model_params"] = {**(model_params or {}), **factory}
    for name in ("batch_size", "warmup_steps"):
        if name in out:
            out[name] = int(out[name])
    if "width" in params or "depth" in params:
        depth = int(params.get("depth", len(hidden_sizes)))
        if "width" in params:
            out["hidden_sizes"] = [int(params["width"])] * depth
        else:
            out["hidden_sizes"] = [hidden_sizes[min(i, len(hidden_sizes) - 1)] for i in range(depth)]
    return out
