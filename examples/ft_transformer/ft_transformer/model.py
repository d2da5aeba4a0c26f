"""FT-Transformer for ml_assets: every feature becomes a token, a Transformer mixes them, the [CLS]
token's final state predicts.

Gorishniy, Rubachev, Khrulkov, Babenko, "Revisiting Deep Learning Models for Tabular Data"
(NeurIPS 2021, arXiv:2106.11959), section 3.3:

- Feature Tokenizer: numeric feature j -> x_j * W_j + b_j; categorical feature j -> E_j[x_j] + b_j;
  a learned [CLS] token is prepended.
- n_blocks pre-norm Transformer layers (the first without its attention LayerNorm, as in the paper):
  multi-head self-attention, then a ReGLU feed-forward of width d_ffn_factor * d_token.
- Prediction: LayerNorm -> ReLU -> Linear on the [CLS] token.

Unlike an MLP over concatenated embeddings, every pair of features interacts through attention in
every layer; the price is time and memory quadratic in the number of features.

The factory follows the ml_assets contract (ml_assets.trainer.contract): ``build(inputs, **params)``
returns a module whose ``forward(numeric, categorical)`` gives [rows, n_outputs] logits or values,
and the platform's default loss and batch layout are used unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class FeatureTokenizer(nn.Module):
    """[rows, numeric] floats and [rows, categorical] indices -> [rows, 1 + features, d_token]."""

    def __init__(self, n_numeric: int, cardinalities: list[int], d_token: int) -> None:
        super().__init__()
        self.numeric_weight = nn.Parameter(torch.empty(n_numeric, d_token))
        self.numeric_bias = nn.Parameter(torch.empty(n_numeric, d_token))
        self.embeddings = nn.ModuleList(nn.Embedding(c, d_token) for c in cardinalities)
        self.categorical_bias = nn.Parameter(torch.empty(len(cardinalities), d_token))
        self.cls = nn.Parameter(torch.empty(1, 1, d_token))
        # The paper's initialization: uniform in +-1/sqrt(d_token) for the tokenizer's parameters.
        bound = 1 / math.sqrt(d_token)
        for p in (self.numeric_weight, self.numeric_bias, self.categorical_bias, self.cls):
            nn.init.uniform_(p, -bound, bound)
        for emb in self.embeddings:
            nn.init.uniform_(emb.weight, -bound, bound)

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        tokens = [numeric.unsqueeze(-1) * self.numeric_weight + self.numeric_bias]
        if len(self.embeddings):
            embedded = torch.stack([emb(categorical[:, i]) for i, emb in enumerate(self.embeddings)], dim=1)
            tokens.append(embedded + self.categorical_bias)
        x = torch.cat(tokens, dim=1)
        return torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1)


class ReGLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return a * torch.relu(b)


class Block(nn.Module):
    """One pre-norm Transformer layer: x + Attention(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, d_token: int, n_heads: int, d_ffn: int, attention_dropout: float, ffn_dropout: float,
                 residual_dropout: float, first: bool) -> None:
        super().__init__()
        self.attention_norm = nn.Identity() if first else nn.LayerNorm(d_token)
        self.attention = nn.MultiheadAttention(d_token, n_heads, dropout=attention_dropout, batch_first=True)
        self.ffn_norm = nn.LayerNorm(d_token)
        self.ffn = nn.Sequential(nn.Linear(d_token, 2 * d_ffn), ReGLU(), nn.Dropout(ffn_dropout),
                                 nn.Linear(d_ffn, d_token))
        self.residual_dropout = nn.Dropout(residual_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        h, _ = self.attention(h, h, h, need_weights=False)
        x = x + self.residual_dropout(h)
        return x + self.residual_dropout(self.ffn(self.ffn_norm(x)))


class FTTransformer(nn.Module):
    def __init__(self, n_numeric: int, cardinalities: list[int], n_outputs: int, *, d_token: int, n_blocks: int,
                 n_heads: int, d_ffn_factor: float, attention_dropout: float, ffn_dropout: float,
                 residual_dropout: float) -> None:
        super().__init__()
        self.tokenizer = FeatureTokenizer(n_numeric, cardinalities, d_token)
        d_ffn = max(1, int(d_token * d_ffn_factor))
        self.blocks = nn.ModuleList(
            Block(d_token, n_heads, d_ffn, attention_dropout, ffn_dropout, residual_dropout, first=i == 0)
            for i in range(n_blocks))
        self.head = nn.Sequential(nn.LayerNorm(d_token), nn.ReLU(), nn.Linear(d_token, n_outputs))

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        x = self.tokenizer(numeric, categorical)
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, 0])


def build(inputs, *, d_token: int = 32, n_blocks: int = 2, n_heads: int = 4, d_ffn_factor: float = 4 / 3,
          attention_dropout: float = 0.2, ffn_dropout: float = 0.1, residual_dropout: float = 0.0) -> nn.Module:
    """The ml_assets factory: ``inputs`` is an ml_assets.trainer.contract.ModelInputs; the keyword
    arguments are the spec's ``model.params`` (defaults: the paper's, at a smaller d_token)."""
    if d_token < 1 or n_blocks < 1 or n_heads < 1:
        raise ValueError(f"d_token, n_blocks and n_heads must be positive, got {d_token}, {n_blocks}, {n_heads}")
    if d_token % n_heads:
        raise ValueError(f"d_token ({d_token}) must be a multiple of n_heads ({n_heads})")
    for name, rate in (("attention_dropout", attention_dropout), ("ffn_dropout", ffn_dropout),
                       ("residual_dropout", residual_dropout)):
        if not 0 <= rate < 1:
            raise ValueError(f"{name} must be in [0, 1), got {rate}")
    return FTTransformer(len(inputs.numeric), list(inputs.cardinalities), inputs.n_outputs, d_token=int(d_token),
                         n_blocks=int(n_blocks), n_heads=int(n_heads), d_ffn_factor=float(d_ffn_factor),
                         attention_dropout=attention_dropout, ffn_dropout=ffn_dropout,
                         residual_dropout=residual_dropout)
