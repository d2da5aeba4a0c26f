"""Reading pinned files: a URI (path or fsspec URL) and the sha256 it must have."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import fsspec


class IntegrityError(ValueError):
    pass


def read_verified(uri: str, sha256: str) -> bytes:
    with fsspec.open(uri, "rb") as fh:
        data = fh.read()
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
    try:
        with fs.open(path, "rb") as src, tmp.open("wb") as dst:
            actual = _copy_hashing(src, dst)
        if actual != sha256:
            raise IntegrityError(f"{uri}: sha256 is {actual}, expected {sha256}; refusing to use it")
        os.replace(tmp, cached)
    finally:
        tmp.unlink(missing_ok=True)
    return cached
