"""The cost of running the bundled graph through Dagster in production mode, and how fast a backfill
queues runs on the production instance.

    python -m benchmarks.orchestration [--quick]

Needs PostgreSQL (ML_ASSETS_TEST_POSTGRES_URL; .ci/run sets it). Everything is the production
configuration of docs/deployment.md on loopback: Dagster's instance on a fresh PostgreSQL database
(ml_assets/instance/production.yaml), ``ml-assets mlflow-server`` on another (its artifacts on local
disk), artifacts and checkpoints in S3 (moto's server on loopback, started by the benchmark: production
refuses stores on one machine's disk), the steps' compute logs on local disk. Both paths read and
write the same objects, so the store's latency is in both.

1. The graph. ``flights_delay_daily`` (raw_data -> validated_snapshot -> features ->
   trained_checkpoint -> evaluation_report -> registered_model) for one partition, its training
   window ingested beforehand:
   - through Dagster: submitted to the run queue (``dagster job launch``), launched by
     ``dagster-daemon`` through ``ml_assets.deploy.run_launcher`` (a run worker forked from its server),
     the production default executor (in process; ML_ASSETS_EXECUTOR), events in PostgreSQL; timed
     from the run's creation to its RUN_SUCCESS event, so the queue's wait and the worker's start
     count;
   - as plain functions: each stage's body called directly in one fresh process (Dagster's direct
     invocation: no run, no executor, no event log; an in-memory instance hands each stage its
     upstream records, outside the timers), the trainer by the same torchrun command without
     Dagster Pipes (``TorchrunLauncher.run_plain``, its result read from the trainer's report.json).
   Each repetition trains into its own checkpoint directory (a shared one would resume). A first run
   through Dagster warms caches and creates the MLflow experiment and registered model; then plain
   and Dagster alternate, five times each. Medians. The spec's promotion waits for approval, so the
   promotion sensor starts no run beside the measured ones.
   The plain process first imports the libraries the stages use (timed apart: a plain script pays
   them on every run, a run worker forked from the launcher's server does not,
   ml_assets.deploy.run_launcher).
   Wall ratio (the RESULT) = Dagster wall / the stages' summed compute (imports left out); also
   printed against the plain process's whole time (imports + stages). Per-step overhead = (the
   run's executing time, RUN_START to RUN_SUCCESS, - the stages' summed compute) / steps.
2. The queue. ``dagster job backfill`` of 60 partitions of ``<model>_ingest`` into the production
   instance's run queue (the daemon is not running, so the runs stay queued and are deleted
   afterwards): runs queued per second, from the runs' creation times; the same on a SQLite
   instance side by side. Three runs each; medians.

Warm start: the spec's ``training.warm_start`` is dropped, so every repetition of the one
partition trains in full (with it, each after the first would skip: the registry holds a version
trained from the same feature bytes); the daily decision's cost is benchmarks.retrain_cost's.

``--quick`` trains a 3-day window for one epoch on one rank, once each way, and queues 5 partitions once, on
PostgreSQL only.

Ends with:
    RESULT orchestration_wall_ratio <Dagster wall / the stages' summed compute> goal <= 1.3
    RESULT orchestration_step_overhead_s <seconds per step> goal <= 1
    RESULT orchestration_queue_runs_per_s <runs/s on PostgreSQL> goal >= 1
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import inspect
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import dagster as dg
import yaml
from moto.server import ThreadedMotoServer

from benchmarks._processes import free_port
from ml_assets.definitions import build_definitions
from ml_assets.deploy.run_launcher import DUMP_STACKS, WORKER_PRELOAD
from ml_assets.instance import PRODUCTION_INSTANCE
from ml_assets.model_files import load_all_model_specs
from ml_assets.pipeline.graph import DAILY_STAGES as STAGES
from ml_assets.pipeline.graph import ModelGraph, Stage
from ml_assets.pipeline.model import BUILDERS
from ml_assets.platform import local_resources
from ml_assets.records.runs import PID_TAG
from ml_assets.settings import BUNDLED_MODELS_DIR, load_settings
from ml_assets.spec import load_specs
from ml_assets.training.launcher import TorchrunLauncher

REPO = Path(__file__).resolve().parents[1]
MODEL = "flights_delay"
BUCKET = "orchestration"
VENV_BIN = Path(sys.executable).parent


def write_models(root: Path, quick: bool = False) -> Path:
    (root / "models").mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load((BUNDLED_MODELS_DIR / f"{MODEL}.yaml").read_text())
    # The promotion sensor (automatic mode) would start a promotion run after each registration,
    # overlapping the next measured run: promotion waits for approval here.
    data["promotion"]["mode"] = "approval_required"
    # What is measured is the graph around a training. With the bundled warm start, every repetition
    # of the one partition after the first would skip (the registry holds a version trained from the
    # same feature bytes) and time a graph that trains nothing; the daily decision's own cost is
    # benchmarks.retrain_cost's.
    data["training"].pop("warm_start", None)
    if quick:  # seconds of training instead of a minute; such a model is not held to the floors or the baseline
        # One rank: a second's start (~2.5 s of imports) on 2 cores is most of such a training.
        data["training"].update({"window_days": 3, "validation_days": 1, "epochs": 1, "processes_per_node": 1})
        data["evaluation"]["test_days"] = 1
        data["promotion"].update(floors={}, beat_baseline=False)
    (root / "models" / f"{MODEL}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root / "models"


# --- 1. the graph through Dagster against its stages as plain functions ------------------------------

GRAPH_DAY = dt.date(2013, 3, 20)


class PlainLauncher(TorchrunLauncher):
    """The plain-function baseline's trainer: the same torchrun command, without Pipes."""

    def run(self, context, config_path: str, nproc: int, max_restarts: int = 0):
        return self.run_plain(config_path, nproc, max_restarts)


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"benchmarks.orchestration: {url} did not answer within {timeout:.0f} s")


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def plain_graph(env: dict[str, str], day: dt.date, window: list[dt.date]) -> tuple[dict[str, float], float]:
    """Each stage's body called directly, in order, in a fresh process: seconds per stage, and under
    ``imports`` the seconds the process spent importing the libraries the stages use (what a plain
    script pays on every run; the launcher's server imported them once: WORKER_PRELOAD)."""
    cli = subprocess.run([sys.executable, "-m", "benchmarks.orchestration", "--plain-graph", day.isoformat(),
                          *[d.isoformat() for d in window]], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=1800)
    if cli.returncode != 0:
        raise SystemExit(f"the plain-function run failed:\n{cli.stdout[-3000:]}\n{cli.stderr[-3000:]}")
    out = json.loads(cli.stdout.strip().splitlines()[-1])
    return out["seconds"], out["samples_per_s"]


