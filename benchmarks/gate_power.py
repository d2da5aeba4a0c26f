"""Calibrated gates out of sample: quiet on ordinary days, quick on real breaks.

For each of three real daily series (examples/daily_series: Seattle's weather 2012-2015, Melbourne's
temperatures 1981-1990, the views of Peyton Manning's Wikipedia page 2007-2016), the checks are
calibrated (``ml-assets calibrate``'s code, at the default target rate of 1%) on the first part of
the history only, then the rest is replayed:

- clean, as it is: the share of its days blocked (goal: <= 1%);
- with a fault injected into a copy of it at several start days, each kind of break on the series'
  main column (or its label, or its category): whether the replay blocks a day naming the column within
  45 days, and after how many days (0: on the fault's first day).

    python -m benchmarks.gate_power [--quick]

RESULT lines: the worst series' clean block rate; the faults never caught; the longest delay of the
breaks a row check catches (goal 0: on their first day); the median delay of the distribution breaks
the drift check catches (goal <= 3 days).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ml_assets.ingest.sources import read_range
from ml_assets.spec import ModelSpec, load_spec
from ml_assets.spec.loading import without_calibration
from ml_assets.validation.calibrate import calibrate, check_range
from ml_assets.validation.judged import NUMERIC, judged_columns
from ml_assets.validation.names import KEYS, NULLS, RANGES, SCHEMA
from ml_assets.validation.replay import replay

ROOT = Path(__file__).resolve().parents[1]
DAY = "__day"
HORIZON = 45
ROW_CHECKS = (SCHEMA, NULLS, RANGES, KEYS)


@dataclass
class Series:
    spec: str
    calibrate: tuple[dt.date, dt.date]
    holdout: tuple[dt.date, dt.date]
    column: str
    unit: Callable[[pl.Expr], pl.Expr]
    drop: Callable[[pl.Expr], pl.Expr]
    label: str
    positive: Callable[[pl.Expr], pl.Expr]
    """The label's column made positive (for a negative row) / negative (for a positive row)."""
    negative: Callable[[pl.Expr], pl.Expr]
    category: tuple[str, str, str] | None = None


SERIES = [
    Series("seattle_rain", (dt.date(2012, 1, 1), dt.date(2013, 12, 31)), (dt.date(2014, 1, 1), dt.date(2015, 12, 31)),
           "temp_max", lambda c: c * 1.8 + 32, lambda c: c * 0.7, "precipitation",
           lambda c: pl.lit(2.5), lambda c: pl.lit(0.0), ("weather", "sun", "sunny")),
    Series("melbourne_hot", (dt.date(1981, 1, 1), dt.date(1985, 12, 31)), (dt.date(1986, 1, 1), dt.date(1990, 12, 31)),
           "Min_Temp", lambda c: c * 1.8 + 32, lambda c: c * 0.7, "Max_Temp",
           lambda c: 50 - c, lambda c: 50 - c),
    # y is log(views): a unit change multiplies the stored value, a 30% drop of views subtracts 0.357.
    Series("peyton_views", (dt.date(2010, 8, 1), dt.date(2013, 12, 31)), (dt.date(2014, 1, 1), dt.date(2016, 1, 20)),
           "y", lambda c: c * 0.3048, lambda c: c + math.log(0.7), "y", lambda c: 18 - c, lambda c: 18 - c),
]
KINDS = ("unit_change", "stuck", "shifted_one_day", "level_drop_30", "nulls_50", "label_rate_doubled",
         "label_flipped", "category_renamed")


