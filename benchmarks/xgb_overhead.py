"""The platform's XGBoost training against a bare ``xgboost.train`` of the same data, params and rounds.

    python -m benchmarks.xgb_overhead [--quick]

Data: the bundled model's real features (60 days of 2013 flights for training, the next day for
validation; the features of flights_delay_xgb, which are flights_delay's), built by the platform's
feature code. Params: flights_delay_xgb's (400 rounds, depth 6, learning rate 0.05, subsample and
colsample_bytree 0.8, ...) turned into XGBoost's by the trainer's own ``boosting.booster_params``,
seed 13, one thread; early stopping off, so both run every round.

Both run in this one process, taking turns, on the same core and allocator settings
(runtime.steady_allocator, which the trainer sets for itself when torchrun starts it):

- Ours: ``ml_assets.trainer.boost.run`` on a single-rank gloo process group, as a torchrun rank
  runs it (lease, sketch, matrices, rounds, export), with the spec's checkpoints (a booster
  checkpoint every 50 rounds, written by a thread; the rows and columns of each round drawn by the
  trainer from the seed and the round, which exact resume needs, and handed to XGBoost as row and
  feature weights) and reports
  (a validation loss every round, the training loss every 50 rounds, a progress report and log
  line each time). Its samples/s is the trainer's own accounting: rows x rounds / seconds of its
  loop, measured from the first round to the last round's checkpoint call.
- Bare: ``xgboost.train(params, dtrain, 400, evals=[(dval, "val")])`` on QuantileDMatrix of the
  same encoded rows, timed around the call: what a user who watches the validation loss writes,
  with the same params (subsample and colsample_bytree drawn by XGBoost itself, as a user's are).
  Its samples/s is rows x rounds / that time. A bare call without evals is timed too and printed,
  not the baseline: the platform's loop needs each round's validation loss (early stopping, the
  best round, pruning), as the user's loop with early stopping does.

Neither timing includes reading the files or building the matrices (in the trainer these come
before its loop). A warm-up of 10 rounds each comes first, uncounted. RESULT: ratio of the medians
of samples/s, ours / bare (goal >= 0.95).

The warm-start policy plays no part here: both boost from no trees, as a boosted model's first
day or a scheduled full retrain does; a fine-tune adds the warm-start rounds to the champion's
booster through the same loop (benchmarks/retrain_cost.py --model flights_delay_xgb).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import xgboost

from benchmarks._processes import free_port
from benchmarks._training import bundled_inputs, median
from ml_assets.features.state import transform
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import load_spec
from ml_assets.trainer import boost, boosting
from ml_assets.trainer.booster_data import feature_names, feature_types, inputs, labels
from ml_assets.trainer.config import TrainConfig
from ml_assets.trainer.data import read_frame, read_state
from ml_assets.trainer.runtime import Runtime, steady_allocator

SPEC = load_spec(BUNDLED_MODELS_DIR / "flights_delay_xgb.yaml")


def fields(rounds: int, sampling: bool = True) -> dict:
    """TrainConfig fields: the xgb spec's model and checkpoint/report cadence, one thread, no early
    stop; without ``sampling``, its params less subsample and colsample_* (nothing drawn per round)."""
    t = SPEC.training
    params = {k: v for k, v in SPEC.model.params.items() if sampling or k not in boosting.SAMPLING}
    return {"family": "xgboost", "model_params": {**params, "num_boost_round": rounds}, "seed": t.seed,
            "threads": 1, "checkpoint_every_steps": t.checkpoint.every_steps, "report_every_steps": t.report_every_steps,
            "checkpoint_every_seconds": 0, "keep_last": t.checkpoint.keep_last, "early_stopping_patience": 0}


def ours(inputs_: dict, root: Path, rounds: int, sampling: bool = True) -> float:
    """The trainer's samples/s over its loop, one rank in this process, in a fresh output directory."""
    out = tempfile.mkdtemp(prefix="ours-", dir=root)
    cfg = TrainConfig(**inputs_, output_dir=out, **fields(rounds, sampling))
    rt = Runtime(rank=0, world=1, device=torch.device("cpu"), backend="gloo")
    result = boost.run(cfg, rt, log=lambda _: None, report=lambda _: None, warn=print)
    return result["accounting"]["samples_per_s"]


