"""Tabular models over standardized numerics and embedded categoricals.

- ``mlp``: [numerics, embeddings] -> (Linear, ReLU, Dropout) per hidden size -> the outputs.
- ``residual_mlp``: [numerics, embeddings] -> Linear to width hidden_sizes[0] -> one pre-norm
  residual block (LayerNorm, Linear, ReLU, Dropout, Linear, + input) per hidden size -> LayerNorm
  -> the outputs.

One output, shape [n]: a logit (binary classification) or the prediction (regression); or
``n_outputs`` > 1, shape [n, n_outputs]: a logit per class (multiclass, softmax head). A model is
rebuilt from its ``ModelConfig`` alone, which is plain JSON: exported weights need no pickle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    n_numeric: int
    cardinalities: list[int]
    hidden_sizes: list[int]
    dropout: float
    family: str = "mlp"
    max_embedding_dim: int = 16
    n_outputs: int = 1  # the default is what configs exported before multiclass meant

    def to_dict(self) -> dict:
        return asdict(self)


class _Embedded(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        dims = [min(config.max_embedding_dim, (c + 1) // 2 + 1) for c in config.cardinalities]
        self.embeddings = nn.ModuleList(nn.Embedding(c, d) for c, d in zip(config.cardinalities, dims, strict=True))
        self.input_width = config.n_numeric + sum(dims)
        self.activation_checkpointing = False

    def inputs(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        parts = [numeric] + [emb(categorical[:, i]) for i, emb in enumerate(self.embeddings)]
        return torch.cat(parts, dim=1)

    def run_blocks(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        for block in blocks:
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


class TabularMLP(_Embedded):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        blocks, width = [], self.input_width
        for hidden in config.hidden_sizes:
            blocks.append(nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(config.dropout)))
            width = hidden
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, config.n_outputs)

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        # squeeze(1) drops the output axis only when it has size 1: [n], or [n, n_outputs].
        return self.head(self.run_blocks(self.inputs(numeric, categorical), self.blocks)).squeeze(1)


class ResidualBlock(nn.Module):
    def __init__(self, width: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout),
                                  nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResidualMLP(_Embedded):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        width = config.hidden_sizes[0]
        self.stem = nn.Linear(self.input_width, width)
        self.blocks = nn.ModuleList(ResidualBlock(width, 2 * width, config.dropout) for _ in config.hidden_sizes)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, config.n_outputs)

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        x = self.run_blocks(self.stem(self.inputs(numeric, categorical)), self.blocks)
        return self.head(self.norm(x)).squeeze(1)


FAMILIES = {"mlp": TabularMLP, "residual_mlp": ResidualMLP}


def build_model(config: ModelConfig | dict, activation_checkpointing: bool = False) -> _Embedded:
    if isinstance(config, dict):
        config = ModelConfig(**config)
    if config.family not in FAMILIES:
        raise ValueError(f"model family {config.family!r} is not one of {sorted(FAMILIES)}")
    model = FAMILIES[config.family](config)
    model.activation_checkpointing = activation_checkpointing
    return model


def loss_fn(task: str) -> nn.Module:
    """Summed over the batch (callers divide): binary cross-entropy on logits, cross-entropy on a
    logit per class (softmax; int64 class-index targets), or squared error."""
    if task == "binary_classification":
        return nn.BCEWithLogitsLoss(reduction="sum")
    if task == "multiclass_classification":
        return nn.CrossEntropyLoss(reduction="sum")
    return nn.MSELoss(reduction="sum")