def _plain_graph_process(day: dt.date, window: list[dt.date]) -> None:
    """``--plain-graph``: the baseline's process. Prints the seconds per stage and the trainer's
    samples/s as JSON."""
    started = time.perf_counter()
    for module in WORKER_PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    seconds: dict[str, float] = {"imports": time.perf_counter() - started}
    settings = load_settings()
    spec = next(s for s in load_all_model_specs(settings.models_dirs) if s.name == MODEL)
    assets = {stage: build(spec) for stage, build in BUILDERS.items()}
    graph = ModelGraph(spec)
    resources = {**local_resources(settings), "launcher": PlainLauncher()}
    with dg.DagsterInstance.get() as source, dg.DagsterInstance.ephemeral() as instance:
        features = graph.key(Stage.FEATURES)
        for d in window:  # the training window's feature records, as the daily run reads them
            record = source.fetch_materializations(dg.AssetRecordsFilter(
                asset_key=features, asset_partitions=[d.isoformat()]), limit=1).records[0]
            instance.report_runless_asset_event(record.asset_materialization)
        for stage in STAGES:
            context = dg.build_asset_context(partition_key=day.isoformat(), instance=instance, resources=resources)
            started = time.perf_counter()
            out = assets[stage](context)
            out = list(out) if inspect.isgenerator(out) else [out]
            seconds[stage] = time.perf_counter() - started
            result = next((o for o in out if isinstance(o, dg.MaterializeResult)), None)
            if result is None:  # a refused candidate registers nothing: the graph ends there, as a run's does
                break
            if stage == "trained_checkpoint":
                samples_per_s = result.metadata["samples_per_s"]
            instance.report_runless_asset_event(dg.AssetMaterialization(
                graph.key(stage), partition=day.isoformat(), metadata=result.metadata))
    print(json.dumps({"seconds": seconds, "samples_per_s": getattr(samples_per_s, "value", samples_per_s)}))


