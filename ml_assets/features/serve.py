"""Batch inference outside Dagster: raw rows in, model inputs out, with the same code training used.

    from ml_assets.features.serve import featurize
    encoded = featurize(spec, {"rows": rows, "weather": weather, "planes": planes}, history, state)

``rows`` are the flights to predict: columns known only later (the target's inputs, after-event
columns) may be missing. ``history`` holds raw rows of the days before, for the rolling aggregates
(the same days the features asset would read from main). ``state`` is the fitted feature state
that travels with the model (the checkpoint's feature_state.json, or the registered model's).
Every row is kept, in order: there is no target to drop rows for.
"""

from __future__ import annotations

import polars as pl

from ml_assets.features.build import build_lazy, collect_each_step
from ml_assets.features.state import Encoded, transform
from ml_assets.spec import ModelSpec


def featurize(spec: ModelSpec, tables: dict[str, pl.DataFrame], history: pl.DataFrame | None,
              state: dict) -> Encoded:
    dims = {name: frame.lazy() for name, frame in tables.items() if name != "rows"}
    built = build_lazy(spec, tables["rows"].lazy(), dims, history.lazy() if history is not None else None,
                       streaming=False, stage=collect_each_step).collect(engine="in-memory")
    return transform(built.drop(spec.target.name), state)
