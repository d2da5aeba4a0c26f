"""One model's definitions: its stage assets in order, its jobs, schedules and sensors."""

import dagster as dg

from ml_assets.evaluation.assets import build_evaluation_report
from ml_assets.features.assets import build_features_asset
from ml_assets.ingest.assets import build_raw_data
from ml_assets.pipeline.arrival import build_arrival_sensor, watched
from ml_assets.pipeline.graph import DAILY_STAGES, INGEST_STAGES, Stage
from ml_assets.pipeline.jobs import (
    build_daily_job,
    build_daily_schedule,
    build_ingest_job,
    job_tags,
)
from ml_assets.promotion.assets import (
    build_production_model,
    build_promotion_job,
    build_promotion_sensor,
)
from ml_assets.registry.assets import build_registered_model
from ml_assets.scoring.assets import (
    build_model_monitor,
    build_predictions,
    build_scoring_job,
    build_scoring_schedule,
)
from ml_assets.scoring.retrain import build_retrain_sensor
from ml_assets.spec import ModelSpec
from ml_assets.training.assets import build_trained_checkpoint
from ml_assets.tuning.assets import (
    build_hyperparameters,
    build_tuning_job,
    build_tuning_schedule,
)
from ml_assets.validation.assets import build_validated_snapshot
from ml_assets.verification.job import build_verify_job, build_verify_schedule

# The daily job's assets, by stage.
BUILDERS = {
    Stage.RAW_DATA: build_raw_data,
    Stage.VALIDATED_SNAPSHOT: build_validated_snapshot,
    Stage.FEATURES: build_features_asset,
    Stage.TRAINED_CHECKPOINT: build_trained_checkpoint,
    Stage.EVALUATION_REPORT: build_evaluation_report,
    Stage.REGISTERED_MODEL: build_registered_model,
}
assert tuple(BUILDERS) == DAILY_STAGES


def build_model_defs(spec: ModelSpec, executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """``executor``: what the model's jobs run with (a model component's jobs carry theirs); None:
    the code location's."""
    daily = {stage: build(spec) for stage, build in BUILDERS.items()}
    assets = list(daily.values())
    job = build_daily_job(spec, assets, executor)
    ingest = build_ingest_job(spec, [daily[stage] for stage in INGEST_STAGES])
    production = build_production_model(spec)
    promote = build_promotion_job(spec, production, executor)
    tuning = build_hyperparameters(spec)
    tune = build_tuning_job(spec, tuning, executor)
    predictions, monitor = build_predictions(spec), build_model_monitor(spec)
    score = build_scoring_job(spec, [predictions, monitor], executor)
    verify = build_verify_job(spec, job_tags(spec, trains=False))
    return dg.Definitions(assets=[*assets, production, tuning, predictions, monitor],
                          jobs=[job, ingest, promote, tune, score, verify],
                          schedules=[*([build_daily_schedule(spec, job)] if spec.retrain.scheduled else []),
                                     build_tuning_schedule(tune), build_scoring_schedule(spec, score),
                                     build_verify_schedule(spec, verify)],
                          sensors=[build_promotion_sensor(spec, promote),
                                   *([build_arrival_sensor(spec, ingest)] if watched(spec) else []),
                                   *([build_retrain_sensor(spec, job)] if spec.retrain.on_degradation else [])])
