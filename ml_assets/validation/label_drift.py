"""The drift check's two judgements of a binary label, and of each class of a multiclass one taken
as "that class or not" (docs/data-validation.md).

- its relationship to the features: the reference's label rate per feature value (per decile for
  numerics), combined naive-Bayes style into a score for each row of the current window, must still rank
  those rows' labels better than chance (ROC-AUC >= ``label_auc_min``). Flipped or redefined labels rank
  backwards; a stormy day delays more flights but still mostly the late ones, so it does not.
- its rate: the log-odds of the current window's rate against the reference's, taken per block of
  ``current_days`` days (per day by default), as a robust z-score; and a binomial test of the window's
  positives against the reference rate must reject too. Daily label rates swing with the weather, so the
  limit is wide; it catches a label that went constant or lost its meaning, where the ranking cannot be
  judged.

Both were calibrated on every day of the bundled 2013 data.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from ml_assets.spec import DriftSpec, ModelSpec
from ml_assets.validation.stats import binomial_p, too_few

DAY = "__day"
PRIOR_ROWS = 20  # a feature value's label rate is shrunk towards the overall rate with this many rows' weight
MIN_CLASS_ROWS = 20  # fewer positives or negatives in the current window: the ranking is not judged


@dataclass
class Labelled:
    """The current window's and the reference's rows with a known label, as ``y`` (0.0 or 1.0)."""

    current: pl.DataFrame
    reference: pl.DataFrame
    rate_not_judged: str | None
    """Why the label rate is not judged, or None when it is."""


def binary_labels(spec: ModelSpec) -> dict[str, pl.Expr]:
    """The label as 0/1, named: the label itself (binary classification), or one per class of a
    multiclass label (that class or not: per-class rates are judged as binary ones); none for regression."""
    target = spec.target
    if target.task == "binary_classification":
        return {"label": pl.sql_expr(target.expression).cast(pl.Float64)}
    if target.task == "multiclass_classification" and target.classes:
        label = pl.sql_expr(target.expression).cast(pl.String)
        return {f"class {c}": (label == c).cast(pl.Float64) for c in target.classes}
    return {}


def labelled(spec: ModelSpec, current: pl.DataFrame, reference: pl.DataFrame, window_start: dt.date | None,
             label: pl.Expr) -> Labelled | None:
    """None when the target's inputs are broken (the schema checks say so)."""
    label = label.alias("y")
    try:
        now = current.with_columns(label).filter(pl.col("y").is_not_null())
        past = reference.with_columns(label).filter(pl.col("y").is_not_null())
    except pl.exceptions.PolarsError:
        return None
    cfg = spec.validation.drift
    if (why := too_few(now.height, past.height, cfg.min_rows)) is None:
        past = past.with_columns(_blocks(past, window_start, cfg))
        blocks = past.filter(pl.col("__block").is_not_null())["__block"].n_unique()
        if blocks < 2:
            unit = "day" if cfg.current_days == 1 else f"block of {cfg.current_days} days"
            why = f"{blocks} reference {unit}{'' if blocks == 1 else 's'} with labels < 2"
    return Labelled(now, past, why)


