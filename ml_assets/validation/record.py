"""What validated_snapshot tells the next stage: the day published on main, and the merge's metadata."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from ml_assets.records.base import Record, RecordError, field
from ml_assets.records.provenance import Provenance, StoredObject


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
    calibration: str = ""
    """The calibration whose limits judged the day's drift: its version, history and target rate."""


@dataclass(frozen=True, kw_only=True)
class PublishCommit:
    """The version-store metadata of the merge that published a day on main."""

    provenance: Provenance
    audited_commit: str
    checks_passed: str = ""
    waived: str = ""
    warnings: str = ""
    calibration: str = ""

    def to_commit_metadata(self) -> dict[str, str]:
        extra = {"waived": self.waived, "warnings": self.warnings, "calibration": self.calibration}
        return {**self.provenance.to_tags(), "audited_commit": self.audited_commit,
                "checks_passed": self.checks_passed, **{k: v for k, v in extra.items() if v}}

    @classmethod
    def from_commit_metadata(cls, meta: Mapping[str, str]) -> Self:
        if "audited_commit" not in meta:
            raise RecordError(f"not a publishing merge: its metadata has no 'audited_commit' ({sorted(meta)})")
        return cls(provenance=Provenance.from_tags(meta), audited_commit=meta["audited_commit"],
                   **{k: meta.get(k, "") for k in ("checks_passed", "waived", "warnings", "calibration")})

    @staticmethod
    def is_publish(meta: Mapping[str, Any], partition: str) -> bool:
        return meta.get("partition") == partition and "audited_commit" in meta
