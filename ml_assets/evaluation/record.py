"""What the evaluation tells registration and the UI. The report itself (a JSON file, pinned by
uri + sha256 here) holds the full evidence; the predictions never travel in either."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ml_assets.records.base import Record, field


@dataclass(frozen=True, kw_only=True)
class EvaluationRecord(Record):
    """evaluation_report. Shown in metadata with each metric as its own number (plotted over
    partitions), ``<primary>_interval`` and, against a champion, ``delta_<primary>``."""

    primary_metric: str
    metrics: dict[str, float] = field("json")
    primary_interval: list[float] = field("json")
    test_rows: int
    repository: str
    test_days: list[str] = field("json")
    validation_days: list[str] = field("json")
    skipped_days: dict[str, str] = field("json")
    test_data_commit: str
    test_files: list[dict[str, str]] = field("json")
    positive_rate: float | None
    decision_threshold: float | None
    class_rates: dict[str, float] | None = field("json", default=None)
    per_class: list[dict[str, Any]] | None = field("json", default=None)
    checkpoint_sha256: str
    champion_version: str | None
    gate_passed: bool
    gate_reason: str
    slices: list[dict[str, Any]] = field("json")
    baseline: dict[str, Any] | None = field("json")
    report_uri: str = field("path")
    report_sha256: str
    report_bytes: int
    mlflow_run_id: str
    mlflow_run_url: str = field("url")
    plots: dict[str, str] = field("json")
    """Plot file name -> its MLflow artifact URL."""
    primary_delta: list[float] | None = field("json", default=None)
    """Against a champion: [change, low, high] of the primary metric."""
    champion_metrics: dict[str, float] | None = field("json", default=None)
    summary: str = field("md")
    plots_inline: str | None = field("md", default=None)
    """The plots themselves, embedded in markdown (evaluation.report.plots_markdown)."""

    def to_metadata(self) -> dict[str, Any]:
        import dagster as dg

        primary = self.primary_metric
        shown = {name: dg.MetadataValue.float(v) for name, v in self.metrics.items()}
        shown[f"{primary}_interval"] = dg.MetadataValue.json(self.primary_interval)
        shown.update({f"plot_{Path(name).stem}": dg.MetadataValue.url(url) for name, url in self.plots.items()})
        if self.primary_delta:
            shown[f"delta_{primary}"] = dg.MetadataValue.float(self.primary_delta[0])
            shown[f"delta_{primary}_interval"] = dg.MetadataValue.json(self.primary_delta[1:])
        return {**shown, **super().to_metadata()}