@dataclass
class DagsterRun:
    wall: float  # submission to RUN_SUCCESS
    queued: float  # submission to RUN_STARTING (the daemon hands it to the launcher)
    worker_start: float  # RUN_STARTING to RUN_START (the run worker is up and executing)
    executing: float  # RUN_START to RUN_SUCCESS: the executor running the steps
    steps: dict[str, float]  # STEP_START to STEP_SUCCESS per stage
    samples_per_s: float  # the trainer's own throughput, from its materialization


def stuck_run_report(instance: dg.DagsterInstance, run_id: str, env: dict[str, str]) -> str:
    """What a run that did not finish was doing, for the benchmark's failure message (its files are
    in a temporary directory that goes with the benchmark): its status and last events, every
    thread's stack in its run worker (asked for with DUMP_STACKS), the worker's and the daemon's logs.
    An unfinished run's worker is then killed with its process group (it leads one): nothing the
    benchmark started outlives it."""
    run = instance.get_run_by_id(run_id)
    parts = [f"run {run_id}: {run.status.value}"]
    parts += [f"  {e.dagster_event.event_type_value if e.dagster_event else 'log'}: {(e.message or '')[:200]}"
              for e in list(instance.all_logs(run_id))[-15:]]
    if PID_TAG in run.tags and not run.is_finished:  # then the worker and what it started go
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(run.tags[PID_TAG]), DUMP_STACKS)
            time.sleep(3)  # the dump is written by the worker's signal handler
            os.killpg(int(run.tags[PID_TAG]), signal.SIGKILL)
    home = Path(env["DAGSTER_HOME"])
    for log in [*sorted((home / "run_workers").glob(f"{run_id}.*.log")), home.parent / "daemon.log"]:
        text = log.read_text(errors="replace") if log.exists() else "(none)"
        parts.append(f"--- {log.name} (last 8000 characters) ---\n{text[-8000:]}")
    return "\n".join(parts)


