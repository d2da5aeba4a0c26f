"""The pandera (polars backend) schema a spec declares, run once and split into named checks.

Validation runs on the collected DataFrame: on a LazyFrame pandera checks only columns and dtypes.
The schema is declared in ``pandera_schema``, its keys checked by ``keys``; ``verdict`` decides valid
frames in one pass, and ``failures`` reads pandera's failure cases when a frame is not.
"""

from __future__ import annotations

import pandera.polars as pa
import polars as pl

from ml_assets.spec import DataSchema
from ml_assets.validation.failures import check_outcome, classified
from ml_assets.validation.keys import UNIQUE_KEYS, unique_keys
from ml_assets.validation.names import KEYS, NULLS, RANGES, SCHEMA
from ml_assets.validation.outcome import CheckOutcome
from ml_assets.validation.pandera_schema import (
    DTYPES,
    bounds,
    build_schema,
    expected_dtypes,
    mistyped,
)
from ml_assets.validation.verdict import FEW_CATEGORIES, passes

# The validation's public names, importable from here wherever they are defined.
__all__ = [
    "DTYPES", "FEW_CATEGORIES", "KEYS", "NULLS", "RANGES", "SCHEMA", "UNIQUE_KEYS", "bounds", "build_schema",
    "expected_dtypes", "mistyped", "passes", "schema_checks", "unique_keys",
]


def schema_checks(schema: DataSchema, frame: pl.DataFrame, known_valid: bool = False) -> dict[str, CheckOutcome]:
    """The schema (columns, dtypes), nulls, ranges and categories, and duplicate keys checks.
    ``known_valid``: pandera already passed rows that include these (the fast replay checks a range of
    days at once); the day's own share of nulls is still judged here."""
    cases = pl.DataFrame(schema={"column": pl.String, "check": pl.String, "failure_case": pl.String, "index": pl.Int64})
    validator = None if known_valid else build_schema(schema, frame=frame)
    try:
        if validator is not None and not passes(schema, validator, frame):
            validator.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        cases = exc.failure_cases.select(
            pl.col("column").cast(pl.String), pl.col("check").cast(pl.String),
            pl.col("failure_case").cast(pl.String), pl.col("index").cast(pl.Int64))
    cases = classified(schema, cases)
    return {kind: check_outcome(kind, cases, schema, frame) for kind in (SCHEMA, NULLS, RANGES, KEYS)}
