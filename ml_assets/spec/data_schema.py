"""The spec's ``schema`` section: the raw columns, their types and the values they may hold."""

from __future__ import annotations

from typing import Literal

import polars as pl
from pydantic import Field, model_validator

from ml_assets.spec.base import StrictModel, check_zone

DType = Literal["int64", "float64", "string", "bool", "date", "datetime"]
POLARS_DTYPES: dict[str, type[pl.DataType]] = {
    "int64": pl.Int64, "float64": pl.Float64, "string": pl.String, "bool": pl.Boolean, "date": pl.Date,
    "datetime": pl.Datetime,
}
# Column types a partition's timestamp can be read from: a day, a point in time, or its ISO text.
TIMESTAMP_DTYPES = ("date", "datetime", "string")


class ColumnSchema(StrictModel):
    dtype: DType
    timezone: str | None = Field(default=None, description=(
        "datetime: the time zone the column's values carry (e.g. UTC); unset: naive values, read as UTC"))
    nullable: bool = False
    max_null_fraction: float | None = Field(
        default=None, ge=0, le=1, description="with nullable: the largest share of nulls a day may have")
    min: float | None = None
    max: float | None = None
    allowed: list[str] | None = None
    unique: bool = False
    after_event: bool = Field(default=False, description=(
        "known only once the predicted event has happened (e.g. the actual departure time): never a "
        "feature, a join key or a rolling group; rolling aggregates may read it from past days"))

    @model_validator(mode="after")
    def _range(self) -> ColumnSchema:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        if (self.min is not None or self.max is not None) and self.dtype not in ("int64", "float64"):
            raise ValueError(f"min/max apply to numeric columns, not {self.dtype}")
        if self.allowed is not None and self.dtype != "string":
            raise ValueError("allowed values apply to string columns")
        if self.max_null_fraction is not None and not self.nullable:
            raise ValueError("max_null_fraction applies to nullable columns (a non-nullable one allows none)")
        if self.timezone is not None:
            if self.dtype != "datetime":
                raise ValueError(f"timezone applies to datetime columns, not {self.dtype}")
            check_zone(self.timezone)
        return self

    def polars_dtype(self, time_unit: str = "us") -> pl.DataType:
        """The column's polars type; a datetime's unit is the file's (Parquet writers differ), its zone the spec's."""
        if self.dtype == "datetime":
            return pl.Datetime(time_unit, self.timezone)  # type: ignore[arg-type]
        return POLARS_DTYPES[self.dtype]()


class DataSchema(StrictModel):
    columns: dict[str, ColumnSchema] = Field(min_length=1)
    strict: bool = True
    keys: list[str] = Field(default=[], description="columns that together identify a row: no duplicates")

    @model_validator(mode="after")
    def _keys_known(self) -> DataSchema:
        unknown = [k for k in self.keys if k not in self.columns]
        if unknown:
            raise ValueError(f"keys {unknown} are not declared columns")
        return self
