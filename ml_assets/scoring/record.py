"""What the scoring stages tell the next: a day's rows scored by the champion of the moment, and
the champion judged on that day."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ml_assets.records.base import Record, field
from ml_assets.trainer.result import rank_seconds


@dataclass(frozen=True, kw_only=True)
class PredictionsRecord(Record):
    """predictions: the day's rows scored by the champion at the time of the run, content-addressed.

    The file names the model that scored it in its Parquet metadata too (``PARQUET_KEYS``), so a
    prediction file found on its own can be walked back (``ml-assets lineage --predictions``)."""

    model_name: str
    model_version: str
    """The version that was @champion when the day was scored."""
    weights_sha256: str
    data_commit: str
    """The main commit of the day's snapshot (and of the days its rolling aggregates read)."""
    repository: str
    uri: str = field("path")
    sha256: str
    bytes: int
    rows: int
    rows_labeled: int
    """Rows whose label was already known when they were scored."""
    columns: list[str] = field("json")
    feature_state_sha256: str
    mlflow_model_url: str = field("url")
    reused: bool = False
    """True when the same champion had already scored the same data: nothing new was written."""
    wall_seconds: float | None = None
    """Seconds the run's predictions step took (a reused record's too: it is this run's); None in
    records from before it was measured. ``ml-assets usage`` counts the whole run instead."""
    cpu_rank_seconds: float | None = None
    """``wall_seconds`` on the one CPU process that scores."""
    gpu_rank_seconds: float | None = None
    """0: scoring runs on CPU."""

    def spent(self, wall_seconds: float) -> PredictionsRecord:
        """This record with the scoring step's own seconds (plotted per day in the UI)."""
        cpu, gpu = rank_seconds("cpu", 1, wall_seconds)
        return dataclasses.replace(self, wall_seconds=round(wall_seconds, 3), cpu_rank_seconds=cpu,
                                   gpu_rank_seconds=gpu)


@dataclass(frozen=True, kw_only=True)
class MonitorRecord(Record):
    """model_monitor: the champion that scored a day, judged on the day's labels and against its own
    training window. Shown with each live metric, the prediction PSI and the worst feature's PSI as
    numbers of their own, so the UI plots them over the days."""

    model_name: str
    model_version: str
    day: str
    status: str
    """ok, warn, blocked (a blocking limit crossed) or pending (no labels to judge the metrics yet)."""
    findings: list[dict[str, str]] = field("json")
    """Each limit crossed: kind (metric or drift), level (warn or blocked) and what was seen."""
    pending_reason: str | None
    rows_scored: int
    rows_labeled: int
    primary_metric: str
    metrics: dict[str, float] = field("json")
    primary_interval: list[float] | None = field("json")
    labels_commit: str
    predictions_sha256: str
    prediction_drift: dict[str, Any] = field("json")
    feature_drift: dict[str, dict[str, Any]] = field("json")
    worst_feature: str | None
    worst_feature_psi: float | None

    def to_metadata(self) -> dict[str, Any]:
        import dagster as dg

        shown = {f"live_{name}": dg.MetadataValue.float(value) for name, value in self.metrics.items()}
        if "psi" in self.prediction_drift:
            shown["prediction_psi"] = dg.MetadataValue.float(self.prediction_drift["psi"])
        if self.worst_feature_psi is not None:
            shown["worst_feature_psi"] = dg.MetadataValue.float(self.worst_feature_psi)
        return {**shown, **super().to_metadata()}
