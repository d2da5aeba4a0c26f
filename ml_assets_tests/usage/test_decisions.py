"""What retraining costs, split by decision, read back from real records in a real Dagster instance:
full trainings, fine-tunes of the champion and a partition that skipped (its trained_checkpoint
observation, as the asset logs it), with a record from before decisions counting as full."""

import dataclasses
import datetime as dt
import json
import re
from pathlib import Path

import dagster as dg
import pytest

from ml_assets.instance import LOCAL_INSTANCE
from ml_assets.pipeline.graph import ModelGraph, Stage
from ml_assets.pipeline.jobs import job_tags
from ml_assets.training import decision as D
from ml_assets.training.launch import skip_metadata
from ml_assets.training.record import CheckpointRecord
from ml_assets.training.warm import Plan
from ml_assets.usage.collect import collect, open_instance
from ml_assets.usage.report import BY_DECISION, render, summarize
from ml_assets_tests.helpers import model_spec
from ml_assets_tests.records.test_round_trip import RECORDS
from ml_assets_tests.usage.test_collect import DAY, PARTITIONS, _materialize, _training

GAMMA = model_spec(name="gamma", team="fraud")
PARENT = D.Parent(version="1", partition="2013-02-03", weights_sha256="w" * 64, feature_state_sha256="f" * 64,
                  decision="full", chain_start="2013-02-03", key={})
SECONDS = ("cpu_rank_seconds", "gpu_rank_seconds", "wall_seconds")


def _trained(decision: D.Decision, device: str, ranks: int, wall: float, samples: int):
    def make(_):
        record = _training(device, ranks, wall)
        result = dataclasses.replace(record.result, samples_processed=samples)
        return dataclasses.replace(record, result=result, decision=decision.as_metadata())
    return make


def _observe(instance: dg.DagsterInstance, metadata: dict) -> str:
    """A real run in which trained_checkpoint observes ``metadata`` and materializes nothing, as the
    asset does when its partition skips."""
    @dg.asset(key=ModelGraph(GAMMA).key(Stage.TRAINED_CHECKPOINT), partitions_def=PARTITIONS, output_required=False)
    def stand_in(context: dg.AssetExecutionContext):
        yield dg.AssetObservation(asset_key=context.asset_key, partition=context.partition_key, metadata=metadata)

    result = dg.materialize([stand_in], instance=instance, tags=job_tags(GAMMA, trains=True), partition_key=DAY)
    assert result.success
    return result.run_id


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    """gamma (team fraud): a full training, two fine-tunes (one on a GPU), a skipped partition, a
    record from before decisions and samples, and an observation that records no decision."""
    home: Path = tmp_path_factory.mktemp("usage_decisions") / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(LOCAL_INSTANCE.read_text())
    writer = dg.DagsterInstance.from_config(str(home))
    tags, key = job_tags(GAMMA, trains=True), Stage.TRAINED_CHECKPOINT
    _materialize(writer, GAMMA, key, _trained(D.Decision(D.FULL, "no @champion of gamma to fine-tune yet"),
                                              "cpu", 2, 20.0, 4000), tags)
    fine = D.Decision(D.FINE_TUNE, "the champion v1 still fits", PARENT, detail={"fine_tune_days": ["2013-02-01"]})
    _materialize(writer, GAMMA, key, _trained(fine, "cuda:0", 1, 3.5, 500), tags)
    _materialize(writer, GAMMA, key, _trained(fine, "cpu", 1, 2.0, 400), tags)
    _materialize(writer, GAMMA, key, lambda _: RECORDS["trained_checkpoint"], tags)  # no decision, no samples
    skip = D.Decision(D.SKIP, "version 3 was trained from the same inputs", holder="3")
    _observe(writer, skip_metadata(Plan(decision=skip, inputs_sha256="i" * 64, key={}, run=None)))
    _observe(writer, {"note": "an observation of something else"})
    writer.dispose()
    reader = open_instance(home)
    yield reader
    reader.dispose()


