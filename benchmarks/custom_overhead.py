"""A model of your own trained by the platform against a bare PyTorch loop of the same model and data.

    python -m benchmarks.custom_overhead [--quick]

The model: the FT-Transformer example (examples/ft_transformer, the spec's own params), on the
bundled model's real features (20 days of 2013 flights for training, the next day for validation).
Ours: ``ml_assets.trainer.train`` under torchrun with one rank and one thread, the factory imported
through the contract (pinned code, the trial batch, CustomModel around the module), with epoch-end
checkpoints, best weights and progress reports, as the ``trained_checkpoint`` asset runs it. The
bare loop (benchmarks.train_overhead's, in a fresh process): the factory imported and called by
hand, AdamW, the same schedule, clipping and batches, written by hand. The bare loop gets the
trainer's malloc settings (ml_assets.trainer.runtime.steady_allocator) so that the ratio measures the
trainer's code; a third run, the bare loop on glibc's defaults, shows what those settings are worth
(a step's activations page-faulted from fresh mmaps, or not, by the process's allocation history).
The runs take turns; the ratio of medians of samples/s is the RESULT (goal >= 0.97).

Warm start: none here, every training is a full one (benchmarks/README.md, "Warm start").
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks._training import bundled_inputs, median, spec_training, train
from benchmarks.train_overhead import bare_in_a_fresh_process
from ml_assets.spec import load_spec
from ml_assets.trainer.config import TrainConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ft_transformer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 days, 1 epoch, one run each")
    args = parser.parse_args()
    days, epochs, runs = (5, 1, 1) if args.quick else (20, 4, 5)
    spec = load_spec(EXAMPLE / "flights_delay_ft.yaml")
    model = {"model_factory": spec.model.module, "model_params": dict(spec.model.params),
             "model_code_path": spec.model.code_path}
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        inputs = bundled_inputs(Path(tmp) / "data", days)
        fields = {**spec_training(), **model, "learning_rate": spec.training.learning_rate, "epochs": epochs,
                  "threads": 1}
        cfg = TrainConfig(**inputs, output_dir=f"{tmp}/unused", **fields)
        ours, bare, glibc = [], [], []
        for _ in range(runs):
            ours.append(train(inputs, **fields)["accounting"]["samples_per_s"])
            bare.append(bare_in_a_fresh_process(cfg, tmp))
            glibc.append(bare_in_a_fresh_process(cfg, tmp, allocator=False))
    print(f"model: {spec.model.module} {spec.model.params}")
    print(f"platform trainer (torchrun, 1 rank, 1 thread): {median(ours):9,.0f} samples/s  runs {[round(v) for v in ours]}")
    print(f"bare PyTorch loop (same model, 1 thread):      {median(bare):9,.0f} samples/s  runs {[round(v) for v in bare]}")
    print(f"bare loop on glibc's malloc defaults:          {median(glibc):9,.0f} samples/s  runs {[round(v) for v in glibc]}")
    print(f"ratios of the runs in turn (the spread): {[round(a / b, 3) for a, b in zip(ours, bare, strict=True)]}")
    print(f"RESULT custom_overhead {median(ours) / median(bare):.3f} goal >= 0.97")


if __name__ == "__main__":
    main()
