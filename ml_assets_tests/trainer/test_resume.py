"""Checkpoints, exact resume, preemption, corruption, resharding and two nodes, all under real
torchrun (gloo on the CPU) with real signals: SIGKILL and SIGTERM sent to real processes."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ml_assets.trainer.checkpoint import SafeFsspecReader
from ml_assets_tests.trainer.toy import (
    complete_checkpoints,
    free_port,
    kill_tree,
    run,
    start,
    torchrun_args,
    toy_data,
    wait_for,
    worker_pids,
    write_config,
)

pytestmark = pytest.mark.torchrun

# Deterministic, one thread per rank: two runs of the same config give the same bits.
EXACT = dict(epochs=3, batch_size=64, learning_rate=0.01, seed=1, deterministic=True, threads=1,
             checkpoint_every_steps=40, keep_last=3, report_every_steps=100, checkpoint_async="thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    return toy_data(tmp_path_factory.mktemp("toy"), train_rows=40_000)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    """An uninterrupted run: its exported weights are what every interrupted run must reproduce."""
    root = tmp_path_factory.mktemp("reference")
    write_config(root / "config.json", data, output_dir=str(root / "out"), **EXACT)
    proc = run(torchrun_args(root / "config.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "out"


def weights(out: Path) -> bytes:
    return (out / "model.safetensors").read_bytes()


def mid_epoch_checkpoint(ckpts: Path) -> bool:
    return any(c["rows_in_epoch"] > 0 and c["epoch"] >= 1 for c in complete_checkpoints(ckpts))


def test_sigkill_mid_epoch_then_rerun_gives_the_same_bits(data, reference, tmp_path):
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **EXACT)
    proc = start(torchrun_args(tmp_path / "config.json"), tmp_path / "first.log")
    wait_for(lambda: mid_epoch_checkpoint(tmp_path / "out" / "checkpoints"), what="a mid-epoch checkpoint")
    kill_tree(proc, signal.SIGKILL)  # torchrun and its worker, no chance to clean up
    assert not (tmp_path / "out" / "model.safetensors").exists()

    again = run(torchrun_args(tmp_path / "config.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = re.search(r"resumed from \S+: step (\d+), epoch (\d+), (\d+) rows into it", again.stderr)
    assert resumed, again.stderr[-3000:]
    assert int(resumed.group(1)) > 0 and int(resumed.group(3)) > 0  # mid-epoch, not from scratch
    assert weights(tmp_path / "out") == weights(reference)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["history"] == json.loads((reference / "meta.json").read_text())["history"]


def test_a_crashed_worker_is_restarted_by_torchrun_and_resumes(data, reference, tmp_path):
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **EXACT)
    proc = start(torchrun_args(tmp_path / "config.json", max_restarts=1), tmp_path / "log")
    wait_for(lambda: mid_epoch_checkpoint(tmp_path / "out" / "checkpoints"), what="a mid-epoch checkpoint")
    for pid in worker_pids(proc.pid):
        os.kill(pid, signal.SIGKILL)  # the worker dies; the agent lives
    assert proc.wait(timeout=300) == 0, (tmp_path / "log").read_text()[-3000:]
    log = (tmp_path / "log").read_text()
    assert "resumed from" in log
    assert weights(tmp_path / "out") == weights(reference)


def test_sigterm_finishes_the_step_checkpoints_and_exits_75(data, reference, tmp_path):
    """The trainer alone (one rank, the process group from environment variables, no agent), so
    its own exit code is what the test sees."""
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **EXACT)
    proc = start([sys.executable, "-m", "ml_assets.trainer.train", "--config", str(tmp_path / "config.json")],
                 tmp_path / "log", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(free_port()))
    wait_for(lambda: mid_epoch_checkpoint(tmp_path / "out" / "checkpoints"), what="a mid-epoch checkpoint")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 75
    log = (tmp_path / "log").read_text()
    stopped = re.search(r"SIGTERM: checkpoint at step (\d+) written", log)
    assert stopped, log[-3000:]
    newest = complete_checkpoints(tmp_path / "out" / "checkpoints")[-1]
    assert newest["step"] == int(stopped.group(1))  # nothing trained after SIGTERM is lost

    again = run(torchrun_args(tmp_path / "config.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"step {stopped.group(1)}," in again.stderr
    assert weights(tmp_path / "out") == weights(reference)


def test_sigterm_to_one_worker_stops_torchrun_instead_of_a_restart(data, tmp_path):
    """A preempted worker asks its agent to shut down: restarting it in place would only be killed
    again with the node, and the Dagster retry resumes from the checkpoint anyway."""
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **EXACT)
    proc = start(torchrun_args(tmp_path / "config.json", max_restarts=3), tmp_path / "log")
    wait_for(lambda: mid_epoch_checkpoint(tmp_path / "out" / "checkpoints"), what="a mid-epoch checkpoint")
    for pid in worker_pids(proc.pid):
        os.kill(pid, signal.SIGTERM)
    assert proc.wait(timeout=120) != 0
    log = (tmp_path / "log").read_text()
    assert "exiting with code 75" in log
    assert log.count("first step of this attempt") == 1  # not restarted
    assert not (tmp_path / "out" / "model.safetensors").exists()


def _copy_finished(reference: Path, data: dict, tmp_path: Path) -> Path:
    """The reference run's checkpoints under a new output, with the same config."""
    shutil.copytree(reference / "checkpoints", tmp_path / "out" / "checkpoints")
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **EXACT)
    return tmp_path / "out" / "checkpoints"


