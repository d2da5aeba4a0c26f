"""Windows larger than memory (``data_mode: streaming``): each epoch, every rank streams its shard of
the window's Parquet row groups through a seeded shuffle buffer, and a resumed run replays its
position exactly. Nothing here holds more than the buffer and a few row groups, however long the
window.

- Verification. Every feature file is checked against its sha256 once, when the trainer starts,
  in one chunked pass (``ml_assets.storage.verified_local``); a file that is not local is copied
  into the cache directory as it is hashed, and streamed from there.
- Shards. The window's row groups (their row counts come from the Parquet footers; no row is read)
  are permuted by ``seed + epoch``, as the in-memory sampler permutes rows; rank r of W takes
  positions r, r+W, r+2W, ... of that permutation.
- Equal steps. Every optimizer step all-reduces, so every rank must run as many steps, but shards
  differ in rows. Every rank streams as many rows as the epoch's largest shard: a rank with fewer
  pads, after its own rows, with rows repeated from the epoch's row groups (from its own position
  in the permutation on, in file order), as DistributedSampler pads. Padding, not truncation: each
  epoch trains every row of the window once, and repeats at most (largest - smallest shard) rows
  per rank. The steps of every epoch follow from the footers alone.
- The shuffle buffer. A rank's row groups are read in shard order, a few at a time (READ_ROWS),
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

import hashlib
import math
import queue
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ml_assets.storage import verified_local
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.data import check_class_indices, to_tensors

Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""numeric, categorical, target: the model's inputs for some rows."""
READ_AHEAD = 2
"""Shuffled chunks (each at least half a buffer) a rank's reader may hold ready."""
READ_ROWS = 8192
"""Consecutive row groups of a shard are read and transformed together up to about this many rows
(at most half the buffer): a transform costs about as much for one small row group as for ten."""


def default_cache_dir() -> str:
    return str(Path(tempfile.gettempdir()) / "ml_assets-stream-cache")


@dataclass(frozen=True)
class RowGroup:
    file: int
    """Index of its file in the config's ``train_files``."""
    index: int
    offset: int
    """Its first row's position in its file."""
    rows: int


@dataclass(frozen=True)
class EpochPlan:
    """One rank's share of one epoch."""

    epoch: int
    groups: tuple[int, ...]
    """Its row groups (indices into ``StreamedWindow.groups``), in the order they are read."""
    own_rows: int
    rows: int
    """Rows every rank streams this epoch: the largest shard's; own_rows less than that are padded."""
    padding: tuple[int, ...]
    """Row groups the padding rows come from, in order (cycled)."""


class StreamedWindow:
    """The training files of one config as row groups, verified once, read and transformed a few at
    a time. Raises ValueError naming the file for a file that is not Parquet or lacks a column."""

    def __init__(self, cfg: TrainConfig, state: dict, rank: int, world: int) -> None:
        self.cfg, self.state, self.rank, self.world = cfg, state, rank, world
        cache = cfg.stream_cache_dir or default_cache_dir()
        self.uris = [ref.uri for ref in cfg.train_files]
        self.paths = [verified_local(ref.uri, ref.sha256, cache) for ref in cfg.train_files]
        self.columns = [c["name"] for c in [*state["numeric"], *state["categorical"]]] + [state["target"]]
        self.footers = [self._footer(i) for i in range(len(self.paths))]
        self.groups = [group for f, md in enumerate(self.footers) for group in _groups(f, md) if group.rows]
        self.rows = sum(g.rows for g in self.groups)
        if not self.rows:
            raise ValueError(f"the training files hold no rows: {self.uris}")
        self._plan: EpochPlan | None = None
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
        return StreamLoader(stream.chunks(), plan.rows - skip, micro_batch)

    def describe(self) -> str:
        return (f"streaming {len(self.groups)} row groups of {len(self.paths)} file(s), "
                f"shuffle buffer {self.cfg.shuffle_buffer_rows} rows")


