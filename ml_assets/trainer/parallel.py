"""How one rank's model is spread over the ranks (``TrainConfig.strategy``).

- ``ddp``: every rank holds the whole model, its gradients and its AdamW moments;
  DistributedDataParallel all-reduces the gradients. One rank trains the bare model.
- ``fsdp``: FSDP2 ``fully_shard``. Every rank holds 1/world of each parameter (a DTensor sharded on
  dim 0), of its gradient and of its optimizer state. A block's parameters are all-gathered just
  before its forward (and again for its backward when ``fsdp_reshard_after_forward``) and its
  gradients reduce-scattered after its backward. It runs at any world size, one rank included, so
  a checkpoint holds the same kind of state whatever the number of ranks.

Which modules become their own FSDP unit (``shard_units``), for any ``nn.Module``: each element of
a direct child that is an ``nn.ModuleList``, and each other direct child, that holds parameters;
then the root takes whatever is left (its own parameters). A wrapper around one such module (a
model of your own inside ``CustomModel``) is looked through. A unit is one all-gather and one
reduce-scatter, and the largest unit bounds the transient memory of the gathered parameters, so a
model whose big modules sit deeper than its direct children (an ``encoder`` holding the layers) is
sharded just as fully but gathers more at a time. Modules that share a parameter are left to the
root, which gathers it once for the whole forward.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.runtime import Runtime

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# The trainer's only caller of the model, the loss, never changes its output in place; FSDP2 warns
# on every model whose forward ends in a view (ours: squeeze) in case a caller would.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def wrap(model: nn.Module, cfg: TrainConfig, rt: Runtime, log: Callable[[str], None]) -> nn.Module:
    """The module the training step calls: ``model`` itself (one DDP rank, or FSDP, which shards in
    place) or its DistributedDataParallel wrapper. Build the optimizer after this: FSDP replaces
    the parameters with sharded ones."""
    if cfg.strategy == "fsdp":
        return _fully_shard(model, cfg, rt, log)
    if rt.world == 1:  # one rank needs no gradient all-reduce: DDP would only add hooks and copies
        return model
    return DistributedDataParallel(model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
                                   gradient_as_bucket_view=True)


def shard_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The submodules sharded as units of their own, by the rule in the module docstring. A wrapper
    (no parameters of its own, one child that holds them all: a factory's module inside
    ml_assets.trainer.contract.CustomModel) is looked through, so its child's blocks are the units."""
    holders = [(name, child) for name, child in model.named_children() if any(True for _ in child.parameters())]
    if (len(holders) == 1 and not isinstance(holders[0][1], nn.ModuleList)
            and not any(True for _ in model.parameters(recurse=False))):
        name, inner = holders[0]
        return [(f"{name}.{sub}", unit) for sub, unit in shard_units(inner)] or [(name, inner)]
    candidates: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            candidates += [(f"{name}.{i}", block) for i, block in enumerate(child)]
        else:
            candidates.append((name, child))
    candidates = [(name, m) for name, m in candidates if any(True for _ in m.parameters())]
    owners: dict[int, int] = {}
    for _, module in candidates:
        for param in module.parameters():
            owners[id(param)] = owners.get(id(param), 0) + 1
    return [(name, m) for name, m in candidates if all(owners[id(p)] == 1 for p in m.parameters())]


def _fully_shard(model: nn.Module, cfg: TrainConfig, rt: Runtime, log: Callable[[str], None]) -> nn.Module:
    mesh = init_device_mesh(rt.device.type, (rt.world,))
    param_dtype = None if cfg.fsdp_param_dtype == "fp32" else DTYPES[cfg.fsdp_param_dtype]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=DTYPES[cfg.fsdp_reduce_dtype])
    units = shard_units(model)
    for _, unit in units:  # bottom-up: a unit's parameters are no longer the root's
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.fsdp_reshard_after_forward)
    # The root's own parameters stay gathered from its forward to its backward, which needs them
    # first (FSDP's default for a root; the built-in families keep none there).
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    log(f"fsdp: {len(units)} unit(s) sharded over {rt.world} rank(s) ({', '.join(n for n, _ in units) or 'none'}) "
        f"and the root; parameters gathered in {cfg.fsdp_param_dtype}, gradients reduced in "
        f"{cfg.fsdp_reduce_dtype}, {'re' if cfg.fsdp_reshard_after_forward else 'not re'}sharded after forward")
    return model


def sharded(net: nn.Module) -> bool:
    return isinstance(net, FSDPModule)


def accumulation(net: nn.Module, boundary: bool) -> contextlib.AbstractContextManager:
    """Where a micro-step's forward and backward run: gradients are reduced across ranks only at an
    accumulation boundary. FSDP2 has no ``no_sync``; its switch stays set until the next call."""
    if sharded(net):
        net.set_requires_gradient_sync(boundary)
        return contextlib.nullcontext()
    if boundary or not isinstance(net, DistributedDataParallel):
        return contextlib.nullcontext()
    return net.no_sync()


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights under the bare model's keys, as an export holds them. Under FSDP a
    collective: every rank must call it; rank 0 gets the weights gathered on the CPU, one parameter
    at a time, and the other ranks an empty dict."""
    if sharded(model):
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return model.state_dict()

