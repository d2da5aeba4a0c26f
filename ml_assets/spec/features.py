"""The spec's ``features`` section: the model's inputs, their transforms, and the columns built for them."""

from __future__ import annotations

from typing import Literal

import polars as pl
from pydantic import Field, field_validator, model_validator

from ml_assets.spec.base import CUSTOM_CHECK, StrictModel
from ml_assets.spec.validation import HolidaySpec


class AsOfSpec(StrictModel):
    column: str = Field(description="timestamp column, in the rows and in the dimension (not `on:`, which YAML 1.1 reads as true)")
    tolerance_hours: float | None = Field(default=None, gt=0, description="older dimension records are not matched")


class JoinSpec(StrictModel):
    dimension: str
    keys: list[str] = Field(default=[], description="columns of the rows equal to the dimension's")
    asof: AsOfSpec | None = Field(default=None, description=(
        "as-of join: per key, the latest dimension record at or before the row's timestamp, never a later one"))
    columns: dict[str, str] = Field(min_length=1, description="dimension column -> feature name")

    @model_validator(mode="after")
    def _keyed(self) -> JoinSpec:
        if not self.keys and self.asof is None:
            raise ValueError("a join needs keys, an asof timestamp, or both")
        return self


class Clip(StrictModel):
    min: float | None = None
    max: float | None = None


class Bucketize(StrictModel):
    buckets: int | None = Field(default=None, ge=2, le=1000, description="quantile buckets fitted on the training window")
    edges: list[float] | None = Field(default=None, min_length=1, description="fixed, increasing bucket edges")

    @model_validator(mode="after")
    def _one(self) -> Bucketize:
        if (self.buckets is None) == (self.edges is None):
            raise ValueError("bucketize takes either buckets (fitted quantiles) or edges (fixed)")
        if self.edges is not None and any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError(f"bucketize.edges must increase: {self.edges}")
        return self


class ClipStep(StrictModel):
    clip: Clip


class BucketizeStep(StrictModel):
    bucketize: Bucketize


NumericStep = Literal["log1p", "standardize"] | ClipStep | BucketizeStep


class NumericFeature(StrictModel):
    name: str
    transforms: list[NumericStep] = Field(default=["standardize"], description=(
        "applied in order: log1p, clip {min, max}, then standardize (fitted mean and sd) or bucketize "
        "(the bucket index becomes an embedded input)"))

    @model_validator(mode="after")
    def _order(self) -> NumericFeature:
        last = [i for i, t in enumerate(self.transforms) if t == "standardize" or isinstance(t, BucketizeStep)]
        if len(last) > 1 or (last and last[0] != len(self.transforms) - 1):
            raise ValueError(f"{self.name}: standardize or bucketize comes once, last")
        return self

    @property
    def bucketized(self) -> bool:
        return any(isinstance(t, BucketizeStep) for t in self.transforms)


class CategoricalFeature(StrictModel):
    name: str
    encoding: Literal["vocabulary", "hash"] = "vocabulary"
    min_frequency: int = Field(default=1, ge=1, description="vocabulary: rarer values go to the out-of-vocabulary index")
    buckets: int | None = Field(default=None, ge=2, le=1_000_000, description="hash: the number of buckets")

    @model_validator(mode="after")
    def _buckets(self) -> CategoricalFeature:
        if (self.encoding == "hash") != (self.buckets is not None):
            raise ValueError(f"{self.name}: buckets goes with encoding: hash, and only with it")
        return self


TIME_PARTS = ("hour", "day_of_week", "month", "day_of_year", "holiday")


class TimeSpec(StrictModel):
    column: str | None = Field(default=None, description="timestamp column (default: partitioning.timestamp_column)")
    parts: list[Literal["hour", "day_of_week", "month", "day_of_year", "holiday"]] = Field(min_length=1)
    prefix: str = Field(default="local_", description="output columns are <prefix><part>, in the partition's time zone")
    holidays: HolidaySpec | None = Field(default=None, description="the calendar of the holiday part (its window_days counts)")

    @model_validator(mode="after")
    def _calendar(self) -> TimeSpec:
        if "holiday" in self.parts and self.holidays is None:
            raise ValueError("the holiday part needs holidays: {country: ...}")
        return self

    @property
    def columns(self) -> list[str]:
        return [f"{self.prefix}{p}" for p in self.parts]


class RollingSpec(StrictModel):
    name: str = Field(description="the output column")
    by: list[str] = Field(default=[], description="group columns (empty: over all rows)")
    expression: str = Field(description="polars SQL expression over a past row, e.g. 'dep_delay >= 15'")
    aggregate: Literal["mean", "sum", "count", "min", "max"] = "mean"
    days: int = Field(ge=1, le=366, description="the previous days aggregated; the row's own day never is")

    @property
    def input_columns(self) -> list[str]:
        return pl.sql_expr(self.expression).meta.root_names()


class CustomTransform(StrictModel):
    function: str = Field(description="'package.module:function' taking and returning a polars LazyFrame")
    columns: list[str] = Field(min_length=1, description="the columns it adds")


class FeaturesSpec(StrictModel):
    numeric: list[NumericFeature] = []
    categorical: list[CategoricalFeature] = []
    joins: list[JoinSpec] = []
    time: TimeSpec | None = None
    rolling: list[RollingSpec] = []
    custom: list[CustomTransform] = []

    @field_validator("numeric", "categorical", mode="before")
    @classmethod
    def _names_are_shorthand(cls, value):
        return [{"name": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _some(self) -> FeaturesSpec:
        if not self.numeric and not self.categorical:
            raise ValueError("declare at least one numeric or categorical feature")
        names = [f.name for f in [*self.numeric, *self.categorical]]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{twice} declared more than once (numeric and categorical are one list of inputs)")
        for c in self.custom:
            if not CUSTOM_CHECK.match(c.function):
                raise ValueError(f"custom: {c.function!r} is not 'package.module:function'")
        return self

    @property
    def joined_columns(self) -> dict[str, str]:
        return {feature: join.dimension for join in self.joins for feature in join.columns.values()}

    @property
    def numeric_names(self) -> list[str]:
        return [f.name for f in self.numeric]

    @property
    def categorical_names(self) -> list[str]:
        return [f.name for f in self.categorical]

    @property
    def derived_columns(self) -> list[str]:
        """Columns the build adds besides the raw ones: joins, time parts, rolling aggregates, custom."""
        return [*self.joined_columns, *(self.time.columns if self.time else []),
                *(r.name for r in self.rolling), *(c for t in self.custom for c in t.columns)]
