"""A boosted fine-tune (family xgboost with ``init_weights``: the parent's booster) under real torchrun:
it adds rounds to the parent's trees (kept as they were), resumes exactly after SIGKILL, and refuses,
naming both sides, a parent whose bytes changed or which reads other inputs."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import polars as pl
import pytest
import xgboost

from ml_assets.features.state import fit_state, state_bytes
from ml_assets.spec.features import FeaturesSpec
from ml_assets.trainer.config import DataRef
from ml_assets_tests.trainer.test_boost import train
from ml_assets_tests.trainer.toy import (
    kill_tree,
    ref,
    run,
    start,
    torchrun_args,
    toy_data,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.torchrun

# Row and column sampling, and XGBoost's own per-node columns: the fine-tune runs in reloaded
# segments (each a resume point), as the hardest case of exact resume.
PARENT = dict(family="xgboost", seed=5, threads=1, report_every_steps=5, checkpoint_every_steps=5, keep_last=2,
              model_params={"max_depth": 4, "learning_rate": 0.1, "num_boost_round": 30, "subsample": 0.8,
                            "colsample_bytree": 0.8, "colsample_bynode": 0.8})
ADDED = 75


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> tuple[dict, DataRef]:
    """A booster trained on older rows, and newer rows (read through the parent's feature state) to
    fine-tune it on."""
    root = tmp_path_factory.mktemp("parent")
    old = toy_data(root / "old", train_rows=6000, seed=0)
    out = train(root, old, **PARENT)
    new = toy_data(root / "new", train_rows=30_000, seed=1)
    return {**new, "feature_state": old["feature_state"]}, ref(out / "model.ubj")


FINE = {**PARENT, "model_params": {**PARENT["model_params"], "num_boost_round": ADDED, "learning_rate": 0.05}}


@pytest.fixture(scope="module")
def fine(parent, tmp_path_factory) -> Path:
    new, ref_ = parent
    return train(tmp_path_factory.mktemp("fine"), new, init_weights=ref_, **FINE)


def test_a_fine_tune_adds_rounds_to_the_parents_trees_which_it_keeps(parent, fine):
    new, ref_ = parent
    meta = json.loads((fine / "meta.json").read_text())
    assert (meta["parent_rounds"], meta["rounds_trained"], meta["rounds"]) == (30, ADDED, 30 + ADDED)
    booster = xgboost.Booster(model_file=str(fine / "model.ubj"))
    start_ = xgboost.Booster(model_file=ref_.uri)
    assert booster.num_boosted_rounds() == 30 + ADDED
    trees = booster.get_dump(dump_format="json")
    assert trees[:30] == start_.get_dump(dump_format="json")  # the parent's trees, as they were
    assert len(set(trees[30:])) > 1
    # The added rounds' own numbering and shrinkage; their losses start from the parent's.
    assert meta["history"][0]["step"] == 5 and meta["params"]["learning_rate"] == 0.05


def test_sigkill_mid_fine_tune_then_rerun_gives_the_same_bits(parent, fine, tmp_path):
    new, ref_ = parent
    write_config(tmp_path / "config.json", new, output_dir=str(tmp_path / "out"), init_weights=ref_,
                 **FINE)
    proc = start(torchrun_args(tmp_path / "config.json"), tmp_path / "first.log")
    ckpts = tmp_path / "out" / "checkpoints"
    wait_for(lambda: any((d / "manifest.json").exists() for d in ckpts.glob("round-*")), timeout=180,
             what="a booster checkpoint of the fine-tune")
    kill_tree(proc, signal.SIGKILL)
    first = (tmp_path / "first.log").read_text()
    assert "fine-tuning from the parent's booster" in first and "30 rounds): adding up to 75" in first
    if (tmp_path / "out" / "model.ubj").exists():
        pytest.fail("the fine-tune finished before it could be killed: give it more rows")
    again = run(torchrun_args(tmp_path / "config.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from round 25" in again.stderr or "resumed from round 50" in again.stderr, again.stderr[-2000:]
    assert (tmp_path / "out" / "model.ubj").read_bytes() == (fine / "model.ubj").read_bytes()


def test_a_parent_whose_bytes_changed_is_refused_with_both_hashes(parent, tmp_path):
    """As the Dagster step checks it before launching (the trainer's own check is the same function)."""
    from ml_assets.storage import IntegrityError
    from ml_assets.training.preflight import check_parent

    new, ref_ = parent
    changed = tmp_path / "model.ubj"
    changed.write_bytes(Path(ref_.uri).read_bytes() + b" ")
    cfg = write_config(tmp_path / "config.json", new, output_dir=str(tmp_path / "out"),
                       init_weights=DataRef(uri=str(changed), sha256=ref_.sha256), **FINE)
    with pytest.raises(IntegrityError) as caught:
        check_parent(cfg)
    assert ref_.sha256 in str(caught.value) and hashlib.sha256(changed.read_bytes()).hexdigest() in str(caught.value)
    assert check_parent(write_config(tmp_path / "ok.json", new, output_dir=str(tmp_path / "out"), init_weights=ref_,
                                     **FINE)) == ""


def test_a_parent_reading_other_inputs_is_refused_naming_both_sides(parent, tmp_path):
    new, ref_ = parent
    rows = pl.read_parquet(new["train_files"][0].uri)
    state = fit_state(rows, FeaturesSpec(numeric=["x"], categorical=["group"]), "label", "binary_classification")
    (tmp_path / "state.json").write_bytes(state_bytes(state))
    write_config(tmp_path / "config.json", {**new, "feature_state": ref(tmp_path / "state.json")},
                 output_dir=str(tmp_path / "out"), init_weights=ref_, **FINE)
    proc = run(torchrun_args(tmp_path / "config.json"))
    assert proc.returncode != 0
    assert "cannot be boosted further by this model: features: the parent reads 3" in proc.stderr, proc.stderr[-2000:]
    assert "this model 2 (['x', 'group'])" in proc.stderr
    assert "only the parent's: ['noise']" in proc.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()
