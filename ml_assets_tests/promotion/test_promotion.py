"""Promotion, rollback, the sensor and crash recovery against a real MLflow registry (SQLite) and
the embedded version store. Versions are registered with the tags the pipeline writes; what is
tested is who becomes @champion, what gets recorded where, and that every path converges."""

import json
from pathlib import Path

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from ml_assets.promotion import moves as promotion
from ml_assets.promotion.assets import (
    build_production_model,
    build_promotion_job,
    build_promotion_sensor,
    promotion_run_config,
)
from ml_assets.registry import versions as registry
from ml_assets.resources import LocalVersionStoreResource, MlflowTrackingResource
from ml_assets.settings import BUNDLED_MODELS_DIR
from ml_assets.spec import load_spec
from ml_assets.versioning import LocalVersionStore
from ml_assets_tests.helpers import version_with_files

SPEC = load_spec(BUNDLED_MODELS_DIR / "flights_delay.yaml")
NAME = SPEC.name


@pytest.fixture
def world(tmp_path):
    db = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=db, registry_uri=db)
    client.create_registered_model(NAME)
    client.create_experiment(NAME, artifact_location=(tmp_path / "runs").as_uri())
    store = LocalVersionStore(tmp_path / "store")
    tracking = MlflowTrackingResource(tracking_uri=db, artifact_root=str(tmp_path / "artifacts"))
    return client, store, tracking, tmp_path


def register(client, partition: str, gate: str = "passed", against: str = "none") -> str:
    mv = version_with_files(client, NAME, {
        "partition": partition, "gate": gate, "gate_champion_version": against,
        "gate_reason": f"{gate} against {against}", "primary_metric": "roc_auc", "test_roc_auc": "0.7"})
    return str(mv.version)


def champion(client) -> str | None:
    mv = registry.by_alias(client, NAME, registry.CHAMPION)
    return str(mv.version) if mv else None


def request(action="promote", version=None, reason="tested"):
    return promotion.Request(NAME, action, version, reason, "pytest")


def test_promote_records_in_three_places_and_a_repeat_changes_nothing(world):
    client, store, _, _ = world
    v1 = register(client, "2013-01-15")
    record, outcome = promotion.execute(client, store, SPEC, request(version=v1))
    assert outcome == "done" and champion(client) == v1
    assert record["previous"] is None and record["decision"] == "promoted" and record["actor"] == "pytest"
    assert record["evidence"]["gate"] == "passed" and record["policy"]["primary_metric"] == "roc_auc"
    assert promotion.history(store, NAME) == [record]  # on main of the version store
    tags = client.get_model_version(NAME, v1).tags
    assert json.loads(tags["promotion.last"])["id"] == record["id"]
    assert promotion.pending(client, NAME) is None
    again, outcome = promotion.execute(client, store, SPEC, request(version=v1))
    assert outcome == "unchanged" and again["id"] == record["id"]
    assert len(promotion.history(store, NAME)) == 1


def test_gate_failures_and_stale_evidence_are_refused_and_nothing_moves(world):
    client, store, _, _ = world
    v1 = register(client, "2013-01-15")
    promotion.execute(client, store, SPEC, request(version=v1))
    weak = register(client, "2013-01-16", gate="failed", against=v1)
    with pytest.raises(promotion.PromotionRefused, match="did not pass the promotion gate"):
        promotion.execute(client, store, SPEC, request(version=weak))
    stale = register(client, "2013-01-17", against="none")  # judged when there was no champion
    with pytest.raises(promotion.PromotionRefused, match="re-run its evaluation_report"):
        promotion.execute(client, store, SPEC, request(version=stale))
    with pytest.raises(registry.RegistryError, match="has no version 99"):
        promotion.execute(client, store, SPEC, request(version="99"))
    assert champion(client) == v1 and len(promotion.history(store, NAME)) == 1


def test_rollback_walks_back_through_the_recorded_champions(world):
    client, store, _, _ = world
    v1 = register(client, "2013-01-15")
    promotion.execute(client, store, SPEC, request(version=v1))
    v2 = register(client, "2013-01-16", against=v1)
    promotion.execute(client, store, SPEC, request(version=v2))
    record, _ = promotion.execute(client, store, SPEC, request("rollback", reason="v2 misbehaves in serving"))
    assert champion(client) == v1 and record["previous"] == v2 and record["decision"] == "rolled back"
    assert json.loads(client.get_model_version(NAME, v2).tags["promotion.replaced_by"])["version"] == v1
    with pytest.raises(promotion.PromotionRefused, match="first champion on record"):
        promotion.execute(client, store, SPEC, request("rollback"))
    assert [r["action"] for r in promotion.history(store, NAME)] == ["promote", "promote", "rollback"]


def test_a_crash_between_moving_the_alias_and_writing_the_record_converges(world, monkeypatch):
    client, store, _, _ = world
    v1 = register(client, "2013-01-15")
    real = promotion.append_log

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("the process died")

    monkeypatch.setattr(promotion, "append_log", crash)
    with pytest.raises(KeyboardInterrupt):
        promotion.execute(client, store, SPEC, request(version=v1))
    assert champion(client) == v1  # the alias moved ...
    assert promotion.history(store, NAME) == []  # ... the record did not reach main
    left = promotion.pending(client, NAME)
    assert left is not None and left["version"] == v1
    monkeypatch.setattr(promotion, "append_log", real)
    record, outcome = promotion.execute(client, store, SPEC, request(version=v1))  # the re-tick
    assert outcome == "resumed" and record["id"] == left["id"]
    assert promotion.history(store, NAME) == [left] and promotion.pending(client, NAME) is None
    # A crash after the log was written but before the tags: the rerun does not append twice.
    v2 = register(client, "2013-01-16", against=v1)
    monkeypatch.setattr(promotion, "append_log", lambda *a, **k: (real(*a, **k), crash())[0])
    with pytest.raises(KeyboardInterrupt):
        promotion.execute(client, store, SPEC, request(version=v2))
    monkeypatch.setattr(promotion, "append_log", real)
    record, outcome = promotion.execute(client, store, SPEC, request(version=v2))
    assert outcome == "resumed" and [r["version"] for r in promotion.history(store, NAME)] == [v1, v2]
    assert json.loads(client.get_model_version(NAME, v2).tags["promotion.last"])["id"] == record["id"]