def inject(rows: pl.DataFrame, series: Series, spec: ModelSpec, kind: str, start: dt.date, seed: int) -> pl.DataFrame:
    """A copy of ``rows`` with the fault from ``start`` on."""
    on = pl.col(DAY) >= start
    col = pl.col(series.column)
    rng = np.random.default_rng(seed)
    draw = pl.Series(rng.random(rows.height))
    if kind == "unit_change":
        return rows.with_columns(pl.when(on).then(series.unit(col)).otherwise(col).alias(series.column))
    if kind == "stuck":
        before = rows.filter(pl.col(DAY) < start)[series.column].drop_nulls()[-1]
        return rows.with_columns(pl.when(on).then(pl.lit(before)).otherwise(col).alias(series.column))
    if kind == "shifted_one_day":
        return rows.sort(DAY).with_columns(pl.when(on).then(col.shift(1)).otherwise(col).alias(series.column))
    if kind == "level_drop_30":
        return rows.with_columns(pl.when(on).then(series.drop(col)).otherwise(col).alias(series.column))
    if kind == "nulls_50":
        burst = on & (pl.col(DAY) < start + dt.timedelta(days=14)) & (draw < 0.5)
        return rows.with_columns(pl.when(burst).then(None).otherwise(col).alias(series.column))
    label = pl.sql_expr(spec.target.expression)
    target = pl.col(series.label)
    if kind == "label_rate_doubled":
        # Doubled from the season's rate (the eight weeks before), at least 5%: a share of negatives
        # turned positive, so that the window's rate is twice what it was.
        recent = pl.col(DAY).is_between(start - dt.timedelta(days=56), start - dt.timedelta(days=1))
        rate = max(float(rows.filter(recent).select(label.cast(pl.Float64).mean()).item()), 0.05)
        flip = on & ~label & (draw < min(rate / (1 - rate), 1.0))
        return rows.with_columns(pl.when(flip).then(series.positive(target)).otherwise(target).alias(series.label))
    if kind == "label_flipped":
        flipped = pl.when(label).then(series.negative(target)).otherwise(series.positive(target))
        return rows.with_columns(pl.when(on).then(flipped).otherwise(target).alias(series.label))
    assert kind == "category_renamed" and series.category is not None
    column, old, new = series.category
    renamed = pl.when(on & (pl.col(column) == old)).then(pl.lit(new)).otherwise(pl.col(column))
    return rows.with_columns(renamed.alias(column))


def example(series: Series) -> ModelSpec:
    """The example's spec without the calibration committed beside it: this benchmark fits its own."""
    with without_calibration():
        return load_spec(ROOT / "examples" / "daily_series" / f"{series.spec}.yaml")


def calibrated(series: Series, rows: pl.DataFrame) -> ModelSpec:
    spec = example(series)
    first, last = series.calibrate
    history = rows.filter(pl.col(DAY).is_between(first, last))
    missing = check_range(spec, first, last, set(history[DAY].unique().to_list()), 0.01)
    cal = calibrate(spec, history, first, last, missing, 0.01)
    data = spec.model_dump(by_alias=True)
    data["validation"]["calibration"] = cal
    return type(spec).model_validate(data)


def first_change(clean: pl.DataFrame, faulted: pl.DataFrame, start: dt.date) -> dt.date:
    """The first day whose rows the fault changed (a burst of nulls may miss its first days)."""
    a, b = clean.filter(pl.col(DAY) >= start), faulted.filter(pl.col(DAY) >= start)
    same = pl.all_horizontal([(a[c].cast(pl.String).eq_missing(b[c].cast(pl.String))) for c in a.columns])
    changed = a.with_columns(same.alias("__same")).filter(~pl.col("__same"))[DAY]
    return changed.min() if changed.len() else start


def caught(spec: ModelSpec, rows: pl.DataFrame, start: dt.date, names: tuple[str, ...]) -> tuple[int, str] | None:
    """(days from ``start`` to the first day blocked naming one of ``names``, the check), or None within
    HORIZON."""
    for verdict in replay(spec, start, start + dt.timedelta(days=HORIZON), rows=rows):
        for check, summary in verdict.failed.items():
            if any(n in summary for n in names):
                return (verdict.day - start).days, check
    return None


def starts(series: Series, count: int) -> list[dt.date]:
    first, last = series.holdout
    usable = (last - first).days - HORIZON - 60
    return [first + dt.timedelta(days=60 + round(i * usable / max(count - 1, 1))) for i in range(count)]


def run_series(series: Series, count: int, kinds: tuple[str, ...]) -> tuple[float, list[dict]]:
    spec = example(series)
    rows = read_range(spec, series.calibrate[0], series.holdout[1]).rows
    began = time.monotonic()
    spec = calibrated(series, rows)
    cal = spec.validation.calibration
    print(f"{series.spec}: calibrated on {series.calibrate[0]}..{series.calibrate[1]} in {time.monotonic() - began:.1f} s "
          f"({len(cal.tests)} tests, in-sample block rate {cal.in_sample_rate:.2%})")
    clean = [v for v in replay(spec, *series.holdout, rows=rows) if not v.absent]
    blocked = [v for v in clean if not v.passed]
    rate = len(blocked) / len(clean)
    print(f"  clean {series.holdout[0]}..{series.holdout[1]}: {len(blocked)} of {len(clean)} days blocked ({rate:.2%})"
          + "".join(f"\n    {v.day}: {'; '.join(v.failed.values())[:160]}" for v in blocked[:6]))
    found = []
    for kind in kinds:
        if kind == "category_renamed" and series.category is None:
            continue
        names = ((series.label, "label") if kind.startswith("label") else
                 (series.category[0],) if kind == "category_renamed" else (series.column,))
        results = []
        for i, start in enumerate(starts(series, count)):
            faulted = inject(rows, series, spec, kind, start, seed=i)
            hit = caught(spec, faulted, first_change(rows.sort(DAY), faulted.sort(DAY), start), names)
            results.append(hit)
            found.append({"series": series.spec, "kind": kind, "start": start, "hit": hit})
        delays = [f"{h[0]}d ({h[1]})" if h else "missed" for h in results]
        print(f"  {kind:<20} {', '.join(delays)}")
        if kind == "shifted_one_day" and None in results:
            print("    " + shift_size(spec, rows, series))
        if kind == "level_drop_30" and None in results:
            print("    " + drop_size(spec, rows, series, [s for s, h in zip(starts(series, count), results, strict=True)
                                                            if h is None]))
    return rate, found


