"""The pandera (polars backend) schema a spec declares, and validation of a collected frame."""

from __future__ import annotations

from dataclasses import dataclass

import pandera.polars as pa
import polars as pl

from ml_assets.spec import DataSchema

DTYPES: dict[str, type[pl.DataType]] = {
    "int64": pl.Int64, "float64": pl.Float64, "string": pl.String, "bool": pl.Boolean, "datetime": pl.Datetime,
}
MAX_SAMPLE = 50


@dataclass(frozen=True)
class ValidationReport:
    passed: bool
    rows: int
    failures: int
    by_check: dict[str, int]
    sample: pl.DataFrame  # up to MAX_SAMPLE failure cases

    def summary(self, where: str) -> str:
        if self.passed:
            return f"{where}: all {self.rows} rows pass the schema"
        worst = ", ".join(f"{k} ({v})" for k, v in sorted(self.by_check.items(), key=lambda kv: -kv[1])[:5])
        return f"{where}: {self.failures} schema failure(s) in {self.rows} rows: {worst}"


def build_schema(schema: DataSchema) -> pa.DataFrameSchema:
    columns = {}
    for name, col in schema.columns.items():
        checks = []
        if col.min is not None:
            checks.append(pa.Check.ge(col.min))
        if col.max is not None:
            checks.append(pa.Check.le(col.max))
        if col.allowed is not None:
            checks.append(pa.Check.isin(col.allowed))
        columns[name] = pa.Column(DTYPES[col.dtype], checks=checks, nullable=col.nullable, unique=col.unique)
    return pa.DataFrameSchema(columns, strict=schema.strict)


def validate_frame(schema: DataSchema, frame: pl.DataFrame) -> ValidationReport:
    """Validate a collected DataFrame: on a LazyFrame pandera checks only columns and dtypes."""
    try:
        build_schema(schema).validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        cases = exc.failure_cases.with_columns(
            pl.concat_str(pl.col("column").fill_null("(table)"), pl.lit(": "), pl.col("check")).alias("failure")
        )
        by_check = dict(cases.group_by("failure").len().iter_rows())
        sample = cases.select("column", "check", pl.col("failure_case").cast(pl.String), "index").head(MAX_SAMPLE)
        return ValidationReport(False, frame.height, cases.height, by_check, sample)
    return ValidationReport(True, frame.height, 0, {}, pl.DataFrame())
