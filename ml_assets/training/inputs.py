"""The feature days a partition's training or evaluation reads, found in the Dagster instance.

A day without features is looked up once more to say why: never ingested, stopped by its snapshot
checks, or published but never featurized. The window module decides what a missing day means.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from ml_assets.features.record import FeaturesRecord
from ml_assets.pipeline.graph import Stage, Wiring
from ml_assets.records.read import instance_hint
from ml_assets.training.window import Window, WindowError, without_missing


def why_missing(instance: dg.DagsterInstance, wiring: Wiring, day: dt.date) -> str:
    def has(stage: Stage) -> bool:
        return wiring.graph.materialized(instance, stage, day.isoformat())

    if not has(Stage.RAW_DATA):
        return "never ingested"
    if not has(Stage.VALIDATED_SNAPSHOT):
        return "ingested, but its snapshot checks never passed"
    return "its snapshot is published, but features were never built"


def feature_window(context: dg.AssetExecutionContext, wiring: Wiring, window: Window, part: str
                   ) -> tuple[Window, dict[str, FeaturesRecord]]:
    """``window`` less the days of ``part`` ("fit" or "test") that have no features (as the spec
    allows), and the features record of every day kept, by ISO day. Raises dg.Failure naming the days."""
    days = window.fit_days if part == "fit" else window.test_days
    found = {d: wiring.find(context.instance, FeaturesRecord, d.isoformat()) for d in days}
    try:
        window = without_missing(wiring.graph.spec, window, part, lambda d: found[d] is not None,
                                 lambda d: why_missing(context.instance, wiring, d))
    except WindowError as exc:
        raise dg.Failure(description=str(exc) + instance_hint(context.instance), allow_retries=False) from None
    return window, {d.isoformat(): record for d, record in found.items() if record is not None}
