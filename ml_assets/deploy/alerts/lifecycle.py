"""Lifecycle notifications: what happened to a model, not only what failed. Each event is one
message to the failure alerts' webhook, with a Slack-compatible ``text`` and the structured fields.

Events are read from the instance's records, so a notification says what the records say:
- a promotion or a rollback: a materialization of ``<model>/production_model`` whose outcome moved
  @champion (a request already in effect, outcome ``unchanged``, moved nothing and says nothing).
"""

from __future__ import annotations

import dagster as dg

from ml_assets.records import PromotionRecord

PRODUCTION_STAGE = "production_model"


def production_key(model: str) -> dg.AssetKey:
    return dg.AssetKey([model, PRODUCTION_STAGE])


def promotion_message(record: PromotionRecord, run_url: str) -> dict:
    """The message of one production_model materialization: a promotion or a rollback."""
    kind = "rollback" if record.action == "rollback" else "promotion"
    verb = "rolled back to" if kind == "rollback" else "promoted"
    text = (f"{record.model_name}: version {record.champion_version} {verb} @champion "
            f"(previous: {record.previous_version or 'none'}) by {record.actor}: {record.reason}")
    return {"kind": kind, "text": text, "model": record.model_name, "version": record.champion_version,
            "previous_version": record.previous_version, "reason": record.reason, "actor": record.actor,
            "time": record.time, "promotion_id": record.promotion_id, "run_url": run_url,
            "mlflow_model_url": record.mlflow_model_url}


def promotion_events(instance: dg.DagsterInstance, models: list[str], after: int, limit: int
                     ) -> list[tuple[int, PromotionRecord, str]]:
    """(storage id, record, run id) of each production_model materialization after ``after``, oldest first."""
    found = []
    for model in models:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=production_key(model), after_storage_id=after), limit=limit,
            ascending=True).records
        for event in records:
            found.append((event.storage_id, PromotionRecord.from_metadata(event.asset_materialization.metadata),
                          event.run_id))
    return sorted(found, key=lambda item: item[0])[:limit]


def latest_storage_id(instance: dg.DagsterInstance, models: list[str]) -> int:
    """Where a first tick starts: after every event already recorded (history is not re-sent)."""
    latest = 0
    for model in models:
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=production_key(model)),
                                                  limit=1).records
        latest = max([latest, *(r.storage_id for r in records)])
    return latest
