"""What each team spent, read back from real records in a real Dagster instance: the records are the
product's own types, written by real runs that carry the tags a model's jobs give them."""

import dataclasses
import datetime as dt
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest

from ml_assets.instance import LOCAL_INSTANCE
from ml_assets.pipeline.graph import ModelGraph, Stage
from ml_assets.pipeline.jobs import job_tags
from ml_assets.records.base import Record
from ml_assets.records.read import latest
from ml_assets.trainer.result import rank_seconds
from ml_assets.training.record import CheckpointRecord
from ml_assets.tuning.record import SpentTrial, TrialCompute, TunedRecord, run_totals
from ml_assets.usage import command
from ml_assets.usage.collect import collect, open_instance
from ml_assets.usage.report import render, summarize
from ml_assets_tests.helpers import model_spec, spec_data, write_spec
from ml_assets_tests.records.test_round_trip import RECORDS, RESULT

ALPHA, BETA = model_spec(name="alpha", team="fraud"), model_spec(name="beta", team="search")
ALPHA_BEFORE = model_spec(name="alpha", team="legacy")  # alpha while it belonged to another team
DAY = "2013-02-04"
PARTITIONS = dg.DailyPartitionsDefinition(start_date="2013-01-01")


def _materialize(instance: dg.DagsterInstance, spec, stage: Stage, make: Callable[[dg.AssetExecutionContext], Record],
                 tags: dict[str, str] | None, partitioned: bool = True) -> str:
    """A real run that records ``make(context)`` as the stage's materialization: the run id."""
    @dg.asset(key=ModelGraph(spec).key(stage), partitions_def=PARTITIONS if partitioned else None)
    def stand_in(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata=make(context).to_metadata())

    result = dg.materialize([stand_in], instance=instance, tags=tags, partition_key=DAY if partitioned else None)
    assert result.success
    return result.run_id


def _training(device: str, ranks: int, wall: float):
    cpu, gpu = rank_seconds(device, ranks, wall)
    result = dataclasses.replace(RESULT, device=device, world_size=ranks, wall_seconds=wall, cpu_rank_seconds=cpu,
                                 gpu_rank_seconds=gpu)
    return dataclasses.replace(RECORDS["trained_checkpoint"], result=result)


def _entry(number: int, state: str, compute: TrialCompute | None, finished: str | None = None) -> dict:
    spent = SpentTrial(number=number, state=state, finished=compute.finished if compute else finished, compute=compute)
    return {"trial": number, "state": state, "value": 0.5, "epochs": 1, "params": {}, **spent.as_entry()}


