"""Lifecycle notifications against real promotions: the production_model asset run by its job in a
real (temporary) Dagster instance, a real MLflow registry (SQLite) and a real HTTP receiver on
loopback. One message per promotion or rollback; a request already in effect sends nothing."""

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from ml_assets.deploy.alerts.sensor import build_lifecycle_sensor
from ml_assets.deploy.alerts.webhook import WEBHOOK_VARIABLE, AlertDeliveryError
from ml_assets.promotion.assets import (
    build_production_model,
    build_promotion_job,
    promotion_run_config,
)
from ml_assets.registry import versions as registry
from ml_assets.resources import LocalVersionStoreResource, MlflowTrackingResource
from ml_assets.resources.links import DagsterLinksResource
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import load_spec
from ml_assets_tests.helpers import version_with_files

SPEC = load_spec(BUNDLED_MODELS_DIR / "flights_delay.yaml")
NAME = SPEC.name


def register(client, partition: str) -> str:
    """A version as the pipeline tags it, its gate passed against the champion of the moment."""
    champion = registry.by_alias(client, NAME, registry.CHAMPION)
    mv = version_with_files(client, NAME, {
        "partition": partition, "gate": "passed", "gate_reason": "beat it",
        "gate_champion_version": str(champion.version) if champion else "none", "primary_metric": "roc_auc",
        "test_roc_auc": "0.7"})
    return str(mv.version)


def test_each_promotion_and_rollback_is_one_message(tmp_path, webhook, monkeypatch):
    monkeypatch.setenv(WEBHOOK_VARIABLE, webhook.url)
    db = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=db, registry_uri=db)
    client.create_registered_model(NAME)
    client.create_experiment(NAME, artifact_location=(tmp_path / "runs").as_uri())
    tracking = MlflowTrackingResource(tracking_uri=db, artifact_root=str(tmp_path / "artifacts"))
    production = build_production_model(SPEC)
    job = build_promotion_job(SPEC, production)
    defs = dg.Definitions(assets=[production], jobs=[job], resources={
        "tracking": tracking, "version_store": LocalVersionStoreResource(root=str(tmp_path / "store"))})
    sensor = build_lifecycle_sensor(interval_seconds=30, webhook=dg.EnvVar(WEBHOOK_VARIABLE), models=[NAME])
    links = DagsterLinksResource(base_url="http://dagster.internal:3000")

    with dg.instance_for_test() as instance:
        cursor = [None]

        def tick():
            context = dg.build_sensor_context(instance=instance, cursor=cursor[0], resources={"links": links})
            result = sensor(context)
            cursor[0] = context.cursor
            return result

        def move(action: str, version: str = "", reason: str = "tested") -> str:
            config = promotion_run_config(SPEC, action, version, reason, "pytest")
            result = defs.resolve_job_def(job.name).execute_in_process(run_config=config, instance=instance)
            assert result.success
            return result.run_id

        move("promote", register(client, "2013-01-15"), "before the sensor existed")  # history: not sent
        assert "started watching" in tick().skip_message and webhook.received == []

        run = move("promote", register(client, "2013-01-16"), "beat v1 on the same rows")
        move("promote", "2", "asked again")  # already in effect: nothing happened, nothing to say
        assert "sent 1 notification(s) for 2 event(s)" in tick().skip_message
        [promoted] = webhook.received
        assert promoted["kind"] == "promotion" and (promoted["version"], promoted["previous_version"]) == ("2", "1")
        assert promoted["reason"] == "beat v1 on the same rows" and promoted["actor"] == "pytest"
        assert promoted["run_url"] == f"http://dagster.internal:3000/runs/{run}"
        assert promoted["text"].startswith("flights_delay: version 2 promoted @champion (previous: 1) by pytest")

        move("rollback", reason="v2 misbehaves in production")
        tick()
        assert [m["kind"] for m in webhook.received] == ["promotion", "rollback"]
        rolled = webhook.received[-1]
        assert (rolled["version"], rolled["previous_version"]) == ("1", "2")
        assert "rolled back to @champion" in rolled["text"] and "v2 misbehaves" in rolled["text"]
        assert "no new lifecycle events" in tick().skip_message and len(webhook.received) == 2

        # The webhook down: nothing is lost, the next tick sends it.
        move("promote", "2", "fixed")
        webhook.fail_next = 1
        with pytest.raises(AlertDeliveryError, match="webhook at 127.0.0.1 failed"):
            tick()  # its cursor is not kept
        tick()
        assert [m["kind"] for m in webhook.received] == ["promotion", "rollback", "promotion"]


def _evaluated(passed: bool) -> dict:
    from ml_assets.evaluation.record import EvaluationRecord

    return EvaluationRecord(
        primary_metric="roc_auc", metrics={"roc_auc": 0.7012}, primary_interval=[0.69, 0.71], test_rows=900,
        repository="r", test_days=["2013-01-20"], validation_days=["2013-01-19"], skipped_days={},
        test_data_commit="c", test_files=[], positive_rate=0.2, decision_threshold=0.3, checkpoint_sha256="c" * 64,
        champion_version="3", gate_passed=passed,
        gate_reason="roc_auc -0.0005 vs champion v3: an improvement of +0.005 is required" if not passed else "beat it",
        slices=[], baseline=None, report_uri="/a/report.json", report_sha256="e" * 64, report_bytes=9,
        mlflow_run_id="run", mlflow_run_url="http://mlflow/run", plots={}, summary="s").to_metadata()


def test_a_refused_candidate_is_one_information_message_and_an_accepted_one_none(webhook, monkeypatch):
    """What the evaluation_report asset records for a refusal (its record, gate not passed) makes one
    message of kind "refused", severity info; an accepted candidate's evaluation makes none."""
    monkeypatch.setenv(WEBHOOK_VARIABLE, webhook.url)
    sensor = build_lifecycle_sensor(interval_seconds=30, webhook=dg.EnvVar(WEBHOOK_VARIABLE), models=[NAME])
    links = DagsterLinksResource(base_url="http://dagster.internal:3000")
    key = dg.AssetKey([NAME, "evaluation_report"])
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(instance=instance, cursor=None, resources={"links": links})
        sensor(context)
        for day, passed in (("2013-01-20", False), ("2013-01-21", True)):
            instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=day, metadata=_evaluated(passed)))
        context = dg.build_sensor_context(instance=instance, cursor=context.cursor, resources={"links": links})
        assert "sent 1 notification(s) for 2 event(s)" in sensor(context).skip_message
    [refused] = webhook.received
    assert (refused["kind"], refused["severity"], refused["partition"]) == ("refused", "info", "2013-01-20")
    assert refused["text"] == ("flights_delay: the candidate of 2013-01-20 was refused (champion v3): roc_auc -0.0005 "
                               "vs champion v3: an improvement of +0.005 is required")
    assert refused["value"] == 0.7012 and refused["champion_version"] == "3"
