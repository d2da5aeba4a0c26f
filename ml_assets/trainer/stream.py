"""Windows larger than memory (``data_mode: streaming``): each epoch, every rank streams its shard of
the window's Parquet row groups through a seeded shuffle buffer, and a resumed run replays its
position exactly. Nothing here holds more than the buffer and a few row groups, however long the
window.

- Verification. Every feature file is checked against its sha256 once, when the trainer starts,
  in one chunked pass (``ml_assets.storage.verified_local``); a file that is not local is copied
  into the cache directory as it is hashed, and streamed from there. Copies unused for
  ``CACHE_KEEP_DAYS`` are removed when a training opens its window.
- Shards. The window's row groups (their row counts come from the Parquet footers; no row is read)
  are permuted by ``seed + epoch``, as the in-memory sampler permutes rows; rank r of W takes
  positions r, r+W, r+2W, ... of that permutation.
- Equal steps. Every optimizer step all-reduces, so every rank must run as many steps, but shards
  differ in rows. Every rank streams as many rows as the epoch's largest shard: a rank with fewer
  pads, after its own rows, with rows repeated from the epoch's row groups (from its own position
  in the permutation on, in file order), as DistributedSampler pads. Padding, not truncation: each
  epoch trains every row of the window once, and repeats at most (largest - smallest shard) rows
  per rank. The steps of every epoch follow from the footers alone.
- The shuffle buffer. A rank's row groups are read in shard order, a few at a time (``shuffle.READ_ROWS``),
  and transformed by the fitted feature state; when ``shuffle_buffer_rows`` rows wait, they are
  shuffled (by a generator seeded with seed, epoch and rank) and all but half of the buffer goes
  out as micro-batches; the shard's end empties it. A row group larger than the buffer is shuffled
  with what waits.
- Read-ahead. A background thread reads, transforms and shuffles while the loop trains; the loop
  builds the next epoch's stream while the current one trains, so its first batch is ready (and
  epoch 0's reader starts when the window is opened).
- Exact resume. Which rows the buffer lets out depends on row counts and the generator alone,
  never on the values: the stream of row ids can be replayed without reading a row. A resumed rank
  replays its epoch's ids up to the rows it had trained (``Progress.rows_in_epoch`` / W), reads
  only the row groups whose rows are still waiting, and continues: the same batches, bit for bit.
  On another number of ranks the shards differ: each rank skips the same share of its new stream
  (rows_in_epoch / W rows), so the epoch keeps its length, but the rest of that epoch is drawn from
  the new shards (a few rows trained twice in it, as many not at all); later epochs are whole.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import os
import queue
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ml_assets.storage import verified_local
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.data import check_class_indices, to_tensors
from ml_assets.trainer.shuffle import EpochPlan, EpochStream, RowGroup, Rows, cat

READ_AHEAD = 2
"""Shuffled chunks (each at least half a buffer) a rank's reader may hold ready."""


CACHE_KEEP_DAYS = 7.0
"""A cached copy unused for this long is removed when a training opens its window: a restarted or
retried training (hours later) finds its files, and a machine's disk does not fill with windows
that nobody trains on any more."""


def default_cache_dir() -> str:
    return str(Path(tempfile.gettempdir()) / "ml_assets-stream-cache")


def prune_cache(cache: str | Path, keep: Sequence[Path], days: float = CACHE_KEEP_DAYS) -> list[Path]:
    """Remove the cached copies (and copies left half-written by a killed process) last used more than
    ``days`` ago, except ``keep``; returns what was removed. A copy's time of last use is its mtime
    (``verified_local`` touches it on every use). Another training on this machine that still reads a
    removed copy keeps reading it (POSIX unlink); one that verifies it again copies it again."""
    root = Path(cache)
    if not root.is_dir():
        return []
    cutoff, kept = time.time() - days * 86400, {Path(p).resolve() for p in keep}
    removed = []
    for entry in root.iterdir():
        try:
            if entry.is_file() and entry.resolve() not in kept and entry.stat().st_mtime < cutoff:
                entry.unlink()
                removed.append(entry)
        except FileNotFoundError:  # another training pruned it first
            continue
    return removed


