"""Helpers every stage builder shares: keys, partitions, upstream records, code versions."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import importlib.util
import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import polars as pl

from ml_assets.names import check_partition_key
from ml_assets.records import Provenance
from ml_assets.resources.links import DagsterLinksResource
from ml_assets.settings import PACKAGE_DIR
from ml_assets.spec import ModelSpec
from ml_assets.spec.architecture import ArchitectureSpec
from ml_assets.trainer import code_pin

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


def code_version(spec: ModelSpec, sections: tuple[str, ...], *modules: str,
                 factory: ArchitectureSpec | None = None) -> str:
    """Changes when the spec sections a stage reads, or the code it runs, change.

    Modules (or whole packages) are named, not imported: their source files are hashed, so building definitions does not
    import torch or scikit-learn. With ``factory``, a model factory's package is pinned the same way
    (ml_assets.trainer.code_pin), as the trainer pins it.
    """
    digest = hashlib.sha256(spec.fingerprint(*sections).encode())
    if factory is not None and factory.module:
        digest.update(code_pin.content(factory.module, factory.code_path or "")[1].encode())
    for name in modules:
        found = importlib.util.find_spec(name)
        if found is None or found.origin is None:
            raise ValueError(f"code_version: no module {name!r}")
        # A package counts whole: splitting a module in two must not leave half of it unhashed.
        for path in (sorted(Path(found.origin).parent.rglob("*.py")) if found.submodule_search_locations
                     else [Path(found.origin)]):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def package_code_version() -> str:
    """A hash of the ml_assets package's source: what a reproduction must run."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Step:
    """One stage's run for one model and partition: its provenance, and how its failures read."""

    spec: ModelSpec
    partition: str
    run_id: str
    run_url: str

    @property
    def where(self) -> str:
        return f"model {self.spec.name}, partition {self.partition}"

    def failure(self, reason: object, retry: bool = False, **metadata: object) -> dg.Failure:
        """A failure that names the model, the partition and the reason."""
        return dg.Failure(description=f"{self.where}: {reason}", allow_retries=retry, metadata=metadata or None)

    def provenance(self) -> Provenance:
        return Provenance(dagster_run_id=self.run_id, dagster_run_url=self.run_url, partition=self.partition,
                          model=self.spec.name, code_version=package_code_version())


def step(context: dg.AssetExecutionContext, spec: ModelSpec, links: DagsterLinksResource | None = None) -> Step:
    """``links``: for a stage that records its run's provenance (a Dagster URL of the run)."""
    partition = context.partition_key if context.has_partition_key else ""
    if partition:
        check_partition_key(partition)
    return Step(spec, partition, context.run_id, links.run_url(context.run_id) if links else "")


def parquet_bytes(frame: pl.DataFrame) -> bytes:
    out = io.BytesIO()
    frame.write_parquet(out, compression="zstd", statistics=True)
    return out.getvalue()


def read_parquet(data: bytes) -> pl.DataFrame:
    return pl.read_parquet(io.BytesIO(data))

