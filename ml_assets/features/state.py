"""Fitted feature state and the one ``transform`` used by training, evaluation and batch inference.

The state is plain JSON, fitted on the training window only: per numeric input its steps (log1p,
clip), mean and standard deviation; per categorical input its encoding (a vocabulary with an
out-of-vocabulary index, a stable hash into buckets, or the bucket edges of a bucketized numeric).
Everything ``transform`` needs is in the state, so inference outside Dagster needs the state and
the built feature rows, nothing else. It is stored beside the features, with the checkpoint and in
the registered model.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from ml_assets.spec import FeaturesSpec, NumericFeature

STATE_VERSION = 2
OOV = 0  # index 0 of every categorical input: unknown, rare or missing


@dataclass(frozen=True)
class Encoded:
    numeric: np.ndarray  # float32 [n, numeric inputs]
    categorical: np.ndarray  # int64 [n, categorical inputs]
    target: np.ndarray | None  # float32 [n]; multiclass: int64 class indices [n]


def _steps(feature: NumericFeature) -> list[dict]:
    # Fitting's: a trainer rank only reads a fitted state, and does not import the spec.
    from ml_assets.spec import ClipStep

    out = []
    for step in feature.transforms:
        if step == "log1p":
            out.append({"log1p": True})
        elif isinstance(step, ClipStep):
            out.append({"clip": [step.clip.min, step.clip.max]})
    return out


def _pre(name: str, steps: list[dict]) -> pl.Expr:
    """The stateless steps, in order; log1p of a value below -1 is missing."""
    expr = pl.col(name).cast(pl.Float64)
    for step in steps:
        if "log1p" in step:
            expr = pl.when(expr > -1).then(expr.log1p())
        elif "clip" in step:
            low, high = step["clip"]
            expr = expr.clip(low, high)
    return expr.fill_nan(None)


@functools.lru_cache(maxsize=1 << 20)
def stable_hash(value: str, buckets: int) -> int:
    """1..buckets, the same on every machine and polars version (not polars' own hash)."""
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little") % buckets + 1


def _hash_batch(values: pl.Series, buckets: int) -> pl.Series:
    """Hash each distinct value once; rows take their value's code through an Enum's physical index."""
    uniques = values.drop_nulls().unique().to_list()
    if not uniques:
        return pl.Series(values.name, [OOV] * len(values), dtype=pl.Int64)
    codes = pl.Series([stable_hash(v, buckets) for v in uniques], dtype=pl.Int64)
    index = values.cast(pl.Enum(uniques)).to_physical()
    return codes.gather(index).fill_null(OOV).alias(values.name)


def fit_state(frame: pl.DataFrame | pl.LazyFrame, features: FeaturesSpec, target: str, task: str) -> dict:
    """Fit on the training window (a DataFrame, or a LazyFrame fitted with the streaming engine)."""
    from ml_assets.spec import BucketizeStep

    engine = "in-memory" if isinstance(frame, pl.DataFrame) else "streaming"
    # Each numeric input's stateless steps once, as a column of its own, before its statistics.
    pre = {f.name: f"__pre_{i}" for i, f in enumerate(features.numeric)}
    lazy = frame.lazy().with_columns(_pre(f.name, _steps(f)).alias(pre[f.name]) for f in features.numeric)
    rows = lazy.select(pl.len()).collect(engine=engine).item()
    if rows == 0:
        raise ValueError("cannot fit feature state on an empty training window")
    # One pass for every numeric statistic.
    stats = []
    for f in features.numeric:
        x = pl.col(pre[f.name])
        if f.bucketized:
            bucket = next(t.bucketize for t in f.transforms if isinstance(t, BucketizeStep))
            if bucket.edges is not None:
                stats.append(pl.lit(None).alias(f"{f.name}|edges"))
            else:
                qs = [i / bucket.buckets for i in range(1, bucket.buckets)]  # all from one sort, not one each
                stats.append(x.quantile(qs, "linear").alias(f"{f.name}|edges"))
        else:
            stats += [x.mean().alias(f"{f.name}|mean"), x.std().alias(f"{f.name}|std")]
    # Every statistic and every vocabulary's counts in one parallel collect.
    vocab_of = [f for f in features.categorical if f.encoding == "vocabulary"]
    queries = [lazy.select(stats or [pl.len()]), *(
        lazy.select(pl.col(f.name).cast(pl.String)).drop_nulls().group_by(f.name).len() for f in vocab_of)]
    results = pl.collect_all(queries, engine=engine)
    fitted = results[0].row(0, named=True) if stats else {}
    counts_of = {f.name: frame for f, frame in zip(vocab_of, results[1:], strict=True)}
    numeric, categorical = [], []
    for f in features.numeric:
        if f.bucketized:
            bucket = next(t.bucketize for t in f.transforms if isinstance(t, BucketizeStep))
            edges = bucket.edges if bucket.edges is not None else sorted(
                {float(e) for e in (fitted[f"{f.name}|edges"] or []) if e is not None})
            categorical.append({"name": f.name, "encoding": "buckets", "steps": _steps(f), "edges": edges})
            continue
        mean, std = fitted[f"{f.name}|mean"], fitted[f"{f.name}|std"]
        numeric.append({"name": f.name, "steps": _steps(f), "mean": float(mean) if mean is not None else 0.0,
                        "std": float(std) if std is not None and np.isfinite(std) and std > 1e-12 else 1.0})
    for f in features.categorical:
        if f.encoding == "hash":
            categorical.append({"name": f.name, "encoding": "hash", "buckets": f.buckets})
            continue
        counts = counts_of[f.name]
        kept = counts.filter(pl.col("len") >= f.min_frequency)
        # The rows already in the out-of-vocabulary index when fitted (rare values): a fine-tune's
        # data check counts only unknown categories beyond this share (ml_assets.training.decision).
        rare = int(counts["len"].sum() or 0) - int(kept["len"].sum() or 0)
        categorical.append({"name": f.name, "encoding": "vocabulary", "min_frequency": f.min_frequency,
                            "vocabulary": sorted(kept[f.name].to_list()), "oov_share": round(rare / rows, 6)})
    # Lists, not mappings: the order is the model's input order and must survive JSON.
    return {"version": STATE_VERSION, "task": task, "target": target, "numeric": numeric,
            "categorical": categorical, "rows_fitted": rows}


def state_bytes(state: dict) -> bytes:
    return json.dumps(state, sort_keys=True, indent=1).encode()


def _numeric_expr(s: dict) -> pl.Expr:
    return ((_pre(s["name"], s["steps"]) - s["mean"]) / s["std"]).fill_null(0.0).alias(s["name"])


def _categorical_expr(c: dict, streaming: bool = False) -> pl.Expr:
    name = c["name"]
    if c["encoding"] == "vocabulary":  # an Enum of the vocabulary: its physical codes are the indices
        if not c["vocabulary"]:
            return pl.lit(OOV, pl.Int64).alias(name)
        codes = pl.col(name).cast(pl.String).cast(pl.Enum(c["vocabulary"]), strict=False).to_physical()
        return (codes.cast(pl.Int64) + 1).fill_null(OOV).alias(name)
    if c["encoding"] == "hash":
        buckets = c["buckets"]
        # Elementwise when streaming: batch by batch instead of gathering the whole column.
        return pl.col(name).cast(pl.String).map_batches(lambda s: _hash_batch(s, buckets), return_dtype=pl.Int64,
                                                        is_elementwise=streaming).alias(name)
    x = _pre(name, c["steps"])  # buckets: 1 + the number of edges at or below the value
    edges = pl.lit(pl.Series(c["edges"], dtype=pl.Float64))
    index = edges.search_sorted(x, side="right").cast(pl.Int64) + 1 if c["edges"] else pl.lit(1, pl.Int64)
    return pl.when(x.is_null()).then(pl.lit(OOV, pl.Int64)).otherwise(index).alias(name)


def target_dtype(state: dict) -> type[pl.DataType]:
    """Class indices stay integers (cross-entropy takes them as int64); other labels are float32."""
    return pl.Int64 if state["task"] == "multiclass_classification" else pl.Float32


def _check(state: dict, columns: list[str]) -> None:
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"feature state version {state.get('version')!r} is not {STATE_VERSION}")
    missing = [c["name"] for c in [*state["numeric"], *state["categorical"]] if c["name"] not in columns]
    if missing:
        raise ValueError(f"rows lack the feature columns {missing}")


