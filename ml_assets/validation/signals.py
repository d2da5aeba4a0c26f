"""A source's days as daily signals: one number a day for each judged column and measure, computed for
many days at once (one ``group_by`` over the day), as calibration and the fast replay need them.

A judged column is a raw column of the schema other than the timestamp and the keys:
- numeric: ``mean`` (of log(value) when the spec's calibration says so), ``spread`` (log sd, for
  sources of several rows a day), ``nulls`` (share of null rows) and ``run`` (the value when every
  row of the day holds the same one: a stuck sensor repeats it day after day);
- categorical: ``nulls``, ``share=<value>`` for its common values, and ``new`` (rows whose value was
  never seen: counted against the calibration's vocabulary and the recent days, in ``gate``);
- the label (``binary_labels``): ``rate``, or ``rate=<class>`` per class.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import polars as pl

from ml_assets.spec import ModelSpec
from ml_assets.validation.label_drift import DAY, binary_labels
from ml_assets.validation.label_fit import design, log_loss

SPREAD_MIN_ROWS = 5  # a day's sd is a signal once the source's median day holds this many rows


def signal_key(column: str, measure: str) -> str:
    return f"{column}:{measure}"


@dataclass
class Daily:
    """Signals over consecutive days: ``values[d, s]`` (NaN where a day has none), the day's rows, and
    the values of categorical columns outside their vocabulary, as (day index, column, value, rows)."""

    days: list[dt.date]
    keys: list[str]
    values: np.ndarray
    rows: np.ndarray
    unseen: pl.DataFrame

    def column(self, key: str) -> np.ndarray:
        return self.values[:, self.keys.index(key)]


def _finite(column: str) -> pl.Expr:
    value = pl.col(column).cast(pl.Float64)
    return pl.when(value.is_finite()).then(value)


def _measures(key: str, column: str, measure: str, log: bool) -> pl.Expr:
    """The polars aggregation of one signal over a day's rows."""
    value = _finite(column)
    if measure == "mean":
        return (value.clip(lower_bound=1e-12).log() if log else value).mean().alias(key)
    if measure == "spread":
        return (value.std() + 1e-9).log().alias(key)
    if measure == "nulls":
        return pl.col(column).is_null().mean().alias(key)
    if measure == "run":
        return pl.when(value.drop_nulls().n_unique() == 1).then(value.drop_nulls().first()).alias(key)
    if measure.startswith("share="):
        return (pl.col(column).cast(pl.String) == measure.removeprefix("share=")).fill_null(False).mean().alias(key)
    raise ValueError(f"unknown measure {measure!r}")


def daily(spec: ModelSpec, signals: dict, rows: pl.DataFrame, days: list[dt.date]) -> Daily:
    """``signals`` (key -> ``Signal``) of ``rows`` (each row's day in ``__day``) over ``days``."""
    labels = binary_labels(spec)
    frame = rows
    label_exprs = []
    for key, sig in signals.items():
        if sig.column == "label" and sig.measure.startswith("rate"):
            name = "label" if sig.measure == "rate" else f"class {sig.measure.removeprefix('rate=')}"
            if name in labels:
                label_exprs.append(labels[name].alias(f"__y {key}"))
    if label_exprs:
        try:
            frame = frame.with_columns(label_exprs)
        except pl.exceptions.PolarsError:  # the target's inputs are broken: the schema checks say so
            frame = frame.with_columns([pl.lit(None, pl.Float64).alias(e.meta.output_name()) for e in label_exprs])
    aggs = [pl.len().alias("__rows")]
    for key, sig in signals.items():
        if sig.measure == "fit" and "label" in labels:
            frame, loss = _with_fit(frame, key, sig, labels["label"])
            aggs.append(loss)
        elif sig.column == "label":
            if f"__y {key}" in frame.columns:
                aggs.append(pl.col(f"__y {key}").cast(pl.Float64).mean().alias(key))
        elif sig.column in frame.columns and sig.measure != "new":
            aggs.append(_measures(key, sig.column, sig.measure, sig.log))
    grouped = frame.group_by(DAY).agg(aggs) if frame.height else pl.DataFrame({DAY: [], "__rows": []},
                                                                                schema={DAY: pl.Date, "__rows": pl.UInt32})
    table = pl.DataFrame({DAY: days}, schema={DAY: pl.Date}).join(grouped, on=DAY, how="left")
    keys = list(signals)
    values = np.full((len(days), len(keys)), np.nan)
    for i, key in enumerate(keys):
        if key in table.columns:
            values[:, i] = table[key].cast(pl.Float64).fill_null(np.nan).to_numpy()
    return Daily(days, keys, values, table["__rows"].fill_null(0).to_numpy(), _unseen(signals, frame, days))


