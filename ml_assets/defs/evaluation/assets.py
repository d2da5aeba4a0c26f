import json
import tempfile
from pathlib import Path

import dagster as dg

from ml_assets.defs.common import (
    asset_key,
    code_version,
    dagster_run_url,
    daily_partitions,
    features_window_mapping,
    package_code_version,
    partition_day,
    upstream_metadata,
)
from ml_assets.defs.training.inputs import feature_ref, feature_window
from ml_assets.resources import ArtifactStoreResource, MlflowTrackingResource
from ml_assets.spec import ModelSpec

GATE = "promotion_gate"


def build_evaluation_report(spec: ModelSpec) -> dg.AssetsDefinition:
    key = asset_key(spec, "evaluation_report")
    ckpt_key, features_key = asset_key(spec, "trained_checkpoint"), asset_key(spec, "features")
    tests = spec.evaluation.test_days
    version = code_version(spec, ("evaluation", "promotion", "target"), "ml_assets.defs.evaluation.report",
                           "ml_assets.serving.predict",
                           "ml_assets.evaluation.metrics", "ml_assets.evaluation.policy", "ml_assets.trainer.checkpoint")
    policy = spec.promotion

    @dg.asset(
        key=key,
        deps=[ckpt_key, dg.AssetDep(features_key, partition_mapping=features_window_mapping(-(tests - 1), 0))],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"pytorch", "scikitlearn", "mlflow"},
        code_version=version,
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
    def evaluation_report(
        context: dg.AssetExecutionContext, artifacts: ArtifactStoreResource, tracking: MlflowTrackingResource
    ) -> dg.MaterializeResult:
        # torch, scikit-learn and matplotlib are imported when an evaluation runs, not when definitions load.
        from ml_assets.defs.evaluation import report as rep
        from ml_assets.defs.training import window as win

        partition = partition_day(context)
        day = partition.isoformat()
        ckpt = upstream_metadata(context, ckpt_key, day)
        days = win.Window(partition, (), (), win.held_out_days(spec, partition))
        days, records = feature_window(context, spec, days, "test")
        where = f"model {spec.name}, partition {day}"
        client = tracking.client()
        try:
            report = rep.evaluate(spec, day, ckpt, [feature_ref(d, records[d]) for d in days.test_days], client,
                                  days.skipped_json())
        except rep.EvaluationError as exc:
            raise dg.Failure(description=f"{where}: {exc}", allow_retries=False) from None
        gate = report["gate"]
        # The MLflow run of this training: found by the checkpoint's sha256 (re-runs reuse it).
        experiment_id = tracking.experiment_id(spec.name)
        from ml_assets.registry import training_run

        run_id = training_run(client, experiment_id, f"{spec.name}-{day}", ckpt["checkpoint_sha256"], {
            "dagster_run_id": context.run_id, "dagster_run_url": dagster_run_url(context.run_id),
            "partition": day, "dagster/partition": day, "code_version": package_code_version()})
        with tempfile.TemporaryDirectory(prefix="ml_assets-evaluation-") as tmp:
            plots = rep.write_plots(spec, report, Path(tmp) / "plots")  # takes the predictions out
            report_bytes = json.dumps(report, indent=1, sort_keys=True).encode()
            ref = artifacts.put(f"{spec.name}/evaluation/date={day}", report_bytes, ".json")
            client.log_artifacts(run_id, str(Path(tmp) / "plots"), "evaluation/plots")
            (Path(tmp) / "evaluation_report.json").write_bytes(report_bytes)
            client.log_artifact(run_id, str(Path(tmp) / "evaluation_report.json"), "evaluation")
        rep.log_metrics(client, run_id, report)
        plot_urls = {name: tracking.artifact_url(run_id, f"evaluation/plots/{name}") for name in plots}
        context.log.info(f"evaluation_report {day}: " + rep.one_line(report))
        log = context.log.info if gate["passed"] else context.log.error
        log(f"{GATE} {'passed' if gate['passed'] else 'FAILED'} for {where}: {gate['reason']}")
        return dg.MaterializeResult(
            metadata=rep.metadata(spec, report, ref, run_id, tracking.run_url(experiment_id, run_id), plot_urls),
            check_results=[dg.AssetCheckResult(
                check_name=GATE, passed=bool(gate["passed"]), severity=dg.AssetCheckSeverity.ERROR,
                description=f"{where}: {gate['reason']}",
                metadata={
                    "decision": gate["kind"], "reason": gate["reason"],
                    "champion_version": (report["champion"] or {}).get("version") or dg.MetadataValue.null(),
                    "clauses": dg.MetadataValue.json(gate["clauses"]),
                    "policy": dg.MetadataValue.json(policy.model_dump(mode="json")),
                },
            )],
        )

    return evaluation_report