def transform_lazy(frame: pl.LazyFrame, state: dict) -> pl.LazyFrame:
    """Built feature rows -> encoded columns (numeric inputs, then categorical inputs, then the target
    when present), lazily: large windows run on the streaming engine."""
    _check(state, frame.collect_schema().names())
    target = state["target"]
    extra = [pl.col(target).cast(target_dtype(state))] if target in frame.collect_schema().names() else []
    return frame.select(*map(_numeric_expr, state["numeric"]),
                        *(_categorical_expr(c, streaming=True) for c in state["categorical"]), *extra)


def transform(frame: pl.DataFrame, state: dict) -> Encoded:
    """Built feature rows -> model inputs. A missing numeric becomes the training mean (0 once
    standardized); an unknown, rare or missing category the out-of-vocabulary index."""
    _check(state, frame.columns)
    numeric, categorical = state["numeric"], state["categorical"]
    num = frame.select(_numeric_expr(s).cast(pl.Float32) for s in numeric)
    cat = frame.select(map(_categorical_expr, categorical))
    target = state["target"]
    y = frame[target].cast(target_dtype(state)).to_numpy(writable=True) if target in frame.columns else None
    return Encoded(
        # copy=False: the frames already hold these dtypes, and a second copy of a few hundred MB
        # is mostly the kernel's page faults.
        numeric=num.to_numpy().astype(np.float32, copy=False).reshape(frame.height, len(numeric)),
        categorical=cat.to_numpy().astype(np.int64, copy=False).reshape(frame.height, len(categorical)),
        target=y,
    )


def cardinalities(state: dict) -> list[int]:
    """Embedding table sizes, the out-of-vocabulary index included."""
    sizes = []
    for c in state["categorical"]:
        if c["encoding"] == "vocabulary":
            sizes.append(len(c["vocabulary"]) + 1)
        elif c["encoding"] == "hash":
            sizes.append(c["buckets"] + 1)
        else:
            sizes.append(len(c["edges"]) + 2)
    return sizes
