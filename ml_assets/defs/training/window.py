"""Which days a partition trains and validates on: the W days before it, never the day itself."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ml_assets.spec import ModelSpec


@dataclass(frozen=True)
class TrainingWindow:
    train_days: list[dt.date]
    val_day: dt.date
    test_day: dt.date


class WindowError(ValueError):
    pass


def training_window(spec: ModelSpec, day: dt.date) -> TrainingWindow:
    width = spec.training.window_days
    first = day - dt.timedelta(days=width)
    if first < spec.partitioning.start:
        earliest = spec.partitioning.start + dt.timedelta(days=width)
        raise WindowError(
            f"model {spec.name}: partition {day} needs {width} days of features before it "
            f"(from {first}), but partitions start on {spec.partitioning.start}; the first "
            f"trainable partition is {earliest}"
        )
    days = [first + dt.timedelta(days=i) for i in range(width)]
    return TrainingWindow(train_days=days[:-1], val_day=days[-1], test_day=day)
