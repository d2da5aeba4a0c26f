"""An evaluation made durable: the report stored content-addressed and in the training's MLflow
run (with its plots and metrics), and the record the evaluation_report asset returns."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ml_assets.evaluation import report as rep
from ml_assets.evaluation.document import EvaluationReport
from ml_assets.evaluation.record import EvaluationRecord
from ml_assets.evaluation.summary import plots_markdown
from ml_assets.layout import MLFLOW_EVALUATION, MLFLOW_PLOTS, Layout
from ml_assets.resources import ArtifactStoreResource, MlflowTrackingResource
from ml_assets.step import Step


def store_evaluation(step: Step, report: EvaluationReport, predictions: rep.Predictions, sha: str,
                     artifacts: ArtifactStoreResource, tracking: MlflowTrackingResource) -> EvaluationRecord:
    """``sha``: the evaluated checkpoint's sha256, which finds its MLflow run (re-runs reuse it)."""
    from ml_assets.registry.versions import training_run

    spec, client = step.spec, tracking.client()
    experiment_id = tracking.experiment_id(spec.name)
    run_id = training_run(client, experiment_id, f"{spec.name}-{step.partition}", sha, {
        **step.provenance().to_tags(), "dagster/partition": step.partition})
    with tempfile.TemporaryDirectory(prefix="ml_assets-evaluation-") as tmp:
        plots = rep.write_plots(spec, report, predictions, Path(tmp) / "plots")
        inline = plots_markdown({name: (Path(tmp) / "plots" / name).read_bytes() for name in plots})
        report_bytes = report.to_json()
        ref = artifacts.put(Layout.of(spec).evaluation_prefix(step.partition), report_bytes, ".json")
        client.log_artifacts(run_id, str(Path(tmp) / "plots"), MLFLOW_PLOTS)
        (Path(tmp) / "evaluation_report.json").write_bytes(report_bytes)
        client.log_artifact(run_id, str(Path(tmp) / "evaluation_report.json"), MLFLOW_EVALUATION)
    rep.log_metrics(client, run_id, report)
    plot_urls = {name: tracking.artifact_url(run_id, f"{MLFLOW_PLOTS}/{name}") for name in plots}
    return rep.evaluation_record(spec, report, ref, run_id, tracking.run_url(experiment_id, run_id), plot_urls,
                                 inline)
