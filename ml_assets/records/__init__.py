"""Typed stage records: what each stage tells the next, one frozen dataclass per stage output.

Each record has one way in and out of Dagster metadata (``to_metadata`` / ``from_metadata``) and,
where it reaches MLflow or the version store, of tags and commit metadata. Nothing reads metadata
or tags by string key outside a record: a stage reads its upstream through the model's graph
(``ml_assets.pipeline.graph``), typed.

This package holds what the records share: the base class (``base``), the provenance every write
carries (``provenance``), reading the latest record from a Dagster instance (``read``) and the
run-level tags (``runs``). Each stage's record lives in its own package:

| stage | record |
|---|---|
| raw_data | ingest.record: RawRecord, commit metadata RawCommit |
| validated_snapshot | validation.record: SnapshotRecord, merge metadata PublishCommit |
| features | features.record: FeaturesRecord |
| trained_checkpoint | training.record: CheckpointRecord (the trainer's TrainingResult + the window) |
| evaluation_report | evaluation.record: EvaluationRecord |
| registered_model | registry.record: RegisteredRecord, MLflow version tags VersionTags (+ GateTags) |
| production_model | promotion.record: PromotionRecord |
| hyperparameters | tuning.record: TunedRecord |
| predictions, model_monitor | scoring.record: PredictionsRecord, MonitorRecord |
"""
