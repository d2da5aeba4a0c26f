"""An object store that stops answering is waited out, each wait a line, within a bound
(ml_assets.storage.patiently), against moto's S3 server behind a proxy that is killed and started
again: the artifact store's write and the version store's read carry on once it is back."""

import threading
import time

import pytest

from ml_assets.resources.artifacts import ArtifactStoreResource
from ml_assets.storage import StoreUnavailable, patiently
from ml_assets_tests.faults.services import Proxy


@pytest.fixture
def proxy(s3_endpoint, tmp_path, monkeypatch):
    import boto3
    from s3fs import S3FileSystem

    proxy = Proxy(s3_endpoint, tmp_path)
    proxy.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    # botocore's own retries off: what is tested is ours (botocore's alone gave up within seconds).
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    # fsspec keeps one S3FileSystem per set of arguments: one an earlier test made reaches moto directly.
    S3FileSystem.clear_instance_cache()
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="retries")
    yield proxy
    proxy.kill()
    S3FileSystem.clear_instance_cache()


def test_a_write_during_an_outage_waits_saying_so_and_lands_once_the_store_is_back(proxy, monkeypatch):
    lines: list[str] = []
    # The module the artifact store calls (a test elsewhere may have imported ml_assets afresh).
    monkeypatch.setitem(ArtifactStoreResource.put.__globals__["patiently"].__globals__, "_say", lines.append)
    store = ArtifactStoreResource(root="s3://retries/artifacts")
    store.put("warm", b"first", ".bin")  # the connection pool is warm: the outage cuts live connections
    proxy.kill()
    # Longer than botocore's own retries (a few seconds, silent): those alone failed such a write.
    back = threading.Timer(10, proxy.start)  # (cancelled should the write fail first: no stray proxy)
    back.start()
    started = time.monotonic()
    try:
        ref = store.put("features", b"written during an outage", ".parquet")
    finally:
        back.cancel()
    took = time.monotonic() - started
    assert took >= 9
    assert store.get(ref.uri, ref.sha256) == b"written during an outage"
    assert lines, f"the write took {took:.1f} s and said nothing"
    assert lines[0].startswith(f"the object store at s3://retries ({proxy.endpoint}) not answering (")
    assert "retry 1 of 6 in 1 s" in lines[0]


def test_past_the_bound_the_store_is_named_and_other_errors_are_not_retried(monkeypatch):
    monkeypatch.setenv("ML_ASSETS_STORE_RETRIES", "3")
    said, slept = [], []

    def refused():
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(StoreUnavailable) as raised:
        patiently("s3://bucket/key", refused, say=said.append, sleep=slept.append)
    assert str(raised.value).startswith("the object store at s3://bucket did not answer (3 retries over ~7 s) "
                                        "for s3://bucket/key: ConnectionRefusedError: [Errno 111] Connection refused")
    assert slept == [1, 2, 4] and [line.split("; ")[1] for line in said] == [
        "retry 1 of 3 in 1 s", "retry 2 of 3 in 2 s", "retry 3 of 3 in 4 s"]

    def missing():
        raise FileNotFoundError("s3://bucket/key")

    with pytest.raises(FileNotFoundError):
        patiently("s3://bucket/key", missing, say=said.append, sleep=slept.append)
    assert len(slept) == 3  # not retried


def test_a_checkpoint_written_during_an_outage_waits_saying_so_and_is_complete(proxy):
    # DCP's save hands the store's error back wrapped (CheckpointException, a BaseException, the
    # error in its per-rank ``failures``): the manager must still see a store that did not answer.
    import torch

    from ml_assets.trainer.checkpoint import CheckpointManager
    from ml_assets.trainer.checkpoint_files import verify

    said: list[str] = []
    manager = CheckpointManager("s3://retries/ckpt", rank=0, world=1, mode="off", keep_last=2, log=said.append,
                                warn=said.append)
    manager.save(1, {"w": torch.arange(6.0)}, {"fingerprint": "f"})  # warm connections, as mid-training
    proxy.kill()
    back = threading.Timer(6, proxy.start)
    back.start()
    try:
        manager.save(2, {"w": torch.arange(6.0) * 2}, {"fingerprint": "f"})
    finally:
        back.cancel()
    waits = [line for line in said if "not answering" in line]
    assert waits and "retry 1 of 6 in 1 s" in waits[0], said
    manifest, reason = verify("s3://retries/ckpt/step-000000002")
    assert manifest is not None, reason
    found = manager.latest("f")
    restored = {"w": torch.zeros(6)}
    manager.load(found, restored)
    assert found.step == 2 and torch.equal(restored["w"], torch.arange(6.0) * 2)


