from __future__ import annotations

import dagster as dg

from ml_assets.pipeline.graph import ModelGraph, daily_partitions
from ml_assets.records.runs import RetrainTags
from ml_assets.spec import ModelSpec

# Run tags the production instance's queue acts on (ml_assets/instance/production.yaml): every run
# carries its model's team (TEAM_TAG) and priority (PRIORITY_TAG, Dagster's own: a higher value is
# dequeued first); runs that train carry their team in TRAINING_TEAM_TAG too, limited per team, so
# one team's backfill cannot take every training slot.
TEAM_TAG = "ml_assets/team"
TRAINING_TEAM_TAG = "ml_assets/training_team"
PRIORITY_TAG = "dagster/priority"
PRIORITIES = {"low": -10, "normal": 0, "high": 10, "urgent": 20}
MAX_RUNTIME_TAG = "dagster/max_runtime"  # seconds; run monitoring cancels and fails a longer run


def job_tags(spec: ModelSpec, trains: bool) -> dict[str, str]:
    tags = {"ml_assets/model": spec.name, TEAM_TAG: spec.team, PRIORITY_TAG: str(PRIORITIES[spec.priority])}
    if trains:
        tags[TRAINING_TEAM_TAG] = spec.team
        tags[MAX_RUNTIME_TAG] = str(spec.training.max_runtime_minutes * 60)
    return tags


def build_daily_job(spec: ModelSpec, assets: list[dg.AssetsDefinition],
                    executor_def: dg.ExecutorDefinition | None = None) -> dg.JobDefinition:
    return dg.define_asset_job(
        name=ModelGraph(spec).daily_job,
        selection=dg.AssetSelection.assets(*assets),
        description=f"Ingest, validate, featurize, train, evaluate and register {spec.name} for one day.",
        tags=job_tags(spec, trains=True),
        executor_def=executor_def,
    )


def build_ingest_job(spec: ModelSpec, assets: list[dg.AssetsDefinition]) -> dg.JobDefinition:
    """raw_data -> validated_snapshot -> features: what a backfill of history runs, without training.

    Three short steps in a line: run in the run worker's process by default (a process per step
    would only add its start-up to each step); run config can still ask for the multiprocess
    executor (``execution: {config: {multiprocess: {}}}``)."""
    return dg.define_asset_job(
        name=ModelGraph(spec).ingest_job,
        selection=dg.AssetSelection.assets(*assets),
        description=f"Ingest, validate and featurize {spec.name} for one day (backfills of history).",
        tags=job_tags(spec, trains=False),
        executor_def=dg.multi_or_in_process_executor,
        config={"execution": {"config": {"in_process": {}}}},
    )


def daily_schedule(spec: ModelSpec, job: dg.JobDefinition, hour: int, tags: dict[str, str] | None = None,
                   description: str = "") -> dg.ScheduleDefinition:
    """At ``hour`` each day in the model's timezone, a run of ``job`` for the day that just ended;
    stopped until someone turns it on.

    Not ``build_schedule_from_partitioned_job``: Dagster resolves the job of such a schedule when the
    code location loads, against every asset of every model, a cost that grows with the square of
    the models (at 300 models, 3.7 s of 8.5); this one leaves the job to be resolved when a run needs
    it. The partition is the same: the last complete day at the tick."""
    partitions = daily_partitions(spec)

    @dg.schedule(name=f"{job.name}_schedule", job=job, cron_schedule=f"0 {hour} * * *",
                 execution_timezone=spec.partitioning.timezone, default_status=dg.DefaultScheduleStatus.STOPPED,
                 description=description or f"{job.name} for the day before, at {hour:02d}:00 each day.")
    def schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        with dg.partition_loading_context(effective_dt=context.scheduled_execution_time):
            key = partitions.get_last_partition_key()
        if key is None:
            return dg.SkipReason(f"no complete day of {spec.name}'s partitions at {context.scheduled_execution_time}")
        return dg.RunRequest(run_key=key, partition_key=key, tags=tags or {})

    return schedule


def build_daily_schedule(spec: ModelSpec, job: dg.JobDefinition) -> dg.ScheduleDefinition:
    # Its runs say why they train, as a retraining on evidence does (ml_assets/scoring/retrain.py).
    return daily_schedule(spec, job, hour=2, tags=RetrainTags(why="schedule").to_tags())