def bare_matrices(cfg: TrainConfig) -> tuple[xgboost.DMatrix, xgboost.DMatrix, int]:
    state = read_state(cfg.feature_state)
    train, val = transform(read_frame(cfg.train_files), state), transform(read_frame(cfg.val_files), state)
    options = {"feature_names": feature_names(state), "feature_types": feature_types(state),
               "enable_categorical": True, "max_bin": 256}
    dtrain = xgboost.QuantileDMatrix(inputs(train), labels(train, cfg.task), **options)
    dval = xgboost.QuantileDMatrix(inputs(val), labels(val, cfg.task), ref=dtrain, **options)
    return dtrain, dval, dtrain.num_row()


def bare(cfg: TrainConfig, matrices: tuple, rounds: int, evals: bool = True) -> float:
    """``xgboost.train`` samples/s: rows x rounds / seconds of the call."""
    dtrain, dval, rows = matrices
    params = boosting.booster_params(cfg.model_params, cfg.task, len(cfg.classes), seed=cfg.seed,
                                     threads=cfg.threads, device="cpu")
    # booster_params leaves out what the trainer draws itself; a user's xgboost.train lets XGBoost draw.
    params.update({k: cfg.model_params[k] for k in boosting.DRAWN_HERE if k in cfg.model_params})
    started = time.perf_counter()
    booster = xgboost.train(params, dtrain, rounds, evals=[(dval, "val")] if evals else (), verbose_eval=False)
    elapsed = time.perf_counter() - started
    assert booster.num_boosted_rounds() == rounds
    return rows * rounds / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 days, 60 rounds, one run each")
    args = parser.parse_args()
    days, rounds, runs = (10, 60, 1) if args.quick else (60, 400, 5)
    steady_allocator()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        data = bundled_inputs(Path(tmp) / "data", days)
        cfg = TrainConfig(**data, output_dir=f"{tmp}/unused", **fields(rounds))
        matrices = bare_matrices(cfg)
        ours(data, Path(tmp), 10), bare(cfg, matrices, 10)  # warm-up: lazy initialisation, first page faults
        unsampled = TrainConfig(**data, output_dir=f"{tmp}/unused", **fields(rounds, sampling=False))
        runs_ = {key: [] for key in ("ours", "bare", "plain", "ours_unsampled", "bare_unsampled")}
        for i in range(runs):
            turn = [("ours", lambda: ours(data, Path(tmp), rounds)), ("bare", lambda: bare(cfg, matrices, rounds)),
                    ("plain", lambda: bare(cfg, matrices, rounds, evals=False)),
                    ("ours_unsampled", lambda: ours(data, Path(tmp), rounds, sampling=False)),
                    ("bare_unsampled", lambda: bare(unsampled, matrices, rounds))]
            for key, measure in turn if i % 2 == 0 else turn[::-1]:  # neither always runs right after the other
                runs_[key].append(measure())
    dist.destroy_process_group()
    report(runs_, matrices[2], rounds, cfg)


def report(runs: dict[str, list[float]], rows: int, rounds: int, cfg: TrainConfig) -> None:
    med = {key: median(values) for key, values in runs.items()}

    def line(label: str, key: str) -> str:
        return f"{label:52s} {med[key]:11,.0f} samples/s  runs {[round(v) for v in runs[key]]}"

    print(f"{rows:,} training rows, {rounds} rounds, params {cfg.model_params}")
    print(line("platform trainer (boost.run, 1 rank, 1 thread):", "ours"))
    print(line("bare xgboost.train, validation each round:", "bare"))
    print(line("bare xgboost.train, no evals (not the baseline):", "plain") + f"  (ours / it: {med['ours'] / med['plain']:.3f})")
    print(line("without subsample/colsample, ours:", "ours_unsampled"))
    print(line("without subsample/colsample, bare with validation:", "bare_unsampled")
          + f"  (ours / it: {med['ours_unsampled'] / med['bare_unsampled']:.3f})")
    print(f"ratios of the runs in turn (the spread): {[round(a / b, 3) for a, b in zip(runs['ours'], runs['bare'], strict=True)]}")
    print(f"RESULT xgb_overhead {med['ours'] / med['bare']:.3f} goal >= 0.95")


if __name__ == "__main__":
    main()
