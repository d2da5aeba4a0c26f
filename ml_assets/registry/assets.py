"""The registered_model asset: an MLflow model version of the partition's checkpoint."""

from dataclasses import replace

import dagster as dg

from ml_assets.code_version import code_version
from ml_assets.evaluation.record import EvaluationRecord
from ml_assets.pipeline.graph import ModelGraph, Stage, daily_partitions
from ml_assets.registry.versions import CHALLENGER
from ml_assets.resources import DagsterLinksResource, MlflowTrackingResource, VersionStoreResource
from ml_assets.spec import ModelSpec
from ml_assets.step import step
from ml_assets.training.record import CheckpointRecord

__all__ = ["build_registered_model"]


def build_registered_model(spec: ModelSpec) -> dg.AssetsDefinition:
    wiring = ModelGraph(spec).wiring(Stage.REGISTERED_MODEL)

    @dg.asset(
        key=wiring.key,
        deps=wiring.deps,
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"mlflow"},
        output_required=False,  # a refused candidate is not registered: nothing materializes, nothing fails
        code_version=code_version(spec, ("name", "training", "evaluation"), __name__),
        description=(f"An MLflow model version of {spec.name} (alias '{CHALLENGER}'), tagged with the data commit, "
                     "Dagster run and code version it came from; one version per trained checkpoint that passed the "
                     "promotion gate (a refused one is logged, not registered); its model card."),
    )
    def registered_model(context: dg.AssetExecutionContext, tracking: MlflowTrackingResource,
                         links: DagsterLinksResource, version_store: VersionStoreResource):
        from ml_assets import cards
        from ml_assets.evaluation.refusals import refusals
        from ml_assets.promotion import moves as promotion
        from ml_assets.registry.register import register

        run = step(context, spec, links)
        ckpt = wiring.read(context, CheckpointRecord, run.partition)
        evaluation = wiring.read(context, EvaluationRecord, run.partition)
        if not evaluation.gate_passed:
            # An outcome, not an error: the refusal is on the evaluation's check and in the refusals
            # log; what is downstream (production_model) is skipped, and the run succeeds.
            context.log.info(f"{spec.name} {run.partition}: the candidate was refused by the promotion gate "
                             f"({evaluation.gate_reason}); not registering")
            return
        store = version_store.get_store()
        record = register(run, ckpt, evaluation, tracking, context.log.info)
        card = cards.publish(tracking.client(), spec, record.model_version, promotion.history(store, spec.name),
                             refusals(store, spec.name))
        yield dg.MaterializeResult(metadata=replace(record, model_card=card).to_metadata())

    return registered_model
