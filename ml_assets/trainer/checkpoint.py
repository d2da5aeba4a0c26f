"""Training checkpoints: torch.distributed.checkpoint (DCP) through fsspec, saved by every rank
together and found again when a training resumes.

Layout under the config's checkpoint root (a path or an fsspec URL such as ``s3://bucket/...``)::

    step-000000120/   .metadata, __0_0.distcp, ...   DCP: model, optimizer, RNG (tensors only)
                      progress.json                  epoch, sampler position, scheduler, history
                      manifest.json                  sha256 + size of every file above, written LAST
    best/             model.safetensors, manifest.json   weights with the best validation loss

A checkpoint without ``manifest.json`` is incomplete (the writer died): ignored. One whose files do
not match its manifest is corrupt or tampered: named in a warning and skipped for the previous one;
if no complete checkpoint verifies, resuming fails instead of silently starting over.

A store that stops answering (an S3 endpoint restarting) is waited out as ml_assets.storage
``patiently`` waits, each wait a line of the rank's log: rank 0's own reads and writes (progress,
manifest, pruning, best weights, finding the newest checkpoint) one by one, and DCP's collective
saves and loads by every rank together (DCP hands every rank the same error, so they all retry).
A background (async) write the store did not take is given up with a warning: training goes on,
and the next checkpoint is written whole; the previous complete one stays the resume point.

Nothing here unpickles anything a checkpoint store could hand us: only tensors go into DCP (so its
loader never unpickles non-tensor items, which it would do without the weights-only guard), and
DCP's ``.metadata`` and every file are checked first (ml_assets.trainer.checkpoint_files). The final
export, safetensors plus JSON, is ml_assets.trainer.export; its names are importable from here too.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from ml_assets.storage import patiently, unreachable
from ml_assets.trainer.checkpoint_files import (
    CheckpointError,
    fs_and_path,
    newest_verified,
    prune,
    verify,
    write_manifest,
)
from ml_assets.trainer.dcp_metadata import SafeFsspecReader
from ml_assets.trainer.export import LoadedCheckpoint, export_model, load_checkpoint
from ml_assets.trainer.lease import Lease

PROGRESS = "progress.json"
BEST = "best"
STEP_PREFIX = "step-"
ASYNC_MIN_BYTES = 16 * 2**20
"""Below this, a checkpoint is written synchronously even in an async mode: a small state is written
in about the time async staging takes (benchmarks/checkpoint_stall.py), and a synchronous
checkpoint is committed before training goes on, so a crash right after it loses nothing."""


@dataclass
class Found:
    directory: str
    step: int
    progress: dict


class CheckpointManager:
    """Saves and finds checkpoints for one training (one config fingerprint) on every rank.

    Every rank calls ``save`` at the same step (DCP is collective). Rank 0 alone writes
    progress.json and the manifest, after every rank's files are written, then prunes to the last
    ``keep_last`` complete checkpoints. ``mode`` "thread"/"process" returns as soon as the state is
    copied to memory; the write, the hashing and the manifest happen in the background (for states
    of at least ASYNC_MIN_BYTES; smaller ones are written synchronously).
    """

    def __init__(self, root: str, *, rank: int, world: int, mode: str, keep_last: int,
                 log: Callable[[str], None], warn: Callable[[str], None]) -> None:
        self.root = root.rstrip("/")
        self.rank, self.world, self.mode, self.keep_last = rank, world, mode, keep_last
        self.log, self.warn = log, warn
        self.lease: Lease | None = None
        """Rank 0's lease on the directory, once taken: confirmed before each commit (a manifest), so
        a checkpoint written after another training took the directory over never becomes complete."""
        # DCP's background save runs collectives; on the training group they could interleave with
        # DDP's all-reduces. A group of its own (gloo: the staged copies live in CPU memory) avoids it.
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._pending: Future | None = None
        self._finalizer: threading.Thread | None = None
        self._error: BaseException | None = None
        self._best_writer: threading.Thread | None = None
        self._writing = -1
        """The step of the save in flight (for what a warning names)."""

    # saving
    def save(self, step: int, tensors: dict[str, torch.Tensor], progress: dict, *, blocking: bool = False) -> float:
        """Checkpoint ``tensors`` (same keys on every rank) at ``step``; returns the seconds the
        caller was held up."""
        started = time.perf_counter()
        self.wait()
        directory = f"{self.root}/{STEP_PREFIX}{step:09d}"
        self._writing = step
        # An FSDP shard (DTensor) counts its global size, the same on every rank: the ranks must all
        # take the same branch below (the synchronous one ends in a barrier).
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if self.mode == "off" or blocking or size < ASYNC_MIN_BYTES:
            patiently(directory, lambda: dcp.save(tensors, storage_writer=FsspecWriter(directory, overwrite=True),
                                                  process_group=self.group), say=self.warn)
            if self.rank == 0:
                self._finish(directory, step, progress)
            self._barrier()
        else:
            kind = AsyncCheckpointerType.PROCESS if self.mode == "process" else AsyncCheckpointerType.THREAD
            response = dcp.async_save(tensors, storage_writer=FsspecWriter(directory, overwrite=True),
                                      process_group=self.group, async_checkpointer_type=kind)
            future = getattr(response, "upload_completion", response)
            self._pending = future
            if self.rank == 0:
                self._finalizer = threading.Thread(target=self._finish_after, args=(future, directory, step, progress),
                                                   name="checkpoint-manifest", daemon=True)
                self._finalizer.start()
        return time.perf_counter() - started

    def _finish_after(self, future: Future, directory: str, step: int, progress: dict) -> None:
        try:
            future.result()
            self._finish(directory, step, progress)
        except BaseException as exc:  # reported by wait() on the training thread
            self._error = exc

    def _finish(self, directory: str, step: int, progress: dict) -> None:
        def commit() -> None:  # each part may run again: the same bytes to the same names
            if self.lease is not None:
                self.lease.confirm()
            fs, path = fs_and_path(directory)
            with fs.open(f"{path}/{PROGRESS}", "wb") as fh:
                fh.write(json.dumps(progress, sort_keys=True).encode())
            write_manifest(directory, {"step": step, "fingerprint": progress["fingerprint"], "world_size": self.world})

        patiently(directory, commit, say=self.warn)
        patiently(self.root, self._prune, say=self.warn)

    def wait(self) -> None:
        """Block until the last save is written and committed; re-raise its failure (an async write
        the store did not take is given up instead, see the module's docstring)."""
        error = None
        if self._pending is not None:
            try:
                self._pending.result()
            except BaseException as exc:  # DCP's CheckpointException is a BaseException
                error = exc
            self._pending = None
        if self._finalizer is not None:
            self._finalizer.join()
            self._finalizer = None
        self._join_best()
        error, self._error = error or self._error, None
        if error is None:
            return
        if (reason := unreachable(error)) is not None:
            self.warn(f"the checkpoint of step {self._writing} was not written: the object store did not answer "
                      f"({reason}); training goes on, and the next checkpoint is written whole")
            return
        raise CheckpointError(f"writing a checkpoint under {self.root} failed: {error}") from error

    def close(self) -> None:
        """Finish the last save and tear down the checkpoint group on every rank together (a gloo
        group left for garbage collection can hang a rank whose peer already exited)."""
        try:
            self.wait()
        finally:
            if self.mode == "process":
                _stop_checkpoint_process()
            if self.group is not None:
                dist.barrier(group=self.group)
                dist.destroy_process_group(self.group)
                self.group = None

    def _barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def _prune(self) -> None:
        prune(self.root, STEP_PREFIX, self.keep_last)

    # finding and loading
    def latest(self, fingerprint: str) -> Found | None:
        """The newest checkpoint that verifies (rank 0 checks, every rank gets the answer)."""
        choice = torch.tensor([-1], dtype=torch.int64)
        problem = ""
        if self.rank == 0:
            try:
                found = self._latest_verified(fingerprint)
                choice[0] = -1 if found is None else found
            except CheckpointError as exc:
                choice[0], problem = -2, str(exc)
        if self.group is not None:
            dist.broadcast(choice, src=0, group=self.group)
        step = int(choice[0])
        if step == -2:
            raise CheckpointError(problem or f"rank 0 found no usable checkpoint under {self.root}")
        if step == -1:
            return None
        directory = f"{self.root}/{STEP_PREFIX}{step:09d}"
        fs, path = fs_and_path(directory)
        with fs.open(f"{path}/{PROGRESS}", "rb") as fh:
            progress = json.loads(fh.read())
        return Found(directory, step, progress)

    def _latest_verified(self, fingerprint: str) -> int | None:
        found = patiently(self.root, lambda: newest_verified(self.root, STEP_PREFIX, fingerprint, self.log, self.warn),
                          say=self.warn)
        return None if found is None else found[0]

    def load(self, found: Found, tensors: dict[str, torch.Tensor]) -> None:
        """Fill ``tensors`` in place from a verified checkpoint (keys the checkpoint lacks stay)."""
        patiently(found.directory, lambda: dcp.load(tensors, storage_reader=SafeFsspecReader(found.directory),
                                                    process_group=self.group), say=self.warn)

    def saved_keys(self, found: Found) -> dict[str, tuple[int, ...]]:
        metadata = SafeFsspecReader(found.directory).read_metadata()
        return {k: tuple(v.size) for k, v in metadata.state_dict_metadata.items() if hasattr(v, "size")}

    # best weights
    def save_best(self, weights: dict[str, torch.Tensor], info: dict) -> None:
        """Rank 0: the best weights so far as safetensors + manifest, replacing the previous best.
        The tensors are copied now; the file is written in the background."""
        copied = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in weights.items()}
        self._join_best()
        self._best_writer = threading.Thread(target=self._write_best, args=(copied, info), name="best-weights",
                                             daemon=True)
        self._best_writer.start()

    def _write_best(self, weights: dict[str, torch.Tensor], info: dict) -> None:
        def write() -> None:
            if self.lease is not None:
                self.lease.confirm()
            directory = f"{self.root}/{BEST}"
            fs, path = fs_and_path(directory)
            if fs.exists(path):
                fs.rm(path, recursive=True)
            fs.makedirs(path, exist_ok=True)
            with fs.open(f"{path}/model.safetensors", "wb") as fh:
                fh.write(safetensors_save(weights))
            write_manifest(directory, info)

        try:
            patiently(self.root, write, say=self.warn)
        except BaseException as exc:  # reported by wait() on the training thread
            self._error = exc

    def _join_best(self) -> None:
        if self._best_writer is not None:
            self._best_writer.join()
            self._best_writer = None

    def load_best(self) -> tuple[dict[str, torch.Tensor], dict] | None:
        self._join_best()
        directory = f"{self.root}/{BEST}"
        fs, path = fs_and_path(directory)
        if not fs.exists(path):
            return None
        manifest, reason = verify(directory)
        if manifest is None:
            raise CheckpointError(f"best weights {directory} are unusable: {reason}")
        with fs.open(f"{path}/model.safetensors", "rb") as fh:
            return safetensors_load(fh.read()), manifest


def _stop_checkpoint_process(timeout: float = 10.0) -> None:
    """Stop DCP's background checkpoint process now, not at interpreter exit.

    torch keeps it in a module global and stops it from ``__del__`` during shutdown, racing
    multiprocessing's own exit handler, which joins daemon children without a timeout: a process
    that used async "process" saves could finish its work and then never exit (seen in CI).
    """
    from torch.distributed.checkpoint import _async_process_executor as executor

    worker = executor._CHECKPOINT_PROCESS
    if worker is None:
        return
    executor._CHECKPOINT_PROCESS = None
    process = worker._save_process
    if process.is_alive():
        # A closed pipe means the process is already on its way out.
        with contextlib.suppress(OSError, ValueError):
            worker._send(executor._CheckpointSaveProcessControlOpts.TERMINATE)
        process.join(timeout=timeout)
    if process.is_alive():
        process.kill()
        process.join(timeout=timeout)


__all__ = ["CheckpointError", "CheckpointManager", "Found", "LoadedCheckpoint", "SafeFsspecReader", "export_model",
           "load_checkpoint", "verify", "write_manifest"]