def _with_fit(frame: pl.DataFrame, key: str, sig, label: pl.Expr) -> tuple[pl.DataFrame, pl.Expr]:
    """The rows with the label model's inputs, and the day's mean log-loss of the labelled rows."""
    try:
        frame = frame.with_columns(design(sig.terms, sig.centers))
        loss = log_loss(sig.terms, sig.centers, label)
        frame.select(loss.head(0))  # inputs broken (a column missing or mistyped): the schema check says so
    except pl.exceptions.PolarsError:
        return frame, pl.lit(None, pl.Float64).alias(key)
    return frame, loss.filter(label.is_not_null()).mean().alias(key)


def _unseen(signals: dict, frame: pl.DataFrame, days: list[dt.date]) -> pl.DataFrame:
    """Rows per (day, column, value) of categorical values outside the calibration's vocabulary."""
    index = {d: i for i, d in enumerate(days)}
    parts = []
    for key, sig in signals.items():
        if sig.measure != "new" or sig.column not in frame.columns:
            continue
        values = pl.col(sig.column).cast(pl.String)
        part = (frame.filter(values.is_not_null() & ~values.is_in(sig.vocabulary))
                .group_by(DAY, values.alias("value")).agg(pl.len().alias("rows"))
                .with_columns(pl.lit(key).alias("signal")))
        parts.append(part)
    empty = pl.DataFrame(schema={"day": pl.Int64, "signal": pl.String, "value": pl.String, "rows": pl.Int64})
    if not parts:
        return empty
    out = pl.concat(parts).with_columns(pl.col(DAY).replace_strict(index, default=-1, return_dtype=pl.Int64).alias("day"))
    return out.filter(pl.col("day") >= 0).select("day", "signal", "value", pl.col("rows").cast(pl.Int64)).sort("day")


def fourier(days: np.ndarray, harmonics: int) -> np.ndarray:
    """cos/sin of the day of the year (days as numpy datetime64[D]), ``2 * harmonics`` columns."""
    doy = (days - days.astype("datetime64[Y]")).astype(np.int64)
    angle = 2 * np.pi * doy[:, None] * np.arange(1, harmonics + 1)[None, :] / 365.25
    out = np.empty((len(days), 2 * harmonics))
    out[:, 0::2], out[:, 1::2] = np.cos(angle), np.sin(angle)
    return out


def weekday(days: np.ndarray) -> np.ndarray:
    """Monday 0 .. Sunday 6 (1970-01-01 was a Thursday)."""
    return (days.astype(np.int64) + 3) % 7


def profile(signals: dict, keys: list[str], days: list[dt.date]) -> np.ndarray:
    """Each signal's weekly and yearly offsets on ``days`` (zeros where the calibration fitted none)."""
    when = np.array(days, dtype="datetime64[D]")
    out = np.zeros((len(days), len(keys)))
    dow = weekday(when)
    basis = None
    for i, key in enumerate(keys):
        sig = signals[key]
        if sig.weekly is not None:
            out[:, i] += np.asarray(sig.weekly)[dow]
        if sig.yearly is not None:
            if basis is None or basis.shape[1] != len(sig.yearly):
                basis = fourier(when, len(sig.yearly) // 2)
            out[:, i] += basis @ np.asarray(sig.yearly)
    return out