def test_an_async_checkpoint_the_store_did_not_take_is_given_up_saying_so_and_the_next_is_whole(proxy):
    import torch

    from ml_assets.trainer.checkpoint import ASYNC_MIN_BYTES, CheckpointManager
    from ml_assets.trainer.checkpoint_files import verify

    said: list[str] = []
    manager = CheckpointManager("s3://retries/async", rank=0, world=1, mode="thread", keep_last=2, log=said.append,
                                warn=said.append)
    big = lambda k: {"w": torch.full((ASYNC_MIN_BYTES // 4,), float(k))}  # noqa: E731 - async only from this size
    proxy.kill()
    manager.save(1, big(1), {"fingerprint": "f"})  # returns at once; its write meets no store
    deadline = time.monotonic() + 60
    while not manager._pending.done() and time.monotonic() < deadline:  # the store back only after
        time.sleep(0.05)
    proxy.start()
    manager.save(2, big(2), {"fingerprint": "f"})  # first: the last save's outcome
    manager.close()
    given_up = [line for line in said if "was not written" in line]
    assert given_up and given_up[0].startswith("the checkpoint of step 1 was not written: the object store did not "
                                               "answer ("), said
    assert verify("s3://retries/async/step-000000001")[0] is None
    assert verify("s3://retries/async/step-000000002")[0] is not None
    assert manager.latest("f").step == 2


def test_a_lease_taken_during_an_outage_waits_saying_so_and_is_held_once_the_store_is_back(proxy):
    # A rank takes its checkpoint directory's lease first thing: in the fault matrix an S3 outage as
    # training started failed rank 0 there, and torchrun restarted it.
    from ml_assets.trainer.lease import Holder, Lease, lease_store

    said: list[str] = []
    store = lease_store("s3://retries/leased/train-abc")
    lease = Lease(store, Holder.this_process("Dagster run r1"), ttl_seconds=30, log=said.append, warn=said.append)
    store.read()  # warm connections
    proxy.kill()
    back = threading.Timer(4, proxy.start)
    back.start()
    try:
        lease.acquire(wait_seconds=0)
    finally:
        back.cancel()
    lease.confirm()
    assert lease.waited_seconds >= 3 and lease.took_over == ""
    lease.release()
    assert store.read() is None


TWO_RANKS = """
import pathlib, sys, time
import torch, torch.distributed as dist
from ml_assets.trainer.checkpoint import CheckpointManager

dist.init_process_group("gloo")
rank, here = dist.get_rank(), pathlib.Path(sys.argv[1])
say = lambda line: print(f"rank {rank}: {line}", flush=True)
manager = CheckpointManager("s3://retries/two-ranks", rank=rank, world=2, mode="off", keep_last=2, log=say, warn=say)
state = lambda k: {"w": torch.full((1000,), float(k + rank))}
manager.save(1, state(1), {"fingerprint": "f"})  # warm connections, as mid-training
(here / f"ready-{rank}").touch()
while not (here / "cut").exists():
    time.sleep(0.05)
manager.save(2, state(2), {"fingerprint": "f"})
say("saved step 2")
dist.destroy_process_group()
"""


@pytest.mark.torchrun
def test_two_ranks_wait_out_an_outage_together_and_write_a_whole_checkpoint(proxy, tmp_path):
    """DCP's save is collective: a rank whose write met no store fails every rank's save with one
    error, so every rank retries the save together (none goes ahead alone into a collective the
    others left), and the checkpoint is whole once the store is back."""
    import subprocess
    import sys

    from ml_assets.trainer.checkpoint_files import verify
    from ml_assets_tests.helpers import cli_env
    from ml_assets_tests.trainer.toy import free_port

    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    ranks = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
                              f"--master_port={free_port()}", str(script), str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=cli_env(AWS_ENDPOINT_URL=proxy.endpoint, AWS_MAX_ATTEMPTS="1", OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
            assert ranks.poll() is None and time.monotonic() < deadline, ranks.communicate()[0][-3000:]
            time.sleep(0.1)
        proxy.kill()
        (tmp_path / "cut").touch()
        time.sleep(6)
        proxy.start()
        out, _ = ranks.communicate(timeout=180)
    finally:
        if ranks.poll() is None:
            ranks.kill()
    assert ranks.returncode == 0, out[-3000:]
    for rank in (0, 1):  # each rank waited, saying so, and went on
        waits = [line for line in out.splitlines() if line.startswith(f"rank {rank}: ") and "not answering" in line]
        assert waits and "retry 1 of 6 in 1 s" in waits[0], out[-3000:]
        assert f"rank {rank}: saved step 2" in out
    manifest, reason = verify("s3://retries/two-ranks/step-000000002")
    assert manifest is not None and manifest["world_size"] == 2, reason
