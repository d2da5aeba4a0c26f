"""Reading what each model spent from the Dagster instance, and nothing else: its trained
checkpoints' records (the trainer's measure, and the training's decision), the observations of the
partitions that skipped their training (nothing spent), the trials its tuning studies list (each trial's
worker's measure) and its scoring runs (Dagster's start and end of each run that recorded
predictions). Only reads: an embedded instance that holds no run yet is not even opened."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import dagster as dg
import yaml

from ml_assets.pipeline.graph import ModelGraph, Stage
from ml_assets.records.read import every_event
from ml_assets.spec import ModelSpec
from ml_assets.trainer.result import rank_seconds
from ml_assets.training.record import CheckpointRecord
from ml_assets.tuning.record import TunedRecord
from ml_assets.usage.record import Skipped, Spent, team_of

STORAGE_KEYS = ("storage", "run_storage", "event_log_storage")


def open_instance(dagster_home: Path) -> dg.DagsterInstance | None:
    """The instance at ``dagster_home``, or None where nothing has run: an embedded (SQLite) instance
    without its run database, which opening would create."""
    config_file = dagster_home / "dagster.yaml"
    config = (yaml.safe_load(config_file.read_text()) or {}) if config_file.exists() else {}
    if not any(key in config for key in STORAGE_KEYS) and not (dagster_home / "history" / "runs.db").exists():
        return None
    return dg.DagsterInstance.from_config(str(dagster_home))


def collect(instance: dg.DagsterInstance, specs: Sequence[ModelSpec], since: dt.datetime | None) -> list[Spent]:
    """Every training, trial and scoring run of ``specs`` that finished at or after ``since``."""
    found: list[Spent] = []
    for spec in specs:
        found += trainings(instance, spec, since)
        found += skips(instance, spec, since)
        found += trials(instance, spec, since)
        found += scoring(instance, spec, since)
    return found


def trainings(instance: dg.DagsterInstance, spec: ModelSpec, since: dt.datetime | None) -> list[Spent]:
    """Each trained_checkpoint materialization: what its trainer reported (ml_assets.trainer.result),
    and how it trained (full or fine_tune; a record from before decisions: full)."""
    events = list(every_event(instance, ModelGraph(spec).key(Stage.TRAINED_CHECKPOINT), _after(since)))
    runs = run_records(instance, (e.run_id for e in events))
    out = []
    for event in events:
        record = CheckpointRecord.from_metadata(event.asset_materialization.metadata)
        result = record.result
        out.append(Spent(team=_team(runs, event.run_id, spec), model=spec.name, work="training", ref=event.run_id,
                         partition=event.partition_key or "", finished=_iso(event.timestamp),
                         cpu_rank_seconds=result.cpu_rank_seconds, gpu_rank_seconds=result.gpu_rank_seconds,
                         wall_seconds=result.wall_seconds, decision=record.decision_kind,
                         samples_processed=result.samples_processed))
    return out


def skips(instance: dg.DagsterInstance, spec: ModelSpec, since: dt.datetime | None) -> list[Spent]:
    """Each partition that skipped its training (a registered version already held the result of
    the same inputs): its trained_checkpoint observation, which records a cost of nothing."""
    found = [(e, s) for e in _observations(instance, ModelGraph(spec).key(Stage.TRAINED_CHECKPOINT), _after(since))
             if (s := Skipped.from_observation(e.asset_observation.metadata)) is not None]
    runs = run_records(instance, (e.run_id for e, _ in found))
    return [Spent(team=_team(runs, event.run_id, spec), model=spec.name, work="training", ref=event.run_id,
                  partition=event.partition_key or "", finished=_iso(event.timestamp),
                  cpu_rank_seconds=skip.cpu_rank_seconds, gpu_rank_seconds=skip.gpu_rank_seconds,
                  wall_seconds=skip.wall_seconds, decision="skip", samples_processed=skip.samples_processed)
            for event, skip in found]


def _observations(instance: dg.DagsterInstance, key: dg.AssetKey, after_timestamp: float | None,
                  page: int = 500) -> Iterator[dg.EventLogRecord]:
    """Every observation of ``key``, newest first, a page at a time (as every_event reads materializations)."""
    cursor = None
    while True:
        found = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=key, after_timestamp=after_timestamp),
                                            limit=page, cursor=cursor)
        yield from (r for r in found.records if r.asset_observation is not None)
        if not found.has_more:
            return
        cursor = found.cursor


def trials(instance: dg.DagsterInstance, spec: ModelSpec, since: dt.datetime | None) -> list[Spent]:
    """Each finished trial of the model's studies, once: a study continued by a later run lists its
    earlier trials again, and the newest record says most. A trial belongs to the run whose worker
    ran it (else to the run that recorded it)."""
    events = list(every_event(instance, ModelGraph(spec).key(Stage.HYPERPARAMETERS), _after(since)))
    records = [(e, TunedRecord.from_metadata(e.asset_materialization.metadata)) for e in events]
    ran_by = {(r.study_name, t.number): (t.compute.run_id if t.compute and t.compute.run_id else e.run_id)
              for e, r in reversed(records) for t in r.spent()}
    runs = run_records(instance, ran_by.values())
    seen: set[tuple[str, int]] = set()
    out = []
    for event, record in records:  # newest first
        for trial in record.spent():
            key = (record.study_name, trial.number)
            finished = trial.finished or _iso(event.timestamp)
            if key in seen or (since is not None and dt.datetime.fromisoformat(finished) < since):
                continue
            seen.add(key)
            c = trial.compute
            out.append(Spent(team=_team(runs, ran_by[key], spec), model=spec.name, work="trial",
                             ref=f"{record.study_name}#{trial.number}", partition="", finished=finished,
                             cpu_rank_seconds=c.cpu_rank_seconds if c else None,
                             gpu_rank_seconds=c.gpu_rank_seconds if c else None,
                             wall_seconds=c.wall_seconds if c else None))
    return out


def scoring(instance: dg.DagsterInstance, spec: ModelSpec, since: dt.datetime | None) -> list[Spent]:
    """Each run that recorded the model's predictions, from its start to its end (the monitor's step
    with it): one CPU process for that time. A run not finished yet has no seconds."""
    by_run: dict[str, list[dg.EventLogRecord]] = {}
    for event in every_event(instance, ModelGraph(spec).key(Stage.PREDICTIONS), _after(since)):
        by_run.setdefault(event.run_id, []).append(event)
    runs = run_records(instance, by_run)
    out = []
    for run_id, events in by_run.items():
        record = runs.get(run_id)
        wall = (record.end_time - record.start_time) if record and record.start_time and record.end_time else None
        cpu, gpu = rank_seconds("cpu", 1, wall) if wall is not None else (None, None)
        out.append(Spent(team=_team(runs, run_id, spec), model=spec.name, work="scoring", ref=run_id,
                         partition=_days(events), finished=_iso(max(e.timestamp for e in events)), cpu_rank_seconds=cpu,
                         gpu_rank_seconds=gpu, wall_seconds=round(wall, 3) if wall is not None else None))
    return out


def run_records(instance: dg.DagsterInstance, run_ids: Iterable[str]) -> dict[str, dg.RunRecord]:
    """The runs of ``run_ids`` that the instance still holds, by id (a deleted run is left out)."""
    ids = sorted({i for i in run_ids if i})
    found: dict[str, dg.RunRecord] = {}
    for start in range(0, len(ids), 200):
        for record in instance.get_run_records(dg.RunsFilter(run_ids=ids[start:start + 200])):
            found[record.dagster_run.run_id] = record
    return found


def _team(runs: dict[str, dg.RunRecord], run_id: str, spec: ModelSpec) -> str:
    record = runs.get(run_id)
    return team_of(record.dagster_run.tags, spec.team) if record else spec.team


def _days(events: Sequence[dg.EventLogRecord]) -> str:
    """The day a run scored, or the first and last of a run that scored several (a backfill's)."""
    days = sorted({e.partition_key for e in events if e.partition_key})
    return "" if not days else days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"


def _after(since: dt.datetime | None) -> float | None:
    return since.timestamp() if since is not None else None


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).isoformat(timespec="seconds")
