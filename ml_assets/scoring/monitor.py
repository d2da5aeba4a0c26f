"""The champion at work, judged on a day once its labels exist.

- **Live metrics.** The day's predictions (the file ``predictions`` wrote, what was served) are
  joined by the spec's ``schema.keys`` with the labels of the day's latest published snapshot
  (labels often arrive after the scores), and scored with the evaluation's metrics; the primary
  metric gets a bootstrap interval. Fewer than ``monitoring.min_labeled_rows`` labelled rows: pending.
- **Drift.** The day's predictions and feature rows against those of the champion's own training
  window (the feature files its meta pins by sha256), each by a population stability index over
  the reference's deciles (numeric) or its categories (pooled as the snapshot's drift check pools
  them), and the snapshot's test of the two samples (Kolmogorov-Smirnov for numbers, chi-square for
  categories): drift counts only where both say so, and a comparison with fewer than
  ``monitoring.min_rows`` rows on either side is not judged.
- **Limits.** ``monitoring:`` in the spec; ``status`` is ``blocked`` when a blocking level is
  crossed, ``warn`` for a warn level, ``ok``, or ``pending`` (no labels yet: the metrics are not
  judged, the drift is).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ml_assets.evaluation import metrics as M
from ml_assets.evaluation.bootstrap import bootstrap_ci
from ml_assets.features.build import build_features, target_expr
from ml_assets.features.day import day_tables
from ml_assets.layout import Layout
from ml_assets.parquet import read_parquet
from ml_assets.registry import versions as registry
from ml_assets.registry.record import VersionTags
from ml_assets.scoring.predictions import PREDICTION, SCORE
from ml_assets.scoring.record import MonitorRecord, PredictionsRecord
from ml_assets.serving.predict import predict
from ml_assets.spec import ModelSpec
from ml_assets.spec.monitoring import DriftLimit, MetricLimit
from ml_assets.storage import read_verified
from ml_assets.validation.record import SnapshotRecord
from ml_assets.validation.stats import (
    MIN_SHARE,
    chi_square_p,
    ks_test,
    pooled_counts,
    psi_of,
    too_few,
)
from ml_assets.versioning import VersionStore

LABEL = "__label"
REFERENCE_ROWS = 50_000
"""At most this many rows of the training window are compared (a seeded sample beyond it)."""


def labels(spec: ModelSpec, store: VersionStore, snapshot: SnapshotRecord, day: dt.date) -> pl.DataFrame:
    """The day's keys and labels (null where not known yet), from its published rows."""
    rows = read_parquet(store.get_object(snapshot.repository, snapshot.commit, Layout.of(spec).rows_path(day)))
    return rows.select(*spec.data_schema.keys, target_expr(spec).alias(LABEL))


def numeric_counts(reference: np.ndarray, current: np.ndarray, bins: int = 10) -> pl.DataFrame:
    """Counts of both samples in the reference's quantile bins (ties merged), as pooled_counts gives."""
    edges = np.unique(np.quantile(reference, np.linspace(0, 1, bins + 1)[1:-1]))
    ref = np.bincount(np.searchsorted(edges, reference, side="right"), minlength=len(edges) + 1)
    cur = np.bincount(np.searchsorted(edges, current, side="right"), minlength=len(edges) + 1)
    return pl.DataFrame({"ref": ref, "cur": cur})


def compare(reference: pl.Series, current: pl.Series, categorical: bool, min_rows: int) -> dict[str, Any]:
    """The PSI of two samples (the effect) and the p-value of the snapshot's test for that kind of
    column (chi-square for categories, Kolmogorov-Smirnov for numbers), or why they are not judged."""
    reference, current = reference.drop_nulls(), current.drop_nulls()
    if not categorical:
        reference, current = reference.filter(reference.is_finite()), current.filter(current.is_finite())
    if (why := too_few(current.len(), reference.len(), min_rows)) is not None:
        return {"not_judged": why}
    if categorical:
        counts = pooled_counts(reference.cast(pl.String), current.cast(pl.String), MIN_SHARE)
        p, test = chi_square_p(counts), "chi-square"
    else:
        counts = numeric_counts(reference.to_numpy(), current.to_numpy())
        p, test = ks_test(reference.to_numpy(), current.to_numpy())[1], "ks"
    return {"psi": round(psi_of(counts), 4), "p": float(f"{p:.3g}"), "test": test,
            "rows": [current.len(), reference.len()]}


