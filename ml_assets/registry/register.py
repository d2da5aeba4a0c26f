"""Registering a trained checkpoint: one MLflow model version per checkpoint (the same weights are
never registered twice), tagged with everything it links to; the evaluation's gate as tags."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from ml_assets.evaluation.record import EvaluationRecord
from ml_assets.layout import (
    DECISION_FILE,
    FEATURE_STATE_FILE,
    META_FILE,
    MLFLOW_MODEL,
    MLFLOW_TRAINING,
    sibling,
    weights_file,
)
from ml_assets.registry.record import GateTags, RegisteredRecord, VersionTags
from ml_assets.registry.versions import (
    CHALLENGER,
    RegistryError,
    ensure_registered_model,
    move_challenger,
    training_run,
    version_of_checkpoint,
)
from ml_assets.resources import MlflowTrackingResource
from ml_assets.step import Step
from ml_assets.storage import read_verified
from ml_assets.training.record import CheckpointRecord


def version_tags(step: Step, ckpt: CheckpointRecord, evaluation: EvaluationRecord) -> VersionTags:
    spec, result = step.spec, ckpt.result
    return VersionTags(
        data_commit=ckpt.data_commit, data_commits=ckpt.data_commits, test_data_commit=evaluation.test_data_commit,
        test_days=evaluation.test_days, skipped_days=evaluation.skipped_days,
        dagster_run_id=step.run_id, dagster_run_url=step.run_url, partition=step.partition,
        code_version=step.provenance().code_version, checkpoint_sha256=result.checkpoint_sha256,
        checkpoint_uri=str(result.checkpoint_uri), feature_state_sha256=result.feature_state_sha256,
        feature_state_uri=str(ckpt.feature_state_uri), world_size=str(result.world_size), seed=str(spec.training.seed),
        torch_version=result.torch_version,
        hyperparameters_source=str(ckpt.hyperparameters.get("source", "spec"))[:4000],
        task=spec.target.task if spec.target.classes else "", classes=list(spec.target.classes or []),
        **factory_tags(ckpt), **decision_tags(step, ckpt))


def decision_tags(step: Step, ckpt: CheckpointRecord) -> dict[str, object]:
    """How the version was trained (full or fine-tuned, and why) and the chain it belongs to."""
    parent = ckpt.parent
    return {"training_decision": ckpt.decision_kind,
            "training_decision_reason": str(ckpt.decision.get("reason", ""))[:4000],
            "parent_version": str(parent.get("version", "")), "parent_checkpoint_sha256": parent.get("weights_sha256", ""),
            "chain_start_partition": ckpt.chain_start(step.partition), "inputs_sha256": ckpt.inputs_sha256,
            "warm_start_key": dict(ckpt.warm_start_key)}


def factory_tags(ckpt: CheckpointRecord) -> dict[str, str]:
    """A factory's import path and code pin, as trained (from the checkpoint's training config)."""
    from ml_assets.trainer.config import TrainConfig

    cfg = TrainConfig.from_dict(ckpt.training_config)
    if not cfg.model_factory:
        return {}
    return {"model_factory": cfg.model_factory, "model_code_sha256": cfg.model_code["sha256"]}


def gate_tags(evaluation: EvaluationRecord) -> GateTags:
    """What the sensor and the promotion read: the gate's decision and the evidence behind it."""
    primary = evaluation.primary_metric
    return GateTags(gate="passed" if evaluation.gate_passed else "failed", gate_reason=evaluation.gate_reason[:4000],
                    gate_champion_version=evaluation.champion_version or "none",
                    decision_threshold=str(evaluation.decision_threshold or ""),
                    evaluation_report_uri=str(evaluation.report_uri),
                    evaluation_report_sha256=evaluation.report_sha256, primary_metric=primary,
                    primary_value=str(evaluation.metrics[primary]))


def register(step: Step, ckpt: CheckpointRecord, evaluation: EvaluationRecord, tracking: MlflowTrackingResource,
             log) -> RegisteredRecord:
    spec, client, sha = step.spec, tracking.client(), ckpt.result.checkpoint_sha256
    experiment_id = tracking.experiment_id(spec.name)
    ensure_registered_model(client, spec.name, spec.description, spec.owner, spec.team)
    tags, gate = version_tags(step, ckpt, evaluation).to_tags(), gate_tags(evaluation).to_tags()
    run_id = training_run(client, experiment_id, f"{spec.name}-{step.partition}", sha,
                          {**tags, "dagster/partition": step.partition})
    existing = version_of_checkpoint(client, spec.name, sha)
    if existing is None:
        _log_training(client, run_id, ckpt, tags)
        _log_model(client, run_id, step, ckpt)
        client.set_terminated(run_id)
        model_version = client.create_model_version(
            spec.name, source=f"{client.get_run(run_id).info.artifact_uri}/{MLFLOW_MODEL}", run_id=run_id,
            tags={**tags, **gate})
    else:
        model_version = existing
        # The latest evaluation of these weights (e.g. against a newer champion) is the evidence.
        for name, value in gate.items():
            client.set_model_version_tag(spec.name, str(existing.version), name, value)
        tags = {**dict(existing.tags), **gate}
        log(f"checkpoint {sha[:12]} is already version {existing.version} (same weights, byte for byte); "
            "not registering again, gate tags refreshed")
    moved = move_challenger(client, spec.name, str(model_version.version), step.partition)
    log(f"registered_model {step.partition}: {spec.name} version {model_version.version}"
        + (f" (@{CHALLENGER})" if moved else f"; @{CHALLENGER} stays on a newer partition's model"))
    return RegisteredRecord(
        model_name=spec.name, model_version=str(model_version.version), alias=CHALLENGER if moved else None,
        mlflow_run_id=run_id, mlflow_run_url=tracking.run_url(experiment_id, run_id),
        mlflow_model_url=tracking.model_url(spec.name, str(model_version.version)), tags=tags)


