"""One training writes a checkpoint directory at a time: an exclusive lease on the directory.

A checkpoint directory is named by the config's fingerprint, so two trainings of the same model,
day and hyperparameters share it: a run started twice, a retry or a resumed run that starts while
the ranks of the attempt before it are still finishing. Interleaved, their checkpoints would mix
steps of two trainings. So rank 0 takes the lease before it reads or writes any checkpoint, renews
it while training, confirms it still holds it before each checkpoint is committed (its manifest),
and releases it when done. The lease is ``lease.json`` in the directory::

    {"holder": {"host", "pid", "started", "namespace", "owner"}, "token", "acquired_at",
     "renewed_at", "ttl_seconds"}

Taking it is a create-if-absent; renewing it, taking over a stale one and releasing it are
compare-and-swap against the version last read, so of two trainers racing for it exactly one wins.
A held lease is **stale**, and taken over (with a warning naming the holder), when

- its holder's process is gone, where its pid can be checked (same machine boot and pid
  namespace; pid reuse is caught by the process's start time): at once, or
- it was not renewed for ``ttl_seconds``: its version unchanged for that long by the waiter's own
  clock, or its ``renewed_at`` two TTLs in the past by the waiter's wall clock (a holder on another
  machine, or one that was killed with SIGKILL, never releases it).

Backends: a local directory (read-compare-write under ``flock`` on ``.lease.lock``) and ``s3://``
(conditional requests: ``If-None-Match: *`` to create, ``If-Match: <ETag>`` to replace and delete).
Other fsspec protocols are refused: there is no lease without an atomic create."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from ml_assets import processes
from ml_assets.storage import patiently

LEASE_FILE = "lease.json"
LOCK_FILE = ".lease.lock"


class LeaseError(RuntimeError):
    """The lease cannot be had: held by another training, lost, or not possible on this storage."""


class LeaseHeld(LeaseError):
    pass


class LeaseLost(LeaseError):
    pass


@dataclass(frozen=True, kw_only=True)
class Holder:
    host: str
    pid: int
    started: str
    """The process's start time (``processes.start_ticks``): the pid alone may be reused."""
    namespace: str
    """Where ``pid`` names this process (``processes.pid_namespace``)."""
    owner: str = ""
    """Who started the training, e.g. ``Dagster run 1f2e…``."""

    @classmethod
    def this_process(cls, owner: str = "") -> Holder:
        pid = os.getpid()
        return cls(host=socket.gethostname(), pid=pid, started=processes.start_ticks(pid) or "",
                   namespace=processes.pid_namespace(), owner=owner)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}" + (f" ({self.owner})" if self.owner else "")

    def checkable_here(self) -> bool:
        return self.namespace == processes.pid_namespace()


@dataclass(frozen=True, kw_only=True)
class Record:
    holder: Holder
    token: str
    acquired_at: float
    renewed_at: float
    ttl_seconds: float

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Record:
        raw = json.loads(data)
        return cls(**{**raw, "holder": Holder(**raw["holder"])})


class LeaseStore(Protocol):
    """Where the lease object lives. A version is whatever changes on every write."""

    location: str

    def create(self, data: bytes) -> str | None:
        """Write ``data`` only if there is no lease: its version, or None when there is one."""

    def read(self) -> tuple[bytes, str] | None:
        """The lease's bytes and version, or None."""

    def replace(self, data: bytes, version: str) -> str | None:
        """Overwrite only if the lease is still at ``version``: the new version, or None."""

    def delete(self, version: str) -> bool:
        """Remove only if the lease is still at ``version``."""


