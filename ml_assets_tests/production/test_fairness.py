"""Teams share the run queue fairly, on the real daemon and PostgreSQL.

The production instance as shipped (ml_assets/instance/production.yaml), with room for 3 runs at
once: runs that train carry their team (ml_assets/training_team, at most 2 at once per team) and
their priority (dagster/priority, from the spec; a higher one is dequeued first). Team A backfills
3 days of its model at low priority; team B submits one retrain of its own model, and A an urgent
retrain of its own. Tiny models, one rank each.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import subprocess

import pytest
import yaml

from ml_assets_tests.helpers import VENV_BIN, small_training
from ml_assets_tests.production.conftest import (
    POSTGRES,
    REPO,
    dagster_yaml,
    private_postgres,
    start_services,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not POSTGRES, reason="ML_ASSETS_TEST_POSTGRES_URL is not set")]

FIRST = dt.date(2013, 2, 1)
BACKFILL_DAYS = 3  # two start at once, one waits behind them: the urgent retrain must overtake it
WINDOW = 3
MAX_RUNS, PER_TEAM = 3, 2
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


def team_model(data: dict, name: str, team: str, priority: str) -> dict:
    spec = small_training(copy.deepcopy(data), window_days=WINDOW, epochs=1)
    spec.update(name=name, team=team, priority=priority)
    spec["training"].update(processes_per_node=1)
    spec["promotion"]["mode"] = "approval_required"  # runs evaluate side by side (see conftest)
    return spec


def instance_config() -> str:
    config = yaml.safe_load(dagster_yaml())
    runs = config["concurrency"]["runs"]
    runs["max_concurrent_runs"] = MAX_RUNS
    [limit] = [c for c in runs["tag_concurrency_limits"] if c["key"] == "ml_assets/training_team"]
    assert limit["limit"] == PER_TEAM and limit["value"] == {"applyLimitPerUniqueValue": True}
    return yaml.safe_dump(config, sort_keys=False)


@pytest.fixture(scope="module")
def teams(tmp_path_factory, s3_endpoint, bundled_spec_dict):
    specs = [team_model(bundled_spec_dict, "a_delays", "team-a", "normal"),
             team_model(bundled_spec_dict, "b_delays", "team-b", "high")]
    with private_postgres() as (make, url), start_services(
            tmp_path_factory.mktemp("fairness"), make, s3_endpoint, specs, instance=instance_config(),
            postgres_url=url) as svc:
        yield svc


def backfill(svc, job: str, start: dt.date, end: dt.date, tags: dict[str, str] | None = None) -> str:
    cli = subprocess.run([str(VENV_BIN / "dagster"), "job", "backfill", "-w", "workspace.yaml", "-j", job,
                          "--from", start.isoformat(), "--to", end.isoformat(), "--noprompt",
                          *(["--tags", json.dumps(tags)] if tags else [])],
                         env=svc.env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    return cli.stdout.split("Launched backfill job `")[1].split("`")[0]


def records(svc, **tags: str) -> list:
    from dagster import RunsFilter

    with svc.instance() as instance:
        return list(instance.get_run_records(RunsFilter(tags=tags)))


def wait_done(svc, run_records: list, timeout: float) -> list:
    from dagster import RunsFilter

    ids = [r.dagster_run.run_id for r in run_records]

    def done():
        with svc.instance() as instance:
            now = instance.get_run_records(RunsFilter(run_ids=ids))
        return now if all(r.dagster_run.status.value in TERMINAL for r in now) and len(now) == len(ids) else None

    return wait_for(done, timeout, f"{len(ids)} runs to end", interval=2)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    now = peak = 0
    for _, step in edges:  # an end before a start at the same instant: -1 sorts first
        now += step
        peak = max(peak, now)
    return peak


def test_one_teams_backfill_leaves_another_teams_retrain_waiting_no_longer_than_one_slot(teams):
    last = FIRST + dt.timedelta(days=BACKFILL_DAYS - 1)
    # Every day the trainings read first (their windows' features), ingested by `ml-assets backfill`
    # (in one process, on the same instance): what is measured is the training runs' queue.
    urgent_day = last + dt.timedelta(days=1)
    for model, start, end in (("a_delays", FIRST - dt.timedelta(days=WINDOW), urgent_day),
                              ("b_delays", last - dt.timedelta(days=WINDOW), last)):
        filled = subprocess.run([str(VENV_BIN / "ml-assets"), "backfill", model, "--start", start.isoformat(),
                                 "--end", end.isoformat()], env=teams.env, cwd=REPO, capture_output=True,
                                text=True, timeout=600)
        assert filled.returncode == 0, filled.stderr[-3000:]

    # Team A: days of history at low priority (what docs/deployment.md tells a backfill to carry).
    history = backfill(teams, "a_delays_daily", FIRST, last, tags={"dagster/priority": "-10"})
    wait_for(lambda: sum(r.dagster_run.status.value == "STARTED" for r in records(teams, **{"dagster/backfill": history}))
             == PER_TEAM, 180, "team A's backfill to fill its two training slots")
    client = teams.graphql()
    # Team B's retrain (its spec's priority: high), and team A's own urgent retrain of the next day.
    b_run = client.submit_job_execution("b_delays_daily", tags={"dagster/partition": last.isoformat()})
    a_urgent = client.submit_job_execution("a_delays_daily", tags={"dagster/partition": urgent_day.isoformat(),
                                                                    "dagster/priority": "20"})

    backfilled = wait_for(lambda: (found := records(teams, **{"dagster/backfill": history}))
                          and len(found) == BACKFILL_DAYS and found, 120, "every backfill run to be queued")
    everything = wait_done(teams, [*backfilled, *records(teams, **{"ml_assets/team": "team-b"}),
                                   *[r for r in records(teams, **{"ml_assets/team": "team-a"})
                                     if r.dagster_run.run_id == a_urgent]], timeout=1500)
    statuses = {r.dagster_run.run_id: r.dagster_run.status.value for r in everything}
    assert set(statuses.values()) == {"SUCCESS"}, {k: v for k, v in statuses.items() if v != "SUCCESS"}
    by_id = {r.dagster_run.run_id: r for r in everything}
    a_runs = [r for r in everything if r.dagster_run.tags["ml_assets/team"] == "team-a"]
    assert len(a_runs) == BACKFILL_DAYS + 1

    # No team trained more runs at once than its limit, and the queue never ran more than its room.
    assert most_at_once([(r.start_time, r.end_time) for r in a_runs]) <= PER_TEAM
    assert most_at_once([(r.start_time, r.end_time) for r in everything]) <= MAX_RUNS

    # B waited no longer than the next slot that freed (here a slot was free: A may hold only two).
    b = by_id[b_run]
    a_ends = sorted(r.end_time for r in a_runs if r.end_time > b.create_timestamp.timestamp())
    next_slot = max(b.create_timestamp.timestamp(), min(a_ends)) if a_ends else b.create_timestamp.timestamp()
    waited = b.start_time - b.create_timestamp.timestamp()
    assert b.start_time <= next_slot + 5, f"team B's retrain waited {waited:.1f} s"

    # A's urgent retrain went ahead of A's own queued history: no backfill run that was still queued
    # when it was submitted started before it (one dequeued just before may start up to a few
    # seconds after: its worker was starting).
    urgent = by_id[a_urgent]
    overtaken = [r.dagster_run.tags["dagster/partition"] for r in a_runs
                 if r.dagster_run.run_id != a_urgent and r.start_time > urgent.create_timestamp.timestamp() + 5
                 and r.start_time < urgent.start_time]
    assert overtaken == [], f"backfill runs dequeued before the urgent retrain: {overtaken}"
    print(f"team B's retrain waited {waited:.1f} s; the urgent retrain "
          f"{urgent.start_time - urgent.create_timestamp.timestamp():.1f} s; "
          f"{BACKFILL_DAYS} backfill runs from {min(r.start_time for r in a_runs):.0f} to "
          f"{max(r.end_time for r in a_runs):.0f} ({max(r.end_time for r in a_runs) - min(r.start_time for r in a_runs):.0f} s)")
