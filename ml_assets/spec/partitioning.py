"""The spec's ``partitioning`` section: the days a model has, and the column that dates each row."""

from __future__ import annotations

import datetime as dt

from pydantic import Field, field_validator, model_validator

from ml_assets.spec.base import StrictModel, check_zone


class PartitioningSpec(StrictModel):
    start: dt.date
    end: dt.date | None = None
    timezone: str = "UTC"
    timestamp_column: str = Field(description=(
        "the column that dates each row: a date (the row's day), a datetime, or ISO text"))
    timestamp_format: str | None = Field(default=None, description=(
        "strftime format of the timestamp column when it holds strings, e.g. '%Y-%m-%dT%H:%M:%S%#z' "
        "(default: inferred, which is slower to parse); a value that does not match is unreadable"))

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        return check_zone(value)

    @model_validator(mode="after")
    def _order(self) -> PartitioningSpec:
        if self.end is not None and self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")
        return self
