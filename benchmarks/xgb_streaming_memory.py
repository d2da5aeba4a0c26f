"""Windows larger than memory for XGBoost: a streamed training's peak memory as the window grows tenfold.

    python -m benchmarks.xgb_streaming_memory [--quick]

As benchmarks.streaming_memory measures the PyTorch families, on the same data: the bundled model's
real features, one zstd Parquet file per local day; 1x is 14 training days, 10x is 140 (no day
repeated), the day after the window validates. Both modes get the same files and feature state.

Every run is the trainer under torchrun (``ml_assets.trainer.agent``), one rank and one thread, as
the ``trained_checkpoint`` asset runs it, with flights_delay_xgb's params and checkpoints (a booster
every 50 rounds) and ``rounds`` boosting rounds, early stopping off. One rank streams the whole
window: the hardest case for memory.

- Memory: the peak resident set of the largest process of the run's tree, i.e. the training rank
  (``RUSAGE_CHILDREN`` of a small wrapper that runs torchrun). RESULT xgb_streaming_memory:
  streaming 10x / streaming 1x (goal <= 1.3). Memory mode's 10x / 1x is printed beside it, to show
  how much the window's size moves a trainer that holds it.
- Throughput (printed, no goal): samples/s as the trainer reports it (rows x rounds / seconds of its
  rounds), streaming / in memory. Streamed rounds read XGBoost's pages from disk (the page cache,
  here); in memory they read one matrix.

What streaming holds that grows with the window: XGBoost's per-row state (gradients, labels,
predictions, row partitions: about 50 bytes a row), and the sketch sample up to
``booster_data.SKETCH_ROWS`` rows (the whole window below that: both windows here). Runs take
turns, several rounds; the ratios are of medians.

Warm start: none here, every training is a full one (benchmarks/README.md, "Warm start").
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks._training import median
from benchmarks.streaming_memory import day_files, measure, window
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import load_spec

SPEC = load_spec(BUNDLED_MODELS_DIR / "flights_delay_xgb.yaml")


def recipe(rounds: int, cache: Path) -> dict:
    t = SPEC.training
    return {"family": "xgboost", "model_params": {**SPEC.model.params, "num_boost_round": rounds}, "seed": t.seed,
            "threads": 1, "checkpoint_every_steps": t.checkpoint.every_steps, "checkpoint_every_seconds": 0,
            "early_stopping_patience": 0, "stream_cache_dir": str(cache)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 and 20 days, 10 rounds, one run each, streaming only")
    args = parser.parse_args()
    base, repeats, rounds = (2, 1, 10) if args.quick else (14, 5, 100)
    modes = ("streaming",) if args.quick else ("streaming", "memory")
    runs: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        files = day_files(Path(tmp) / "features", 10 * base + 1)
        sizes = {"1x": window(Path(tmp), files, base), "10x": window(Path(tmp), files, 10 * base)}
        fields = recipe(rounds, Path(tmp) / "cache")
        for _ in range(repeats):
            for size, inputs in sizes.items():
                for mode in modes:
                    runs.setdefault((mode, size), []).append(measure(inputs, data_mode=mode, **fields))
        left = list((Path(tmp) / "cache").glob("xgboost-pages-*"))
    med = {key: {k: median([r[k] for r in rs]) for k in ("peak_rss_mb", "samples_per_s", "cpu_hours")}
           for key, rs in runs.items()}
    for (mode, size), rs in runs.items():
        m = med[mode, size]
        print(f"{mode:9s} {size:3s} ({rs[0]['rows']:7,d} rows): peak RSS {m['peak_rss_mb']:4.0f} MB  "
              f"{m['samples_per_s']:10,.0f} samples/s  rank CPU {3600 * m['cpu_hours']:5.1f} s  "
              f"runs: RSS {[round(r['peak_rss_mb']) for r in rs]} samples/s {[round(r['samples_per_s']) for r in rs]}")
    rows = {size: runs["streaming", size][0]["rows"] for size in sizes}
    for mode in modes:
        grown = med[mode, "10x"]["peak_rss_mb"] - med[mode, "1x"]["peak_rss_mb"]
        print(f"{mode}: 10x / 1x peak RSS {med[mode, '10x']['peak_rss_mb'] / med[mode, '1x']['peak_rss_mb']:.3f}, "
              f"{grown * 2**20 / (rows['10x'] - rows['1x']):,.0f} bytes of peak per training row added")
    if "memory" in modes:
        print(f"streaming / in memory samples/s: 1x {med['streaming', '1x']['samples_per_s'] / med['memory', '1x']['samples_per_s']:.3f}"
              f", 10x {med['streaming', '10x']['samples_per_s'] / med['memory', '10x']['samples_per_s']:.3f}")
    print(f"pages directories left behind: {len(left)}")
    print(f"RESULT xgb_streaming_memory "
          f"{med['streaming', '10x']['peak_rss_mb'] / med['streaming', '1x']['peak_rss_mb']:.3f} goal <= 1.3")


if __name__ == "__main__":
    main()