def test_a_tampered_checkpoint_is_named_and_skipped_for_the_previous_one(data, reference, tmp_path):
    ckpts = _copy_finished(reference, data, tmp_path)
    newest = sorted(ckpts.glob("step-*"))[-1]
    shard = next(newest.glob("*.distcp"))
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    shard.write_bytes(bytes(blob))

    proc = run(torchrun_args(tmp_path / "config.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"checkpoint {newest} is unusable ({shard.name} has" in proc.stderr
    previous = sorted(ckpts.glob("step-*"))[-2].name
    assert f"resumed from {ckpts / previous}" in proc.stderr
    assert weights(tmp_path / "out") == weights(reference)  # the last stretch was retrained exactly


def test_when_every_checkpoint_is_bad_the_step_fails_instead_of_starting_over(data, reference, tmp_path):
    ckpts = _copy_finished(reference, data, tmp_path)
    for step in ckpts.glob("step-*"):
        shard = next(step.glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])  # truncated
    before = {p: p.read_bytes() for p in ckpts.rglob("*") if p.is_file()}

    proc = run(torchrun_args(tmp_path / "config.json"))
    assert proc.returncode != 0
    assert "every checkpoint under" in proc.stderr and "failed verification" in proc.stderr
    assert "refusing to start over silently" in proc.stderr
    assert {p: p.read_bytes() for p in ckpts.rglob("*") if p.is_file()} == before  # nothing touched
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_checkpoint_of_another_config_is_not_resumed(data, reference, tmp_path):
    shutil.copytree(reference / "checkpoints", tmp_path / "out" / "checkpoints")
    write_config(tmp_path / "config.json", data, output_dir=str(tmp_path / "out"), **{**EXACT, "learning_rate": 0.02})
    proc = run(torchrun_args(tmp_path / "config.json"))
    assert proc.returncode != 0
    assert "written for training config" in proc.stderr


def _stop_after_a_mid_epoch_checkpoint(config: Path, log: Path, nproc: int) -> int:
    proc = start(torchrun_args(config, nproc=nproc), log)
    out = Path(json.loads(config.read_text())["output_dir"])
    wait_for(lambda: mid_epoch_checkpoint(out / "checkpoints"), what="a mid-epoch checkpoint")
    os.kill(proc.pid, signal.SIGTERM)  # to torchrun this time: it passes SIGTERM to every worker
    proc.wait(timeout=120)
    stopped = re.search(r"SIGTERM: checkpoint at step (\d+) written", log.read_text())
    assert stopped, log.read_text()[-3000:]
    return int(stopped.group(1))


@pytest.mark.parametrize(("first", "second"), [(2, 1), (1, 2)])
def test_a_checkpoint_written_by_n_ranks_resumes_on_m(data, tmp_path, first, second):
    fields = {**EXACT, "deterministic": False, "checkpoint_every_steps": 20}
    config = tmp_path / "config.json"
    write_config(config, data, output_dir=str(tmp_path / "out"), **fields)
    step = _stop_after_a_mid_epoch_checkpoint(config, tmp_path / "first.log", first)
    proc = run(torchrun_args(config, nproc=second))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {tmp_path / 'out' / 'checkpoints'}/step-{step:09d}: step {step}," in proc.stderr
    assert f"checkpoint written by {first} rank(s), resuming on {second}" in proc.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["world_size"] == second and meta["steps"] > step
    assert meta["history"][-1]["val_loss"] < 0.5  # it kept learning (the base rate scores ~0.69)


def test_two_ranks_stopped_and_resumed_on_two_ranks_give_the_same_bits(data, tmp_path):
    """Same world size: every rank gets its own RNG state back; then a rerun of the finished
    training exports the same weights again."""
    fields = {**EXACT, "checkpoint_every_steps": 20, "epochs": 2}
    write_config(tmp_path / "whole.json", data, output_dir=str(tmp_path / "whole"), **fields)
    assert run(torchrun_args(tmp_path / "whole.json", nproc=2)).returncode == 0
    config = tmp_path / "config.json"
    write_config(config, data, output_dir=str(tmp_path / "out"), **fields)
    step = _stop_after_a_mid_epoch_checkpoint(config, tmp_path / "first.log", 2)
    resumed = run(torchrun_args(config, nproc=2))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"step-{step:09d}: step {step}," in resumed.stderr
    assert weights(tmp_path / "out") == weights(tmp_path / "whole")
    rerun = run(torchrun_args(config, nproc=2))  # finds the training finished
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "the checkpoint says training already finished" in rerun.stderr
    assert weights(tmp_path / "out") == weights(tmp_path / "whole")


def test_checkpoints_on_s3_resume(data, tmp_path, s3_endpoint):
    import boto3

    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="ckpt")
    config = tmp_path / "config.json"
    write_config(config, data, output_dir=str(tmp_path / "out"), checkpoint_dir="s3://ckpt/toy/run",
                 **{**EXACT, "checkpoint_every_steps": 100})
    env = {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    proc = start(torchrun_args(config), tmp_path / "first.log", **env)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)

    def manifests() -> list[str]:
        listed = s3.list_objects_v2(Bucket="ckpt", Prefix="toy/run/step-").get("Contents", [])
        return [o["Key"] for o in listed if o["Key"].endswith("/manifest.json")]

    wait_for(lambda: len(manifests()) >= 2, what="two checkpoints in S3")
    kill_tree(proc, signal.SIGKILL)
    again = run(torchrun_args(config), **env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from s3://ckpt/toy/run/step-" in again.stderr
    assert len(manifests()) <= EXACT["keep_last"]


def test_two_torchrun_agents_train_together_through_c10d_rendezvous(data, tmp_path):
    config = tmp_path / "config.json"
    write_config(config, data, output_dir=str(tmp_path / "out"), **{**EXACT, "epochs": 1})
    port = free_port()
    agents = [
        start([*torchrun_args(config)[:3], "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=toy-two-nodes", "--max-restarts=0",
               *torchrun_args(config)[6:]], tmp_path / f"node{i}.log")
        for i in range(2)
    ]
    codes = [a.wait(timeout=300) for a in agents]
    logs = [(tmp_path / f"node{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], "\n".join(log[-2000:] for log in logs)
    assert sum(log.count("exported ") for log in logs) == 1  # one rank 0 in the whole job
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["world_size"] == 2
    assert "2 rank(s) on cpu" in "".join(logs)


def test_checkpoint_metadata_is_not_unpickled_freely(tmp_path):
    class Boom:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        SafeFsspecReader(str(tmp_path)).read_metadata()
    assert not (tmp_path / "pwned").exists()


def test_the_trainer_refuses_a_bad_config_by_name(tmp_path, data):
    bad = json.loads(write_config(tmp_path / "ok.json", data, output_dir=str(tmp_path / "out")).to_json())
    bad.update(batch_size=0, family="transformer", surprise=1)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    proc = subprocess.run([sys.executable, "-m", "ml_assets.trainer.train", "--config",
                           str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown field(s) ['surprise']" in proc.stderr
    bad.pop("surprise")
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    proc = subprocess.run([sys.executable, "-m", "ml_assets.trainer.train", "--config",
                           str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "batch_size must be >= 1, got 0" in proc.stderr and "family 'transformer'" in proc.stderr


ASYNC_ROUNDTRIP = """
import os, sys, torch, torch.distributed as dist
from ml_assets.trainer.checkpoint import ASYNC_MIN_BYTES, CheckpointManager
root, mode, port = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
state = {"model.w": torch.randn(ASYNC_MIN_BYTES // 4 + 1000), "optim.w.step": torch.tensor(3.0)}
manager = CheckpointManager(root, rank=0, world=1, mode=mode, keep_last=2, log=print, warn=print)
held = manager.save(7, state, {"fingerprint": "f", "step": 7})
saved = {k: v.clone() for k, v in state.items()}
state["model.w"].add_(1.0)  # training goes on while the write runs: the checkpoint must not see it
manager.wait()
found = manager.latest("f")
target = {k: torch.zeros_like(v) for k, v in state.items()}
manager.load(found, target)
assert found.step == 7 and found.progress["step"] == 7
assert all(torch.equal(target[k], saved[k]) for k in saved), "restored tensors differ"
manager.close()
print("ok", held)
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_an_async_checkpoint_holds_the_state_of_its_step(tmp_path, mode):
    proc = subprocess.run([sys.executable, "-c", ASYNC_ROUNDTRIP, str(tmp_path / "ckpt"), mode, str(free_port())],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok" in proc.stdout
    assert (tmp_path / "ckpt" / "step-000000007" / "manifest.json").exists()
