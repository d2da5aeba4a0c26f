"""The evaluation_report asset and its blocking promotion gate."""

import dagster as dg

from ml_assets.defs.common import (
    asset_key,
    code_version,
    daily_partitions,
    features_window_mapping,
    step,
)
from ml_assets.defs.training.inputs import feature_window
from ml_assets.records import CheckpointRecord, upstream
from ml_assets.resources import ArtifactStoreResource, DagsterLinksResource, MlflowTrackingResource
from ml_assets.spec import ModelSpec

GATE = "promotion_gate"


def build_evaluation_report(spec: ModelSpec) -> dg.AssetsDefinition:
    key, ckpt_key = asset_key(spec, "evaluation_report"), asset_key(spec, "trained_checkpoint")
    tests, policy = spec.evaluation.test_days, spec.promotion

    @dg.asset(
        key=key,
        deps=[ckpt_key, dg.AssetDep(asset_key(spec, "features"),
                                    partition_mapping=features_window_mapping(-(tests - 1), 0))],
        group_name=spec.name, partitions_def=daily_partitions(spec), kinds={"pytorch", "scikitlearn", "mlflow"},
        code_version=code_version(spec, ("evaluation", "promotion", "target"), "ml_assets.evaluation",
                                  "ml_assets.serving.predict", "ml_assets.trainer.export"),
        check_specs=[dg.AssetCheckSpec(
            GATE, asset=key, blocking=True,
            description=(f"The promotion policy: {policy.primary_metric} at least {policy.min_improvement:+} over the "
                         f"champion on the same rows, no slice worse by more than {policy.max_slice_regression}, "
                         f"calibration error up by at most {policy.max_calibration_worsening}; a first model must "
                         f"reach {dict(policy.floors) or 'no floors'}. Failing stops registration."))],
        description=(f"{spec.name} evaluated on the {tests} day(s) ending with the partition's own (held out in "
                     "time), next to the champion on the same rows: metrics, intervals, slices, plots in MLflow, "
                     "and the promotion gate."),
    )
    def evaluation_report(context: dg.AssetExecutionContext, artifacts: ArtifactStoreResource,
                          tracking: MlflowTrackingResource, links: DagsterLinksResource) -> dg.MaterializeResult:
        # torch, scikit-learn and matplotlib are imported when an evaluation runs, not when definitions load.
        import datetime as dt

        from ml_assets.defs.training import window as win
        from ml_assets.evaluation import report as rep
        from ml_assets.evaluation.record import store_evaluation

        run = step(context, spec, links)
        ckpt = upstream(context, ckpt_key, run.partition, CheckpointRecord)
        days = win.Window(dt.date.fromisoformat(run.partition), (), (),
                          win.held_out_days(spec, dt.date.fromisoformat(run.partition)))
        days, records = feature_window(context, spec, days, "test")
        try:
            report, predictions = rep.evaluate(spec, run.partition, ckpt, [r.ref(d) for d, r in records.items()],
                                               tracking.client(), days.skipped_json())
        except rep.EvaluationError as exc:
            raise run.failure(exc) from None
        record = store_evaluation(run, report, predictions, ckpt.result.checkpoint_sha256, artifacts, tracking)
        gate = report["gate"]
        context.log.info(f"evaluation_report {run.partition}: " + rep.one_line(report))
        (context.log.info if gate["passed"] else context.log.error)(
            f"{GATE} {'passed' if gate['passed'] else 'FAILED'} for {run.where}: {gate['reason']}")
        return dg.MaterializeResult(metadata=record.to_metadata(), check_results=[dg.AssetCheckResult(
            check_name=GATE, passed=bool(gate["passed"]), severity=dg.AssetCheckSeverity.ERROR,
            description=f"{run.where}: {gate['reason']}",
            metadata={"decision": gate["kind"], "reason": gate["reason"],
                      "champion_version": record.champion_version or dg.MetadataValue.null(),
                      "clauses": dg.MetadataValue.json(gate["clauses"]),
                      "policy": dg.MetadataValue.json(policy.model_dump(mode="json"))})])

    return evaluation_report
