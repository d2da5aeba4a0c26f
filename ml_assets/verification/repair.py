"""Rebuild what a verification found missing, from the sources and the records; never move an alias.

- A day whose objects (or features) are missing is ingested, validated and featurized again
  (``ml-assets backfill --force`` for that day). Objects and features are named by their sha256, so
  a source that still gives the same bytes puts back exactly the objects that were lost, and no new
  commit reaches main; a source that changed puts back nothing, and the next check says so.
- A version whose weights are missing (from the registry or the checkpoint store) is retrained from
  its records (``ml-assets reproduce``). Only weights that come out bit for bit the same are written
  back, where they were lost; anything else is reported and left alone.
- Aliases stay where they are: an alias on a version that still cannot load is reported, for a
  person to promote or roll back (both refuse a version that cannot load).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import tempfile
from pathlib import Path

import fsspec

from ml_assets.layout import FEATURE_STATE_FILE, MLFLOW_MODEL, sibling
from ml_assets.lineage import _read
from ml_assets.registry.record import VersionTags
from ml_assets.verification.check import Report

_DAY = re.compile(r"(\d{4}-\d{2}-\d{2})")


def repair(settings, spec, client, store, report: Report, workdir: Path) -> list[str]:
    """What was done and what could not be, a line each."""
    lines = _days(settings, spec, store, report)
    if client is not None:
        lines += _versions(client, spec.name, report, workdir)
    unrepairable = [f for f in report.findings if not f.days and f.subject.startswith("object ")]
    lines += [f"{f.subject}: not of one day, so no day's ingest rebuilds it; restore it from a backup"
              for f in unrepairable]
    return lines


def days_to_rebuild(report: Report) -> list[str]:
    days = {d for f in report.findings for d in f.days}
    days |= {m.group(1) for f in report.findings if f.version and ": features " in f.subject
             if (m := _DAY.search(f.subject))}
    return sorted(days)


def _days(settings, spec, store, report: Report) -> list[str]:
    from ml_assets import runs

    set_aside = getattr(store, "set_aside", None)
    for finding in report.findings:
        if finding.sha256 and "corrupt" in finding.problem and set_aside is not None:
            set_aside(finding.sha256)  # else the rewrite would find bytes at its name and keep them
    lines = []
    for day in days_to_rebuild(report):
        code = runs.backfill(settings, spec, dt.date.fromisoformat(day), dt.date.fromisoformat(day), force=True)
        lines.append(f"day {day}: " + ("ingested, validated and featurized again from its source" if code == 0
                                       else "its ingest failed (its reason is above)"))
    return lines


def _versions(client, model: str, report: Report, workdir: Path) -> list[str]:
    from ml_assets.audit import exported_weights, reproduce
    from ml_assets.code_version import package_code_version
    from ml_assets.registry import versions as registry

    lost = {v for v, ok in report.loadable.items() if not ok}
    lost |= {f.version for f in report.findings if f.version and "checkpoint in the checkpoint store" in f.subject}
    lines = []
    for version in sorted(lost, key=int):
        try:
            result = reproduce(client, model, version, workdir, package_code_version())
        except registry.RegistryError as exc:
            lines.append(f"version {version}: cannot be retrained: {exc}")
            continue
        if not result.identical:
            lines.append(f"version {version}: retrained, but not bit for bit (expected {result.expected_sha256[:12]}, "
                         f"got {(result.actual_sha256 or 'nothing')[:12]}: {'; '.join(result.reasons)}); nothing written")
            continue
        export = Path(result.output_dir)
        mv = registry.get_version(client, model, version)
        restored = _restore(client, mv, exported_weights(export), export / FEATURE_STATE_FILE)
        lines.append(f"version {version}: reproduced bit for bit; " +
                     (f"restored {', '.join(restored)}" if restored else "nothing was missing"))
    return lines


def _sha_of(uri: str) -> str | None:
    data = _read(uri)
    return hashlib.sha256(data).hexdigest() if data is not None else None


def _put(uri: str, data: bytes) -> None:
    fs, path = fsspec.core.url_to_fs(uri)
    fs.makedirs(fs._parent(path), exist_ok=True)
    fs.pipe_file(path, data)


def _restore(client, mv, weights: Path, state: Path) -> list[str]:
    """Write the reproduced files back where they are missing or wrong: the checkpoint store and the
    version's MLflow run. Each file is written only if it hashes to the version's record."""
    tags = VersionTags.from_tags(mv.tags)
    expected = {weights.name: tags.checkpoint_sha256, FEATURE_STATE_FILE: tags.feature_state_sha256}
    files = {name: path for name, path in ((weights.name, weights), (FEATURE_STATE_FILE, state))
             if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == expected[name]}
    restored = []
    if tags.checkpoint_uri:
        for name, path in files.items():
            uri = tags.checkpoint_uri if name == weights.name else sibling(tags.checkpoint_uri, name)
            if _sha_of(uri) != expected[name]:
                _put(uri, path.read_bytes())
                restored.append(uri)
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory(prefix="ml_assets-repair-") as tmp:
        try:
            held = Path(client.download_artifacts(mv.run_id, MLFLOW_MODEL, tmp)) / "artifacts"
        except MlflowException:  # the whole directory is gone: every file is missing
            held = Path(tmp) / "none"
        for name, path in files.items():
            if _sha_of(str(held / name)) != expected[name]:
                client.log_artifact(mv.run_id, str(path), f"{MLFLOW_MODEL}/artifacts")
                restored.append(f"{mv.source}/artifacts/{name}")
    return restored

