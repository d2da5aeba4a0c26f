import json
import tempfile
import time
from pathlib import Path

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
from ml_assets.registry import (
    CHALLENGER,
    class_tags,
    ensure_registered_model,
    move_challenger,
    training_run,
    version_of_checkpoint,
)
from ml_assets.resources import ArtifactStoreResource, MlflowTrackingResource
from ml_assets.spec import ModelSpec
from ml_assets.storage import read_verified

__all__ = ["CHALLENGER", "build_registered_model", "move_challenger"]


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
        if not report["gate_passed"]:
            # The blocking gate stops this asset in the run that evaluated; this covers a later run
            # that selects registered_model alone.
            raise dg.Failure(description=f"model {spec.name}, partition {day}: the evaluation's promotion gate "
                                         f"failed ({report['gate_reason']}); not registering", allow_retries=False)
        ensure_registered_model(client, spec.name, spec.description, spec.owner)
        sha = ckpt["checkpoint_sha256"]
        data_commits = ckpt["data_commits"]
        tags = {
            "data_commit": data_commits[max(data_commits)],  # main commit of the newest training day
            "data_commits": json.dumps(data_commits, sort_keys=True),
            "test_data_commit": report["test_data_commit"],
            "test_days": json.dumps(report.get("test_days") or []),
            # Window and test days the spec let the partition go without (training.missing_days: skip).
            "skipped_days": json.dumps(report.get("skipped_days") or {}, sort_keys=True),
            "dagster_run_id": context.run_id, "dagster_run_url": dagster_run_url(context.run_id),
            "partition": day, "code_version": package_code_version(),
            "checkpoint_sha256": sha, "checkpoint_uri": str(ckpt["checkpoint_uri"]),
            "feature_state_sha256": ckpt["feature_state_sha256"], "feature_state_uri": str(ckpt["feature_state_uri"]),
            "world_size": str(ckpt.get("world_size", "")), "seed": str(spec.training.seed),
            "torch_version": str(ckpt.get("torch_version", "")),
            # Where the hyperparameters came from: the spec, or a tuning study's best trial.
            "hyperparameters_source": str((ckpt.get("hyperparameters") or {}).get("source", "spec"))[:4000],
            **class_tags(spec),
        }
        gate = report_tags(report, spec.promotion.primary_metric)
        run_id = training_run(client, experiment_id, f"{spec.name}-{day}", sha, {
            **tags, "dagster/partition": day})
        existing = version_of_checkpoint(client, spec.name, sha)
        if existing is None:
            _log_training(client, run_id, ckpt, tags)
            with tempfile.TemporaryDirectory(prefix="ml_assets-register-") as tmp:
                base = str(ckpt["checkpoint_uri"]).rsplit("/", 1)[0]
                files = {name: read_verified(f"{base}/{name}", file_sha) for name, file_sha in (
                    ("model.safetensors", sha), ("meta.json", ckpt["meta_sha256"]),
                    ("feature_state.json", ckpt["feature_state_sha256"]))}
                spec_json = json.dumps(spec.model_dump(mode="json", by_alias=True), sort_keys=True).encode()
                from ml_assets.serving import pyfunc

                # Pickle-free: MLflow "models from code"; weights in safetensors, state and spec in JSON.
                client.log_artifacts(run_id, str(pyfunc.save(Path(tmp) / "model", files, spec_json)), "model")
                config = Path(tmp) / "train_config.json"
                config.write_text(json.dumps(ckpt["training_config"], indent=1, sort_keys=True))
                client.log_artifact(run_id, str(config), "training")
            client.set_terminated(run_id)
            model_version = client.create_model_version(
                spec.name, source=f"{client.get_run(run_id).info.artifact_uri}/model", run_id=run_id,
                tags={**tags, **gate})
        else:
            model_version = existing
            # The latest evaluation of these weights (e.g. against a newer champion) is the evidence.
            for name, value in gate.items():
                client.set_model_version_tag(spec.name, str(existing.version), name, value)
            tags = {**dict(existing.tags), **gate}
            context.log.info(f"checkpoint {sha[:12]} is already version {existing.version} (same weights, "
                             "byte for byte); not registering again, gate tags refreshed")
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


def report_tags(report: dict, primary: str) -> dict[str, str]:
    """What the sensor and the promotion read: the gate's decision and the evidence behind it."""
    return {
        "gate": "passed" if report["gate_passed"] else "failed",
        "gate_reason": str(report["gate_reason"])[:4000],
        "gate_champion_version": str(report.get("champion_version") or "none"),
        "decision_threshold": str(report.get("decision_threshold") or ""),
        "evaluation_report_uri": str(report["report_uri"]), "evaluation_report_sha256": report["report_sha256"],
        "primary_metric": primary, f"test_{primary}": str(report[primary]),
    }


def _log_training(client, run_id: str, ckpt: dict, tags: dict[str, str]) -> None:
    """Hyperparameters, the loss curves and the trainer's progress reports as MLflow run data."""
    from mlflow.entities import Metric, Param, RunTag

    params = [Param(name, str(value)[:6000]) for name, value in sorted(ckpt["training_config"].items())
              if not isinstance(value, list | dict)]
    now = int(time.time() * 1000)
    epochs = [Metric(metric, entry[metric], now, entry["epoch"])
              for entry in ckpt["history"] for metric in ("train_loss", "val_loss")]
    # The trainer's progress reports (rank 0, every report_every_steps) as step metrics.
    steps = [Metric(name, float(entry[key]), int(entry["time"] * 1000), int(entry["step"]))
             for entry in ckpt.get("progress", []) for name, key in
             (("step_loss", "loss"), ("samples_per_s", "samples_per_s"), ("learning_rate", "lr"))]
    totals = [Metric(f"training_{name}", float(ckpt[name]), now, 0)
              for name in ("samples_per_s", "data_wait_pct", "checkpoint_stall_s", "cpu_hours", "gpu_hours")
              if name in ckpt]
    metrics = epochs + steps + totals
    client.log_batch(run_id, params=params[:100], tags=[RunTag(k, v) for k, v in sorted(tags.items())])
    for start in range(100, len(params), 100):  # MLflow's batch limits: 100 params, 1000 metrics
        client.log_batch(run_id, params=params[start:start + 100])
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start:start + 1000])
