"""Helpers every stage builder shares: keys, partitions, upstream records, code versions."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import importlib.util
import io
import os
import warnings
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from ml_assets.names import check_partition_key
from ml_assets.settings import PACKAGE_DIR
from ml_assets.spec import ModelSpec

# The concurrency pool of steps that train (trained_checkpoint, hyperparameters): its limit is the
# number of trainings that may hold the machine's (or cluster's) GPUs at once.
GPU_POOL = "gpu"

STAGES = ("raw_data", "validated_snapshot", "features", "trained_checkpoint", "evaluation_report", "registered_model")


def asset_key(spec: ModelSpec, stage: str) -> dg.AssetKey:
    return dg.AssetKey([spec.name, stage])


def daily_partitions(spec: ModelSpec) -> dg.DailyPartitionsDefinition:
    part = spec.partitioning
    end = (part.end + dt.timedelta(days=1)).isoformat() if part.end else None  # Dagster's end is exclusive
    return dg.DailyPartitionsDefinition(start_date=part.start.isoformat(), end_date=end, timezone=part.timezone)


def features_window_mapping(start_offset: int, end_offset: int) -> dg.TimeWindowPartitionMapping:
    """Days ``start_offset..end_offset`` around a partition (0: its own day); days before the first
    partition do not exist rather than fail the mapping."""
    with warnings.catch_warnings():  # allow_nonexistent_upstream_partitions is marked beta
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.TimeWindowPartitionMapping(start_offset=start_offset, end_offset=end_offset,
                                             allow_nonexistent_upstream_partitions=True)


def partition_day(context: dg.AssetExecutionContext) -> dt.date:
    return check_partition_key(context.partition_key)


def code_version(spec: ModelSpec, sections: tuple[str, ...], *modules: str) -> str:
    """Changes when the spec sections a stage reads, or the code it runs, change.

    Modules are named, not imported: their source files are hashed, so building definitions does not
    import torch or scikit-learn.
    """
    digest = hashlib.sha256(spec.fingerprint(*sections).encode())
    for name in modules:
        found = importlib.util.find_spec(name)
        if found is None or found.origin is None:
            raise ValueError(f"code_version: no module {name!r}")
        digest.update(Path(found.origin).read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def package_code_version() -> str:
    """A hash of the ml_assets package's source: what a reproduction must run."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def dagster_run_url(run_id: str) -> str:
    base = os.environ.get("ML_ASSETS_DAGSTER_URL", "http://127.0.0.1:3000").rstrip("/")
    return f"{base}/runs/{run_id}"


def latest_record(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None) -> dict[str, Any] | None:
    """The metadata of the latest materialization of ``key`` (for ``partition``, when partitioned), or None."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1).records
    if not records or records[0].asset_materialization is None:
        return None
    return {name: value.value for name, value in records[0].asset_materialization.metadata.items()}


def upstream_metadata(context: dg.AssetExecutionContext, key: dg.AssetKey, partition: str) -> dict[str, Any]:
    """The metadata of the latest materialization of ``key`` for ``partition``.

    Downstream stages read their inputs by the ids recorded here (commit ids, URIs + sha256),
    never by "the latest file in a folder".
    """
    record = latest_record(context.instance, key, partition)
    if record is None:
        raise dg.Failure(
            description=(
                f"{key.to_user_string()} has no materialization for partition {partition}. "
                f"Materialize it first: dagster asset materialize -m ml_assets "
                f"--select '{key.to_user_string()}' --partition {partition}"
            )
        )
    return record


def parquet_bytes(frame: pl.DataFrame) -> bytes:
    out = io.BytesIO()
    frame.write_parquet(out, compression="zstd", statistics=True)
    return out.getvalue()


def read_parquet(data: bytes) -> pl.DataFrame:
    return pl.read_parquet(io.BytesIO(data))

