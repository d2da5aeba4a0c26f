"""The fault matrix: each service the platform stands on SIGKILLed as a stage of a daily run starts,
and brought back seconds later, in production mode on loopback (a private PostgreSQL cluster for
Dagster and MLflow, the MLflow server with its authentication, moto's S3 behind a proxy that is the
thing killed, the Dagster daemon, the run worker).

Each cell asserts what docs/operations.md promises ("When a service fails"):
1. the run succeeds, or fails with the fault named in its reason;
2. nothing is half-written: the stores are whole (``ml-assets verify``'s check: every object of
   main's history, every version's files and chain, every alias), and every checkpoint that has a
   manifest matches it;
3. the partition run again succeeds, and exactly one version is registered for the day, the one
   Dagster's registered_model records;
4. no training rank is left.

`make test-faults` runs every cell (ML_ASSETS_FAULT_MATRIX=full), or the cells it names
(``ML_ASSETS_FAULT_MATRIX="daemon@training,s3@checkpoint write" make test-faults``); the suite runs
the cells that exercise distinct code paths (CI_CELLS).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import logging
import os
import re
import signal
import subprocess
import time
import uuid

import pytest

from ml_assets_tests.helpers import VENV_BIN, small_training
from ml_assets_tests.production.conftest import POSTGRES, REPO, start_services, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not POSTGRES, reason="ML_ASSETS_TEST_POSTGRES_URL is not set")]

MODEL = "flights_delay"
STAGES = {"ingest commit": "raw_data", "snapshot publish": "validated_snapshot", "features write": "features",
          "training": "trained_checkpoint", "checkpoint write": "trained_checkpoint",
          "evaluation": "evaluation_report", "registration": "registered_model", "promotion": "production_model"}
"""Each stage and the step whose start (training: its rank's first second; checkpoint write: the
first file of this day's first checkpoint in the store) is the moment of the kill."""
SERVICES = ("postgres", "mlflow", "s3", "daemon", "run worker")
CI_CELLS = {("s3", "features write"), ("postgres", "training")}  # `make test-faults`: the rest

def chosen_cells(setting: str) -> list[tuple[str, str]]:
    every = [(service, stage) for service in SERVICES for stage in STAGES]
    if setting == "full":
        return every
    if not setting:
        return [cell for cell in every if cell in CI_CELLS]
    named = [tuple(part.strip().split("@", 1)) for part in setting.split(",") if part.strip()]
    unknown = [cell for cell in named if cell not in every]
    if unknown:
        raise pytest.UsageError(f"ML_ASSETS_FAULT_MATRIX names no such cell: {unknown}; a cell is SERVICE@STAGE, "
                                f"SERVICE one of {list(SERVICES)}, STAGE one of {list(STAGES)}")
    return [cell for cell in every if cell in named]


CELLS = chosen_cells(os.environ.get("ML_ASSETS_FAULT_MATRIX", ""))
FIRST = dt.date(2013, 6, 3)  # days no other test uses; cell i trains FIRST + i, its window the 3 days before
OUTAGE_S = 8
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


def cell_day(i: int) -> str:
    return (FIRST + dt.timedelta(days=i)).isoformat()


@pytest.fixture(scope="module")
def world(tmp_path_factory, s3_endpoint, bundled_spec_dict):
    from ml_assets_tests.faults.services import PrivateCluster, Proxy

    spec = small_training(copy.deepcopy(bundled_spec_dict))
    spec["promotion"]["mode"] = "approval_required"  # a promotion is its own cell, not a side effect
    root = tmp_path_factory.mktemp("faults")
    cluster = PrivateCluster()
    cluster.start()
    (root / "logs").mkdir()
    proxy = Proxy(s3_endpoint, root / "logs")
    proxy.start()
    made = lambda prefix: cluster.create_database(f"{prefix}_{uuid.uuid4().hex[:8]}")  # noqa: E731
    try:
        with start_services(root / "services", made, proxy.endpoint, [spec], postgres_url=cluster.url) as svc:
            _ingest_windows(svc)
            yield svc, cluster, proxy, s3_endpoint
    finally:
        proxy.kill()
        cluster.stop()


def _ingest_windows(svc) -> None:
    """The three days before each cell's day, by `ml-assets backfill` (its runs in one process, on the
    production instance): a run worker per day through the queue cost a minute more on 2 cores."""
    start, end = FIRST - dt.timedelta(days=3), FIRST + dt.timedelta(days=len(CELLS) - 2)
    filled = subprocess.run([str(VENV_BIN / "ml-assets"), "backfill", MODEL, "--start", start.isoformat(),
                             "--end", end.isoformat()], env=svc.env, cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    assert filled.returncode == 0, filled.stderr[-3000:]


def wait_runs(svc, run_ids: list[str], timeout: float) -> dict[str, str]:
    def statuses():
        with contextlib.suppress(Exception), svc.instance() as instance:
            found = {r: instance.get_run_by_id(r).status.value for r in run_ids}
            return found if all(v in TERMINAL for v in found.values()) else None
        return None

    return wait_for(statuses, timeout, f"runs {run_ids} to finish", interval=2)


def started(svc, run_id: str, step: str) -> int | None:
    """The run worker's pid once ``step`` has started, else None."""
    from dagster import DagsterEventType

    from ml_assets.records.runs import PID_TAG

    with svc.instance() as instance:
        if any(e.dagster_event.step_key == step for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)):
            return int(instance.get_run_by_id(run_id).tags.get(PID_TAG, 0)) or -1
    return None


def outage(svc, cluster, proxy, service: str, worker: int) -> None:
    """SIGKILL ``service``; bring it back OUTAGE_S seconds later (the run worker: run monitoring does)."""
    from ml_assets_tests.production.conftest import _http_ok

    if service == "run worker":
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
        return
    {"postgres": cluster.kill, "s3": proxy.kill}.get(service, lambda: svc.kill(service))()
    time.sleep(OUTAGE_S)
    {"postgres": cluster.start, "s3": proxy.start}.get(service, lambda: svc.restart(service))()
    if service == "mlflow":
        wait_for(lambda: _http_ok(f"{svc.mlflow_url}/health"), 120, "the MLflow server to come back")


def failure_reason(svc, run_id: str) -> str:
    """The run's reason as the failure alert gives it: its failed step's innermost error."""
    from ml_assets.deploy.alerts.failures import describe

    with svc.instance() as instance:
        return describe(instance, instance.get_run_by_id(run_id), "").reason


def whole(svc) -> list[str]:
    """What ``ml-assets verify`` finds, and every checkpoint with a manifest that does not match it."""
    import fsspec
    from mlflow.tracking import MlflowClient

    from ml_assets.trainer.checkpoint_files import MANIFEST, verify
    from ml_assets.verification.check import check
    from ml_assets.versioning import LocalVersionStore

    with pytest.MonkeyPatch.context() as env:  # S3 as the services reach it
        env.setenv("AWS_ENDPOINT_URL", svc.s3_endpoint)
        store = LocalVersionStore(svc.home / "versions", objects_url=svc.env["ML_ASSETS_OBJECTS_URL"])
        client = MlflowClient(tracking_uri=svc.mlflow_url, registry_uri=svc.mlflow_url)
        problems = [f.line() for f in check(client, store, MODEL).findings]
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        for manifest in fs.glob(f"ml-assets/checkpoints/{MODEL}/**/{MANIFEST}"):
            directory = "s3://" + manifest.rsplit("/", 1)[0]
            _, reason = verify(directory)
            if reason:
                problems.append(f"checkpoint {directory}: {reason}")
    return problems


def registered(svc, day: str) -> tuple[list[str], str | None]:
    """The registry's versions for ``day``, and the version Dagster's registered_model last recorded."""
    import dagster as dg
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=svc.mlflow_url, registry_uri=svc.mlflow_url)
    versions = [str(v.version) for v in client.search_model_versions(f"name = '{MODEL}'")
                if v.tags.get("partition") == day]
    with svc.instance() as instance:
        records = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey([MODEL, "registered_model"]), asset_partitions=[day]), limit=1).records
    recorded = records[0].asset_materialization.metadata.get("model_version") if records else None
    return versions, str(recorded.value) if recorded is not None else None


