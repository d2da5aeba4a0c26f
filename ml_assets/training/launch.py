"""One training of a partition's window: its config, the torchrun launch, and what the launch's
outcome means (a preemption to retry, a held lease, a crash) or the checkpoint record it made."""

from __future__ import annotations

import dataclasses
import json
import signal
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from ml_assets.features.build import feature_columns
from ml_assets.features.record import FeaturesRecord
from ml_assets.layout import Layout
from ml_assets.records.base import unwrap
from ml_assets.step import Step
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.result import TrainingResult
from ml_assets.training.launcher import TorchrunLauncher, TrainingOutcome, TrainingPreempted
from ml_assets.training.preflight import check_model
from ml_assets.training.prepare import Prepared
from ml_assets.training.record import CheckpointRecord
from ml_assets.training.trainer_config import train_config
from ml_assets.training.tuned import Tuned
from ml_assets.training.window import Window

if TYPE_CHECKING:
    from ml_assets.training.warm import Plan


def configure(step: Step, prepared: Prepared, checkpoint_root: str, tuned: Tuned | None,
              fine_tune: Callable[[TrainConfig], dict[str, Any]] | None = None) -> TrainConfig:
    """The trainer's config; checkpoints keyed by the config's fingerprint (a re-run resumes).
    ``fine_tune``: the fields a fine-tune sets over the config the spec's and the tuned values make
    (its epochs or rounds, learning rate and the parent's weights)."""
    layout = Layout.of(step.spec)
    try:  # a factory's code is pinned as the config is made, then tried before anything is launched
        cfg = train_config(step.spec, prepared.train, prepared.val, prepared.state.as_data_ref(),
                           layout.output_dir(checkpoint_root, step.partition, step.run_id, uuid.uuid4().hex[:8]),
                           tuned.params if tuned else {}, owner=f"Dagster run {step.run_id}",
                           data_mode=prepared.data.mode)
        if fine_tune:
            cfg = dataclasses.replace(cfg, **fine_tune(cfg))
        check_model(cfg)
    except ValueError as exc:
        raise step.failure(exc) from None
    return dataclasses.replace(cfg, checkpoint_dir=layout.checkpoint_dir(checkpoint_root, step.partition,
                                                                         cfg.fingerprint()))


def launch(context: dg.AssetExecutionContext, step: Step, launcher: TorchrunLauncher, cfg: TrainConfig,
           window: Window) -> tuple[TrainingResult, list[dict[str, Any]]]:
    """Run torchrun; the trainer's result and progress reports, or the failure that says what happened."""
    spec, training = step.spec, step.spec.training
    with tempfile.TemporaryDirectory(prefix="ml_assets-train-") as tmp:
        config_path = Path(tmp) / "train_config.json"
        config_path.write_text(cfg.to_json())
        nodes = f" on each of {training.nodes} nodes" if training.nodes > 1 and launcher.spreads_nodes else ""
        days = [ref.day for ref in cfg.train_files if ref.day]
        replay = " and a replay sample of the older days" if len(days) < len(cfg.train_files) else ""
        what = window.describe() if cfg.init_weights is None else (
            f"fine-tuning on {', '.join(days)}{replay}, validating on {', '.join(r.day for r in cfg.val_files)}")
        context.log.info(f"trained_checkpoint {step.partition}: torchrun with {launcher.processes(spec)} processes"
                         f"{nodes}: {what}; data {cfg.data_mode}; checkpoints in {cfg.checkpoint_root}")
        outcome = launcher.train(context, spec, str(config_path), cfg.output_dir)
    check_outcome(step, outcome, cfg)
    return TrainingResult(**{k: unwrap(v) for k, v in outcome.result.metadata.items()}), outcome.progress


def check_outcome(step: Step, outcome: TrainingOutcome, cfg: TrainConfig) -> None:
    # torchrun killed by a signal it cannot handle (the OOM killer, kill -9) is not a preemption,
    # even when its orphaned ranks checkpointed and said "preempted" before exiting: it fails.
    if outcome.preempted is not None and outcome.returncode >= 0:
        raise TrainingPreempted(
            f"{step.where}: training was stopped ({outcome.preempted.get('signal') or 'SIGTERM'}) and checkpointed "
            f"at step {outcome.preempted.get('step')}; the retry resumes from there")
    if outcome.lease_held is not None:
        raise step.failure(outcome.lease_held["message"])
    if outcome.refused is not None:
        raise step.failure(outcome.refused["message"])
    if outcome.returncode != 0 or outcome.result is None:
        if outcome.returncode < 0:  # torchrun itself was killed (the OOM killer, kill -9)
            saved = (f"its ranks checkpointed at step {outcome.preempted.get('step')} and exited"
                     if outcome.preempted is not None else "its ranks checkpointed if they could and exited")
            why = (f"torchrun was killed by {signal.Signals(-outcome.returncode).name}; {saved} (docs/training.md), "
                   "and running the partition again resumes")
        else:
            why = (f"the trainer exited with code {outcome.returncode} (torchrun restarted crashed workers up to "
                   f"{step.spec.training.max_restarts} times); its log above says why")
        raise step.failure(f"{why}. Checkpoints stay in {cfg.checkpoint_root}")


def checkpoint_record(step: Step, result: TrainingResult, window: Window, records: dict[str, FeaturesRecord],
                      prepared: Prepared, cfg: TrainConfig, tuned: Tuned | None,
                      progress: list[dict[str, Any]], plan: Plan | None = None) -> CheckpointRecord:
    return CheckpointRecord(
        result=result, repository=step.spec.repository,
        train_days=[d.isoformat() for d in window.train_days], val_days=[d.isoformat() for d in window.val_days],
        skipped_days=window.skipped_json(), data_commits={d: r.data_commit for d, r in records.items()},
        feature_files=tuple(r.ref(d) for d, r in records.items()), feature_state_uri=prepared.state.uri,
        features=feature_columns(step.spec), training_config=json.loads(cfg.to_json()),
        hyperparameters=tuned.as_metadata() if tuned else {"source": "the spec's training section"},
        data=prepared.data.as_metadata(),
        progress=[{k: m[k] for k in ("step", "loss", "samples_per_s", "lr", "time")} for m in progress],
        decision=plan.decision.as_metadata() if plan else {}, inputs_sha256=plan.inputs_sha256 if plan else "",
        warm_start_key=plan.key if plan else {})


def skip_metadata(plan: Plan) -> dict[str, Any]:
    """What a skipped partition's observation says: the decision, the version holding the result,
    and a cost of nothing."""
    return {"training_decision": plan.decision.kind, "training_decision_reason": plan.decision.reason,
            "decision": dg.MetadataValue.json(plan.decision.as_metadata()),
            "holder_version": plan.decision.holder, "inputs_sha256": plan.inputs_sha256,
            "wall_seconds": 0.0, "cpu_rank_seconds": 0.0, "gpu_rank_seconds": 0.0, "samples_processed": 0}
