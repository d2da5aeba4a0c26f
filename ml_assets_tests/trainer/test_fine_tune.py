"""A fine-tune (``init_weights``) under real torchrun with gloo on the CPU: it starts from the
parent's exported weights under DDP and under FSDP (which shards the parent's full weights) to the
same bits, resumes exactly after SIGKILL, and refuses, naming both hashes or what does not fit, a
parent whose bytes changed or whose weights do not fit the model."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors.torch import load as safetensors_load

from ml_assets.trainer.config import DataRef, TrainConfig
from ml_assets_tests.trainer.test_fsdp import FSDP, RECIPE, _train
from ml_assets_tests.trainer.test_resume import weights
from ml_assets_tests.trainer.toy import (
    complete_checkpoints,
    kill_tree,
    run,
    start,
    torchrun_args,
    toy_data,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.torchrun


def _parent_ref(out: Path) -> DataRef:
    return DataRef(uri=str(out / "model.safetensors"),
                   sha256=hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest())


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> tuple[dict, DataRef]:
    """A model trained on the first rows (DDP), and newer rows to fine-tune it on."""
    root = tmp_path_factory.mktemp("parent")
    old = toy_data(root / "old", train_rows=1500, seed=0)
    out, _ = _train(root, old, **dict(RECIPE, epochs=1))
    return toy_data(root / "new", train_rows=1000, seed=1), _parent_ref(out)


@pytest.fixture(scope="module")
def fine_ddp(parent, tmp_path_factory) -> tuple[Path, str]:
    new, ref = parent
    return _train(tmp_path_factory.mktemp("fine-ddp"), new, init_weights=ref, **RECIPE)


def test_a_fine_tune_starts_from_the_parents_weights_not_from_scratch(parent, fine_ddp, tmp_path):
    new, ref = parent
    out, log = fine_ddp
    assert f"fine-tuning from the parent's weights {ref.uri} (sha256 {ref.sha256[:12]})" in log
    scratch, _ = _train(tmp_path, new, **RECIPE)
    assert weights(out) != weights(scratch)
    first = lambda o: json.loads((o / "meta.json").read_text())["history"][0]["val_loss"]  # noqa: E731
    assert first(out) < first(scratch)  # one epoch on from a trained model, not from random weights


def test_fsdp_shards_the_parents_full_weights_and_fine_tunes_to_ddps_bits(parent, fine_ddp, tmp_path):
    new, ref = parent
    out, log = _train(tmp_path, new, init_weights=ref, **FSDP)
    assert "fsdp: 6 unit(s) sharded over 2 rank(s)" in log
    assert weights(out) == weights(fine_ddp[0])


@pytest.mark.parametrize("recipe", [RECIPE, FSDP], ids=["ddp", "fsdp"])
def test_sigkill_mid_fine_tune_then_rerun_gives_the_same_bits(parent, fine_ddp, tmp_path, recipe):
    """FSDP's fine-tune trains DDP's bits (above), so both resume to the uninterrupted DDP fine-tune's."""
    new, ref = parent
    write_config(tmp_path / "config.json", new, output_dir=str(tmp_path / "out"), init_weights=ref, **recipe)
    proc = start(torchrun_args(tmp_path / "config.json", nproc=2), tmp_path / "first.log")
    wait_for(lambda: any(c["rows_in_epoch"] > 0 for c in complete_checkpoints(tmp_path / "out" / "checkpoints")),
             what="a mid-epoch checkpoint")
    kill_tree(proc, signal.SIGKILL)
    assert not (tmp_path / "out" / "model.safetensors").exists()
    again = run(torchrun_args(tmp_path / "config.json", nproc=2))
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"resumed from \S+: step (\d+)", again.stderr), again.stderr[-3000:]
    assert weights(tmp_path / "out") == weights(fine_ddp[0])


def test_a_parent_whose_bytes_changed_is_refused_with_both_hashes(parent, tmp_path):
    new, ref = parent
    tampered = tmp_path / "model.safetensors"
    shutil.copy(ref.uri, tampered)
    tensors = safetensors_load(tampered.read_bytes())
    from safetensors.torch import save as safetensors_save

    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1
    tampered.write_bytes(safetensors_save(tensors))
    actual = hashlib.sha256(tampered.read_bytes()).hexdigest()
    write_config(tmp_path / "config.json", new, output_dir=str(tmp_path / "out"),
                 init_weights=DataRef(uri=str(tampered), sha256=ref.sha256), **RECIPE)
    proc = run(torchrun_args(tmp_path / "config.json", nproc=1))
    assert proc.returncode != 0
    assert "the parent's weights changed since they were registered" in proc.stderr
    assert ref.sha256 in proc.stderr and actual in proc.stderr
    assert not (tmp_path / "out" / "checkpoints").exists() or not list((tmp_path / "out" / "checkpoints").glob("step-*"))


