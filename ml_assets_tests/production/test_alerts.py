"""The run-failure alert sensor against real failed runs in a real (temporary) Dagster instance and a
real HTTP receiver on loopback: one message per failed run, one summary when many fail in a tick,
nothing lost when the webhook is down."""

import dagster as dg
import pytest

from ml_assets.deploy.alerts.sensor import build_failure_alert_sensor
from ml_assets.deploy.alerts.webhook import WEBHOOK_VARIABLE, AlertDeliveryError
from ml_assets.resources.links import DagsterLinksResource


@dg.asset(key=["toy", "validated_snapshot"], partitions_def=dg.DailyPartitionsDefinition(start_date="2013-01-01"))
def validated_snapshot(context: dg.AssetExecutionContext) -> None:
    raise dg.Failure(description=f"model toy, partition {context.partition_key}: check nulls failed: "
                                 "column dep_delay has 41.0% nulls, allowed 5.0%\nmore detail on the next line")


toy_job = dg.define_asset_job("toy_daily", selection=[validated_snapshot], tags={"ml_assets/model": "toy"},
                              partitions_def=validated_snapshot.partitions_def)
defs = dg.Definitions(assets=[validated_snapshot], jobs=[toy_job])


def fail_runs(instance: dg.DagsterInstance, days: list[str]) -> list[str]:
    job = defs.resolve_job_def("toy_daily")
    run_ids = []
    for day in days:
        result = job.execute_in_process(instance=instance, partition_key=day, raise_on_error=False)
        assert not result.success
        run_ids.append(result.run_id)
    return run_ids


@pytest.fixture
def sensor():
    return build_failure_alert_sensor(interval_seconds=30, webhook=dg.EnvVar(WEBHOOK_VARIABLE))


def tick(sensor, instance, cursor):
    context = dg.build_sensor_context(instance=instance, cursor=cursor,
                                      resources={"links": DagsterLinksResource(base_url="http://dagster.internal:3000")})
    result = sensor(context)
    return result, context.cursor


def test_one_message_per_failed_run_then_one_summary_for_many(sensor, webhook, monkeypatch):
    monkeypatch.setenv(WEBHOOK_VARIABLE, webhook.url)
    with dg.instance_for_test() as instance:
        old = fail_runs(instance, ["2013-01-01"])  # before the sensor's first tick: history, not alerted
        result, cursor = tick(sensor, instance, None)
        assert webhook.received == [] and "started watching" in result.skip_message

        two = fail_runs(instance, ["2013-01-02", "2013-01-03"])
        result, cursor = tick(sensor, instance, cursor)
        assert [m["kind"] for m in webhook.received] == ["run_failure", "run_failure"]
        by_run = {m["alerts"][0]["run_id"]: m["alerts"][0] for m in webhook.received}
        assert set(by_run) == set(two) and old[0] not in by_run
        first = by_run[two[0]]
        assert first["model"] == "toy" and first["partition"] == "2013-01-02"
        assert first["stage"] == "validated_snapshot"
        assert first["reason"] == ("model toy, partition 2013-01-02: check nulls failed: column dep_delay has "
                                   "41.0% nulls, allowed 5.0%")
        assert first["url"] == f"http://dagster.internal:3000/runs/{two[0]}"
        assert "toy partition 2013-01-02, stage validated_snapshot" in webhook.received[0]["text"]

        result, cursor = tick(sensor, instance, cursor)  # nothing new: nothing sent again
        assert len(webhook.received) == 2 and "no new failed runs" in result.skip_message

        many = fail_runs(instance, [f"2013-02-{d:02d}" for d in range(1, 6)])  # a failing backfill
        tick(sensor, instance, cursor)
        assert len(webhook.received) == 3
        summary = webhook.received[-1]
        assert summary["kind"] == "run_failure_summary"
        assert {a["run_id"] for a in summary["alerts"]} == set(many)
        assert summary["text"].startswith("5 runs failed: toy x5; stages validated_snapshot x5")


def test_a_webhook_that_is_down_loses_no_alert(sensor, webhook, monkeypatch):
    monkeypatch.setenv(WEBHOOK_VARIABLE, webhook.url)
    with dg.instance_for_test() as instance:
        _, cursor = tick(sensor, instance, None)
        (run_id,) = fail_runs(instance, ["2013-03-01"])
        webhook.fail_next = 1
        with pytest.raises(AlertDeliveryError, match="webhook at 127.0.0.1 failed"):
            tick(sensor, instance, cursor)  # the cursor the failed tick saw stays as it was
        assert webhook.received == []
        tick(sensor, instance, cursor)
        assert [m["alerts"][0]["run_id"] for m in webhook.received] == [run_id]


def test_without_a_webhook_url_the_sensor_says_so(sensor, monkeypatch):
    monkeypatch.delenv(WEBHOOK_VARIABLE, raising=False)
    with dg.instance_for_test() as instance:
        result, _ = tick(sensor, instance, None)
    assert WEBHOOK_VARIABLE in result.skip_message
    monkeypatch.setenv(WEBHOOK_VARIABLE, "file:///etc/passwd")
    with dg.instance_for_test() as instance, pytest.raises(ValueError, match="must be an http"):
        tick(sensor, instance, None)


@dg.asset(key=["toy", "features"])
def features() -> None:
    import sqlalchemy

    raise sqlalchemy.exc.OperationalError("INSERT INTO event_logs ...", {},
                                          Exception("server closed the connection unexpectedly"))


@dg.asset(key=["toy", "evaluation_report"])
def fine() -> None:
    pass


def test_a_database_error_is_named_as_postgresql_in_a_step_and_in_a_run_that_failed_outside_one():
    from dagster._core.events import JobFailureData
    from dagster._utils.error import SerializableErrorInfo

    from ml_assets.deploy.alerts.failures import describe

    with dg.instance_for_test() as instance:
        result = dg.materialize([features], instance=instance, raise_on_error=False)
        run = instance.get_run_by_id(result.run_id)
        reason = describe(instance, run, "").reason
        assert reason.startswith("PostgreSQL: OperationalError: (builtins.Exception) server closed the connection "
                                 "unexpectedly"), reason

        # The run worker failed the run itself (an event it could not write): Dagster's message is
        # generic, the error it carries is not.
        run = instance.get_run_by_id(dg.materialize([fine], instance=instance).run_id)
        cause = SerializableErrorInfo("psycopg2.OperationalError: server closed the connection unexpectedly\n", [],
                                      "OperationalError")
        wrapper = SerializableErrorInfo("dagster._core.errors.DagsterExecutionInterruptedError: ...", [],
                                        "DagsterExecutionInterruptedError", cause=cause)
        instance.report_run_failed(run, 'Execution of run for "toy_daily" failed. An exception was thrown during '
                                        "execution.", JobFailureData(error=wrapper))
        reason = describe(instance, instance.get_run_by_id(run.run_id), "").reason
        assert reason == "PostgreSQL: OperationalError: server closed the connection unexpectedly", reason
