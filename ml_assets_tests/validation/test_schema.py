import datetime as dt

import polars as pl
import pytest

from ml_assets.ingest.sources import read_day
from ml_assets.spec import load_spec
from ml_assets.validation.outcome import MAX_FAILING_ROWS
from ml_assets.validation.schema_checks import KEYS, NULLS, RANGES, SCHEMA, schema_checks
from ml_assets_tests.helpers import BUNDLED_SPEC


@pytest.fixture(scope="module")
def spec():
    return load_spec(BUNDLED_SPEC)


@pytest.fixture(scope="module")
def day_rows(spec) -> pl.DataFrame:
    return read_day(spec, dt.date(2013, 6, 1)).tables["rows"]


def failed(outcomes) -> set[str]:
    return {name for name, o in outcomes.items() if not o.passed}


def test_real_day_passes_every_schema_check(spec, day_rows):
    outcomes = schema_checks(spec.data_schema, day_rows)
    assert failed(outcomes) == set()
    assert outcomes[SCHEMA].summary == f"all {day_rows.height} rows pass"


def test_bad_values_fail_only_their_own_checks_with_counts(spec, day_rows):
    bad = day_rows.with_row_index("i").with_columns(
        pl.when(pl.col("i") < 3).then(pl.lit("ZZ")).otherwise(pl.col("carrier")).alias("carrier"),
        pl.when(pl.col("i") == 7).then(99).otherwise(pl.col("hour")).alias("hour"),
        pl.when(pl.col("i").is_in([8, 9])).then(-1).when(pl.col("i") == 10).then(60)
        .otherwise(pl.col("minute")).alias("minute"),
    ).drop("i")
    outcomes = schema_checks(spec.data_schema, bad)
    assert failed(outcomes) == {RANGES}
    ranges = outcomes[RANGES]
    assert "carrier: 3 rows outside the allowed categories ('ZZ')" in ranges.summary
    assert "hour: 1 row above 23 (highest 99)" in ranges.summary
    # one in_range(0, 59) check, reported by the side each value fell on
    assert "minute: 2 rows below 0 (lowest -1)" in ranges.summary and "minute: 1 row above 59 (highest 60)" in ranges.summary
    assert sum(ranges.counts.values()) == 7
    assert ranges.failing_rows.height == 7 and "failed" in ranges.failing_rows.columns


def test_a_failure_names_the_values_to_fix(spec, day_rows):
    """Categories: the first three distinct bad values (cut to 40 characters), then an ellipsis if
    there are more; a bound: the most extreme value past it."""
    i = pl.int_range(pl.len())
    bad = day_rows.with_columns(
        pl.when(i < 3).then(pl.lit("ZZ")).when(i < 5).then(pl.lit("Q1")).when(i == 5).then(pl.lit("X" * 100))
        .when(i == 6).then(pl.lit("K9")).otherwise(pl.col("carrier")).alias("carrier"),
        pl.when(i == 7).then(2400).when(i == 8).then(99_999).when(i == 9).then(-3).otherwise(pl.col("dep_time"))
        .alias("dep_time"),
        pl.when(i == 10).then(-5).when(i == 11).then(-120).otherwise(pl.col("sched_dep_time")).alias("sched_dep_time"),
    )
    summary = schema_checks(spec.data_schema, bad)[RANGES].summary
    assert f"carrier: 7 rows outside the allowed categories ('ZZ', 'Q1', '{'X' * 40}…', …)" in summary
    assert "dep_time: 1 row above 2400 (highest 99999)" in summary
    assert "dep_time: 1 row below 0 (lowest -3)" in summary
    assert "sched_dep_time: 2 rows below 0 (lowest -120)" in summary


def test_null_in_required_column_and_null_fraction(spec, day_rows):
    bad = day_rows.with_columns(pl.lit(None, pl.Int64).alias("dep_time"),
                                pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("distance")).alias("distance"))
    outcomes = schema_checks(spec.data_schema, bad)
    assert failed(outcomes) == {NULLS}
    summary = outcomes[NULLS].summary
    assert "distance: 1 row null (not allowed)" in summary
    assert f"dep_time: 100.0% null ({bad.height} of {bad.height} rows), more than the allowed 50%" in summary


def test_duplicate_keys(spec, day_rows):
    bad = pl.concat([day_rows, day_rows.head(2)])
    outcomes = schema_checks(spec.data_schema, bad)
    assert failed(outcomes) == {KEYS}
    assert "4 rows share a key with another row" in outcomes[KEYS].summary


