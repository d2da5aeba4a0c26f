"""The contract between the platform and a model it did not write.

A spec's ``model.module: "package.module:build"`` names a factory. The trainer calls it with the
inputs the features produce and the spec's ``model.params``, and trains what it returns::

    from torch import nn
    from ml_assets.trainer.contract import ModelInputs

    def build(inputs: ModelInputs, *, width: int = 64) -> nn.Module:
        ...  # a module whose forward(numeric, categorical) returns one output per row (or per class)

- ``inputs.numeric``: the numeric feature names, the columns of a float32 tensor [n, len(numeric)],
  standardized by the fitted feature state.
- ``inputs.categorical`` and ``inputs.cardinalities``: the categorical feature names, the columns of
  an int64 tensor [n, len(categorical)] whose column i holds indices in [0, cardinalities[i]) (0 is
  unknown, rare or missing).
- ``inputs.task``, ``inputs.classes``, ``inputs.n_outputs``: binary classification and regression
  want one output per row ([n] or [n, 1]: a logit, or the prediction); multiclass one logit per class
  ([n, n_outputs]), in the order of ``classes``.

The hyperparameters are the factory's keyword arguments: a name it does not take, or a value it
rejects with ``TypeError``/``ValueError``, fails the training before it starts, naming
``model.params``. For hooks, name a ``ModelFactory`` instead of a function:

- ``inputs(numeric, categorical)`` turns a feature batch into the module's arguments: a tuple
  (positional) or a dict (keyword). Default: ``(numeric, categorical)``.
- ``loss(inputs)`` returns the training loss, ``fn(output, target) -> scalar``, SUMMED over the
  batch's rows (the trainer divides by the global batch, so gradient accumulation and every number
  of ranks give the same gradient). Default: binary cross-entropy on the logit, cross-entropy on
  the class logits, or squared error, by task (``default_loss``).

What the factory returns is wrapped in ``CustomModel``, whose ``forward(numeric, categorical)`` is
what the rest of the platform (DDP, FSDP, validation, evaluation, the registered pyfunc) calls; its
weights are saved under ``net.`` and rebuilt from ``meta.json``'s ``model_factory`` entry, with the
factory's code pinned by sha256 (ml_assets.trainer.code_pin). Pure PyTorch: no dagster here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ml_assets.trainer.code_pin import ModelContractError, check_import_path
from ml_assets.trainer.model import loss_fn

SAMPLE_ROWS = 4
"""Rows of the batch a factory's module is tried on before training: enough to see a batch axis."""

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class ModelInputs:
    """What a factory learns of its inputs: the feature names, the cardinalities and the task."""

    numeric: list[str]
    categorical: list[str]
    cardinalities: list[int]
    task: str
    classes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.categorical) != len(self.cardinalities):
            raise ValueError(f"{len(self.categorical)} categorical features but {len(self.cardinalities)} cardinalities")

    @property
    def n_outputs(self) -> int:
        return len(self.classes) if self.task == "multiclass_classification" else 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict, task: str, classes: list[str] | None = None) -> ModelInputs:
        """From a fitted feature state (ml_assets.features.state), in the encoded columns' order."""
        from ml_assets.features.state import cardinalities

        return cls(numeric=[s["name"] for s in state["numeric"]], categorical=[c["name"] for c in state["categorical"]],
                   cardinalities=cardinalities(state), task=task, classes=list(classes or []))


def default_loss(inputs: ModelInputs) -> Loss:
    """The built-in families' loss for the task (ml_assets.trainer.model.loss_fn), summed over the batch."""
    return loss_fn(inputs.task)