class LocalLeaseStore:
    """``lease.json`` in a local (or NFS-mounted) directory; every change under an exclusive
    ``flock`` of ``.lease.lock``, written to a temporary file and renamed, so readers see a whole
    lease or none."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LEASE_FILE
        self.location = str(self.path)

    @contextlib.contextmanager
    def _locked(self):
        import fcntl

        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, data: bytes) -> str:
        tmp = self.directory / f".{LEASE_FILE}.{os.getpid()}.{threading.get_ident()}"
        tmp.write_bytes(data)
        os.replace(tmp, self.path)
        return hashlib.sha256(data).hexdigest()

    def read(self) -> tuple[bytes, str] | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def create(self, data: bytes) -> str | None:
        with self._locked():
            return None if self.path.exists() else self._write(data)

    def replace(self, data: bytes, version: str) -> str | None:
        with self._locked():
            current = self.read()
            if current is None or current[1] != version:
                return None
            return self._write(data)

    def delete(self, version: str) -> bool:
        with self._locked():
            current = self.read()
            if current is None or current[1] != version:
                return False
            self.path.unlink()
            return True


class S3LeaseStore:
    """``lease.json`` under an ``s3://`` prefix, changed only by conditional requests (credentials and
    endpoint as for the checkpoints: the ``AWS_*`` variables)."""

    def __init__(self, url: str) -> None:
        import fsspec

        self.fs, path = fsspec.core.url_to_fs(url)
        bucket, _, prefix = path.strip("/").partition("/")
        self.bucket, self.key = bucket, f"{prefix}/{LEASE_FILE}" if prefix else LEASE_FILE
        self.location = f"s3://{self.bucket}/{self.key}"

    def _call(self, method: str, **kwargs):
        # Waited out when the store does not answer (ml_assets.storage); see acquire for a lost answer.
        return patiently(self.location, lambda: self.fs.call_s3(method, Bucket=self.bucket, Key=self.key, **kwargs))

    @staticmethod
    def _refused(exc: BaseException) -> bool:
        code = getattr(exc.__cause__, "response", {}).get("Error", {}).get("Code")
        return code in ("PreconditionFailed", "ConditionalRequestConflict") or isinstance(exc, FileNotFoundError)

    def read(self) -> tuple[bytes, str] | None:
        from fsspec.asyn import sync

        async def get() -> tuple[bytes, str]:
            response = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.key)
            async with response["Body"] as body:
                return await body.read(), response["ETag"]

        try:
            return patiently(self.location, lambda: sync(self.fs.loop, get))
        except FileNotFoundError:
            return None

    def _conditional(self, method: str, **kwargs) -> dict | None:
        try:
            return self._call(method, **kwargs)
        except OSError as exc:
            if self._refused(exc):
                return None
            raise

    def create(self, data: bytes) -> str | None:
        response = self._conditional("put_object", Body=data, IfNoneMatch="*")
        return None if response is None else response["ETag"]

    def replace(self, data: bytes, version: str) -> str | None:
        response = self._conditional("put_object", Body=data, IfMatch=version)
        return None if response is None else response["ETag"]

    def delete(self, version: str) -> bool:
        return self._conditional("delete_object", IfMatch=version) is not None


def lease_store(directory: str) -> LeaseStore:
    """The store for a checkpoint directory (a path, ``file://`` or ``s3://``)."""
    protocol, sep, rest = directory.partition("://")
    if not sep:
        return LocalLeaseStore(directory)
    if protocol == "file":
        return LocalLeaseStore(rest)
    if protocol in ("s3", "s3a"):
        return S3LeaseStore(directory)
    raise LeaseError(f"checkpoint directory {directory}: a lease needs an atomic create-if-absent, which this "
                     f"platform implements for local paths and s3:// only, not {protocol}://")


class Lease:
    """The lease on one checkpoint directory, as one trainer (rank 0) holds it."""

    def __init__(self, store: LeaseStore, holder: Holder, *, ttl_seconds: float, log: Callable[[str], None],
                 warn: Callable[[str], None]) -> None:
        self.store, self.holder, self.ttl = store, holder, ttl_seconds
        self.log, self.warn = log, warn
        self.record: Record | None = None
        self.version: str | None = None
        """The store's version of our lease; None while not held."""
        self.waited_seconds = 0.0
        self.released_at: float | None = None
        """When this holder stopped holding: stamped before the lease is deleted, so that no other
        holder's ``acquired_at`` can precede it."""
        self.took_over: str = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self.version is not None

    def _new_record(self) -> Record:
        now = time.time()
        if self.record is None:
            return Record(holder=self.holder, token=uuid.uuid4().hex, acquired_at=now, renewed_at=now,
                          ttl_seconds=self.ttl)
        return dataclasses.replace(self.record, renewed_at=now)

    def acquire(self, wait_seconds: float, poll_seconds: float = 0.5) -> None:
        """Take the lease, waiting up to ``wait_seconds`` for a live holder to release it (a stale one
        is taken over at once); ``LeaseHeld``, naming the holder, when it is still held then."""
        started = time.monotonic()
        seen: tuple[str, float] | None = None  # (version, when first seen): expiry by our own clock
        announced = ""
        while True:
            record = self._new_record()
            if (version := self.store.create(record.to_bytes())) is not None:
                break
            current = self.store.read()
            if current is None:
                continue  # released between our create and read
            raw, held_version = current
            if raw == record.to_bytes():  # our own create, applied before its answer was lost
                version = held_version
                break
            if seen is None or seen[0] != held_version:
                seen = (held_version, time.monotonic())
            other = _parse(raw)
            stale = self._stale(other, raw, time.monotonic() - seen[1])
            if stale and (version := self.store.replace(record.to_bytes(), held_version)) is not None:
                self.took_over = stale
                self.warn(f"checkpoint lease {self.store.location}: took over from {stale}")
                break
            held_by = _describe(other)
            waited = time.monotonic() - started
            if waited >= wait_seconds:
                raise LeaseHeld(
                    f"checkpoint directory {self.store.location.rsplit('/', 1)[0]} is being written by another "
                    f"training: {held_by}; waited {waited:.0f}s (training.checkpoint.lease_wait_seconds "
                    f"{wait_seconds:g}). Two trainings of the same config must not write the same checkpoints; "
                    "wait for it to finish (or stop it), then run again")
            token = other.token if other else "unreadable"
            if token != announced:  # once per holder, not at every renewal
                self.log(f"checkpoint lease {self.store.location} is held by {held_by}; waiting up to "
                         f"{wait_seconds - waited:.0f}s for it")
                announced = token
            time.sleep(poll_seconds)
        self.record, self.version = record, version
        self.waited_seconds = time.monotonic() - started

    @staticmethod
    def _stale(record: Record | None, raw: bytes, unchanged_for: float) -> str:
        """Why the lease ``record`` may be taken over ("" when it may not)."""
        if record is None:
            return f"an unreadable lease ({raw[:60]!r})"
        holder, ttl = record.holder, record.ttl_seconds
        if holder.checkable_here() and not processes.is_alive(holder.pid, holder.started):
            return f"{holder.describe()}, which is no longer running"
        if unchanged_for >= ttl:
            return f"{holder.describe()}, not renewed for {unchanged_for:.0f}s (ttl {ttl:g}s)"
        if (age := time.time() - record.renewed_at) >= 2 * ttl:
            return f"{holder.describe()}, last renewed {age:.0f}s ago (ttl {ttl:g}s)"
        return ""

    def _lost(self, what: str) -> LeaseLost:
        current = self.store.read()
        holder = "nobody" if current is None else _describe(_parse(current[0]))
        return LeaseLost(f"checkpoint lease {self.store.location} {what}: now held by {holder}")

    def confirm(self) -> None:
        """Raise ``LeaseLost`` unless the lease in the store is still ours."""
        with self._lock:
            if self.version is None:
                raise LeaseLost(f"checkpoint lease {self.store.location} is not held")
            current = self.store.read()
            if current is None or current[1] != self.version:
                raise self._lost("was lost")

    def renew(self) -> None:
        with self._lock:
            if self.version is None:
                raise LeaseLost(f"checkpoint lease {self.store.location} is not held")
            record = self._new_record()
            version = self.store.replace(record.to_bytes(), self.version)
            if version is None:
                self.version = None
                raise self._lost("was taken over")
            self.record, self.version = record, version

    def start_renewing(self, on_lost: Callable[[LeaseLost], None]) -> None:
        """Renew every third of the TTL in a background thread; ``on_lost`` when it cannot."""

        def loop() -> None:
            while not self._stop.wait(self.ttl / 3):
                try:
                    self.renew()
                except LeaseLost as exc:
                    on_lost(exc)
                    return
                except Exception as exc:  # storage hiccup: the next renewal may work; the TTL is the limit
                    self.warn(f"checkpoint lease {self.store.location}: renewal failed ({exc}); retrying")

        self._renewer = threading.Thread(target=loop, name="lease-renewal", daemon=True)
        self._renewer.start()

    def release(self) -> None:
        """Give the lease up (only if it is still ours). Safe to call twice."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=5)
        with self._lock:
            if self.version is not None:
                self.released_at = time.time()
                with contextlib.suppress(Exception):
                    self.store.delete(self.version)
                self.version = None

    def summary(self) -> dict:
        """What the trained checkpoint records about the lease."""
        return {"location": self.store.location, "acquired_at": self.record.acquired_at if self.record else None,
                "released_at": self.released_at, "waited_s": round(self.waited_seconds, 3),
                "took_over_from": self.took_over}


def _parse(raw: bytes) -> Record | None:
    try:
        return Record.from_bytes(raw)
    except (ValueError, TypeError, KeyError):
        return None


def _describe(record: Record | None) -> str:
    if record is None:
        return "an unreadable lease"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.acquired_at))
    return f"{record.holder.describe()}, holding it since {since}, renewed {time.time() - record.renewed_at:.0f}s ago"
