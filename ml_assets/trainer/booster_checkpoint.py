"""Boosting checkpoints: the booster in UBJSON every N rounds, written in the background by rank 0,
and found again (verified) when a training resumes.

Layout under the config's checkpoint root (a path or an fsspec URL)::

    round-000000050/   booster.ubj       the booster after 50 rounds (XGBoost's own format: no pickle)
                       progress.json     round, early-stopping state, history
                       manifest.json     sha256 + size of both, written LAST: the commit point

The boosters of every rank are the same (each round's histograms are all-reduced), so rank 0 alone
writes them. On resume rank 0 picks the newest checkpoint that verifies against its manifest (a
corrupt or tampered booster is named and skipped, and if none verifies the training fails instead of
starting over), reads its bytes and sends them to the other ranks, so nodes need not share a disk.
Nothing is loaded before its sha256 matched; the booster is UBJSON, which XGBoost parses as data.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ml_assets.storage import patiently
from ml_assets.trainer.checkpoint_files import (
    CheckpointError,
    fs_and_path,
    newest_verified,
    prune,
    write_manifest,
)
from ml_assets.trainer.lease import Lease

BOOSTER = "booster.ubj"
PROGRESS = "progress.json"
ROUND_PREFIX = "round-"


@dataclass
class FoundBooster:
    round: int
    raw: bytes
    progress: dict


class BoosterCheckpoints:
    """Saves and finds one training's booster checkpoints (one config fingerprint)."""

    def __init__(self, root: str, *, rank: int, world: int, mode: str, keep_last: int,
                 log: Callable[[str], None], warn: Callable[[str], None]) -> None:
        self.root = root.rstrip("/")
        self.rank, self.world, self.mode, self.keep_last = rank, world, mode, keep_last
        self.log, self.warn = log, warn
        self.lease: Lease | None = None
        """Rank 0's lease on the directory: confirmed before each commit, as for the PyTorch checkpoints."""
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None
        self.written = 0

    def save(self, round_: int, raw: bytes, progress: dict, *, blocking: bool = False) -> float:
        """Rank 0: checkpoint the booster's bytes after ``round_`` rounds; the seconds the caller waited.
        The bytes are already a copy (``save_raw``): training goes on while they are written."""
        started = time.perf_counter()
        if self.rank != 0:
            return 0.0
        self.wait()
        progress = json.loads(json.dumps(progress))
        if self.mode == "off" or blocking:
            self._write(round_, raw, progress)
        else:
            self._writer = threading.Thread(target=self._write_quietly, args=(round_, raw, progress),
                                            name="booster-checkpoint", daemon=True)
            self._writer.start()
        return time.perf_counter() - started

    def _write_quietly(self, round_: int, raw: bytes, progress: dict) -> None:
        try:
            self._write(round_, raw, progress)
        except BaseException as exc:  # raised by wait() on the training thread
            self._error = exc

    def _write(self, round_: int, raw: bytes, progress: dict) -> None:
        directory = f"{self.root}/{ROUND_PREFIX}{round_:09d}"

        def write() -> None:  # may run again (a store that stopped answering): the same bytes, the same names
            fs, path = fs_and_path(directory)
            fs.makedirs(path, exist_ok=True)
            with fs.open(f"{path}/{BOOSTER}", "wb") as fh:
                fh.write(raw)
            with fs.open(f"{path}/{PROGRESS}", "wb") as fh:
                fh.write(json.dumps(progress, sort_keys=True).encode())
            if self.lease is not None:
                self.lease.confirm()
            write_manifest(directory, {"step": round_, "fingerprint": progress["fingerprint"], "world_size": self.world})

        patiently(directory, write, say=self.warn)
        self.written += 1
        patiently(self.root, self._prune, say=self.warn)

    def wait(self) -> None:
        """Block until the last save is committed; re-raise its failure."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"writing a booster checkpoint under {self.root} failed: {error}") from error

    def close(self) -> None:
        self.wait()

    def _prune(self) -> None:
        prune(self.root, ROUND_PREFIX, self.keep_last)

    def latest(self, fingerprint: str) -> FoundBooster | None:
        """The newest checkpoint that verifies: rank 0 chooses and reads it, every rank gets its bytes."""
        found, problem = None, ""
        if self.rank == 0:
            try:
                found = self._latest_verified(fingerprint)
            except CheckpointError as exc:
                problem = str(exc)
        if self.world > 1:
            found = _broadcast(found, bool(problem))
        if problem or (found is not None and found.round < 0):
            raise CheckpointError(problem or f"rank 0 found no usable booster checkpoint under {self.root}")
        return found

    def _latest_verified(self, fingerprint: str) -> FoundBooster | None:
        return patiently(self.root, lambda: self._read_latest(fingerprint), say=self.warn)

    def _read_latest(self, fingerprint: str) -> FoundBooster | None:
        found = newest_verified(self.root, ROUND_PREFIX, fingerprint, self.log, self.warn)
        if found is None:
            return None
        round_, directory, manifest = found
        fs, path = fs_and_path(directory)
        raw = fs.cat_file(f"{path}/{BOOSTER}")
        progress = json.loads(fs.cat_file(f"{path}/{PROGRESS}"))
        # Verified a moment ago; checked again as read, so what is loaded is what was hashed.
        if _sha(raw) != manifest["files"][BOOSTER]["sha256"]:
            raise CheckpointError(f"{directory}/{BOOSTER} changed while it was read (sha256 {_sha(raw)[:12]}, "
                                  f"the manifest says {manifest['files'][BOOSTER]['sha256'][:12]})")
        return FoundBooster(round_, raw, progress)


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _broadcast(found: FoundBooster | None, failed: bool) -> FoundBooster | None:
    """Rank 0's choice to every rank: round (-1: none, -2: failed), then the booster and progress bytes."""
    head = torch.tensor([-2 if failed else (-1 if found is None else found.round), 0, 0], dtype=torch.int64)
    if found is not None:
        head[1], head[2] = len(found.raw), len(json.dumps(found.progress).encode())
    dist.broadcast(head, src=0)
    round_, n_raw, n_progress = (int(v) for v in head)
    if round_ == -1:
        return None
    if round_ == -2:
        return FoundBooster(-2, b"", {})
    payload = torch.zeros(n_raw + n_progress, dtype=torch.uint8)
    if found is not None:
        payload[:] = torch.frombuffer(bytearray(found.raw + json.dumps(found.progress).encode()), dtype=torch.uint8)
    dist.broadcast(payload, src=0)
    data = payload.numpy().tobytes()
    return FoundBooster(round_, data[:n_raw], json.loads(data[n_raw:]))
