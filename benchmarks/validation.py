"""Validating ten million rows: pandera's polars backend against its pandas backend, and against
the cost of building features from the same rows.

    python -m benchmarks.validation [--quick]

The rows are the bundled 2013 flights replicated 30 times (10.1 million rows) with noise: delays
jittered, distances scaled by up to ±2%, flight numbers offset per copy so the spec's keys stay
unique. The same schema, generated from the bundled spec, validates them:

- polars: ``build_schema`` (pandera's polars backend) on the polars DataFrame, as the snapshot runs it;
- pandas: the same columns, dtypes, nullability, ranges and categories declared with pandera's
  pandas API by the same function, the keys with pandera's own ``unique=`` (the polars schema
  checks them with ``unique_keys``, a hash-and-sort pandera check), on the same rows converted to
  pandas (the conversion is not timed).

Then the whole of the snapshot's row checks (``schema_checks``: pandera plus the null fractions and
the split into named checks) against ``build_features`` on the same rows (the joins with weather
and planes, the target, the typed feature columns). Peak memory of each step is the process's
resident set, sampled every 5 ms, above what it held before the step. Medians of 5 runs, the
steps taking turns run by run. Each step's line also gives its minor page faults and the process's
kernel time while it ran (medians): feature engineering touches about 1.2 million fresh pages per
call, so how fast a machine's kernel serves them moves its time 2x from one machine to the next,
and the ratio with it (docs/data-validation.md).

Goals: polars at least 3x faster than pandas; validation at most 0.10 of feature time.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandera.pandas as ppa
import polars as pl

from ml_assets.features.build import build_features
from ml_assets.ingest.sources import _bundled_table
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import DataSchema, load_spec
from ml_assets.validation.schema_checks import build_schema, schema_checks

PANDAS_DTYPES = {"int64": "Int64", "float64": "Float64", "string": "string", "bool": "boolean"}


def replicated(copies: int, seed: int = 13) -> pl.DataFrame:
    flights, _ = _bundled_table("flights")
    rng = np.random.default_rng(seed)
    parts = []
    for k in range(copies):
        n = flights.height
        jitter = pl.Series(rng.normal(0, 5, n).round().astype(np.int64))
        scale = pl.Series(rng.uniform(0.98, 1.02, n))
        parts.append(flights.with_columns(
            (pl.col("flight") + 10_000 * k).alias("flight"),
            (pl.col("dep_delay") + jitter).clip(-120, 1800).alias("dep_delay"),
            (pl.col("distance") * scale).round().cast(pl.Int64).clip(1, 10_000).alias("distance"),
        ))
    return pl.concat(parts)


def pandas_schema(schema: DataSchema) -> ppa.DataFrameSchema:
    """The schema ``build_schema`` generates, built by the same function with pandera's pandas API."""
    return build_schema(schema, api=ppa, dtypes=PANDAS_DTYPES)


@dataclass(frozen=True)
class Step:
    seconds: float  # wall clock
    peak_mib: float
    faults: int  # minor page faults (the whole process, all threads)
    system: float  # seconds of kernel time (the whole process): mostly those faults

    def line(self, label: str, note: str = "") -> str:
        return (f"{label:<25}{self.seconds:7.2f} s  peak +{self.peak_mib:6.0f} MiB  "
                f"{self.faults / 1000:6.0f}k faults, {self.system:5.2f} s system{note}")


class PeakRSS:
    """The resident set's peak above its level at entry, sampled by a thread (polars allocates
    outside Python, so tracemalloc would not see it)."""

    def __enter__(self) -> PeakRSS:
        gc.collect()
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._rss())

    @property
    def mib(self) -> float:
        return (self.peak - self.base) / 2**20


def measure(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, Step]:
    """Median seconds, largest peak memory (MiB), and median page faults and system time of each
    function, the functions taking turns run by run (a slow spell of this shared machine then hits
    all of them, not one)."""
    taken: dict[str, list[Step]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            with PeakRSS() as mem:
                before = resource.getrusage(resource.RUSAGE_SELF)
                started = time.perf_counter()
                fn()
                seconds = time.perf_counter() - started
                after = resource.getrusage(resource.RUSAGE_SELF)
            taken[name].append(Step(seconds, mem.mib, after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime))
    return {name: Step(seconds=statistics.median(s.seconds for s in samples),
                       peak_mib=max(s.peak_mib for s in samples),
                       faults=int(statistics.median(s.faults for s in samples)),
                       system=statistics.median(s.system for s in samples))
            for name, samples in taken.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one copy (337 thousand rows), fewer runs")
    args = parser.parse_args()
    copies, runs = (1, 2) if args.quick else (30, 5)
    spec = load_spec(BUNDLED_MODELS_DIR / "flights_delay.yaml")
    rows = replicated(copies)
    tables = {"rows": rows, **{name: _bundled_table(t.table)[0] for name, t in spec.source.dimensions.items()}}
    print(f"{rows.height:,} rows, {rows.width} columns ({rows.estimated_size() / 2**20:.0f} MiB in polars)")

    polars_schema = build_schema(spec.data_schema)
    polars_schema.validate(rows.head(1000), lazy=True)  # warm up: imports, first compilation
    frame = rows.to_pandas().astype({n: PANDAS_DTYPES[c.dtype] for n, c in spec.data_schema.columns.items()})
    pandas_validator = pandas_schema(spec.data_schema)
    pandas_validator.validate(frame.head(1000), lazy=True)
    results = measure({
        "polars": lambda: polars_schema.validate(rows, lazy=True),
        "pandas": lambda: pandas_validator.validate(frame, lazy=True),
        "checks": lambda: schema_checks(spec.data_schema, rows),
        "features": lambda: build_features(spec, tables),
    }, runs)
    polars, pandas, checks, features = (results[k] for k in ("polars", "pandas", "checks", "features"))
    assert all(o.passed for o in schema_checks(spec.data_schema, rows).values()), "the replicated rows must be valid"

    print(polars.line("pandera polars backend:"))
    print(pandas.line("pandera pandas backend:", f"  ({pandas.seconds / polars.seconds:.1f}x polars)"))
    print(checks.line("snapshot row checks:", "  (schema_checks: pandera + null fractions)"))
    print(features.line("feature engineering:", "  (build_features)"))
    print(f"(medians of {runs} runs, the four taking turns)")
    print(f"RESULT validation_polars_speedup {pandas.seconds / polars.seconds:.2f} goal >= 3")
    print(f"RESULT validation_over_features {checks.seconds / features.seconds:.3f} goal <= 0.10")


if __name__ == "__main__":
    main()
