"""A day's rows scored by the champion of the moment.

The rows go through the transform the model was trained with: the day's snapshot as published on
main (by commit id), the spec's joins and rolling aggregates over the same commit, then the fitted
feature state that was registered with the weights. Rows whose label is not known yet are scored
too. The file is content-addressed and names, in its Parquet metadata, the model version, its
weights' sha256, the feature state's sha256 and the data commit: the same champion on the same
data writes the same bytes to the same name, and a file found on its own can be walked back
(``ml-assets lineage --predictions FILE``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
from collections.abc import Callable, Mapping

import numpy as np
import polars as pl

from ml_assets.features.build import KEY_PREFIX, TIMESTAMP, build_features
from ml_assets.features.day import day_tables
from ml_assets.layout import Layout
from ml_assets.registry import versions as registry
from ml_assets.registry.record import VersionTags
from ml_assets.scoring.record import PredictionsRecord
from ml_assets.serving.predict import predict
from ml_assets.spec import ModelSpec
from ml_assets.validation.record import SnapshotRecord
from ml_assets.versioning import VersionStore

METADATA_PREFIX = "ml_assets."
PARQUET_KEYS = ("model", "version", "weights_sha256", "feature_state_sha256", "data_commit", "repository", "day")
"""What a predictions file says of itself (Parquet key-value metadata, each key prefixed)."""
SCORE = "score"
DECISION = "decision"
PREDICTION = "prediction"


class ScoringError(Exception):
    """The day cannot be scored: no champion, or a champion that cannot score this spec's rows."""


def champion(client, spec: ModelSpec):
    mv = registry.by_alias(client, spec.name, registry.CHAMPION)
    if mv is None:
        raise ScoringError(f"{spec.name} has no @champion yet: nothing scores a day until a version is promoted "
                           f"(automatically by {spec.name}_promotion_sensor, or `ml-assets promote {spec.name} "
                           "VERSION --reason TEXT`)")
    return mv


def scored(spec: ModelSpec, loaded, features: pl.DataFrame, threshold: float | None) -> pl.DataFrame:
    """The rows' keys and timestamp column, then the champion's output: ``score`` (and ``decision`` at the
    version's registered threshold) for binary classification, ``prediction`` and one ``score_<class>``
    per class for multiclass, ``prediction`` for regression."""
    keys, ts = spec.data_schema.keys, spec.partitioning.timestamp_column
    out = features.select(*[pl.col(KEY_PREFIX + k).alias(k) for k in keys],
                          *([] if ts in keys else [pl.col(TIMESTAMP).alias(ts)]))
    values = predict(loaded, features)
    task = spec.target.task
    if task == "binary_classification":
        out = out.with_columns(pl.Series(SCORE, values))
        if threshold is not None:
            out = out.with_columns((pl.col(SCORE) >= threshold).alias(DECISION))
    elif task == "multiclass_classification":
        classes = [str(c) for c in loaded.meta["classes"]]
        out = out.with_columns(pl.Series(PREDICTION, np.asarray(classes)[values.argmax(axis=1)]),
                               *[pl.Series(f"{SCORE}_{c}", values[:, i]) for i, c in enumerate(classes)])
    else:
        out = out.with_columns(pl.Series(PREDICTION, values))
    return out


def file_bytes(frame: pl.DataFrame, about: Mapping[str, str]) -> bytes:
    """Parquet with ``about`` in its key-value metadata. The same frame and ``about`` give the same
    bytes (no timestamps are written), so the name (the sha256) of a re-scored day does not move."""
    import pyarrow.parquet as pq

    table = frame.to_arrow()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           **{METADATA_PREFIX + k: str(v) for k, v in about.items()}})
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd")
    return out.getvalue()


def read_about(data: bytes) -> dict[str, str]:
    """A predictions file's own account of what scored it (``PARQUET_KEYS``); {} for other files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(pa.BufferReader(data)).metadata or {}
    except (pa.ArrowException, OSError):
        return {}
    return {k.decode()[len(METADATA_PREFIX):]: v.decode() for k, v in meta.items()
            if k.decode().startswith(METADATA_PREFIX)}


def score_day(spec: ModelSpec, day: dt.date, store: VersionStore, artifacts, client, snapshot: SnapshotRecord,
              model_url: Callable[[str, str], str], previous: PredictionsRecord | None,
              log: Callable[[str], None]) -> PredictionsRecord:
    """Score ``day``'s published rows with the current champion. ``previous``: this day's last
    record; when the same champion already scored the same commit, it is returned (``reused``)
    and nothing is read or written."""
    mv = champion(client, spec)
    tags = VersionTags.from_tags(mv.tags)
    if (previous is not None and previous.model_version == str(mv.version)
            and previous.weights_sha256 == tags.checkpoint_sha256 and previous.data_commit == snapshot.commit):
        log(f"predictions {day}: version {mv.version} already scored commit {snapshot.commit[:12]}; nothing new")
        return dataclasses.replace(previous, reused=True)
    try:
        loaded = registry.load_version(client, mv)
    except (registry.RegistryError, ValueError) as exc:
        raise ScoringError(f"the champion (version {mv.version}) cannot be loaded: {exc}") from None
    if loaded.meta.get("task") != spec.target.task or loaded.meta.get("classes") != spec.target.classes:
        raise ScoringError(f"the champion (version {mv.version}) predicts {loaded.meta.get('task')} "
                           f"{loaded.meta.get('classes') or ''}, the spec {spec.target.task} "
                           f"{spec.target.classes or ''}: promote a version trained on this spec")
    inputs = day_tables(spec, store, snapshot.repository, snapshot.commit, day)
    built = build_features(spec, inputs.tables, inputs.history, keys=spec.data_schema.keys, labeled_only=False)
    gate = tags.gate
    threshold = float(gate.decision_threshold) if gate and gate.decision_threshold else None
    frame = scored(spec, loaded, built.frame, threshold)
    about = {"model": spec.name, "version": str(mv.version), "weights_sha256": tags.checkpoint_sha256,
             "feature_state_sha256": loaded.meta["feature_state_sha256"], "data_commit": snapshot.commit,
             "repository": snapshot.repository, "day": day.isoformat()}
    ref = artifacts.put(Layout.of(spec).predictions_prefix(day), file_bytes(frame, about), ".parquet")
    labeled = built.frame.select(pl.col(spec.target.name).is_not_null().sum()).item()
    log(f"predictions {day}: {frame.height} rows scored by version {mv.version} (weights "
        f"{tags.checkpoint_sha256[:12]}) from main commit {snapshot.commit[:12]}")
    return PredictionsRecord(
        model_name=spec.name, model_version=str(mv.version), weights_sha256=tags.checkpoint_sha256,
        data_commit=snapshot.commit, repository=snapshot.repository, uri=ref.uri, sha256=ref.sha256,
        bytes=ref.size, rows=frame.height, rows_labeled=int(labeled), columns=frame.columns,
        feature_state_sha256=loaded.meta["feature_state_sha256"], mlflow_model_url=model_url(spec.name, str(mv.version)))
