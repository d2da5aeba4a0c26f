"""The pandera (polars backend) schema a spec declares, run once and split into named checks.

Validation runs on the collected DataFrame: on a LazyFrame pandera checks only columns and dtypes.
"""

from __future__ import annotations

import functools
import math
import operator
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandera.backends.polars.builtin_checks  # noqa: F401 - registers the checks' polars functions
import pandera.polars as pa
import polars as pl
from pandera.api.function_dispatch import Dispatcher
from pandera.api.polars.types import PolarsData
from pandera.constants import CHECK_OUTPUT_KEY

from ml_assets.spec import POLARS_DTYPES, ColumnSchema, DataSchema
from ml_assets.validation.names import KEYS, NULLS, RANGES, SCHEMA
from ml_assets.validation.outcome import MAX_FAILING_ROWS, CheckOutcome

DTYPES = POLARS_DTYPES


UNIQUE_KEYS = "unique_keys"

# Up to this many allowed values, `passes` compares a category column with each value row by row.
FEW_CATEGORIES = 4
# The threads `passes` sorts key hashes on while its column checks run (two: two calls at once
# need not wait for each other).
_BESIDE = ThreadPoolExecutor(max_workers=2, thread_name_prefix="key-verdict")


def unique_keys(keys: list[str]):
    """A pandera (polars) dataframe check: no two rows share the spec's key columns.

    Exact, and faster on millions of rows than pandera's own ``unique=`` (which runs
    ``DataFrame.is_duplicated`` on the key columns): the rows' hashes are sorted, and only rows
    whose hash another row shares
    (a real duplicate, or rarely a hash collision) are compared column by column. Nulls in a key
    compare equal, as in pandera's check. Key columns missing from the frame are left to the
    schema check, which reports them; the rest are still compared.
    """

    def check(data) -> pl.LazyFrame | bool:
        hashes = _key_hashes(data.lazyframe, keys)
        if hashes is None:
            return True
        shared = _shared_hashes(hashes, one_core=False)
        unique = np.ones(hashes.len(), dtype=bool)
        if shared.size:
            candidates = np.flatnonzero(np.isin(hashes.to_numpy(), shared))
            frame = data.lazyframe.select(_present(data.lazyframe, keys)).collect()
            unique[candidates[frame[candidates].is_duplicated().to_numpy()]] = False
        return pl.LazyFrame({UNIQUE_KEYS: unique})

    return check


def _present(lazy: pl.LazyFrame, keys: list[str]) -> list[str]:
    """The key columns the frame has (a missing one is the schema check's to report)."""
    names = set(lazy.collect_schema().names())
    return [k for k in keys if k in names]


# The integer key columns' 64-bit words are folded into one, w <- w * _FOLD ^ next (wrapping), which
# stands for their hashes: _FOLD is odd (the 64-bit golden ratio), so each fold is a bijection of w, and keys
# that differ in exactly one integer column always fold apart (but for a null, which folds as
# _NULL_WORD, against that value).
_FOLD = 0x9E3779B97F4A7C15
_NULL_WORD = 0x5BD1E9955BD1E995


def _key_hashes(lazy: pl.LazyFrame, keys: list[str]) -> pl.Series | None:
    """One hash per row of the key columns the frame has (None if it has none of them): rows with
    equal keys always get equal hashes (nulls included), different keys almost never do.

    The integer key columns folded into one 64-bit word, every other key column hashed with its own
    seed, all xor-ed, in one streaming query: cheaper than a hash per column, and than
    ``DataFrame.hash_rows``, which also builds a copy of its result (benchmarks/validation.py).
    Sharing a hash only sends rows to an exact comparison, so a fold that collides costs time, never
    a wrong verdict."""
    present = _present(lazy, keys)
    if not present:
        return None
    schema = lazy.collect_schema()
    words = [(pl.col(k) if schema[k] == pl.UInt64 else pl.col(k).cast(pl.Int64).reinterpret(signed=False))
             .fill_null(_NULL_WORD) for k in present if schema[k].is_integer()]
    hashes = [pl.col(k).hash(seed) for seed, k in enumerate(present, start=1) if not schema[k].is_integer()]
    if words:
        hashes.append(functools.reduce(lambda folded, word: folded * _FOLD ^ word, words))
    return lazy.select(functools.reduce(operator.xor, hashes).alias("hash")).collect(engine="streaming").to_series()


# From this many hashes on, the sort is whichever of numpy's and polars' is faster on this machine.
CHOOSE_SORT_FROM = 1 << 20


