"""The production configuration running for real on loopback (see conftest.py): PostgreSQL-backed
Dagster with its daemon and webserver, the MLflow server on PostgreSQL + S3, artifacts and
checkpoints on S3. The tests share one set of services and run in file order."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import time

import pytest

from ml_assets_tests.helpers import VENV_BIN
from ml_assets_tests.production.conftest import REPO, needs_postgres, wait_for

pytestmark = [needs_postgres, pytest.mark.e2e]

MODEL = "flights_delay"
FIRST = dt.date(2013, 1, 1)
BACKFILL_FROM, BACKFILL_DAYS = dt.date(2013, 3, 1), 24  # days no other test here uses; three times the queue's 8
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


def statuses(instance, run_ids: list[str]) -> dict[str, str]:
    return {run_id: instance.get_run_by_id(run_id).status.value for run_id in run_ids}


def wait_runs(services, run_ids: list[str], timeout: float) -> dict[str, str]:
    with services.instance() as instance:
        return wait_for(lambda: (s := statuses(instance, run_ids)) and all(v in TERMINAL for v in s.values()) and s,
                        timeout, f"runs {run_ids} to finish", interval=1)


def main_commits(services) -> dict[str, str]:
    """Partition -> commit of every validated snapshot merged to main of the version store."""
    from ml_assets.names import repo_for_model
    from ml_assets.versioning import LocalVersionStore

    store = LocalVersionStore(services.home / "versions", objects_url=services.env["ML_ASSETS_OBJECTS_URL"])
    found = {}
    for commit in store.log(repo_for_model(MODEL), "main"):
        if "checks_passed" in commit.metadata:  # the merge validated_snapshot makes after its checks
            found.setdefault(commit.metadata["partition"], commit.id)
    return found


def worker_pid(instance, run_id: str) -> int | None:
    from ml_assets.records.runs import PID_TAG

    run = instance.get_run_by_id(run_id)
    return int(run.tags[PID_TAG]) if PID_TAG in run.tags else None


def step_started(instance, run_id: str, step: str) -> bool:
    from dagster import DagsterEventType

    return any(e.dagster_event.step_key == step for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START))


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def test_four_partition_runs_at_once_through_the_queue(services):
    """Four ingest runs submitted together through the GraphQL API: the daemon's queue launches them,
    each a run worker with the multiprocess executor (chosen by run config; the job's default is
    in-process), all on one PostgreSQL instance. (The queue's limit of 8 at once is the 24-day
    backfill's test below; four multiprocess runs, each a process per step, already share the
    database at once.)"""
    from dagster import DagsterEventType

    client = services.graphql()
    days = [(FIRST + dt.timedelta(days=i)).isoformat() for i in range(4, 8)]  # day 7: a window below
    multiprocess = {"execution": {"config": {"multiprocess": {
        "max_concurrent": 2, "start_method": {"forkserver": {"preload_modules": ["ml_assets.deploy.preload"]}}}}}}
    run_ids = [client.submit_job_execution(f"{MODEL}_ingest", run_config=multiprocess, tags={"dagster/partition": day})
               for day in days]
    final = wait_runs(services, run_ids, timeout=600)
    assert set(final.values()) == {"SUCCESS"}, final
    with services.instance() as instance:
        for run_id, day in zip(run_ids, days, strict=True):
            events = [e.dagster_event.event_type for e in instance.all_logs(run_id) if e.dagster_event]
            assert events.count(DagsterEventType.STEP_SUCCESS) == 3, (day, events)
            assert events.count(DagsterEventType.ASSET_MATERIALIZATION) == 3, (day, events)
            assert DagsterEventType.RUN_SUCCESS in events and DagsterEventType.RUN_FAILURE not in events
            assert instance.get_run_by_id(run_id).tags["ml_assets/model"] == MODEL
            assert any(e == DagsterEventType.STEP_WORKER_STARTED for e in events)  # a process per step
    on_main = main_commits(services)
    assert set(days) <= set(on_main), sorted(on_main)
    for name in ("daemon", "webserver"):
        log = services.log(name)
        assert "database is locked" not in log and "OperationalError" not in log, log[-3000:]




def test_a_run_worker_killed_mid_run_is_detected_and_the_run_resumed(services):
    """SIGKILL the run worker while a step runs: run monitoring sees the dead worker within a few
    polls and resumes the run with a new worker, which finishes it; nothing stays STARTED."""
    from dagster import DagsterEventType

    day = (FIRST + dt.timedelta(days=8)).isoformat()
    run_id = services.graphql().submit_job_execution(f"{MODEL}_ingest", tags={"dagster/partition": day})
    with services.instance() as instance:
        wait_for(lambda: step_started(instance, run_id, f"{MODEL}__raw_data"), 120, "the first step to start")
        pid = worker_pid(instance, run_id)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: any("Resum" in (e.message or "") for e in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)),
                 60, "run monitoring to resume the run")
        detected = time.monotonic() - killed
    final = wait_runs(services, [run_id], timeout=300)
    assert final[run_id] == "SUCCESS", services.log("daemon")[-3000:]
    with services.instance() as instance:
        assert worker_pid(instance, run_id) != pid
    assert day in main_commits(services)
    assert detected < 30, f"the dead worker was noticed only after {detected:.0f} s"


def test_a_run_past_its_max_runtime_is_cancelled_failed_and_alerted(services):
    """dagster/max_runtime: run monitoring terminates the run and marks it failed; the alert sensor
    posts one message naming model, partition, stage and reason, with the run's link."""
    day = (FIRST + dt.timedelta(days=9)).isoformat()
    run_id = services.graphql().submit_job_execution(
        f"{MODEL}_ingest", tags={"dagster/partition": day, "dagster/max_runtime": "3"})
    final = wait_runs(services, [run_id], timeout=180)
    assert final[run_id] == "FAILURE", final
    with services.instance() as instance:
        messages = [e.message or "" for e in instance.all_logs(run_id)]
    assert any("maximum runtime of 3 seconds" in m for m in messages), messages[-10:]
    alert = wait_for(lambda: next((m for m in services.alerts.received
                                   if any(a["run_id"] == run_id for a in m["alerts"])), None),
                     90, "the failure alert")
    assert alert["kind"] == "run_failure"
    (entry,) = alert["alerts"]
    assert entry["model"] == MODEL and entry["partition"] == day
    assert entry["url"].endswith(f"/runs/{run_id}") and entry["url"].startswith("http://127.0.0.1:")
    assert "maximum runtime" in entry["reason"] or entry["stage"] != "run", entry
    assert day not in main_commits(services)  # a cancelled run publishes nothing
    time.sleep(5)  # run retries (crashes only) must leave it alone: it was stopped on purpose
    with services.instance() as instance:
        from dagster import RunsFilter

        assert instance.get_run_by_id(run_id).tags.get("dagster/will_retry") == "false"
        assert not instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": run_id}))


