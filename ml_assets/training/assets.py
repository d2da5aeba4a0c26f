import datetime as dt

import dagster as dg

from ml_assets.code_version import code_version
from ml_assets.pipeline.graph import GPU_POOL, ModelGraph, Stage, daily_partitions
from ml_assets.resources import (
    ArtifactStoreResource,
    CheckpointStoreResource,
    MlflowTrackingResource,
)
from ml_assets.spec import ModelSpec
from ml_assets.step import step
from ml_assets.training import window
from ml_assets.training.decision import SKIP
from ml_assets.training.inputs import feature_window
from ml_assets.training.launch import checkpoint_record, launch, skip_metadata
from ml_assets.training.launcher import TRAINER_ROOTS, TorchrunLauncher
from ml_assets.training.tuned import tuned_parameters
from ml_assets.training.warm import plan

__all__ = ["build_trained_checkpoint", "tuned_parameters"]


def build_trained_checkpoint(spec: ModelSpec) -> dg.AssetsDefinition:
    width, tests = spec.training.window_days, spec.evaluation.test_days
    wiring = ModelGraph(spec).wiring(Stage.TRAINED_CHECKPOINT)
    version = code_version(spec, ("model", "training", "features", "target"), __name__, *TRAINER_ROOTS,
                           factory=spec.model)

    @dg.asset(
        key=wiring.key,
        deps=wiring.deps,
        group_name=spec.name, partitions_def=daily_partitions(spec), kinds={_kind(spec)}, code_version=version,
        tags={"ml_assets/stage": "training"},
        pool=GPU_POOL,  # the production instance limits how many training steps run at once
        # Only a preemption (checkpoint written, TrainingPreempted) is retried: the retry resumes.
        retry_policy=dg.RetryPolicy(max_retries=spec.training.retries, delay=1) if spec.training.retries else None,
        # A skip (training.warm_start: a registered version holds the result) materializes nothing,
        # so the run's evaluation and registration do not run either.
        output_required=False,
        description=(f"{spec.name} weights trained with torchrun DDP on the {width} feature days before the "
                     f"partition's {tests} test day(s), the last {spec.training.validation_days} of them validating; "
                     "sha256-pinned, with the fitted feature state. With training.warm_start, each partition skips, "
                     "fine-tunes the champion or trains from scratch, and records why."),
    )
    def trained_checkpoint(context: dg.AssetExecutionContext, artifacts: ArtifactStoreResource,
                           checkpoints: CheckpointStoreResource, launcher: TorchrunLauncher,
                           tracking: MlflowTrackingResource):
        run = step(context, spec)
        try:
            win = window.training_window(spec, dt.date.fromisoformat(run.partition))
        except window.WindowError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        win, records = feature_window(context, wiring, win, "fit")
        if win.skipped:
            context.log.warning(f"trained_checkpoint {run.partition}: skipping days without features: "
                                f"{win.skipped_json()}")
        tuned = tuned_parameters(context.instance, wiring)
        if tuned and tuned.last_day >= win.test_days[0].isoformat():
            # A study that validated on this partition's test days chose its parameters on them.
            context.log.warning(f"trained_checkpoint {run.partition}: not applying {tuned.source}: it validated on "
                                f"days up to {tuned.last_day}, this partition's test days start on {win.test_days[0]}")
            tuned = None
        elif tuned:
            context.log.info(f"trained_checkpoint {run.partition}: hyperparameters from {tuned.source}: {tuned.params}")
        planned = plan(context, wiring.graph, run, win, records, artifacts, tracking.client(), checkpoints.root, tuned,
                       version)
        decision = planned.decision
        context.log.info(f"trained_checkpoint {run.partition}: {decision.kind}: {decision.reason}")
        if decision.kind == SKIP:
            yield dg.AssetObservation(asset_key=wiring.key, partition=run.partition,
                                      metadata=skip_metadata(planned))
            return
        result, progress = launch(context, planned.run, launcher, planned.cfg, win)
        record = checkpoint_record(planned.run, result, win, records, planned.prepared, planned.cfg, tuned, progress,
                                   planned)
        yield dg.MaterializeResult(data_version=dg.DataVersion(result.checkpoint_sha256),
                                   metadata=record.to_metadata())

    return trained_checkpoint


def _kind(spec) -> str:
    """The technology the UI shows on the asset: the network's or the trees'."""
    return "xgboost" if spec.model.boosted else "pytorch"
