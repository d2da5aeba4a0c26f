"""Featurize a window larger than memory: build, fit and transform on polars' streaming engine, each
step reading Parquet lazily and sinking its result to Parquet.

    built, state, encoded = featurize_out_of_core(spec, "rows/*.parquet", {"weather": ..., "planes": ...}, out)

Two things keep memory flat: common-subplan elimination is off (the rolling aggregates and the as-of
join read the rows a second time; with it on, the engine would hold the shared rows in memory, so
the rows are read twice instead), and every Python step is elementwise, so it runs batch by batch.
What stays in memory grows with the distinct keys (days x groups for rolling aggregates, distinct
(keys, timestamp) pairs for an as-of join), not with the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ml_assets.features.build import build_lazy
from ml_assets.features.state import fit_state, state_bytes, transform_lazy
from ml_assets.layout import FEATURE_STATE_FILE
from ml_assets.spec import ModelSpec
from ml_assets.storage import verified_local
from ml_assets.trainer.config import DataRef

STREAMING = pl.QueryOptFlags(comm_subplan_elim=False)


def scan_verified(refs: list[DataRef], cache_dir: str | Path) -> pl.LazyFrame:
    """Pinned feature files as one lazy frame (``fit_state`` and ``transform_lazy`` run it on the
    streaming engine), each checked against its sha256 first in one chunked pass; a file that is not
    local is copied into ``cache_dir`` as it is checked, and scanned there."""
    return pl.scan_parquet([verified_local(ref.uri, ref.sha256, cache_dir) for ref in refs])


@dataclass(frozen=True)
class Featurized:
    built: Path  # feature rows with a target
    state: dict  # fitted on ``built``
    encoded: Path  # model inputs (numeric, categorical, target)


def featurize_out_of_core(spec: ModelSpec, rows: str | Path | list, dims: dict[str, str | Path],
                          out_dir: str | Path) -> Featurized:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    built = out / "built.parquet"
    lazy_dims = {name: pl.scan_parquet(path) for name, path in dims.items()}
    (build_lazy(spec, pl.scan_parquet(rows), lazy_dims, streaming=True)
     .filter(pl.col(spec.target.name).is_not_null())
     .sink_parquet(built, engine="streaming", optimizations=STREAMING))
    state = fit_state(pl.scan_parquet(built), spec.features, spec.target.name, spec.target.task)
    (out / FEATURE_STATE_FILE).write_bytes(state_bytes(state))
    encoded = out / "encoded.parquet"
    transform_lazy(pl.scan_parquet(built), state).sink_parquet(encoded, engine="streaming", optimizations=STREAMING)
    return Featurized(built, state, encoded)
