"""Tuning studies with the real trainer (torchrun) on toy data: pruning, failures recorded, and
several workers sharing a PostgreSQL study that survives a worker killed mid-trial."""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest

from ml_assets.spec import TuningSpec
from ml_assets.trainer.config import TrainConfig
from ml_assets.tuning import study as st
from ml_assets.tuning.record import COMPUTE_ATTR, TrialCompute
from ml_assets.tuning.space import config_overrides, suggest
from ml_assets_tests.helpers import cli_env
from ml_assets_tests.trainer.toy import kill_tree, toy_data

pytestmark = pytest.mark.torchrun

POSTGRES = os.environ.get("ML_ASSETS_TEST_POSTGRES_URL")


def job(tmp_path: Path, storage_url: str, **fields) -> st.Job:
    data = toy_data(tmp_path / "data", train_rows=1500, val_rows=301)
    base = {**data, "output_dir": "unused", "batch_size": 128, "hidden_sizes": [16], "precision": "fp32"}
    base = json.loads(TrainConfig(**base).to_json())
    spec = TuningSpec(**fields.pop("spec", {}))
    return st.Job(model="toy", study_name=f"toy-{uuid.uuid4().hex[:8]}", storage_url=storage_url, base_config=base,
                  space={k: v.model_dump(mode="json") for k, v in spec.space.items()}, trials=spec.trials,
                  max_epochs=spec.max_epochs, processes_per_trial=1, workdir=str(tmp_path / "work"),
                  pruner=spec.pruner.model_dump(mode="json"), sampler_seed=0, startup_trials=spec.startup_trials,
                  heartbeat_seconds=spec.heartbeat_seconds, max_retries=spec.max_retries, **fields)


def test_the_space_becomes_trainer_fields():
    space = {k: v.model_dump(mode="json") for k, v in TuningSpec().space.items()}
    trial = optuna.trial.FixedTrial({"learning_rate": 0.01, "weight_decay": 1e-4, "batch_size": 256, "width": 48,
                                     "depth": 2, "dropout": 0.2})
    params = suggest(trial, space)
    assert params["width"] == 48 and params["batch_size"] == 256
    fields = config_overrides(params, [64, 32])
    assert fields["hidden_sizes"] == [48, 48] and "width" not in fields and fields["learning_rate"] == 0.01
    assert config_overrides({"depth": 3}, [64, 32])["hidden_sizes"] == [64, 32, 32]
    with pytest.raises(ValueError, match="cannot tune"):
        TuningSpec(space={"momentum": {"low": 0.1, "high": 0.9}})
    with pytest.raises(ValueError, match="log range needs low > 0"):
        TuningSpec(space={"learning_rate": {"low": 0, "high": 0.1, "log": True}})


def test_one_worker_on_sqlite_prunes_and_records_every_trial(tmp_path):
    j = job(tmp_path, f"sqlite:///{tmp_path / 'optuna.db'}",
            spec={"trials": 6, "max_epochs": 4, "startup_trials": 2,
                  "pruner": {"kind": "successive_halving", "min_resource": 1, "reduction_factor": 2}},
            run_id="the-run")
    st.open_study(j, create=True)
    started = time.time()
    st.run_worker(j)
    took = time.time() - started
    study = st.open_study(j)
    counts = st.counts(study)
    assert counts["complete"] + counts["pruned"] + counts["failed"] == 6 and counts["running"] == 0
    assert counts["pruned"] >= 1  # successive halving stops the worse half at each rung
    for t in study.get_trials():
        assert t.user_attrs["epochs"] == (4 if t.state.name == "COMPLETE" else len(t.intermediate_values))
        assert sorted(t.intermediate_values) == list(range(1, t.user_attrs["epochs"] + 1))
        # The pruner sees the trial's best epoch so far, read from what the trainer logged.
        logged = Path(j.workdir) / f"trial-{t.number:04d}" / "epochs.jsonl"
        losses = [json.loads(line)["val_loss"] for line in logged.read_text().splitlines()]
        seen = [t.intermediate_values[e] for e in sorted(t.intermediate_values)]
        assert seen == pytest.approx([min(losses[:i + 1]) for i in range(len(seen))])
        if t.state.name == "COMPLETE":
            assert t.value == pytest.approx(min(losses))
        # What it held, pruned or not: its one rank on the CPU its trainer named, for its torchrun's time.
        held = TrialCompute(**t.user_attrs[COMPUTE_ATTR])
        assert (held.run_id, held.device, held.ranks, held.gpu_rank_seconds) == ("the-run", "cpu", 1, 0.0)
        assert 0 < held.wall_seconds == held.cpu_rank_seconds
    walls = [TrialCompute(**t.user_attrs[COMPUTE_ATTR]).wall_seconds for t in study.get_trials()]
    assert sum(walls) < took  # one worker: its trials one after another, within its time
    # Re-running continues the same study: it is finished, so nothing new runs.
    st.run_worker(j)
    assert len(st.open_study(j).get_trials()) == 6


