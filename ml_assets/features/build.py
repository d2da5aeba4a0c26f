"""Build one day's feature rows: join dimensions, derive the target, keep the declared columns."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ml_assets.spec import ModelSpec

TIMESTAMP = "__timestamp"


@dataclass(frozen=True)
class FeatureFrame:
    frame: pl.DataFrame
    rows_in: int
    rows_without_target: int


class FeatureError(ValueError):
    pass


def feature_columns(spec: ModelSpec) -> list[str]:
    return [*spec.features.numeric, *spec.features.categorical]


def build_features(spec: ModelSpec, tables: dict[str, pl.DataFrame]) -> FeatureFrame:
    rows = tables["rows"]
    for i, join in enumerate(spec.features.joins):
        dim = tables[join.dimension]
        missing = [c for c in [*join.keys, *join.columns] if c not in dim.columns]
        if missing:
            raise FeatureError(f"features.joins[{i}]: dimension {join.dimension!r} has no columns {missing}")
        # One dimension row per key, so a join can never multiply the rows it enriches.
        dim = (
            dim.select([*join.keys, *join.columns])
            .unique(subset=join.keys, keep="first", maintain_order=True)
            .rename(join.columns)
        )
        rows = rows.join(dim, on=join.keys, how="left", coalesce=True)
    target = spec.target
    dtype = pl.Float32
    labelled = rows.with_columns(pl.sql_expr(target.expression).cast(dtype).alias(target.name))
    kept = labelled.filter(pl.col(target.name).is_not_null())
    frame = kept.select(
        pl.col(spec.partitioning.timestamp_column).alias(TIMESTAMP),
        *[pl.col(c).cast(pl.Float64) for c in spec.features.numeric],
        *[pl.col(c).cast(pl.String) for c in spec.features.categorical],
        pl.col(target.name),
    )
    return FeatureFrame(frame, rows.height, labelled.height - kept.height)
