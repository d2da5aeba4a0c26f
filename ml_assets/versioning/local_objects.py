"""The embedded version store's objects: content-addressed bytes under the home or any fsspec URL
(``<objects>/ab/cdef…``, the file name is the sha256), so a branch or a commit never copies data.
An object is written once and read back only after its bytes hash to its name."""

from __future__ import annotations

import hashlib
import os
import uuid

from fsspec import AbstractFileSystem

from ml_assets.storage import patiently
from ml_assets.versioning.base import VersionStoreError


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ObjectStorage:
    """Writes and verified reads of objects, for the store that sets these attributes."""

    objects_url: str
    _fs: AbstractFileSystem
    _objects: str
    _local: bool
    """True when the objects are on local disk: written aside and renamed instead of PUT."""

    def _object_key(self, sha256: str) -> str:
        return f"{self._objects}/{sha256[:2]}/{sha256[2:]}"

    def _store_bytes(self, key: str, data: bytes) -> None:
        if self._local:  # write aside, then rename: a reader never sees half an object
            self._fs.makedirs(self._fs._parent(key), exist_ok=True)
            tmp = f"{key}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, key)
        else:  # object stores publish a PUT atomically; one that stops answering is waited out
            patiently(key, lambda: self._fs.pipe_file(key, data))

    def _write_object(self, data: bytes) -> str:
        sha = digest(data)
        key = self._object_key(sha)
        if not (self._fs.exists(key) if self._local else patiently(key, lambda: self._fs.exists(key))):
            self._store_bytes(key, data)
        return sha

    def _read_object(self, sha256: str, where: str) -> bytes:
        try:
            key = self._object_key(sha256)
            data = self._fs.cat_file(key) if self._local else patiently(key, lambda: self._fs.cat_file(key))
        except FileNotFoundError:
            raise VersionStoreError(f"{where}: object {sha256} is missing from {self.objects_url}") from None
        if digest(data) != sha256:
            raise VersionStoreError(f"{where} is corrupt: its bytes do not hash to {sha256}")
        return data

    def set_aside(self, sha256: str) -> str | None:
        """Move an object whose bytes are wrong out of its name (to ``<name>.corrupt-<id>``, kept for a
        person to look at), so the next write of the right bytes stores them. Returns where it went."""
        key = self._object_key(sha256)
        if not self._fs.exists(key):
            return None
        aside = f"{key}.corrupt-{uuid.uuid4().hex[:8]}"
        self._fs.mv(key, aside)
        return aside
