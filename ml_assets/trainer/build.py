"""The model a training config asks for, its loss, and the meta.json entry that rebuilds it.

A built-in family (ml_assets.trainer.model) is rebuilt from ``model_config``; a factory's module
(ml_assets.trainer.contract) from ``model_factory``: its import path, hyperparameters, the inputs it
was built for and its code pin, verified against the code found before anything is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ml_assets.trainer import code_pin
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets.trainer.contract import (
    ModelInputs,
    default_loss,
    factory_loss,
    make_custom,
)
from ml_assets.trainer.model import ModelConfig, build_model


@dataclass
class Built:
    model: nn.Module
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    rebuild: dict
    """meta.json's entry that rebuilds the model: ``{"model_config": ...}`` or ``{"model_factory": ...}``."""
    name: str
    """For the log: the family, or the factory's import path."""


def build(cfg: TrainConfig, state: dict, batch: tuple[torch.Tensor, torch.Tensor]) -> Built:
    """The config's model, tried on ``batch`` (a few training rows) before anything is trained."""
    inputs = ModelInputs.from_state(state, cfg.task, cfg.classes)
    if not cfg.model_factory:
        config = ModelConfig(n_numeric=len(inputs.numeric), cardinalities=inputs.cardinalities,
                             hidden_sizes=list(cfg.hidden_sizes), dropout=cfg.dropout, family=cfg.family,
                             n_outputs=cfg.n_outputs)
        model = build_model(config, cfg.activation_checkpointing)
        return Built(model, default_loss(inputs), {"model_config": config.to_dict()}, cfg.family)
    code_pin.verify(cfg.model_code, cfg.model_code_path)
    model, factory = make_custom(cfg.model_factory, cfg.model_params, inputs, cfg.model_code_path, batch)
    entry = {"module": cfg.model_factory, "params": dict(cfg.model_params), "inputs": inputs.to_dict(),
             "code": cfg.model_code}
    return Built(model, factory_loss(factory, cfg.model_factory, inputs), {"model_factory": entry},
                 cfg.model_factory)


def load_parent(model: nn.Module, ref: DataRef) -> None:
    """A fine-tune's starting point: the parent's exported weights, verified by sha256 and loaded
    strictly (every parameter and buffer, of the same shape). ModelContractError says what does not
    fit: the same on every restart, so the trainer refuses instead of crashing."""
    from safetensors.torch import load as safetensors_load

    from ml_assets.storage import IntegrityError, read_verified

    try:
        tensors = safetensors_load(read_verified(ref.uri, ref.sha256))
    except IntegrityError as exc:
        raise code_pin.ModelContractError(f"the parent's weights changed since they were registered: {exc}") from None
    except OSError as exc:
        raise code_pin.ModelContractError(f"the parent's weights {ref.uri} cannot be read: {exc}") from None
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    shapes = [f"{k}: {tuple(tensors[k].shape)} vs {tuple(own[k].shape)}" for k in own
              if k in tensors and tensors[k].shape != own[k].shape]
    if missing or extra or shapes:
        raise code_pin.ModelContractError(
            f"the parent's weights {ref.uri} do not fit this model (fine-tune): missing {missing[:5]}, unexpected "
            f"{extra[:5]}, other shapes {shapes[:5]}; the spec's model section or the factory changed since the "
            "parent was trained")
    model.load_state_dict(tensors, strict=True)


def rebuild(meta: dict, code_path: str = "") -> nn.Module:
    """An exported model's module, untrained, from its meta.json (weights are loaded by the caller).
    A factory's code must be the pinned code: otherwise the error names the changed files."""
    if "model_factory" not in meta:
        return build_model(meta["model_config"])
    entry = meta["model_factory"]
    code_pin.verify(entry["code"], code_path)
    inputs = ModelInputs(**entry["inputs"])
    model, _ = make_custom(entry["module"], entry["params"], inputs, code_path)  # outputs checked there
    return model
