"""Fitted feature state and the one ``transform`` used by training, evaluation and batch inference.

The state is plain JSON (means, standard deviations, vocabularies), fitted on the training window
only, stored beside the checkpoint and inside the registered model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import polars as pl

STATE_VERSION = 1
OOV = 0  # index 0 of every vocabulary: unknown or missing category


@dataclass(frozen=True)
class Encoded:
    numeric: np.ndarray  # float32 [n, len(numeric)]
    categorical: np.ndarray  # int64 [n, len(categorical)]
    target: np.ndarray | None  # float32 [n]


def fit_state(frame: pl.DataFrame, numeric: list[str], categorical: list[str], target: str, task: str) -> dict:
    if frame.height == 0:
        raise ValueError("cannot fit feature state on an empty training window")
    # Lists, not mappings: the column order is the model's input order and must survive JSON.
    stats = []
    for col in numeric:
        values = frame[col].drop_nulls()
        mean = float(values.mean()) if len(values) else 0.0
        std = float(values.std()) if len(values) > 1 else 1.0
        stats.append({"name": col, "mean": mean, "std": std if std and np.isfinite(std) and std > 1e-12 else 1.0})
    vocab = [{"name": col, "vocabulary": sorted(frame[col].drop_nulls().unique().to_list())} for col in categorical]
    return {
        "version": STATE_VERSION,
        "task": task,
        "target": target,
        "numeric": stats,
        "categorical": vocab,
        "rows_fitted": frame.height,
    }


def state_bytes(state: dict) -> bytes:
    return json.dumps(state, sort_keys=True, indent=1).encode()



def transform(frame: pl.DataFrame, state: dict) -> Encoded:
    """Raw feature columns -> model inputs. Missing numerics become the training mean."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"feature state version {state.get('version')!r} is not {STATE_VERSION}")
    numeric, categorical = state["numeric"], state["categorical"]
    missing = [c["name"] for c in [*numeric, *categorical] if c["name"] not in frame.columns]
    if missing:
        raise ValueError(f"rows lack the feature columns {missing}")
    num = frame.select(
        ((pl.col(s["name"]).cast(pl.Float64) - s["mean"]) / s["std"]).fill_null(0.0).fill_nan(0.0)
        for s in numeric
    )
    cat = frame.select(
        pl.col(c["name"]).cast(pl.String).replace_strict(
            c["vocabulary"], list(range(1, len(c["vocabulary"]) + 1)), default=OOV, return_dtype=pl.Int64)
        for c in categorical
    )
    target = state["target"]
    y = frame[target].cast(pl.Float32).to_numpy(writable=True) if target in frame.columns else None
    return Encoded(
        numeric=num.to_numpy().astype(np.float32).reshape(frame.height, len(numeric)),
        categorical=cat.to_numpy().astype(np.int64).reshape(frame.height, len(categorical)),
        target=y,
    )


def cardinalities(state: dict) -> list[int]:
    """Embedding table sizes: the vocabulary plus the out-of-vocabulary index."""
    return [len(c["vocabulary"]) + 1 for c in state["categorical"]]
