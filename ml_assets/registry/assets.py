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
        code_version=code_version(spec, ("name", "training", "evaluation"), __name__),
        description=(f"An MLflow model version of {spec.name} (alias '{CHALLENGER}'), tagged with the data commit, "
                     "Dagster run and code version it came from; one version per trained checkpoint; its model card."),
    )
    def registered_model(context: dg.AssetExecutionContext, tracking: MlflowTrackingResource,
                         links: DagsterLinksResource, version_store: VersionStoreResource) -> dg.MaterializeResult:
        from ml_assets import cards
        from ml_assets.promotion import moves as promotion
        from ml_assets.registry.register import register

        run = step(context, spec, links)
        ckpt = wiring.read(context, CheckpointRecord, run.partition)
        evaluation = wiring.read(context, EvaluationRecord, run.partition)
        if not evaluation.gate_passed:
            # The blocking gate stops this asset in the run that evaluated; this covers a later run
            # that selects registered_model alone.
            raise run.failure(f"the evaluation's promotion gate failed ({evaluation.gate_reason}); not registering")
        record = register(run, ckpt, evaluation, tracking, context.log.info)
        card = cards.publish(tracking.client(), spec, record.model_version,
                             promotion.history(version_store.get_store(), spec.name))
        return dg.MaterializeResult(metadata=replace(record, model_card=card).to_metadata())

    return registered_model