@pytest.mark.parametrize(("service", "stage"), CELLS, ids=[f"{s}-at-{t.replace(' ', '-')}" for s, t in CELLS])
def test_a_service_killed_as_a_stage_starts(world, service, stage):
    svc, cluster, proxy, s3 = world
    day = cell_day(CELLS.index((service, stage)))
    seen = {"service": service, "stage": stage, "day": day}
    try:
        run_cell(svc, lambda worker: outage(svc, cluster, proxy, service, worker), s3, service, stage, day, seen)
    finally:
        report(seen)
        if stage == "promotion":  # the next cells' candidates are gated against no champion again
            no_champion(svc)


def run_cell(svc, kill, s3: str, service: str, stage: str, day: str, seen: dict) -> None:
    from ml_assets_tests.trainer.toy import training_ranks

    submit = _promotion(svc, day) if stage == "promotion" else lambda: svc.graphql().submit_job_execution(
        f"{MODEL}_daily", tags={"dagster/partition": day})
    run_id = submit()
    worker = wait_for(lambda: started(svc, run_id, f"{MODEL}__{STAGES[stage]}"), 600, f"{stage} to start", interval=0.2)
    if stage == "training":  # mid-epoch: once the rank runs
        wait_for(lambda: training_ranks(svc.home), 120, "the training rank", interval=0.1)
        time.sleep(1)
    if stage == "checkpoint write":
        wait_for(lambda: checkpoint_begun(s3, day), 300, "this day's first checkpoint file", interval=0.05)
    kill(worker)
    seen["run"] = status = wait_runs(svc, [run_id], 900)[run_id]
    seen["said"] = said(svc, run_id)
    if status != "SUCCESS":
        seen["reason"] = reason = failure_reason(svc, run_id)
        assert SERVICE_WORDS[service].search(reason), f"{service} at {stage}: the run failed with {reason!r}"
    seen["problems"] = whole(svc)
    assert seen["problems"] == []
    if status != "SUCCESS":
        again = submit()
        seen["rerun"] = wait_runs(svc, [again], 900)[again]
        assert seen["rerun"] == "SUCCESS", failure_reason(svc, again)
        seen["problems"] = whole(svc)
        assert seen["problems"] == []
    versions, recorded = registered(svc, day)
    seen["versions"], seen["recorded"] = versions, recorded
    assert len(versions) == 1 and versions == [recorded], (versions, recorded)
    if stage == "promotion":
        seen["champion"], seen["recorded_champion"] = champion(svc)
        assert seen["champion"] == seen["recorded_champion"] == recorded, seen
    wait_for(lambda: not training_ranks(svc.home), 30, "no training rank to be left")
    seen["ranks_left"] = 0


