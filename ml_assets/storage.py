"""Reading pinned files: a URI (path or fsspec URL) and the sha256 it must have; and waiting on an
object store that stops answering (``patiently``), visibly and within a bound.

s3fs retries a request a few times within a second or two and then raises whatever its HTTP
stack raised (``EndpointConnectionError``, aiohttp's ``ClientConnectorError``...): an S3 endpoint
restarting for ten seconds failed the step that was writing features, with Dagster's "Error occurred
while executing op" on top. Here a read or write that meets a store which does not answer is tried
again with backoff (1, 2, 4, 8, 16, 30 s: about a minute; ``ML_ASSETS_STORE_RETRIES`` sets the number
of retries), each wait a line in the step's log ("the object store at … not answering (…); retry 2
of 6 in 2 s"); past the bound it raises StoreUnavailable, "the object store at … did not answer: …".
Only a store that does not answer is retried: a missing object, a refused permission or a full disk
fail at once (ml_assets.trainer.faults names the last ones). No Dagster here: the trainer uses it too.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import fsspec


class IntegrityError(ValueError):
    pass


def read_verified(uri: str, sha256: str) -> bytes:
    def read() -> bytes:
        with fsspec.open(uri, "rb") as fh:
            return fh.read()

    data = patiently(uri, read)
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise IntegrityError(f"{uri}: sha256 is {actual}, expected {sha256}; refusing to use it")
    return data


CHUNK_BYTES = 8 << 20


def _copy_hashing(src, dst=None) -> str:
    """sha256 of what ``src`` holds, read chunk by chunk (and written to ``dst`` when given)."""
    digest = hashlib.sha256()
    while chunk := src.read(CHUNK_BYTES):
        digest.update(chunk)
        if dst is not None:
            dst.write(chunk)
    return digest.hexdigest()


def verified_local(uri: str, sha256: str, cache_dir: str | Path) -> Path:
    """A local file holding ``uri``'s bytes, checked against ``sha256`` in one chunked pass, never
    held whole: a local file is checked where it is; any other (an fsspec URL) is copied into
    ``cache_dir`` as it is hashed, named by its sha256, and reused from there by later calls
    (checked again). Raises IntegrityError naming the URI when the bytes differ."""
    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(uri)
    if isinstance(fs, LocalFileSystem):
        with open(path, "rb") as fh:
            actual = _copy_hashing(fh)
        if actual != sha256:
            raise IntegrityError(f"{uri}: sha256 is {actual}, expected {sha256}; refusing to use it")
        return Path(path)
    cached = Path(cache_dir) / f"{sha256}{Path(path).suffix}"
    if cached.exists():
        with cached.open("rb") as fh:
            if _copy_hashing(fh) == sha256:
                os.utime(cached)  # used now: a cache pruned by age keeps it (trainer.stream.prune_cache)
                return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own: ranks on one machine may copy the same file at once.
    tmp = cached.with_name(f"{cached.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    def copy() -> str:
        with fs.open(path, "rb") as src, tmp.open("wb") as dst:
            return _copy_hashing(src, dst)

    try:
        actual = patiently(uri, copy)
        if actual != sha256:
            raise IntegrityError(f"{uri}: sha256 is {actual}, expected {sha256}; refusing to use it")
        os.replace(tmp, cached)
    finally:
        tmp.unlink(missing_ok=True)
    return cached


T = TypeVar("T")

RETRIES_VARIABLE = "ML_ASSETS_STORE_RETRIES"
DEFAULT_RETRIES = 6
MAX_WAIT_S = 30.0
# Errors of a store that does not answer, by class name (botocore's, aiohttp's, urllib3's): the
# packages are not imported here, and their classes vary between versions.
UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
               "ClientConnectorError", "ClientConnectorDNSError", "ServerDisconnectedError", "ClientOSError",
               "ServerTimeoutError", "NewConnectionError", "ProtocolError"}


class StoreUnavailable(OSError):
    """The object store did not answer within the bound; the message names it and the last error."""


def unreachable(exc: BaseException) -> str | None:
    """The error, in a line, when ``exc`` (or one of its causes) is a store that did not answer."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (type(current).__name__ in UNREACHABLE or isinstance(current, ConnectionError | TimeoutError)
                and not isinstance(current, StoreUnavailable)):
            return f"{type(current).__name__}: {' '.join(str(current).split())}"[:300]
        # torch.distributed.checkpoint's CheckpointException carries each rank's error (and its
        # trace) in ``failures``, not as a cause: every rank gets the same one, so decides the same.
        failures = getattr(current, "failures", None)
        for failed in failures.values() if isinstance(failures, dict) else ():
            inner = failed[0] if isinstance(failed, tuple) else failed
            if isinstance(inner, BaseException) and (reason := unreachable(inner)):
                return reason
        current = current.__cause__ or current.__context__
    return None


def where(uri: str) -> str:
    """The store a URI is in, as a person finds it: the endpoint and the bucket (no credentials)."""
    parts = urlsplit(uri)
    if parts.scheme in ("", "file", "local"):
        return "the local disk"
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return f"{parts.scheme}://{parts.hostname or ''}" + (f" ({endpoint})" if endpoint else "")


def _say(line: str) -> None:
    if "dagster" in sys.modules:  # in a step: the line goes to the step's event log
        import dagster as dg

        dg.get_dagster_logger("ml_assets").warning(line)
    else:  # stderr alone (a logging call would reach it twice where no handler is configured)
        print(f"[ml_assets] WARNING {line}", file=sys.stderr, flush=True)


def retries() -> int:
    value = os.environ.get(RETRIES_VARIABLE, "")
    return int(value) if value.isdigit() else DEFAULT_RETRIES


def patiently(uri: str, fn: Callable[[], T], say: Callable[[str], None] | None = None, sleep=time.sleep) -> T:
    """``fn()``, tried again while the store of ``uri`` does not answer (see the module's docstring);
    ``say`` each wait (default: the step's log in a step, else stderr)."""
    say = say or _say
    bound = retries()
    for attempt in range(bound + 1):
        try:
            return fn()
        except BaseException as exc:  # only a store that does not answer (DCP's errors are BaseExceptions)
            reason = unreachable(exc)
            if reason is None:
                raise
            if attempt == bound:
                raise StoreUnavailable(f"the object store at {where(uri)} did not answer ({bound} retries over "
                                       f"~{sum(waits(bound)):.0f} s) for {uri}: {reason}") from exc
            wait = waits(bound)[attempt]
            say(f"the object store at {where(uri)} not answering ({reason}); retry {attempt + 1} of {bound} "
                f"in {wait:.0f} s")
            sleep(wait)
            _forget_connections()
    raise AssertionError("unreachable")


def waits(bound: int) -> list[float]:
    """The seconds before each of ``bound`` retries: 1, 2, 4, 8, 16, then 30 (any service we wait for)."""
    return [min(MAX_WAIT_S, 2.0 ** n) for n in range(bound)]


def _forget_connections() -> None:
    """s3fs caches its filesystem and that filesystem's connection pool: after a store came back, a
    cached pool may still hold the dead connections; drop the cached instances."""
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None:
        s3fs.S3FileSystem.clear_instance_cache()
