"""Refused candidates: every evaluation the promotion gate refused, as one line of a log on main of
the model's repository, beside its promotions.

A refusal is an outcome, not a failure: the day's run succeeds, nothing is registered, and this log
is where an auditor finds each refused candidate, its metrics, the bar it was held to and why it
missed (``ml-assets audit``, the model card's history, the lifecycle notifications). A refused
candidate is not registered in MLflow: the registry holds only versions that passed the gate, so
every version there could serve, and a daily fine-tune refused most days does not add a version a
day. Its evidence is not lost: the evaluation report (content-addressed, sha256 in this log) and its
MLflow run with metrics and plots stay where every evaluation's do.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import TYPE_CHECKING, Any

from ml_assets.layout import Layout
from ml_assets.names import repo_for_model
from ml_assets.versioning.logs import append_record, read_log

if TYPE_CHECKING:
    from ml_assets.evaluation.record import EvaluationRecord
    from ml_assets.versioning import VersionStore

SHOWN = 10  # refusals an audit or a model card lists (the newest); the log keeps them all


def refusal(model: str, partition: str, evaluation: EvaluationRecord, clauses: list[dict[str, Any]],
            trained: str, dagster_run_id: str) -> dict[str, Any]:
    """The log line of one refused candidate. Its id is the candidate and the champion it was held
    against: evaluating the same checkpoint again against the same champion logs nothing new."""
    key = f"{model}|{partition}|{evaluation.checkpoint_sha256}|{evaluation.champion_version or ''}"
    primary = evaluation.primary_metric
    return {"id": hashlib.sha256(key.encode()).hexdigest()[:32], "model": model, "partition": partition,
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "decision": "refused",
            "trained": trained or "full", "checkpoint_sha256": evaluation.checkpoint_sha256,
            "primary_metric": primary, "value": evaluation.metrics.get(primary),
            "champion_version": evaluation.champion_version,
            "champion_value": (evaluation.champion_metrics or {}).get(primary),
            "delta": evaluation.primary_delta[0] if evaluation.primary_delta else None,
            "reason": evaluation.gate_reason, "clauses": clauses,
            "report_uri": evaluation.report_uri, "report_sha256": evaluation.report_sha256,
            "mlflow_run_id": evaluation.mlflow_run_id, "dagster_run_id": dagster_run_id}


def log_refusal(store: VersionStore, record: dict[str, Any]) -> str | None:
    """Append ``record`` to the model's refusals log on main (None when it was already there)."""
    model = record["model"]
    meta = {"refusal_id": record["id"], "partition": record["partition"],
            "checkpoint_sha256": record["checkpoint_sha256"], "dagster_run_id": record["dagster_run_id"]}
    return append_record(store, repo_for_model(model), Layout(model).refusals_log, record,
                         f"refused {model} candidate of {record['partition']}", meta)


def refusals(store: VersionStore, model: str, ref: str = "main") -> list[dict[str, Any]]:
    """Every refused candidate of ``model`` on main, oldest first."""
    return read_log(store, repo_for_model(model), Layout(model).refusals_log, ref)


def line(r: dict[str, Any]) -> str:
    """One refusal in words (audit, model card)."""
    value = f" {r['value']:.4f}" if isinstance(r.get("value"), float) else ""
    against = (f" against champion v{r['champion_version']}" + (f" ({r['delta']:+.4f})" if r.get("delta") is not None
                                                                   else "")) if r.get("champion_version") else ""
    return (f"{r['time']} partition {r['partition']} ({r['trained']}): {r['primary_metric']}{value}{against}: "
            f"{r['reason']}")