def _metric_level(value: float, limit: MetricLimit) -> str:
    if limit.higher_is_better:
        return ("blocked" if limit.block_below is not None and value < limit.block_below else
                "warn" if limit.warn_below is not None and value < limit.warn_below else "ok")
    return ("blocked" if limit.block_above is not None and value > limit.block_above else
            "warn" if limit.warn_above is not None and value > limit.warn_above else "ok")


def _drift_level(found: dict[str, Any], limit: DriftLimit, alpha: float) -> str:
    if "psi" not in found or found["p"] >= alpha:
        return "ok"
    return ("blocked" if limit.block_above is not None and found["psi"] > limit.block_above else
            "warn" if limit.warn_above is not None and found["psi"] > limit.warn_above else "ok")


def _worst(levels: list[str]) -> str:
    return max(levels, key=["ok", "warn", "blocked"].index, default="ok")


@dataclass
class Live:
    """The live metrics of a day, or why they are pending."""

    labeled: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    interval: list[float] | None = None
    pending: str | None = None


@dataclass
class Drift:
    prediction: dict[str, Any]
    features: dict[str, dict[str, Any]]
    alpha: float
    """The significance each feature's test is held to (Bonferroni over the judged features)."""

    @property
    def worst(self) -> str | None:
        drifted = {c: f for c, f in self.features.items() if "psi" in f and f["p"] < self.alpha}
        return max(drifted, key=lambda c: drifted[c]["psi"], default=None)


def live_metrics(spec: ModelSpec, scored: pl.DataFrame, day_labels: pl.DataFrame | None, threshold: float | None,
                 day: dt.date) -> Live:
    """The champion's metrics on the day's rows whose label is known (``day_labels``: keys + LABEL)."""
    cfg, task, primary = spec.monitoring, spec.target.task, spec.promotion.primary_metric
    if day_labels is None:
        return Live(pending="the spec has no schema.keys to match the day's labels to its predictions")
    joined = scored.join(day_labels, on=spec.data_schema.keys, how="left").filter(pl.col(LABEL).is_not_null())
    if joined.height < cfg.min_labeled_rows:
        return Live(joined.height, pending=f"{joined.height} labelled row(s) on {day}, fewer than "
                                           f"monitoring.min_labeled_rows {cfg.min_labeled_rows}")
    y = joined[LABEL].to_numpy()
    pred = (joined.select([c for c in scored.columns if c.startswith(f"{SCORE}_")]).to_numpy()
            if task == "multiclass_classification"
            else joined[SCORE if task == "binary_classification" else PREDICTION].to_numpy())
    top_k = spec.evaluation.top_k
    try:
        values = M.compute_metrics(task, y, pred, threshold, top_k=top_k)
        interval = bootstrap_ci(y, pred, M.metric_function(task, primary, threshold, top_k=top_k),
                                n=cfg.bootstrap_samples, level=spec.evaluation.confidence_level)
    except M.MetricError as exc:
        return Live(joined.height, pending=f"the live metrics cannot be computed on {day}: {exc}")
    return Live(joined.height, values, list(interval))


