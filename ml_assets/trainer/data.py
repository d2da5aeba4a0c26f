"""Feature files -> tensors -> batches. Every file is verified against the sha256 its caller pinned.

Batches are gathered a whole batch at a time (one index_select per tensor), not row by row and
collated: per-row ``__getitem__`` and collation would cost more than the model's step on tabular data.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Iterator

import numpy as np
import polars as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ml_assets.features.state import transform
from ml_assets.storage import read_verified as _read_verified
from ml_assets.trainer.config import DataRef


def read_verified(ref: DataRef) -> bytes:
    return _read_verified(ref.uri, ref.sha256)


def read_state(ref: DataRef) -> dict:
    return json.loads(read_verified(ref))


def read_frame(refs: list[DataRef]) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(io.BytesIO(read_verified(r))) for r in refs], how="vertical")


def to_tensors(frame: pl.DataFrame, state: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    encoded = transform(frame, state)
    if encoded.target is None:
        raise ValueError(f"feature rows lack the target column {state['target']!r}")
    return _tensor(encoded.numeric), _tensor(encoded.categorical), _tensor(encoded.target)


def _tensor(array: np.ndarray) -> torch.Tensor:
    # Columns read through Arrow (streaming) can come back as read-only views, which torch warns of.
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def check_class_indices(target: torch.Tensor, classes: list[str], rows: str) -> None:
    """Multiclass labels must be indices of the config's classes (cross-entropy would otherwise
    fail on a device assert, or a model with too few outputs would train)."""
    if target.dtype != torch.int64:
        raise ValueError(f"the {rows} rows' labels are {target.dtype}, not int64 class indices: features "
                         "built for another task?")
    bad = target[(target < 0) | (target >= len(classes))]
    if len(bad):
        raise ValueError(f"the {rows} rows hold labels {sorted(set(bad.tolist()))[:10]}, not indices of the "
                         f"{len(classes)} classes {classes}")


class ResumableSampler(DistributedSampler):
    """DistributedSampler (same shuffle, same ``set_epoch``) that can start mid-epoch.

    Rank r of W takes positions r, r+W, r+2W, ... of the epoch's permutation, so after every rank
    has taken k rows the first k*W positions are used, whatever W was. ``set_start(k*W)`` resumes
    there, on the same or on a different number of ranks. What is left is padded to a multiple of
    W (as DistributedSampler pads) so every rank runs the same number of steps.
    """

    def __init__(self, dataset: Dataset, *, num_replicas: int, rank: int, seed: int, shuffle: bool = True) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.start = 0

    def set_start(self, consumed: int) -> None:
        self.start = consumed

    def _remaining(self) -> int:
        left = max(len(self.dataset) - self.start, 0)
        return math.ceil(left / self.num_replicas)

    def order(self) -> torch.Tensor:
        """This rank's rows for the rest of the epoch, as one tensor (no Python list of ints)."""
        n = len(self.dataset)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator)
        else:
            order = torch.arange(n)
        left = order[self.start:]
        padding = self._remaining() * self.num_replicas - len(left)
        if padding:
            left = torch.cat([left, order.repeat(math.ceil(padding / max(n, 1)))[:padding]])
        return left[self.rank::self.num_replicas]

    def __iter__(self):
        return iter(self.order().tolist())

    def __len__(self) -> int:
        return self._remaining()


class Batches(Dataset):
    """Micro-batches of one rank's share of an epoch. The rows are gathered into the epoch's order
    once (one index_select per tensor), so a batch is a slice: no per-step gather or copy."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], order: torch.Tensor, micro_batch: int) -> None:
        self.tensors = tuple(t.index_select(0, order) for t in tensors)
        self.rows, self.micro_batch = len(order), micro_batch

    def __len__(self) -> int:
        return math.ceil(self.rows / self.micro_batch)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return tuple(t[i * self.micro_batch:(i + 1) * self.micro_batch] for t in self.tensors)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        b = self.micro_batch
        return (tuple(t[start:start + b] for t in self.tensors) for start in range(0, self.rows, b))


def make_loader(tensors: tuple[torch.Tensor, ...], sampler: ResumableSampler, micro_batch: int, *,
                num_workers: int, pin_memory: bool, prefetch_factor: int) -> Iterable[tuple[torch.Tensor, ...]]:
    """This rank's micro-batches for the sampler's epoch. In-process (no DataLoader) unless workers
    or pinned memory are asked for: rows already in memory need no worker to fetch them."""
    batches = Batches(tensors, sampler.order(), micro_batch)
    if not num_workers and not pin_memory:
        return batches
    options = {"num_workers": num_workers, "pin_memory": pin_memory}
    if num_workers:
        options["prefetch_factor"] = prefetch_factor
    return DataLoader(batches, batch_size=None, shuffle=False, **options)
