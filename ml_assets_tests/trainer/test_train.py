"""The trainer under real torchrun (2 processes, gloo), on small learnable data."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from ml_assets.features.state import fit_state, state_bytes
from ml_assets.spec import FeaturesSpec
from ml_assets.storage import IntegrityError
from ml_assets.trainer.checkpoint import load_checkpoint
from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets.trainer.data import to_tensors
from ml_assets_tests.helpers import cli_env
from ml_assets_tests.trainer.toy import frame

pytestmark = pytest.mark.torchrun


def _ref(path: Path) -> DataRef:
    return DataRef(uri=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[TrainConfig, Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("train")
    rng = np.random.default_rng(0)
    train, val = frame(rng, 3000), frame(rng, 501)  # an odd count: ranks get unequal shards
    train.write_parquet(root / "train.parquet")
    val.write_parquet(root / "val.parquet")
    state = fit_state(train, FeaturesSpec(numeric=["x", "noise"], categorical=["group"]), "label", "binary_classification")
    (root / "state.json").write_bytes(state_bytes(state))
    cfg = TrainConfig(
        model="toy", task="binary_classification", train_files=[_ref(root / "train.parquet")],
        val_files=[_ref(root / "val.parquet")], feature_state=_ref(root / "state.json"),
        output_dir=str(root / "out"), epochs=4, batch_size=64, learning_rate=0.01, seed=1, precision="fp32",
    )
    (root / "config.json").write_text(cfg.to_json())
    proc = subprocess.run(
        [sys.executable, "-m", "ml_assets.trainer.agent", "--standalone", "--nproc_per_node=2",
         "-m", "ml_assets.trainer", "--config", str(root / "config.json")],
        capture_output=True, text=True, timeout=300, env=cli_env(OMP_NUM_THREADS="1"),
    )
    return cfg, root, proc


def test_torchrun_ddp_trains_and_writes_a_pinned_checkpoint(trained):
    cfg, root, proc = trained
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((root / "out" / "meta.json").read_text())
    assert meta["world_size"] == 2
    assert meta["weights_sha256"] == hashlib.sha256((root / "out" / "model.safetensors").read_bytes()).hexdigest()
    assert (root / "out" / "feature_state.json").read_bytes() == (root / "state.json").read_bytes()
    losses = [e["val_loss"] for e in meta["history"]]
    y = pl.read_parquet(root / "val.parquet")["label"].to_numpy()
    base_rate = pl.read_parquet(root / "train.parquet")["label"].mean()
    constant = -np.mean(y * np.log(base_rate) + (1 - y) * np.log(1 - base_rate))
    assert len(losses) == 4
    assert losses[-1] < 0.8 * constant  # it learns the signal, far beyond predicting the base rate
    assert "epoch 4/4" in proc.stderr  # rank 0 reports progress when not under Dagster
    assert proc.stderr.count("epoch 4/4") == 1  # ...and only rank 0


def test_outside_dagster_the_result_is_written_beside_the_export(trained):
    """A run by hand (no Pipes) leaves report.json: what the asset would have reported, typed as Pipes types it."""
    import dagster as dg

    from ml_assets.training.launcher import metadata_from_pipes

    cfg, root, proc = trained
    report = json.loads((root / "out" / "report.json").read_text())
    meta = json.loads((root / "out" / "meta.json").read_text())
    assert report["data_version"] == meta["weights_sha256"]
    converted = metadata_from_pipes(report["metadata"])
    assert converted["checkpoint_uri"] == dg.MetadataValue.path(str(root / "out" / "model.safetensors"))
    assert converted["checkpoint_sha256"] == meta["weights_sha256"]
    assert converted["world_size"] == 2 and converted["steps"] == meta["steps"]
    assert [e["val_loss"] for e in converted["history"].value] == [e["val_loss"] for e in meta["history"]]
    # What it held: its two CPU ranks since they started, their imports and setup before training too.
    held = converted["wall_seconds"]
    assert held > meta["accounting"]["wall_s"] > 0 and converted["gpu_rank_seconds"] == 0.0
    assert converted["cpu_rank_seconds"] == pytest.approx(2 * held, abs=0.002)
    with pytest.raises(ValueError, match="'weird' has type 'pickle'"):
        metadata_from_pipes({"weird": {"raw_value": "x", "type": "pickle"}})


def test_validation_loss_is_over_all_ranks_rows(trained):
    """The all-reduced loss equals the loss of the saved model on the whole validation file."""
    cfg, root, proc = trained
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((root / "out" / "meta.json").read_text())
    loaded = load_checkpoint(_ref(root / "out" / "model.safetensors"), _ref(root / "out" / "meta.json"))
    numeric, categorical, target = to_tensors(pl.read_parquet(root / "val.parquet"), loaded.feature_state)
    with torch.no_grad():
        loss = torch.nn.functional.binary_cross_entropy_with_logits(loaded.model(numeric, categorical), target)
    assert float(loss) == pytest.approx(meta["history"][-1]["val_loss"], rel=1e-5)


def test_tampered_weights_are_refused(trained, tmp_path):
    cfg, root, proc = trained
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = _ref(root / "out" / "model.safetensors")
    for name in ("meta.json", "feature_state.json"):
        (tmp_path / name).write_bytes((root / "out" / name).read_bytes())
    (tmp_path / "model.safetensors").write_bytes((root / "out" / "model.safetensors").read_bytes() + b"\0")
    with pytest.raises(IntegrityError, match="sha256"):
        load_checkpoint(DataRef(uri=str(tmp_path / "model.safetensors"), sha256=weights.sha256), _ref(tmp_path / "meta.json"))


def test_feature_file_changed_after_pinning_fails_training(tmp_path):
    (tmp_path / "f.parquet").write_bytes(b"x")
    ref = DataRef(uri=str(tmp_path / "f.parquet"), sha256="0" * 64)
    cfg = TrainConfig(model="toy", task="binary_classification", train_files=[ref], val_files=[ref],
                      feature_state=ref, output_dir=str(tmp_path / "out"), epochs=1)
    (tmp_path / "config.json").write_text(cfg.to_json())
    proc = subprocess.run(
        [sys.executable, "-m", "ml_assets.trainer.agent", "--standalone", "--nproc_per_node=1",
         "-m", "ml_assets.trainer", "--config", str(tmp_path / "config.json")],
        capture_output=True, text=True, timeout=300, env=cli_env(OMP_NUM_THREADS="1"),
    )
    assert proc.returncode != 0
    assert "refusing to use it" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_trainer_imports_no_dagster():
    code = "import sys, ml_assets.trainer.train; print(sorted(m for m in sys.modules if m.split('.')[0] == 'dagster'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("change", "problem"),
    [({"epochs": 0}, "epochs must be >= 1"), ({"task": "ranking"}, "task 'ranking'"),
     ({"train_files": []}, "train_files is empty"), ({"dropout": 1.5}, "dropout")],
)
def test_invalid_config_is_refused(change, problem):
    ref = {"uri": "/x", "sha256": "0" * 64}
    data = {"model": "m", "task": "binary_classification", "train_files": [ref], "val_files": [ref],
            "feature_state": ref, "output_dir": "/tmp/x", **change}
    with pytest.raises(ValueError, match=problem):
        TrainConfig.from_dict(data)
