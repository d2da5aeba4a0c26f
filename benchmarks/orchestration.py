"""How fast a backfill queues runs on the production instance (PostgreSQL), beside the embedded
SQLite instance.

    python -m benchmarks.orchestration [--quick]

``dagster job backfill`` of 60 partitions of ``<model>_ingest`` into the production instance's run
queue (deploy/production/dagster.yaml) on a fresh PostgreSQL database (ML_ASSETS_TEST_POSTGRES_URL;
the daemon is not running, so the runs stay queued and are deleted afterwards): runs queued per
second, from the runs' creation times; the same on a SQLite instance side by side. Three runs each;
medians.

Issue 9 also asks for the wall time of the bundled graph through Dagster against its stages as plain
functions, and the executor's per-step overhead: not measured yet (the training stage reports through
Dagster Pipes, so it has no plain-function form to compare against); see benchmarks/README.md.

Ends with:
    RESULT orchestration_queue_runs_per_s <runs/s on PostgreSQL> goal >= 1
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import yaml

from ml_assets.settings import BUNDLED_MODELS_DIR

REPO = Path(__file__).resolve().parents[1]
MODEL = "flights_delay"
VENV_BIN = Path(sys.executable).parent


def write_models(root: Path) -> Path:
    (root / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(BUNDLED_MODELS_DIR / f"{MODEL}.yaml", root / "models" / f"{MODEL}.yaml")
    return root / "models"


def queue_rate(instance_yaml: str, env: dict[str, str], partitions: int, first: dt.date, where: Path) -> float:
    """Runs queued per second by `dagster job backfill` (creation times of its runs)."""
    import dagster as dg

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
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with dg.DagsterInstance.from_config(str(where)) as instance:
            records = instance.get_run_records()
            created = sorted(r.create_timestamp.timestamp() for r in records)
            statuses = {r.dagster_run.status.value for r in records}
            for record in records:
                instance.delete_run(record.dagster_run.run_id)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert len(created) == partitions, (len(created), partitions)
    print(f"    {partitions} runs {sorted(statuses)} in {created[-1] - created[0]:.1f} s")
    return (len(created) - 1) / (created[-1] - created[0])


def postgres_database(base_url: str) -> tuple[str, str]:
    """A fresh database on the server of ``base_url``: (its psycopg2 URL for Dagster, its name)."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(base_url)
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"bench_orchestration_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(drivername="postgresql+psycopg2", database=name).render_as_string(hide_password=False), name


def drop_database(base_url: str, name: str) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    admin = make_url(base_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 partitions, one repetition")
    args = parser.parse_args(argv)
    postgres = os.environ.get("ML_ASSETS_TEST_POSTGRES_URL")
    if not postgres:
        raise SystemExit("benchmarks.orchestration needs PostgreSQL: set ML_ASSETS_TEST_POSTGRES_URL "
                         "(postgresql+psycopg://user@127.0.0.1:5432/db; .ci/run sets it)")
    repeats, partitions = (1, 10) if args.quick else (3, 60)
    production = yaml.safe_load((REPO / "deploy" / "production" / "dagster.yaml").read_text())
    sqlite_yaml = yaml.safe_dump({"run_coordinator": production["run_coordinator"], "telemetry": {"enabled": False}})
    rates: dict[str, list[float]] = {"postgres": [], "sqlite": []}
    print(f"orchestration: dagster job backfill of {partitions} partitions of {MODEL}_ingest into the run queue, "
          f"{repeats} time(s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-orchestration-") as tmp:
        root = Path(tmp)
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
            print("  SQLite:    ", end="", flush=True)
            rates["sqlite"].append(queue_rate(sqlite_yaml, env, partitions, dt.date(2013, 2, 1), root / f"sqlite-{rep}"))
    pg, lite = statistics.median(rates["postgres"]), statistics.median(rates["sqlite"])
    print(f"runs queued per second (median of {repeats}): PostgreSQL {pg:.2f}, SQLite {lite:.2f} "
          f"(PostgreSQL / SQLite {pg / lite:.2f})")
    print(f"RESULT orchestration_queue_runs_per_s {pg:.2f} goal >= 1")


if __name__ == "__main__":
    main()
