"""Reading pinned files: a URI (path or fsspec URL) and the sha256 it must have."""

from __future__ import annotations

import hashlib

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
