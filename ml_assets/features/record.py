"""What features tells training and evaluation: the day's feature rows, content-addressed."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ml_assets.records.base import Record, field
from ml_assets.trainer.config import DataRef


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
