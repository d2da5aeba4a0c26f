"""The whole spec (``ModelSpec``): its sections, and the checks that span several of them."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ml_assets.names import InvalidName, check_team_name
from ml_assets.spec.architecture import ArchitectureSpec, factory_default_space, move_legacy
from ml_assets.spec.base import StrictModel, model_name
from ml_assets.spec.card import CardSpec
from ml_assets.spec.data_schema import TIMESTAMP_DTYPES, DataSchema
from ml_assets.spec.evaluation import TASK_METRICS, EvaluationSpec
from ml_assets.spec.features import FeaturesSpec
from ml_assets.spec.monitoring import MonitoringSpec
from ml_assets.spec.partitioning import PartitioningSpec
from ml_assets.spec.promotion import PromotionSpec
from ml_assets.spec.retrain import RetrainSpec
from ml_assets.spec.source import SourceSpec
from ml_assets.spec.target import TargetSpec
from ml_assets.spec.training import TrainingSpec
from ml_assets.spec.tuning import BUILT_IN_TUNABLE, PARAMS_PREFIX, TuningSpec
from ml_assets.spec.validation import ValidationSpec


class ModelSpec(StrictModel):
    name: str
    description: str = ""
    owner: str = Field(default="unowned", description="who answers for the model (a person or a list); "
                       "shown on its model card")
    team: str = Field(default="default", description="the team the model belongs to: its runs carry it, the "
                      "queue limits runs per team, usage is added up per team; a deployment that sets "
                      "ML_ASSETS_TEAMS allows only those")
    priority: Literal["low", "normal", "high", "urgent"] = Field(
        default="normal", description="the queue's order for this model's runs (dagster/priority "
        "-10, 0, 10, 20): a higher priority is dequeued first")
    source: SourceSpec
    data_schema: DataSchema = Field(alias="schema")
    partitioning: PartitioningSpec
    target: TargetSpec
    features: FeaturesSpec
    validation: ValidationSpec = ValidationSpec()
    model: ArchitectureSpec = ArchitectureSpec()
    training: TrainingSpec = TrainingSpec()
    tuning: TuningSpec = TuningSpec()
    evaluation: EvaluationSpec
    promotion: PromotionSpec
    card: CardSpec = CardSpec()
    monitoring: MonitoringSpec = MonitoringSpec()
    retrain: RetrainSpec = RetrainSpec()

    @model_validator(mode="before")
    @classmethod
    def _legacy_model_settings(cls, data: object) -> object:
        return factory_default_space(move_legacy(data))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return model_name(value)

    @field_validator("team")
    @classmethod
    def _team(cls, value: str) -> str:
        try:
            return check_team_name(value)
        except InvalidName as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _monitored_metrics(self) -> ModelSpec:
        from ml_assets.spec.evaluation import HIGHER_IS_BETTER

        known = TASK_METRICS[self.target.task]
        for name, limit in self.monitoring.metrics.items():
            where = f"monitoring.metrics.{name}"
            if name not in known:
                raise ValueError(f"{where}: {self.target.task} has no metric {name!r} (it has {', '.join(known)})")
            if limit.higher_is_better != HIGHER_IS_BETTER[name]:
                want = "warn_below/block_below" if HIGHER_IS_BETTER[name] else "warn_above/block_above"
                raise ValueError(f"{where}: {name} is {'higher' if HIGHER_IS_BETTER[name] else 'lower'}-is-better, "
                                 f"so its limits are {want}")
        return self

    @model_validator(mode="after")
    def _evidence_to_retrain_on(self) -> ModelSpec:
        m = self.monitoring
        blocking = any(limit.block_below is not None or limit.block_above is not None for limit in m.metrics.values())
        blocking = blocking or any(d is not None and d.block_above is not None for d in (m.prediction_drift, m.feature_drift))
        if self.retrain.on_degradation and not blocking:
            raise ValueError(f"retrain.on: {self.retrain.on} retrains when model_monitor crosses a blocking limit, and "
                             "monitoring sets none (give a block_below/block_above in monitoring)")
        return self

    @model_validator(mode="after")
    def _top_k_fits(self) -> ModelSpec:
        classes = self.target.classes
        # k at or above the number of classes counts every row right: a metric that cannot fail.
        if classes is not None and self.evaluation.top_k >= len(classes):
            raise ValueError(f"evaluation.top_k: {self.evaluation.top_k} is not below the {len(classes)} "
                             "target.classes")
        return self

    @model_validator(mode="after")
    def _boosting(self) -> ModelSpec:
        if not self.model.boosted:
            return self
        from ml_assets.trainer.boosting import problems

        if wrong := problems(self.model.params, self.target.task):
            raise ValueError("model.params." + "; model.params.".join(wrong))
        if self.training.strategy != "ddp":
            raise ValueError(f"training.strategy: {self.training.strategy} shards a network; family xgboost "
                             "shards the rows over the ranks (leave strategy out)")
        return self

    @model_validator(mode="after")
    def _tunable(self) -> ModelSpec:
        space = set(self.tuning.space)
        if self.model.boosted:
            if wrong := sorted(s for s in space if not s.startswith(PARAMS_PREFIX)):
                raise ValueError(f"tuning.space: {wrong} tune a network's training; family xgboost is tuned through "
                                 "params.<name> (XGBoost's parameters)")
            from ml_assets.trainer.boosting import PARAMS

            if wrong := sorted(s for s in space if s[len(PARAMS_PREFIX):] not in PARAMS):
                raise ValueError(f"tuning.space: {wrong} are not XGBoost parameters the platform accepts")
            return self
        if self.model.custom:
            if wrong := sorted(space & BUILT_IN_TUNABLE):
                raise ValueError(f"tuning.space: {wrong} tune the built-in families; the factory "
                                 f"{self.model.module!r} is tuned through params.<name>")
        elif wrong := sorted(s for s in space if s.startswith(PARAMS_PREFIX)):
            raise ValueError(f"tuning.space: {wrong} tune a factory's params; set model.module")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        raw = set(self.data_schema.columns)
        _need([self.partitioning.timestamp_column], "partitioning.timestamp_column", raw)
        _need(self.target.input_columns, "target.expression", raw)
        leaky = _leaky_columns(self)
        _check_derivations(self, raw, leaky)
        features = _check_inputs(self, raw, leaky)
        _need(self.evaluation.slice_columns, "evaluation.slice_columns", features)
        _check_metrics(self)
        _check_seasonal(self)
        return self

    @model_validator(mode="after")
    def _windows_fit(self) -> ModelSpec:
        training, part = self.training, self.partitioning
        if training.validation_days >= training.window_days:
            raise ValueError(f"training.validation_days: {training.validation_days} leaves no training day in "
                             f"training.window_days {training.window_days}")
        train_days = training.window_days - training.validation_days
        if training.missing_days == "skip":
            if training.max_missing_days == 0:
                raise ValueError("training.max_missing_days: 0 skips nothing; set how many days may be missing "
                                 "(or missing_days: fail)")
            if training.max_missing_days >= train_days:
                raise ValueError(f"training.max_missing_days: {training.max_missing_days} could leave no training "
                                 f"day of the {train_days}")
        elif training.max_missing_days:
            raise ValueError("training.max_missing_days applies with missing_days: skip")
        if training.warm_start is not None:
            _check_warm_start(self, train_days)
        needed = training.window_days + self.evaluation.test_days
        if part.end is not None and (part.end - part.start).days + 1 < needed:
            raise ValueError(f"evaluation.test_days: {training.window_days} window days and "
                             f"{self.evaluation.test_days} test days need {needed} days of partitions, but "
                             f"{part.start}..{part.end} has {(part.end - part.start).days + 1}")
        ts = self.data_schema.columns.get(part.timestamp_column)
        if ts is not None:
            if ts.dtype not in TIMESTAMP_DTYPES:
                raise ValueError(f"partitioning.timestamp_column: {part.timestamp_column!r} has dtype {ts.dtype}, "
                                 f"which cannot date a row (use one of {list(TIMESTAMP_DTYPES)})")
            if part.timestamp_format is not None and ts.dtype != "string":
                raise ValueError(f"partitioning.timestamp_format: {part.timestamp_column!r} is a {ts.dtype} "
                                 "column, read without a format; remove timestamp_format")
        return self

    @model_validator(mode="after")
    def _calibrated_for_this_schema(self) -> ModelSpec:
        cal = self.validation.calibration
        if cal is not None:
            if cal.model != self.name:
                raise ValueError(f"validation.calibration: made for model {cal.model!r}, not {self.name!r}")
            if changes := cal.schema_changes({c: col.dtype for c, col in self.data_schema.columns.items()}):
                raise ValueError(f"validation.calibration: made for another schema ({', '.join(changes)}): "
                                 f"calibrate again (ml-assets calibrate {self.name} --start ... --end ...)")
        return self

    @property
    def repository(self) -> str:
        from ml_assets.names import repo_for_model

        return repo_for_model(self.name)

    @functools.cached_property
    def _as_json(self) -> dict:
        # Dumped once: every stage's code version fingerprints some of the sections.
        return self.model_dump(mode="json", by_alias=True)

    def model_copy(self, *, update: dict | None = None, deep: bool = False) -> ModelSpec:
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("_as_json", None)  # the copy's own sections are dumped when asked
        return copied

    def fingerprint(self, *sections: str) -> str:
        """A stable hash of the whole spec or of some of its sections (for code versions)."""
        data = dict(self._as_json)
        if sections:
            data = {s: data[s] for s in sections}
            # A waiver concerns its own day: it does not change how any other partition is judged.
            _drop(data, "validation", "waivers")
            # Where the training pods are scheduled does not change what they learn.
            _drop(data, "training", "pod")
        # Where the factory's code lies is not what it is: its content is pinned by sha256 instead.
        _drop(data, "model", "code_path")
        _drop(data, "model", "tracker_port")  # where the ranks meet, not what they learn
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _drop(data: dict, section: str, key: str) -> None:
    """``data`` without ``section.key``, leaving the cached dump it was copied from whole."""
    if isinstance(data.get(section), dict) and key in data[section]:
        data[section] = {k: v for k, v in data[section].items() if k != key}


def _check_warm_start(spec: ModelSpec, train_days: int) -> None:
    warm = spec.training.warm_start
    if warm.days > train_days:
        raise ValueError(f"training.warm_start.days: {warm.days} is more than the window's {train_days} training days "
                         f"(training.window_days {spec.training.window_days} less validation_days "
                         f"{spec.training.validation_days})")
    if spec.model.boosted and warm.epochs is not None:
        raise ValueError("training.warm_start.epochs: family xgboost's fine-tune adds boosting rounds, not epochs "
                         "(training.warm_start.rounds)")
    if not spec.model.boosted and warm.rounds is not None:
        raise ValueError("training.warm_start.rounds: boosting rounds apply to family xgboost; a network's "
                         "fine-tune trains training.warm_start.epochs")
    if warm.replay_fraction and warm.days == train_days:
        raise ValueError("training.warm_start.replay_fraction: every training day is already a fine-tune day; "
                         "there is no older day to replay")
    checked = {f.name for f in spec.features.categorical if f.encoding == "vocabulary"} | {
        f.name for f in spec.features.numeric if not f.bucketized}
    for field, names in (("features", warm.full_when.features or []), ("ignore", warm.full_when.ignore)):
        for name in names:
            if name not in checked:
                raise ValueError(f"training.warm_start.full_when.{field}: {name!r} is not a vocabulary-encoded "
                                 f"categorical or a numeric feature with a fitted scaler (those are {sorted(checked)})")


def _check_seasonal(spec: ModelSpec) -> None:
    """Seasonal columns are drift columns: features read as they are from the raw rows."""
    seasonal = spec.validation.drift.seasonal
    if seasonal is None:
        return
    raw = spec.data_schema.columns
    judged = {c for c in spec.features.numeric_names if c in raw and raw[c].dtype in ("int64", "float64")}
    judged |= {c for c in spec.features.categorical_names if c in raw}
    unknown = [c for c in seasonal.columns if c not in judged]
    if unknown:
        raise ValueError(f"validation.drift.seasonal.columns: {unknown} are not drift columns (the features read as "
                         f"they are from the raw rows: {sorted(judged)})")


def _need(columns: list[str], where: str, known: set[str]) -> None:
    missing = [c for c in columns if c not in known]
    if missing:
        raise ValueError(f"{where}: {missing} not among the columns {sorted(known)}")


def _leaky_columns(spec: ModelSpec) -> dict[str, str]:
    """The columns a feature must not come from, each with why (an input of the target says it first)."""
    after = {c: "known only after the event" for c, col in spec.data_schema.columns.items() if col.after_event}
    return {**after, **dict.fromkeys(spec.target.input_columns, "an input of the target")}


def _why(leaky: dict[str, str], columns: set[str]) -> str:
    return ", ".join(f"{c!r} ({leaky[c]})" for c in sorted(columns))


def _check_derivations(spec: ModelSpec, raw: set[str], leaky: dict[str, str]) -> None:
    """Joins, time parts and rolling aggregates read declared columns, and never key on the label."""
    ts, feats = spec.partitioning.timestamp_column, spec.features
    for i, join in enumerate(feats.joins):
        where = f"features.joins[{i}]"
        if join.dimension not in spec.source.dimensions:
            raise ValueError(f"{where}.dimension: {join.dimension!r} is not a source dimension "
                             f"({sorted(spec.source.dimensions)})")
        _need(join.keys, f"{where}.keys", raw)
        if join.asof:
            _need([join.asof.column], f"{where}.asof.column", raw)
        if bad := leaky.keys() & {*join.keys, *([join.asof.column] if join.asof else [])}:
            raise ValueError(f"{where}: joining on {_why(leaky, bad)} leaks the label")
    if feats.time:
        _need([feats.time.column or ts], "features.time.column", raw)
        if bad := leaky.keys() & {feats.time.column or ts}:
            raise ValueError(f"features.time.column: time parts of {_why(leaky, bad)} leak the label")
    for i, roll in enumerate(feats.rolling):
        _need(roll.by, f"features.rolling[{i}].by", raw)
        _need(roll.input_columns, f"features.rolling[{i}].expression", raw)
        if bad := leaky.keys() & set(roll.by):
            raise ValueError(f"features.rolling[{i}].by: grouping by {_why(leaky, bad)} leaks the label")


def _check_inputs(spec: ModelSpec, raw: set[str], leaky: dict[str, str]) -> set[str]:
    """The model's inputs exist, are made once and leak no label; returns every column there is to read."""
    feats, columns = spec.features, spec.data_schema.columns
    derived = feats.derived_columns
    if clash := sorted({c for c in derived if c in raw or derived.count(c) > 1}):
        raise ValueError(f"features: {clash} are made twice (a raw column, a join, a time part, a rolling "
                         "aggregate or a custom transform's column)")
    features = raw | set(derived)
    _need(feats.numeric_names, "features.numeric", features)
    _need(feats.categorical_names, "features.categorical", features)
    for col in feats.numeric_names:
        if col in raw and columns[col].dtype not in ("int64", "float64", "bool"):
            raise ValueError(f"features.numeric: {col!r} has dtype {columns[col].dtype}")
    if spec.target.name in features:
        raise ValueError(f"target.name {spec.target.name!r} collides with a column or feature")
    if leaked := leaky.keys() & set(feats.numeric_names + feats.categorical_names):
        raise ValueError(f"features: {_why(leaky, leaked)}: a feature from it leaks the label")
    return features


def _check_metrics(spec: ModelSpec) -> None:
    allowed = TASK_METRICS[spec.target.task]
    for where, metrics in (
        ("evaluation.metrics", spec.evaluation.metrics),
        ("promotion.floors", list(spec.promotion.floors)),
        ("promotion.primary_metric", [spec.promotion.primary_metric]),
    ):
        wrong = [m for m in metrics if m not in allowed]
        if wrong:
            raise ValueError(f"{where}: {wrong} do not apply to task {spec.target.task} (use {list(allowed)})")