@functools.cache
def _numpy_sorts_faster() -> bool:
    """Whether numpy sorts 64-bit hashes faster than polars' single-threaded sort here, measured once
    per process on 2^20 random values (best of two each). Neither wins everywhere, by a factor of
    two to four either way, and no CPU feature flag predicts which (docs/data-validation.md)."""
    values = np.random.default_rng(0).integers(0, 2**63, CHOOSE_SORT_FROM, dtype=np.uint64)
    series = pl.Series(values)

    def best(sort) -> float:
        times = []
        for _ in range(2):
            started = time.perf_counter()
            sort()
            times.append(time.perf_counter() - started)
        return min(times)

    return best(lambda: np.sort(values)) < best(lambda: series.sort(multithreaded=False))


def _shared_hashes(hashes: pl.Series, *, one_core: bool) -> np.ndarray:
    """The hash values two or more rows share, each once: the hashes sorted, then neighbours compared.
    The sort is polars' (on one core if ``one_core``), or numpy's where that is faster here."""
    if hashes.len() >= CHOOSE_SORT_FROM and _numpy_sorts_faster():
        ordered = hashes.to_numpy(writable=True)  # a streamed Series has many chunks: its one copy
        ordered.sort()
    else:
        ordered = hashes.sort(multithreaded=not one_core).to_numpy()
    return np.unique(ordered[1:][ordered[1:] == ordered[:-1]])


def _shares_a_hash(hashes: pl.Series) -> bool:
    """Whether two rows share a key hash: always for duplicate keys, rarely (a collision) otherwise.
    The verdict `passes` asks for, with no row mask, on a thread beside the column checks, so on one
    core: polars' parallel sort costs about twice the CPU for a tenth less time, and on two cores
    the column checks want that CPU. Both sorts release the GIL."""
    return _shared_hashes(hashes, one_core=True).size > 0


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


def _kind(check: str) -> str:
    if check in ("column_in_schema", "column_in_dataframe") or check.startswith("dtype("):
        return SCHEMA
    if check == "not_nullable":
        return NULLS
    if check == UNIQUE_KEYS or "uniqueness" in check:
        return KEYS
    return RANGES


# A failure's summary names up to this many of the values that failed (each cut to _VALUE_CHARS).
_EXAMPLES = 3
_VALUE_CHARS = 40


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


def schema_checks(schema: DataSchema, frame: pl.DataFrame) -> dict[str, CheckOutcome]:
    """The schema (columns, dtypes), nulls, ranges and categories, and duplicate keys checks."""
    cases = pl.DataFrame(schema={"column": pl.String, "check": pl.String, "failure_case": pl.String, "index": pl.Int64})
    validator = build_schema(schema, frame=frame)
    try:
        if not passes(schema, validator, frame):
            validator.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        cases = exc.failure_cases.select(
            pl.col("column").cast(pl.String), pl.col("check").cast(pl.String),
            pl.col("failure_case").cast(pl.String), pl.col("index").cast(pl.Int64))
    cases = _split_ranges(schema, cases)
    kind = pl.col("check").map_elements(_kind, return_dtype=pl.String)
    cases = cases.with_columns(
        kind.alias("kind"),
        # Column-set failures name the column in failure_case, not in column.
        pl.when(pl.col("check").is_in(["column_in_schema", "column_in_dataframe"]))
        .then(pl.col("failure_case")).otherwise(pl.col("column")).alias("column"),
    )
    outcomes = {}
    for kind in (SCHEMA, NULLS, RANGES, KEYS):
        mine = cases.filter(pl.col("kind") == kind)
        grouped = mine.group_by("column", "check", maintain_order=True).len()
        counts = {f"{c or '(table)'}: {k}": n for c, k, n in grouped.iter_rows()}
        problems = [_describe(c, k, n, _failing_values(mine, c, k)) for c, k, n in grouped.iter_rows()]
        if kind == NULLS:
            problems += _null_fraction_problems(schema, frame, counts)
        failing = _failing_rows(frame, mine) if kind != SCHEMA else None
        indices = set(mine["index"].drop_nulls().to_list()) if kind != SCHEMA else set()
        outcomes[kind] = CheckOutcome(
            name=kind, passed=not problems,
            summary="; ".join(problems) if problems else f"all {frame.height} rows pass",
            counts=counts, observed={"rows": frame.height, "failures": sum(counts.values())},
            expected={"failures": 0}, failing_rows=failing, row_indices=indices,
        )
    return outcomes


