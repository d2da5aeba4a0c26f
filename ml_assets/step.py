"""One stage's run for one model and partition: its provenance, and how its failures read."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import dagster as dg

from ml_assets.code_version import package_code_version
from ml_assets.names import check_partition_key
from ml_assets.records.provenance import Provenance
from ml_assets.resources.links import DagsterLinksResource
from ml_assets.spec import ModelSpec


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


def partition_day(context: dg.AssetExecutionContext) -> dt.date:
    return check_partition_key(context.partition_key)
