"""FSDP's memory per rank against DDP's: parameters + gradients + AdamW state held by each of 2 ranks
of a >= 50M-parameter model on the CPU, and the same losses step for step.

    python -m benchmarks.fsdp_memory [--quick]

Both run the platform trainer under torchrun (2 ranks x 1 thread, gloo), one after the other, on
the bundled model's real features: the built-in ``residual_mlp`` family at width 2048 with 3 blocks
(about 50.5M parameters), fp32, deterministic, 20 optimizer steps (within the first epoch) with the
spec's hyperparameters, ``training.strategy`` the only difference, and gradient clipping off: the
clipping norm is summed in another order over shards than over whole gradients, and this model
turns that last-bit difference in the clipping factor into loss differences of about 1e-4 within a
dozen steps, which would hide whether FSDP trains the same model. Without clipping, 2 ranks' FSDP
does DDP's arithmetic exactly. Each rank adds up, after every optimizer step, the
bytes it actually holds: the local shards (numel * element size) of the parameters, their
gradients and the AdamW moments (benchmarks/_fsdp_memory_rank.py); the figure is the peak over
steps, the larger of the two ranks. Each rank's peak RSS is printed beside it: it also counts what
neither strategy shards (the data, torch itself) and FSDP's transient gathered blocks. The
training loop's samples/s of each is printed too (not a goal: FSDP trades collectives for memory).

Goal: FSDP's bytes per rank / DDP's <= 0.6, with every step's loss within 1e-5 of DDP's.

Warm start: none here, every training is a full one (benchmarks/README.md, "Warm start").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._training import bundled_inputs, env, spec_training
from ml_assets.trainer.config import TrainConfig

LOSS_TOLERANCE = 1e-5


def run(inputs: dict, root: Path, strategy: str, **fields) -> dict:
    """The trainer under torchrun on 2 ranks, probed; returns what rank 0 wrote."""
    cfg = TrainConfig(**{**inputs, "output_dir": str(root / strategy), "strategy": strategy, **fields})
    (root / f"{strategy}.json").write_text(cfg.to_json())
    cmd = [sys.executable, "-m", "ml_assets.trainer.agent", "--standalone", "--nproc_per_node=2", "--max-restarts=0",
           "-m", "benchmarks._fsdp_memory_rank", str(root / f"{strategy}.json"), str(root / f"{strategy}-probe.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env(1))
    if proc.returncode != 0:
        raise SystemExit(f"the {strategy} run failed:\n{proc.stderr[-4000:]}")
    return json.loads((root / f"{strategy}-probe.json").read_text())


def mb(n: float) -> str:
    return f"{n / 1e6:9.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="width 256, 2 blocks, 5 steps")
    args = parser.parse_args()
    hidden, steps, days = ([256] * 2, 5, 3) if args.quick else ([2048] * 3, 20, 8)
    fields = {**spec_training(), "family": "residual_mlp", "hidden_sizes": hidden, "max_steps": steps, "epochs": 1,
              "grad_clip_norm": 0.0, "precision": "fp32", "deterministic": True, "threads": 1,
              "report_every_steps": 1, "checkpoint_every_seconds": 0.0}
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        inputs = bundled_inputs(Path(tmp) / "data", days)
        runs = {strategy: run(inputs, Path(tmp), strategy, **fields) for strategy in ("ddp", "fsdp")}
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    print(f"residual_mlp {hidden}: {ddp['parameters']:,} parameters; 2 ranks x 1 thread (gloo), {steps} steps, "
          f"global batch {fields['batch_size']}, fp32, no gradient clipping")
    print("bytes held per rank after an optimizer step (peak over steps):")
    print(f"{'':12}{'parameters':>12}{'gradients':>12}{'AdamW state':>12}{'total':>12}{'peak RSS':>12}")
    for name, result in runs.items():
        for rank, r in enumerate(result["ranks"]):
            print(f"{name:5} rank {rank}{mb(r['params'])}{mb(r['grads'])}{mb(r['optimizer'])}{mb(r['total'])}"
                  f"{r['rss_mib']:8,.0f} MiB")
    worst = {name: max(r["total"] for r in result["ranks"]) for name, result in runs.items()}
    rss = {name: max(r["rss_mib"] for r in result["ranks"]) for name, result in runs.items()}
    diffs = [abs(a - b) for a, b in zip(ddp["losses"], fsdp["losses"], strict=True)]
    agree = len(diffs) == steps and max(diffs) <= LOSS_TOLERANCE
    print(f"losses over {len(diffs)} steps: max |fsdp - ddp| = {max(diffs):.2e} "
          f"({'agree' if agree else 'DO NOT agree'} within {LOSS_TOLERANCE:g}); first {ddp['losses'][0]:.6f}, "
          f"last {ddp['losses'][-1]:.6f} (ddp)")
    speed = {name: sum(r["rows"] for r in result["ranks"]) / max(r["loop_s"] for r in result["ranks"])
             for name, result in runs.items()}
    print(f"training loop: ddp {speed['ddp']:,.0f} samples/s, fsdp {speed['fsdp']:,.0f} samples/s "
          f"(fsdp / ddp {speed['fsdp'] / speed['ddp']:.2f})")
    print(f"peak RSS per rank, fsdp / ddp: {rss['fsdp']:,.0f} / {rss['ddp']:,.0f} MiB = {rss['fsdp'] / rss['ddp']:.3f}")
    print(f"parameters + gradients + AdamW state per rank, fsdp / ddp: {mb(worst['fsdp']).strip()} / "
          f"{mb(worst['ddp']).strip()}")
    if not agree:
        raise SystemExit("FSDP's losses differ from DDP's: the memory ratio of a different training means nothing")
    print(f"RESULT fsdp_memory {worst['fsdp'] / worst['ddp']:.3f} goal <= 0.6")


if __name__ == "__main__":
    main()
