from __future__ import annotations

import dagster as dg

from ml_assets.spec import ModelSpec


def build_daily_job(spec: ModelSpec, assets: list[dg.AssetsDefinition]) -> dg.JobDefinition:
    return dg.define_asset_job(
        name=f"{spec.name}_daily",
        selection=dg.AssetSelection.assets(*assets),
        description=f"Ingest, validate, featurize, train, evaluate and register {spec.name} for one day.",
        tags={"ml_assets/model": spec.name, "team": spec.owner},
    )


def build_daily_schedule(job: dg.JobDefinition) -> dg.ScheduleDefinition:
    # Stopped by default: turning on daily retraining is a decision, not a side effect of deploying.
    return dg.build_schedule_from_partitioned_job(job, hour_of_day=2, default_status=dg.DefaultScheduleStatus.STOPPED)
