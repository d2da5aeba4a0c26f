"""What failed, for each failed run, and the messages that tell it: one per run, or one summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import dagster as dg

from ml_assets.records.runs import RunLabels

MAX_PER_RUN_MESSAGES = 3  # more failures than this in one tick: one summary instead
SUMMARY_LINES = 20
REASON_CHARS = 300


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


def describe(instance: dg.DagsterInstance, run: dg.DagsterRun, run_url: str) -> Alert:
    """The alert for one failed run: the failing step names the stage, its error the reason;
    ``run_url`` is the run's page in the Dagster UI."""
    stage, reason, error = "run", "", None
    failures = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    if failures:
        event = failures[0].dagster_event
        stage = _stage(event.step_key or "")
        error = _innermost(getattr(event.event_specific_data, "error", None))
        reason = _first_line(_error_text(error) if error else failures[0].message)
        if len(failures) > 1:
            stage += f" (+{len(failures) - 1} more failed steps)"
    if not reason:
        # No step failed: the run worker died, timed out, or the run was failed by monitoring.
        for kind in (dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.ENGINE_EVENT):
            logs = instance.all_logs(run.run_id, of_type=kind)
            errors = [_innermost(getattr(log.dagster_event.event_specific_data, "error", None))
                      for log in logs if log.dagster_event is not None]
            texts = [_first_line(_error_text(e) if e else log.message) for e, log in zip(errors, logs, strict=True)
                     if e or log.message]
            if texts:
                reason, error = texts[-1], errors[-1]
                break
    labels = RunLabels.from_tags(run.tags, run.job_name)
    return Alert(run_id=run.run_id, job=run.job_name, model=labels.model, partition=labels.partition, stage=stage,
                 reason=_named(reason, error, instance) or "no failure message recorded", url=run_url,
                 backfill=labels.backfill)


def _innermost(error):
    # Dagster's "Error occurred while executing op" (or "An exception was thrown during execution")
    # wraps what was raised; a dg.Failure is already ours, in words.
    while error is not None and error.cause is not None and error.cls_name != "Failure":
        error = error.cause
    return error


DATABASE_ERRORS = {"OperationalError", "InterfaceError", "DatabaseUnavailable", "DagsterPostgresException"}


def _named(reason: str, error, instance: dg.DagsterInstance) -> str:
    """A database driver's error says "server closed the connection unexpectedly", not which server:
    name PostgreSQL, and where the instance's database is when it is there."""
    if error is None or error.cls_name not in DATABASE_ERRORS or "PostgreSQL" in reason:
        return reason
    url = getattr(instance.run_storage, "postgres_url", "")
    if not url:
        return f"PostgreSQL: {reason}"
    from ml_assets.deploy.pg_storage import where

    return f"PostgreSQL (Dagster's instance database is at {where(url)}): {reason}"


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
