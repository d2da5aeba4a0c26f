"""pandera's failure cases read as the snapshot's named checks: each case's kind of check, and each
check's outcome, with a summary that names the values to fix and the rows that failed.
"""

from __future__ import annotations

import polars as pl

from ml_assets.spec import DataSchema
from ml_assets.validation.keys import UNIQUE_KEYS
from ml_assets.validation.names import KEYS, NULLS, RANGES, SCHEMA
from ml_assets.validation.outcome import MAX_FAILING_ROWS, CheckOutcome
from ml_assets.validation.pandera_schema import bounds

# A failure's summary names up to this many of the values that failed (each cut to _VALUE_CHARS).
_EXAMPLES = 3
_VALUE_CHARS = 40


def classified(schema: DataSchema, cases: pl.DataFrame) -> pl.DataFrame:
    """pandera's failure cases with the kind of check each belongs to, a range failure named by the
    side it fell on, and the column a column-set failure is about."""
    cases = _split_ranges(schema, cases)
    kind = pl.col("check").map_elements(_kind, return_dtype=pl.String)
    return cases.with_columns(
        kind.alias("kind"),
        # Column-set failures name the column in failure_case, not in column.
        pl.when(pl.col("check").is_in(["column_in_schema", "column_in_dataframe"]))
        .then(pl.col("failure_case")).otherwise(pl.col("column")).alias("column"),
    )


def check_outcome(kind: str, cases: pl.DataFrame, schema: DataSchema, frame: pl.DataFrame) -> CheckOutcome:
    """One named check's outcome from the ``classified`` failure cases of its kind."""
    mine = cases.filter(pl.col("kind") == kind) if cases.height else cases
    if not mine.height:  # nothing failed (most days): no queries on the failure cases
        counts: dict[str, int] = {}
        problems = _null_fraction_problems(schema, frame, counts) if kind == NULLS else []
        return CheckOutcome(name=kind, passed=not problems,
                            summary="; ".join(problems) if problems else f"all {frame.height} rows pass",
                            counts=counts, observed={"rows": frame.height, "failures": sum(counts.values())},
                            expected={"failures": 0})
    grouped = mine.group_by("column", "check", maintain_order=True).len()
    counts = {f"{c or '(table)'}: {k}": n for c, k, n in grouped.iter_rows()}
    problems = [_describe(c, k, n, _failing_values(mine, c, k)) for c, k, n in grouped.iter_rows()]
    if kind == NULLS:
        problems += _null_fraction_problems(schema, frame, counts)
    failing = _failing_rows(frame, mine) if kind != SCHEMA else None
    indices = set(mine["index"].drop_nulls().to_list()) if kind != SCHEMA else set()
    return CheckOutcome(
        name=kind, passed=not problems,
        summary="; ".join(problems) if problems else f"all {frame.height} rows pass",
        counts=counts, observed={"rows": frame.height, "failures": sum(counts.values())},
        expected={"failures": 0}, failing_rows=failing, row_indices=indices,
    )


def _kind(check: str) -> str:
    if check in ("column_in_schema", "column_in_dataframe") or check.startswith("dtype("):
        return SCHEMA
    if check == "not_nullable":
        return NULLS
    if check == UNIQUE_KEYS or "uniqueness" in check:
        return KEYS
    return RANGES


def _shown(value: str | None) -> str:
    if value is None:
        return "null"
    return repr(value if len(value) <= _VALUE_CHARS else value[:_VALUE_CHARS] + "…")


def _describe(column: str | None, check: str, count: int, values: list[str | None] | None = None) -> str:
    text = _describe_count(column, check, count)
    if check.startswith("dtype(") and values:
        return f"{text} (it is {values[0]}): its range and category checks were not run"
    if not values:
        return text
    if check.startswith("greater_than_or_equal_to("):
        return f"{text} (lowest {values[0]})"
    if check.startswith("less_than_or_equal_to("):
        return f"{text} (highest {values[0]})"
    if check.startswith("isin("):
        shown = ", ".join(_shown(v) for v in values[:_EXAMPLES])
        return f"{text} ({shown}{', …' if len(values) > _EXAMPLES else ''})"
    return text


