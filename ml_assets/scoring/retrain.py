"""Retraining on evidence: when ``model_monitor`` crosses a blocking limit of the spec's monitoring
section, the model's daily job trains the latest partition, at most once per ``retrain.cooldown_hours``.
Each launch carries why in its tags (the monitor's day, version and findings), as a scheduled run
carries ``ml_assets/retrain: schedule``."""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg

from ml_assets.features.record import FeaturesRecord
from ml_assets.pipeline.graph import ModelGraph, Stage
from ml_assets.records.runs import REASON_TAG, RETRAIN_TAG, RetrainTags
from ml_assets.scoring.record import MonitorRecord
from ml_assets.spec import ModelSpec

__all__ = ["REASON_TAG", "RETRAIN_TAG", "build_retrain_sensor"]
BATCH = 100


def reason(record: MonitorRecord) -> str:
    """Why a blocked monitor retrains: the day, the version and what crossed its blocking level."""
    crossed = "; ".join(f["text"] for f in record.findings if f["level"] == "blocked")
    return f"model_monitor {record.day}, version {record.model_version}: {crossed}"[:1000]


def latest_partition(instance: dg.DagsterInstance, spec: ModelSpec) -> str | None:
    """The newest day whose features hold enough labelled rows to be a training's test day: what a
    retraining trains (a newer day whose labels have not arrived has feature rows, but none labelled)."""
    graph = ModelGraph(spec)
    for day in sorted(instance.get_materialized_partitions(graph.key(Stage.FEATURES)), reverse=True):
        found = graph.latest(instance, FeaturesRecord, day)
        if found is not None and found.rows >= spec.evaluation.min_test_rows:
            return day
    return None


def last_retraining(instance: dg.DagsterInstance, spec: ModelSpec) -> dg.RunRecord | None:
    records = instance.get_run_records(filters=dg.RunsFilter(
        job_name=ModelGraph(spec).daily_job, tags={RETRAIN_TAG: "degradation"}), limit=1)
    return records[0] if records else None


def build_retrain_sensor(spec: ModelSpec, daily_job: dg.JobDefinition) -> dg.SensorDefinition:
    cooldown = dt.timedelta(hours=spec.retrain.cooldown_hours)

    @dg.sensor(
        name=ModelGraph(spec).retrain_sensor, job=daily_job, minimum_interval_seconds=60,
        # Running by default: the spec's retrain.on is the decision.
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(f"Trains {spec.name}'s latest partition when model_monitor crosses a blocking limit, at most "
                     f"once per {spec.retrain.cooldown_hours:g} h; the run's tags say why."),
    )
    def retrain_sensor(context: dg.SensorEvaluationContext):
        after = int(json.loads(context.cursor)["after"]) if context.cursor else None
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=ModelGraph(spec).key(Stage.MODEL_MONITOR), after_storage_id=after), limit=BATCH,
            ascending=True).records
        if not records:
            return dg.SkipReason("no new model_monitor results")
        context.update_cursor(json.dumps({"after": records[-1].storage_id}))
        blocked = [(r.storage_id, MonitorRecord.from_metadata(r.asset_materialization.metadata)) for r in records]
        blocked = [(sid, m) for sid, m in blocked if m.status == "blocked"]
        if not blocked:
            return dg.SkipReason(f"{len(records)} new model_monitor result(s), none past a blocking limit")
        storage_id, evidence = blocked[-1]
        last = last_retraining(context.instance, spec)
        if last is not None and dt.datetime.now(dt.UTC) - last.create_timestamp.astimezone(dt.UTC) < cooldown:
            return dg.SkipReason(f"{reason(evidence)}; not retraining: run {last.dagster_run.run_id} retrained "
                                 f"at {last.create_timestamp:%Y-%m-%d %H:%M} UTC, within the cooldown of "
                                 f"{spec.retrain.cooldown_hours:g} h")
        partition = latest_partition(context.instance, spec)
        if partition is None:
            return dg.SkipReason(f"{reason(evidence)}; no features to train on yet")
        why = reason(evidence)
        context.log.info(f"retraining {spec.name} for {partition}: {why}")
        return dg.RunRequest(run_key=f"retrain-{storage_id}", partition_key=partition, tags=RetrainTags(
            why="degradation", reason=why, evidence=f"model_monitor {evidence.day}").to_tags())

    return retrain_sensor
