"""Custom checks written in Python, named in the spec as 'package.module:function'.

The function takes the day's rows (a polars DataFrame) and returns either a boolean Series with
one value per row (True: the row is fine; failing rows can be quarantined) or a single bool for
the whole day.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from ml_assets.names import load_callable
from ml_assets.validation.names import custom_check_name
from ml_assets.validation.outcome import MAX_FAILING_ROWS, CheckOutcome

CustomCheck = Callable[[pl.DataFrame], "pl.Series | bool"]


class CustomCheckError(ValueError):
    pass


check_name = custom_check_name


def load_check(target: str) -> CustomCheck:
    try:
        return load_callable(target)
    except ValueError as exc:
        raise CustomCheckError(f"custom check {target!r} {exc}") from None


def run_custom(target: str, rows: pl.DataFrame) -> CheckOutcome:
    name = check_name(target)
    result = load_check(target)(rows)
    if isinstance(result, bool):
        return CheckOutcome(name, result, f"{target}: {'passed' if result else 'failed'} for the day",
                            {} if result else {target: 1})
    if not isinstance(result, pl.Series) or result.dtype != pl.Boolean or len(result) != rows.height:
        raise CustomCheckError(f"custom check {target!r} must return a bool or a Boolean Series of {rows.height} "
                               f"values; it returned {type(result).__name__}")
    bad = (~result.fill_null(False)).arg_true().to_list()
    summary = f"{target}: {len(bad)} of {rows.height} rows fail" if bad else f"{target}: all {rows.height} rows pass"
    failing = rows.with_row_index("index").filter(pl.col("index").is_in(bad[:MAX_FAILING_ROWS])) \
        .with_columns(pl.lit(target).alias("failed")).drop("index") if bad else None
    return CheckOutcome(name, not bad, summary, {target: len(bad)} if bad else {},
                        {"failing_rows": len(bad)}, {"failing_rows": 0}, failing, set(bad))