def test_wrong_dtype_missing_and_extra_columns_are_schema_failures(spec, day_rows):
    bad = day_rows.with_columns(pl.col("distance").cast(pl.Float64), pl.lit(1).alias("extra")).drop("minute")
    outcomes = schema_checks(spec.data_schema, bad)
    assert SCHEMA in failed(outcomes)
    summary = outcomes[SCHEMA].summary
    assert "column 'distance' is not Int64" in summary
    assert "column 'extra' is not in the schema" in summary
    assert "column 'minute' is missing" in summary


def test_failing_rows_are_bounded(spec, day_rows):
    outcomes = schema_checks(spec.data_schema, day_rows.with_columns(pl.lit("ZZ").alias("carrier")))
    assert outcomes[RANGES].counts["carrier: isin(['9E', 'AA', 'AS', 'B6', 'DL', 'EV', 'F9', 'FL', 'HA', 'MQ', 'OO', 'UA', 'US', 'VX', 'WN', 'YV'])"] == day_rows.height
    assert outcomes[RANGES].failing_rows.height == MAX_FAILING_ROWS


def test_unique_keys_check_agrees_with_polars_is_duplicated():
    """The hash-and-sort key check flags exactly the rows polars' ``is_duplicated`` flags: many
    duplicates, nulls in a key (equal to each other, as in pandera's own check), a missing key column."""
    import numpy as np
    from pandera.api.polars.types import PolarsData

    from ml_assets.validation.schema_checks import unique_keys

    rng = np.random.default_rng(3)
    frame = pl.DataFrame({
        "a": rng.integers(0, 3000, 5000), "b": rng.choice(["x", "y", None], 5000),
        "c": pl.Series(rng.integers(0, 30, 5000)).scatter(list(range(0, 5000, 7)), None),
    })
    for keys in (["a", "b", "c"], ["a", "c"], ["b"], ["a", "b", "missing"]):
        got = unique_keys(keys)(PolarsData(frame.lazy(), "*")).collect().to_series()
        present = [k for k in keys if k in frame.columns]
        want = ~frame.select(present).is_duplicated()
        assert got.to_list() == want.to_list(), keys
        assert (~got).sum() > 0 and (keys == ["b"] or got.sum() > 0)  # both kinds of row occur
    assert unique_keys(["missing"])(PolarsData(frame.lazy(), "*")) is True
    assert unique_keys(["a"])(PolarsData(frame.head(0).lazy(), "*")).collect().height == 0


def test_key_hashes_are_equal_for_equal_keys_and_distinct_over_a_real_year(spec):
    """The key hash (the integer key columns folded into one 64-bit word, every other key column
    hashed with its own seed, xor-ed): equal keys, nulls included, always hash equal; values swapped
    between two key columns, or equal in both, do not cancel out; keys that differ in one integer
    column, whatever its width or sign, hash apart; and over the bundled year (336,776 rows, every key
    distinct) no two rows share a hash, so the one-pass verdict never has to fall back to pandera on
    real data."""
    from ml_assets.ingest.sources import _bundled_table
    from ml_assets.validation.keys import _key_hashes, _shared_hashes, _shares_a_hash

    frame = pl.DataFrame({"a": [1, 2, 1, None, None, 7, 7], "b": ["2", "1", "2", "x", "x", "7", "8"]})
    hashes = _key_hashes(frame.lazy(), ["a", "b"]).to_list()
    assert hashes[0] == hashes[2] and hashes[3] == hashes[4]  # duplicates, a null key included
    assert len({hashes[0], hashes[1], hashes[3], hashes[5], hashes[6]}) == 5
    for dtype in (pl.Int64, pl.Int8, pl.UInt64):  # only integer columns: all in the fold
        numbers = pl.DataFrame({"a": [1, 2, 5, 6, 0, 1, None, None], "b": [2, 1, 5, 6, 0, 2, 3, 3]},
                               schema={"a": dtype, "b": dtype})  # swapped; equal within a row; nulls
        folded = _key_hashes(numbers.lazy(), ["a", "b"]).to_list()
        assert len(set(folded[:5])) == 5 and folded[5] == folded[0] and folded[6] == folded[7], dtype
    signed = pl.DataFrame({"a": [-1, 1, -(2**63), 2**63 - 1], "b": [0, 0, 0, 0]})
    assert len(set(_key_hashes(signed.lazy(), ["a", "b"]).to_list())) == 4
    assert _key_hashes(frame.lazy(), ["missing"]) is None

    year, _ = _bundled_table("flights")
    year_hashes = _key_hashes(year.lazy(), spec.data_schema.keys)
    assert year.select(spec.data_schema.keys).is_duplicated().sum() == 0
    assert year_hashes.n_unique() == year.height
    assert _shares_a_hash(year_hashes) is False
    repeated = pl.concat([year_hashes, year_hashes.tail(1), year_hashes.head(2), year_hashes.head(1)])
    assert _shares_a_hash(repeated) is True
    expected = sorted(set(year_hashes.head(2).to_list()) | set(year_hashes.tail(1).to_list()))
    before = repeated.to_list()
    for one_core in (True, False):
        assert _shared_hashes(repeated, one_core=one_core).tolist() == expected
    assert repeated.to_list() == before  # sorted as a copy: unique_keys still needs the rows' order


