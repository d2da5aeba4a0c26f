"""Build feature rows from raw rows: joins (exact and as-of), time parts, rolling aggregates over past
days, custom transforms, the target. Lazy polars throughout, so a long window can run on the
streaming engine; the same code builds one day (the features asset) or a whole year (benchmarks).

What is built here is stateless: the fitted part (means, vocabularies, bucket edges) is
``ml_assets.features.state``, fitted on the training window only.

Leakage, by construction:
- columns that are target inputs or marked ``after_event`` are dropped before anything but the
  rolling aggregates sees them (custom transforms never receive them);
- as-of joins take, per key, the latest dimension record at or before the row's timestamp;
- a rolling aggregate for a row on day D reads days D-n..D-1 only, never D or later.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import polars as pl

from ml_assets.calendar import holiday_near
from ml_assets.ingest.sources import SourceError, utc_timestamp
from ml_assets.names import load_callable
from ml_assets.spec import POLARS_DTYPES, FeaturesSpec, ModelSpec

TIMESTAMP = "__timestamp"
DAY = "__day"
UTC = "__utc"  # the rows' timestamp parsed once (parsing ISO strings is the slow part)
KEY_PREFIX = "__key."  # a raw key column carried to a scored row (build_lazy's ``keys``)
LOCAL = "__local"  # the same instant as wall-clock time in the partition's time zone (naive)


@dataclass(frozen=True)
class FeatureFrame:
    frame: pl.DataFrame
    rows_in: int
    rows_without_target: int


class FeatureError(ValueError):
    pass


def feature_columns(spec: ModelSpec) -> list[str]:
    return [*spec.features.numeric_names, *spec.features.categorical_names]


def hidden_columns(spec: ModelSpec) -> list[str]:
    """Raw columns no feature may see: the target's inputs and what is known only after the event."""
    after = [c for c, col in spec.data_schema.columns.items() if col.after_event]
    return sorted({*spec.target.input_columns, *after})


def _utc(column: str, dtype: pl.DataType, fmt: str | None = None, timezone: str = "UTC") -> pl.Expr:
    try:
        return utc_timestamp(column, dtype, fmt, timezone)
    except SourceError as exc:
        raise FeatureError(str(exc)) from None


def load_custom(target: str) -> Callable[[pl.LazyFrame], pl.LazyFrame]:
    try:
        return load_callable(target)
    except ValueError as exc:
        raise FeatureError(f"features.custom: {target!r} {exc}") from None


def _joins(feats: FeaturesSpec, rows: pl.LazyFrame, dims: dict[str, pl.LazyFrame], ts: str,
           stage: Callable[[pl.LazyFrame], pl.LazyFrame], timezone: str) -> pl.LazyFrame:
    for i, join in enumerate(feats.joins):
        rows = stage(rows) if i else rows
        if join.dimension not in dims:
            raise FeatureError(f"features.joins[{i}]: no table for dimension {join.dimension!r}")
        dim = dims[join.dimension]
        have = dim.collect_schema()
        on = [join.asof.column] if join.asof else []
        missing = [c for c in [*join.keys, *on, *join.columns] if c not in have]
        if missing:
            raise FeatureError(f"features.joins[{i}]: dimension {join.dimension!r} has no columns {missing}")
        dim = dim.select([*join.keys, *on, *join.columns]).rename(join.columns)
        if join.asof is None:
            # One dimension row per key, so a join can never multiply the rows it enriches.
            dim = dim.unique(subset=join.keys, keep="first", maintain_order=True)
            rows = rows.join(dim, on=join.keys, how="left", coalesce=True, maintain_order="left")
            continue
        key = f"__asof_{i}"
        mine = pl.col(UTC) if join.asof.column == ts else _utc(
            join.asof.column, rows.collect_schema()[join.asof.column], timezone=timezone)
        right = (dim.with_columns(_utc(join.asof.column, have[join.asof.column], timezone=timezone).alias(key))
                 .drop(join.asof.column)
                 .drop_nulls(key).unique(subset=[*join.keys, key], keep="first", maintain_order=True).sort(key))
        tolerance = dt.timedelta(hours=join.asof.tolerance_hours) if join.asof.tolerance_hours else None
        # What a row gets depends only on its keys and its time, and rows share them (a year of flights
        # has ~26 thousand distinct (origin, hour) pairs): the as-of join runs on the distinct pairs,
        # sorted, and the rows take their pair's match by an exact join. Sorting the rows themselves is
        # what an as-of join costs otherwise, in time and, on the streaming engine, in memory.
        rows = rows.with_columns(mine.alias(key))
        matched = (rows.select(*join.keys, key).drop_nulls().unique().sort(key)
                   .join_asof(right, on=key, by=join.keys or None, strategy="backward", tolerance=tolerance,
                              check_sortedness=False))
        rows = rows.join(matched, on=[*join.keys, key], how="left", maintain_order="left").drop(key)
    return rows


