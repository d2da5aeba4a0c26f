import dataclasses
import json
import signal
import tempfile
from pathlib import Path

import dagster as dg

from ml_assets.defs.common import (
    GPU_POOL,
    asset_key,
    code_version,
    daily_partitions,
    features_window_mapping,
    partition_day,
)
from ml_assets.defs.training import window
from ml_assets.defs.training.inputs import feature_ref, feature_window
from ml_assets.features import state as feature_state
from ml_assets.features.build import feature_columns
from ml_assets.resources import ArtifactStoreResource, CheckpointStoreResource, TorchrunLauncher
from ml_assets.resources.training import TrainingPreempted
from ml_assets.spec import ModelSpec
from ml_assets.trainer.config import DataRef, TrainConfig


def build_trained_checkpoint(spec: ModelSpec) -> dg.AssetsDefinition:
    features_key = asset_key(spec, "features")
    width, tests = spec.training.window_days, spec.evaluation.test_days
    # The window ends the day before the first test day: D-W-T+1 .. D-T.
    window_mapping = features_window_mapping(-(width + tests - 1), -tests)
    version = code_version(spec, ("training", "features", "target"), "ml_assets.trainer.train",
                           "ml_assets.trainer.runtime", "ml_assets.trainer.model", "ml_assets.trainer.config",
                           "ml_assets.trainer.data", "ml_assets.trainer.checkpoint", "ml_assets.features.state")

    @dg.asset(
        key=asset_key(spec, "trained_checkpoint"),
        # hyperparameters: its latest best trial, when there is one, sets the defaults (lineage edge).
        deps=[dg.AssetDep(features_key, partition_mapping=window_mapping), asset_key(spec, "hyperparameters")],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"pytorch"},
        code_version=version,
        tags={"ml_assets/stage": "training"},
        pool=GPU_POOL,  # the production instance limits how many training steps run at once
        # Only a preemption (checkpoint written, TrainingPreempted) is retried: the retry resumes.
        retry_policy=dg.RetryPolicy(max_retries=spec.training.retries, delay=1) if spec.training.retries else None,
        description=(f"{spec.name} weights trained with torchrun DDP on the {width} feature days before the "
                     f"partition's {tests} test day(s), the last {spec.training.validation_days} of them validating; "
                     "sha256-pinned, with the fitted feature state."),
    )
    def trained_checkpoint(
        context: dg.AssetExecutionContext, artifacts: ArtifactStoreResource,
        checkpoints: CheckpointStoreResource, launcher: TorchrunLauncher,
    ) -> dg.MaterializeResult:
        day = partition_day(context)
        where = f"model {spec.name}, partition {day}"
        try:
            win = window.training_window(spec, day)
        except window.WindowError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        win, records = feature_window(context, spec, win, "fit")
        if win.skipped:
            context.log.warning(f"trained_checkpoint {day}: skipping days without features: {win.skipped_json()}")
        refs = {d: feature_ref(d, m) for d, m in records.items()}
        train_refs, val_refs = [refs[d] for d in win.train_days], [refs[d] for d in win.val_days]
        from ml_assets.trainer.data import read_frame  # torch: imported when training runs

        training = spec.training
        # Fitted only on the training days: validation and test rows never shape the transform.
        try:
            window.check_rows(spec, read_frame(val_refs), "validation days", win.val_days, "training.min_validation_rows",
                       training.min_validation_rows, "training.validation_days", training.validation_days)
            state = feature_state.fit_state(read_frame(train_refs), spec.features, spec.target.name, spec.target.task)
        except ValueError as exc:  # includes a feature file that no longer matches its sha256
            raise dg.Failure(description=f"{where}: {exc}", allow_retries=False) from None
        state_ref = artifacts.put(f"{spec.name}/feature_state/date={day.isoformat()}", feature_state.state_bytes(state), ".json")
        run_dir = f"{checkpoints.root.rstrip('/')}/{spec.name}/date={day.isoformat()}"
        tuned = tuned_parameters(context.instance, spec)
        if tuned and (seen := tuned["last_day"]) >= win.test_days[0].isoformat():
            # A study that validated on this partition's test days chose its parameters on them.
            context.log.warning(f"trained_checkpoint {day}: not applying {tuned['source']}: it validated on days up "
                                f"to {seen}, this partition's test days start on {win.test_days[0]}")
            tuned = None
        cfg = train_config(spec, train_refs, val_refs, state_ref.as_data_ref(),
                           f"{run_dir}/{context.run_id}", (tuned or {}).get("params", {}),
                           owner=f"Dagster run {context.run_id}")
        if tuned:
            context.log.info(f"trained_checkpoint {day}: hyperparameters from {tuned['source']}: {tuned['params']}")
        # Checkpoints are keyed by what decides the weights (data, state, hyperparameters), not by the
        # run: a retry or a re-run of the same training resumes; a changed config starts its own.
        cfg = dataclasses.replace(cfg, checkpoint_dir=f"{run_dir}/train-{cfg.fingerprint()[:16]}")
        with tempfile.TemporaryDirectory(prefix="ml_assets-train-") as tmp:
            config_path = Path(tmp) / "train_config.json"
            config_path.write_text(cfg.to_json())
            nodes = f" on each of {training.nodes} nodes" if training.nodes > 1 and launcher.spreads_nodes else ""
            context.log.info(f"trained_checkpoint {day}: torchrun with {launcher.processes(spec)} processes{nodes}: "
                             f"{win.describe()}; checkpoints in {cfg.checkpoint_root}")
            outcome = launcher.train(context, spec, str(config_path), cfg.output_dir)
        if outcome.preempted is not None:
            step = outcome.preempted.get("step")
            raise TrainingPreempted(
                f"model {spec.name}, partition {day}: training was stopped ({outcome.preempted.get('signal') or 'SIGTERM'}) "
                f"and checkpointed at step {step}; the retry resumes from there")
        if outcome.lease_held is not None:
            raise dg.Failure(description=f"model {spec.name}, partition {day}: {outcome.lease_held['message']}",
                             allow_retries=False)
        if outcome.returncode != 0 or outcome.result is None:
            if outcome.returncode < 0:  # torchrun itself was killed (the OOM killer, kill -9)
                why = (f"torchrun was killed by {signal.Signals(-outcome.returncode).name}; its ranks checkpointed if "
                       "they could and exited (docs/training.md), and running the partition again resumes")
            else:
                why = (f"the trainer exited with code {outcome.returncode} (torchrun restarted crashed workers up to "
                       f"{training.max_restarts} times); its log above says why")
            raise dg.Failure(description=f"model {spec.name}, partition {day}: {why}. Checkpoints stay in "
                                         f"{cfg.checkpoint_root}", allow_retries=False)
        reported = outcome.result
        return dg.MaterializeResult(
            data_version=reported.data_version,
            metadata={
                **(reported.metadata or {}),
                "repository": spec.repository,
                "train_days": dg.MetadataValue.json([d.isoformat() for d in win.train_days]),
                "val_days": dg.MetadataValue.json([d.isoformat() for d in win.val_days]),
                "skipped_days": dg.MetadataValue.json(win.skipped_json()),
                "data_commits": dg.MetadataValue.json({d.isoformat(): m["data_commit"] for d, m in records.items()}),
                "feature_files": dg.MetadataValue.json([r.__dict__ for r in refs.values()]),
                "feature_state_uri": dg.MetadataValue.path(state_ref.uri), "feature_state_sha256": state_ref.sha256,
                "features": dg.MetadataValue.json(feature_columns(spec)),
                "training_config": dg.MetadataValue.json(json.loads(cfg.to_json())),
                "hyperparameters": dg.MetadataValue.json(tuned or {"source": "the spec's training section"}),
                "progress": dg.MetadataValue.json([{k: m[k] for k in ("step", "loss", "samples_per_s", "lr", "time")}
                                                   for m in outcome.progress]),
            },
        )

    return trained_checkpoint



