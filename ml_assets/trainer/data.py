"""Feature files -> tensors. Every file is verified against the sha256 its caller pinned."""

from __future__ import annotations

import io
import json

import polars as pl
import torch

from ml_assets.features.state import transform
from ml_assets.storage import read_verified as _read_verified
from ml_assets.trainer.config import DataRef


def read_verified(ref: DataRef) -> bytes:
    return _read_verified(ref.uri, ref.sha256)


def read_state(ref: DataRef) -> dict:
    return json.loads(read_verified(ref))


def read_frame(refs: list[DataRef]) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(io.BytesIO(read_verified(r))) for r in refs], how="vertical")


def to_tensors(frame: pl.DataFrame, state: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    encoded = transform(frame, state)
    if encoded.target is None:
        raise ValueError(f"feature rows lack the target column {state['target']!r}")
    return (
        torch.from_numpy(encoded.numeric),
        torch.from_numpy(encoded.categorical),
        torch.from_numpy(encoded.target),
    )