def test_each_training_counts_with_its_decision_and_a_skipped_partition_as_a_skip_that_cost_nothing(instance):
    found = [i for i in collect(instance, [GAMMA], None) if i.work == "training"]
    events = instance.fetch_materializations(ModelGraph(GAMMA).key(Stage.TRAINED_CHECKPOINT), limit=100).records
    expected = {}
    for event in events:
        record = CheckpointRecord.from_metadata(event.asset_materialization.metadata)
        expected[event.run_id] = (record.decision_kind, record.result.samples_processed,
                                  *(getattr(record.result, s) for s in SECONDS))
    trained = {i.ref: (i.decision, i.samples_processed, *(getattr(i, s) for s in SECONDS))
               for i in found if i.decision != "skip"}
    assert trained == expected
    assert sorted(i.decision for i in found) == ["fine_tune", "fine_tune", "full", "full", "skip"]
    [skipped] = [i for i in found if i.decision == "skip"]
    assert (skipped.partition, skipped.team, skipped.samples_processed) == (DAY, "fraud", 0)
    assert [getattr(skipped, s) for s in SECONDS] == [0.0, 0.0, 0.0]


def test_the_split_by_decision_adds_up_to_the_trainings_for_the_model_the_team_and_everyone(instance):
    items = collect(instance, [GAMMA], None)
    document = json.loads(json.dumps(summarize(items)))
    [team] = document["teams"]
    [model] = team["models"]
    for split in (model[BY_DECISION], team[BY_DECISION], document[BY_DECISION]):
        assert {d: t["count"] for d, t in split.items()} == {"full": 2, "fine_tune": 2, "skip": 1}
        assert split["fine_tune"]["gpu_rank_seconds"] == 3.5 and split["fine_tune"]["cpu_rank_seconds"] == 2.0
        assert split["fine_tune"]["samples_processed"] == 900
        assert split["full"]["samples_processed"] == 4000 and split["full"]["cpu_rank_seconds"] == 40.0 + 3.6
        assert split["skip"] == {"count": 1, "unmeasured": 0, "cpu_rank_seconds": 0.0, "gpu_rank_seconds": 0.0,
                                 "wall_seconds": 0.0, "samples_processed": 0}
        for field in (*SECONDS, "count", "samples_processed"):
            assert sum(t[field] for t in split.values()) == pytest.approx(model["training"][field])
    assert model["trial"]["samples_processed"] is None
    assert {i["decision"] for i in document["items"]} == {"full", "fine_tune", "skip"}


def test_the_table_shows_each_decisions_trainings_under_the_trainings(instance):
    table = render(summarize(collect(instance, [GAMMA], None)))
    rows = [re.split(r"\s{2,}", line) for line in table.split("\n\n")[0].splitlines()]
    assert rows[0][-1] == "SAMPLES"
    assert [r[2:] for r in rows[1:5]] == [
        ["training", "5", "45.6", "3.5", "27.3", "4,900"],
        ["training: full", "2", "43.6", "0.0", "21.8", "4,000"],
        ["training: fine_tune", "2", "2.0", "3.5", "5.5", "900"],
        ["training: skip", "1", "0.0", "0.0", "0.0", "0"]]
    assert "1 training(s) counted without samples" in table


def test_since_counts_a_skip_from_the_day_it_was_observed(instance):
    # The day comes from the records the fixture wrote, not the clock, so midnight UTC cannot fall between.
    items = collect(instance, [GAMMA], None)
    day = {i.finished: _day_of(i.finished) for i in items}
    skipped = min(day[i.finished] for i in items if i.decision == "skip")
    assert "skip" in {i.decision for i in collect(instance, [GAMMA], skipped)}
    assert collect(instance, [GAMMA], max(day.values()) + dt.timedelta(days=1)) == []


def _day_of(finished: str) -> dt.datetime:
    return dt.datetime.fromisoformat(finished).astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
