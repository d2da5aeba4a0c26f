"""The checkpoint directory's lease (ml_assets.trainer.lease): one conformance suite, run against a
local directory and against S3 (moto's server on loopback, conditional requests and all)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from ml_assets import processes
from ml_assets.trainer.lease import (
    LEASE_FILE,
    Holder,
    Lease,
    LeaseError,
    LeaseHeld,
    LeaseLost,
    LocalLeaseStore,
    Record,
    S3LeaseStore,
    lease_store,
)


@pytest.fixture(scope="module")
def bucket(s3_endpoint: str) -> str:
    import boto3

    name = f"leases-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["local", "s3"])
def directory(request, tmp_path, monkeypatch) -> str:
    if request.param == "local":
        return str(tmp_path / "train-abc")
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", request.getfixturevalue("s3_endpoint"))
    s3fs.S3FileSystem.clear_instance_cache()  # an earlier test's client may point elsewhere
    return f"s3://{request.getfixturevalue('bucket')}/checkpoints/{uuid.uuid4().hex[:8]}/train-abc"


class Messages:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, message: str) -> None:
        self.lines.append(message)


def lease(directory: str, owner: str, *, ttl: float = 30.0, holder: Holder | None = None) -> tuple[Lease, Messages]:
    said = Messages()
    holder = holder or Holder.this_process(owner)
    return Lease(lease_store(directory), holder, ttl_seconds=ttl, log=said, warn=said), said


def elsewhere(owner: str) -> Holder:
    """A holder on another machine: its pid cannot be checked from here, only its renewals."""
    return dataclasses.replace(Holder.this_process(owner), host="node-b", namespace="node-b|other-boot|pid:[1]")


def test_the_store_is_chosen_by_the_directory(tmp_path):
    assert isinstance(lease_store(str(tmp_path)), LocalLeaseStore)
    assert isinstance(lease_store(f"file://{tmp_path}"), LocalLeaseStore)
    assert isinstance(lease_store("s3://bucket/checkpoints/train-abc"), S3LeaseStore)
    with pytest.raises(LeaseError, match="local paths and s3:// only, not gs://"):
        lease_store("gs://bucket/checkpoints/train-abc")


@pytest.fixture
def serial_s3(s3_endpoint, monkeypatch):
    """The same moto backends behind a server that answers one request at a time. moto checks a
    conditional PUT's precondition and then writes, unlocked: under load two of its threads both
    passed the check (seen in a full run). S3 itself is atomic; what a race here tests is that our
    requests are conditional and a refusal is read as one, so it races against an atomic server."""
    import s3fs
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=False,
                         request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.server_port}")
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    server.shutdown()
    s3fs.S3FileSystem.clear_instance_cache()


def test_of_trainers_racing_for_a_free_lease_exactly_one_gets_it(directory, request):
    if directory.startswith("s3://"):
        request.getfixturevalue("serial_s3")
    store = lease_store(directory)
    with ThreadPoolExecutor(8) as pool:
        versions = list(pool.map(lambda i: store.create(f"trainer {i}".encode()), range(8)))
    assert sum(v is not None for v in versions) == 1
    data, version = store.read()
    assert version == next(v for v in versions if v is not None)
    assert data == f"trainer {versions.index(version)}".encode()


def test_a_held_lease_makes_another_trainer_wait_then_fail_naming_the_holder(directory):
    first, _ = lease(directory, "Dagster run aaaa1111")
    first.acquire(wait_seconds=0)
    second, said = lease(directory, "Dagster run bbbb2222")
    started = time.monotonic()
    with pytest.raises(LeaseHeld) as failure:
        second.acquire(wait_seconds=1.0, poll_seconds=0.1)
    assert time.monotonic() - started >= 1.0
    message = str(failure.value)
    assert "Dagster run aaaa1111" in message and f"pid {first.holder.pid}" in message
    assert "lease_wait_seconds" in message
    assert any("is held by" in line and "Dagster run aaaa1111" in line for line in said.lines)
    first.confirm()  # the holder still holds it


def test_a_released_lease_goes_to_the_trainer_waiting_for_it(directory):
    first, _ = lease(directory, "first")
    first.acquire(wait_seconds=0)
    second, _ = lease(directory, "second")
    waiter = threading.Thread(target=second.acquire, args=(30.0, 0.05))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive()  # still waiting
    first.release()
    waiter.join(timeout=10)
    assert second.held and second.waited_seconds >= 0.4 and not second.took_over
    second.confirm()
    with pytest.raises(LeaseLost):
        first.confirm()


def test_a_create_applied_whose_answer_was_lost_is_known_as_ours(s3_endpoint, bucket, tmp_path, monkeypatch):
    """The store applied our create, but its answer was lost on the way back: the retry is refused
    (a lease exists), and reading it back finds our own bytes, so the lease is ours; not another
    holder's to wait for (which, with no wait allowed, would refuse the training)."""
    import s3fs

    from ml_assets_tests.faults.services import Proxy

    proxy = Proxy(s3_endpoint, tmp_path, "--lose-first-answer")
    proxy.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        mine, said = lease(f"s3://{bucket}/checkpoints/{uuid.uuid4().hex[:8]}/train-abc", "Dagster run mine1111")
        mine.acquire(wait_seconds=0)
        mine.confirm()
        assert mine.held and not mine.took_over and not any("held by" in line for line in said.lines), said.lines
        assert "lost an answer" in (tmp_path / "s3-proxy.log").read_text()  # the answer really was lost
        mine.release()
    finally:
        proxy.kill()
        s3fs.S3FileSystem.clear_instance_cache()