def _time_parts(spec: ModelSpec, rows: pl.LazyFrame, streaming: bool) -> pl.LazyFrame:
    time = spec.features.time
    if time is None:
        return rows
    column = time.column or spec.partitioning.timestamp_column
    local = pl.col(LOCAL) if column == spec.partitioning.timestamp_column else (
        _utc(column, rows.collect_schema()[column], timezone=spec.partitioning.timezone)
        .dt.convert_time_zone(spec.partitioning.timezone)
        .dt.replace_time_zone(None))
    parts = {
        "hour": local.dt.hour().cast(pl.Int64),
        "day_of_week": local.dt.weekday().cast(pl.Int64),  # 1 = Monday
        "month": local.dt.month().cast(pl.Int64),
        "day_of_year": local.dt.ordinal_day().cast(pl.Int64),
    }
    if "holiday" in time.parts:
        cal = time.holidays
        assert cal is not None

        def near_holiday(dates: pl.Series) -> pl.Series:  # a calendar lookup per distinct date, not per row
            near = [d for d in dates.drop_nulls().unique().to_list()
                    if holiday_near(d, cal.country, cal.subdivision, cal.window_days) is not None]
            return dates.is_in(near).cast(pl.Int64).set(dates.is_null(), None)

        parts["holiday"] = local.dt.date().map_batches(near_holiday, return_dtype=pl.Int64, is_elementwise=streaming)
    return rows.with_columns(parts[p].alias(f"{time.prefix}{p}") for p in time.parts)


def _rolling(spec: ModelSpec, rows: pl.LazyFrame, past: pl.LazyFrame) -> pl.LazyFrame:
    """Per row of day D and group: the aggregate over the rows of days D-n..D-1 (``past`` holds every
    row that may be read, with its day in ``__day``; the rows' own day is excluded by construction)."""
    for roll in spec.features.rolling:
        value = pl.sql_expr(roll.expression).cast(pl.Float64).alias("__v")
        needs = {"mean": ("__sum", "__n"), "sum": ("__sum",), "count": ("__n",), "min": ("__min",),
                 "max": ("__max",)}[roll.aggregate]
        parts = {"__sum": pl.col("__v").sum(), "__n": pl.len(), "__min": pl.col("__v").min(),
                 "__max": pl.col("__v").max()}
        daily = (past.select(*roll.by, DAY, value).filter(pl.col("__v").is_not_null())
                 .group_by(*roll.by, DAY).agg(parts[n].alias(n) for n in needs))
        # Day d's aggregate serves the rows of days d+1 .. d+n: shifted copies, then one group-by.
        shifted = pl.concat([daily.with_columns((pl.col(DAY) + dt.timedelta(days=k)).alias(DAY))
                             for k in range(1, roll.days + 1)])
        agg = {"mean": pl.col("__sum").sum() / pl.col("__n").sum(), "sum": pl.col("__sum").sum(),
               "count": pl.col("__n").sum().cast(pl.Float64), "min": pl.col("__min").min(),
               "max": pl.col("__max").max()}[roll.aggregate]
        window = shifted.group_by(*roll.by, DAY).agg(agg.alias(roll.name))
        # A row whose group key is missing gets no aggregate (missing, the training mean once standardized).
        rows = rows.join(window, on=[*roll.by, DAY], how="left", coalesce=True, maintain_order="left")
    return rows


