"""Typed stage records: what each stage tells the next, one frozen dataclass per stage output.

Each record has one way in and out of Dagster metadata (``to_metadata`` / ``from_metadata``) and,
where it reaches MLflow or the version store, of tags and commit metadata. Outside this package
nothing reads metadata or tags by string key: a stage reads its upstream with ``upstream`` (or
``latest``), typed.

| stage | record |
|---|---|
| raw_data | RawRecord (objects: StoredObject), commit metadata RawCommit |
| validated_snapshot | SnapshotRecord, merge metadata PublishCommit |
| features | FeaturesRecord |
| trained_checkpoint | CheckpointRecord (the trainer's TrainingResult + the window) |
| evaluation_report | EvaluationRecord |
| registered_model | RegisteredRecord, MLflow version tags VersionTags (+ GateTags) |
| production_model | PromotionRecord |
| hyperparameters | TunedRecord |
| predictions | PredictionsRecord |
| model_monitor | MonitorRecord |
"""

from ml_assets.records.base import Record, RecordError
from ml_assets.records.data import (
    FeaturesRecord,
    Provenance,
    PublishCommit,
    RawCommit,
    RawRecord,
    SnapshotRecord,
    StoredObject,
)
from ml_assets.records.evaluation import EvaluationRecord
from ml_assets.records.promotion import PromotionRecord
from ml_assets.records.registry import GateTags, RegisteredRecord, VersionTags
from ml_assets.records.scoring import MonitorRecord, PredictionsRecord
from ml_assets.records.training import CheckpointRecord, TunedRecord

__all__ = ["CheckpointRecord", "EvaluationRecord", "FeaturesRecord", "GateTags", "MonitorRecord", "PredictionsRecord", "PromotionRecord", "Provenance",
           "PublishCommit", "RawCommit", "RawRecord", "Record", "RecordError", "RegisteredRecord", "SnapshotRecord",
           "StoredObject", "TunedRecord", "VersionTags", "latest", "upstream"]


def __getattr__(name: str):
    # Reading from a Dagster instance needs dagster; the records themselves do not (a scorer in a
    # fresh process reads a version's tags without it).
    if name in ("latest", "upstream"):
        from ml_assets.records import read

        return getattr(read, name)
    raise AttributeError(f"module 'ml_assets.records' has no attribute {name!r}")
