import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from ml_assets.defs.common import (
    asset_key,
    code_version,
    dagster_run_url,
    daily_partitions,
    package_code_version,
    partition_day,
    upstream_metadata,
)
from ml_assets.resources import ArtifactStoreResource, MlflowTrackingResource
from ml_assets.spec import ModelSpec
from ml_assets.storage import read_verified

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

CHALLENGER = "challenger"


def _existing_version(client: "MlflowClient", name: str, checkpoint_sha: str):
    found = client.search_model_versions(f"name='{name}' and tags.checkpoint_sha256='{checkpoint_sha}'")
    return found[0] if found else None


def _ensure_registered_model(client: "MlflowClient", spec: ModelSpec) -> None:
    if not client.search_registered_models(filter_string=f"name='{spec.name}'"):
        client.create_registered_model(spec.name, description=spec.description, tags={"owner": spec.owner})


def move_challenger(client: "MlflowClient", name: str, version: str, partition: str) -> bool:
    """Point @challenger at this version unless it already names a newer partition's model.

    Re-running an old partition must not push a newer challenger aside.
    """
    from mlflow.exceptions import MlflowException

    try:
        current = client.get_model_version_by_alias(name, CHALLENGER)
    except MlflowException:
        current = None
    newer = current is not None and current.tags.get("partition", "") > partition
    if newer and str(current.version) != str(version):
        return False
    client.set_registered_model_alias(name, CHALLENGER, str(version))
    return True


def build_registered_model(spec: ModelSpec) -> dg.AssetsDefinition:
    keys = {stage: asset_key(spec, stage) for stage in ("validated_snapshot", "trained_checkpoint", "evaluation_report")}
    version = code_version(spec, ("name", "training", "evaluation"))

    @dg.asset(
        key=asset_key(spec, "registered_model"),
        deps=[keys["trained_checkpoint"], keys["evaluation_report"]],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"mlflow"},
        code_version=version,
        description=(f"An MLflow model version of {spec.name} (alias '{CHALLENGER}'), tagged with the data commit, "
                     "Dagster run and code version it came from; one version per trained checkpoint."),
    )
    def registered_model(
        context: dg.AssetExecutionContext, tracking: MlflowTrackingResource, artifacts: ArtifactStoreResource
    ) -> dg.MaterializeResult:
        day = partition_day(context).isoformat()
        ckpt = upstream_metadata(context, keys["trained_checkpoint"], day)
        report = upstream_metadata(context, keys["evaluation_report"], day)
        client = tracking.client()
        experiment_id = tracking.experiment_id(spec.name)
        _ensure_registered_model(client, spec)
        sha = ckpt["checkpoint_sha256"]
        data_commits = ckpt["data_commits"]
        tags = {
            "data_commit": data_commits[max(data_commits)],  # main commit of the newest training day
            "data_commits": json.dumps(data_commits, sort_keys=True),
            "test_data_commit": report["test_data_commit"],
            "dagster_run_id": context.run_id, "dagster_run_url": dagster_run_url(context.run_id),
            "partition": day, "code_version": package_code_version(),
            "checkpoint_sha256": sha, "checkpoint_uri": str(ckpt["checkpoint_uri"]),
            "feature_state_sha256": ckpt["feature_state_sha256"],
        }
        existing = _existing_version(client, spec.name, sha)
        if existing is None:
            run = client.create_run(experiment_id, run_name=f"{spec.name}-{day}", tags={
                **tags, "mlflow.source.name": "ml_assets", "dagster/partition": day})
            run_id = run.info.run_id
            for name, value in ckpt["training_config"].items():
                if not isinstance(value, list | dict):
                    client.log_param(run_id, name, value)
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            epochs = [Metric(metric, entry[metric], now, entry["epoch"])
                      for entry in ckpt["history"] for metric in ("train_loss", "val_loss")]
            # The trainer's progress reports (rank 0, every report_every_steps) as step metrics.
            steps = [Metric(name, float(entry[key]), int(entry["time"] * 1000), int(entry["step"]))
                     for entry in ckpt.get("progress", []) for name, key in
                     (("step_loss", "loss"), ("samples_per_s", "samples_per_s"), ("learning_rate", "lr"))]
            for start in range(0, len(epochs + steps), 1000):  # MLflow's batch limit
                client.log_batch(run_id, metrics=(epochs + steps)[start:start + 1000])
            for name in ("samples_per_s", "data_wait_pct", "checkpoint_stall_s", "cpu_hours", "gpu_hours"):
                if name in ckpt:
                    client.log_metric(run_id, f"training_{name}", float(ckpt[name]))
            for name in ("roc_auc", "pr_auc", "log_loss", "rmse", "mae", "r2"):
                if name in report:
                    client.log_metric(run_id, f"test_{name}", float(report[name]))
            with tempfile.TemporaryDirectory(prefix="ml_assets-register-") as tmp:
                model_dir = Path(tmp) / "model"
                model_dir.mkdir()
                base = str(ckpt["checkpoint_uri"]).rsplit("/", 1)[0]
                for name, file_sha in (("model.safetensors", sha), ("meta.json", ckpt["meta_sha256"]),
                                       ("feature_state.json", ckpt["feature_state_sha256"])):
                    (model_dir / name).write_bytes(read_verified(f"{base}/{name}", file_sha))
                client.log_artifacts(run_id, str(model_dir), "model")
                report_path = Path(tmp) / "evaluation_report.json"
                report_path.write_bytes(artifacts.get(str(report["report_uri"]), report["report_sha256"]))
                client.log_artifact(run_id, str(report_path), "evaluation")
            client.set_terminated(run_id)
            model_version = client.create_model_version(
                spec.name, source=f"{client.get_run(run_id).info.artifact_uri}/model", run_id=run_id, tags=tags)
        else:
            run_id, model_version, tags = existing.run_id, existing, dict(existing.tags)
            context.log.info(f"checkpoint {sha[:12]} is already version {existing.version} (same weights, "
                             "byte for byte); not registering again")
        moved = move_challenger(client, spec.name, str(model_version.version), day)
        context.log.info(f"registered_model {day}: {spec.name} version {model_version.version}"
                         + (f" (@{CHALLENGER})" if moved else f"; @{CHALLENGER} stays on a newer partition's model"))
        return dg.MaterializeResult(
            metadata={
                "model_name": spec.name, "model_version": str(model_version.version),
                "alias": CHALLENGER if moved else dg.MetadataValue.null(),
                "mlflow_run_id": run_id, "mlflow_run_url": dg.MetadataValue.url(tracking.run_url(experiment_id, run_id)),
                "mlflow_model_url": dg.MetadataValue.url(tracking.model_url(spec.name, str(model_version.version))),
                "tags": dg.MetadataValue.json(tags),
            }
        )

    return registered_model
