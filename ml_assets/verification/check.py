"""Whether a model's stores are whole, and what depends on what is not.

Three walks, each reading every byte it judges:
- the version store: every object of every commit reachable from ``main`` (a root commit's tree,
  then what each commit changed from each parent), each read once and hashed against its record;
- the registry: every version's chain, as ``ml-assets lineage`` walks it (its registered weights and
  feature state, its checkpoint, its features, its days' objects, its sources);
- the aliases: each must point at a version that loads.

A problem is reported with what depends on it: an object with its days and the versions that learned
from it, a version with the aliases on it. Source files that changed or cannot be read are notes:
they are not the platform's to keep, but they say a rebuild from sources cannot be bit for bit.
Dagster-free: the CLI, the scheduled job and the tests share it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ml_assets.names import repo_for_model
from ml_assets.versioning import NotFound, VersionStore, VersionStoreError

DAY = re.compile(r"date=(\d{4}-\d{2}-\d{2})")
SOURCE = "source file "
LOAD_CHECKS = ("registered weights", "feature state (MLflow")
"""A version whose failed checks start with these cannot be loaded (served, promoted, compared)."""


@dataclass(frozen=True)
class Finding:
    subject: str
    """What is broken: ``object rows/date=…/part-0.parquet``, ``version 3``, ``alias @champion``."""
    problem: str
    days: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    sha256: str = ""
    """An object's: what a repair must bring back."""
    version: str = ""
    """The version a finding is about (its aliases depend on it)."""

    def line(self) -> str:
        needed = [*(f"day {d}" for d in self.days), *(f"version {v}" for v in self.versions),
                  *(f"@{a}" for a in self.aliases)]
        return f"{self.subject}: {self.problem}" + (f" (needed by {', '.join(needed)})" if needed else "")


@dataclass
class Report:
    model: str
    repository: str
    commits: int = 0
    objects: int = 0
    loadable: dict[str, bool] = field(default_factory=dict)
    """Each registered version: whether its registered model files load."""
    aliases: dict[str, str] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        counted = (f"{self.commits} commit(s) and {self.objects} object(s) of {self.repository}, "
                   f"{len(self.loadable)} version(s), {len(self.aliases)} alias(es)")
        if self.whole:
            return f"{self.model}: whole: {counted} checked"
        return f"{self.model}: {len(self.findings)} problem(s) in {counted}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "whole": self.whole, "summary": self.summary()}


def check(client, store: VersionStore, model: str) -> Report:
    """``client``: an MLflow client of the registry, or None to check the version store only."""
    report = Report(model, repo_for_model(model))
    objects = _store(store, report)
    if client is not None and client.search_registered_models(filter_string=f"name='{model}'"):
        _versions(client, store, report, objects)
        _aliases(client, report)
    return report


def _reachable(store: VersionStore, repo: str) -> tuple[int, dict[str, tuple[str, set[str]]]]:
    """Every object of every commit reachable from main, by sha256: a commit that holds it and the
    paths it is stored at."""
    held: dict[str, tuple[str, set[str]]] = {}
    try:
        commits = store.log(repo, "main")
    except NotFound:  # no repository yet: nothing ingested
        return 0, held
    for commit in commits:
        changed = [(o.path, o.sha256) for o in store.list_objects(repo, commit.id)] if not commit.parents else [
            (c.path, c.sha256) for parent in commit.parents for c in store.diff(repo, parent, commit.id)
            if c.type != "removed"]
        for path, sha in changed:
            held.setdefault(sha, (commit.id, set()))[1].add(path)
    return len(commits), held


def _store(store: VersionStore, report: Report) -> dict[str, Finding]:
    """Each object read and hashed once; the broken ones by path (to attach versions to)."""
    report.commits, held = _reachable(store, report.repository)
    report.objects = len(held)
    broken: dict[str, Finding] = {}
    for sha, (commit, paths) in sorted(held.items()):
        path = sorted(paths)[0]
        try:
            store.get_object(report.repository, commit, path)
        except VersionStoreError as exc:
            days = tuple(sorted({m.group(1) for p in paths if (m := DAY.search(p))}))
            problem = "corrupt: its bytes do not hash to its record" if "corrupt" in str(exc) else "missing"
            finding = Finding(f"object {', '.join(sorted(paths))}", f"{problem} ({sha[:12]}, first in commit "
                              f"{commit[:12]})", days=days, sha256=sha)
            report.findings.append(finding)
            for p in paths:
                broken[p] = finding
    return broken


def _versions(client, store: VersionStore, report: Report, broken: dict[str, Finding]) -> None:
    from ml_assets.lineage import LineageError, trace
    from ml_assets.registry.record import VersionTags

    needs: dict[str, set[str]] = {path: set() for path in broken}
    read: dict[str, set[str]] = {}  # each version's days: those it trained, validated and was tested on
    for mv in sorted(client.search_model_versions(f"name='{report.model}'"), key=lambda v: int(v.version)):
        version = str(mv.version)
        tags = VersionTags.from_tags(mv.tags)
        read[version] = {*tags.data_commits, *tags.test_days}
        try:
            lineage = trace(client, store, report.model, version=version, parents=False)
        except LineageError as exc:
            report.loadable[version] = False
            report.findings.append(Finding(f"version {version}", str(exc).removeprefix(f"{report.model} version "
                                                                                       f"{version}: "),
                                           version=version))
            continue
        failed = [c for c in lineage.checks if c.status != "ok"]
        report.loadable[version] = not any(c.what.startswith(LOAD_CHECKS) for c in failed)
        for c in failed:
            path = c.what.removeprefix("object ").rsplit(" of ", 1)[0]
            if path in needs:  # the store walk reported it: say this version needs it
                needs[path].add(version)
                continue
            state = "cannot be read" if c.actual is None else f"does not match its record (expected {c.expected[:12]})"
            finding = Finding(f"version {version}: {c.what}", f"{state} at {c.where}", version=version)
            (report.notes if c.what.startswith(SOURCE) else report.findings).append(finding)
    # The versions that learned from each broken object.
    report.findings[:] = [
        replace(f, versions=tuple(sorted(
            {v for p in f.subject.removeprefix("object ").split(", ") for v in needs.get(p, ())}
            | {v for v, days in read.items() if days & set(f.days)}, key=int))) if f.sha256 else f
        for f in report.findings]


def _aliases(client, report: Report) -> None:
    aliases = dict(getattr(client.get_registered_model(report.model), "aliases", {}) or {})
    report.aliases = {alias: str(version) for alias, version in sorted(aliases.items())}
    by_version: dict[str, list[str]] = {}
    for alias, version in report.aliases.items():
        by_version.setdefault(version, []).append(alias)
        if not report.loadable.get(version, False):
            report.findings.append(Finding(f"alias @{alias}", f"points at version {version}, which cannot load"))
    report.findings[:] = [
        replace(f, aliases=tuple(sorted({a for v in (f.versions or (f.version,)) for a in by_version.get(v, ())})))
        for f in report.findings]