def dagster_graph(env: dict[str, str], day: dt.date, checkpoints: str, timeout: float) -> DagsterRun:
    """A run of the daily job submitted to the production instance's queue (``dagster job launch``),
    launched by the daemon through ``ml_assets.deploy.run_launcher``: its wall time from submission to
    success, each step's from the executor starting it to its success, and the time the run waited in
    the queue.
    A run not finished within ``timeout`` seconds, or not successful, ends the benchmark with what it
    was doing (``stuck_run_report``)."""
    config = Path(env["DAGSTER_HOME"]) / "run_config.yaml"  # this run's own checkpoint directory
    config.write_text(yaml.safe_dump({"resources": {"checkpoints": {"config": {"root": checkpoints}}}}))
    cli = subprocess.run([str(VENV_BIN / "dagster"), "job", "launch", "-w", "workspace.yaml", "-j", f"{MODEL}_daily",
                          "-c", str(config), "--tags", json.dumps({"dagster/partition": day.isoformat()})],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    if cli.returncode != 0:
        raise SystemExit(f"dagster job launch failed:\n{cli.stdout[-3000:]}\n{cli.stderr[-3000:]}")
    with environment(env), dg.DagsterInstance.get() as instance:
        record = instance.get_run_records(limit=1)[0]
        run_id = record.dagster_run.run_id
        deadline = time.monotonic() + timeout
        while not (run := instance.get_run_by_id(run_id)).is_finished:
            if time.monotonic() > deadline:
                raise SystemExit(f"the run did not finish within {timeout:.0f} s\n"
                                 + stuck_run_report(instance, run_id, env))
            time.sleep(0.2)
        if run.status != dg.DagsterRunStatus.SUCCESS:
            raise SystemExit(f"the run ended {run.status.value}\n" + stuck_run_report(instance, run_id, env))
        steps: dict[str, float] = {}
        began: dict[str, float] = {}
        marks: dict[dg.DagsterEventType, float] = {}
        samples_per_s = float("nan")
        for entry in instance.all_logs(run_id):
            event = entry.dagster_event
            if event is None:
                continue
            if event.event_type in (dg.DagsterEventType.RUN_STARTING, dg.DagsterEventType.RUN_START,
                                    dg.DagsterEventType.RUN_SUCCESS):
                marks[event.event_type] = entry.timestamp
            elif event.event_type == dg.DagsterEventType.STEP_START:
                began[event.step_key] = entry.timestamp
            elif event.event_type == dg.DagsterEventType.STEP_SUCCESS:
                steps[event.step_key.removeprefix(f"{MODEL}__")] = entry.timestamp - began[event.step_key]
            elif (event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION
                  and event.asset_key.path[-1] == "trained_checkpoint"):
                samples_per_s = event.step_materialization_data.materialization.metadata["samples_per_s"].value
        created = record.create_timestamp.timestamp()
    starting, start, success = (marks[t] for t in (dg.DagsterEventType.RUN_STARTING, dg.DagsterEventType.RUN_START,
                                                    dg.DagsterEventType.RUN_SUCCESS))
    return DagsterRun(wall=success - created, queued=starting - created, worker_start=start - starting,
                      executing=success - start, steps=steps,
                      samples_per_s=samples_per_s)


def production_instance() -> dict:
    """ml_assets/instance/production.yaml, its compute logs kept on local disk (under DAGSTER_HOME) instead
    of S3: the run's log, not part of what either path computes."""
    config = yaml.safe_load(PRODUCTION_INSTANCE.read_text())
    config.pop("compute_logs")
    return config


def graph_benchmark(postgres: str, root: Path, quick: bool) -> tuple[float, float]:
    models = write_models(root / "graph", quick)
    spec = next(s for s in load_specs(models) if s.name == MODEL)
    # The training window and the test days before the partition's own.
    before = spec.training.window_days + spec.evaluation.test_days - 1
    window = [GRAPH_DAY - dt.timedelta(days=n) for n in range(before, 0, -1)]
    repeats = 1 if quick else 5
    dagster_url, dagster_db = postgres_database(postgres)
    mlflow_url, mlflow_db = postgres_database(postgres, driver="postgresql+psycopg")
    (root / "dagster").mkdir()
    (root / "dagster" / "dagster.yaml").write_text(yaml.safe_dump(production_instance()))
    port = free_port()
    s3_port = free_port()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    s3.start()
    s3_env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}", "AWS_ACCESS_KEY_ID": "bench",
              "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], aws_access_key_id="bench", aws_secret_access_key="bench",
                 region_name="us-east-1").create_bucket(Bucket=BUCKET)
    env = {**os.environ, **s3_env, "ML_ASSETS_ENV": "production", "DAGSTER_HOME": str(root / "dagster"),
           "ML_ASSETS_DAGSTER_POSTGRES_URL": dagster_url, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}",
           "ML_ASSETS_ARTIFACTS_URL": f"s3://{BUCKET}/artifacts",
           "ML_ASSETS_CHECKPOINTS_URL": f"s3://{BUCKET}/checkpoints/setup",
           "ML_ASSETS_HOME": str(root / "home"), "ML_ASSETS_MODELS_DIR": str(models),
           # Production's MLflow authentication: the runs speak as the platform's identity.
           "MLFLOW_TRACKING_USERNAME": "ml-platform", "MLFLOW_TRACKING_PASSWORD": uuid.uuid4().hex}
    admin = {"MLFLOW_AUTH_ADMIN_PASSWORD": uuid.uuid4().hex, "MLFLOW_FLASK_SERVER_SECRET_KEY": uuid.uuid4().hex}
    servers = [subprocess.Popen([str(VENV_BIN / "ml-assets"), "mlflow-server", "--port", str(port), "--workers", "1"],
                                env={**env, **admin, "MLFLOW_BACKEND_STORE_URI": mlflow_url,
                                     "MLFLOW_ARTIFACTS_DESTINATION": (root / "mlflow-artifacts").as_uri()},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    try:
        for command in (["instance", "migrate"], ["instance", "concurrency", "set", "gpu", "1"]):
            subprocess.run([str(VENV_BIN / "dagster"), *command], env=env, cwd=REPO, check=True, capture_output=True)
        with open(root / "daemon.log", "wb") as log:
            servers.append(subprocess.Popen([str(VENV_BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"], env=env,
                                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        wait_http(f"http://127.0.0.1:{port}/health", 120)
        subprocess.run([str(VENV_BIN / "ml-assets"), "mlflow-users", "create-platform"], env={**env, **admin},
                       cwd=REPO, check=True, capture_output=True)
        print(f"graph: {MODEL}_daily for {GRAPH_DAY} in production mode ({spec.training.window_days}-day window, "
              f"{spec.training.epochs} epochs); ingesting the window", flush=True)
        with environment(env), dg.DagsterInstance.get() as instance:
            ingest = build_definitions(load_settings()).resolve_job_def(f"{MODEL}_ingest")
            quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
            for d in window:
                result = ingest.execute_in_process(run_config=quiet, partition_key=d.isoformat(),
                                                   instance=instance, raise_on_error=False)
                if not result.success:
                    failures = [e.message for e in result.all_events if e.is_failure]
                    raise SystemExit(f"ingesting {d} failed: {failures}")
        plain: list[dict[str, float]] = []
        plain_samples: list[float] = []
        through: list[DagsterRun] = []

        def one(kind: str, rep: int) -> None:
            checkpoints = f"s3://{BUCKET}/checkpoints/{kind}-{rep}"
            if kind == "plain":
                seconds, samples_per_s = plain_graph({**env, "ML_ASSETS_CHECKPOINTS_URL": checkpoints}, GRAPH_DAY, window)
                plain.append(seconds)
                plain_samples.append(samples_per_s)
                print(f"  plain functions: {sum(seconds.values()):6.1f} s (imports {seconds['imports']:.1f} s; "
                      f"trainer {samples_per_s:.0f} samples/s)", flush=True)
            else:
                # --quick: well inside the 600 s its test gives the whole benchmark (one run takes ~15 s)
                run = dagster_graph(env, GRAPH_DAY, checkpoints, timeout=300 if quick else 1800)
                through.append(run)
                print(f"  through Dagster: {run.wall:6.1f} s (queued {run.queued:.1f} s, worker start "
                      f"{run.worker_start:.1f} s, executing {run.executing:.1f} s; trainer {run.samples_per_s:.0f} samples/s)"
                      + (" (warm-up, not counted)" if rep < 0 else ""), flush=True)

        if not quick:
            one("dagster", -1)
            through.clear()
        for rep in range(repeats):
            one("plain", rep)
            one("dagster", rep)
    finally:
        for server in servers:
            os.killpg(server.pid, signal.SIGTERM)
        for server in servers:
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=15)
        drop_database(postgres, dagster_db)
        drop_database(postgres, mlflow_db)
        s3.stop()
    med = statistics.median
    plain_total = med(sum(p.values()) for p in plain)  # a plain script in a fresh process, imports included
    compute = med(sum(v for k, v in p.items() if k != "imports") for p in plain)  # the stages alone
    wall, executing = med(r.wall for r in through), med(r.executing for r in through)
    print(f"  {'stage':<20} {'plain s':>8} {'in its step s':>14}")
    print(f"  {'(imports)':<20} {med(p['imports'] for p in plain):8.2f} {'preloaded':>14}")
    for stage in STAGES:
        print(f"  {stage:<20} {med(p[stage] for p in plain):8.2f} {med(r.steps[stage] for r in through):14.2f}")
    print(f"  {'(trainer samples/s)':<20} {med(plain_samples):8.0f} {med(r.samples_per_s for r in through):14.0f}")
    overhead = (executing - compute) / len(STAGES)
    print(f"  median of {repeats}: through Dagster {wall:.1f} s from submission (queued {med(r.queued for r in through):.1f} s, "
          f"run worker start {med(r.worker_start for r in through):.1f} s, executing {executing:.1f} s); "
          f"plain functions {plain_total:.1f} s in a fresh process, of which the stages {compute:.1f} s")
    print(f"  wall ratio {wall / compute:.3f} against the stages' summed compute ({wall / plain_total:.3f} against the "
          f"plain script, its imports included); the executor adds {overhead:.2f} s per step (executing - stages) / "
          f"{len(STAGES)}")
    return wall / compute, overhead


def queue_rate(instance_yaml: str, env: dict[str, str], partitions: int, first: dt.date, where: Path) -> float:
    """Runs queued per second by `dagster job backfill` (creation times of its runs)."""
    where.mkdir(parents=True)
    (where / "dagster.yaml").write_text(instance_yaml)
    env = {**env, "DAGSTER_HOME": str(where)}
    subprocess.run([str(VENV_BIN / "dagster"), "instance", "migrate"], env=env, cwd=REPO, check=True,
                   capture_output=True)
    last = first + dt.timedelta(days=partitions - 1)
    cli = subprocess.run([str(VENV_BIN / "dagster"), "job", "backfill", "-w", "workspace.yaml", "-j", f"{MODEL}_ingest",
                          "--from", first.isoformat(), "--to", last.isoformat(), "--noprompt"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    if cli.returncode != 0:
        raise SystemExit(f"dagster job backfill failed:\n{cli.stderr[-3000:]}")
    with environment(env), dg.DagsterInstance.from_config(str(where)) as instance:
        records = instance.get_run_records()
        created = sorted(r.create_timestamp.timestamp() for r in records)
        statuses = {r.dagster_run.status.value for r in records}
        for record in records:
            instance.delete_run(record.dagster_run.run_id)
    assert len(created) == partitions, (len(created), partitions)
    print(f"    {partitions} runs {sorted(statuses)} in {created[-1] - created[0]:.1f} s")
    return (len(created) - 1) / (created[-1] - created[0])


def postgres_database(base_url: str, driver: str = "postgresql+psycopg2") -> tuple[str, str]:
    """A fresh database on the server of ``base_url``: (its URL with ``driver`` (psycopg2: Dagster's), its name)."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(base_url)
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"bench_orchestration_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(drivername=driver, database=name).render_as_string(hide_password=False), name


def drop_database(base_url: str, name: str) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    admin = make_url(base_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 3-day window, 1 epoch, once; 5 partitions queued once")
    parser.add_argument("--plain-graph", nargs="+", metavar="DAY", help=argparse.SUPPRESS)  # the baseline's process
    args = parser.parse_args(argv)
    if args.plain_graph:
        day, *window = (dt.date.fromisoformat(d) for d in args.plain_graph)
        return _plain_graph_process(day, window)
    postgres = os.environ.get("ML_ASSETS_TEST_POSTGRES_URL")
    if not postgres:
        raise SystemExit("benchmarks.orchestration needs PostgreSQL: set ML_ASSETS_TEST_POSTGRES_URL "
                         "(postgresql+psycopg://user@127.0.0.1:5432/db; .ci/run sets it)")
    with tempfile.TemporaryDirectory(prefix="bench-orchestration-") as tmp:
        ratio, overhead = graph_benchmark(postgres, Path(tmp) / "graph", args.quick)
        pg = queue_benchmark(postgres, Path(tmp) / "queue", args.quick)
    print(f"RESULT orchestration_wall_ratio {ratio:.3f} goal <= 1.3")
    print(f"RESULT orchestration_step_overhead_s {overhead:.2f} goal <= 1")
    print(f"RESULT orchestration_queue_runs_per_s {pg:.2f} goal >= 1")


def queue_benchmark(postgres: str, root: Path, quick: bool) -> float:
    repeats, partitions = (1, 5) if quick else (3, 60)
    production = production_instance()
    sqlite_yaml = yaml.safe_dump({"run_coordinator": production["run_coordinator"], "telemetry": {"enabled": False}})
    rates: dict[str, list[float]] = {"postgres": [], "sqlite": []}
    print(f"queue: dagster job backfill of {partitions} partitions of {MODEL}_ingest into the run queue, "
          f"{repeats} time(s)", flush=True)
    models = write_models(root)
    env = {**os.environ, "ML_ASSETS_HOME": str(root / "home"), "ML_ASSETS_MODELS_DIR": str(models)}
    for rep in range(repeats):
        url, name = postgres_database(postgres)
        try:
            print("  PostgreSQL:", end="", flush=True)
            rates["postgres"].append(queue_rate(yaml.safe_dump(production), {
                **env, "ML_ASSETS_DAGSTER_POSTGRES_URL": url}, partitions, dt.date(2013, 2, 1), root / f"pg-{rep}"))
        finally:
            drop_database(postgres, name)
        if not quick:  # the SQLite side is for comparison only
            print("  SQLite:    ", end="", flush=True)
            rates["sqlite"].append(queue_rate(sqlite_yaml, env, partitions, dt.date(2013, 2, 1), root / f"sqlite-{rep}"))
    pg = statistics.median(rates["postgres"])
    if rates["sqlite"]:
        lite = statistics.median(rates["sqlite"])
        print(f"  runs queued per second (median of {repeats}): PostgreSQL {pg:.2f}, SQLite {lite:.2f} "
              f"(PostgreSQL / SQLite {pg / lite:.2f})")
    else:
        print(f"  runs queued per second: PostgreSQL {pg:.2f}")
    return pg


if __name__ == "__main__":
    main()