def passes(schema: DataSchema, validator: pa.DataFrameSchema, frame: pl.DataFrame) -> bool:
    """True only if ``validator.validate(frame)`` would pass, decided in one parallel pass.

    pandera runs each check as its own query and collects its output two or three times (about
    half its time on valid rows); here the same checks are reduced to one boolean each and
    collected together: the column checks as the expressions pandera's own builtin check functions
    select (``_builtin_expression``), all in one ``select`` with nullability as pandera's
    ``check_nullable`` decides it (null, or NaN in a float column), on polars' streaming engine
    (faster than in memory on rows that are not in cache); any other check through
    pandera's check backend; the key check (``unique_keys``) as a sort of the rows' key hashes, on
    a thread of its own while the column checks run.
    Any doubt (a column, a dtype, a check that fails or returns something else) returns False, and
    pandera's own validation then decides and gives the failure cases: this can only skip pandera
    on rows it would pass.
    """
    if set(frame.columns) != set(validator.columns) if validator.strict else not set(validator.columns) <= set(frame.columns):
        return False
    if mistyped(schema, frame):
        return False
    lazy = frame.lazy()
    verdicts, queries, exprs = [], [], []
    key_verdict = None
    hashes = _key_hashes(lazy, schema.keys) if any(c.name == UNIQUE_KEYS for c in validator.checks) else None
    if hashes is not None:  # the key check's verdict, without its row mask
        # The hashes on polars' pool first, then their sort on a thread of its own while the column
        # checks run on the pool (docs/data-validation.md).
        key_verdict = _BESIDE.submit(_shares_a_hash, hashes)

    def reduce(out, check) -> None:
        if isinstance(out, bool):
            verdicts.append(out)
            return
        result = pl.col(CHECK_OUTPUT_KEY).fill_null(check.ignore_na)  # null: passes if ignore_na, as in pandera
        queries.append(out.select(result.all().alias(f"c{len(queries)}")))

    for name, col in validator.columns.items():
        if not col.nullable:
            ok = pl.col(name).is_not_null()
            exprs.append((ok & pl.col(name).is_not_nan() if frame.schema[name].is_float() else ok).all())
        for check in col.checks:
            expr = _builtin_expression(check, name)
            if expr is None:
                reduce(check.get_backend(lazy)(check).apply(PolarsData(lazy, name)), check)
            elif check.name == "isin" and frame.schema[name] == pl.String:
                allowed = check.statistics["allowed_values"]
                if 0 < len(allowed) <= FEW_CATEGORIES and None not in allowed:
                    # A few allowed values: a comparison per value and row (polars compares a short
                    # string within its 16-byte view) costs less than finding the distinct values.
                    # A null row compares null to every value, as is_in gives it: passes if ignore_na.
                    same = pl.any_horizontal([pl.col(name) == value for value in allowed])
                    exprs.append(same.fill_null(check.ignore_na).all())
                else:
                    # A row passes on its own value alone, so every row passes iff every distinct value
                    # does; finding the distinct values costs less than is_in's lookup per row.
                    queries.append(lazy.select(pl.col(name).unique()).select(
                        expr.fill_null(check.ignore_na).all().alias(f"u{len(queries)}")))
            else:
                exprs.append(expr.fill_null(check.ignore_na).all())
    for check in validator.checks:
        if check.name != UNIQUE_KEYS:
            reduce(check.get_backend(lazy)(check).apply(PolarsData(lazy, "*")), check)
    if exprs:
        queries.append(lazy.select(*(e.alias(f"e{i}") for i, e in enumerate(exprs))))
    if not all(verdicts):
        return False
    if queries:
        row = pl.concat(queries, how="horizontal").collect(engine="streaming").row(0)
        if not all(v is True for v in row):
            return False
    return key_verdict is None or not key_verdict.result()


_BUILTINS = frozenset({"in_range", "greater_than_or_equal_to", "less_than_or_equal_to", "isin"})


class _OneSelect:
    """Takes the place of the LazyFrame a pandera builtin check selects its one expression from."""

    expr: pl.Expr | None = None

    def select(self, *exprs, **named):
        if self.expr is not None or named or len(exprs) != 1 or not isinstance(exprs[0], pl.Expr):
            raise TypeError("not a single-expression select")
        self.expr = exprs[0]
        return self


def _builtin_expression(check, column: str) -> pl.Expr | None:
    """The polars expression pandera's own builtin check function selects for ``column`` (``in_range``:
    ``ge & le``, ``isin``: ``is_in``, ...), so that every column check is evaluated in one ``select``
    instead of a query each. None for any other check (element-wise, custom, or a builtin that does
    more than one select of one expression): it then runs through pandera's check backend."""
    if check.name not in _BUILTINS or check.element_wise or not isinstance(check._check_fn, Dispatcher):
        return None
    capture = _OneSelect()
    try:
        out = check._check_fn(PolarsData(capture, column), **check._check_kwargs)
    except TypeError:
        return None
    return capture.expr if out is capture else None


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

