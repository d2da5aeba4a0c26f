"""The one-pass verdict: whether pandera's validation of a frame would pass, decided without
pandera's query per check, so that pandera itself runs only on frames that fail, to report.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pandera.backends.polars.builtin_checks  # noqa: F401 - registers the checks' polars functions
import pandera.polars as pa
import polars as pl
from pandera.api.function_dispatch import Dispatcher
from pandera.api.polars.types import PolarsData
from pandera.constants import CHECK_OUTPUT_KEY

from ml_assets.spec import DataSchema
from ml_assets.validation.keys import UNIQUE_KEYS, _key_hashes, _shares_a_hash
from ml_assets.validation.pandera_schema import mistyped

# Up to this many allowed values, `passes` compares a category column with each value row by row.
FEW_CATEGORIES = 4
# The threads `passes` sorts key hashes on while its column checks run (two: two calls at once
# need not wait for each other).
_BESIDE = ThreadPoolExecutor(max_workers=2, thread_name_prefix="key-verdict")


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
    key_verdict = None
    hashes = _key_hashes(lazy, schema.keys) if any(c.name == UNIQUE_KEYS for c in validator.checks) else None
    if hashes is not None:  # the key check's verdict, without its row mask
        # The hashes on polars' pool first, then their sort on a thread of its own while the column
        # checks run on the pool (docs/data-validation.md).
        key_verdict = _BESIDE.submit(_shares_a_hash, hashes)
    verdicts = _Verdicts(lazy)
    for name, col in validator.columns.items():
        _add_column(verdicts, name, col, frame.schema[name])
    for check in validator.checks:
        if check.name != UNIQUE_KEYS:
            verdicts.add_output(check.get_backend(lazy)(check).apply(PolarsData(lazy, "*")), check)
    if not verdicts.all_pass():
        return False
    return key_verdict is None or not key_verdict.result()


class _Verdicts:
    """The checks' verdicts as `passes` gathers them: booleans a check gave at once, one-row queries
    a check's output reduces to, and the column expressions that become one ``select``."""

    def __init__(self, lazy: pl.LazyFrame) -> None:
        self.lazy = lazy
        self.known: list[bool] = []
        self.queries: list[pl.LazyFrame] = []
        self.exprs: list[pl.Expr] = []

    def add_output(self, out, check) -> None:
        """A check's output through pandera's backend: a boolean, or a frame of its row mask."""
        if isinstance(out, bool):
            self.known.append(out)
            return
        result = pl.col(CHECK_OUTPUT_KEY).fill_null(check.ignore_na)  # null: passes if ignore_na, as in pandera
        self.queries.append(out.select(result.all().alias(f"c{len(self.queries)}")))

    def add_distinct(self, name: str, expr: pl.Expr, check) -> None:
        """A check judged on the column's distinct values instead of on every row."""
        self.queries.append(self.lazy.select(pl.col(name).unique()).select(
            expr.fill_null(check.ignore_na).all().alias(f"u{len(self.queries)}")))

    def all_pass(self) -> bool:
        """Every verdict true: the queries collected together, on polars' streaming engine."""
        queries = self.queries
        if self.exprs:
            queries = [*queries, self.lazy.select(*(e.alias(f"e{i}") for i, e in enumerate(self.exprs)))]
        if not all(self.known):
            return False
        if queries:
            row = pl.concat(queries, how="horizontal").collect(engine="streaming").row(0)
            if not all(v is True for v in row):
                return False
        return True


def _add_column(verdicts: _Verdicts, name: str, col: pa.Column, dtype: pl.DataType) -> None:
    """A column's nullability and its checks, each as cheaply as it can be judged."""
    if not col.nullable:
        ok = pl.col(name).is_not_null()
        verdicts.exprs.append((ok & pl.col(name).is_not_nan() if dtype.is_float() else ok).all())
    lazy = verdicts.lazy
    for check in col.checks:
        expr = _builtin_expression(check, name)
        if expr is None:
            verdicts.add_output(check.get_backend(lazy)(check).apply(PolarsData(lazy, name)), check)
        elif check.name == "isin" and dtype == pl.String:
            allowed = check.statistics["allowed_values"]
            if 0 < len(allowed) <= FEW_CATEGORIES and None not in allowed:
                # A few allowed values: a comparison per value and row (polars compares a short
                # string within its 16-byte view) costs less than finding the distinct values.
                # A null row compares null to every value, as is_in gives it: passes if ignore_na.
                same = pl.any_horizontal([pl.col(name) == value for value in allowed])
                verdicts.exprs.append(same.fill_null(check.ignore_na).all())
            else:
                # A row passes on its own value alone, so every row passes iff every distinct value
                # does; finding the distinct values costs less than is_in's lookup per row.
                verdicts.add_distinct(name, expr, check)
        else:
            verdicts.exprs.append(expr.fill_null(check.ignore_na).all())


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