def train_config(spec: ModelSpec, train_refs: list[DataRef], val_refs: list[DataRef], state: DataRef,
                 output_dir: str, overrides: dict | None = None, owner: str = "") -> TrainConfig:
    """The trainer's config from the spec's training section, with tuned values on top."""
    from ml_assets.tuning.space import config_overrides

    training = spec.training
    values = dict(
        model=spec.name, task=spec.target.task, classes=list(spec.target.classes or []),
        train_files=train_refs, val_files=val_refs,
        feature_state=state, output_dir=output_dir,
        family=training.family, epochs=training.epochs, batch_size=training.batch_size,
        grad_accum_steps=training.grad_accum_steps, learning_rate=training.learning_rate,
        weight_decay=training.weight_decay, warmup_steps=training.warmup_steps, min_lr_ratio=training.min_lr_ratio,
        grad_clip_norm=training.grad_clip_norm, hidden_sizes=list(training.hidden_sizes), dropout=training.dropout,
        activation_checkpointing=training.activation_checkpointing, precision=training.precision,
        early_stopping_patience=training.early_stopping.patience,
        early_stopping_min_delta=training.early_stopping.min_delta, seed=training.seed,
        deterministic=training.deterministic, num_workers=training.loader.num_workers,
        pin_memory=training.loader.pin_memory, prefetch_factor=training.loader.prefetch_factor,
        report_every_steps=training.report_every_steps, checkpoint_every_steps=training.checkpoint.every_steps,
        checkpoint_every_seconds=training.checkpoint.every_seconds, keep_last=training.checkpoint.keep_last,
        checkpoint_async=training.checkpoint.async_mode,
        preemption_grace_seconds=training.checkpoint.preemption_grace_seconds,
        orphan_grace_seconds=training.checkpoint.orphan_grace_seconds,
        lease_ttl_seconds=training.checkpoint.lease_ttl_seconds,
        lease_wait_seconds=training.checkpoint.lease_wait_seconds, owner=owner,
    )
    values.update(config_overrides(overrides or {}, list(training.hidden_sizes)))
    return TrainConfig(**values)


def tuned_parameters(instance: dg.DagsterInstance, spec: ModelSpec) -> dict | None:
    """The best parameters of the model's latest tuning study, if it has one and the spec applies it."""
    if not spec.tuning.apply_best:
        return None
    records = instance.fetch_materializations(asset_key(spec, "hyperparameters"), limit=1).records
    if not records or records[0].asset_materialization is None:
        return None
    meta = records[0].asset_materialization.metadata
    if "best_params" not in meta:
        return None
    return {"params": meta["best_params"].value, "source": (
        f"tuning study {meta['study_name'].value} trial {meta['best_trial'].value} "
        f"(best val_loss {meta['best_value'].value:.4f}, Dagster run {records[0].run_id})"),
        "study_name": meta["study_name"].value, "best_trial": meta["best_trial"].value,
        # The newest day the study saw (its validation days are its last).
        "last_day": max(_listed((meta["window"].value or {}).get("validation")) if "window" in meta else [""]),
        "dagster_run_id": records[0].run_id}


def _listed(days: str | list[str] | None) -> list[str]:
    """A study's validation days: a list, or one day as studies recorded it before validation_days."""
    return [days] if isinstance(days, str) else list(days or [""])
