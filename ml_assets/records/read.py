"""Reading a stage's record from the Dagster instance: the one typed way upstream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import dagster as dg

from ml_assets.records.base import Record

R = TypeVar("R", bound=Record)


def latest_event(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None
                 ) -> dg.EventLogRecord | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1).records
    if not records or records[0].asset_materialization is None:
        return None
    return records[0]


def latest(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None, record: type[R]) -> R | None:
    """The record of the latest materialization of ``key`` (for ``partition`` when partitioned), or None."""
    event = latest_event(instance, key, partition)
    if event is None:
        return None
    return record.from_metadata(event.asset_materialization.metadata)


def instance_hint(instance: dg.DagsterInstance) -> str:
    """Why earlier runs may be missing: a temporary instance keeps nothing from one command to the next."""
    if not instance.is_ephemeral:
        return ""
    return (" This run's Dagster instance is temporary (DAGSTER_HOME is not set, so `dg launch` and `dagster "
            "asset materialize` keep no runs between commands): set DAGSTER_HOME to a folder and run the "
            "earlier stages again (docs/components.md).")


def upstream(context: dg.AssetExecutionContext, key: dg.AssetKey, partition: str, record: type[R]) -> R:
    """The record of the latest materialization of ``key`` for ``partition``; a Failure saying how to
    make it when there is none. Downstream stages read their inputs by the ids recorded there
    (commit ids, URIs + sha256), never by "the latest file in a folder"."""
    found = latest(context.instance, key, partition, record)
    if found is None:
        name = key.to_user_string()
        raise dg.Failure(description=(
            f"{name} has no materialization for partition {partition}. Materialize it first: "
            f"dg launch --assets '{name}' --partition {partition}" + instance_hint(context.instance)))
    return found


def every_event(instance: dg.DagsterInstance, key: dg.AssetKey, after_timestamp: float | None = None,
                page: int = 500) -> Iterator[dg.EventLogRecord]:
    """Every materialization of ``key``, newest first (those after ``after_timestamp`` when given),
    read a page at a time."""
    cursor = None
    while True:
        found = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, after_timestamp=after_timestamp), limit=page, cursor=cursor)
        yield from (r for r in found.records if r.asset_materialization is not None)
        if not found.has_more:
            return
        cursor = found.cursor