class StreamedWindow:
    """The training files of one config as row groups, verified once, read and transformed a few at
    a time. Raises ValueError naming the file for a file that is not Parquet or lacks a column."""

    def __init__(self, cfg: TrainConfig, state: dict, rank: int, world: int) -> None:
        self.cfg, self.state, self.rank, self.world = cfg, state, rank, world
        cache = cfg.stream_cache_dir or default_cache_dir()
        self.uris = [ref.uri for ref in cfg.train_files]
        self.paths = [verified_local(ref.uri, ref.sha256, cache) for ref in cfg.train_files]
        if int(os.environ.get("LOCAL_RANK", rank)) == 0:  # once per machine
            prune_cache(cache, self.paths)
        self.columns = [c["name"] for c in [*state["numeric"], *state["categorical"]]] + [state["target"]]
        self.footers = [self._footer(i) for i in range(len(self.paths))]
        self.groups = [group for f, md in enumerate(self.footers) for group in _groups(f, md) if group.rows]
        self.rows = sum(g.rows for g in self.groups)
        if not self.rows:
            raise ValueError(f"the training files hold no rows: {self.uris}")
        self._plan: EpochPlan | None = None
        self._readers = Readers()
        # A fresh training asks first for epoch 0 from its start: its reader starts now, while the
        # model is built (a resumed training asks for another position, and this one is dropped).
        self._first: tuple[tuple, StreamLoader] | None = None  # (what it was asked for, the loader)
        micro_batch = max(1, cfg.batch_size // (world * cfg.grad_accum_steps))  # as TrainerSetup's
        self._first = ((0, 0, micro_batch), self.loader(0, 0, micro_batch))

    def _footer(self, i: int) -> pq.FileMetaData:
        try:
            metadata = pq.read_metadata(self.paths[i])
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(f"{self.uris[i]}: not a readable Parquet file ({exc})") from None
        missing = [c for c in self.columns if c not in metadata.schema.names]
        if missing:
            raise ValueError(f"{self.uris[i]}: lacks the column(s) {missing} that the feature state and "
                             f"target {self.state['target']!r} need")
        return metadata

    def plan(self, epoch: int) -> EpochPlan:
        """This rank's row groups of ``epoch`` and the rows every rank streams in it (footers only)."""
        plan = self._plan  # asked at every step (and by the thread building the next epoch): kept
        if plan is None or plan.epoch != epoch:
            plan = self._plan = self._new_plan(epoch)
        return plan

    def _new_plan(self, epoch: int) -> EpochPlan:
        generator = torch.Generator()
        generator.manual_seed(self.cfg.seed + epoch)
        order = torch.randperm(len(self.groups), generator=generator).tolist()
        shard_rows = [sum(self.groups[g].rows for g in order[r::self.world]) for r in range(self.world)]
        first = self.rank % len(order)
        return EpochPlan(epoch=epoch, groups=tuple(order[self.rank::self.world]), own_rows=shard_rows[self.rank],
                         rows=max(shard_rows), padding=tuple(order[first:] + order[:first]))

    def read(self, groups: Sequence[int]) -> Rows:
        """The rows of row groups ``groups``, in that order, as model inputs: one polars query
        reads them (the Parquet reader skips the other row groups) and one transform encodes them."""
        pieces: list[list[int]] = []  # [file, first row, rows]: adjacent row groups of a file read as one
        for g in groups:
            group = self.groups[g]
            if pieces and pieces[-1][0] == group.file and sum(pieces[-1][1:]) == group.offset:
                pieces[-1][2] += group.rows
            else:
                pieces.append([group.file, group.offset, group.rows])
        scans = [pl.scan_parquet(self.paths[f]).select(self.columns).slice(first, n) for f, first, n in pieces]
        try:
            frame = pl.concat(scans, how="vertical_relaxed").collect()
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise ValueError(f"{self._where(groups)}: {exc}") from None
        rows = to_tensors(frame, self.state)
        if self.cfg.task == "multiclass_classification":
            check_class_indices(rows[2], self.cfg.classes, f"training {self._where(groups)}")
        return rows

    def _where(self, groups: Sequence[int]) -> str:
        return "; ".join(f"{self.uris[self.groups[g].file]} (row group {self.groups[g].index})" for g in groups)

    def loader(self, epoch: int, start: int, micro_batch: int) -> StreamLoader:
        """This rank's micro-batches of ``epoch`` after the first ``start`` rows of it (over all ranks)."""
        first, self._first = self._first, None
        if first is not None and first[0] == (epoch, start, micro_batch):
            return first[1]
        plan = self.plan(epoch)
        skip = min(start // self.world, plan.rows)
        seed = int.from_bytes(hashlib.sha256(f"{self.cfg.seed}/{epoch}/{self.rank}".encode()).digest()[:8], "little")
        stream = EpochStream(self.read, self.groups, plan, self.cfg.shuffle_buffer_rows, seed, skip)
        return StreamLoader(stream.chunks(), plan.rows - skip, micro_batch, self._readers)

    def describe(self) -> str:
        return (f"streaming {len(self.groups)} row groups of {len(self.paths)} file(s), "
                f"shuffle buffer {self.cfg.shuffle_buffer_rows} rows")


def _groups(file: int, footer: pq.FileMetaData) -> Iterator[RowGroup]:
    offset = 0
    for i in range(footer.num_row_groups):
        rows = footer.row_group(i).num_rows
        yield RowGroup(file, i, offset, rows)
        offset += rows


_END = object()


def _produce(chunks: Iterator[Rows], out: queue.Queue, stop: threading.Event) -> None:
    """A reader: chunks into ``out`` until they end, an error (handed over), or ``stop``."""

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    try:
        while not stop.is_set():
            chunk = next(chunks, _END)
            if not put(chunk) or chunk is _END:
                return
    except BaseException as exc:  # the loop re-raises it where it waits for a batch
        put(exc)


class Readers:
    """Two long-lived daemon threads that run a window's readers (the current epoch's and the next
    one's). Not a thread per epoch: glibc gives new threads malloc arenas of their own, and with a
    thread per epoch a rank's memory grew by about a megabyte an epoch (measured: 426 MB after one
    epoch, 471 MB after 24). Daemons, stopped at exit: a reader still inside polars or torch when the
    interpreter finalizes aborts the process (``terminate called``), which would turn a clean exit
    (or the preemption code 75) into a crash."""

    def __init__(self, threads: int = 2) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._stops: set[threading.Event] = set()
        self._idle = threading.Condition()
        self._busy = 0
        for i in range(threads):
            threading.Thread(target=self._work, name=f"stream-reader-{i}", daemon=True).start()
        _OPEN.add(self)

    def _work(self) -> None:
        while True:
            args = self._tasks.get()
            with self._idle:
                self._busy += 1
            try:
                _produce(*args)
            finally:
                with self._idle:
                    self._busy -= 1
                    self._stops.discard(args[2])
                    self._idle.notify_all()

    def submit(self, chunks: Iterator[Rows], out: queue.Queue, stop: threading.Event) -> None:
        with self._idle:
            self._stops.add(stop)
        self._tasks.put((chunks, out, stop))

    def close(self, timeout: float = 10.0) -> None:
        """Stop every reader and wait (at most ``timeout``) for the one in a read to finish it."""
        with self._idle:
            for stop in self._stops:
                stop.set()
            self._idle.wait_for(lambda: not self._busy and not self._stops, timeout)


_OPEN: weakref.WeakSet[Readers] = weakref.WeakSet()


@atexit.register
def _close_readers() -> None:
    for readers in list(_OPEN):
        readers.close()


class StreamLoader:
    """One rank's micro-batches of one epoch; a reader thread reads ahead from the moment it is built."""

    def __init__(self, chunks: Iterator[Rows], rows: int, micro_batch: int, readers: Readers) -> None:
        self.micro_batch, self.batches = micro_batch, math.ceil(rows / micro_batch)
        self._queue: queue.Queue = queue.Queue(maxsize=READ_AHEAD)
        self._stop = threading.Event()
        # The reader holds the chunks, the queue and the event, not the loader: a loader dropped
        # mid-epoch (max_steps, a stop, a resume elsewhere) is collected, and frees its reader.
        readers.submit(chunks, self._queue, self._stop)

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[Rows]:
        b, carry = self.micro_batch, None
        while (chunk := self._queue.get()) is not _END:
            if isinstance(chunk, BaseException):
                raise chunk
            if carry is not None:
                chunk = cat([carry, chunk])
            full = len(chunk[2]) - len(chunk[2]) % b
            for start in range(0, full, b):
                yield tuple(t[start:start + b] for t in chunk)
            carry = tuple(t[full:] for t in chunk) if full < len(chunk[2]) else None
        if carry is not None:
            yield carry

    def __del__(self) -> None:
        self._stop.set()