@pytest.mark.parametrize("bad", [
    "category", "range", "null", "duplicate", "dtype", "missing", "extra"])
def test_the_one_pass_verdict_never_passes_what_pandera_fails(spec, day_rows, bad):
    """``passes`` decides valid rows without pandera's per-check queries; on every kind of bad row
    it must say False, so that pandera's own validation runs and reports."""
    import pandera.polars as pa

    from ml_assets.validation.schema_checks import build_schema, passes

    first = pl.int_range(pl.len()) == 0
    frame = {
        "category": lambda f: f.with_columns(pl.when(first).then(pl.lit("ZZ")).otherwise("carrier").alias("carrier")),
        "range": lambda f: f.with_columns(pl.when(first).then(-5).otherwise("minute").alias("minute")),
        "null": lambda f: f.with_columns(pl.when(first).then(None).otherwise("origin").alias("origin")),
        "duplicate": lambda f: pl.concat([f, f.tail(1)]),
        "dtype": lambda f: f.with_columns(pl.col("hour").cast(pl.Int32)),
        "missing": lambda f: f.drop("dest"),
        "extra": lambda f: f.with_columns(pl.lit(1).alias("surprise")),
    }[bad](day_rows)
    validator = build_schema(spec.data_schema)
    assert passes(spec.data_schema, validator, day_rows) is True
    assert passes(spec.data_schema, validator, frame) is False
    with pytest.raises(pa.errors.SchemaErrors):
        validator.validate(frame, lazy=True)


def test_the_one_pass_column_expressions_are_panderas_own():
    """``passes`` evaluates each builtin column check as the expression pandera's check function
    selects: on values at and past the bounds, nulls and NaN, each expression's row mask is the
    one pandera's check backend computes, and a check that is not a single-select builtin (a custom
    column check) is left to the backend."""
    import pandera.polars as pa
    from pandera.api.polars.types import PolarsData
    from pandera.constants import CHECK_OUTPUT_KEY

    from ml_assets.validation.verdict import _builtin_expression

    frame = pl.DataFrame({
        "i": pl.Series([0, 1, 5, 6, None, -3], dtype=pl.Int64),
        "f": pl.Series([0.5, 1.0, 5.0, 5.5, None, float("nan")], dtype=pl.Float64),
        "s": pl.Series(["a", "b", "z", None, "a", ""], dtype=pl.String),
    })
    lazy = frame.lazy()
    checks = [("i", pa.Check.in_range(1.0, 5.0)), ("f", pa.Check.in_range(1.0, 5.0)), ("i", pa.Check.ge(1.0)),
              ("f", pa.Check.le(5.0)), ("s", pa.Check.isin(["a", "b"])),
              ("i", pa.Check.in_range(1, 5, include_min=False))]
    for column, check in checks:
        expr = _builtin_expression(check, column)
        assert expr is not None, check.name
        got = frame.select(expr).to_series()
        want = check.get_backend(lazy)(check).apply(PolarsData(lazy, column)).collect()[CHECK_OUTPUT_KEY]
        assert got.to_list() == want.to_list(), (column, check.name)
        assert not got.fill_null(True).all()  # the rows include failing ones
    custom = pa.Check(lambda data: data.lazyframe.select(pl.col(data.key) > 0), name="positive")
    assert _builtin_expression(custom, "i") is None
    assert _builtin_expression(pa.Check(lambda x: x > 0, element_wise=True), "i") is None