def test_the_sensor_requests_one_promotion_and_re_ticks_request_nothing_new(world):
    client, store, tracking, tmp_path = world
    production = build_production_model(SPEC)
    job = build_promotion_job(SPEC, production)
    sensor = build_promotion_sensor(SPEC, job)
    defs = dg.Definitions(assets=[production], jobs=[job], sensors=[sensor], resources={
        "tracking": tracking, "version_store": LocalVersionStoreResource(root=str(tmp_path / "store"))})
    instance = dg.DagsterInstance.ephemeral()

    def tick():
        return sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources={"tracking": tracking}))

    assert "no registered version has passed" in tick().skip_message
    register(client, "2013-01-15", gate="failed")
    assert "no registered version has passed" in tick().skip_message
    v2 = register(client, "2013-01-16")
    [run] = tick().run_requests
    assert run.run_key == f"promote-v{v2}-over-none"
    assert tick().run_requests[0].run_key == run.run_key  # a re-tick asks for the same run (deduplicated by key)
    result = defs.resolve_job_def(job.name).execute_in_process(run_config=run.run_config, instance=instance)
    assert result.success and champion(client) == v2
    [materialization] = result.asset_materializations_for_node(production.node_def.name)
    assert materialization.metadata["actor"].value == f"sensor {NAME}_promotion_sensor"
    assert materialization.metadata["previous_version"].value is None
    assert "is the champion" in tick().skip_message
    # A worse model registered later, judged against v2, never passes the gate: nothing to promote.
    register(client, "2013-01-17", gate="failed", against=v2)
    assert tick().run_requests == [] and champion(client) == v2
    # A failed promotion run leaves a pending record: the next tick finishes it.
    v4 = register(client, "2013-01-18", against=v2)
    client.set_registered_model_tag(NAME, promotion.PENDING_TAG, json.dumps(
        promotion.plan(client, store, SPEC, request(version=v4))))
    [finish] = tick().run_requests
    assert finish.run_key.startswith("finish-")
    assert defs.resolve_job_def(job.name).execute_in_process(run_config=finish.run_config, instance=instance).success
    assert champion(client) == v4 and promotion.pending(client, NAME) is None


def test_the_promotion_job_fails_with_the_reason_when_refused(world):
    client, _, tracking, tmp_path = world
    production = build_production_model(SPEC)
    job = build_promotion_job(SPEC, production)
    defs = dg.Definitions(assets=[production], jobs=[job], resources={
        "tracking": tracking, "version_store": LocalVersionStoreResource(root=str(tmp_path / "store"))})
    weak = register(client, "2013-01-16", gate="failed")
    result = defs.resolve_job_def(job.name).execute_in_process(
        run_config=promotion_run_config(SPEC, "promote", weak, "try anyway", "pytest"),
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "did not pass the promotion gate" in failure.step_failure_data.error.message
    assert champion(client) is None


def lose_weights(client, version: str, corrupt: bool = False) -> None:
    """The version's registered weights deleted (or overwritten) behind the registry's back."""
    from urllib.parse import urlparse

    weights = Path(urlparse(client.get_model_version(NAME, version).source).path) / "artifacts" / "model.safetensors"
    if corrupt:
        weights.write_bytes(b"other bytes")
    else:
        weights.unlink()


def test_no_alias_moves_onto_a_version_that_cannot_load(world):
    client, store, tracking, tmp_path = world
    v1 = register(client, "2013-01-15")
    promotion.execute(client, store, SPEC, request(version=v1))
    v2 = register(client, "2013-01-16", against=v1)
    lose_weights(client, v2)
    with pytest.raises(promotion.PromotionRefused) as refused:
        promotion.execute(client, store, SPEC, request(version=v2))
    message = str(refused.value)
    assert message.startswith(f"{NAME} version {v2}: ") and "model.safetensors" in message and "\n" not in message
    assert message.endswith(f"it cannot be loaded, so it cannot be the champion (`ml-assets verify {NAME} --repair` "
                            "rebuilds what it can)")
    # The sensor would promote v2 (it passed against the champion): it says why not, and asks nothing.
    sensor = build_promotion_sensor(SPEC, build_promotion_job(SPEC, build_production_model(SPEC)))
    tick = sensor.evaluate_tick(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(),
                                                        resources={"tracking": tracking}))
    assert tick.run_requests == [] and f"version {v2} passed the gate but cannot be loaded" in tick.skip_message
    # A rollback onto a version whose weights no longer hash to their record is refused the same way.
    v3 = register(client, "2013-01-17", against=v1)
    promotion.execute(client, store, SPEC, request(version=v3))
    lose_weights(client, v1, corrupt=True)
    with pytest.raises(promotion.PromotionRefused, match=f"version {v1}: weights sha256 .* differ from the registered"):
        promotion.execute(client, store, SPEC, request("rollback"))
    assert champion(client) == v3 and [r["version"] for r in promotion.history(store, NAME)] == [v1, v3]
    assert promotion.pending(client, NAME) is None
