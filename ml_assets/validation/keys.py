"""The duplicate-keys check: the rows' key columns hashed, the hashes sorted, and only rows whose
hash another row shares compared column by column, so the verdict is exact.
"""

from __future__ import annotations

import functools
import operator

import numpy as np
import polars as pl

UNIQUE_KEYS = "unique_keys"


def unique_keys(keys: list[str]):
    """A pandera (polars) dataframe check: no two rows share the spec's key columns.

    Exact, and faster on millions of rows than pandera's own ``unique=`` (which runs
    ``DataFrame.is_duplicated`` on the key columns): the rows' hashes are sorted, and only rows
    whose hash another row shares
    (a real duplicate, or rarely a hash collision) are compared column by column. Nulls in a key
    compare equal, as in pandera's check. Key columns missing from the frame are left to the
    schema check, which reports them; the rest are still compared.
    """

    def check(data) -> pl.LazyFrame | bool:
        hashes = _key_hashes(data.lazyframe, keys)
        if hashes is None:
            return True
        shared = _shared_hashes(hashes, one_core=False)
        unique = np.ones(hashes.len(), dtype=bool)
        if shared.size:
            candidates = np.flatnonzero(np.isin(hashes.to_numpy(), shared))
            frame = data.lazyframe.select(_present(data.lazyframe, keys)).collect()
            unique[candidates[frame[candidates].is_duplicated().to_numpy()]] = False
        return pl.LazyFrame({UNIQUE_KEYS: unique})

    return check


def _present(lazy: pl.LazyFrame, keys: list[str]) -> list[str]:
    """The key columns the frame has (a missing one is the schema check's to report)."""
    names = set(lazy.collect_schema().names())
    return [k for k in keys if k in names]


# The integer key columns' 64-bit words are folded into one, w <- w * _FOLD ^ next (wrapping), which
# stands for their hashes: _FOLD is odd (the 64-bit golden ratio), so each fold is a bijection of w, and keys
# that differ in exactly one integer column always fold apart (but for a null, which folds as
# _NULL_WORD, against that value).
_FOLD = 0x9E3779B97F4A7C15
_NULL_WORD = 0x5BD1E9955BD1E995


def _key_hashes(lazy: pl.LazyFrame, keys: list[str]) -> pl.Series | None:
    """One hash per row of the key columns the frame has (None if it has none of them): rows with
    equal keys always get equal hashes (nulls included), different keys almost never do.

    The integer key columns folded into one 64-bit word, every other key column hashed with its own
    seed, all xor-ed, in one streaming query: cheaper than a hash per column, and than
    ``DataFrame.hash_rows``, which also builds a copy of its result (benchmarks/validation.py).
    Sharing a hash only sends rows to an exact comparison, so a fold that collides costs time, never
    a wrong verdict."""
    present = _present(lazy, keys)
    if not present:
        return None
    schema = lazy.collect_schema()
    words = [(pl.col(k) if schema[k] == pl.UInt64 else pl.col(k).cast(pl.Int64).reinterpret(signed=False))
             .fill_null(_NULL_WORD) for k in present if schema[k].is_integer()]
    hashes = [pl.col(k).hash(seed) for seed, k in enumerate(present, start=1) if not schema[k].is_integer()]
    if words:
        hashes.append(functools.reduce(lambda folded, word: folded * _FOLD ^ word, words))
    return lazy.select(functools.reduce(operator.xor, hashes).alias("hash")).collect(engine="streaming").to_series()


def _shared_hashes(hashes: pl.Series, *, one_core: bool) -> np.ndarray:
    """The hash values two or more rows share, each once: the hashes sorted by polars (on one core
    if ``one_core``), then neighbours compared. One sort everywhere: polars' is the faster of
    polars' and numpy's on the project's CI machine (benchmarks/RESULTS.md#validation)."""
    ordered = hashes.sort(multithreaded=not one_core).to_numpy()
    return np.unique(ordered[1:][ordered[1:] == ordered[:-1]])


def _shares_a_hash(hashes: pl.Series) -> bool:
    """Whether two rows share a key hash: always for duplicate keys, rarely (a collision) otherwise.
    The verdict `passes` asks for, with no row mask, on a thread beside the column checks, so on one
    core: polars' parallel sort costs about twice the CPU for a tenth less time, and on two cores
    the column checks want that CPU. The sort releases the GIL."""
    return _shared_hashes(hashes, one_core=True).size > 0
