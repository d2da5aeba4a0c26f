"""A table as Parquet bytes and back: how stages store a day's rows in the version store."""

from __future__ import annotations

import io

import polars as pl


def parquet_bytes(frame: pl.DataFrame) -> bytes:
    out = io.BytesIO()
    frame.write_parquet(out, compression="zstd", statistics=True)
    return out.getvalue()


def read_parquet(data: bytes) -> pl.DataFrame:
    return pl.read_parquet(io.BytesIO(data))
