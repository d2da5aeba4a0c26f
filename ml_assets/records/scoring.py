"""What the scoring stage tells the next: a day's rows scored by the champion of the moment."""

from __future__ import annotations

from dataclasses import dataclass

from ml_assets.records.base import Record, field


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