def test_integer_columns_are_checked_against_whole_number_bounds():
    """An Int64 column's range is checked in integers (polars casts every value when the bound is a
    float): fractional bounds of the spec round inwards and keep the same rows in and out, and a
    range holding no whole number still fails every row."""
    import pandera.polars as pa

    from ml_assets.spec import DataSchema
    from ml_assets.validation.schema_checks import bounds, build_schema

    schema = DataSchema.model_validate({"columns": {
        "i": {"dtype": "int64", "min": 1.5, "max": 4.5}, "f": {"dtype": "float64", "min": 1.5, "max": 4.5},
        "j": {"dtype": "int64", "min": 2.2, "max": 2.8}}, "keys": []})
    assert bounds(schema.columns["i"]) == (2, 4) and isinstance(bounds(schema.columns["i"])[0], int)
    assert bounds(schema.columns["f"]) == (1.5, 4.5)
    values = list(range(0, 7))
    frame = pl.DataFrame({"i": values, "f": [float(v) for v in values], "j": values})
    with pytest.raises(pa.errors.SchemaErrors) as info:
        build_schema(schema).validate(frame, lazy=True)
    failing = info.value.failure_cases.group_by("column").agg(pl.col("failure_case").cast(pl.Float64).cast(pl.Int64).sort())
    assert dict(failing.iter_rows()) == {"i": [0, 1, 5, 6], "f": [0, 1, 5, 6], "j": values}


def test_the_one_pass_verdict_on_categories_matches_pandera():
    """``passes`` judges a category column with a few allowed values by comparing each row with
    each value, one with more by its distinct values: either way nulls in a nullable column pass,
    one unknown value among many rows fails, as pandera's own validation decides."""
    import pandera.polars as pa

    from ml_assets.spec import DataSchema
    from ml_assets.validation.schema_checks import FEW_CATEGORIES, build_schema, passes

    many = [f"v{i}" for i in range(FEW_CATEGORIES + 1)]
    schema = DataSchema.model_validate({"columns": {
        "c": {"dtype": "string", "nullable": True, "allowed": ["a", "b"]},
        "d": {"dtype": "string", "allowed": ["x"]},
        "e": {"dtype": "string", "nullable": True, "allowed": many}}, "keys": []})
    validator = build_schema(schema)
    good = pl.DataFrame({"c": ["a", None, "b"] * 1000, "d": ["x"] * 3000, "e": (many + [None]) * 500})
    validator.validate(good, lazy=True)
    assert passes(schema, validator, good) is True

    def one(column: str, value: str, row: int) -> pl.DataFrame:
        return good.with_columns(pl.when(pl.int_range(pl.len()) == row).then(pl.lit(value))
                                 .otherwise(column).alias(column))

    for bad in (one("c", "z", 1500), one("c", "ab", 0), one("d", "", 2999), one("d", "x ", 7),
                one("e", "v", 1500), one("e", "A", 2999)):
        assert passes(schema, validator, bad) is False
        with pytest.raises(pa.errors.SchemaErrors):
            validator.validate(bad, lazy=True)
    strict = pa.DataFrameSchema({  # ignore_na=False: a null is not an allowed value
        "c": pa.Column(pl.String, nullable=True, checks=[pa.Check.isin(["a", "b"], ignore_na=False)]),
        "d": pa.Column(pl.String, checks=[pa.Check.isin(["x"])]),
        "e": pa.Column(pl.String, nullable=True, checks=[pa.Check.isin(many, ignore_na=False)])})
    no_nulls = good.with_columns(pl.col("c").fill_null("a"), pl.col("e").fill_null("v0"))
    strict.validate(no_nulls, lazy=True)
    assert passes(schema, strict, no_nulls) is True
    for frame in (good.with_columns(pl.col("e").fill_null("v0")), good.with_columns(pl.col("c").fill_null("a"))):
        assert passes(schema, strict, frame) is False
        with pytest.raises(pa.errors.SchemaErrors):
            strict.validate(frame, lazy=True)


def test_the_one_pass_verdict_runs_other_checks_through_panderas_backend():
    """A check that is not a single-select builtin (a custom column check, a dataframe check) is
    still part of the verdict, through pandera's check backend, nulls passing where pandera's
    ``ignore_na`` lets them."""
    import pandera.polars as pa

    from ml_assets.spec import DataSchema
    from ml_assets.validation.schema_checks import passes

    schema = DataSchema.model_validate({"columns": {"x": {"dtype": "int64", "nullable": True}}, "keys": []})
    validator = pa.DataFrameSchema(
        {"x": pa.Column(pl.Int64, nullable=True,
                        checks=[pa.Check(lambda d: d.lazyframe.select(pl.col(d.key) % 2 == 0), name="even")])},
        checks=[pa.Check(lambda d: d.lazyframe.select(pl.col("x").sum() < 100), name="small_total")])
    good = pl.DataFrame({"x": [2, None, 4]})
    validator.validate(good, lazy=True)
    assert passes(schema, validator, good) is True
    for bad in (pl.DataFrame({"x": [2, None, 3]}), pl.DataFrame({"x": [2, None, 400]})):
        assert passes(schema, validator, bad) is False
        with pytest.raises(pa.errors.SchemaErrors):
            validator.validate(bad, lazy=True)
