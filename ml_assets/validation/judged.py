"""The raw columns the calibrated gate judges (every column but the timestamp and the keys)."""

from __future__ import annotations

from ml_assets.spec import ModelSpec

NUMERIC = ("int64", "float64")


def judged_columns(spec: ModelSpec) -> dict[str, str]:
    """The raw columns calibration judges, with their dtype."""
    skip = {spec.partitioning.timestamp_column, *spec.data_schema.keys}
    return {c: col.dtype for c, col in spec.data_schema.columns.items() if c not in skip}
