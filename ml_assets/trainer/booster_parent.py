"""A boosted fine-tune's starting point: the parent's exported booster (``model.ubj``, pinned by
sha256), checked against the model this config trains before any round is added to it.

Continued boosting adds trees to the parent's; they only mean what the parent's meant if both read
the same inputs in the same order and kind, predict through the same objective and for the same
number of classes. What differs is named with both sides (the same on every restart: the trainer
refuses instead of crashing, and the Dagster step checks it first, ml_assets.training.preflight)."""

from __future__ import annotations

import json

from ml_assets.trainer.code_pin import ModelContractError
from ml_assets.trainer.config import DataRef


def parent_bytes(ref: DataRef) -> bytes:
    """The parent booster's bytes, verified against the sha256 the config pins."""
    from ml_assets.storage import IntegrityError, read_verified

    try:
        return read_verified(ref.uri, ref.sha256)
    except IntegrityError as exc:
        raise ModelContractError(f"the parent's booster changed since it was registered: {exc}") from None
    except OSError as exc:
        raise ModelContractError(f"the parent's booster {ref.uri} cannot be read: {exc}") from None


def describe(booster) -> dict:
    """What a booster's added trees must agree with: its inputs, objective and classes, and its rounds."""
    config = json.loads(booster.save_config())["learner"]
    return {"feature_names": list(booster.feature_names or []), "feature_types": list(booster.feature_types or []),
            "objective": config["objective"]["name"],
            "num_class": int(config["learner_model_param"].get("num_class", "0") or 0),
            "rounds": booster.num_boosted_rounds()}


def differences(parent: dict, *, feature_names: list[str], feature_types: list[str], objective: str,
                num_class: int) -> list[str]:
    """What the parent booster (``describe``) and this training disagree on, each with both sides."""
    out = []
    if parent["feature_names"] != feature_names:
        gone = [n for n in parent["feature_names"] if n not in feature_names]
        new = [n for n in feature_names if n not in parent["feature_names"]]
        out.append(f"features: the parent reads {len(parent['feature_names'])} ({parent['feature_names'][:8]}), this "
                   f"model {len(feature_names)} ({feature_names[:8]})"
                   + (f"; only the parent's: {gone[:5]}, only this model's: {new[:5]}" if gone or new else
                      "; the same names in another order"))
    elif parent["feature_types"] != feature_types:
        changed = [f"{n}: {a} vs {b}" for n, a, b in zip(feature_names, parent["feature_types"], feature_types,
                                                          strict=False) if a != b]
        out.append(f"feature types (the parent's vs this model's): {changed[:5]}")
    if parent["objective"] != objective:
        out.append(f"objective: the parent's {parent['objective']!r}, this model's {objective!r}")
    if parent["num_class"] != num_class:
        out.append(f"classes: the parent predicts {parent['num_class'] or 'one score (no classes)'}, this model "
                   f"{num_class or 'one score (no classes)'}")
    return out


def check(raw: bytes, ref: DataRef, *, feature_names: list[str], feature_types: list[str], objective: str,
          num_class: int) -> dict:
    """The parent's ``describe``; ModelContractError when it cannot start this model, saying why."""
    import xgboost

    try:
        parent = describe(xgboost.Booster(model_file=bytearray(raw)))
    except xgboost.core.XGBoostError as exc:
        raise ModelContractError(f"the parent's booster {ref.uri} is not an XGBoost model: {exc}") from None
    if problems := differences(parent, feature_names=feature_names, feature_types=feature_types,
                               objective=objective, num_class=num_class):
        raise ModelContractError(f"the parent's booster {ref.uri} cannot be boosted further by this model: "
                                 + "; ".join(problems) + "; the spec's features, target or model changed since "
                                 "the parent was trained")
    return parent