SAID = re.compile(r"not answering|did not answer|Resumed run|zygote exited|took over|resum", re.I)


def said(svc, run_id: str) -> list[str]:
    """What the run's log told its user of the fault: the first two distinct warnings, or lines about
    a wait, a retry or a resumption (the report's "what you see")."""
    with svc.instance() as instance:
        events = instance.all_logs(run_id)
    lines = [re.sub(r"\?[^\"\s)]*", "?…", " ".join(e.user_message.split()))[:240] for e in events  # no queries
             if e.user_message and (e.level >= logging.WARNING or SAID.search(e.user_message))]
    return list(dict.fromkeys(lines))[:2]


def checkpoint_begun(s3: str, day: str) -> bool:
    """Whether a file of a checkpoint of ``day`` is in the store (read past the proxy, which is what
    an S3 outage kills)."""
    import boto3

    listing = boto3.client("s3", endpoint_url=s3).list_objects_v2(
        Bucket="ml-assets", Prefix=f"checkpoints/{MODEL}/date={day}/")
    return any("/step-" in item["Key"] for item in listing.get("Contents", []))


def _promotion(svc, day: str):
    """The promotion cell: the day trains and registers without a fault, from no champion (so that its
    gate, like a first model's, is against none); then the promotion of its version is the run."""


    no_champion(svc)
    daily = svc.graphql().submit_job_execution(f"{MODEL}_daily", tags={"dagster/partition": day})
    assert wait_runs(svc, [daily], 900)[daily] == "SUCCESS", failure_reason(svc, daily)
    version = registered(svc, day)[1]
    config = {"ops": {f"{MODEL}__production_model": {"config": {
        "action": "promote", "version": version, "reason": "the fault matrix", "actor": "test"}}}}
    return lambda: svc.graphql().submit_job_execution(f"{MODEL}_promote", run_config=config)


def no_champion(svc) -> None:
    from mlflow.tracking import MlflowClient

    from ml_assets.registry.versions import CHAMPION

    client = MlflowClient(tracking_uri=svc.mlflow_url, registry_uri=svc.mlflow_url)
    with contextlib.suppress(Exception):  # none yet
        client.delete_registered_model_alias(MODEL, CHAMPION)


def champion(svc) -> tuple[str | None, str | None]:
    """@champion in the registry, and the version Dagster's production_model last recorded."""
    import dagster as dg
    from mlflow.tracking import MlflowClient

    from ml_assets.registry.versions import CHAMPION

    client = MlflowClient(tracking_uri=svc.mlflow_url, registry_uri=svc.mlflow_url)
    alias = str(client.get_model_version_by_alias(MODEL, CHAMPION).version)
    with svc.instance() as instance:
        records = instance.fetch_materializations(dg.AssetKey([MODEL, "production_model"]), limit=1).records
    recorded = records[0].asset_materialization.metadata.get("champion_version") if records else None
    return alias, str(recorded.value) if recorded is not None else None


def report(seen: dict) -> None:
    """One JSON line per cell in $ML_ASSETS_FAULT_REPORT (`make test-faults` sets it): what happened,
    whatever the assertions said."""
    path = os.environ.get("ML_ASSETS_FAULT_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(seen, sort_keys=True) + "\n")


SERVICE_WORDS = {
    "postgres": re.compile(r"PostgreSQL|postgres|database", re.I),
    "mlflow": re.compile(r"MLflow", re.I),
    "s3": re.compile(r"object store|S3|endpoint", re.I),
    "daemon": re.compile(r"daemon", re.I),
    "run worker": re.compile(r"worker", re.I),
}
