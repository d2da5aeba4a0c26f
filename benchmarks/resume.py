"""Resuming after a crash: SIGKILL at a random step, then seconds from the restart to the first new
training step, and the steps lost (trained before the kill, trained again after it).

    python -m benchmarks.resume [--quick]

The trainer runs under torchrun (1 rank) on the bundled model's real features, checkpointing every
INTERVAL steps (async) and logging every step. At a random moment the whole process tree gets
SIGKILL; the same command is started again and timed until it logs its first step. The baseline is
the same command started fresh (no checkpoint): its time to the first step is the fixed cost of a
start (interpreter, torch, rendezvous, reading features), which a resume cannot avoid.
Goals: seconds to the first new step <= 30 (worst of the runs); steps lost <= INTERVAL (worst).

Warm start: none here, every training is a full one (benchmarks/README.md, "Warm start").
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks._processes import kill_tree
from benchmarks._training import bundled_inputs, env, spec_training, torchrun
from ml_assets.trainer.config import TrainConfig

INTERVAL = 50
FIRST = re.compile(r"first step of this attempt: step (\d+)")
STEP = re.compile(r"step (\d+)/\d+ ")
RESUMED = re.compile(r"resumed from \S+: step (\d+),")


def until(log: Path, pattern: re.Pattern, timeout: float = 300) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pattern.search(log.read_text()) if log.exists() else None
        if found:
            return found
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {pattern.pattern!r} in {log}")


def attempt(config: Path, log: Path) -> tuple[subprocess.Popen, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(torchrun(config), stdout=subprocess.DEVNULL, stderr=log.open("w"),
                            start_new_session=True, env=env(1))
    until(log, FIRST)
    return proc, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one kill, a shorter run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    days, runs, epochs = (10, 1, 300) if args.quick else (60, 5, 40)
    seconds, lost, fresh = [], [], []
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        inputs = bundled_inputs(Path(tmp) / "data", days)
        for run in range(runs):
            cfg = TrainConfig(**inputs, **spec_training(), output_dir=f"{tmp}/run{run}", epochs=epochs, threads=1,
                              checkpoint_every_steps=INTERVAL, report_every_steps=1)
            config = Path(tmp) / f"config{run}.json"
            config.write_text(cfg.to_json())
            proc, started_in = attempt(config, Path(tmp) / f"first{run}.log")
            fresh.append(started_in)
            time.sleep(rng.uniform(0.5, 3.0))
            kill_tree(proc)
            last = max(int(s) for s in STEP.findall((Path(tmp) / f"first{run}.log").read_text()))
            proc, took = attempt(config, Path(tmp) / f"second{run}.log")
            kill_tree(proc)
            resumed = int(RESUMED.search((Path(tmp) / f"second{run}.log").read_text()).group(1))
            seconds.append(took)
            lost.append(last - resumed)
            print(f"run {run + 1}: killed after step {last}, resumed from step {resumed} ({last - resumed} lost), "
                  f"first new step {took:.1f}s after the restart (a fresh start took {started_in:.1f}s)")
    print(f"RESULT resume_steps_lost {max(lost)} goal <= {INTERVAL}")
    print(f"RESULT resume_seconds {max(seconds):.1f} goal <= 30")


if __name__ == "__main__":
    main()
