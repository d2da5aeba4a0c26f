"""What the data stages tell the next: the day's raw commit, its published snapshot, its features;
and who wrote a version-store commit (the provenance every write to the store carries)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from ml_assets.records.base import Record, RecordError, field
from ml_assets.trainer.config import DataRef


@dataclass(frozen=True, kw_only=True)
class StoredObject:
    """One table of the day as stored in the version store."""

    table: str
    path: str
    sha256: str
    bytes: int
    rows: int


@dataclass(frozen=True, kw_only=True)
class RawRecord(Record):
    """raw_data: the day's source rows, committed to a fresh branch (not on main yet)."""

    repository: str
    branch: str
    commit: str
    rows: int
    objects: tuple[StoredObject, ...] = field("json", of=StoredObject)
    source_files: dict[str, str] = field("json")
    """Each source file read, by URL, with its sha256."""


@dataclass(frozen=True, kw_only=True)
class SnapshotRecord(Record):
    """validated_snapshot: the day after its checks, merged into main; ``commit`` is the data version."""

    repository: str
    commit: str
    audited_commit: str
    """The branch commit the checks judged (after quarantine, when rows were moved aside)."""
    rows: int
    objects: tuple[StoredObject, ...] = field("json", of=StoredObject)
    """The objects as published: after quarantine, the clean rows' bytes and counts."""


@dataclass(frozen=True, kw_only=True)
class FeaturesRecord(Record):
    """features: the day's feature rows, content-addressed, built from one main commit."""

    data_commit: str
    repository: str
    uri: str = field("path")
    sha256: str
    bytes: int
    rows: int
    rows_without_target: int
    columns: list[str] = field("json")
    rolling_days_read: list[str] | None = field("json", default=None)
    rolling_days_missing: list[str] | None = field("json", default=None)

    def ref(self, day: dt.date | str) -> DataRef:
        day = day.isoformat() if isinstance(day, dt.date) else day
        return DataRef(uri=str(self.uri), sha256=self.sha256, day=day, commit=self.data_commit)


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Which run wrote something, for which model and partition, with which code."""

    dagster_run_id: str
    dagster_run_url: str = ""
    partition: str = ""
    model: str = ""
    code_version: str = ""

    def to_tags(self) -> dict[str, str]:
        return {"dagster_run_id": self.dagster_run_id, "dagster_run_url": self.dagster_run_url,
                "partition": self.partition, "model": self.model, "code_version": self.code_version}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Self:
        return cls(**{name: tags.get(name, "") for name in cls.__dataclass_fields__})


@dataclass(frozen=True, kw_only=True)
class RawCommit:
    """The version-store metadata of a raw_data commit."""

    provenance: Provenance
    source_files: dict[str, str]

    def to_commit_metadata(self) -> dict[str, str]:
        return {**self.provenance.to_tags(), "source_files": json.dumps(self.source_files, sort_keys=True)}

    @classmethod
    def from_commit_metadata(cls, meta: Mapping[str, str]) -> Self:
        return cls(provenance=Provenance.from_tags(meta), source_files=json.loads(meta.get("source_files") or "{}"))


@dataclass(frozen=True, kw_only=True)
class PublishCommit:
    """The version-store metadata of the merge that published a day on main."""

    provenance: Provenance
    audited_commit: str
    checks_passed: str = ""
    waived: str = ""
    warnings: str = ""

    def to_commit_metadata(self) -> dict[str, str]:
        extra = {"waived": self.waived, "warnings": self.warnings}
        return {**self.provenance.to_tags(), "audited_commit": self.audited_commit,
                "checks_passed": self.checks_passed, **{k: v for k, v in extra.items() if v}}

    @classmethod
    def from_commit_metadata(cls, meta: Mapping[str, str]) -> Self:
        if "audited_commit" not in meta:
            raise RecordError(f"not a publishing merge: its metadata has no 'audited_commit' ({sorted(meta)})")
        return cls(provenance=Provenance.from_tags(meta), audited_commit=meta["audited_commit"],
                   **{k: meta.get(k, "") for k in ("checks_passed", "waived", "warnings")})

    @staticmethod
    def is_publish(meta: Mapping[str, Any], partition: str) -> bool:
        return meta.get("partition") == partition and "audited_commit" in meta