def dated(spec: ModelSpec, frame: pl.LazyFrame, streaming: bool = False) -> pl.LazyFrame:
    """Add the rows' UTC timestamp (parsed once), local wall-clock time and local day. Local time is
    computed per distinct timestamp of each batch and mapped back: per-row time-zone arithmetic is
    the slow part, and a day of rows has a few dozen distinct hours."""
    part = spec.partitioning
    ts = part.timestamp_column

    def local(utc: pl.Series) -> pl.Series:
        distinct = utc.unique().drop_nulls()
        wall = distinct.dt.convert_time_zone(part.timezone).dt.replace_time_zone(None)
        return utc.replace_strict(distinct, wall, default=None, return_dtype=wall.dtype)

    frame = frame.with_columns(_utc(ts, frame.collect_schema()[ts], part.timestamp_format, part.timezone).alias(UTC))
    naive = pl.Datetime(frame.collect_schema()[UTC].time_unit)
    # Elementwise when streaming: batch by batch instead of gathering the whole column; in memory, one call.
    wall = pl.col(UTC).map_batches(local, return_dtype=naive, is_elementwise=streaming)
    return frame.with_columns(wall.alias(LOCAL)).with_columns(pl.col(LOCAL).dt.date().alias(DAY))


def class_index(spec: ModelSpec) -> Callable[[pl.Series], pl.Series]:
    """Multiclass labels (class names, or indices) -> Int64 class indices; a missing label stays
    missing (the row is dropped). A label that is not a declared class is an error, never a dropped
    row: a new class in the data would otherwise vanish from training and evaluation unseen."""
    classes = spec.target.classes or []

    def index(labels: pl.Series) -> pl.Series:
        known = labels.drop_nulls()
        if labels.dtype in (pl.String, pl.Categorical) or isinstance(labels.dtype, pl.Enum):
            labels = labels.cast(pl.String)
            unknown = known.cast(pl.String).filter(~known.cast(pl.String).is_in(classes)).unique().sort()
            mapped = labels.replace_strict(classes, list(range(len(classes))), default=None, return_dtype=pl.Int64)
        elif labels.dtype.is_numeric():
            known = known.cast(pl.Float64).fill_nan(None).drop_nulls()
            unknown = known.filter((known != known.round()) | (known < 0) | (known >= len(classes))).unique().sort()
            mapped = labels.cast(pl.Float64).fill_nan(None).cast(pl.Int64, strict=False)
        else:
            raise FeatureError(f"model {spec.name}: target.expression gives {labels.dtype} values, not class names "
                               f"(text) or class indices (integers) of target.classes {classes}")
        if len(unknown):
            shown = unknown.head(10).to_list()
            raise FeatureError(
                f"model {spec.name}: target.expression gives {shown}{' and more' if len(unknown) > 10 else ''}, "
                f"not among target.classes {classes} (names, or indices 0..{len(classes) - 1}); add the class to "
                "target.classes or map it in target.expression")
        return mapped.alias(labels.name)

    return index


def target_expr(spec: ModelSpec, streaming: bool = False) -> pl.Expr:
    """The label column: Float32 (a 0/1 label or a regression value), or for multiclass the Int64
    class index (``class_index``)."""
    label = pl.sql_expr(spec.target.expression)
    if spec.target.task != "multiclass_classification":
        return label.cast(pl.Float32).alias(spec.target.name)
    return label.map_batches(class_index(spec), return_dtype=pl.Int64, is_elementwise=streaming).alias(spec.target.name)


def collect_each_step(frame: pl.LazyFrame) -> pl.LazyFrame:
    """A ``stage`` for ``build_lazy``: collect in memory between steps (fast when the rows fit)."""
    return frame.collect(engine="in-memory").lazy()


