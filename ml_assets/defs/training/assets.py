import json
import tempfile
import warnings
from pathlib import Path

import dagster as dg

from ml_assets.defs.common import (
    asset_key,
    code_version,
    daily_partitions,
    partition_day,
    upstream_metadata,
)
from ml_assets.defs.training import window
from ml_assets.features import state as feature_state
from ml_assets.features.build import feature_columns
from ml_assets.resources import ArtifactStoreResource, CheckpointStoreResource, TorchrunLauncher
from ml_assets.spec import ModelSpec
from ml_assets.trainer.config import DataRef, TrainConfig


def build_trained_checkpoint(spec: ModelSpec) -> dg.AssetsDefinition:
    features_key = asset_key(spec, "features")
    width = spec.training.window_days
    with warnings.catch_warnings():  # allow_nonexistent_upstream_partitions is marked beta
        warnings.simplefilter("ignore", dg.BetaWarning)
        window_mapping = dg.TimeWindowPartitionMapping(
            start_offset=-width, end_offset=-1, allow_nonexistent_upstream_partitions=True
        )
    version = code_version(spec, ("training", "features", "target"), "ml_assets.trainer.train", "ml_assets.trainer.model",
                           "ml_assets.trainer.config", "ml_assets.trainer.data", "ml_assets.features.state")

    @dg.asset(
        key=asset_key(spec, "trained_checkpoint"),
        deps=[dg.AssetDep(features_key, partition_mapping=window_mapping)],
        group_name=spec.name,
        partitions_def=daily_partitions(spec),
        kinds={"pytorch"},
        code_version=version,
        tags={"ml_assets/stage": "training"},
        description=(f"{spec.name} weights trained with torchrun DDP on the {width - 1} feature days before the "
                     "partition (validated on the last of them); sha256-pinned, with the fitted feature state."),
    )
    def trained_checkpoint(
        context: dg.AssetExecutionContext, artifacts: ArtifactStoreResource,
        checkpoints: CheckpointStoreResource, launcher: TorchrunLauncher,
    ) -> dg.MaterializeResult:
        day = partition_day(context)
        try:
            win = window.training_window(spec, day)
        except window.WindowError as exc:
            raise dg.Failure(description=str(exc)) from None
        records = {d: upstream_metadata(context, features_key, d.isoformat()) for d in [*win.train_days, win.val_day]}
        refs = {d: DataRef(uri=str(m["uri"]), sha256=m["sha256"], day=d.isoformat()) for d, m in records.items()}
        train_refs = [refs[d] for d in win.train_days]
        from ml_assets.trainer.data import read_frame  # torch: imported when training runs

        # Fitted only on the training days: validation and test rows never shape the transform.
        state = feature_state.fit_state(read_frame(train_refs), spec.features, spec.target.name, spec.target.task)
        state_ref = artifacts.put(f"{spec.name}/feature_state/date={day.isoformat()}", feature_state.state_bytes(state), ".json")
        training = spec.training
        cfg = TrainConfig(
            model=spec.name, task=spec.target.task, train_files=train_refs, val_files=[refs[win.val_day]],
            feature_state=state_ref.as_data_ref(), epochs=training.epochs, batch_size=training.batch_size,
            learning_rate=training.learning_rate, weight_decay=training.weight_decay,
            hidden_sizes=list(training.hidden_sizes), dropout=training.dropout, seed=training.seed,
            output_dir=f"{checkpoints.root.rstrip('/')}/{spec.name}/date={day.isoformat()}/{context.run_id}",
        )
        with tempfile.TemporaryDirectory(prefix="ml_assets-train-") as tmp:
            config_path = Path(tmp) / "train_config.json"
            config_path.write_text(cfg.to_json())
            context.log.info(f"trained_checkpoint {day}: torchrun with {training.processes_per_node} processes on "
                             f"{win.train_days[0]}..{win.train_days[-1]}, validating on {win.val_day}")
            reported = launcher.run(context, str(config_path), training.processes_per_node)
        return dg.MaterializeResult(
            data_version=reported.data_version,
            metadata={
                **(reported.metadata or {}),
                "repository": spec.repository,
                "train_days": f"{win.train_days[0]}..{win.train_days[-1]}", "val_day": win.val_day.isoformat(),
                "data_commits": dg.MetadataValue.json({d.isoformat(): m["data_commit"] for d, m in records.items()}),
                "feature_files": dg.MetadataValue.json([r.__dict__ for r in refs.values()]),
                "feature_state_uri": dg.MetadataValue.path(state_ref.uri), "feature_state_sha256": state_ref.sha256,
                "features": dg.MetadataValue.json(feature_columns(spec)),
                "training_config": dg.MetadataValue.json(json.loads(cfg.to_json())),
            },
        )

    return trained_checkpoint