def drop_size(spec: ModelSpec, rows: pl.DataFrame, series: Series, missed: list[dt.date]) -> str:
    """How large the missed drops are against the column's natural variability: the shift of its daily
    mean (in the calibration's units: log where the signal is) in its daily sd, beside the limits of
    its level tests in the same sd."""
    cal = spec.validation.calibration
    key = f"{series.column}:mean"
    sig = cal.signals[key]
    shifts = []
    for start in missed:
        window = rows.filter(pl.col(DAY).is_between(start, start + dt.timedelta(days=HORIZON)))[series.column]
        dropped = window.to_frame().select(series.drop(pl.col(series.column)))[series.column]
        before, after = (np.log(np.clip(v.to_numpy(), 1e-12, None)) if sig.log else v.to_numpy()
                         for v in (window, dropped))
        shifts.append(abs(float(np.nanmean(after - before))) / sig.scale)
    limits = ", ".join(f"{t.limit:.1f} ({t.window} days)" for t in cal.tests if t.signal == key and t.kind == "level")
    return (f"missed drops: {series.column}'s daily mean moves by {statistics.median(shifts):.1f} of its daily sd "
            f"(median of {len(shifts)}); its level tests block at a median day {limits} sd off its recent level")


def shift_size(spec: ModelSpec, rows: pl.DataFrame, series: Series) -> str:
    """How much a shift of the column changes its tie with each other numeric column on the held-out
    days: the correlation of their daily anomalies (less a centred 31-day mean) on the same day, and
    with the column's day before (what a column shifted a day late shows)."""
    numeric = [c for c, t in judged_columns(spec).items() if t in NUMERIC and c != series.column]
    held = (rows.filter(pl.col(DAY).is_between(*series.holdout)).group_by(DAY)
            .agg(pl.col(c).cast(pl.Float64).mean() for c in [series.column, *numeric]).sort(DAY))

    def anomaly(c: str) -> np.ndarray:
        x = held[c].cast(pl.Float64)
        return (x - x.rolling_mean(31, center=True)).to_numpy()

    def corr(a: np.ndarray, b: np.ndarray) -> float:
        ok = np.isfinite(a) & np.isfinite(b)
        return float(np.corrcoef(a[ok], b[ok])[0, 1])

    own = anomaly(series.column)
    ties = ", ".join(f"{c} {corr(own[1:], anomaly(c)[1:]):+.2f} / {corr(own[:-1], anomaly(c)[1:]):+.2f}"
                     for c in numeric)
    return (f"missed shifts: {series.column}'s anomaly against each other numeric column's, on its own day / "
            f"a day late: {ties or 'no other numeric column'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one series, two starts per fault")
    quick = parser.parse_args().quick
    series = SERIES[:1] if quick else SERIES
    rates, found = [], []
    for s in series:
        rate, hits = run_series(s, 2 if quick else 6, KINDS)
        rates.append(rate)
        found += hits
    missed = sum(f["hit"] is None for f in found)
    row_level = [f["hit"][0] for f in found if f["hit"] and f["hit"][1] in ROW_CHECKS]
    drift = [f["hit"][0] for f in found if f["hit"] and f["hit"][1] not in ROW_CHECKS]
    print(f"{len(found)} injections: {missed} missed; {len(row_level)} caught by a row check, {len(drift)} by drift "
          f"(delays {sorted(drift)})")
    print(f"RESULT gate_power_clean_block_rate {max(rates):.4f} goal <= 0.01")
    print(f"RESULT gate_power_missed {missed} goal == 0")
    print(f"RESULT gate_power_row_level_delay {max(row_level, default=0)} goal == 0")
    print(f"RESULT gate_power_median_delay {statistics.median(drift) if drift else 0:.1f} goal <= 3")


if __name__ == "__main__":
    main()