def test_a_parent_that_does_not_fit_the_model_is_refused_saying_what_differs(parent, tmp_path):
    new, ref = parent
    write_config(tmp_path / "config.json", new, output_dir=str(tmp_path / "out"), init_weights=ref,
                 **dict(RECIPE, hidden_sizes=[16, 16]))
    proc = run(torchrun_args(tmp_path / "config.json", nproc=1))
    assert proc.returncode != 0
    assert "do not fit this model (fine-tune)" in proc.stderr and "other shapes" in proc.stderr


def test_the_parents_bytes_decide_the_fingerprint_not_where_a_copy_lies(parent):
    new, ref = parent
    cfg = TrainConfig(**new, output_dir="/nowhere", init_weights=ref)
    moved = replace(cfg, init_weights=DataRef(uri="s3://elsewhere/model.safetensors", sha256=ref.sha256))
    assert moved.fingerprint() == cfg.fingerprint()
    assert replace(cfg, init_weights=DataRef(uri=ref.uri, sha256="0" * 64)).fingerprint() != cfg.fingerprint()
    assert TrainConfig(**new, output_dir="/nowhere").fingerprint() != cfg.fingerprint()
    with pytest.raises(ValueError, match="init_weights needs the parent weights' sha256"):
        TrainConfig(**new, output_dir="/nowhere", init_weights=DataRef(uri=ref.uri, sha256="abc"))


def test_the_step_checks_the_parent_before_launching_what_does_not_fit_or_changed(parent, tmp_path):
    """What the trained_checkpoint step runs before torchrun: a parent that does not fit is a reason
    to train from scratch instead (recorded); one whose bytes changed stops the step with both hashes."""
    from ml_assets.storage import IntegrityError
    from ml_assets.training.preflight import check_parent

    new, ref = parent
    assert check_parent(TrainConfig(**new, output_dir="/nowhere", init_weights=ref, **RECIPE)) == ""
    problem = check_parent(TrainConfig(**new, output_dir="/nowhere", init_weights=ref, **dict(RECIPE, hidden_sizes=[8])))
    assert "do not fit this model (fine-tune)" in problem
    copy = tmp_path / "model.safetensors"
    copy.write_bytes(Path(ref.uri).read_bytes() + b" ")
    with pytest.raises(IntegrityError, match=f"expected {ref.sha256}"):
        check_parent(TrainConfig(**new, output_dir="/nowhere", init_weights=DataRef(uri=str(copy), sha256=ref.sha256),
                                 **RECIPE))


def test_a_streamed_fine_tune_resumes_after_sigkill_to_the_uninterrupted_bits(parent, tmp_path):
    import polars as pl

    from ml_assets_tests.trainer.test_streaming import split

    new, ref = parent
    rows = pl.read_parquet(new["train_files"][0].uri)
    streamed = {**new, "train_files": split(rows, tmp_path, [600, 400], row_group_size=100)}
    fields = dict(RECIPE, data_mode="streaming", shuffle_buffer_rows=300, checkpoint_every_steps=5, init_weights=ref)
    (tmp_path / "whole").mkdir()
    whole, log = _train(tmp_path / "whole", streamed, **fields)
    assert "streaming 10 row groups of 2 file(s)" in log and "fine-tuning from the parent's weights" in log
    write_config(tmp_path / "config.json", streamed, output_dir=str(tmp_path / "out"), **fields)
    proc = start(torchrun_args(tmp_path / "config.json", nproc=2), tmp_path / "first.log")
    wait_for(lambda: any(c["rows_in_epoch"] > 0 for c in complete_checkpoints(tmp_path / "out" / "checkpoints")),
             what="a mid-epoch checkpoint")
    kill_tree(proc, signal.SIGKILL)
    again = run(torchrun_args(tmp_path / "config.json", nproc=2))
    assert again.returncode == 0 and "resumed from" in again.stderr, again.stderr[-3000:]
    assert weights(tmp_path / "out") == weights(whole)