def _groups(file: int, footer: pq.FileMetaData) -> Iterator[RowGroup]:
    offset = 0
    for i in range(footer.num_row_groups):
        rows = footer.row_group(i).num_rows
        yield RowGroup(file, i, offset, rows)
        offset += rows


def _pick(rows: Rows | None, index: torch.Tensor) -> Rows | None:
    return None if rows is None else tuple(t.index_select(0, index) for t in rows)


def _cat(parts: list[Rows]) -> Rows:
    return tuple(torch.cat(columns) for columns in zip(*parts, strict=True))


class ShuffleBuffer:
    """Rows wait until ``capacity`` of them do; then they are shuffled and all but half of the
    buffer goes out. What goes out depends on the row counts and the generator alone, so the same
    calls on row ids without their rows (``rows`` None) replay it."""

    def __init__(self, capacity: int, generator: torch.Generator) -> None:
        self.capacity, self.generator = capacity, generator
        self.parts: list[tuple[torch.Tensor, Rows | None]] = []
        self.size = 0

    def add(self, ids: torch.Tensor, rows: Rows | None) -> None:
        # Kept as parts until the next shuffle: one concatenation per shuffle, not one per row group.
        self.parts.append((ids, rows))
        self.size += len(ids)

    def ready(self) -> bool:
        return self.size >= self.capacity

    def take(self, final: bool = False) -> tuple[torch.Tensor, Rows | None]:
        """Shuffle; the rows that go out (all of them when ``final``)."""
        ids = torch.cat([p[0] for p in self.parts])
        known = [p[1] for p in self.parts]
        rows = None if any(r is None for r in known) else _cat(known)
        order = torch.randperm(len(ids), generator=self.generator)
        keep = 0 if final else min(self.capacity // 2, len(ids))
        out, held = order[:len(ids) - keep], order[len(ids) - keep:]
        self.parts = [(ids[held], _pick(rows, held))] if keep else []
        self.size = keep
        return ids[out], _pick(rows, out)

    def load(self, fetch: Callable[[torch.Tensor], Rows]) -> None:
        """Give the waiting row ids their rows: the replay becomes the stream."""
        if self.parts:
            ids = torch.cat([p[0] for p in self.parts])
            self.parts = [(ids, fetch(ids))]


class EpochStream:
    """One rank's rows of one epoch, in shuffled chunks, from row ``skip`` of its stream on.

    A row's id is its position in the rank's row groups read in shard order; until the stream
    reaches ``skip``, the buffer runs on ids alone and no row group is read. Row groups are read in
    runs of about ``read_rows`` rows, decided by row counts alone, like everything the buffer does."""

    def __init__(self, read: Callable[[Sequence[int]], Rows], groups: list[RowGroup], plan: EpochPlan,
                 capacity: int, seed: int, skip: int) -> None:
        self.read, self.groups, self.plan, self.skip = read, groups, plan, skip
        self.read_rows = max(1, min(READ_ROWS, capacity // 2))
        self.sizes = [groups[g].rows for g in plan.groups]
        sizes = torch.tensor(self.sizes, dtype=torch.int64)
        self.starts = torch.cumsum(sizes, 0) - sizes
        generator = torch.Generator()
        generator.manual_seed(seed)
        self.buffer = ShuffleBuffer(capacity, generator)
        self.passed = 0  # rows of the stream skipped or handed out
        self.replaying = skip > 0

    def runs(self) -> Iterator[tuple[int, int]]:
        """Positions [first, last) of the shard's row groups read together."""
        first, rows = 0, 0
        for pos, n in enumerate(self.sizes):
            rows += n
            if rows >= self.read_rows or pos + 1 == len(self.sizes):
                yield first, pos + 1
                first, rows = pos + 1, 0

    def chunks(self) -> Iterator[Rows]:
        for first, last in self.runs():
            start = int(self.starts[first])
            ids = torch.arange(start, start + sum(self.sizes[first:last]), dtype=torch.int64)
            self.buffer.add(ids, None if self.replaying else self.read(self.plan.groups[first:last]))
            if self.buffer.ready():
                yield from self._emit(*self.buffer.take())
        if self.buffer.size:
            yield from self._emit(*self.buffer.take(final=True))
        yield from self._padding()

    def _emit(self, ids: torch.Tensor, rows: Rows | None) -> Iterator[Rows]:
        if self.passed + len(ids) <= self.skip:  # trained before the checkpoint
            self.passed += len(ids)
            return
        if rows is None:  # the replay reaches the resume point: from here on the rows are needed
            ids = ids[self.skip - self.passed:]
            self.passed = self.skip
            rows = self._fetch(ids)
            self.buffer.load(self._fetch)
            self.replaying = False
        self.passed += len(ids)
        yield rows

    def _fetch(self, ids: torch.Tensor) -> Rows:
        """The rows of ``ids`` (in that order), reading each row group they come from once, in runs
        of about ``read_rows`` rows (only the rows asked for are kept)."""
        order = torch.argsort(ids)
        wanted = ids[order]
        positions = torch.unique_consecutive(torch.searchsorted(self.starts, wanted, right=True) - 1).tolist()
        parts, run = [], []
        for i, pos in enumerate(positions):
            run.append(pos)
            if sum(self.sizes[p] for p in run) < self.read_rows and i + 1 < len(positions):
                continue
            # The run's rows, concatenated, and where each wanted id of the run lies among them.
            offsets = torch.tensor([int(self.starts[p]) for p in run])
            sizes = torch.tensor([self.sizes[p] for p in run])
            within = torch.cumsum(sizes, 0) - sizes
            mine = wanted[(wanted >= offsets[0]) & (wanted < offsets[-1] + sizes[-1])]
            at = torch.searchsorted(offsets, mine, right=True) - 1
            parts.append(_pick(self.read([self.plan.groups[p] for p in run]), within[at] + mine - offsets[at]))
            run = []
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        return _pick(_cat(parts), inverse)

    def _padding(self) -> Iterator[Rows]:
        """Rows repeated after this rank's own until it has streamed ``plan.rows``."""
        need, i = self.plan.rows - self.plan.own_rows, 0
        while need > 0:
            g = self.plan.padding[i % len(self.plan.padding)]
            i += 1
            n = min(need, self.groups[g].rows)
            need -= n
            cut = max(self.skip - self.passed, 0)
            self.passed += n
            if cut < n:
                yield tuple(t[cut:n] for t in self.read([g]))


_END = object()


def _produce(chunks: Iterator[Rows], out: queue.Queue, stop: threading.Event) -> None:
    """The reader thread: chunks into ``out`` until they end, an error (handed over), or ``stop``."""

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    try:
        for chunk in chunks:
            if not put(chunk):
                return
        put(_END)
    except BaseException as exc:  # the loop re-raises it where it waits for a batch
        put(exc)


class StreamLoader:
    """One rank's micro-batches of one epoch; a thread reads ahead from the moment it is built."""

    def __init__(self, chunks: Iterator[Rows], rows: int, micro_batch: int) -> None:
        self.micro_batch, self.batches = micro_batch, math.ceil(rows / micro_batch)
        self._queue: queue.Queue = queue.Queue(maxsize=READ_AHEAD)
        self._stop = threading.Event()
        # The thread holds the chunks, the queue and the event, not the loader: a loader dropped
        # mid-epoch (max_steps, a stop) is collected, and stops its thread.
        threading.Thread(target=_produce, args=(chunks, self._queue, self._stop), name="stream-reader",
                         daemon=True).start()

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[Rows]:
        b, carry = self.micro_batch, None
        while (chunk := self._queue.get()) is not _END:
            if isinstance(chunk, BaseException):
                raise chunk
            if carry is not None:
                chunk = _cat([carry, chunk])
            full = len(chunk[2]) - len(chunk[2]) % b
            for start in range(0, full, b):
                yield tuple(t[start:start + b] for t in chunk)
            carry = tuple(t[full:] for t in chunk) if full < len(chunk[2]) else None
        if carry is not None:
            yield carry

    def __del__(self) -> None:
        self._stop.set()
