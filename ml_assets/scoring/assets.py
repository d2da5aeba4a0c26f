"""The scoring assets (predictions, model_monitor), their job and its daily schedule."""

import datetime as dt
import time

import dagster as dg

from ml_assets.code_version import code_version
from ml_assets.pipeline.graph import ModelGraph, Stage, daily_partitions
from ml_assets.pipeline.jobs import daily_schedule, job_tags
from ml_assets.records.read import latest
from ml_assets.resources import ArtifactStoreResource, MlflowTrackingResource, VersionStoreResource
from ml_assets.scoring.record import MonitorRecord, PredictionsRecord
from ml_assets.spec import ModelSpec
from ml_assets.step import step
from ml_assets.validation.record import SnapshotRecord


def build_predictions(spec: ModelSpec) -> dg.AssetsDefinition:
    graph = ModelGraph(spec)
    wiring = graph.wiring(Stage.PREDICTIONS)
    version = code_version(spec, ("features", "target", "partitioning", "schema"), __name__)

    @dg.asset(
        key=wiring.key,
        deps=wiring.deps,
        group_name=graph.production_group,
        partitions_def=daily_partitions(spec),
        kinds={"pytorch", "mlflow"},
        code_version=version,
        tags={"ml_assets/stage": "scoring"},
        description=(f"The day's {spec.name} rows scored by the @champion of the moment, through the transform it "
                     "was trained with; content-addressed, naming the version, its weights and the data commit."),
    )
    def predictions(context: dg.AssetExecutionContext, version_store: VersionStoreResource,
                    artifacts: ArtifactStoreResource, tracking: MlflowTrackingResource) -> dg.MaterializeResult:
        from ml_assets.features.build import FeatureError
        from ml_assets.scoring.predictions import ScoringError, score_day

        run, started = step(context, spec), time.monotonic()
        snapshot = wiring.read(context, SnapshotRecord, run.partition)
        previous = latest(context.instance, context.asset_key, run.partition, PredictionsRecord)
        try:
            record = score_day(spec, dt.date.fromisoformat(run.partition), version_store.get_store(), artifacts,
                               tracking.client(), snapshot, tracking.model_url, previous, context.log.info)
        except (ScoringError, FeatureError) as exc:
            raise run.failure(exc) from None
        record = record.spent(time.monotonic() - started)
        return dg.MaterializeResult(data_version=dg.DataVersion(record.sha256), metadata=record.to_metadata())

    return predictions


LIVE_METRICS_CHECK = "live_metrics"
DRIFT_CHECK = "drift"


def monitor_checks(record: MonitorRecord, key: dg.AssetKey) -> list[dg.AssetCheckResult]:
    """The spec's monitoring limits as two checks: failed with severity ERROR when a blocking level
    is crossed, WARN for a warn level; a pending day passes, saying why it is not judged."""
    results = []
    for name, kind in ((LIVE_METRICS_CHECK, "metric"), (DRIFT_CHECK, "drift")):
        mine = [f for f in record.findings if f["kind"] == kind]
        blocked = any(f["level"] == "blocked" for f in mine)
        description = ("; ".join(f["text"] for f in mine) if mine else
                       f"pending: {record.pending_reason}" if kind == "metric" and record.pending_reason
                       else "within the spec's monitoring limits")
        results.append(dg.AssetCheckResult(
            asset_key=key, check_name=name, passed=not mine,
            severity=dg.AssetCheckSeverity.ERROR if blocked else dg.AssetCheckSeverity.WARN,
            description=description[:1000], metadata={"status": record.status, "day": record.day}))
    return results


def build_model_monitor(spec: ModelSpec) -> dg.AssetsDefinition:
    graph = ModelGraph(spec)
    wiring = graph.wiring(Stage.MODEL_MONITOR)
    key = wiring.key

    @dg.asset(
        key=key,
        deps=wiring.deps,
        group_name=graph.production_group,
        partitions_def=daily_partitions(spec),
        kinds={"pytorch", "mlflow"},
        code_version=code_version(spec, ("monitoring", "target", "evaluation"), __name__),
        tags={"ml_assets/stage": "monitoring"},
        check_specs=[dg.AssetCheckSpec(LIVE_METRICS_CHECK, asset=key,
                                       description="the champion's live metrics of the day within monitoring.metrics"),
                     dg.AssetCheckSpec(DRIFT_CHECK, asset=key,
                                       description="the day's predictions and features within monitoring's drift limits")],
        description=(f"The {spec.name} champion that scored the day, judged on its labels (metrics with intervals) "
                     "and against its training window (prediction and feature drift); limits from monitoring:."),
    )
    def model_monitor(context: dg.AssetExecutionContext, version_store: VersionStoreResource,
                      tracking: MlflowTrackingResource) -> dg.MaterializeResult:
        from ml_assets.scoring.monitor import monitor_day

        run = step(context, spec)
        scored = wiring.read(context, PredictionsRecord, run.partition)
        snapshot = wiring.read(context, SnapshotRecord, run.partition)
        record = monitor_day(spec, dt.date.fromisoformat(run.partition), version_store.get_store(), tracking.client(),
                             scored, snapshot, context.log.info)
        return dg.MaterializeResult(metadata=record.to_metadata(), check_results=monitor_checks(record, key))

    return model_monitor


def build_scoring_job(spec: ModelSpec, assets: list[dg.AssetsDefinition],
                      executor_def: dg.ExecutorDefinition | None = None) -> dg.JobDefinition:
    return dg.define_asset_job(
        name=ModelGraph(spec).score_job,
        selection=dg.AssetSelection.assets(*assets),
        description=f"Score one day of {spec.name} rows with the current @champion, and judge it on the day.",
        tags=job_tags(spec, trains=False),
        executor_def=executor_def,
    )


def build_scoring_schedule(spec: ModelSpec, job: dg.JobDefinition) -> dg.ScheduleDefinition:
    # Stopped by default, like daily training: scoring starts when a team turns it on.
    return daily_schedule(spec, job, hour=1)
