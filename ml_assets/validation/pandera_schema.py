"""The spec's data schema declared for pandera: exact column types, whole-number bounds on integer
columns, one range check per bounded column, and the keys as the ``unique_keys`` check.
"""

from __future__ import annotations

import math

import pandera.polars as pa
import polars as pl

from ml_assets.spec import POLARS_DTYPES, ColumnSchema, DataSchema
from ml_assets.validation.keys import UNIQUE_KEYS, unique_keys

DTYPES = POLARS_DTYPES


def expected_dtypes(schema: DataSchema, frame: pl.DataFrame) -> dict[str, pl.DataType]:
    """Each declared column's polars type, exactly: a datetime takes the frame's time unit (Parquet
    writers differ; the unit does not change a value's meaning), never its time zone."""
    out = {}
    for name, col in schema.columns.items():
        have = frame.schema.get(name)
        unit = have.time_unit if isinstance(have, pl.Datetime) else "us"
        out[name] = col.polars_dtype(unit)
    return out


def mistyped(schema: DataSchema, frame: pl.DataFrame) -> set[str]:
    """Declared columns the frame has with another type: the schema check reports them, and their
    range and category checks are not run (they would compare values of the wrong type)."""
    expected = expected_dtypes(schema, frame)
    return {name for name in schema.columns if name in frame.columns and frame.schema[name] != expected[name]}


def build_schema(schema: DataSchema, api=pa, dtypes: dict | None = None, frame: pl.DataFrame | None = None):
    """The spec's schema as pandera declares it: the polars API by default, with the exact types
    ``expected_dtypes`` gives for ``frame`` and no value checks on its mistyped columns;
    ``api=pandera.pandas`` with pandas dtypes gives the same schema for pandas (the benchmark's
    baseline), its keys declared with pandera's own ``unique=``."""
    exact = expected_dtypes(schema, frame) if frame is not None else {}
    skip = mistyped(schema, frame) if frame is not None else set()
    dtypes = dtypes or DTYPES
    columns = {}
    for name, col in schema.columns.items():
        checks = []
        if name in skip:
            columns[name] = api.Column(exact[name], nullable=col.nullable)
            continue
        low, high = bounds(col)
        if low is not None and high is not None:  # one pass over the column, not two
            checks.append(api.Check.in_range(low, high))
        elif low is not None:
            checks.append(api.Check.ge(low))
        elif high is not None:
            checks.append(api.Check.le(high))
        if col.allowed is not None:
            checks.append(api.Check.isin(col.allowed))
        columns[name] = api.Column(exact.get(name, dtypes[col.dtype]), checks=checks, nullable=col.nullable)
    if api is not pa or not schema.keys:
        return api.DataFrameSchema(columns, strict=schema.strict, unique=schema.keys or None)
    return pa.DataFrameSchema(columns, strict=schema.strict,
                              checks=[pa.Check(unique_keys(schema.keys), name=UNIQUE_KEYS)])


def bounds(col: ColumnSchema) -> tuple[float | None, float | None]:
    """The column's range in the column's own terms: whole numbers for an integer column (the
    spec's bounds are floats; polars compares an Int64 column with a float by casting every value,
    much slower). On integers ``x >= 1.5`` and ``x >= 2`` agree, and an
    integer comparison is exact past 2**53 where a float one rounds."""
    low, high = col.min, col.max
    if col.dtype != "int64":
        return low, high
    low = None if low is None else math.ceil(low)
    high = None if high is None else math.floor(high)
    if low is not None and high is not None and low > high:  # no whole number in range: every row fails
        return col.min, col.max
    return low, high