def drift(spec: ModelSpec, champion, scored: pl.DataFrame, today: pl.DataFrame) -> Drift:
    """The day's predictions and features against the champion's training window."""
    cfg, task = spec.monitoring, spec.target.task
    reference = pl.concat([read_parquet(read_verified(ref["uri"], ref["sha256"]))
                           for ref in champion.meta["train_files"]], how="diagonal_relaxed")
    if reference.height > REFERENCE_ROWS:
        reference = reference.sample(REFERENCE_ROWS, seed=0)
    categorical = spec.features.categorical_names
    features = {c: compare(reference[c], today[c], c in categorical, cfg.min_rows)
                for c in [*spec.features.numeric_names, *categorical]}
    ref_out = predict(champion, reference)
    if task == "multiclass_classification":
        classes = np.asarray([str(c) for c in champion.meta["classes"]])
        prediction = compare(pl.Series(classes[ref_out.argmax(axis=1)]), scored[PREDICTION], True, cfg.min_rows)
    else:
        prediction = compare(pl.Series(ref_out), scored[SCORE if task == "binary_classification" else PREDICTION],
                             False, cfg.min_rows)
    alpha = cfg.significance / max(1, sum("psi" in f for f in features.values()))
    return Drift(prediction, {c: features[c] for c in sorted(features)}, alpha)


def findings(spec: ModelSpec, live: Live, found: Drift, day: dt.date) -> list[dict[str, str]]:
    """Each limit of the spec's monitoring section that the day crossed (kind, level, text)."""
    cfg, out = spec.monitoring, []
    for name, limit in cfg.metrics.items():
        if name in live.metrics and (level := _metric_level(live.metrics[name], limit)) != "ok":
            out.append({"kind": "metric", "level": level, "text": (
                f"{name} {live.metrics[name]:.4f} on {day}: {level} (limits {limit.model_dump(exclude_none=True)})")})
    p = found.prediction
    if cfg.prediction_drift is not None and (level := _drift_level(p, cfg.prediction_drift, cfg.significance)) != "ok":
        out.append({"kind": "drift", "level": level, "text": (
            f"predictions drifted on {day}: PSI {p['psi']:.3f} (p {p['p']:.1e}) against the training window: {level}")})
    worst = found.worst
    if cfg.feature_drift is not None and worst is not None:
        f = found.features[worst]
        if (level := _drift_level(f, cfg.feature_drift, found.alpha)) != "ok":
            out.append({"kind": "drift", "level": level, "text": (
                f"feature {worst} drifted on {day}: PSI {f['psi']:.3f} (p {f['p']:.1e}): {level}")})
    return out


def monitor_day(spec: ModelSpec, day: dt.date, store: VersionStore, client, predictions: PredictionsRecord,
                snapshot: SnapshotRecord, log: Callable[[str], None]) -> MonitorRecord:
    """Judge the champion that scored ``day`` (``predictions``) on the labels of ``snapshot`` (the
    day's latest) and against its training window."""
    mv = registry.get_version(client, spec.name, predictions.model_version)
    champion = registry.load_version(client, mv)
    gate = VersionTags.from_tags(mv.tags).gate
    threshold = float(gate.decision_threshold) if gate and gate.decision_threshold else None
    scored = read_parquet(read_verified(predictions.uri, predictions.sha256))
    day_labels = labels(spec, store, snapshot, day) if spec.data_schema.keys else None
    live = live_metrics(spec, scored, day_labels, threshold, day)
    inputs = day_tables(spec, store, predictions.repository, predictions.data_commit, day)
    found = drift(spec, champion, scored, build_features(spec, inputs.tables, inputs.history, labeled_only=False).frame)
    crossed = findings(spec, live, found, day)
    status = _worst([f["level"] for f in crossed])
    if live.pending and status == "ok":
        status = "pending"
    primary, worst = spec.promotion.primary_metric, found.worst
    log(f"model_monitor {day}: {status}; version {mv.version}, {scored.height} rows scored"
        + (f", {primary} {live.metrics[primary]:.4f}" if primary in live.metrics else f" ({live.pending})"))
    return MonitorRecord(
        model_name=spec.name, model_version=str(mv.version), day=day.isoformat(), status=status, findings=crossed,
        pending_reason=live.pending, rows_scored=scored.height, rows_labeled=live.labeled, primary_metric=primary,
        metrics=live.metrics, primary_interval=live.interval, labels_commit=snapshot.commit,
        predictions_sha256=predictions.sha256, prediction_drift=found.prediction, feature_drift=found.features,
        worst_feature=worst, worst_feature_psi=found.features[worst]["psi"] if worst else None)
