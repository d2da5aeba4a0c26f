"""A model's asset graph, declared once: its stages' keys, the edges between them (with the days of
the upstream partitions each one covers), the record a stage reads over each edge, and the names of
its jobs and groups.

A stage builder asks its ``Wiring`` for its key, its ``deps`` and its upstream records; the CLI and
the sensors ask the graph for a stage's key or latest record. Nothing else builds a key from a
string, so an edge drawn in the UI and a read in an asset's body cannot disagree: reading a record
over an edge the graph does not declare is a programming error, raised at once.

    graph = ModelGraph(spec)
    wiring = graph.wiring(Stage.FEATURES)
    @dg.asset(key=wiring.key, deps=wiring.deps, ...)
    ... snapshot = wiring.read(context, SnapshotRecord, partition)
"""

from __future__ import annotations

import datetime as dt
import enum
import warnings
from dataclasses import dataclass
from typing import TypeVar

import dagster as dg

from ml_assets.evaluation.record import EvaluationRecord
from ml_assets.features.record import FeaturesRecord
from ml_assets.ingest.record import RawRecord
from ml_assets.promotion.record import PromotionRecord
from ml_assets.records.base import Record
from ml_assets.records.read import latest, latest_event, upstream
from ml_assets.registry.record import RegisteredRecord
from ml_assets.scoring.record import MonitorRecord, PredictionsRecord
from ml_assets.spec import ModelSpec
from ml_assets.training.record import CheckpointRecord
from ml_assets.tuning.record import TunedRecord
from ml_assets.validation.record import SnapshotRecord

R = TypeVar("R", bound=Record)

# The concurrency pool of steps that train (trained_checkpoint, hyperparameters): its limit is the
# number of trainings that may hold the machine's (or cluster's) GPUs at once.
GPU_POOL = "gpu"


class Stage(enum.StrEnum):
    """A stage of a model's life; its asset key is ``<model>/<stage>``."""

    RAW_DATA = "raw_data"
    VALIDATED_SNAPSHOT = "validated_snapshot"
    FEATURES = "features"
    TRAINED_CHECKPOINT = "trained_checkpoint"
    EVALUATION_REPORT = "evaluation_report"
    REGISTERED_MODEL = "registered_model"
    PRODUCTION_MODEL = "production_model"
    HYPERPARAMETERS = "hyperparameters"
    PREDICTIONS = "predictions"
    MODEL_MONITOR = "model_monitor"


# What each stage's materializations record (its metadata, typed).
RECORDS: dict[Stage, type[Record]] = {
    Stage.RAW_DATA: RawRecord, Stage.VALIDATED_SNAPSHOT: SnapshotRecord, Stage.FEATURES: FeaturesRecord,
    Stage.TRAINED_CHECKPOINT: CheckpointRecord, Stage.EVALUATION_REPORT: EvaluationRecord,
    Stage.REGISTERED_MODEL: RegisteredRecord, Stage.PRODUCTION_MODEL: PromotionRecord,
    Stage.HYPERPARAMETERS: TunedRecord, Stage.PREDICTIONS: PredictionsRecord, Stage.MODEL_MONITOR: MonitorRecord,
}
STAGE_OF: dict[type[Record], Stage] = {record: stage for stage, record in RECORDS.items()}

# The daily job's stages, in order; the first three are what a backfill of history runs.
DAILY_STAGES = (Stage.RAW_DATA, Stage.VALIDATED_SNAPSHOT, Stage.FEATURES, Stage.TRAINED_CHECKPOINT,
                Stage.EVALUATION_REPORT, Stage.REGISTERED_MODEL)
INGEST_STAGES = DAILY_STAGES[:3]


@dataclass(frozen=True)
class Edge:
    """``upstream`` feeds a stage. ``days``: the window of upstream days around the stage's partition,
    as offsets (0: its own day); None: Dagster's default mapping (the same day between daily stages,
    every day into an unpartitioned one). ``read``: whether the stage reads the upstream's record
    (False: a lineage edge only)."""

    upstream: Stage
    days: tuple[int, int] | None = None
    read: bool = True


def edges(spec: ModelSpec) -> dict[Stage, tuple[Edge, ...]]:
    """The one declaration of a model's graph."""
    width, tests = spec.training.window_days, spec.evaluation.test_days
    return {
        Stage.RAW_DATA: (),
        Stage.VALIDATED_SNAPSHOT: (Edge(Stage.RAW_DATA),),
        Stage.FEATURES: (Edge(Stage.VALIDATED_SNAPSHOT),),
        # The window ends the day before the first test day: D-W-T+1 .. D-T. The latest study, when
        # there is one, sets the training's defaults.
        Stage.TRAINED_CHECKPOINT: (Edge(Stage.FEATURES, (-(width + tests - 1), -tests)),
                                   Edge(Stage.HYPERPARAMETERS, None)),
        # The checkpoint first: the order is the order of the asset's deps, as it always was.
        Stage.EVALUATION_REPORT: (Edge(Stage.TRAINED_CHECKPOINT), Edge(Stage.FEATURES, (-(tests - 1), 0))),
        Stage.REGISTERED_MODEL: (Edge(Stage.TRAINED_CHECKPOINT), Edge(Stage.EVALUATION_REPORT)),
        Stage.PRODUCTION_MODEL: (Edge(Stage.REGISTERED_MODEL, None, read=False),),
        # A study reads the newest window of features, whichever days those are.
        Stage.HYPERPARAMETERS: (Edge(Stage.FEATURES, None),),
        # The champion is read when the run starts (MLflow alias), not pinned by the graph: a day is
        # scored by whatever serves at the time, and the record names which version that was.
        Stage.PREDICTIONS: (Edge(Stage.VALIDATED_SNAPSHOT), Edge(Stage.PRODUCTION_MODEL, None, read=False)),
        Stage.MODEL_MONITOR: (Edge(Stage.PREDICTIONS), Edge(Stage.VALIDATED_SNAPSHOT)),
    }


