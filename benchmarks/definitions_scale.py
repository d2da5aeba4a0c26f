"""A code location of hundreds of models loads in seconds: what each model adds to building it.

    python -m benchmarks.definitions_scale [--quick]

Writes N copies of the bundled flights_delay spec (renamed m0000, m0001, ...) to a models directory
and, for N = 1, 100 and 500, times a fresh Python process that imports ml_assets, builds the code
location (``ml_assets.definitions.build_definitions``: read and validate the specs, build every
model's assets, checks, jobs, schedules and sensors) and resolves it as a run worker does
(``get_repository_def()`` and its asset graph): the cost every run worker and step pod pays before
its step starts. Wall time from the process's start (the interpreter and every import included) and
its peak RSS. Medians of several runs.

Side by side, the baseline: Dagster's own construction alone, the same N models as Dagster sees them
(the same asset keys, dependencies, daily partitions and window mappings, asset checks, kinds, five
jobs, two daily schedules and a sensor per model) with empty bodies, no spec, no code versions.
The difference is what this package adds per model.

Results: ms per model above the first, (wall(500) - wall(1)) / 499 (goal <= 20); the wall time at
500 models (goal <= 10 s) and at 1 (goal <= 1.5 s). Also printed, not a goal: resolving every job
of the location at the largest N, what `dagster definitions validate` and a code server's snapshot
do once per load (Dagster resolves each asset job against the whole asset graph, so that part grows
with the square of the models).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "ml_assets" / "models" / "flights_delay.yaml"

# Both children end alike: resolve what they built as a run worker does, and say what it cost.
RESOLVE_AND_REPORT = """
built = time.perf_counter()
repository = defs.get_repository_def()
repository.asset_graph
resolved = time.perf_counter()
jobs = len(repository.get_all_jobs()) if sys.argv[1] == "all-jobs" else 0
print(json.dumps({"import": imported - started, "build": built - imported, "resolve": resolved - built,
                  "all_jobs": time.perf_counter() - resolved, "jobs": jobs,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

OURS = """
import json, resource, sys, time
started = time.perf_counter()
from ml_assets.definitions import build_definitions
imported = time.perf_counter()
defs = build_definitions()
""" + RESOLVE_AND_REPORT

# Dagster alone: the shape of one model's definitions (ml_assets.pipeline.model), nothing of ours.
DAGSTER_ALONE = """
import json, resource, sys, time
started = time.perf_counter()
import dagster as dg
imported = time.perf_counter()
n = int(sys.argv[2])
DAILY = ["raw_data", "validated_snapshot", "features", "trained_checkpoint", "evaluation_report", "registered_model"]
CHECKS = ["schema", "nulls", "ranges_and_categories", "duplicate_keys", "volume", "freshness", "drift"]

def model(name):
    days = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2014-01-01", timezone="America/New_York")
    window = dg.TimeWindowPartitionMapping(start_offset=-14, end_offset=-1)
    assets, previous = {}, None
    for stage in DAILY:
        key = dg.AssetKey([name, stage])
        deps = [dg.AssetDep(previous, partition_mapping=window if stage == "trained_checkpoint" else None)] if previous else []
        checks = [dg.AssetCheckSpec(c, asset=key, blocking=True) for c in CHECKS] if stage == "validated_snapshot" else []

        @dg.asset(key=key, deps=deps, group_name=name, partitions_def=days, kinds={"python"}, code_version="1",
                  check_specs=checks or None, description=stage)
        def body(context: dg.AssetExecutionContext):
            return None
        assets[stage], previous = body, key
    extra = []
    for stage, dep in (("production_model", "registered_model"), ("hyperparameters", "features"),
                       ("predictions", "registered_model"), ("model_monitor", "predictions")):
        @dg.asset(key=dg.AssetKey([name, stage]), deps=[dg.AssetKey([name, dep])], group_name=name,
                  kinds={"python"}, code_version="1", description=stage)
        def other(context: dg.AssetExecutionContext):
            return None
        extra.append(other)
    daily = dg.define_asset_job(f"{name}_daily", selection=dg.AssetSelection.assets(*assets.values()))
    ingest = dg.define_asset_job(f"{name}_ingest", selection=dg.AssetSelection.assets(*list(assets.values())[:3]))
    jobs = [daily, ingest] + [dg.define_asset_job(f"{name}_{j}", selection=dg.AssetSelection.assets(a))
                              for j, a in zip(("promote", "tune", "score"), extra[:3])]
    schedules = [dg.ScheduleDefinition(name=f"{name}_{j.name}_schedule", job=j, cron_schedule="0 2 * * *")
                 for j in (daily, jobs[4])]

    @dg.sensor(name=f"{name}_promotion_sensor", job=jobs[2])
    def sensor(context):
        return None
    return dg.Definitions(assets=[*assets.values(), *extra], jobs=jobs, schedules=schedules, sensors=[sensor])

defs = dg.Definitions.merge(*[model(f"m{i:04d}") for i in range(n)])
""" + RESOLVE_AND_REPORT


def models_dir(root: Path, n: int) -> Path:
    folder = root / f"models-{n}"
    folder.mkdir()
    text = BUNDLED.read_text()
    for i in range(n):
        (folder / f"m{i:04d}.yaml").write_text(text.replace("name: flights_delay", f"name: m{i:04d}", 1))
    return folder


def run(code: str, n: int, folder: Path, home: Path, all_jobs: bool = False) -> dict:
    env = {**os.environ, "ML_ASSETS_MODELS_DIR": str(folder), "ML_ASSETS_HOME": str(home), "ML_ASSETS_ENV": "local",
           "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, "all-jobs" if all_jobs else "-", str(n)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"building {n} models failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall": wall}


def median_of(samples: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1, 20 and 100 models, one run each (a smoke run)")
    args = parser.parse_args()
    sizes, runs = ((1, 20, 100), 1) if args.quick else ((1, 100, 500), 5)
    largest = sizes[-1]
    with tempfile.TemporaryDirectory(prefix="bench-definitions-scale-") as tmp:
        root = Path(tmp)
        folders = {n: models_dir(root, n) for n in sizes}
        ours: dict[int, list[dict]] = {n: [] for n in sizes}
        alone: dict[int, list[dict]] = {n: [] for n in sizes}
        for _ in range(runs):  # interleaved, so that a slow moment of the machine hits both alike
            for n in sizes:
                ours[n].append(run(OURS, n, folders[n], root / "home"))
                alone[n].append(run(DAGSTER_ALONE, n, folders[n], root / "home"))
        every_job = run(OURS, largest, folders[largest], root / "home", all_jobs=True)
        every_job_alone = run(DAGSTER_ALONE, largest, folders[largest], root / "home", all_jobs=True)

    print(f"{'models':>6}  {'ours wall s':>11}  {'import':>6}  {'build':>6}  {'resolve':>7}  {'peak MB':>7}  "
          f"{'Dagster alone wall s':>20}  {'its build':>9}  {'peak MB':>7}   (medians of {runs}; spread of ours)")
    for n in sizes:
        walls = [s["wall"] for s in ours[n]]
        print(f"{n:>6}  {median_of(ours[n], 'wall'):>11.2f}  {median_of(ours[n], 'import'):>6.2f}  "
              f"{median_of(ours[n], 'build'):>6.2f}  {median_of(ours[n], 'resolve'):>7.2f}  "
              f"{median_of(ours[n], 'rss_mb'):>7.0f}  {median_of(alone[n], 'wall'):>20.2f}  "
              f"{median_of(alone[n], 'build'):>9.2f}  {median_of(alone[n], 'rss_mb'):>7.0f}   "
              f"{min(walls):.2f}..{max(walls):.2f}")
    per_model = (median_of(ours[largest], "wall") - median_of(ours[1], "wall")) / (largest - 1) * 1e3
    per_model_alone = (median_of(alone[largest], "wall") - median_of(alone[1], "wall")) / (largest - 1) * 1e3
    print(f"per model above the first, 1 -> {largest}: ours {per_model:.1f} ms, Dagster alone {per_model_alone:.1f} ms "
          f"(this package adds {per_model - per_model_alone:.1f} ms: reading and validating the spec, code versions, "
          "the stages' own checks and resources)")
    print(f"every job resolved at {largest} models (a code server's snapshot, `dagster definitions validate`; "
          f"not on a run worker's path): ours {every_job['all_jobs']:.2f} s for {every_job['jobs']} jobs, "
          f"Dagster alone {every_job_alone['all_jobs']:.2f} s for {every_job_alone['jobs']}")
    print(f"RESULT definitions_scale_1_model_s {median_of(ours[1], 'wall'):.3f} goal <= 1.5")
    if largest == 500:
        print(f"RESULT definitions_scale_500_models_s {median_of(ours[500], 'wall'):.3f} goal <= 10")
    print(f"RESULT definitions_scale_ms_per_model {per_model:.2f} goal <= 20")


if __name__ == "__main__":
    main()
