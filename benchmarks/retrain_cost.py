"""Daily retraining with the spec's warm-start policy against retraining from scratch every day:
what it saves in trainer compute and what it costs in held-out ROC-AUC.

    python -m benchmarks.retrain_cost [--quick] [--model flights_delay_xgb] [--days N] [--first YYYY-MM-DD] [--keep]

Two arms, each the bundled spec (flights_delay, or with ``--model`` the boosted flights_delay_xgb,
whose fine-tunes add rounds to the champion's booster) in its own home (ML_ASSETS_HOME, DAGSTER_HOME, and
so its own SQLite MLflow registry, artifact and checkpoint stores, under a temporary directory):
- scratch: the spec with ``training.warm_start`` removed, so every partition trains from scratch;
- warm: the spec as bundled, so each partition skips, fine-tunes the @champion or retrains from
  scratch as its policy decides (scheduled full retrains and data-moved refusals included).
Each arm is a worker process that builds its definitions once and runs, for each partition, the
real daily job in process (ingest the day, train, evaluate against the champion, register when the
promotion gate passed) and then one tick of the real promotion sensor, running the promote job it
asks for, as the Dagster daemon would: a candidate that lost the gate is not registered and the
champion stays. The window's days are ingested first, in both arms at once (not measured).

The partitions: ``--first`` (default 2013-03-01) trains from scratch in both arms (no champion
yet); the comparison is over the ``--days`` (default 30) consecutive partitions after it. Day by
day the arms take turns, the one that goes first alternating, so that machine noise falls on both.

Measured, over the compared partitions:
- trainer compute: the sum of each trained checkpoint's ``cpu_rank_seconds`` (ranks x the seconds
  from their torchrun workers' start to the export), a skipped partition counting zero;
  ``gpu_rank_seconds`` apart. RESULT retrain_cost = warm / scratch. The ranks fork from the trainer
  zygote each arm's worker starts once (ml_assets.trainer.zygote, the launcher's default), so a
  rank's imports are not in its rank-seconds; the zygote's own CPU is printed apart, with the ratio
  it would give counted in.
  Also printed: the trained_checkpoint step's wall in the run, which adds what the ranks do not
  pay (the plan, a fine-tune's data checks and its parent's download, the record).
- the primary metric (ROC-AUC) of each arm's candidate on the partition's held-out test rows (its
  evaluation report: both arms are evaluated on the same rows), the daily difference warm -
  scratch, its mean, and a paired bootstrap over the days (10,000 resamples of the days with
  replacement, seeded): the 2.5th and 97.5th percentiles of the resampled means. Consecutive
  partitions share a test day (evaluation.test_days: 2), so the days are not independent and the
  interval is somewhat narrower than an honest one; the lower bound is the RESULT (goal >= -0.005:
  non-inferiority). Also printed: the difference of the models each arm would serve after the
  partition's promotion (the candidate when it was promoted, else the champion it was compared to).
- how many partitions the warm arm skipped, fine-tuned and retrained in full, and why in full.
- every partition's run succeeds (a failed run ends the benchmark with its reason): a candidate the
  gate refused is an outcome; after the last partition each arm runs ``ml-assets audit MODEL
  --format json`` and the partitions of the refusals it lists are compared with those the gate
  refused (a mismatch is printed).

``--quick`` runs a 4-day window for 2 epochs (fine-tunes: 1; a booster 40 rounds, fine-tunes 10) on
1 compared partition after the first (the ratio and interval of so few tiny trainings are real
measurements, not the claim's figures). A boosted model's ``promotion.rival`` (the network) is left
out in both arms: the rival is not trained here, and the comparison is warm against scratch.

Ends with:
    RESULT retrain_cost_auc_lower_bound <lower bound of the mean daily ROC-AUC difference> goal >= -0.005
    RESULT retrain_cost <warm / scratch trainer CPU rank-seconds> goal <= 0.25
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("flights_delay", "flights_delay_xgb")
ARMS = ("scratch", "warm")
FIRST = dt.date(2013, 3, 1)
QUICK_FIRST = dt.date(2013, 3, 12)
RESAMPLES = 10_000
MARK = "@@retrain_cost "


# --- the two arms' specs ------------------------------------------------------------------------------

def bundled(model: str) -> Path:
    return ROOT / "ml_assets" / "models" / f"{model}.yaml"


def arm_spec(arm: str, quick: bool, model: str = MODELS[0]) -> dict:
    data = yaml.safe_load(bundled(model).read_text())
    if "warm_start" not in data["training"]:
        raise SystemExit(f"benchmarks.retrain_cost: the bundled {model} has no training.warm_start policy to measure")
    boosted = data["model"].get("family") == "xgboost"
    data["promotion"].pop("rival", None)
    if quick:  # seconds per training instead of a minute; such a model is not held to floors or the baseline
        data["training"].update({"window_days": 4, "validation_days": 1, "early_stopping": {"patience": 0}})
        if boosted:
            data["model"]["params"]["num_boost_round"] = 40
        else:
            data["training"].update({"epochs": 2, "batch_size": 128, "learning_rate": 0.003})
        data["evaluation"].update({"test_days": 1, "bootstrap_samples": 200})
        data["promotion"].update(floors={}, beat_baseline=False)
        warm = data["training"]["warm_start"]
        warm.update(days=2, **({"rounds": 10} if boosted else {"epochs": 1}))  # one of 3 days is left to replay
        # A 3-day training window has not seen every weekday: its vocabulary would send the next
        # partition to a full retrain, and the quick run would never fine-tune.
        full_when = warm.setdefault("full_when", {})
        if full_when.get("features"):
            full_when["features"] = [f for f in full_when["features"] if f != "local_day_of_week"]
        else:
            full_when["ignore"] = sorted({*full_when.get("ignore", []), "local_day_of_week"})
    if arm == "scratch":
        del data["training"]["warm_start"]
    data["promotion"]["mode"] = "automatic"  # the promotion sensor promotes what passed the gate
    return data


# --- a worker: one arm's home, definitions and instance -------------------------------------------------

def worker(arm: str, model: str) -> None:
    """Read one JSON command a line from stdin, answer one line on the real stdout; everything else
    (Dagster's logs, the trainer's output) goes to stderr."""
    answer = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    import dagster as dg

    from ml_assets.evaluation.record import EvaluationRecord
    from ml_assets.model_files import load_model_spec
    from ml_assets.pipeline.graph import INGEST_STAGES, ModelGraph, Stage
    from ml_assets.registry import versions as registry
    from ml_assets.runs import failure_reasons, model_defs, prepare_home
    from ml_assets.settings import load_settings
    from ml_assets.trainer import zygote

    settings = load_settings()
    prepare_home(settings)
    spec = load_model_spec(settings.models_dirs, model)
    defs = model_defs(settings, spec)
    instance = dg.DagsterInstance.get()
    graph = ModelGraph(spec)
    daily, promote = defs.resolve_job_def(graph.daily_job), defs.resolve_job_def(graph.promote_job)
    sensor = defs.resolve_sensor_def(graph.promotion_sensor)
    tracking = defs.resources["tracking"]
    node = {stage: graph.key(stage).to_python_identifier() for stage in Stage}
    gate_step = node[Stage.EVALUATION_REPORT]

    def failed(result, what: str) -> None:
        raise SystemExit(f"benchmarks.retrain_cost [{arm}]: the run {what} failed: " + "; ".join(
            failure_reasons(result) or ["no step failed"]))

    def ingest(days: list[str]) -> dict:
        for day in days:
            result = daily.execute_in_process(partition_key=day, instance=instance, raise_on_error=False,
                                              asset_selection=[graph.key(s) for s in INGEST_STAGES])
            if not result.success:
                failed(result, f"ingesting {day}")
        return {"ingested": len(days)}

    def refused(result) -> bool:
        """The gate refused the candidate: evaluated, not registered (the run itself succeeds)."""
        return bool(result.asset_materializations_for_node(gate_step)) and not \
            result.asset_materializations_for_node(node[Stage.REGISTERED_MODEL])

    def step_seconds(run_id: str, step_key: str) -> float:
        """The step's wall time in the run (its plan, the torchrun agent and the ranks, its record)."""
        times = {e.dagster_event.event_type_value: e.timestamp for e in instance.all_logs(run_id)
                 if e.dagster_event is not None and e.dagster_event.step_key == step_key}
        return times.get("STEP_SUCCESS", 0.0) - times.get("STEP_START", 0.0) if "STEP_START" in times else 0.0

    def train(day: str) -> dict:
        started = time.perf_counter()
        result = daily.execute_in_process(partition_key=day, instance=instance, raise_on_error=False)
        run_wall = time.perf_counter() - started
        if not result.success:
            failed(result, f"of partition {day}")
        out: dict = {"day": day, "run_wall": run_wall, "gate_blocked": refused(result),
                     "step_wall": step_seconds(result.run_id, node[Stage.TRAINED_CHECKPOINT])}
        ckpt = result.asset_materializations_for_node(node[Stage.TRAINED_CHECKPOINT])
        if ckpt:
            meta = {k: v.value for k, v in ckpt[-1].metadata.items()}
        else:  # a skip observes the checkpoint asset instead of materializing it
            [meta] = [{k: v.value for k, v in e.event_specific_data.asset_observation.metadata.items()}
                      for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"
                      and "training_decision" in e.event_specific_data.asset_observation.metadata]
        decision = meta.get("decision") or {}
        out.update(decision=meta["training_decision"], reason=meta["training_decision_reason"],
                   cpu=float(meta["cpu_rank_seconds"]), gpu=float(meta["gpu_rank_seconds"]),
                   train_wall=float(meta["wall_seconds"]), samples=int(meta["samples_processed"]),
                   world=int(meta.get("world_size", 0) or 0), checks=decision.get("checks"),
                   parent=(decision.get("parent") or {}).get("version"))
        if result.asset_materializations_for_node(node[Stage.EVALUATION_REPORT]):
            report = graph.latest(instance, EvaluationRecord, day)
            primary = report.primary_metric
            out.update(metric=report.metrics[primary], champion_metric=(report.champion_metrics or {}).get(primary),
                       champion_version=report.champion_version, gate_passed=report.gate_passed,
                       gate_reason=report.gate_reason, test_rows=report.test_rows, test_days=report.test_days)
        registered = result.asset_materializations_for_node(node[Stage.REGISTERED_MODEL])
        out["version"] = str(registered[-1].metadata["model_version"].value) if registered else None
        # One tick of the promotion sensor, and the promotion it asks for (ml_assets.demo.promote_by_sensor).
        context = dg.build_sensor_context(instance=instance, resources={"tracking": tracking})
        tick = sensor.evaluate_tick(context)
        out["promoted"] = None
        for request in tick.run_requests:
            moved = promote.execute_in_process(run_config=request.run_config, instance=instance, tags=request.tags,
                                               raise_on_error=False)
            if not moved.success:
                failed(moved, f"promoting after {day}")
            out["promoted"] = request.tags.get("ml_assets/version")
        champion = registry.by_alias(tracking.client(), spec.name, registry.CHAMPION)
        out["champion_after"] = str(champion.version) if champion is not None else None
        return out

    def audited() -> dict:
        """The refusals ``ml-assets audit MODEL --format json`` lists, as a user runs it."""
        done = subprocess.run([str(Path(sys.executable).parent / "ml-assets"), "audit", model, "--format", "json"],
                              capture_output=True, text=True, timeout=600)
        try:
            found = json.loads(done.stdout)
        except json.JSONDecodeError:
            return {"audit_error": (done.stdout + done.stderr)[-500:]}
        return {"refused_partitions": sorted(r.get("partition", "?") for r in found.get("refused", [])),
                "zygote_cpu_s": zygote.cpu_seconds()}

    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            break
        op = command["op"]
        reply = ingest(command["days"]) if op == "ingest" else train(command["day"]) if op == "train" else audited()
        answer.write(MARK + json.dumps(reply) + "\n")


