"""The model spec: one YAML file declares a model, validated here with friendly errors.

A broken spec fails definitions loading with one message that names the file, the field and the
problem, e.g. ``models/flights_delay.yaml: training.epochs: Input should be greater than 0``.

One module per section of the spec (``source``, ``schema``, ``partitioning``, ``target``,
``features``, ``validation``, ``training`` with its ``pods``, ``tuning``, ``evaluation``,
``promotion``); ``model`` joins them and checks what spans several; ``loading`` reads the files.
"""

from ml_assets.spec.base import CUSTOM_CHECK, PositiveInt
from ml_assets.spec.data_schema import (
    POLARS_DTYPES,
    TIMESTAMP_DTYPES,
    ColumnSchema,
    DataSchema,
    DType,
)
from ml_assets.spec.evaluation import (
    CLASSIFICATION_METRICS,
    HIGHER_IS_BETTER,
    MULTICLASS_METRICS,
    REGRESSION_METRICS,
    TASK_METRICS,
    EvaluationSpec,
    Metric,
)
from ml_assets.spec.features import (
    TIME_PARTS,
    AsOfSpec,
    Bucketize,
    BucketizeStep,
    CategoricalFeature,
    Clip,
    ClipStep,
    CustomTransform,
    FeaturesSpec,
    JoinSpec,
    NumericFeature,
    NumericStep,
    RollingSpec,
    TimeSpec,
)
from ml_assets.spec.loading import SpecError, load_spec, load_specs, parse_spec
from ml_assets.spec.model import ModelSpec
from ml_assets.spec.partitioning import PartitioningSpec
from ml_assets.spec.pods import LABEL_KEY, LABEL_VALUE, QUANTITY, TolerationSpec, TrainingPodSpec
from ml_assets.spec.promotion import PromotionSpec
from ml_assets.spec.source import SourceSpec, TableSource
from ml_assets.spec.target import TargetSpec, Task
from ml_assets.spec.training import CheckpointSpec, EarlyStoppingSpec, LoaderSpec, TrainingSpec
from ml_assets.spec.tuning import TUNABLE, PrunerSpec, RangeSpec, TuningSpec
from ml_assets.spec.validation import (
    CheckSettings,
    ColumnDrift,
    DriftSpec,
    FreshnessSpec,
    HolidaySpec,
    QuarantineSpec,
    ValidationSpec,
    VolumeSpec,
    Waiver,
)

__all__ = [
    "CLASSIFICATION_METRICS", "CUSTOM_CHECK", "HIGHER_IS_BETTER", "LABEL_KEY", "LABEL_VALUE", "MULTICLASS_METRICS",
    "POLARS_DTYPES", "QUANTITY", "REGRESSION_METRICS", "TASK_METRICS", "TIMESTAMP_DTYPES", "TIME_PARTS", "TUNABLE",
    "AsOfSpec", "Bucketize", "BucketizeStep", "CategoricalFeature", "CheckSettings", "CheckpointSpec", "Clip",
    "ClipStep", "ColumnDrift", "ColumnSchema", "CustomTransform", "DType", "DataSchema", "DriftSpec",
    "EarlyStoppingSpec", "EvaluationSpec", "FeaturesSpec", "FreshnessSpec", "HolidaySpec", "JoinSpec", "LoaderSpec",
    "Metric", "ModelSpec", "NumericFeature", "NumericStep", "PartitioningSpec", "PositiveInt", "PromotionSpec",
    "PrunerSpec", "QuarantineSpec", "RangeSpec", "RollingSpec", "SourceSpec", "SpecError", "TableSource",
    "TargetSpec", "Task", "TimeSpec", "TolerationSpec", "TrainingPodSpec", "TrainingSpec", "TuningSpec",
    "ValidationSpec", "VolumeSpec", "Waiver", "load_spec", "load_specs", "parse_spec",
]