def _describe_count(column: str | None, check: str, count: int) -> str:
    rows = f"{count} row{'s' if count != 1 else ''}"
    if check == "column_in_dataframe":
        return f"column {column!r} is missing"
    if check == "column_in_schema":
        return f"column {column!r} is not in the schema"
    if check.startswith("dtype("):
        return f"column {column!r} is not {check[6:-1].strip(chr(39))}"  # _describe adds what it is
    if check == "not_nullable":
        return f"{column}: {rows} null (not allowed)"
    if check == UNIQUE_KEYS or "uniqueness" in check:
        return f"{rows} share a key with another row"
    if check.startswith("greater_than_or_equal_to("):
        return f"{column}: {rows} below {check[25:-1]}"
    if check.startswith("less_than_or_equal_to("):
        return f"{column}: {rows} above {check[22:-1]}"
    if check.startswith("isin("):
        return f"{column}: {rows} outside the allowed categories"
    return f"{column}: {rows} fail {check}"


def _split_ranges(schema: DataSchema, cases: pl.DataFrame) -> pl.DataFrame:
    """An ``in_range(min, max)`` failure says which side it fell on: a value below the minimum is
    reported as failing ``greater_than_or_equal_to(min)``, above the maximum as failing
    ``less_than_or_equal_to(max)``, as if the two bounds had been two checks."""
    bounded = []
    for name, col in schema.columns.items():
        low, high = bounds(col)
        if low is not None and high is not None:
            bounded.append((name, float(low), str(low), str(high)))
    if not bounded or cases.height == 0:
        return cases
    sides = pl.DataFrame(bounded, schema={"column": pl.String, "__min": pl.Float64, "__low": pl.String,
                                          "__high": pl.String}, orient="row")
    value = pl.col("failure_case").cast(pl.Float64, strict=False)
    return cases.join(sides, on="column", how="left", maintain_order="left").with_columns(
        pl.when(~pl.col("check").str.starts_with("in_range(")).then(pl.col("check"))
        .when(value < pl.col("__min")).then(pl.format("greater_than_or_equal_to({})", pl.col("__low")))
        .otherwise(pl.format("less_than_or_equal_to({})", pl.col("__high"))).alias("check"),
    ).drop("__min", "__low", "__high")


def _failing_values(cases: pl.DataFrame, column: str | None, check: str) -> list[str | None] | None:
    """What a failure's summary shows of the values a column's check failed on, so the reader learns
    what to fix without opening the table: for a bound the most extreme value, for a category check
    the first distinct ones (one more than shown, to tell whether there are more)."""
    value = pl.col("failure_case")
    if check.startswith("greater_than_or_equal_to("):
        picked = value.sort_by(value.cast(pl.Float64, strict=False)).head(1)
    elif check.startswith("less_than_or_equal_to("):
        picked = value.sort_by(value.cast(pl.Float64, strict=False), descending=True).head(1)
    elif check.startswith("isin("):
        picked = value.unique(maintain_order=True).head(_EXAMPLES + 1)
    elif check.startswith("dtype("):  # the failure case is the column's actual type
        picked = value.head(1)
    else:
        return None
    mine = cases.filter((pl.col("column") == column) & (pl.col("check") == check))
    return mine.select(picked).to_series().to_list()


def _null_fraction_problems(schema: DataSchema, frame: pl.DataFrame, counts: dict[str, int]) -> list[str]:
    problems = []
    for name, col in schema.columns.items():
        if col.max_null_fraction is None or name not in frame.columns or frame.height == 0:
            continue
        nulls = frame[name].null_count()
        if nulls / frame.height > col.max_null_fraction:
            counts[f"{name}: null_fraction"] = nulls
            problems.append(f"{name}: {nulls / frame.height:.1%} null ({nulls} of {frame.height} rows), "
                            f"more than the allowed {col.max_null_fraction:.0%}")
    return problems


def _failing_rows(frame: pl.DataFrame, cases: pl.DataFrame) -> pl.DataFrame | None:
    rows = cases.drop_nulls("index").group_by("index", maintain_order=True).agg(
        pl.concat_str(pl.col("column").fill_null("(key)"), pl.lit(": "), pl.col("check")).str.join("; ").alias("failed"))
    if rows.height == 0:
        return None
    picked = rows.head(MAX_FAILING_ROWS)
    indexed = frame.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64))
    return picked.join(indexed, left_on="index", right_on="row", how="left").drop("index")
