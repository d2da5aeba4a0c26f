"""How long a training rank outlives its torchrun agent when the agent is killed with SIGKILL (an
out-of-memory kill, a `kill -9` of the run worker's process group).

    python -m benchmarks.orphans [--quick]

Ours, as the trained_checkpoint asset starts ranks: ``python -m ml_assets.trainer.agent ... -m
ml_assets.trainer.forked``, each worker a thin client whose rank is forked by a trainer zygote this
process owns (ml_assets.trainer.zygote; the rank ends when its client does, the client follows its
agent). Ours, exec'd: the same agent with ``-m ml_assets.trainer`` (``ML_ASSETS_RANK_START=exec``:
each rank follows its agent, ml_assets.processes). Baseline: plain ``torch.distributed.run``
running the same trainer with its lifeline switched off (benchmarks/_rank_without_lifeline.py),
i.e. the platform before either. Two ranks train the bundled model's real features; the agent is
killed at a moment measured from when both ranks exist: at once (0 s: an exec'd rank is still
importing, a forked one imports only the project's code), while they join the rendezvous and read
data (1 s, 3 s), and mid-training (after their first checkpoint). Then the seconds until every
rank (and every forked rank's client) is gone, up to a cap (a rank still there at the cap is
reported as ">cap" and killed). The warm-start policy plays no part: each run is a full training
given straight to the trainer, with no parent weights.
Goal (the issue: "exits promptly, a few seconds"): the worst moment's median of either of ours <= 5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._training import bundled_inputs, env, spec_training
from ml_assets.processes import child_env, start_ticks
from ml_assets.trainer import zygote
from ml_assets.trainer.config import TrainConfig

BASELINE_RANK = Path(__file__).with_name("_rank_without_lifeline.py")
GOAL = 5.0
VARIANTS = {"forked": "ours, forked ranks", "exec": "ours, exec'd ranks", "baseline": "plain torchrun"}


def command(variant: str, config: Path) -> list[str]:
    common = ["--standalone", "--nproc_per_node=2", "--max-restarts=0"]
    if variant in ("forked", "exec"):
        rank = "ml_assets.trainer.forked" if variant == "forked" else "ml_assets.trainer"
        return [sys.executable, "-m", "ml_assets.trainer.agent", *common, "-m", rank, "--config", str(config)]
    return [sys.executable, "-m", "torch.distributed.run", *common, str(BASELINE_RANK), "--config", str(config)]


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def ranks_of(agent: subprocess.Popen, owner: subprocess.Popen | None) -> list[int]:
    """The run's processes that must end: the agent's workers and, when ranks fork, the zygote's
    children (this benchmark runs one training at a time, so they are this run's ranks)."""
    return children(agent.pid) + (children(owner.pid) if owner else [])


def one_kill(variant: str, moment: str, inputs: dict, cap: float, owner: subprocess.Popen | None) -> float:
    """Seconds from the agent's SIGKILL until its ranks are gone (``cap`` if they are not by then);
    ``owner``: the zygote that forks this run's ranks (the "forked" variant), else None."""
    with tempfile.TemporaryDirectory(prefix="ml_assets-orphans-") as tmp:
        out = Path(tmp) / "out"
        cfg = TrainConfig(**{**inputs, **spec_training(), "output_dir": str(out), "epochs": 10_000, "batch_size": 32,
                             "threads": 1, "checkpoint_every_steps": 20, "checkpoint_every_seconds": 0})
        (Path(tmp) / "config.json").write_text(cfg.to_json())
        agent = subprocess.Popen(command(variant, Path(tmp) / "config.json"), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True, env=child_env(env(1)))
        ranks: list[int] = []
        try:
            while len(ranks := ranks_of(agent, owner)) < (4 if owner else 2):
                if agent.poll() is not None:
                    raise SystemExit(f"{variant}: torchrun exited with {agent.returncode} before its ranks started")
                time.sleep(0.01)
            if moment == "mid-training":
                while not any(out.glob("checkpoints/step-*/manifest.json")):
                    time.sleep(0.02)
            else:
                time.sleep(float(moment.rstrip("s")))
            agent.kill()
            killed = time.monotonic()
            agent.wait()
            while any(start_ticks(pid) is not None for pid in ranks) or (owner and children(owner.pid)):
                if time.monotonic() - killed >= cap:
                    return cap
                time.sleep(0.01)
            return time.monotonic() - killed
        finally:
            for pid in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if agent.poll() is None:
                agent.kill()
                agent.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two moments, one run each, a 6 s cap")
    args = parser.parse_args(argv)
    moments = ["0s", "mid-training"] if args.quick else ["0s", "1s", "3s", "mid-training"]
    repeats, cap = (1, 6.0) if args.quick else (3, 20.0)
    owner, address = zygote.start()
    if address is None:
        raise SystemExit("the trainer zygote did not start: see its stderr above")
    os.environ[zygote.SOCKET_ENV] = address
    try:
        with tempfile.TemporaryDirectory(prefix="ml_assets-orphans-data-") as data:
            inputs = bundled_inputs(Path(data), train_days=2)
            times: dict[tuple[str, str], list[float]] = {}
            for moment in moments:
                for _ in range(repeats):
                    for variant in VARIANTS:  # taking turns
                        forks = owner if variant == "forked" else None
                        times.setdefault((moment, variant), []).append(one_kill(variant, moment, inputs, cap, forks))
    finally:
        zygote.stop(owner)

    def shown(values: list[float]) -> str:
        return "  ".join(f">{v:.0f}" if v >= cap else f"{v:.2f}" for v in values)

    print(f"seconds from torchrun's SIGKILL until both ranks are gone (cap {cap:.0f} s), {repeats} run(s) each")
    print(f"{'killed':<14}" + "".join(f"{title:<26}" for title in VARIANTS.values()))
    for moment in moments:
        print(f"{moment:<14}" + "".join(f"{shown(times[(moment, v)]):<26}" for v in VARIANTS))
    worst = max(statistics.median(times[(m, v)]) for m in moments for v in ("forked", "exec"))
    left = sum(v >= cap for m in moments for v in times[(m, "baseline")])
    print(f"baseline: ranks still running at the cap in {left} of {len(moments) * repeats} kills")
    print(f"RESULT orphans_exit_seconds {worst:.2f} goal <= {GOAL:g}")


if __name__ == "__main__":
    main()
