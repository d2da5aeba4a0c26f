"""The alert sensors of the production configuration (ml_assets.definitions adds them): failed runs,
and lifecycle events (promotions, rollbacks, monitoring limits crossed, retrainings launched)."""

import datetime as dt
import json

import dagster as dg

from ml_assets.deploy.alerts import lifecycle
from ml_assets.deploy.alerts.failures import MAX_PER_RUN_MESSAGES, describe, messages
from ml_assets.deploy.alerts.webhook import check_webhook_url, deliver
from ml_assets.resources.links import DagsterLinksResource

BATCH = 200  # failed runs read per tick; the rest wait for the next tick
REMEMBERED = 500  # alerted run ids kept in the cursor, so a failed run updated again is not re-sent


def _utc(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def build_failure_alert_sensor(*, interval_seconds: int, webhook: dg.EnvVar) -> dg.SensorDefinition:
    """``webhook`` names the variable that holds the webhook's URL; the run links come from the
    ``links`` resource."""

    @dg.sensor(
        name="run_failure_alerts",
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(f"Posts each failed run (model, partition, stage, reason, link) to ${webhook.env_var_name}; "
                     f"more than {MAX_PER_RUN_MESSAGES} failures in one tick become one summary."),
    )
    def run_failure_alerts(context: dg.SensorEvaluationContext, links: DagsterLinksResource) -> dg.SkipReason:
        # Read at each tick, as a resource reads its EnvVar: the URL carries the webhook's token, so it
        # is never part of the definitions (serialized to the instance, shown in the UI), and unset is
        # a valid state (no alerts) that each tick reports rather than a load error.
        url = (webhook.get_value() or "").strip()
        if not url:
            return dg.SkipReason(f"{webhook.env_var_name} is not set: no alerts are sent")
        check_webhook_url(url)
        now = dt.datetime.now(dt.UTC)
        if not context.cursor:
            # First tick: start from now; the failures before the sensor existed are history.
            context.update_cursor(json.dumps({"after": now.timestamp(), "alerted": []}))
            return dg.SkipReason("started watching for failed runs")
        cursor = json.loads(context.cursor)
        alerted = list(cursor.get("alerted", []))
        after = dt.datetime.fromtimestamp(float(cursor["after"]), dt.UTC) - dt.timedelta(microseconds=1)
        records = context.instance.get_run_records(
            filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], updated_after=after),
            limit=BATCH, order_by="update_timestamp", ascending=True)
        fresh = [r for r in records if r.dagster_run.run_id not in set(alerted)]
        if not fresh:
            return dg.SkipReason("no new failed runs")
        found = [describe(context.instance, r.dagster_run, links.run_url(r.dagster_run.run_id)) for r in fresh]
        payloads = messages(found)
        deliver(url, payloads)  # raises on failure: the cursor stays, the next tick retries
        latest = max(_utc(r.update_timestamp) for r in fresh)
        alerted = (alerted + [a.run_id for a in found])[-REMEMBERED:]
        context.update_cursor(json.dumps({"after": latest.timestamp(), "alerted": alerted}))
        context.log.info(f"sent {len(payloads)} message(s) for {len(found)} failed run(s)")
        return dg.SkipReason(f"alerted {len(found)} failed run(s) in {len(payloads)} message(s)")

    return run_failure_alerts


def build_lifecycle_sensor(*, interval_seconds: int, webhook: dg.EnvVar, models: list[str]) -> dg.SensorDefinition:
    """One message per lifecycle event of ``models`` (ml_assets.deploy.alerts.lifecycle), to the same
    webhook as the failure alerts. The cursor: the last materialization's storage id and the last
    retraining run's creation time."""

    @dg.sensor(
        name="lifecycle_notifications",
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(f"Posts each promotion, rollback, blocking monitoring limit crossed and retraining launched of "
                     f"{', '.join(models) or 'no model'} to ${webhook.env_var_name}."),
    )
    def lifecycle_notifications(context: dg.SensorEvaluationContext, links: DagsterLinksResource) -> dg.SkipReason:
        url = (webhook.get_value() or "").strip()  # read at each tick: see run_failure_alerts
        if not url:
            return dg.SkipReason(f"{webhook.env_var_name} is not set: no notifications are sent")
        check_webhook_url(url)
        now = dt.datetime.now(dt.UTC)
        if not context.cursor:
            context.update_cursor(json.dumps({"after": lifecycle.latest_storage_id(context.instance, models),
                                              "runs_after": now.timestamp()}))
            return dg.SkipReason("started watching for promotions, rollbacks, monitoring limits and retrainings")
        cursor = json.loads(context.cursor)
        events = lifecycle.events(context.instance, models, int(cursor["after"]), BATCH)
        runs = lifecycle.retrainings(context.instance, models,
                                     dt.datetime.fromtimestamp(float(cursor["runs_after"]), dt.UTC), BATCH)
        if not events and not runs:
            return dg.SkipReason("no new lifecycle events")
        payloads = [m for _, e in events if (m := lifecycle.message(e, links.run_url(e.run_id))) is not None]
        payloads += [lifecycle.retraining_message(r.dagster_run, links.run_url(r.dagster_run.run_id)) for r in runs]
        deliver(url, payloads)  # raises on failure: the cursor stays, the next tick retries
        context.update_cursor(json.dumps({
            "after": events[-1][0] if events else cursor["after"],
            "runs_after": _utc(runs[-1].create_timestamp).timestamp() if runs else cursor["runs_after"]}))
        return dg.SkipReason(f"sent {len(payloads)} notification(s) for {len(events) + len(runs)} event(s)")

    return lifecycle_notifications
