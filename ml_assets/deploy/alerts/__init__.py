"""Alerts to a webhook. Run failures: what failed (model, partition, stage, reason, link).

``sensor.build_failure_alert_sensor`` watches for failed runs; for those that failed since its
cursor ``failures.describe`` says what failed and ``failures.messages`` groups them (one message
per failed run while there are few, one summary when many fail together: a backfill that fails 60
partitions sends one message, not 60); ``webhook.deliver`` posts them once per tick. The payload is
JSON with a Slack-compatible ``text`` and the structured ``alerts``. Lifecycle events
(``lifecycle``: promotions and rollbacks) go to the same webhook, one message each, from
``sensor.build_lifecycle_sensor``.
"""