def _log_model(client, run_id: str, step: Step, ckpt: CheckpointRecord) -> None:
    """The pyfunc model (pickle-free: MLflow "models from code"; weights in safetensors or a booster's
    UBJSON, state and spec in JSON) and the training config, verified against the checkpoint's sha256s."""
    from ml_assets.serving import pyfunc

    with tempfile.TemporaryDirectory(prefix="ml_assets-register-") as tmp:
        files = exported_files(ckpt)
        spec_json = json.dumps(step.spec.model_dump(mode="json", by_alias=True), sort_keys=True).encode()
        example = pyfunc.input_example(step.spec, _validation_rows(ckpt))
        client.log_artifacts(run_id, str(pyfunc.save(Path(tmp) / "model", files, spec_json, example)), MLFLOW_MODEL)
        config = Path(tmp) / "train_config.json"
        config.write_text(json.dumps(ckpt.training_config, indent=1, sort_keys=True))
        client.log_artifact(run_id, str(config), MLFLOW_TRAINING)
        # Why it was trained this way, the parent, and the replay sample's source days (lineage reads it).
        decision = Path(tmp) / DECISION_FILE
        decision.write_text(json.dumps(ckpt.decision or {"kind": "full"}, indent=1, sort_keys=True))
        client.log_artifact(run_id, str(decision), MLFLOW_TRAINING)


def exported_files(ckpt: CheckpointRecord) -> dict[str, bytes]:
    """The trainer's export, each file read against the sha256 the trainer reported: meta.json first,
    since it names the weights file (``model.safetensors``, or ``model.ubj`` for a booster)."""
    result = ckpt.result
    meta = read_verified(sibling(str(result.checkpoint_uri), META_FILE), result.meta_sha256)
    weights = weights_file(json.loads(meta))
    if str(result.checkpoint_uri).rsplit("/", 1)[-1] != weights:
        raise RegistryError(f"{result.checkpoint_uri}: the checkpoint's meta.json names its weights {weights}")
    return {weights: read_verified(str(result.checkpoint_uri), result.checkpoint_sha256), META_FILE: meta,
            FEATURE_STATE_FILE: read_verified(sibling(str(result.checkpoint_uri), FEATURE_STATE_FILE),
                                              result.feature_state_sha256)}


def _validation_rows(ckpt: CheckpointRecord):
    """The first validation day's feature rows the model trained with (verified), for its input example."""
    from ml_assets.parquet import read_parquet

    first = ckpt.training_config["val_files"][0]
    return read_parquet(read_verified(first["uri"], first["sha256"]))


def _log_training(client, run_id: str, ckpt: CheckpointRecord, tags: dict[str, str]) -> None:
    """Hyperparameters, the loss curves and the trainer's progress reports as MLflow run data."""
    from mlflow.entities import Metric, Param, RunTag

    result = ckpt.result
    params = [Param(name, str(value)[:6000]) for name, value in sorted(ckpt.training_config.items())
              if not isinstance(value, list | dict)]
    now = int(time.time() * 1000)
    epochs = [Metric(metric, entry[metric], now, entry["epoch"])
              for entry in result.history for metric in ("train_loss", "val_loss")]
    # The trainer's progress reports (rank 0, every report_every_steps) as step metrics.
    steps = [Metric(name, float(entry[key]), int(entry["time"] * 1000), int(entry["step"]))
             for entry in ckpt.progress for name, key in
             (("step_loss", "loss"), ("samples_per_s", "samples_per_s"), ("learning_rate", "lr"))]
    # What the training cost, whatever its decision (usage sums the same figures from the records).
    totals = [Metric(f"training_{name}", float(getattr(result, name)), now, 0)
              for name in ("samples_per_s", "data_wait_pct", "checkpoint_stall_s", "cpu_hours", "gpu_hours",
                           "wall_seconds", "cpu_rank_seconds", "gpu_rank_seconds", "samples_processed")
              if getattr(result, name) is not None]
    metrics = epochs + steps + totals
    params, tags = _unlogged(client, run_id, params, tags)
    client.log_batch(run_id, params=params[:100], tags=[RunTag(k, v) for k, v in sorted(tags.items())])
    for start in range(100, len(params), 100):  # MLflow's batch limits: 100 params, 1000 metrics
        client.log_batch(run_id, params=params[start:start + 100])
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start:start + 1000])


def _unlogged(client, run_id: str, params: list, tags: dict[str, str]) -> tuple[list, dict[str, str]]:
    """The params the run does not hold yet. A run is found by its weights' sha256: one an attempt
    left before it was killed (params logged, no version made) is this attempt's too, and MLflow
    refuses to change a param. Values that differ (an attempt's own paths) stay as the earlier
    attempt logged them; the tag names them, and train_config.json holds this attempt's."""
    held = client.get_run(run_id).data.params
    differing = sorted(p.key for p in params if p.key in held and held[p.key] != p.value)
    if differing:
        tags = {**tags, "ml_assets.params_from_earlier_attempt": ",".join(differing)[:5000]}
    return [p for p in params if p.key not in held], tags
