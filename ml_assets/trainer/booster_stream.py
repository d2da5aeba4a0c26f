"""Windows larger than memory for XGBoost (``data_mode: streaming``): each rank feeds its shard of
the window's Parquet row groups to XGBoost's external-memory matrix (``ExtMemQuantileDMatrix``),
which bins each batch by the shared cuts and keeps the binned pages in files on disk, fetched a
page at a time while a tree is built.

- Files and reading are the PyTorch families' (ml_assets.trainer.stream.StreamedWindow): every
  feature file verified once (a remote one copied into the stream cache as it is hashed), whole
  row groups read up to ``shuffle.READ_ROWS`` rows at a time by one polars query and encoded by
  the fitted feature state. Trees need no shuffle buffer and no epochs: the window's shuffled
  stream is never started.
- Shards. Rank r of W takes the window's rows ``[r*N//W, (r+1)*N//W)`` in file order
  (booster_data.row_range, as in memory mode): disjoint, every row once, no padding, equal to
  within a row (XGBoost all-reduces every tree level's histograms, so the largest shard sets the
  pace), and a window of fewer row groups than ranks still shards: the row groups holding a
  shard's edges are read in part (the reader decodes such a group up to the edge).
- Pages. XGBoost makes one external-memory page of each batch it is handed: consecutive row groups
  of the shard, up to ``shuffle_buffer_rows`` rows (a larger row group alone; trees shuffle
  nothing, and the knob keeps its meaning of rows a rank holds at once). A batch is filled read
  by read into one float32 array.
- Shared cuts. Every rank reads the same seeded sample of at most ``SKETCH_ROWS`` rows
  (booster_data.sketch_positions: the rows memory mode samples, so both modes sketch the same
  cuts), read by read, holding only the sample.
- Memory. A rank holds the sketch sample until it is sketched (at most SKETCH_ROWS x inputs x 4
  bytes; the whole window below that), one batch and one read while XGBoost builds its pages, and
  the validation rows. XGBoost itself keeps, per training row of the shard, its gradient pair,
  label, prediction and row partition in memory (about 50 bytes a row, measured with xgboost 3.2
  on CPU): that grows with the window; the inputs do not.
- Disk. The pages (about a byte per input per row) go to a directory of this process's own under
  the stream cache directory (``stream_cache_dir``), removed once XGBoost has freed the matrix;
  directories of trainers on this machine that died first are removed when the next one starts.
- Reads. XGBoost iterates the batches twice while it builds the matrix (counting, then binning),
  and the sketch reads the window once: three reads and encodings of each row before the first
  round, none during the rounds (they read the pages).

Models. Both modes sketch the same cuts and give each rank the same rows in the same order, so a
streamed training trains memory mode's booster. What differs is how the rows reach XGBoost (pages
instead of one matrix): where XGBoost sums a histogram page by page the additions may group
differently, a difference of float rounding at most; the tests find the boosters byte-identical
(1 and 2 ranks, row and column sampling, several pages per rank).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import shutil
import socket
import tempfile
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xgboost

from ml_assets.trainer.booster_data import (
    Shard,
    check_labels,
    feature_names,
    feature_types,
    row_range,
    sketch_positions,
    stack,
    validation_rows,
)
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.shuffle import READ_ROWS, RowGroup, Rows
from ml_assets.trainer.stream import StreamedWindow, StreamLoader, default_cache_dir

PAGES_PREFIX = "xgboost-pages-"


class BoosterWindow(StreamedWindow):
    """The window's row groups, the ones holding this rank's shard edges cut there, read whole (as
    StreamedWindow reads them, a Parquet row group being the unit a reader decodes) a few at a time."""

    def __init__(self, cfg: TrainConfig, state: dict, rank: int, world: int) -> None:
        super().__init__(cfg, state, rank, world)
        if self.rows < world:
            raise ValueError(f"{self.rows} training rows cannot be shared by {world} ranks")
        self.first, self.last = row_range(self.rows, rank, world)
        self.groups, starts = _cut(self.groups, [self.first, self.last])
        self.shard = list(range(bisect.bisect_left(starts, self.first), bisect.bisect_left(starts, self.last)))
        """This rank's pieces (indices into ``groups``), in file order."""

    def loader(self, epoch: int, start: int, micro_batch: int) -> StreamLoader | None:
        # Trees take the rows in no particular order: the shuffled epoch stream that StreamedWindow
        # starts reading at once for a network is never started.
        return None

    def runs(self, groups: Sequence[int], most: int) -> list[list[int]]:
        """Consecutive ``groups`` in runs of at most ``most`` rows; a larger row group is a run alone."""
        out: list[list[int]] = []
        size = 0
        for g in groups:
            rows = self.groups[g].rows
            if out and size + rows <= most:
                out[-1].append(g)
                size += rows
            else:
                out.append([g])
                size = rows
        return out

    def arrays(self, groups: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``groups`` as XGBoost's inputs and labels, read ``READ_ROWS`` at a time into
        one array: a batch costs its float32 rows and one read, however many rows XGBoost's page is."""
        x = np.empty((sum(self.groups[g].rows for g in groups), len(feature_names(self.state))), np.float32)
        y = np.empty(len(x), np.float32)
        filled = 0
        for run in self.runs(groups, READ_ROWS):
            xs, ys = _arrays(self.read(run))
            x[filled:filled + len(xs)], y[filled:filled + len(ys)] = xs, ys
            filled += len(xs)
        return x, y

    def files_of(self, groups: Sequence[int]) -> str:
        return ", ".join(dict.fromkeys(self.uris[self.groups[g].file] for g in groups))


def _cut(groups: Sequence[RowGroup], edges: Sequence[int]) -> tuple[list[RowGroup], list[int]]:
    """Row groups split at the window's row positions ``edges`` (sorted), and where each piece starts."""
    pieces, starts, start = [], [], 0
    for g in groups:
        inside = edges[bisect.bisect_right(edges, start):bisect.bisect_left(edges, start + g.rows)]
        bounds = [start, *inside, start + g.rows]
        for a, b in zip(bounds, bounds[1:], strict=False):
            pieces.append(RowGroup(g.file, g.index, g.offset + a - start, b - a))
            starts.append(a)
        start += g.rows
    return pieces, starts


def _arrays(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    numeric, categorical, target = rows
    return stack(numeric.numpy(), categorical.numpy()), target.numpy().astype(np.float32)


def read_sketch(window: BoosterWindow) -> np.ndarray:
    """The sketch sample (booster_data.sketch_positions), read ``READ_ROWS`` at a time: every rank
    reads the same rows, in file order, and holds no more than the sample and one read."""
    pick = sketch_positions(window.rows)
    out = np.empty((window.rows if pick is None else len(pick), len(feature_names(window.state))), np.float32)
    filled, start = 0, 0
    for run in window.runs(range(len(window.groups)), READ_ROWS):
        x, _ = _arrays(window.read(run))
        rows = len(x)
        if pick is not None:
            lo, hi = np.searchsorted(pick, [start, start + rows])
            x = x[pick[lo:hi] - start]
        out[filled:filled + len(x)] = x
        filled, start = filled + len(x), start + rows
    return out


class _Batches(xgboost.DataIter):
    """One rank's batches as XGBoost iterates them (it does so twice while it builds its pages)."""

    def __init__(self, shard: StreamShard, prefix: str) -> None:
        self.shard, self.at = shard, 0
        self.names, self.types = feature_names(shard.window.state), feature_types(shard.window.state)
        super().__init__(cache_prefix=prefix, release_data=True)

    def next(self, input_data: Callable) -> bool:
        if self.at == len(self.shard.batches):
            return False
        x, y = self.shard.batch(self.at)
        input_data(data=x, label=y, feature_names=self.names, feature_types=self.types)
        self.at += 1
        return True

    def reset(self) -> None:
        self.at = 0


@dataclass
class StreamShard(Shard):
    """This rank's row range of a streamed window; its matrix is XGBoost's external memory."""

    window: BoosterWindow
    batches: list[list[int]]
    """Runs of ``window.groups`` indices of up to ``shuffle_buffer_rows`` rows: XGBoost's pages."""

    def batch(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        window = self.window
        x, y = window.arrays(self.batches[i])
        check_labels(y, window.cfg.task, window.cfg.classes, f"training ({window.files_of(self.batches[i])})")
        return x, y

    def train_matrix(self, ref: xgboost.DMatrix, options: dict) -> xgboost.DMatrix:
        window = self.window
        pages = pages_dir(window.cfg.stream_cache_dir or default_cache_dir())
        try:
            # The iterator is only read while the matrix is built: nothing keeps it afterwards.
            matrix = xgboost.ExtMemQuantileDMatrix(_Batches(self, str(pages / "train")), ref=ref,
                                                   max_bin=options["max_bin"],
                                                   enable_categorical=options["enable_categorical"])
        except BaseException:
            _remove(pages)
            raise
        # XGBoost deletes its page files when the matrix is freed, and warns if they are gone
        # already: the directory goes after them. Not at exit (the matrix may outlive the exit
        # hooks): a directory left behind is removed by the next trainer's pages_dir.
        weakref.finalize(matrix, _remove, pages).atexit = False
        if matrix.num_row() != window.last - window.first:  # every row of the range, once
            raise RuntimeError(f"XGBoost's external memory holds {matrix.num_row()} rows of rank "
                               f"{window.rank}'s {window.last - window.first}")
        return matrix


def stream_shard(cfg: TrainConfig, state: dict, rank: int, world: int) -> StreamShard:
    """This rank's streamed shard: its row range's batches (nothing read yet), the sketch sample
    every rank reads alike, and its validation rows in memory."""
    window = BoosterWindow(cfg, state, rank, world)
    vx, vy, val_rows = validation_rows(cfg, state, rank, world)
    return StreamShard(val_x=vx, val_y=vy, sketch=read_sketch(window), rows=window.rows, val_rows=val_rows,
                       window=window, batches=window.runs(window.shard, cfg.shuffle_buffer_rows))


def pages_dir(cache: str) -> Path:
    """A new directory of this process's own for XGBoost's pages under the stream cache, after
    removing those that trainers on this machine, dead now, left behind (killed, or their matrix
    outlived the exit hooks)."""
    root = Path(cache)
    root.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    for stale in root.glob(f"{PAGES_PREFIX}*"):
        owner, _, _ = stale.name[len(PAGES_PREFIX):].rpartition("-")
        pid, _, on = owner.partition("@")
        if on == host and pid.isdigit() and not _alive(int(pid)):
            _remove(stale)
    return Path(tempfile.mkdtemp(prefix=f"{PAGES_PREFIX}{os.getpid()}@{host}-", dir=root))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):  # another trainer removed it first
        shutil.rmtree(path)