def test_the_lease_of_a_dead_holder_is_taken_over_at_once_and_said_so(directory):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = processes.start_ticks(dead.pid)
    dead.wait()
    holder = dataclasses.replace(Holder.this_process("Dagster run dead0000"), pid=dead.pid, started=started or "1")
    gone, _ = lease(directory, "", holder=holder)
    gone.acquire(wait_seconds=0)
    gone._stop.set()  # it died: no renewals, no release
    taker, said = lease(directory, "Dagster run next0000")
    before = time.monotonic()
    taker.acquire(wait_seconds=30)
    assert time.monotonic() - before < 2  # not after the 30 s TTL: the pid told
    assert "no longer running" in taker.took_over and "Dagster run dead0000" in taker.took_over
    assert any("took over from" in line and f"pid {dead.pid}" in line for line in said.lines)


def test_an_unrenewed_lease_from_another_machine_is_taken_over_after_its_ttl(directory):
    stale, _ = lease(directory, "", ttl=1.0, holder=elsewhere("Dagster run gone1111"))
    stale.acquire(wait_seconds=0)
    before = time.monotonic()  # its last renewal
    taker, _ = lease(directory, "next")
    taker.acquire(wait_seconds=10, poll_seconds=0.1)
    watched, aged = time.monotonic() - before, time.time() - stale.record.renewed_at
    # Unchanged for a TTL as the taker watched it (its own monotonic clock), or last renewed two
    # TTLs ago by the wall clock the holder stamped: the second is how a holder on another machine
    # is judged, and a wall clock that steps (seen once in CI: taken over 0.74 s after the renewal
    # by the monotonic clock) makes it the one that answers first. Either way, never before a TTL.
    assert watched < 5, taker.took_over
    if "not renewed for" in taker.took_over:
        assert watched >= 0.9, taker.took_over
    else:
        assert "last renewed" in taker.took_over and aged >= 1.9, (taker.took_over, watched, aged)
    with pytest.raises(LeaseLost, match="now held by"):  # the old holder learns it lost it
        stale.renew()


def test_renewals_keep_a_live_lease_from_expiring(directory):
    holder, _ = lease(directory, "Dagster run live1111", ttl=1.0, holder=elsewhere("Dagster run live1111"))
    holder.acquire(wait_seconds=0)
    lost: list[LeaseLost] = []
    holder.start_renewing(lost.append)
    other, _ = lease(directory, "other")
    with pytest.raises(LeaseHeld, match="Dagster run live1111"):
        other.acquire(wait_seconds=3.0, poll_seconds=0.1)  # three TTLs: it would have expired
    assert not lost
    holder.release()
    other.acquire(wait_seconds=1.0, poll_seconds=0.1)


def test_a_holder_whose_lease_was_taken_over_cannot_confirm_renew_or_release_it(directory):
    old, _ = lease(directory, "old", ttl=1.0, holder=elsewhere("old"))
    old.acquire(wait_seconds=0)
    new, _ = lease(directory, "new")
    new.acquire(wait_seconds=5, poll_seconds=0.1)
    with pytest.raises(LeaseLost, match="was lost: now held by"):
        old.confirm()
    with pytest.raises(LeaseLost, match="taken over"):
        old.renew()
    old.release()  # must not delete the new holder's lease
    new.confirm()


def test_an_unreadable_lease_is_taken_over(directory):
    store = lease_store(directory)
    assert store.create(b"{not json") is not None
    taker, said = lease(directory, "taker")
    taker.acquire(wait_seconds=5)
    assert "unreadable" in taker.took_over
    assert Record.from_bytes(store.read()[0]).holder.owner == "taker"


def test_the_lease_names_everything_a_waiter_needs(directory):
    held, _ = lease(directory, "Dagster run 0123abcd")
    held.acquire(wait_seconds=0)
    record = json.loads(lease_store(directory).read()[0])
    assert record["holder"]["pid"] == held.holder.pid and record["holder"]["owner"] == "Dagster run 0123abcd"
    assert record["holder"]["host"] and record["holder"]["namespace"] == processes.pid_namespace()
    assert record["ttl_seconds"] == 30.0 and record["renewed_at"] >= record["acquired_at"]
    assert held.summary()["location"].endswith(f"train-abc/{LEASE_FILE}")
    held.release()
    assert lease_store(directory).read() is None



@pytest.mark.torchrun
def test_a_trainer_that_cannot_get_the_lease_fails_naming_the_holder_and_is_not_restarted(tmp_path):
    """Two ranks under torchrun with restarts left: the verdict reaches every rank, rank 0 names the
    holder, torchrun is asked to stop instead of restarting them to wait again, nothing is written."""
    from ml_assets_tests.trainer.toy import run, torchrun_args, toy_data, write_config

    cfg = write_config(tmp_path / "config.json", toy_data(tmp_path / "data"), output_dir=str(tmp_path / "out"),
                       epochs=1, threads=1, lease_wait_seconds=1)
    holder, _ = lease(cfg.checkpoint_root, "Dagster run held1234")
    holder.acquire(wait_seconds=0)
    proc = run(torchrun_args(tmp_path / "config.json", nproc=2, max_restarts=2))
    assert proc.returncode != 0
    assert "is being written by another training" in proc.stderr and "Dagster run held1234" in proc.stderr
    assert proc.stderr.count("waiting up to") == 1, proc.stderr[-3000:]  # no restart waited again
    assert not list((tmp_path / "out").glob("checkpoints/step-*")) and not (tmp_path / "out" / "model.safetensors").exists()
    holder.confirm()