def _study(entries: list[dict], run_id: str) -> TunedRecord:
    spent = [SpentTrial.from_entry(e) for e in entries]
    return dataclasses.replace(RECORDS["hyperparameters"], study_name="alpha-study", trials=entries,
                               **run_totals(spent, run_id))


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A Dagster home where alpha (team fraud, earlier legacy) trained and tuned and beta (search)
    trained on a GPU and scored, by real runs; one of each kind of record from before seconds."""
    home = tmp_path_factory.mktemp("usage") / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(LOCAL_INSTANCE.read_text())
    instance = dg.DagsterInstance.from_config(str(home))
    trains, scores = job_tags(ALPHA, trains=True), job_tags(BETA, trains=False)
    _materialize(instance, ALPHA, Stage.TRAINED_CHECKPOINT, lambda _: _training("cpu", 2, 30.25), trains)
    before_seconds = dataclasses.replace(RESULT, wall_seconds=None, cpu_rank_seconds=None, gpu_rank_seconds=None)
    _materialize(instance, ALPHA, Stage.TRAINED_CHECKPOINT,
                 lambda _: dataclasses.replace(RECORDS["trained_checkpoint"], result=before_seconds), trains)
    _materialize(instance, BETA, Stage.TRAINED_CHECKPOINT, lambda _: _training("cuda:0", 2, 12.5),
                 job_tags(BETA, trains=True))

    def first_study(context):  # trials 0 and 1, ran by this run's worker; 2 still running
        mine = [TrialCompute.measured(context.run_id, "cpu", 1, w) for w in (4.0, 1.5)]
        return _study([_entry(0, "COMPLETE", mine[0]), _entry(1, "PRUNED", mine[1]),
                       {"trial": 2, "state": "RUNNING"}], context.run_id)

    def continued(context):  # the same study: its trials again, 2 done here, 3 failed unmeasured long ago
        before = latest(context.instance, context.asset_key, None, TunedRecord).trials[:2]
        mine = TrialCompute.measured(context.run_id, "cuda", 2, 2.25)
        return _study([*before, _entry(2, "COMPLETE", mine),
                       _entry(3, "FAIL", None, finished="2020-01-01T00:00:00+00:00")], context.run_id)

    _materialize(instance, ALPHA, Stage.HYPERPARAMETERS, first_study, job_tags(ALPHA_BEFORE, trains=False), False)
    _materialize(instance, ALPHA, Stage.HYPERPARAMETERS, continued, job_tags(ALPHA, trains=False), False)

    def scored(_):
        time.sleep(0.2)  # a run that lasts
        return RECORDS["predictions"]

    _materialize(instance, BETA, Stage.PREDICTIONS, scored, scores)
    _materialize(instance, BETA, Stage.PREDICTIONS, scored, None)  # by hand: no job tags, the spec's team
    instance.dispose()
    return home


@pytest.fixture
def instance(home: Path):
    instance = open_instance(home)
    yield instance
    instance.dispose()


def _events(instance, spec, stage: Stage) -> list[dg.EventLogRecord]:
    return list(instance.fetch_materializations(ModelGraph(spec).key(stage), limit=100).records)


def test_each_training_counts_what_its_trainer_reported_for_the_team_its_run_carried(instance):
    found = [i for i in collect(instance, [ALPHA, BETA], None) if i.work == "training"]
    expected = {}
    for spec in (ALPHA, BETA):
        for event in _events(instance, spec, Stage.TRAINED_CHECKPOINT):
            result = CheckpointRecord.from_metadata(event.asset_materialization.metadata).result
            expected[event.run_id] = (spec.name, spec.team, result.cpu_rank_seconds, result.gpu_rank_seconds,
                                      result.wall_seconds)
    assert {i.ref: (i.model, i.team, i.cpu_rank_seconds, i.gpu_rank_seconds, i.wall_seconds) for i in found} == expected
    # What the GPU held is GPU time; the record from before seconds were reported has none.
    assert sorted((i.cpu_rank_seconds, i.gpu_rank_seconds) for i in found if i.wall_seconds) == [(0.0, 25.0),
                                                                                              (60.5, 0.0)]
    assert [i.wall_seconds for i in found].count(None) == 1


def test_each_finished_trial_counts_once_for_the_team_of_the_run_that_ran_it(instance):
    found = {i.ref: i for i in collect(instance, [ALPHA], None) if i.work == "trial"}
    assert sorted(found) == [f"alpha-study#{n}" for n in range(4)]  # 2 once, though both records list it
    newest = latest(instance, ModelGraph(ALPHA).key(Stage.HYPERPARAMETERS), None, TunedRecord)
    for trial in newest.spent():
        item = found[f"alpha-study#{trial.number}"]
        measured = trial.compute
        assert (item.cpu_rank_seconds, item.gpu_rank_seconds, item.wall_seconds) == (
            (measured.cpu_rank_seconds, measured.gpu_rank_seconds, measured.wall_seconds) if measured else (None,) * 3)
    assert {n: found[f"alpha-study#{n}"].team for n in range(4)} == {0: "legacy", 1: "legacy", 2: "fraud", 3: "fraud"}
    # The hyperparameters materialization shows the trials its own run ran.
    assert (newest.trials_run, newest.gpu_rank_seconds, newest.cpu_rank_seconds) == (1, 4.5, 0.0)


def test_a_scoring_run_counts_its_dagster_start_to_end_on_one_cpu(instance):
    found = [i for i in collect(instance, [BETA], None) if i.work == "scoring"]
    assert len(found) == 2
    for item in found:
        stats = instance.get_run_stats(item.ref)
        assert item.wall_seconds == round(stats.end_time - stats.start_time, 3) >= 0.2
        assert (item.cpu_rank_seconds, item.gpu_rank_seconds, item.partition) == (item.wall_seconds, 0.0, DAY)
    assert {i.team for i in found} == {"search"}  # the run by hand takes the spec's team


def test_totals_per_team_and_model_add_up_the_items(instance):
    items = collect(instance, [ALPHA, BETA], None)
    document = json.loads(json.dumps(summarize(items)))
    teams = {t["team"]: t for t in document["teams"]}
    assert sorted(teams) == ["fraud", "legacy", "search"]
    for name, team in teams.items():
        mine = [i for i in items if i.team == name]
        assert team["total"]["count"] == len(mine)
        assert team["total"]["unmeasured"] == sum(i.wall_seconds is None for i in mine)
        for field in ("cpu_rank_seconds", "gpu_rank_seconds", "wall_seconds"):
            assert team["total"][field] == pytest.approx(sum(getattr(i, field) or 0 for i in mine), abs=1e-3)
        for model in team["models"]:
            for work in ("training", "trial", "scoring"):
                assert model[work]["count"] == sum(i.model == model["model"] and i.work == work for i in mine)
    assert document["total"]["count"] == len(items) == len(document["items"])
    table = render(summarize(items))
    rows = [re.split(r"\s{2,}", line) for line in table.split("\n\n")[0].splitlines()[1:]]
    totals = {r[0]: r[3:] for r in rows if r[2] == "total"}
    for name, team in teams.items():
        t = team["total"]
        samples = "-" if t["samples_processed"] is None else f"{t['samples_processed']:,}"
        assert totals[name] == [str(t["count"]), *(f"{t[f]:,.1f}" for f in ("cpu_rank_seconds", "gpu_rank_seconds",
                                                                              "wall_seconds")), samples]
    assert [r for r in rows if r[:3] == ["fraud", "alpha", "trial"]][0][:4] == ["fraud", "alpha", "trial", "2"]
    assert f"{document['total']['unmeasured']} counted without seconds" in table


def test_since_counts_what_finished_on_or_after_the_day(instance):
    everything = collect(instance, [ALPHA, BETA], None)
    # The fixture's records were written just now; taking the day from them, not from the clock, keeps
    # the test true when it runs across midnight UTC.
    written = [i.finished for i in everything if i.ref != "alpha-study#3"]
    recent = collect(instance, [ALPHA, BETA], _day_of(min(written)))
    assert {i.ref for i in everything} - {i.ref for i in recent} == {"alpha-study#3"}  # finished in 2020
    assert collect(instance, [ALPHA, BETA], _day_of(max(written)) + dt.timedelta(days=1)) == []


def _day_of(finished: str) -> dt.datetime:
    return dt.datetime.fromisoformat(finished).astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def cli_home(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    models = tmp_path / "models"
    for data in (spec_data(name="alpha", team="fraud"), spec_data(name="beta", team="search")):
        write_spec(models, data)
    monkeypatch.setenv("ML_ASSETS_MODELS_DIR", str(models))
    monkeypatch.setenv("ML_ASSETS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def test_the_command_filters_by_team_and_model(cli_home, capsys):
    assert command.usage("legacy", None, None, "json") == 0
    document = json.loads(capsys.readouterr().out)
    assert [t["team"] for t in document["teams"]] == ["legacy"] and document["total"]["count"] == 2
    assert command.usage(None, "beta", None, "json") == 0
    assert {i["model"] for i in json.loads(capsys.readouterr().out)["items"]} == {"beta"}


@pytest.mark.parametrize(("team", "model", "since", "says"), [
    ("nobody", None, None, "no team 'nobody' is known here; known teams: fraud, legacy, search"),
    ("Bad_Team", None, None, "team name 'Bad_Team' is invalid"),
    (None, "gamma", None, "no model 'gamma' is declared here; known models: alpha, beta"),
    (None, "../x", None, "model name '../x' is invalid"),
    (None, None, "2013-2-1", "--since '2013-2-1' is not a day: give it as YYYY-MM-DD (UTC)"),
])
def test_a_bad_query_says_why_and_what_is_known(cli_home, capsys, team, model, since, says):
    assert command.usage(team, model, since, "table") == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines()[-1].startswith(f"ml-assets usage: {says}")


def test_an_empty_home_is_not_opened_and_nothing_is_written(tmp_path):
    empty = tmp_path / "dagster"
    empty.mkdir()
    (empty / "dagster.yaml").write_text(LOCAL_INSTANCE.read_text())
    assert open_instance(empty) is None
    assert sorted(p.name for p in empty.iterdir()) == ["dagster.yaml"]
