"""The feature days a partition's training or evaluation reads, found in the Dagster instance.

A day without features is looked up once more to say why: never ingested, stopped by its snapshot
checks, or published but never featurized. The window module decides what a missing day means.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from ml_assets.defs.common import asset_key
from ml_assets.defs.training.window import Window, WindowError, without_missing
from ml_assets.records import FeaturesRecord, latest
from ml_assets.records.read import instance_hint, latest_event
from ml_assets.spec import ModelSpec


def why_missing(instance: dg.DagsterInstance, spec: ModelSpec, day: dt.date) -> str:
    def has(stage: str) -> bool:
        return latest_event(instance, asset_key(spec, stage), day.isoformat()) is not None

    if not has("raw_data"):
        return "never ingested"
    if not has("validated_snapshot"):
        return "ingested, but its snapshot checks never passed"
    return "its snapshot is published, but features were never built"


def feature_window(context: dg.AssetExecutionContext, spec: ModelSpec, window: Window, part: str
                   ) -> tuple[Window, dict[str, FeaturesRecord]]:
    """``window`` less the days of ``part`` ("fit" or "test") that have no features (as the spec
    allows), and the features record of every day kept, by ISO day. Raises dg.Failure naming the days."""
    days = window.fit_days if part == "fit" else window.test_days
    key = asset_key(spec, "features")
    found = {d: latest(context.instance, key, d.isoformat(), FeaturesRecord) for d in days}
    try:
        window = without_missing(spec, window, part, lambda d: found[d] is not None,
                                 lambda d: why_missing(context.instance, spec, d))
    except WindowError as exc:
        raise dg.Failure(description=str(exc) + instance_hint(context.instance), allow_retries=False) from None
    return window, {d.isoformat(): record for d, record in found.items() if record is not None}