def build_lazy(spec: ModelSpec, rows: pl.LazyFrame, dims: dict[str, pl.LazyFrame],
               history: pl.LazyFrame | None = None, *, streaming: bool = True,
               stage: Callable[[pl.LazyFrame], pl.LazyFrame] = lambda frame: frame,
               keys: Sequence[str] = ()) -> pl.LazyFrame:
    """Raw rows (one or many days) -> feature rows: ``__timestamp``, the declared feature columns and
    the target (null where the target is unknown). ``history`` holds raw rows of earlier days for
    the rolling aggregates (those of the rows' own days are read from ``rows``).

    Some steps read the rows twice (the rolling aggregates, the as-of join's narrow sort); a lazy
    plan recomputes what they share. ``stage`` is applied between steps: identity keeps the plan
    whole (streaming, out of core: recomputing costs time, not memory); ``build_features`` collects
    each step in memory instead, which is much faster when the rows fit. ``streaming``: the Python
    steps run batch by batch (for the streaming engine) rather than once over the whole column.
    ``keys``: raw columns carried through as they were, named ``KEY_PREFIX + name`` (a scored row
    names the row it scored, even where a feature shares the column's name)."""
    feats = spec.features
    ts = spec.partitioning.timestamp_column
    # Rows to predict may lack what is known only later (the target's inputs, after-event columns): they
    # are null here, as they are dropped before anything but the rolling aggregates of later days reads them.
    have = rows.collect_schema()
    absent = [c for c in hidden_columns(spec) if c not in have]
    rows = rows.with_columns(pl.lit(None, POLARS_DTYPES[spec.data_schema.columns[c].dtype]).alias(c) for c in absent)
    rows = stage(dated(spec, rows, streaming).with_columns(pl.col(k).alias(KEY_PREFIX + k) for k in keys))
    if feats.rolling:
        mine = rows
        past = mine if history is None else pl.concat([dated(spec, history, streaming), mine], how="diagonal_relaxed")
    rows = rows.with_columns(target_expr(spec, streaming))
    rows = stage(_rolling(spec, rows, past)) if feats.rolling else rows
    rows = rows.drop(hidden_columns(spec))  # nothing below can see the label or the future
    rows = stage(_joins(feats, rows, dims, ts, stage, spec.partitioning.timezone))
    rows = _time_parts(spec, rows, streaming)
    for custom in feats.custom:
        before = rows.collect_schema().names()
        rows = load_custom(custom.function)(rows)
        if not isinstance(rows, pl.LazyFrame):
            raise FeatureError(f"features.custom: {custom.function} returned {type(rows).__name__}, not a LazyFrame")
        got = rows.collect_schema().names()
        if missing := [c for c in custom.columns if c not in got]:
            raise FeatureError(f"features.custom: {custom.function} did not add its declared columns {missing}")
        if removed := [c for c in before if c not in got]:
            raise FeatureError(f"features.custom: {custom.function} removed the columns {removed}")
    return rows.select(
        pl.col(ts).alias(TIMESTAMP),
        *[pl.col(c).cast(pl.Float64) for c in feats.numeric_names],
        *[pl.col(c).cast(pl.String) for c in feats.categorical_names],
        pl.col(spec.target.name),
        *[pl.col(KEY_PREFIX + k) for k in keys],
    )


def build_features(spec: ModelSpec, tables: dict[str, pl.DataFrame],
                   history: pl.DataFrame | None = None, *, keys: Sequence[str] = (),
                   labeled_only: bool = True) -> FeatureFrame:
    """One batch in memory (the features asset's day): rows without a target are dropped and counted,
    unless ``labeled_only`` is off (rows to score: the target is null where it is not known yet)."""
    rows = tables["rows"]
    dims = {name: frame.lazy() for name, frame in tables.items() if name != "rows"}
    try:
        built = build_lazy(spec, rows.lazy(), dims, history.lazy() if history is not None else None,
                           streaming=False, stage=collect_each_step, keys=keys).collect(engine="in-memory")
    except pl.exceptions.PolarsError as exc:
        raise FeatureError(f"building features of {spec.name}: {exc}") from None
    kept = built.filter(pl.col(spec.target.name).is_not_null()) if labeled_only else built
    return FeatureFrame(kept, rows.height, built.height - kept.height)
