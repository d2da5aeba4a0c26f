import hashlib
import uuid
from dataclasses import dataclass

import dagster as dg
import fsspec

from ml_assets.names import check_object_path
from ml_assets.storage import patiently, read_verified
from ml_assets.trainer.config import DataRef


@dataclass(frozen=True)
class ArtifactRef:
    uri: str
    sha256: str
    size: int

    def as_data_ref(self, day: str = "") -> DataRef:
        return DataRef(uri=self.uri, sha256=self.sha256, day=day)


class ArtifactStoreResource(dg.ConfigurableResource):
    """Derived artifacts (features, fitted state, reports), content-addressed under an fsspec root.

    A file's name is its sha256, so a write never replaces bytes someone pinned, and readers verify.
    """

    root: str

    def put(self, prefix: str, data: bytes, suffix: str) -> ArtifactRef:
        check_object_path(prefix)
        sha = hashlib.sha256(data).hexdigest()
        uri = f"{self.root.rstrip('/')}/{prefix}/{sha}{suffix}"

        def write() -> None:
            fs, path = fsspec.core.url_to_fs(uri)
            if not fs.exists(path):
                # A name of its own: two runs writing the same bytes at once must not share a temporary
                # file (one would truncate what the other is about to rename into place).
                tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
                fs.makedirs(fs._parent(path), exist_ok=True)
                with fs.open(tmp, "wb") as fh:
                    fh.write(data)
                fs.mv(tmp, path)

        patiently(uri, write)  # a store that stops answering is waited out, visibly, within a bound
        return ArtifactRef(uri, sha, len(data))

    def get(self, uri: str, sha256: str) -> bytes:
        return read_verified(uri, sha256)


class CheckpointStoreResource(dg.ConfigurableResource):
    """Where trained checkpoints go: a directory or fsspec URL (s3:// in production)."""

    root: str
