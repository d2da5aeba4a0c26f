"""DDP scaling on the CPU: 2 ranks x 1 thread against 1 rank x 1 thread, samples/s.

    python -m benchmarks.ddp_scaling [--quick]

Both run the platform trainer under torchrun (gloo) on the bundled model's real features with the
spec's hyperparameters (global batch 256: 128 rows per rank per step with two ranks); samples/s is
rows trained by all ranks / training-loop seconds. Runs take turns; ratio of medians. The full run
also measures a 16x larger global batch (4096: compute per step outweighs the all-reduce) and
prints it as ``ddp_scaling_batch4096``; the goal is judged on the spec's own settings.
Goal: >= 1.7.

Warm start: none here, every training is a full one (benchmarks/README.md, "Warm start").
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks._training import bundled_inputs, median, spec_training, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 days, 1 epoch, one run each")
    args = parser.parse_args()
    days, epochs, runs = (10, 1, 1) if args.quick else (60, 3, 5)
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        inputs = bundled_inputs(Path(tmp) / "data", days)
        fields = {**spec_training(), "epochs": epochs, "threads": 1}
        batches = [fields["batch_size"]] if args.quick else [4096, fields["batch_size"]]
        ratios = {}
        for batch in batches:
            one, two = [], []
            for _ in range(runs):
                one.append(train(inputs, nproc=1, **{**fields, "batch_size": batch})["accounting"]["samples_per_s"])
                two.append(train(inputs, nproc=2, **{**fields, "batch_size": batch})["accounting"]["samples_per_s"])
            print(f"global batch {batch}: 1 rank x 1 thread  {median(one):9,.0f} samples/s  runs {[round(v) for v in one]}")
            print(f"global batch {batch}: 2 ranks x 1 thread {median(two):9,.0f} samples/s  runs {[round(v) for v in two]}")
            ratios[batch] = median(two) / median(one)
    if 4096 in ratios:
        print(f"RESULT ddp_scaling_batch4096 {ratios[4096]:.3f} goal >= 1.7")
    print(f"RESULT ddp_scaling {ratios[fields['batch_size']]:.3f} goal >= 1.7")


if __name__ == "__main__":
    main()
