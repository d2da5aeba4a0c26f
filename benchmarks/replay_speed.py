"""Replaying years of one row a day: the calibrated replay (vectorized over days) against today's.

A source of one row a day for 15 years (5,479 days) and 50 columns (45 numeric with a trend, a weekly
and a yearly cycle; 4 categorical; a binary label), seeded, in one CSV file. Today's replay judges
each day from scratch (the spec lists every numeric column under ``drift.seasonal``, as
docs/bring-your-own-data.md's recipe did); it is timed on 40 days whose history is full (three earlier
years on main), one day at a time as it judges each.
The calibrated replay (``ml-assets calibrate``, then ``replay-checks`` with the calibration) runs
over every day; ``calibrate`` itself is timed too.

    python -m benchmarks.replay_speed [--quick]

RESULT: the calibrated replay's days per second over today's (goal >= 10).
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from ml_assets.ingest.sources import read_range
from ml_assets.spec import ModelSpec, load_spec
from ml_assets.validation.calibrate import calibrate, check_range
from ml_assets.validation.replay import _judge_day, replay

START = dt.date(2010, 1, 1)
NUMERIC, CATEGORICAL = 45, 4


def series(days: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    t = np.arange(days)
    dates = [START + dt.timedelta(days=int(i)) for i in t]
    dow = np.array([d.weekday() for d in dates])
    data: dict[str, object] = {"day": [d.isoformat() for d in dates]}
    for c in range(NUMERIC):
        trend = 100 + rng.normal(0, 0.01) * t
        yearly = rng.uniform(0, 20) * np.sin(2 * np.pi * (t / 365.25 + rng.uniform()))
        weekly = rng.uniform(0, 5) * (dow >= 5)
        noise = np.convolve(rng.normal(0, rng.uniform(1, 5), days + 6), np.ones(7) / 3, "valid")[:days]
        data[f"x{c}"] = np.round(trend + yearly + weekly + noise, 2)
    for c in range(CATEGORICAL):
        data[f"c{c}"] = rng.choice(["a", "b", "c", "d"], size=days, p=[0.4, 0.3, 0.2, 0.1])
    data["label"] = (np.asarray(data["x0"]) + rng.normal(0, 5, days) > 100).astype(np.int64)
    return pl.DataFrame(data)


def spec_file(folder: Path, frame: pl.DataFrame, seasonal: bool) -> Path:
    numeric = [f"x{c}" for c in range(NUMERIC)]
    columns = {"day": {"dtype": "string"}, **{n: {"dtype": "float64"} for n in numeric},
               **{f"c{c}": {"dtype": "string"} for c in range(CATEGORICAL)},
               "label": {"dtype": "int64", "min": 0, "max": 1, "after_event": True}}
    drift = {"current_days": 35, "reference_days": 140, "min_reference_days": 28,
             **({"seasonal": {"columns": numeric}} if seasonal else {})}
    name = "wide_daily" if seasonal else "wide_daily_calibrated"
    spec = {"name": name, "source": {"kind": "files", "rows": {"path": str(folder / "wide.csv"), "format": "csv"}},
            "schema": {"keys": ["day"], "columns": columns},
            "partitioning": {"start": START.isoformat(), "timezone": "UTC", "timestamp_column": "day",
                             "timestamp_format": "%Y-%m-%d"},
            "target": {"name": "high", "expression": "label = 1", "task": "binary_classification"},
            "features": {"numeric": numeric, "categorical": [f"c{c}" for c in range(CATEGORICAL)]},
            "validation": {"volume": {"min_rows": 1}, "drift": drift},
            "training": {"window_days": 150, "validation_days": 30, "min_validation_rows": 30, "batch_size": 16},
            "evaluation": {"metrics": ["roc_auc"], "test_days": 30, "min_test_rows": 30},
            "promotion": {"primary_metric": "roc_auc"}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def with_calibration(spec: ModelSpec, end: dt.date) -> tuple[ModelSpec, float]:
    began = time.perf_counter()
    rows = read_range(spec, START, end).rows
    missing = check_range(spec, START, end, set(rows["__day"].unique().to_list()), 0.01)
    cal = calibrate(spec, rows, START, end, missing)
    seconds = time.perf_counter() - began
    data = spec.model_dump(by_alias=True)
    data["validation"]["calibration"] = cal
    return type(spec).model_validate(data), seconds


def seconds(spec: ModelSpec, first: dt.date, last: dt.date) -> float:
    began = time.perf_counter()
    for _ in replay(spec, first, last):
        pass
    return time.perf_counter() - began


def todays_days_per_second(spec: ModelSpec, rows: pl.DataFrame, first: dt.date, days: int) -> float:
    """Today's replay, one day at a time as it judges each (the day read from the source, its history
    gathered from the days before, every check run), on ``days`` days from ``first`` with every day
    before them on main: its cost per day once the history is full, without judging years to get there."""
    by_day = {k[0]: f for k, f in rows.partition_by("__day", as_dict=True, include_key=False).items()}
    published = {d: f for d, f in by_day.items() if d < first}
    began = time.perf_counter()
    for i in range(days):
        day = first + dt.timedelta(days=i)
        result, kept = _judge_day(spec, day, lambda s, d: by_day[d], published)
        if kept is not None:
            published[day] = kept
    return days / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two years, 10 days of today's replay, 1 run")
    quick = parser.parse_args().quick
    days, slice_days, runs = (730, 10, 1) if quick else (5479, 40, 3)
    end = START + dt.timedelta(days=days - 1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        frame = series(days)
        frame.write_csv(folder / "wide.csv")
        today = load_spec(spec_file(folder, frame, seasonal=True))
        rows = read_range(today, START, end).rows
        ours, fit_seconds = with_calibration(load_spec(spec_file(folder, frame, seasonal=False)), end)
        print(f"{days} days x {frame.width - 1} columns; calibrate: {fit_seconds:.1f} s ({days / fit_seconds:.0f} days/s)")
        # Today's replay is timed where its seasonal reference holds three earlier years (as over most of
        # 15 years; two in the quick run).
        first = START + dt.timedelta(days=500 if quick else 1200)
        old, new = [], []
        for _ in range(runs):
            old.append(todays_days_per_second(today, rows, first, slice_days))
            new.append(days / seconds(ours, START, end))
    o, n = statistics.median(old), statistics.median(new)
    print(f"today's replay: {o:.1f} days/s ({1000 / o:.0f} ms a day; runs {', '.join(f'{v:.1f}' for v in old)})")
    print(f"calibrated replay: {n:.0f} days/s ({1000 / n:.1f} ms a day; runs {', '.join(f'{v:.0f}' for v in new)})")
    print(f"RESULT replay_speed_ratio {n / o:.1f} goal >= 10")


if __name__ == "__main__":
    main()
