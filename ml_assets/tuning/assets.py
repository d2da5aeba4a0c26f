import dagster as dg

from ml_assets.code_version import code_version
from ml_assets.features.record import FeaturesRecord
from ml_assets.layout import Layout
from ml_assets.pipeline.graph import GPU_POOL, ModelGraph, Stage
from ml_assets.pipeline.jobs import TRAINING_TEAM_TAG, job_tags
from ml_assets.resources import ArtifactStoreResource, DagsterLinksResource, MlflowTrackingResource
from ml_assets.spec import ModelSpec
from ml_assets.step import step
from ml_assets.training.launcher import TRAINER_ROOTS
from ml_assets.training.prepare import prepare
from ml_assets.tuning.resource import TuningResource
from ml_assets.tuning.search import latest_window, study_job, study_record


def build_hyperparameters(spec: ModelSpec) -> dg.AssetsDefinition:
    graph, tuning = ModelGraph(spec), spec.tuning
    wiring = graph.wiring(Stage.HYPERPARAMETERS)

    @dg.asset(
        key=wiring.key, deps=wiring.deps, group_name=graph.tuning_group,
        kinds={"optuna", "mlflow"},
        code_version=code_version(spec, ("tuning", "training", "features", "target"), __name__,
                                  "ml_assets.tuning.study", *TRAINER_ROOTS),
        tags={"ml_assets/stage": "tuning"}, pool=GPU_POOL,
        description=(f"An Optuna study of {spec.name} ({tuning.trials} trials, TPE, {tuning.pruner.kind} pruning) "
                     "on the newest window of features; its best parameters become the training defaults."),
    )
    def hyperparameters(context: dg.AssetExecutionContext, artifacts: ArtifactStoreResource,
                        tracking: MlflowTrackingResource, tuning_store: TuningResource,
                        links: DagsterLinksResource) -> dg.MaterializeResult:
        from ml_assets.tuning import study as st

        run = step(context, spec, links)
        if tuning.workers > 1 and tuning_store.is_sqlite():
            raise dg.Failure(description=(
                f"model {spec.name}: tuning.workers is {tuning.workers}, but the study storage is SQLite, which "
                "serves one worker: set ML_ASSETS_OPTUNA_STORAGE to a PostgreSQL URL "
                "(postgresql+psycopg://user@host/db) or use workers: 1"), allow_retries=False)
        train_days, val_days = latest_window(context.instance, spec, wiring.key_of(Stage.FEATURES))
        records = {d: wiring.read(context, FeaturesRecord, d) for d in [*train_days, *val_days]}
        try:
            prepared = prepare(spec, records, train_days, val_days, artifacts,
                               Layout.of(spec).tuning_state_prefix(val_days[-1]), check_validation=False)
        except ValueError as exc:
            raise dg.Failure(description=f"model {spec.name}: {exc}", allow_retries=False) from None
        job = study_job(run, prepared, val_days[-1], tracking, tuning_store)
        window = {"train": train_days, "validation": val_days}
        study = st.open_study(job, create=True)
        study.set_user_attr("window", window)
        context.log.info(f"hyperparameters: study {job.study_name} ({st.counts(study)}); "
                         f"{tuning.workers} worker(s) until {tuning.trials} trials are finished; train "
                         f"{train_days[0]}..{train_days[-1]}, validate {val_days[0]}..{val_days[-1]}")
        codes = tuning_store.run_workers(context, spec, job, tuning.workers)
        study = st.open_study(job)
        if not st.counts(study)["complete"]:
            raise dg.Failure(description=(f"model {spec.name}: study {job.study_name} has no completed trial "
                                          f"({st.counts(study)}); worker exit codes {codes}; trial logs under "
                                          f"{job.workdir}"), allow_retries=False)
        record = study_record(job, study, window, tracking)
        context.log.info(f"hyperparameters: best val_loss {record.best_value:.4f} (trial {record.best_trial}) "
                         f"{record.best_params}; {st.counts(study)}")
        return dg.MaterializeResult(metadata=record.to_metadata())

    return hyperparameters


def build_tuning_job(spec: ModelSpec, asset: dg.AssetsDefinition,
                     executor_def: dg.ExecutorDefinition | None = None) -> dg.JobDefinition:
    return dg.define_asset_job(name=ModelGraph(spec).tune_job, selection=dg.AssetSelection.assets(asset),
                               description=f"Run (or continue) {spec.name}'s hyperparameter study.",
                               tags={**job_tags(spec, trains=False), TRAINING_TEAM_TAG: spec.team},
                               executor_def=executor_def)


def build_tuning_schedule(job: dg.JobDefinition) -> dg.ScheduleDefinition:
    # Weekly, Sunday 03:00; stopped by default: tuning costs many trainings.
    return dg.ScheduleDefinition(job=job, cron_schedule="0 3 * * 0", default_status=dg.DefaultScheduleStatus.STOPPED)


__all__ = ["build_hyperparameters", "build_tuning_job", "build_tuning_schedule", "latest_window"]
