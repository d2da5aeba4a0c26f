"""Distribution drift of a day against a reference of recent validated days.

Categoricals: population stability index. Numerics: two-sample Kolmogorov-Smirnov statistic and
Wasserstein distance (in reference standard deviations). The label: the day's rate against the
reference days' daily rates, as a robust z-score (daily label rates swing with the weather; a fixed
band would cry wolf).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from scipy import stats

from ml_assets.spec import ModelSpec
from ml_assets.validation.outcome import CheckOutcome

DRIFT = "drift"
DAY = "__day"
EPS = 1e-4


def psi(reference: pl.Series, current: pl.Series) -> float:
    ref = reference.fill_null("(null)").value_counts(normalize=True, name="p")
    cur = current.fill_null("(null)").value_counts(normalize=True, name="q")
    name = reference.name
    both = ref.join(cur, on=name, how="full", coalesce=True).fill_null(0.0)
    p = np.clip(both["p"].to_numpy(), EPS, None)
    q = np.clip(both["q"].to_numpy(), EPS, None)
    return float(np.sum((q - p) * np.log(q / p)))


def drift_columns(spec: ModelSpec) -> tuple[list[str], list[str]]:
    """The declared feature inputs present in the raw rows (never the target's inputs)."""
    raw = spec.data_schema.columns
    numeric = [c for c in spec.features.numeric if c in raw and raw[c].dtype in ("int64", "float64")]
    categorical = [c for c in spec.features.categorical if c in raw]
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
    label = _label_rate(spec, rows, reference, cfg.label_rate_z, observed, expected)
    if label:
        counts["label: rate"] = 1
        problems.append(label)
    summary = "; ".join(problems) if problems else (
        f"{len(categorical)} categorical, {len(numeric)} numeric columns and the label within limits "
        f"against {days} reference days")
    return CheckOutcome(DRIFT, not problems, summary, counts, observed, expected)


def _label_rate(spec: ModelSpec, rows: pl.DataFrame, reference: pl.DataFrame, z_limit: float,
                observed: dict, expected: dict) -> str | None:
    if spec.target.task != "binary_classification":
        return None
    label = pl.sql_expr(spec.target.expression).cast(pl.Float64)
    try:
        today = rows.select(label.alias("y")).drop_nulls()["y"]
        daily = reference.select(pl.col(DAY), label.alias("y")).drop_nulls().group_by(DAY).agg(pl.col("y").mean())["y"]
    except pl.exceptions.PolarsError:
        return None  # the target's inputs are broken: the schema checks report that
    if len(today) == 0 or len(daily) < 2:
        return None
    # Robust centre and scale (median, 1.4826 x MAD): a stormy day in the reference must not widen
    # the band so much that a day of flipped labels passes.
    rates = daily.to_numpy()
    rate, centre = float(today.mean()), float(np.median(rates))
    scale = max(1.4826 * float(np.median(np.abs(rates - centre))), 0.02)
    z = (rate - centre) / scale
    low, high = float(rates.min()), float(rates.max())
    observed["label rate"] = round(rate, 4)
    expected["label rate"] = f"{centre:.3f} ± {z_limit} x {scale:.3f}, and within the reference days' {low:.3f}..{high:.3f}"
    # Both: far from the centre AND outside every reference day's rate. Weather moves the daily rate a
    # lot; a rate no recent day has seen, far from the usual, is what a broken label looks like.
    if math.isfinite(z) and abs(z) > z_limit and not low <= rate <= high:
        return (f"label rate {rate:.3f} vs {centre:.3f} over the reference days (robust z {z:+.1f}, limit ±{z_limit}; "
                f"reference days ranged {low:.3f}..{high:.3f})")
    return None
