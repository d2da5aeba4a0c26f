"""Distribution drift of a day against a reference of recent validated days.

Categoricals: population stability index. Numerics: two-sample Kolmogorov-Smirnov statistic and
Wasserstein distance (in reference standard deviations). The label, two ways:

- its relationship to the features: the reference days' label rate per feature value (per decile for
  numerics), combined naive-Bayes style into a score for each of the day's rows, must still rank the
  day's labels better than chance (ROC-AUC >= ``label_auc_min``). Flipped or redefined labels rank
  backwards; a stormy day delays more flights but still mostly the late ones, so it does not.
- its rate: the log-odds of the day's rate against the reference days' daily log-odds, as a robust
  z-score. Daily label rates swing with the weather, so the limit is wide; it catches a label that
  went constant or lost its meaning, where the ranking cannot be judged.

Both were calibrated on every day of the bundled 2013 data (docs/data-validation.md).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from ml_assets.spec import ModelSpec
from ml_assets.validation.names import DRIFT
from ml_assets.validation.outcome import CheckOutcome

DAY = "__day"
EPS = 1e-4


OTHER = "(other)"
MIN_SHARE = 0.01


def psi(reference: pl.Series, current: pl.Series, min_share: float = MIN_SHARE) -> float:
    """Population stability index. Categories under ``min_share`` of the reference (and categories
    the reference never had) are pooled as one "(other)" category: with thousands of rare values (tail
    numbers) the index would otherwise measure sampling noise; a new value taking a large share still
    moves "(other)" and shows."""
    ref = reference.fill_null("(null)").value_counts(normalize=True, name="p")
    name = reference.name
    common = ref.filter(pl.col("p") >= min_share)[name]
    pool = lambda s: s.fill_null("(null)").alias(name).to_frame().select(  # noqa: E731
        pl.when(pl.col(name).is_in(common.implode())).then(pl.col(name)).otherwise(pl.lit(OTHER)).alias(name))[name]
    ref = pool(reference).value_counts(normalize=True, name="p")
    cur = pool(current).value_counts(normalize=True, name="q")
    both = ref.join(cur, on=name, how="full", coalesce=True).fill_null(0.0)
    p = np.clip(both["p"].to_numpy(), EPS, None)
    q = np.clip(both["q"].to_numpy(), EPS, None)
    return float(np.sum((q - p) * np.log(q / p)))


def drift_columns(spec: ModelSpec) -> tuple[list[str], list[str]]:
    """The declared feature inputs present in the raw rows (never the target's inputs)."""
    raw = spec.data_schema.columns
    numeric = [c for c in spec.features.numeric_names if c in raw and raw[c].dtype in ("int64", "float64")]
    categorical = [c for c in spec.features.categorical_names if c in raw]
    return numeric, categorical


def drift_check(spec: ModelSpec, rows: pl.DataFrame, reference: pl.DataFrame) -> CheckOutcome:
    """``reference`` holds the reference days' rows with their day in column ``__day``."""
    cfg = spec.validation.drift
    days = reference[DAY].n_unique() if reference.height else 0
    if days < cfg.min_reference_days or rows.height == 0:
        return CheckOutcome(DRIFT, True, f"only {days} reference day(s) on main, fewer than {cfg.min_reference_days}: "
                            "drift not judged", observed={"reference_days": days},
                            expected={"reference_days": f">= {cfg.min_reference_days}"})
    numeric, categorical = drift_columns(spec)
    observed, expected, counts, problems = {}, {}, {}, []

    def limit(column: str, measure: str) -> float:
        override = cfg.columns.get(column)
        value = getattr(override, measure) if override else None
        return value if value is not None else getattr(cfg, measure)

    # A column whose dtype differs from the reference is the schema check's to report.
    comparable = {c for c in rows.columns if c in reference.columns and rows[c].dtype == reference[c].dtype}
    for col in categorical:
        if col in comparable:
            value, bound = psi(reference[col].cast(pl.String), rows[col].cast(pl.String)), limit(col, "psi")
            observed[f"{col} psi"], expected[f"{col} psi"] = round(value, 4), f"<= {bound}"
            if value > bound:
                counts[f"{col}: psi"] = 1
                problems.append(f"{col}: PSI {value:.3f} > {bound}")
    for col in numeric:
        if col not in comparable:
            continue
        ref = reference[col].drop_nulls().cast(pl.Float64).to_numpy()
        cur = rows[col].drop_nulls().cast(pl.Float64).to_numpy()
        if len(ref) == 0 or len(cur) == 0:
            continue
        from scipy import stats  # imported when a check runs, not when definitions load

        ks = float(stats.ks_2samp(ref, cur).statistic)
        scale = float(np.std(ref)) or 1.0
        wd = float(stats.wasserstein_distance(ref, cur)) / scale
        for measure, value in (("ks", ks), ("wasserstein", wd)):
            bound = limit(col, measure)
            observed[f"{col} {measure}"], expected[f"{col} {measure}"] = round(value, 4), f"<= {bound}"
            if value > bound:
                counts[f"{col}: {measure}"] = 1
                problems.append(f"{col}: {'KS' if measure == 'ks' else 'Wasserstein'} {value:.3f} > {bound}"
                                + (" (reference sd)" if measure == "wasserstein" else ""))
    for problem in _label_checks(spec, rows, reference, comparable, observed, expected):
        counts[f"label: {'relationship' if problem.startswith('label relationship') else 'rate'}"] = 1
        problems.append(problem)
    summary = "; ".join(problems) if problems else (
        f"{len(categorical)} categorical, {len(numeric)} numeric columns and the label within limits "
        f"against {days} reference days")
    return CheckOutcome(DRIFT, not problems, summary, counts, observed, expected)


PRIOR_ROWS = 20  # a feature value's label rate is shrunk towards the overall rate with this many rows' weight
MIN_CLASS_ROWS = 20  # fewer positives or negatives in the day: the ranking is not judged


def _logit(p: np.ndarray | float) -> np.ndarray | float:
    p = np.clip(p, 1e-3, 1 - 1e-3)
    return np.log(p / (1 - p))


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    """ROC-AUC of ``score`` for binary ``y`` (Mann-Whitney U, ties counted half)."""
    positives, negatives = score[y == 1], score[y == 0]
    from scipy import stats

    return float(stats.mannwhitneyu(positives, negatives).statistic) / (len(positives) * len(negatives))


def _column_offsets(reference: pl.DataFrame, today: pl.DataFrame, column: str, numeric: bool, base: float) -> np.ndarray:
    """Per row of ``today``: the log-odds of its value's label rate in the reference, minus the overall."""
    if numeric:
        values = reference[column].cast(pl.Float64).drop_nulls().to_numpy()
        if len(values) == 0:
            return np.zeros(today.height)
        edges = np.unique(np.quantile(values, np.linspace(0, 1, 11)[1:-1]))

        def key(frame: pl.DataFrame) -> pl.Series:  # the decile; a missing value is a bucket of its own
            x = frame[column].cast(pl.Float64).fill_nan(None)
            return pl.Series(np.searchsorted(edges, x.fill_null(0.0).to_numpy())).set(x.is_null(), -1)

        ref = pl.DataFrame({"k": key(reference), "y": reference["y"]})
        cur = pl.DataFrame({"k": key(today)})
    else:
        ref = pl.DataFrame({"k": reference[column].cast(pl.String), "y": reference["y"]})
        cur = pl.DataFrame({"k": today[column].cast(pl.String)})
    rates = ref.group_by("k").agg(((pl.col("y").sum() + PRIOR_ROWS * base) / (pl.len() + PRIOR_ROWS)).alias("p"))
    p = cur.join(rates, on="k", how="left", nulls_equal=True, maintain_order="left")["p"].fill_null(base).to_numpy()
    return _logit(p) - _logit(base)


def _label_checks(spec: ModelSpec, rows: pl.DataFrame, reference: pl.DataFrame, comparable: set[str],
                  observed: dict, expected: dict) -> list[str]:
    cfg = spec.validation.drift
    if spec.target.task != "binary_classification":
        return []
    label = pl.sql_expr(spec.target.expression).cast(pl.Float64).alias("y")
    numeric, categorical = drift_columns(spec)
    try:
        today = rows.with_columns(label).filter(pl.col("y").is_not_null())
        past = reference.with_columns(label).filter(pl.col("y").is_not_null())
    except pl.exceptions.PolarsError:
        return []  # the target's inputs are broken: the schema checks report that
    daily = past.group_by(DAY).agg(pl.col("y").mean())["y"].to_numpy()
    if today.height == 0 or len(daily) < 2:
        return []
    problems = []
    rate = float(today["y"].mean())
    centre = float(np.median(_logit(daily)))
    scale = max(1.4826 * float(np.median(np.abs(_logit(daily) - centre))), 0.3)
    z = (float(_logit(rate)) - centre) / scale
    observed["label rate"] = round(rate, 4)
    observed["label rate robust z (log-odds)"] = round(z, 2)
    expected["label rate"] = (f"log-odds within ±{cfg.label_rate_z} robust sd of the reference days' "
                              f"(median rate {1 / (1 + math.exp(-centre)):.3f}, daily {daily.min():.3f}..{daily.max():.3f})")
    if math.isfinite(z) and abs(z) > cfg.label_rate_z:
        problems.append(f"label rate {rate:.3f} vs a median of {1 / (1 + math.exp(-centre)):.3f} over the reference days "
                        f"(robust z of the log-odds {z:+.1f}, limit ±{cfg.label_rate_z}; reference days ranged "
                        f"{daily.min():.3f}..{daily.max():.3f})")
    y = today["y"].to_numpy()
    if min(int(y.sum()), int(len(y) - y.sum())) < MIN_CLASS_ROWS:
        observed["label relationship"] = f"not judged: fewer than {MIN_CLASS_ROWS} rows of one class"
        return problems
    base = float(past["y"].mean())
    columns = [c for c in (*numeric, *categorical) if c in comparable]
    offsets = {c: _column_offsets(past, today, c, c in numeric, base) for c in columns}
    if not offsets:
        return problems
    auc = _auc(sum(offsets.values()), y)
    by_column = {c: round(_auc(o, y), 3) for c, o in offsets.items()}
    observed["label relationship auc"] = round(auc, 4)
    observed["label relationship auc by column"] = by_column
    expected["label relationship auc"] = f">= {cfg.label_auc_min}"
    if auc < cfg.label_auc_min:
        worst = ", ".join(f"{c} {a:.2f}" for c, a in sorted(by_column.items(), key=lambda kv: kv[1])[:3])
        problems.append(f"label relationship: the reference days' label rates by {', '.join(columns)} rank the day's "
                        f"labels at ROC-AUC {auc:.3f}, below {cfg.label_auc_min} (lowest by column: {worst}): the "
                        "labels run against recent days; flipped or redefined labels do this, and so does a day "
                        "unlike any recent one")
    return problems