def stage_key(model: str, stage: Stage) -> dg.AssetKey:
    """``<model>/<stage>``: for what knows a model by name only (alerts, sensors over many models)."""
    return dg.AssetKey([model, stage.value])


def daily_job_name(model: str) -> str:
    return f"{model}_daily"


def daily_partitions(spec: ModelSpec) -> dg.DailyPartitionsDefinition:
    part = spec.partitioning
    end = (part.end + dt.timedelta(days=1)).isoformat() if part.end else None  # Dagster's end is exclusive
    return dg.DailyPartitionsDefinition(start_date=part.start.isoformat(), end_date=end, timezone=part.timezone)


def window_mapping(start_offset: int, end_offset: int) -> dg.TimeWindowPartitionMapping:
    """Days ``start_offset..end_offset`` around a partition (0: its own day); days before the first
    partition do not exist rather than fail the mapping."""
    with warnings.catch_warnings():  # allow_nonexistent_upstream_partitions is marked beta
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.TimeWindowPartitionMapping(start_offset=start_offset, end_offset=end_offset,
                                             allow_nonexistent_upstream_partitions=True)


@dataclass(frozen=True)
class ModelGraph:
    """One model's graph: keys, edges, jobs and groups."""

    spec: ModelSpec

    def key(self, stage: Stage) -> dg.AssetKey:
        return stage_key(self.spec.name, stage)

    def wiring(self, stage: Stage) -> Wiring:
        return Wiring(self, stage, edges(self.spec)[stage])

    def latest(self, instance: dg.DagsterInstance, record: type[R], partition: str | None) -> R | None:
        """The record of a stage's latest materialization (for ``partition`` when partitioned), or None."""
        return latest(instance, self.key(STAGE_OF[record]), partition, record)

    def materialized(self, instance: dg.DagsterInstance, stage: Stage, partition: str | None) -> bool:
        return latest_event(instance, self.key(stage), partition) is not None

    @property
    def daily_job(self) -> str:
        return daily_job_name(self.spec.name)

    @property
    def ingest_job(self) -> str:
        return f"{self.spec.name}_ingest"

    @property
    def promote_job(self) -> str:
        return f"{self.spec.name}_promote"

    @property
    def tune_job(self) -> str:
        return f"{self.spec.name}_tune"

    @property
    def score_job(self) -> str:
        return f"{self.spec.name}_score"

    @property
    def promotion_sensor(self) -> str:
        return f"{self.spec.name}_promotion_sensor"

    @property
    def retrain_sensor(self) -> str:
        return f"{self.spec.name}_retrain_sensor"

    @property
    def arrival_sensor(self) -> str:
        return f"{self.spec.name}_data_arrival_sensor"

    @property
    def production_group(self) -> str:
        """production_model, predictions and model_monitor: materializing the model's own group for a
        day trains; it never promotes or scores."""
        return f"{self.spec.name}_production"

    @property
    def tuning_group(self) -> str:
        return f"{self.spec.name}_tuning"


@dataclass(frozen=True)
class Wiring:
    """One stage's place in its model's graph: its key, its deps, and its reads of upstream records."""

    graph: ModelGraph
    stage: Stage
    edges: tuple[Edge, ...]

    @property
    def key(self) -> dg.AssetKey:
        return self.graph.key(self.stage)

    @property
    def deps(self) -> list[dg.AssetDep]:
        return [dg.AssetDep(self.graph.key(e.upstream),
                            partition_mapping=window_mapping(*e.days) if e.days else None)
                for e in self.edges]

    def key_of(self, upstream: Stage) -> dg.AssetKey:
        self._edge(upstream)
        return self.graph.key(upstream)

    def read(self, context: dg.AssetExecutionContext, record: type[R], partition: str) -> R:
        """The upstream's record for ``partition``; a Failure saying how to make it when there is none."""
        return upstream(context, self.key_of(self._readable(record)), partition, record)

    def find(self, instance: dg.DagsterInstance, record: type[R], partition: str | None) -> R | None:
        """The upstream's record for ``partition`` (None: not partitioned), or None when there is none."""
        return latest(instance, self.key_of(self._readable(record)), partition, record)

    def _readable(self, record: type[R]) -> Stage:
        stage = STAGE_OF[record]
        if not self._edge(stage).read:
            raise TypeError(f"{self.stage} does not read {stage}'s record: its edge is lineage only")
        return stage

    def _edge(self, upstream: Stage) -> Edge:
        for edge in self.edges:
            if edge.upstream == upstream:
                return edge
        raise TypeError(f"{self.stage} has no edge from {upstream} in the model's graph "
                        "(ml_assets.pipeline.graph.edges)")
