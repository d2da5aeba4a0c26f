"""What raw_data tells the next stage: the day's source rows on a fresh branch, and that commit's metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from ml_assets.records.base import Record, field
from ml_assets.records.provenance import Provenance, StoredObject


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
class RawCommit:
    """The version-store metadata of a raw_data commit."""

    provenance: Provenance
    source_files: dict[str, str]

    def to_commit_metadata(self) -> dict[str, str]:
        return {**self.provenance.to_tags(), "source_files": json.dumps(self.source_files, sort_keys=True)}

    @classmethod
    def from_commit_metadata(cls, meta: Mapping[str, str]) -> Self:
        return cls(provenance=Provenance.from_tags(meta), source_files=json.loads(meta.get("source_files") or "{}"))