def test_a_run_worker_rebuilds_the_pooled_storage_from_the_instance_ref(services):
    """A run worker builds its instance from the ref the launcher passes: the shipped storage must
    survive that round trip, keep one connection per storage and write through it."""
    from dagster import AssetKey, AssetMaterialization, DagsterInstance
    from sqlalchemy.pool import QueuePool

    from ml_assets.deploy.pg_storage import PooledPostgresStorage

    with services.instance() as instance:
        worker = DagsterInstance.from_ref(instance.get_ref())
        assert isinstance(worker.get_ref().storage, PooledPostgresStorage)
        engines = [worker.run_storage._engine, worker.event_log_storage._engine, worker.schedule_storage._engine]
        assert all(isinstance(engine.pool, QueuePool) for engine in engines)
        worker.report_runless_asset_event(AssetMaterialization("pool_probe", metadata={"n": 1}))
        worker.report_runless_asset_event(AssetMaterialization("pool_probe", metadata={"n": 2}))
        assert engines[1].pool.checkedin() == 1  # both writes went through the one kept connection
        assert instance.fetch_materializations(AssetKey("pool_probe"), limit=5).records[0].asset_materialization.metadata[
            "n"].value == 2
        worker.dispose()


def test_the_bundled_graph_for_two_days_against_postgres_mlflow_server_and_s3(services, monkeypatch):
    """The daily job (raw -> registered model) for two partitions at once: Dagster on PostgreSQL,
    MLflow's server on PostgreSQL with its artifacts in S3, features and checkpoints in S3."""
    import boto3
    import requests
    from mlflow.tracking import MlflowClient

    # The features of the days before each exist: the first test's, the resumed run's.
    days = [(FIRST + dt.timedelta(days=i)).isoformat() for i in (8, 9)]
    client = services.graphql()
    run_ids = [client.submit_job_execution(f"{MODEL}_daily", tags={"dagster/partition": day}) for day in days]
    final = wait_runs(services, run_ids, timeout=900)
    assert set(final.values()) == {"SUCCESS"}, (final, services.log("daemon")[-2000:])

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)  # only boto3 below gets S3 credentials
    registry = MlflowClient(tracking_uri=services.mlflow_url, registry_uri=services.mlflow_url)
    versions = registry.search_model_versions(f"name = '{MODEL}'")
    assert sorted(v.tags["partition"] for v in versions) == days
    s3 = boto3.client("s3", endpoint_url=services.s3_endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")

    def keys(bucket: str, prefix: str) -> list[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    mlflow_objects = keys("mlflow", "artifacts/")
    for version in versions:  # each version's files are in S3 behind the server
        assert any(version.run_id in key for key in mlflow_objects), version
    for day in days:
        assert keys("ml-assets", f"checkpoints/{MODEL}/date={day}/"), day
        assert keys("ml-assets", f"artifacts/{MODEL}/features/date={day}/"), day
    # The steps' stdout/stderr went to S3 through dagster-aws's compute log manager (ml_assets/instance/production.yaml).
    logged = keys("ml-assets", "dagster/compute-logs/")
    for run_id in run_ids:
        assert any(run_id in key for key in logged), (run_id, logged[:5])
    # docs/api.md's MLflow REST calls: a Dagster run's MLflow run, and the model's versions.
    rest = f"{services.mlflow_url}/api/2.0/mlflow"
    auth = services.mlflow_auth  # the server authenticates every request (docs/api.md)
    experiment = requests.get(f"{rest}/experiments/get-by-name", params={"experiment_name": MODEL}, timeout=30,
                              auth=auth).json()
    for run_id, day in zip(run_ids, days, strict=True):
        found = requests.post(f"{rest}/runs/search", timeout=30, auth=auth, json={
            "experiment_ids": [experiment["experiment"]["experiment_id"]],
            "filter": f"tags.dagster_run_id = '{run_id}'"}).json()["runs"]
        assert len(found) == 1, found
        tags = {t["key"]: t["value"] for t in found[0]["data"]["tags"]}
        assert tags["partition"] == day
        assert {m["key"] for m in found[0]["data"]["metrics"]} >= {"test_roc_auc", "val_loss"}
    listed = requests.get(f"{rest}/model-versions/search", params={"filter": f"name='{MODEL}'"}, timeout=30,
                          auth=auth).json()
    assert sorted(v["version"] for v in listed["model_versions"]) == ["1", "2"]
    # The registered model's files come back through the server (the client has no S3 access of its own).
    local = registry.download_artifacts(versions[0].run_id, "model", dst_path=str(services.home / "download"))
    assert os.path.exists(os.path.join(local, "MLmodel"))


def test_a_run_worker_killed_while_it_trains_leaves_no_rank_and_the_resumed_run_registers_once(services):
    """The production path of docs/training.md's process chain: SIGKILL the run worker (it runs the
    training step in process) while its rank exists (one: small_training). Its torchrun agent
    follows it and stops the rank, so none is left 10 s later; run monitoring resumes the run, whose
    training takes the checkpoint lease (S3, conditional writes) and finishes; one version is registered for the day."""
    from mlflow.tracking import MlflowClient

    from ml_assets.processes import start_ticks
    from ml_assets_tests.trainer.toy import training_ranks

    day = (FIRST + dt.timedelta(days=10)).isoformat()  # its window (days 7-9) was ingested above
    run_id = services.graphql().submit_job_execution(f"{MODEL}_daily", tags={"dagster/partition": day})
    with services.instance() as instance:
        wait_for(lambda: len(training_ranks(services.home)) == 1, 300, "the training rank", interval=0.05)
        ranks = training_ranks(services.home)
        os.kill(worker_pid(instance, run_id), signal.SIGKILL)
        try:
            wait_for(lambda: all(start_ticks(pid) is None for pid in ranks), 10, "the killed worker's ranks to exit",
                     interval=0.1)
        finally:  # whatever this found, nothing of it may outlive the test
            for pid in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    final = wait_runs(services, [run_id], timeout=600)
    assert final[run_id] == "SUCCESS", services.log("daemon")[-3000:]
    registry = MlflowClient(tracking_uri=services.mlflow_url, registry_uri=services.mlflow_url)
    assert [v.tags["dagster_run_id"] for v in registry.search_model_versions(f"name = '{MODEL}'")
            if v.tags.get("partition") == day] == [run_id]


def test_a_24_day_backfill_through_the_queue_publishes_every_day(services):
    """`dagster job backfill` of raw -> features for 24 days: 24 runs queued at once, the daemon runs
    8 at a time (each a run worker executing its steps in process, the ingest job's default) on one
    PostgreSQL instance; every run succeeds with all its events, and every day's validated data
    version is on main."""
    import subprocess

    from dagster import DagsterEventType, RunsFilter

    days = [(BACKFILL_FROM + dt.timedelta(days=i)).isoformat() for i in range(BACKFILL_DAYS)]
    started = time.monotonic()
    cli = subprocess.run([str(VENV_BIN / "dagster"), "job", "backfill", "-w", "workspace.yaml", "-j", f"{MODEL}_ingest",
                          "--from", days[0], "--to", days[-1], "--noprompt"],
                         env=services.env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr[-3000:]
    backfill_id = cli.stdout.split("Launched backfill job `")[1].split("`")[0]
    with services.instance() as instance:
        runs = instance.get_runs(RunsFilter(tags={"dagster/backfill": backfill_id}))
        assert sorted(r.tags["dagster/partition"] for r in runs) == days
        run_ids = [r.run_id for r in runs]
    final = wait_runs(services, run_ids, timeout=1500)
    took = time.monotonic() - started
    assert set(final.values()) == {"SUCCESS"}, {k: v for k, v in final.items() if v != "SUCCESS"}
    with services.instance() as instance:
        records = instance.get_run_records(RunsFilter(run_ids=run_ids))
        for run_id in run_ids:  # every event of every run is there, in order
            logs = instance.all_logs(run_id)
            events = [e.dagster_event.event_type for e in logs if e.dagster_event]
            # the ingest job's partitioned config: its steps run in the run worker's process
            assert any("Executing steps in process" in (e.message or "") for e in logs), run_id
            assert events.count(DagsterEventType.STEP_SUCCESS) == 3, (run_id, events)
            assert events.count(DagsterEventType.ASSET_MATERIALIZATION) == 3, (run_id, events)
            assert events.index(DagsterEventType.RUN_START) < events.index(DagsterEventType.RUN_SUCCESS)
    overlap = max_overlap([(r.start_time, r.end_time) for r in records])
    # The queue allows 8; how many overlap depends on how fast runs finish against how fast the
    # daemon launches them, so it is bounded, not fixed.
    assert 2 <= overlap <= 8, f"at most {overlap} runs ran at once; the queue allows 8"
    on_main = main_commits(services)
    assert set(days) <= set(on_main), sorted(set(days) - set(on_main))
    for name in ("daemon", "webserver"):
        log = services.log(name)
        assert "database is locked" not in log and "OperationalError" not in log, log[-3000:]
    print(f"backfill of {len(days)} days: {took:.0f} s, at most {overlap} runs at once")


def backfill_cli(services, start: str, end: str, **popen):
    import subprocess

    args = [str(VENV_BIN / "ml-assets"), "backfill", MODEL, "--start", start, "--end", end]
    if popen:
        return subprocess.Popen(args, env=services.env, cwd=REPO, **popen)
    return subprocess.run(args, env=services.env, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ml_assets_backfill_works_under_run_monitoring_and_a_killed_command_fails_its_run_with_its_name(services):
    """`ml-assets backfill` against the production instance runs each day in its own process. Run
    monitoring (polling every 2 s) watches that process as the run's worker: it leaves the runs of a
    live command alone, and fails the run of a command killed mid-run naming the command, instead of
    resuming a run that has no code origin (which failed every run once its monitoring looked)."""
    import subprocess

    from dagster import DagsterEventType, RunsFilter

    done = backfill_cli(services, "2013-04-01", "2013-04-01")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    with services.instance() as instance:
        runs = instance.get_runs(RunsFilter(tags={"ml_assets/backfill": "2013-04-01..2013-04-01"}))
        assert [r.status.value for r in runs] == ["SUCCESS"]
        for run in runs:
            assert not [e for e in instance.all_logs(run.run_id) if "Resuming run" in (e.message or "")]
    daemon = services.log("daemon")
    assert any(f"Checking run {run.run_id}" in daemon for run in runs), "run monitoring never looked at the runs"

    cli = backfill_cli(services, "2013-04-02", "2013-04-02", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with services.instance() as instance:
            started = wait_for(lambda: [r for r in instance.get_runs(RunsFilter(
                tags={"ml_assets/backfill": "2013-04-02..2013-04-02"})) if r.status.value == "STARTED"], 120,
                "the command's run to start")
            os.kill(cli.pid, signal.SIGKILL)
            cli.wait()
            run_id = started[0].run_id
            wait_for(lambda: instance.get_run_by_id(run_id).status.value == "FAILURE", 60,
                     "run monitoring to fail the killed command's run")
            failure = instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)[-1].message
    finally:
        if cli.poll() is None:
            cli.kill()
    assert "`ml-assets backfill`" in failure and f"pid {cli.pid}" in failure and "run the command again" in failure, failure
    assert "job_origin" not in services.log("daemon")
    again = backfill_cli(services, "2013-04-02", "2013-04-02")
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "1 day(s) ingested" in again.stdout


def test_doctor_checks_each_service_and_names_the_variable_to_fix(services):
    import subprocess

    def doctor(**override: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV_BIN / "ml-assets"), "doctor"], env={**services.env, **override}, cwd=REPO,
                              capture_output=True, text=True, timeout=300)

    healthy = doctor()
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    # The three stores, the MLflow server, the instance's PostgreSQL.
    assert sum(line.startswith("ok ") for line in healthy.stdout.splitlines()) == 5, healthy.stdout
    assert healthy.stdout.strip().endswith("every service answers")

    broken = doctor(ML_ASSETS_CHECKPOINTS_URL="s3://no-such-bucket/checkpoints", MLFLOW_TRACKING_PASSWORD="wrong",
                    ML_ASSETS_DAGSTER_POSTGRES_URL="postgresql+psycopg2://postgres@127.0.0.1:1/dagster")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    failed = [line for line in broken.stdout.splitlines() if line.startswith("FAILED")]
    assert [line.split()[1] for line in failed] == ["ML_ASSETS_CHECKPOINTS_URL", "MLFLOW_TRACKING_URI",
                                                    "ML_ASSETS_DAGSTER_POSTGRES_URL"], broken.stdout
    assert "the bucket does not exist" in broken.stdout and "fix ML_ASSETS_CHECKPOINTS_URL" in broken.stdout
    assert "refused the identity MLFLOW_TRACKING_USERNAME=ml-platform (HTTP 401)" in broken.stdout, broken.stdout
    assert "fix ML_ASSETS_DAGSTER_POSTGRES_URL" in broken.stdout
    assert broken.stderr.strip().splitlines()[-1] == (
        "ml-assets doctor: 3 check(s) failed; a run would fail on the first of them")
