"""Tests that know their sample sizes: whether a difference could be told from noise at all, beside how
large it is. A check fails only when both the effect size passes its limit and its test rejects.

scipy is imported inside the functions: definitions load without it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

EPS = 1e-4  # a share the reference never had is taken as this, so PSI stays finite
OTHER = "(other)"
NULL = "(null)"
MIN_SHARE = 0.01


def too_few(current: int, reference: int, min_rows: int) -> str | None:
    """Why a comparison of ``current`` with ``reference`` rows is not judged, or None when it is."""
    if current < min_rows:
        return f"{current} row{'' if current == 1 else 's'} < {min_rows}"
    if reference < min_rows:
        return f"{reference} reference row{'' if reference == 1 else 's'} < {min_rows}"
    return None


def ks_test(reference: np.ndarray, current: np.ndarray) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov statistic and its p-value for these sizes (exact for small samples)."""
    from scipy import stats

    result = stats.ks_2samp(reference, current)
    return float(result.statistic), float(result.pvalue)


def pooled_counts(reference: pl.Series, current: pl.Series, min_share: float = MIN_SHARE,
                  min_expected: float = 0.0) -> pl.DataFrame:
    """Counts per category (``ref``, ``cur``), rare categories pooled as one "(other)".

    A category stays on its own while it holds at least ``min_share`` of the reference (with thousands of
    rare values, tail numbers, PSI would otherwise measure sampling noise) and the current rows expect at
    least ``min_expected`` of it under the reference's mix (what a chi-square test needs to be valid).
    Values the reference never had join "(other)", so a new value taking a large share still shows. While
    "(other)" itself expects too few, the smallest remaining category joins it.
    """
    name = "category"
    ref = reference.cast(pl.String).fill_null(NULL).alias(name).value_counts(name="ref")
    cur = current.cast(pl.String).fill_null(NULL).alias(name).value_counts(name="cur")
    both = ref.join(cur, on=name, how="full", coalesce=True).fill_null(0)
    share = both["ref"] / max(reference.len(), 1)
    expect = share * current.len()
    keep = both.with_columns(own=(share >= min_share) & (expect >= min_expected) & (share > 0), expect=expect)
    kept = keep.filter("own").sort("expect")
    pooled_expect = float(keep.filter(~pl.col("own"))["expect"].sum())
    pooled_any = keep.height > kept.height
    while pooled_any and pooled_expect < min_expected and kept.height:
        pooled_expect += float(kept["expect"][0])
        kept = kept.slice(1)
    own = set(kept[name].to_list())
    label = pl.when(pl.col(name).is_in(list(own))).then(pl.col(name)).otherwise(pl.lit(OTHER))
    return both.group_by(label.alias(name)).agg(pl.col("ref").sum(), pl.col("cur").sum()).sort(name)


def psi_of(counts: pl.DataFrame) -> float:
    """Population stability index of ``pooled_counts``."""
    p = np.clip(counts["ref"].to_numpy() / max(counts["ref"].sum(), 1), EPS, None)
    q = np.clip(counts["cur"].to_numpy() / max(counts["cur"].sum(), 1), EPS, None)
    return float(np.sum((q - p) * np.log(q / p)))


def chi_square_p(counts: pl.DataFrame) -> float:
    """Pearson's chi-square test of homogeneity of the two rows of ``pooled_counts`` (reference and current
    as two samples: both sizes count, not only the current one's)."""
    from scipy import stats

    table = np.array([counts["ref"].to_numpy(), counts["cur"].to_numpy()], dtype=float)
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2 or (table.sum(axis=1) == 0).any():
        return 1.0
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(statistic, table.shape[1] - 1))


def binomial_p(successes: int, trials: int, rate: float) -> float:
    """Two-sided exact binomial test of ``successes`` in ``trials`` against ``rate``."""
    from scipy import stats

    if rate <= 0 or rate >= 1:
        return 0.0 if (successes > 0 if rate <= 0 else successes < trials) else 1.0
    return float(stats.binomtest(successes, trials, rate).pvalue)


def poisson_p(count: int, mean: float) -> float:
    """Two-sided p-value of ``count`` under a Poisson count with ``mean`` (twice the smaller tail)."""
    from scipy import (
        special,  # the functions scipy.stats.poisson's cdf and sf call, without its overhead
    )

    lower = float(special.pdtr(count, mean)) if count >= 0 else 0.0
    upper = float(special.pdtrc(count - 1, mean)) if count >= 1 else 1.0
    return float(min(1.0, 2 * min(lower, upper)))
