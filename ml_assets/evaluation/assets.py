"""The evaluation_report asset and its promotion gate (a check: a refusal warns and stops
registration; an evaluation that errors fails)."""

import dagster as dg

from ml_assets.code_version import code_version
from ml_assets.pipeline.graph import ModelGraph, Stage, daily_partitions
from ml_assets.resources import (
    ArtifactStoreResource,
    DagsterLinksResource,
    MlflowTrackingResource,
    VersionStoreResource,
)
from ml_assets.spec import ModelSpec
from ml_assets.step import step
from ml_assets.training.inputs import feature_window
from ml_assets.training.record import CheckpointRecord

GATE = "promotion_gate"


def build_evaluation_report(spec: ModelSpec) -> dg.AssetsDefinition:
    wiring = ModelGraph(spec).wiring(Stage.EVALUATION_REPORT)
    key = wiring.key
    tests, policy = spec.evaluation.test_days, spec.promotion

    @dg.asset(
        key=key,
        deps=wiring.deps,
        group_name=spec.name, partitions_def=daily_partitions(spec), kinds={"pytorch", "scikitlearn", "mlflow"},
        code_version=code_version(spec, ("evaluation", "promotion", "target"), __name__),
        check_specs=[dg.AssetCheckSpec(
            GATE, asset=key, blocking=True,
            description=(f"The promotion policy: {policy.primary_metric} at least {policy.min_improvement:+} over the "
                         f"champion on the same rows, no slice worse by more than {policy.max_slice_regression}, "
                         f"calibration error up by at most {policy.max_calibration_worsening}; a first model must "
                         f"reach {dict(policy.floors) or 'no floors'}. A candidate that misses is refused: this "
                         "check warns with the reason, the refusal is logged, nothing is registered and the "
                         "run succeeds."))],
        description=(f"{spec.name} evaluated on the {tests} day(s) ending with the partition's own (held out in "
                     "time), next to the champion on the same rows: metrics, intervals, slices, plots in MLflow, "
                     "and the promotion gate."),
    )
    def evaluation_report(context: dg.AssetExecutionContext, artifacts: ArtifactStoreResource,
                          tracking: MlflowTrackingResource, links: DagsterLinksResource,
                          version_store: VersionStoreResource) -> dg.MaterializeResult:
        # torch, scikit-learn and matplotlib are imported when an evaluation runs, not when definitions load.
        import datetime as dt

        from ml_assets.evaluation import report as rep
        from ml_assets.evaluation.store import store_evaluation
        from ml_assets.training import window as win

        run = step(context, spec, links)
        ckpt = wiring.read(context, CheckpointRecord, run.partition)
        days = win.Window(dt.date.fromisoformat(run.partition), (), (),
                          win.held_out_days(spec, dt.date.fromisoformat(run.partition)))
        days, records = feature_window(context, wiring, days, "test")
        try:
            report, predictions = rep.evaluate(spec, run.partition, ckpt, [r.ref(d) for d, r in records.items()],
                                               tracking.client(), days.skipped_json())
        except rep.EvaluationError as exc:
            raise run.failure(exc) from None
        record = store_evaluation(run, report, predictions, ckpt.result.checkpoint_sha256, artifacts, tracking)
        context.log.info(f"evaluation_report {run.partition}: " + rep.one_line(report))
        store = version_store.get_store()
        if not report.gate.passed:
            _refused(spec, run.partition, record, report.gate, ckpt.decision.get("kind", ""), context.run_id, store)
        _observe_freshness(context, spec, tracking.client(), store)
        return _result(record, report.gate, run.where, policy, context.log)

    return evaluation_report


def _observe_freshness(context: dg.AssetExecutionContext, spec: ModelSpec, client, store) -> None:
    """production_model's page shows the champion's freshness after each evaluation, not only at
    promotions (an observation: nothing is materialized)."""
    from ml_assets.pipeline.graph import Stage, stage_key
    from ml_assets.promotion.freshness import freshness, to_metadata

    fresh = freshness(context.instance, client, store, spec.name)
    context.log_event(dg.AssetObservation(asset_key=stage_key(spec.name, Stage.PRODUCTION_MODEL),
                                          metadata=to_metadata(fresh)))


def _refused(spec: ModelSpec, partition: str, record, gate, trained: str, run_id: str, store) -> None:
    """Log the refusal on main. The champion's card lists it as built by ``ml-assets card`` (from the
    records, now) and as logged again at the next registration or promotion: republishing the card
    here would make this stage's code version cover the card's and the audit's code."""
    from ml_assets.evaluation.refusals import log_refusal, refusal

    log_refusal(store, refusal(spec.name, partition, record, [c.to_dict() for c in gate.clauses], trained, run_id))


def _result(record, gate, where: str, policy, log) -> dg.MaterializeResult:
    """The asset's materialization and its gate's check. A refusal is an outcome of a healthy
    evaluation: the check fails with WARN severity (shown, not blocking, no red run) and
    registered_model, seeing the refusal, materializes nothing."""
    verdict = "accepted" if gate.passed else "refused"
    log.info(f"{GATE}: {verdict} for {where}: {gate.reason}")
    return dg.MaterializeResult(metadata={**record.to_metadata(), "verdict": verdict}, check_results=[dg.AssetCheckResult(
        check_name=GATE, passed=gate.passed,
        severity=dg.AssetCheckSeverity.ERROR if gate.passed else dg.AssetCheckSeverity.WARN,
        description=f"{verdict}: {where}: {gate.reason}",
        metadata={"verdict": verdict, "decision": gate.kind, "reason": gate.reason,
                  "champion_version": record.champion_version or dg.MetadataValue.null(),
                  "clauses": dg.MetadataValue.json([c.to_dict() for c in gate.clauses]),
                  "policy": dg.MetadataValue.json(policy.model_dump(mode="json"))})])
