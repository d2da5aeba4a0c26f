"""The drift check of a spec with a calibration: the day judged by ``Gate`` against the calibrated
limits, as a ``CheckOutcome`` that names each column past its limit, the limit and the reference."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from ml_assets.spec import ModelSpec
from ml_assets.spec.calibration import Calibration
from ml_assets.validation.gate import Finding, Gate
from ml_assets.validation.label_drift import DAY
from ml_assets.validation.names import DRIFT
from ml_assets.validation.outcome import CheckOutcome
from ml_assets.validation.signals import daily

NEAREST = 5  # the observed metadata lists this many tests nearest their limits


def outcome(cal: Calibration, day: dt.date, stats: np.ndarray) -> CheckOutcome:
    """The drift check's outcome for ``day`` from its test statistics."""
    limits = np.array([t.limit for t in cal.tests])
    judged = np.isfinite(stats)
    with np.errstate(invalid="ignore", divide="ignore"):
        over = judged & (stats > limits)
        ratio = np.where(judged, stats / np.where(limits > 0, limits, 1e-12), -np.inf)
    findings = [Finding(cal.tests[i], float(stats[i])) for i in np.argsort(-ratio) if over[i]]
    nearest = [i for i in np.argsort(-ratio)[:NEAREST] if judged[i]]
    observed = {"calibration": f"{cal.version[:12]} ({cal.start}..{cal.end}, target rate {cal.target_rate:g})",
                "tests judged": int(judged.sum()), "tests": len(cal.tests)}
    observed |= {cal.tests[i].name: round(float(stats[i]), 4) for i in nearest}
    expected = {cal.tests[i].name: f"<= {cal.tests[i].limit:.4g}" for i in nearest}
    counts = {}
    for f in findings:
        counts[f"{cal.signals[f.test.signal].column}: {f.test.kind}"] = 1
    if findings:
        summary = "; ".join(f.describe(cal, day) for f in findings[:3])
        if len(findings) > 3:
            summary += f"; and {len(findings) - 3} more test(s) past their limits"
    elif not judged.any():
        summary = (f"not judged: fewer than {cal.level_days // 2} of the {cal.level_days} days before the window "
                   "are on main")
    else:
        summary = (f"{int(judged.sum())} of {len(cal.tests)} calibrated tests within their limits (calibration "
                   f"{cal.version[:12]} on {cal.start}..{cal.end})")
    return CheckOutcome(DRIFT, not findings, summary, counts, observed, expected)


def calibrated_drift(spec: ModelSpec, rows: pl.DataFrame, day: dt.date, history: pl.DataFrame) -> CheckOutcome:
    """``rows``: the day's; ``history``: the rows on main of the days before it (their day in ``__day``)."""
    cal = spec.validation.calibration
    assert cal is not None
    first = day - dt.timedelta(days=cal.history_days)
    days = [first + dt.timedelta(days=i) for i in range(cal.history_days + 1)]
    past = history.filter(pl.col(DAY) >= first) if history.height else history
    frame = pl.concat([past, rows.with_columns(pl.lit(day, pl.Date).alias(DAY))], how="diagonal_relaxed") \
        if past.height else rows.with_columns(pl.lit(day, pl.Date).alias(DAY))
    data = daily(spec, cal.signals, frame, days)
    on_main = set(past[DAY].unique().to_list()) if past.height else set()
    published = np.array([d in on_main for d in days])
    stats = next(s for t, s in Gate(cal).run(data, published, len(days) - 1))
    return outcome(cal, day, stats)
