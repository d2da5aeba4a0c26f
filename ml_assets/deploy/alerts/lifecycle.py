"""Lifecycle notifications: what happened to a model, not only what failed. Each event is one
message to the failure alerts' webhook, with a Slack-compatible ``text`` and the structured fields.

Events are read from the instance's records, so a notification says what the records say:
- a promotion or a rollback: a materialization of ``<model>/production_model`` whose outcome moved
  @champion (a request already in effect, outcome ``unchanged``, moved nothing and says nothing);
- a blocking limit crossed: a materialization of ``<model>/model_monitor`` with status ``blocked``;
- a candidate refused by the promotion gate: a materialization of ``<model>/evaluation_report`` whose
  gate did not pass (information: the run succeeded, and the failure alerts say nothing of it);
- a retraining launched on evidence: a run of ``<model>_daily`` tagged ``ml_assets/retrain:
  degradation`` (ml_assets/scoring/retrain.py), with the reason it carries.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from ml_assets.evaluation.record import EvaluationRecord
from ml_assets.pipeline.graph import Stage, daily_job_name, stage_key
from ml_assets.promotion.record import PromotionRecord
from ml_assets.records.runs import RETRAIN_TAG, RetrainTags, RunLabels
from ml_assets.scoring.record import MonitorRecord


def keys(models: list[str]) -> list[dg.AssetKey]:
    return [stage_key(model, stage) for model in models
            for stage in (Stage.PRODUCTION_MODEL, Stage.MODEL_MONITOR, Stage.EVALUATION_REPORT)]


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


def refusal_message(record: EvaluationRecord, model: str, partition: str, run_url: str) -> dict:
    primary = record.primary_metric
    text = (f"{model}: the candidate of {partition} was refused (champion "
            f"{'v' + record.champion_version if record.champion_version else 'none'}): {record.gate_reason}")
    return {"kind": "refused", "severity": "info", "text": text, "model": model, "partition": partition,
            "metric": primary, "value": record.metrics.get(primary), "champion_version": record.champion_version,
            "reason": record.gate_reason, "checkpoint_sha256": record.checkpoint_sha256, "run_url": run_url}


def monitor_message(record: MonitorRecord, run_url: str) -> dict:
    crossed = [f["text"] for f in record.findings if f["level"] == "blocked"]
    text = (f"{record.model_name}: version {record.model_version} crossed a blocking monitoring limit on "
            f"{record.day}: {'; '.join(crossed)}")
    return {"kind": "monitor_blocked", "text": text, "model": record.model_name, "version": record.model_version,
            "day": record.day, "findings": record.findings, "run_url": run_url}


def retraining_message(run: dg.DagsterRun, run_url: str) -> dict:
    labels, retrain = RunLabels.from_tags(run.tags, run.job_name.removesuffix(daily_job_name(""))), RetrainTags.from_tags(run.tags)
    why = retrain.reason if retrain else ""
    return {"kind": "retraining", "text": f"{labels.model}: retraining partition {labels.partition} launched: {why}",
            "model": labels.model, "partition": labels.partition, "reason": why, "run_id": run.run_id,
            "run_url": run_url}


def events(instance: dg.DagsterInstance, models: list[str], after: int, limit: int
           ) -> list[tuple[int, dg.EventLogRecord]]:
    """(storage id, record) of each production_model, model_monitor and evaluation_report materialization
    after ``after``."""
    found = []
    for key in keys(models):
        for event in instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, after_storage_id=after),
                                                     limit=limit, ascending=True).records:
            found.append((event.storage_id, event))
    return sorted(found, key=lambda item: item[0])[:limit]


def message(event: dg.EventLogRecord, run_url: str) -> dict | None:
    """The message one materialization makes, or None (an unchanged promotion, a monitor not blocked)."""
    metadata = event.asset_materialization.metadata
    if event.asset_key.path[-1] == Stage.EVALUATION_REPORT:
        evaluated = EvaluationRecord.from_metadata(metadata)
        model = "/".join(event.asset_key.path[:-1])
        partition = event.asset_materialization.partition or ""
        return None if evaluated.gate_passed else refusal_message(evaluated, model, partition, run_url)
    if event.asset_key.path[-1] == Stage.PRODUCTION_MODEL:
        record = PromotionRecord.from_metadata(metadata)
        return promotion_message(record, run_url) if record.outcome != "unchanged" else None
    monitored = MonitorRecord.from_metadata(metadata)
    return monitor_message(monitored, run_url) if monitored.status == "blocked" else None


def retrainings(instance: dg.DagsterInstance, models: list[str], after: dt.datetime, limit: int) -> list[dg.RunRecord]:
    """Runs launched on evidence after ``after``, oldest first."""
    found = []
    for model in models:
        found += instance.get_run_records(filters=dg.RunsFilter(
            job_name=daily_job_name(model), tags={RETRAIN_TAG: "degradation"}, created_after=after), limit=limit)
    return sorted(found, key=lambda r: r.create_timestamp)[:limit]


def latest_storage_id(instance: dg.DagsterInstance, models: list[str]) -> int:
    """Where a first tick starts: after every event already recorded (history is not re-sent)."""
    latest = 0
    for key in keys(models):
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1).records
        latest = max([latest, *(r.storage_id for r in records)])
    return latest
