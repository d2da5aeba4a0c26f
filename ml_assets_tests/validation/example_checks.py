"""Custom checks used by the tests, as a team would write them (named in a spec as module:function)."""

import polars as pl


def no_long_taxi(rows: pl.DataFrame) -> pl.Series:
    """Row-level: air time shorter than 15 hours (nulls are for cancelled flights)."""
    return rows["air_time"].is_null() | (rows["air_time"] < 900)


def at_least_one_airport(rows: pl.DataFrame) -> bool:
    return rows["origin"].n_unique() >= 1


def wrong_shape(rows: pl.DataFrame) -> list:
    return [True]
