"""What the data stages tell the next: the day's raw commit, its published snapshot, its features;
and who wrote a version-store commit (the provenance every write to the store carries)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self


@dataclass(frozen=True, kw_only=True)
class StoredObject:
    """One table of the day as stored in the version store."""

    table: str
    path: str
    sha256: str
    bytes: int
    rows: int


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


