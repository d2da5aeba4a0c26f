"""Promotion and rollback, step by step (the package docstring tells the whole story)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ml_assets.layout import Layout
from ml_assets.names import check_model_name, repo_for_model
from ml_assets.promotion.record import PENDING_TAG, pending_record, pending_tag
from ml_assets.registry import versions as registry
from ml_assets.registry.record import VersionTags
from ml_assets.spec import ModelSpec
from ml_assets.versioning.logs import append_record, read_log

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from ml_assets.versioning import VersionStore

ACTIONS = ("promote", "rollback")


class PromotionRefused(Exception):
    """The request breaks the policy or names nothing promotable; the message says which and why."""


@dataclass(frozen=True)
class Request:
    model: str
    action: str
    version: str | None
    reason: str
    actor: str
    dagster_run_id: str = ""

    def __post_init__(self) -> None:
        check_model_name(self.model)
        if self.action not in ACTIONS:
            raise PromotionRefused(f"action {self.action!r} is not one of {list(ACTIONS)}")
        if self.action == "promote" and not self.version:
            raise PromotionRefused("promote needs a version")
        if not self.reason.strip():
            raise PromotionRefused("a reason is required: it is what the audit log shows")


def log_path(model: str) -> str:
    return Layout(model).promotions_log


def history(store: VersionStore, model: str, ref: str = "main") -> list[dict[str, Any]]:
    """Every promotion and rollback of ``model`` on main, oldest first."""
    return read_log(store, repo_for_model(model), log_path(model), ref)


def pending(client: MlflowClient, model: str) -> dict[str, Any] | None:
    return pending_record(client.get_registered_model(model).tags)


def _evidence(mv) -> dict[str, Any]:
    """What the promoted version was judged on, from its tags."""
    tags = VersionTags.from_tags(mv.tags)
    links = {"partition": tags.partition, "data_commit": tags.data_commit, "test_data_commit": tags.test_data_commit,
             "checkpoint_sha256": tags.checkpoint_sha256, "code_version": tags.code_version,
             "dagster_run_url": tags.dagster_run_url}
    evidence = {k: v for k, v in links.items() if v}
    if tags.gate is not None:
        gate = tags.gate.to_tags()
        evidence.update({k: v for k, v in gate.items() if not k.startswith("test_") and k != "decision_threshold"})
        if tags.gate.primary_value:
            evidence[f"test_{tags.gate.primary_metric}"] = float(tags.gate.primary_value)
    return evidence


def plan(client: MlflowClient, store: VersionStore, spec: ModelSpec, req: Request) -> dict[str, Any] | None:
    """The record this request would write, or None when it is already in effect (a re-tick)."""
    current = registry.by_alias(client, spec.name, registry.CHAMPION)
    previous = str(current.version) if current is not None else None
    if req.action == "promote":
        mv = registry.get_version(client, spec.name, str(req.version))
        if previous == str(mv.version):
            return None
        tags = VersionTags.from_tags(mv.tags)
        if tags.gate is None or not tags.gate.passed:
            raise PromotionRefused(
                f"{spec.name} version {mv.version} did not pass the promotion gate "
                f"({tags.gate.gate_reason if tags.gate else 'no gate recorded'}); it cannot be promoted")
        compared = tags.gate.gate_champion_version or "none"
        if compared != (previous or "none"):
            raise PromotionRefused(
                f"{spec.name} version {mv.version} was judged against champion "
                f"{'none' if compared == 'none' else 'version ' + compared}, but the champion is now "
                f"{'none' if previous is None else 'version ' + previous}: re-run its evaluation_report and "
                f"registered_model for partition {tags.partition} to compare it with the current one")
        decision = "promoted"
    else:
        if current is None:
            raise PromotionRefused(f"{spec.name} has no champion to roll back")
        # The promotion that installed the current champion names the one before it; rolling back
        # again walks further back the chain (a rollback record is never the way back).
        made = [r for r in history(store, spec.name) if r["version"] == previous and r["action"] == "promote"]
        target = made[-1]["previous"] if made else None
        if target is None:
            raise PromotionRefused(f"{spec.name} version {previous} is the first champion on record; "
                                   "there is no earlier champion to roll back to")
        mv = registry.get_version(client, spec.name, target)
        decision = "rolled back"
    loadable(client, mv)
    return {
        "id": uuid.uuid4().hex, "model": spec.name, "action": req.action, "version": str(mv.version),
        "previous": previous, "decision": decision, "reason": req.reason, "actor": req.actor,
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "dagster_run_id": req.dagster_run_id,
        "evidence": _evidence(mv), "policy": spec.promotion.model_dump(mode="json"),
    }


def loadable(client: MlflowClient, mv) -> None:
    """PromotionRefused unless ``mv``'s model files are whole: no alias moves onto a version that
    cannot be served (its artifacts lost behind the registry's back)."""
    try:
        registry.check_loadable(client, mv)
    except registry.RegistryError as exc:
        raise PromotionRefused(f"{exc}: it cannot be loaded, so it cannot be the champion "
                               f"(`ml-assets verify {mv.name} --repair` rebuilds what it can)") from None


def execute(client: MlflowClient, store: VersionStore, spec: ModelSpec, req: Request) -> tuple[dict, str]:
    """Carry out ``req`` (after finishing any promotion a crash left pending).

    Returns the record in effect and what happened: "done", "resumed" (a pending record was
    finished and it was this request) or "unchanged" (already in effect; nothing new written).
    An identity MLflow does not let move the alias gets registry.PermissionDenied before anything
    is written.
    """
    registry.check_can_set_alias(client, spec.name, registry.CHAMPION)
    operation = f"set alias {registry.CHAMPION}"
    left = pending(client, spec.name)
    if left is not None:
        with registry.refused_as(spec.name, operation):
            _apply(client, store, left)
        if left["action"] == req.action and (req.action == "rollback" or left["version"] == str(req.version)):
            return left, "resumed"
    record = plan(client, store, spec, req)
    if record is None:
        last = [r for r in history(store, spec.name) if r["version"] == str(req.version)]
        return (last[-1] if last else {"model": spec.name, "version": str(req.version)}), "unchanged"
    with registry.refused_as(spec.name, operation):
        client.set_registered_model_tag(spec.name, *pending_tag(record))
        _apply(client, store, record)
    return record, "done"


def _apply(client: MlflowClient, store: VersionStore, record: dict[str, Any]) -> None:
    """Idempotent: every step can run again with the same result."""
    model, version = record["model"], record["version"]
    client.set_registered_model_alias(model, registry.CHAMPION, version)
    append_log(store, record)
    summary = {k: record[k] for k in ("id", "action", "previous", "decision", "reason", "actor", "time")}
    client.set_model_version_tag(model, version, "promotion.last", json.dumps(summary, sort_keys=True))
    client.set_model_version_tag(model, version, f"promotion.{record['id']}", record["time"])
    if record["previous"]:
        client.set_model_version_tag(model, record["previous"], "promotion.replaced_by",
                                     json.dumps({"version": version, "id": record["id"], "time": record["time"]}))
    client.delete_registered_model_tag(model, PENDING_TAG)


def append_log(store: VersionStore, record: dict[str, Any], attempts: int = 5) -> str | None:
    """Append ``record`` to the promotions log on main (a branch, a commit, a merge); nothing if it
    is already there. Returns the main commit, or None when nothing was written."""
    model = record["model"]
    meta = {"promotion_id": record["id"], "action": record["action"], "model_version": record["version"],
            "previous_version": record["previous"] or "", "actor": record["actor"]}
    return append_record(store, repo_for_model(model), log_path(model), record,
                         f"{record['decision']} {model} version {record['version']}", meta, attempts)


def candidate(client: MlflowClient, spec: ModelSpec):
    """What automatic promotion would promote now, or (None, why not)."""
    current = registry.by_alias(client, spec.name, registry.CHAMPION)
    passed = client.search_model_versions(f"name='{spec.name}' and tags.gate='passed'")
    if not passed:
        return None, "no registered version has passed the promotion gate"
    newest = max(passed, key=lambda v: (VersionTags.from_tags(v.tags).partition, int(v.version)))
    tags = VersionTags.from_tags(newest.tags)
    if current is not None:
        if str(newest.version) == str(current.version):
            return None, f"version {current.version} is the champion and no newer version passed the gate"
        if tags.partition <= VersionTags.from_tags(current.tags).partition:
            return None, (f"the newest version that passed the gate ({newest.version}, partition "
                          f"{tags.partition}) is not newer than champion {current.version}")
    compared = tags.gate.gate_champion_version if tags.gate else "none"
    expected = str(current.version) if current is not None else "none"
    if compared != expected:
        return None, (f"version {newest.version} passed against champion {compared}, not the current {expected}: "
                      "its evidence is stale (re-run its evaluation)")
    try:
        registry.check_loadable(client, newest)
    except registry.RegistryError as exc:
        return None, f"version {newest.version} passed the gate but cannot be loaded: {exc}"
    return newest, f"version {newest.version} passed the gate against champion {expected}"
