"""Tabular models: an MLP over standardized numerics and embedded categoricals."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    n_numeric: int
    cardinalities: list[int]
    hidden_sizes: list[int]
    dropout: float
    max_embedding_dim: int = 16

    def to_dict(self) -> dict:
        return asdict(self)


class TabularMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        dims = [min(config.max_embedding_dim, (c + 1) // 2 + 1) for c in config.cardinalities]
        self.embeddings = nn.ModuleList(nn.Embedding(c, d) for c, d in zip(config.cardinalities, dims, strict=True))
        layers: list[nn.Module] = []
        width = config.n_numeric + sum(dims)
        for hidden in config.hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(config.dropout)]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        parts = [numeric] + [emb(categorical[:, i]) for i, emb in enumerate(self.embeddings)]
        return self.mlp(torch.cat(parts, dim=1)).squeeze(1)


def build_model(config: ModelConfig | dict) -> TabularMLP:
    if isinstance(config, dict):
        config = ModelConfig(**config)
    return TabularMLP(config)
