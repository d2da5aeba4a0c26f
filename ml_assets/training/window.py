"""Which days a partition trains, validates and is tested on.

The partition's test days end with its own day (``evaluation.test_days``); the window of
``training.window_days`` days before them trains, its last ``training.validation_days`` validate.
No day is in two parts, and the model never sees a test day. With ``training.missing_days: skip``
a day without features is left out (at most ``max_missing_days`` of the window, and of the test
days) and listed with its reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from ml_assets.spec import ModelSpec


class WindowError(ValueError):
    pass


def _span(days: tuple[dt.date, ...]) -> str:
    if not days:
        return "no day"
    if len(days) == 1:
        return days[0].isoformat()
    return f"{days[0]}..{days[-1]} ({len(days)} days)"


@dataclass(frozen=True)
class Window:
    partition: dt.date
    train_days: tuple[dt.date, ...]
    val_days: tuple[dt.date, ...]
    test_days: tuple[dt.date, ...]
    skipped: dict[dt.date, str] = field(default_factory=dict)
    """Days of the window or the test days left out, with why (missing_days: skip)."""

    @property
    def fit_days(self) -> tuple[dt.date, ...]:
        return self.train_days + self.val_days

    def describe(self) -> str:
        text = (f"train {_span(self.train_days)}, validate {_span(self.val_days)}, test {_span(self.test_days)}")
        if self.skipped:
            text += "; skipped " + ", ".join(f"{d} ({why})" for d, why in sorted(self.skipped.items()))
        return text

    def skipped_json(self) -> dict[str, str]:
        return {d.isoformat(): why for d, why in sorted(self.skipped.items())}


def _days(first: dt.date, count: int) -> tuple[dt.date, ...]:
    return tuple(first + dt.timedelta(days=i) for i in range(count))


def held_out_days(spec: ModelSpec, day: dt.date) -> tuple[dt.date, ...]:
    count = spec.evaluation.test_days
    return _days(day - dt.timedelta(days=count - 1), count)


def training_window(spec: ModelSpec, day: dt.date) -> Window:
    """Every day the partition's training and evaluation would read, none skipped yet."""
    width, tests = spec.training.window_days, held_out_days(spec, day)
    first = tests[0] - dt.timedelta(days=width)
    if first < spec.partitioning.start:
        earliest = spec.partitioning.start + dt.timedelta(days=width + len(tests) - 1)
        raise WindowError(
            f"model {spec.name}: partition {day} needs {width} days of features before its "
            f"{len(tests)} test day(s) (from {first}), but partitions start on {spec.partitioning.start}; "
            f"the first trainable partition is {earliest}")
    days = _days(first, width)
    val = spec.training.validation_days
    return Window(day, days[:-val], days[-val:], tests)


def without_missing(spec: ModelSpec, window: Window, part: str, have: Callable[[dt.date], bool],
                    why: Callable[[dt.date], str]) -> Window:
    """``window`` less the days of ``part`` ("fit": training and validation days, or "test") that
    ``have`` says lack features, as the spec's ``training.missing_days`` allows; WindowError names
    the days, why each is missing and the spec field that decides."""
    days = window.fit_days if part == "fit" else window.test_days
    missing = {d: why(d) for d in days if not have(d)}
    if not missing:
        return window
    listed = "; ".join(f"{d}: {reason}" for d, reason in sorted(missing.items()))
    where = f"model {spec.name}, partition {window.partition}"
    what = "training window" if part == "fit" else "test days"
    training = spec.training
    if training.missing_days == "fail":
        raise WindowError(f"{where}: {len(missing)} day(s) of the {what} have no features ({listed}); materialize "
                          "them, or let the spec skip them (training.missing_days: skip, training.max_missing_days)")
    if len(missing) > training.max_missing_days:
        raise WindowError(f"{where}: {len(missing)} day(s) of the {what} have no features ({listed}), more than "
                          f"training.max_missing_days ({training.max_missing_days})")
    kept = lambda group: tuple(d for d in group if d not in missing)  # noqa: E731
    result = Window(window.partition, kept(window.train_days), kept(window.val_days), kept(window.test_days),
                    {**window.skipped, **missing})
    for name, group, field_name in (("training", result.train_days, "training.window_days"),
                                    ("validation", result.val_days, "training.validation_days"),
                                    ("test", result.test_days, "evaluation.test_days")):
        if not group:
            raise WindowError(f"{where}: no {name} day is left after skipping the days without features ({listed}); "
                              f"raise {field_name}")
    return result


class TooFewRows(ValueError):
    pass


def check_rows(spec: ModelSpec, frame: pl.DataFrame, what: str, days: tuple[dt.date, ...],
               min_field: str, minimum: int, days_field: str, now: int) -> None:
    """Enough rows, and (classification) more than one class, to judge a model on: otherwise
    TooFewRows names the days, the counts and the spec field to raise."""
    span = f"{days[0]}..{days[-1]}" if len(days) > 1 else str(days[0])
    if frame.height < minimum:
        raise TooFewRows(f"the {what} ({span}) hold {frame.height} rows, fewer than {min_field} ({minimum}); "
                         f"raise {days_field} (now {now})")
    if spec.target.task == "regression":
        return
    counts = frame[spec.target.name].drop_nulls().unique()
    if counts.len() < 2:
        only = counts[0] if counts.len() else None
        raise TooFewRows(f"the {what} ({span}) hold {frame.height} rows, all of one class ({spec.target.name} = "
                         f"{only}): no decision threshold, ROC-AUC or log loss comparison can be judged on one "
                         f"class; raise {days_field} (now {now})")
