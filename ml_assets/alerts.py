"""Run-failure alerts: what failed (model, partition, stage, reason, link) posted to a webhook.

The sensor in ``ml_assets.defs.alerts`` calls :func:`collect` for the runs that failed since its
cursor and :func:`deliver` once per tick: one message per failed run while there are few, one
summary when many fail together (a backfill that fails 60 partitions sends one message, not 60).
The payload is JSON with a Slack-compatible ``text`` and the structured ``alerts``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass

import dagster as dg
from dagster._core.events import DagsterEventType

WEBHOOK_VARIABLE = "ML_ASSETS_ALERT_WEBHOOK_URL"
MAX_PER_RUN_MESSAGES = 3  # more failures than this in one tick: one summary instead
SUMMARY_LINES = 20
REASON_CHARS = 300


class AlertDeliveryError(RuntimeError):
    pass


@dataclass(frozen=True)
class Alert:
    run_id: str
    job: str
    model: str
    partition: str
    stage: str
    reason: str
    url: str
    backfill: str = ""

    def line(self) -> str:
        where = f"partition {self.partition}" if self.partition else "unpartitioned"
        return f"{self.model} {where}, stage {self.stage}: {self.reason} ({self.url})"


def _first_line(text: str) -> str:
    line = next((part.strip() for part in (text or "").splitlines() if part.strip()), "")
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


def _error_text(error) -> str:
    """An error's message without the module path: a dg.Failure's description, else 'ValueError: ...'."""
    message, name = error.message or "", error.cls_name or ""
    head, sep, rest = message.partition(": ")
    if sep and name and head.split(".")[-1] == name:
        return rest if name == "Failure" else f"{name}: {rest}"
    return message


def _stage(step_key: str) -> str:
    # Asset steps are keyed by the asset key joined with "__": flights_delay__trained_checkpoint.
    return step_key.split("__")[-1] if step_key else "run"


def describe(instance: dg.DagsterInstance, run: dg.DagsterRun, dagster_url: str) -> Alert:
    """The alert for one failed run: the failing step names the stage, its error the reason."""
    tags = run.tags
    stage, reason = "run", ""
    failures = instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_FAILURE)
    if failures:
        event = failures[0].dagster_event
        stage = _stage(event.step_key or "")
        error = getattr(event.event_specific_data, "error", None)
        reason = _first_line(_error_text(error) if error else failures[0].message)
        if len(failures) > 1:
            stage += f" (+{len(failures) - 1} more failed steps)"
    if not reason:
        # No step failed: the run worker died, timed out, or the run was failed by monitoring.
        for kind in (DagsterEventType.RUN_FAILURE, DagsterEventType.ENGINE_EVENT):
            logs = instance.all_logs(run.run_id, of_type=kind)
            texts = [_first_line(log.message) for log in logs if log.message]
            if texts:
                reason = texts[-1]
                break
    partition = tags.get("dagster/partition", "")
    if not partition and tags.get("dagster/asset_partition_range_start"):
        partition = f"{tags['dagster/asset_partition_range_start']}..{tags.get('dagster/asset_partition_range_end', '')}"
    return Alert(run_id=run.run_id, job=run.job_name, model=tags.get("ml_assets/model", run.job_name),
                 partition=partition, stage=stage, reason=reason or "no failure message recorded",
                 url=f"{dagster_url.rstrip('/')}/runs/{run.run_id}", backfill=tags.get("dagster/backfill", ""))


def messages(alerts: list[Alert]) -> list[dict]:
    """One message per alert, or a single summary when there are more than MAX_PER_RUN_MESSAGES."""
    if not alerts:
        return []
    if len(alerts) <= MAX_PER_RUN_MESSAGES:
        return [{"kind": "run_failure", "text": f"Run failed: {a.line()}", "alerts": [asdict(a)]} for a in alerts]
    by_model = Counter(a.model for a in alerts)
    by_stage = Counter(a.stage for a in alerts)
    backfills = sorted({a.backfill for a in alerts if a.backfill})
    head = (f"{len(alerts)} runs failed: "
            + ", ".join(f"{model} x{n}" for model, n in by_model.most_common())
            + "; stages " + ", ".join(f"{stage} x{n}" for stage, n in by_stage.most_common())
            + (f"; backfills {', '.join(backfills)}" if backfills else ""))
    lines = [a.line() for a in alerts[:SUMMARY_LINES]]
    if len(alerts) > SUMMARY_LINES:
        lines.append(f"... and {len(alerts) - SUMMARY_LINES} more")
    return [{"kind": "run_failure_summary", "text": "\n".join([head, *lines]), "alerts": [asdict(a) for a in alerts]}]


def check_webhook_url(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{WEBHOOK_VARIABLE} must be an http(s) URL; got {parts.scheme or 'no'} scheme")
    return url


def deliver(url: str, payloads: list[dict], timeout: float = 10.0) -> None:
    """POST each payload as JSON; any non-2xx answer or network error raises (the tick retries)."""
    check_webhook_url(url)
    for payload in payloads:
        request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (scheme checked)
                if not 200 <= response.status < 300:
                    raise AlertDeliveryError(f"webhook answered HTTP {response.status}")
        except (urllib.error.URLError, OSError) as exc:
            # The URL may carry a token: name the host only.
            from urllib.parse import urlsplit

            raise AlertDeliveryError(f"webhook at {urlsplit(url).hostname} failed: {exc}") from None
