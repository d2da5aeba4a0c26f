"""One rank's stream of one epoch (ml_assets.trainer.stream): its row groups read a few at a time,
shuffled in a seeded buffer, replayable on row ids alone, which is how a resumed rank finds its
place without reading what it has already trained on."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""numeric, categorical, target: the model's inputs for some rows."""
READ_ROWS = 8192
"""Consecutive row groups of a shard are read and transformed together up to about this many rows
(at most half the buffer): a transform costs about as much for one small row group as for ten."""


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


def _pick(rows: Rows | None, index: torch.Tensor) -> Rows | None:
    return None if rows is None else tuple(t.index_select(0, index) for t in rows)


def cat(parts: list[Rows]) -> Rows:
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
        rows = None if any(r is None for r in known) else cat(known)
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
        return _pick(cat(parts), inverse)

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