def default_inputs(numeric: torch.Tensor, categorical: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return numeric, categorical


@dataclass(frozen=True)
class ModelFactory:
    """A factory with hooks. ``build(inputs, **params) -> nn.Module`` is required; ``loss`` and
    ``inputs`` default to ``default_loss`` and ``default_inputs``."""

    build: Callable[..., nn.Module]
    loss: Callable[[ModelInputs], Loss] = default_loss
    inputs: Callable[[torch.Tensor, torch.Tensor], tuple | dict] = default_inputs


class CustomModel(nn.Module):
    """A factory's module behind the platform's call: ``forward(numeric, categorical)`` returns [n]
    (one output) or [n, n_outputs] (multiclass), whatever the module's own arguments are."""

    def __init__(self, net: nn.Module, to_inputs: Callable[[torch.Tensor, torch.Tensor], tuple | dict],
                 n_outputs: int) -> None:
        super().__init__()
        self.net = net
        self.to_inputs = to_inputs
        self.n_outputs = n_outputs

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        args = self.to_inputs(numeric, categorical)
        out = self.net(**args) if isinstance(args, Mapping) else self.net(*args)
        if self.n_outputs == 1 and isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[1] == 1:
            out = out.squeeze(1)
        return out


def load_factory(path: str, code_path: str = "", where: str = "model.module") -> ModelFactory:
    """The factory an import path names, a plain function wrapped with the default hooks. With
    ``code_path`` (a directory), it is searched before the installed packages, and stays on
    ``sys.path`` for the life of the process: a factory may import its package's other modules
    later (inside ``build``, or a hook). Two models whose code paths hold packages of one name are
    told apart by ``_import``."""
    module_name, attr = check_import_path(path, where).split(":")
    if code_path:
        if code_path in sys.path:
            sys.path.remove(code_path)
        sys.path.insert(0, code_path)
    try:
        target = getattr(_import(module_name, code_path), attr)
    except ImportError as exc:
        raise ModelContractError(f"{where}: cannot import {module_name!r} for {path!r}: {exc}"
                                 + (f" (searched {code_path} first)" if code_path else "")) from None
    except AttributeError:
        raise ModelContractError(f"{where}: module {module_name!r} has no {attr!r} (from {path!r})") from None
    except Exception as exc:  # the user's module raised while importing: say so, with its own words
        raise ModelContractError(f"{where}: importing {module_name!r} for {path!r} raised "
                                 f"{type(exc).__name__}: {exc}") from exc
    if isinstance(target, ModelFactory):
        return target
    if not callable(target):
        raise ModelContractError(f"{where}: {path!r} is a {type(target).__name__}, not a factory function "
                                 "or a ModelFactory")
    return ModelFactory(build=target)


def _import(module_name: str, code_path: str):
    """The module, from ``code_path`` when given: a copy of its package imported earlier from
    elsewhere (another version's code, in a process that loads two models) is dropped first."""
    module = importlib.import_module(module_name)
    if not code_path:
        return module
    top = module_name.split(".")[0]
    root = Path(code_path).resolve()
    if Path(getattr(module, "__file__", None) or root).resolve().is_relative_to(root):
        return module
    for name in [n for n in sys.modules if n == top or n.startswith(f"{top}.")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    return importlib.import_module(module_name)


def build_custom(factory: ModelFactory, path: str, inputs: ModelInputs, params: Mapping[str, Any]) -> CustomModel:
    """Call the factory with the spec's hyperparameters; check it returned a module."""
    try:
        net = factory.build(inputs, **dict(params))
    except (TypeError, ValueError) as exc:
        raise ModelContractError(f"model.params: the factory {path} rejected its hyperparameters "
                                 f"{dict(params)}: {exc}") from None
    if not isinstance(net, nn.Module):
        raise ModelContractError(f"model.module: the factory {path} returned a {type(net).__name__}, "
                                 "not a torch.nn.Module")
    return CustomModel(net, factory.inputs, inputs.n_outputs)


def sample_batch(inputs: ModelInputs, rows: int = SAMPLE_ROWS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch shaped as the features are: standard-normal numerics and in-range category indices."""
    generator = torch.Generator().manual_seed(seed)
    numeric = torch.randn(rows, len(inputs.numeric), generator=generator)
    categorical = torch.stack([torch.randint(0, max(c, 1), (rows,), generator=generator)
                               for c in inputs.cardinalities], dim=1) if inputs.cardinalities else \
        torch.zeros(rows, 0, dtype=torch.int64)
    return numeric, categorical


def check_outputs(model: nn.Module, path: str, inputs: ModelInputs,
                  batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Run the module on a batch (the features' shapes) in eval mode, without gradients, and check
    that it gives one output per row, or one per class."""
    numeric, categorical = batch if batch is not None else sample_batch(inputs)
    rows = len(numeric)
    was_training = model.training
    model.eval()
    try:
        # The trial draws nothing from the global generator: training's random stream stays the same.
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            out = model(numeric, categorical)
    except Exception as exc:
        raise ModelContractError(
            f"model.module: {path}'s module failed on a batch of {rows} rows (numeric {list(numeric.shape)} "
            f"float32, categorical {list(categorical.shape)} int64): {type(exc).__name__}: {exc}") from exc
    finally:
        model.train(was_training)
    want = [rows] if inputs.n_outputs == 1 else [rows, inputs.n_outputs]
    shape = list(out.shape) if isinstance(out, torch.Tensor) else None
    if shape != want:
        said = f"shape {shape}" if shape is not None else f"a {type(out).__name__}"
        raise ModelContractError(
            f"model.module: {path}'s module returned {said} for a batch of {rows} rows; {inputs.task} needs "
            f"{want}" + (" (or [rows, 1])" if inputs.n_outputs == 1 else f" (one logit per class of {inputs.classes})"))
    if not out.is_floating_point():
        raise ModelContractError(f"model.module: {path}'s module returned {out.dtype} outputs; the loss needs floats")


def make_custom(path: str, params: Mapping[str, Any], inputs: ModelInputs, code_path: str = "",
                batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[CustomModel, ModelFactory]:
    """Import, build and try the factory's module: every contract failure is raised here, before
    anything is trained or written."""
    factory = load_factory(path, code_path)
    model = build_custom(factory, path, inputs, params)
    check_outputs(model, path, inputs, batch)
    return model, factory


def factory_loss(factory: ModelFactory, path: str, inputs: ModelInputs) -> Loss:
    try:
        loss = factory.loss(inputs)
    except Exception as exc:
        raise ModelContractError(f"model.module: {path}'s loss hook raised {type(exc).__name__}: {exc}") from exc
    if not callable(loss):
        raise ModelContractError(f"model.module: {path}'s loss hook returned a {type(loss).__name__}, not a function")
    return loss