class Arm:
    """A worker process and what it has answered."""

    def __init__(self, name: str, root: Path, quick: bool, model: str) -> None:
        self.name, self.home = name, root / name
        models = self.home / "models"
        models.mkdir(parents=True)
        (models / f"{model}.yaml").write_text(yaml.safe_dump(arm_spec(name, quick, model), sort_keys=False))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ML_ASSETS_", "DAGSTER_", "MLFLOW_"))}
        env.update(ML_ASSETS_ENV="local", ML_ASSETS_HOME=str(self.home / "home"),
                   DAGSTER_HOME=str(self.home / "home" / "dagster"), ML_ASSETS_MODELS_DIR=str(models),
                   MLFLOW_DISABLE_TELEMETRY="true", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
        self.log = self.home / "worker.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.retrain_cost", "--worker", name, "--model", model],
                                     cwd=ROOT,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, bufsize=1)

    def send(self, op: str, **fields) -> None:
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        self.proc.wait()
        tail = self.log.read_text()[-4000:]
        raise SystemExit(f"benchmarks.retrain_cost: the {self.name} worker exited ({self.proc.returncode}):\n{tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# --- the figures ----------------------------------------------------------------------------------

def bootstrap(diffs: list[float], resamples: int = RESAMPLES, seed: int = 40) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the mean of ``diffs`` resampled with replacement."""
    import numpy as np

    values = np.asarray(diffs, dtype=float)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def full_reason(reason: str) -> str:
    """The kind of a full decision's reason (ml_assets.training.decision's wording)."""
    if reason.startswith("the data moved"):
        found = re.search(r"hold a '([^']+)'", reason) or re.search(r"moved: '([^']+)''s mean", reason)
        feature = found[1] if found else "?"
        return f"data moved: {feature} {'unknown categories' if 'vocabulary lacks' in reason else 'mean shift'}"
    for prefix, kind in (("scheduled", "scheduled"), ("no @champion", "no champion"),
                         ("retraining on evidence", "evidence"), ("training.warm_start is not set", "no policy")):
        if reason.startswith(prefix):
            return kind
    return "incompatible champion" if "incompatible" in reason or "cannot start" in reason else reason[:60]


def summarize(results: dict[str, list[dict]], first: dict[str, dict], wall: float, days: list[str],
              audits: dict[str, dict]) -> None:
    scratch, warm = results["scratch"], results["warm"]
    print(f"\nfirst partition {first['warm']['day']} (not compared): scratch {first['scratch']['decision']} "
          f"{first['scratch']['cpu']:.1f} cpu rank-s, warm {first['warm']['decision']} {first['warm']['cpu']:.1f}")
    print(f"\n{'day':10} | {'scratch auc':>11} {'cpu rank-s':>10} | {'warm':9} {'auc':>7} {'cpu rank-s':>10} "
          f"{'diff':>8} | promoted s/w")
    for s, w in zip(scratch, warm, strict=True):
        diff = w["metric"] - s["metric"] if "metric" in w and "metric" in s else float("nan")
        print(f"{s['day']:10} | {s.get('metric', float('nan')):11.4f} {s['cpu']:10.1f} | {w['decision']:9} "
              f"{w.get('metric', float('nan')):7.4f} {w['cpu']:10.1f} {diff:+8.4f} | "
              f"{s['promoted'] or '-'}/{w['promoted'] or '-'}")
    cpu = {arm: sum(r["cpu"] for r in results[arm]) for arm in ARMS}
    gpu = {arm: sum(r["gpu"] for r in results[arm]) for arm in ARMS}
    samples = {arm: sum(r["samples"] for r in results[arm]) for arm in ARMS}
    ratio = cpu["warm"] / cpu["scratch"]
    by_kind = collections.defaultdict(list)
    for r in warm:
        by_kind[r["decision"]].append(r["cpu"])
    print(f"\n{len(days)} partitions {days[0]}..{days[-1]}; wall {wall / 60:.1f} min for both arms")
    print(f"trainer CPU rank-seconds: scratch {cpu['scratch']:.1f}, warm {cpu['warm']:.1f} (ratio {ratio:.3f}); "
          f"GPU rank-seconds: scratch {gpu['scratch']:.1f}, warm {gpu['warm']:.1f}")
    step = {arm: sum(r["step_wall"] for r in results[arm]) for arm in ARMS}
    print(f"trained_checkpoint step wall (plan, data checks, the parent's download, torchrun, record): scratch "
          f"{step['scratch']:.1f} s, warm {step['warm']:.1f} s (ratio {step['warm'] / step['scratch']:.3f})")
    print(f"samples processed: scratch {samples['scratch']}, warm {samples['warm']} "
          f"(ratio {samples['warm'] / max(samples['scratch'], 1):.3f})")
    print(f"scratch: median {_median([r['cpu'] for r in scratch]):.1f} cpu rank-s per training")
    for kind, values in sorted(by_kind.items()):
        print(f"warm {kind}: {len(values)} partitions, median {_median(values):.1f} cpu rank-s, total {sum(values):.1f}")
    counts = collections.Counter(r["decision"] for r in warm)
    reasons = collections.Counter(full_reason(r["reason"]) for r in warm if r["decision"] == "full")
    print("warm decisions: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in ("full", "fine_tune", "skip")))
    if reasons:
        print("warm full retrains: " + ", ".join(f"{k} {n}" for k, n in reasons.most_common()))
    checks = [r["checks"] for r in warm if r.get("checks")]
    if checks:
        print(f"warm data checks ({len(checks)} partitions): unknown share max {max(c['unknown_share'] for c in checks):.4f} "
              f"median {_median([c['unknown_share'] for c in checks]):.4f}; mean shift max "
              f"{max(c['mean_shift'] for c in checks):.3f} median {_median([c['mean_shift'] for c in checks]):.3f} sd")
    gated = {arm: sum(1 for r in results[arm] if r["version"] is None) for arm in ARMS}
    promoted = {arm: sum(1 for r in results[arm] if r["promoted"]) for arm in ARMS}
    print(f"not registered (gate): scratch {gated['scratch']}, warm {gated['warm']}; promoted: scratch "
          f"{promoted['scratch']}, warm {promoted['warm']}")
    for arm in ARMS:  # every partition's run succeeded (a failed one ends the benchmark): refusals are outcomes
        refused = sorted(r["day"] for r in [first[arm], *results[arm]] if r["gate_blocked"])
        listed = audits[arm].get("refused_partitions")
        print(f"{arm}: {len(refused)} candidate(s) refused by the gate, {len(listed) if listed is not None else '?'} "
              f"listed by ml-assets audit" + ("" if listed == refused else
                                              f" (MISMATCH: {audits[arm].get('audit_error') or listed})"))

    zyg = {arm: audits[arm].get("zygote_cpu_s") for arm in ARMS}
    if all(v is not None for v in zyg.values()):
        # Paid once per arm's worker (as once per run launcher in production), not per training.
        print(f"trainer zygote's own CPU (its imports once, and the forks): scratch {zyg['scratch']:.1f} s, warm "
              f"{zyg['warm']:.1f} s; with it counted, warm / scratch {(cpu['warm'] + zyg['warm']) / (cpu['scratch'] + zyg['scratch']):.3f}")
    pairs = [(s, w) for s, w in zip(scratch, warm, strict=True) if "metric" in s and "metric" in w]
    diffs = [w["metric"] - s["metric"] for s, w in pairs]
    low, high = bootstrap(diffs)
    mean = sum(diffs) / len(diffs)
    print(f"ROC-AUC of the day's candidate, warm - scratch, over {len(diffs)} days: mean {mean:+.4f}, paired "
          f"bootstrap 95% [{low:+.4f}, {high:+.4f}] ({RESAMPLES} resamples); scratch mean "
          f"{sum(s['metric'] for s, _ in pairs) / len(pairs):.4f}, warm mean {sum(w['metric'] for _, w in pairs) / len(pairs):.4f}")
    served = [served_metric(w) - served_metric(s) for s, w in pairs
              if served_metric(w) is not None and served_metric(s) is not None]
    if served:
        slow, shigh = bootstrap(served)
        print(f"ROC-AUC of the model each arm serves after the day's promotion, warm - scratch: mean "
              f"{sum(served) / len(served):+.4f}, 95% [{slow:+.4f}, {shigh:+.4f}]")
    skipped = len(scratch) - len(pairs)
    if skipped:
        print(f"({skipped} partition(s) without an evaluation in one arm (a skip) are left out of the comparison)")
    print(f"RESULT retrain_cost_auc_lower_bound {low:.4f} goal >= -0.005")
    print(f"RESULT retrain_cost {ratio:.3f} goal <= 0.25")


def served_metric(r: dict) -> float | None:
    """The primary metric, on the day's rows, of the model the arm serves after the day's promotion."""
    if "metric" not in r:
        return None
    if r["promoted"] or r.get("champion_metric") is None:
        return r["metric"]
    return r["champion_metric"]


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values) if values else float("nan")


# --- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 4-day window, 2 epochs, 1 compared partition")
    parser.add_argument("--days", type=int, help="compared partitions after the first (default 30; quick 1)")
    parser.add_argument("--first", type=dt.date.fromisoformat, help="the first partition (trains from scratch in both)")
    parser.add_argument("--keep", action="store_true", help="keep the arms' homes (their path is printed)")
    parser.add_argument("--model", choices=MODELS, default=MODELS[0], help="the bundled model (default flights_delay)")
    parser.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.model)
        return
    n = args.days or (1 if args.quick else 30)
    first = args.first or (QUICK_FIRST if args.quick else FIRST)
    spec = yaml.safe_load(bundled(args.model).read_text())
    quick_spec = arm_spec("warm", args.quick, args.model)
    width, tests = quick_spec["training"]["window_days"], quick_spec["evaluation"]["test_days"]
    before = width + tests - 1  # the first partition's window and its earlier test days
    ingest = [(first - dt.timedelta(days=before - i)).isoformat() for i in range(before)]
    partitions = [(first + dt.timedelta(days=i)).isoformat() for i in range(n + 1)]
    if dt.date.fromisoformat(ingest[0]) < dt.date.fromisoformat(str(spec["partitioning"]["start"])):
        raise SystemExit(f"--first {first}: its window starts on {ingest[0]}, before the first partition")
    print(f"benchmarks.retrain_cost: {args.model}, window {width} days, test {tests} day(s); partition {first} then "
          f"{n} compared ({partitions[1]}..{partitions[-1]}); warm policy {quick_spec['training']['warm_start']}",
          flush=True)
    root = Path(tempfile.mkdtemp(prefix="retrain_cost-"))
    arms = {}
    try:
        arms = {name: Arm(name, root, args.quick, args.model) for name in ARMS}
        started = time.perf_counter()
        for arm in arms.values():  # both at once: ingestion is not measured
            arm.send("ingest", days=ingest)
        for arm in arms.values():
            arm.receive()
        print(f"ingested {len(ingest)} days per arm in {time.perf_counter() - started:.0f} s", flush=True)
        results: dict[str, list[dict]] = {name: [] for name in ARMS}
        firsts = {}
        for i, day in enumerate(partitions):
            order = ARMS if i % 2 == 0 else ARMS[::-1]
            for name in order:
                arms[name].send("train", day=day)
                r = arms[name].receive()
                if i:
                    results[name].append(r)
                else:
                    firsts[name] = r
                print(f"{day} {name:7} {r['decision']:9} cpu {r['cpu']:6.1f} rank-s (world {r['world']}) "
                      f"auc {r.get('metric', float('nan')):.4f} version {r['version'] or '-'} promoted "
                      f"{r['promoted'] or '-'} champion {r['champion_after'] or '-'} run {r['run_wall']:.0f} s"
                      + ("" if r["decision"] != "full" or name == "scratch" else f"  [{full_reason(r['reason'])}]"),
                      flush=True)
        wall = time.perf_counter() - started
        for arm in arms.values():
            arm.send("audit")
        audits = {name: arm.receive() for name, arm in arms.items()}
        for arm in arms.values():
            arm.close()
        summarize(results, firsts, wall, partitions[1:], audits)
    finally:
        for arm in arms.values():
            arm.close()
        if args.keep:
            print(f"(kept the arms' homes in {root})", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