def _blocks(past: pl.DataFrame, window_start: dt.date | None, cfg: DriftSpec) -> pl.Expr:
    """The reference split into blocks of ``current_days`` days counted back from the current window, so a
    pooled window is compared with rates pooled over as many days; a partial block at the far end is left out."""
    if cfg.current_days == 1 or window_start is None:
        return pl.col(DAY).rank("dense").alias("__block")
    back = (pl.lit(window_start) - pl.col(DAY)).dt.total_days() - 1
    block = back // cfg.current_days
    return pl.when(block < cfg.reference_days // cfg.current_days).then(block).alias("__block")


def _logit(p: np.ndarray | float) -> np.ndarray | float:
    p = np.clip(p, 1e-3, 1 - 1e-3)
    return np.log(p / (1 - p))


def label_rate(cfg: DriftSpec, data: Labelled, alpha: float, observed: dict, expected: dict,
               name: str = "label") -> str | None:
    """The problem with the current window's label rate, or None."""
    rates = data.reference.filter(pl.col("__block").is_not_null()).group_by("__block").agg(pl.col("y").mean())
    blocks = rates["y"].to_numpy()
    positives, rows = int(data.current["y"].sum()), data.current.height
    rate, base = positives / rows, float(data.reference["y"].mean())
    centre = float(np.median(_logit(blocks)))
    scale = max(1.4826 * float(np.median(np.abs(_logit(blocks) - centre))), 0.3)
    z = (float(_logit(rate)) - centre) / scale
    p = binomial_p(positives, rows, base)
    unit = "days" if cfg.current_days == 1 else f"{len(blocks)} blocks of {cfg.current_days} days"
    median = 1 / (1 + math.exp(-centre))
    observed[f"{name} rate"] = round(rate, 4)
    observed[f"{name} rate robust z (log-odds)"] = round(z, 2)
    observed[f"{name} rate binomial p-value"] = float(f"{p:.3g}")
    expected[f"{name} rate"] = (f"log-odds within ±{cfg.label_rate_z} robust sd of the reference {unit}' (median rate "
                              f"{median:.3f}, {blocks.min():.3f}..{blocks.max():.3f}), or binomial p >= {alpha:.2g}")
    if not (math.isfinite(z) and abs(z) > cfg.label_rate_z and p < alpha):
        return None
    return (f"{name} rate {rate:.3f} vs a median of {median:.3f} over the reference {unit} (robust z of the log-odds "
            f"{z:+.1f}, limit ±{cfg.label_rate_z}; reference {unit} ranged {blocks.min():.3f}..{blocks.max():.3f}; "
            f"binomial p {p:.1e} < {alpha:.2g}, {positives} of {rows} rows)")


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    """ROC-AUC of ``score`` for binary ``y``: the Mann-Whitney U statistic from average ranks (ties
    counted half), in numpy: a day's replay computes this a few hundred times."""
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based, ties averaged
    positives = int(np.count_nonzero(y == 1))
    negatives = len(y) - positives
    return float(ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)


def _column_offsets(reference: pl.DataFrame, today: pl.DataFrame, column: str, numeric: bool, base: float) -> np.ndarray:
    """Per row of ``today``: the log-odds of its value's label rate in the reference, minus the overall.
    Values are coded as integers (a numeric column by reference decile, a categorical by value; a
    missing value is a code of its own) and the rates counted with numpy."""
    if numeric:
        values = reference[column].cast(pl.Float64).drop_nulls().to_numpy()
        if len(values) == 0:
            return np.zeros(today.height)
        edges = np.unique(np.quantile(values, np.linspace(0, 1, 11)[1:-1]))

        def codes(frame: pl.DataFrame) -> np.ndarray:  # the decile; a missing value is a bucket of its own
            x = frame[column].cast(pl.Float64).fill_nan(None)
            return np.where(x.is_null().to_numpy(), len(edges) + 1, np.searchsorted(edges, x.fill_null(0.0).to_numpy()))

        ref_k, cur_k, size = codes(reference), codes(today), len(edges) + 2
    else:
        both = pl.concat([reference[column].cast(pl.String), today[column].cast(pl.String)])
        coded = both.cast(pl.Categorical).to_physical().fill_null(-1).to_numpy().astype(np.int64) + 1  # null: 0
        ref_k, cur_k, size = coded[:reference.height], coded[reference.height:], int(coded.max(initial=0)) + 1
    y = reference["y"].cast(pl.Float64).to_numpy()
    sums, rows = np.bincount(ref_k, weights=y, minlength=size), np.bincount(ref_k, minlength=size)
    rates = (sums + PRIOR_ROWS * base) / (rows + PRIOR_ROWS)
    p = np.where(rows[cur_k] > 0, rates[cur_k], base)
    return _logit(p) - _logit(base)


def relationship_not_judged(data: Labelled) -> str | None:
    """Why the ranking of the current window's labels cannot be judged, or None when it can."""
    positives = int(data.current["y"].sum())
    fewer = min(positives, data.current.height - positives)
    if fewer < MIN_CLASS_ROWS:
        return f"{fewer} row{'' if fewer == 1 else 's'} of one class < {MIN_CLASS_ROWS}"
    if data.reference.height == 0:
        return "no labelled reference rows"
    return None


def label_relationship(cfg: DriftSpec, data: Labelled, numeric: list[str], columns: list[str],
                       observed: dict, expected: dict, name: str = "label") -> str | None:
    """The problem with how the reference's label rates by feature rank the current window's labels, or None
    (``relationship_not_judged`` first). ``columns``: the drift columns comparable with the reference
    (``numeric`` says which are numeric)."""
    y = data.current["y"].to_numpy()
    base = float(data.reference["y"].mean())
    offsets = {c: _column_offsets(data.reference, data.current, c, c in numeric, base) for c in columns}
    if not offsets:
        return None
    auc = _auc(sum(offsets.values()), y)
    by_column = {c: round(_auc(o, y), 3) for c, o in offsets.items()}
    observed[f"{name} relationship auc"] = round(auc, 4)
    observed[f"{name} relationship auc by column"] = by_column
    expected[f"{name} relationship auc"] = f">= {cfg.label_auc_min}"
    if auc >= cfg.label_auc_min:
        return None
    worst = ", ".join(f"{c} {a:.2f}" for c, a in sorted(by_column.items(), key=lambda kv: kv[1])[:3])
    return (f"{name} relationship: the reference days' {name} rates by {', '.join(columns)} rank the day's "
            f"labels at ROC-AUC {auc:.3f}, below {cfg.label_auc_min} (lowest by column: {worst}): the "
            "labels run against recent days; flipped or redefined labels do this, and so does a day "
            "unlike any recent one")