def test_a_trial_whose_trainer_fails_is_recorded_not_dropped(tmp_path):
    j = job(tmp_path, f"sqlite:///{tmp_path / 'optuna.db'}", spec={"trials": 2, "max_epochs": 2})
    j.base_config["train_files"][0]["sha256"] = "0" * 64  # the trainer refuses the file
    st.open_study(j, create=True)
    st.run_worker(j)
    study = st.open_study(j)
    assert st.counts(study)["failed"] == 2
    assert all("exited with code" in t.user_attrs["error"] for t in study.get_trials())
    # A trainer that failed before its first epoch named no device: its seconds count as CPU.
    assert all(TrialCompute(**t.user_attrs[COMPUTE_ATTR]).cpu_rank_seconds > 0 for t in study.get_trials())


@pytest.mark.skipif(not POSTGRES, reason="set ML_ASSETS_TEST_POSTGRES_URL (.ci/run sets it for the local PostgreSQL)")
def test_two_workers_share_a_postgres_study_and_survive_a_killed_worker(tmp_path):
    j = job(tmp_path, POSTGRES, spec={"trials": 6, "max_epochs": 6, "heartbeat_seconds": 1, "max_retries": 2,
                                      "pruner": {"kind": "none"}})
    st.open_study(j, create=True)
    path = j.write(tmp_path / "job.json")

    def worker(log: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "ml_assets.tuning.study", str(path)],
                                stdout=subprocess.DEVNULL, stderr=(tmp_path / log).open("w"),
                                env=cli_env(OMP_NUM_THREADS="1"), start_new_session=True)

    first, second = worker("w1.log"), worker("w2.log")
    study = st.open_study(j)
    deadline = time.monotonic() + 120
    while not any(t.state.name == "RUNNING" and t.intermediate_values for t in study.get_trials()):
        assert time.monotonic() < deadline, "no trial reported an epoch"
        time.sleep(0.2)
    # The first worker dies with its trainer, mid-trial (a lost pod): SIGKILL to the whole tree.
    kill_tree(first)
    assert second.wait(timeout=600) == 0, (tmp_path / "w2.log").read_text()[-3000:]
    # Re-materializing = a worker again: it fails what is stale and finishes the study.
    third = worker("w3.log")
    assert third.wait(timeout=600) == 0, (tmp_path / "w3.log").read_text()[-3000:]
    study = st.open_study(j)
    counts = st.counts(study)
    assert counts["running"] == 0 and counts["waiting"] == 0
    assert counts["complete"] + counts["pruned"] + counts["failed"] >= 6
    assert counts["retried"] >= 1  # the killed trial was failed by the heartbeat and queued again
    retried = [t for t in study.get_trials()
               if optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t) is not None]
    assert retried and all(t.state.name == "COMPLETE" for t in retried)
