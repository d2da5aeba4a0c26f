"""Pruning's saving: the same number of trials with and without the bundled spec's pruner.

For each sampler seed, two studies on the bundled model's real features (the first days of 2013),
run by the platform's own trial worker (``ml_assets.tuning.study``: the real trainer under
torchrun, reporting validation loss per epoch): one with the spec's pruner (``tuning.pruner``;
``--pruner``, ``--min-resource``, ``--reduction-factor`` and ``--max-epochs`` measure other settings),
one without pruning. Measured:
the epochs trained with pruning divided by without (summed over seeds), and how far the pruned
studies' best validation loss is from the unpruned ones', in standard deviations of the unpruned
best over seeds.

    python -m benchmarks.hpo [--quick] [--pruner hyperband|successive_halving|median]
                             [--min-resource N] [--reduction-factor N] [--max-epochs N] [--seeds N]

Ends with:
    RESULT hpo_epochs_ratio <pruned/unpruned epochs> goal <= 0.35
    RESULT hpo_best_loss_gap_std <(mean pruned best - mean unpruned best) / std unpruned> goal <= 1

The warm-start policy plays no part here: a tuning study's trials train from scratch (a study
never starts from a champion's weights), as they do here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks._training import SPEC, bundled_inputs, spec_training
from ml_assets.spec import PrunerSpec
from ml_assets.trainer.config import TrainConfig
from ml_assets.tuning import study as st


def run_study(inputs: dict, root: Path, seed: int, trials: int, max_epochs: int, pruner_kind: str,
              pruner_settings: dict | None = None) -> dict:
    tuning = SPEC.tuning
    base = json.loads(TrainConfig(**inputs, output_dir="unused", **spec_training()).to_json())
    job = st.Job(
        model=SPEC.name, study_name=f"bench-{pruner_kind}-{seed}", storage_url=f"sqlite:///{root / 'optuna.db'}",
        base_config=base, space={k: v.model_dump(mode="json") for k, v in tuning.space.items()}, trials=trials,
        max_epochs=max_epochs, processes_per_trial=1, workdir=str(root / f"{pruner_kind}-{seed}"),
        pruner={**(pruner_settings or tuning.pruner.model_dump(mode="json")), "kind": pruner_kind},
        sampler_seed=seed, startup_trials=tuning.startup_trials)
    st.open_study(job, create=True)
    started = time.perf_counter()
    st.run_worker(job)
    study = st.open_study(job)
    epochs = sum(int(t.user_attrs.get("epochs", 0)) for t in study.get_trials())
    return {"epochs": epochs, "best": study.best_value, "counts": st.counts(study),
            "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds x 1 trial of 2 epochs: checks it runs")
    parser.add_argument("--pruner", choices=["hyperband", "successive_halving", "median"],
                        default=SPEC.tuning.pruner.kind, help="default: the bundled spec's")
    parser.add_argument("--min-resource", type=int, help="epochs before the first rung (default: the spec's)")
    parser.add_argument("--reduction-factor", type=int, help="default: the spec's")
    parser.add_argument("--max-epochs", type=int, help="epochs of an unpruned trial (default: the spec's)")
    parser.add_argument("--seeds", type=int, default=5, help="sampler seeds, each a pruned and an unpruned study")
    args = parser.parse_args(argv)
    kind = args.pruner
    seeds, trials, max_epochs, days = (([0, 1], 1, 2, 3) if args.quick
                                       else (list(range(args.seeds)), 27, SPEC.tuning.max_epochs, 8))
    max_epochs = args.max_epochs or max_epochs
    settings = PrunerSpec(**{**SPEC.tuning.pruner.model_dump(), "kind": kind,
                             **{k: v for k, v in (("min_resource", args.min_resource),
                                                  ("reduction_factor", args.reduction_factor)) if v is not None}})
    print(f"hpo: {len(seeds)} seeds x {trials} trials of up to {max_epochs} epochs, {days} training days; "
          f"pruner {kind} (min_resource {settings.min_resource}, reduction "
          f"{settings.reduction_factor}) vs none", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-hpo-") as tmp:
        root = Path(tmp)
        inputs = bundled_inputs(root / "data", days)
        results: dict[str, list[dict]] = {kind: [], "none": []}
        for seed in seeds:
            for name in results:
                r = run_study(inputs, root, seed, trials, max_epochs, name, settings.model_dump(mode="json"))
                results[name].append(r)
                print(f"  seed {seed} {name:9} epochs {r['epochs']:4}  best val_loss {r['best']:.5f}  "
                      f"{r['counts']}  {r['seconds']:.0f} s", flush=True)
    pruned = sum(r["epochs"] for r in results[kind])
    full = sum(r["epochs"] for r in results["none"])
    ratio = pruned / full
    best_pruned = [r["best"] for r in results[kind]]
    best_full = [r["best"] for r in results["none"]]
    spread = statistics.stdev(best_full) if len(best_full) > 1 else 0.0
    gap = statistics.mean(best_pruned) - statistics.mean(best_full)
    gap_std = gap / spread if spread > 0 else (0.0 if gap <= 0 else 999.0)  # no spread: any loss is too much
    print(f"epochs: {pruned} with pruning, {full} without; best val_loss with pruning "
          f"{statistics.mean(best_pruned):.5f}, without {statistics.mean(best_full):.5f} "
          f"(std over seeds {spread:.5f})")
    print(f"RESULT hpo_epochs_ratio {ratio:.3f} goal <= 0.35")
    print(f"RESULT hpo_best_loss_gap_std {gap_std:.2f} goal <= 1")


if __name__ == "__main__":
    main()
