"""The evaluation report as a document: frozen dataclasses with one way to and from its JSON.

The report is stored content-addressed and in the training's MLflow run
(``evaluation/evaluation_report.json``); the gate, the model card and the audit read its fields.
``to_dict`` writes the keys the report has always had (a field that did not apply is left out as
it always was), and ``from_dict`` reads a document written by any earlier version, a key it lacks
read as its field's default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Doc = Mapping[str, Any]


def _triple(value: Sequence[float] | None) -> tuple[float, float, float] | None:
    return None if value is None else (float(value[0]), float(value[1]), float(value[2]))


@dataclass(frozen=True, kw_only=True)
class SliceScore:
    """The primary metric on the rows of one value of a slice column; None (with why) when too few
    rows or undefined. ``positive_rate`` (binary, regression: the mean label) or ``class_rates``
    (multiclass) is the slice's label mix."""

    column: str
    value: str
    rows: int
    metric: float | None
    reason: str | None
    positive_rate: float | None = None
    class_rates: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        mix = {"class_rates": self.class_rates} if self.class_rates is not None else {"positive_rate": self.positive_rate}
        return {"column": self.column, "value": self.value, "rows": self.rows, **mix, "metric": self.metric,
                "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Doc) -> SliceScore:
        return cls(column=d["column"], value=d["value"], rows=d["rows"], metric=d.get("metric"),
                   reason=d.get("reason"), positive_rate=d.get("positive_rate"), class_rates=d.get("class_rates"))


@dataclass(frozen=True, kw_only=True)
class SliceRegression:
    """A slice's primary metric, new model against the champion; ``regression`` > 0: the new one is worse."""

    column: str
    value: str
    rows: int
    new: float
    old: float
    regression: float

    def to_dict(self) -> dict[str, Any]:
        return {"column": self.column, "value": self.value, "rows": self.rows, "new": self.new, "old": self.old,
                "regression": self.regression}

    @classmethod
    def from_dict(cls, d: Doc) -> SliceRegression:
        return cls(**{k: d[k] for k in ("column", "value", "rows", "new", "old", "regression")})


@dataclass(frozen=True, kw_only=True)
class ClassScore:
    """Multiclass: one class's rows and share, how often it is predicted, the precision and recall of predicting it."""

    name: str
    rows: int
    rate: float
    predicted: int
    precision: float
    recall: float

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.name, "rows": self.rows, "rate": self.rate, "predicted": self.predicted,
                "precision": self.precision, "recall": self.recall}

    @classmethod
    def from_dict(cls, d: Doc) -> ClassScore:
        return cls(name=d["class"], rows=d.get("rows", 0), rate=d["rate"], predicted=d.get("predicted", 0),
                   precision=d["precision"], recall=d["recall"])


@dataclass(frozen=True, kw_only=True)
class BaselineScore:
    name: str
    description: str
    metrics: dict[str, float]
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "metrics": self.metrics,
                "threshold": self.threshold}

    @classmethod
    def from_dict(cls, d: Doc) -> BaselineScore:
        return cls(name=d["name"], description=d.get("description", ""), metrics=dict(d["metrics"]),
                   threshold=d.get("threshold"))


@dataclass(frozen=True, kw_only=True)
class BaselineSample:
    """The training rows the baselines were fitted on: ``rows`` of the window's ``window_rows``,
    drawn uniformly without replacement with ``seed`` (all of them, in order, when the window has
    no more rows than the bound)."""

    rows: int
    window_rows: int
    seed: int

    @property
    def whole(self) -> bool:
        return self.rows == self.window_rows

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "window_rows": self.window_rows, "seed": self.seed}

    @classmethod
    def from_dict(cls, d: Doc | None) -> BaselineSample | None:
        return cls(rows=int(d["rows"]), window_rows=int(d["window_rows"]), seed=int(d["seed"])) if d else None


@dataclass(frozen=True, kw_only=True)
class Baselines:
    """The baselines fitted on the model's training days, the best by the primary metric, and the
    model's paired-bootstrap change over it (point, low, high); ``sample``: the training rows they
    were fitted on (None in reports from before it was recorded)."""

    baselines: tuple[BaselineScore, ...]
    best: str
    delta: tuple[float, float, float]
    sample: BaselineSample | None = None

    @property
    def best_score(self) -> BaselineScore:
        return next(b for b in self.baselines if b.name == self.best)

    def to_dict(self) -> dict[str, Any]:
        out = {"baselines": [b.to_dict() for b in self.baselines], "best": self.best, "delta": list(self.delta)}
        if self.sample is not None:
            out["sample"] = self.sample.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Doc | None) -> Baselines | None:
        if not d:
            return None
        return cls(baselines=tuple(BaselineScore.from_dict(b) for b in d.get("baselines", [])), best=d["best"],
                   delta=_triple(d["delta"]), sample=BaselineSample.from_dict(d.get("sample")))


@dataclass(frozen=True, kw_only=True)
class Champion:
    """The champion when the report was made; compared on the same rows unless it has the same weights."""

    version: str
    checkpoint_sha256: str
    partition: str
    same_weights: bool
    metrics: dict[str, float] | None = None
    """None: not compared (the same weights)."""
    threshold: float | None = None
    slices: tuple[SliceScore, ...] = ()

    @property
    def compared(self) -> bool:
        return self.metrics is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "checkpoint_sha256": self.checkpoint_sha256,
                               "partition": self.partition, "same_weights": self.same_weights}
        if self.compared:
            out.update(metrics=self.metrics, threshold=self.threshold, slices=[s.to_dict() for s in self.slices])
        return out

    @classmethod
    def from_dict(cls, d: Doc | None) -> Champion | None:
        if not d:
            return None
        return cls(version=str(d["version"]), checkpoint_sha256=d.get("checkpoint_sha256", ""),
                   partition=d.get("partition", ""), same_weights=bool(d.get("same_weights")),
                   metrics=d.get("metrics"), threshold=d.get("threshold"),
                   slices=tuple(SliceScore.from_dict(s) for s in d.get("slices") or []))


@dataclass(frozen=True, kw_only=True)
class Rival:
    """``promotion.rival``: another model's champion on the same rows; ``version`` None: it has none yet."""

    model: str
    version: str | None
    metrics: dict[str, float] | None = None
    primary_delta: tuple[float, float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.version is None:
            return {"model": self.model, "version": None}
        return {"model": self.model, "version": self.version, "metrics": self.metrics,
                "primary_delta": list(self.primary_delta)}

    @classmethod
    def from_dict(cls, d: Doc | None) -> Rival | None:
        if not d:
            return None
        return cls(model=d["model"], version=d.get("version"), metrics=d.get("metrics"),
                   primary_delta=_triple(d.get("primary_delta")))


@dataclass(frozen=True, kw_only=True)
class Clause:
    """One rule of the promotion policy: what was observed, what was required, and whether it held."""

    name: str
    observed: float | str | None
    required: str
    ok: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "observed": self.observed, "required": self.required, "ok": self.ok,
                "detail": self.detail}

    @classmethod
    def from_dict(cls, d: Doc) -> Clause:
        return cls(name=d["name"], observed=d.get("observed"), required=d.get("required", ""), ok=bool(d["ok"]),
                   detail=d.get("detail", ""))


@dataclass(frozen=True, kw_only=True)
class Gate:
    """The promotion gate's decision: ``kind`` first_model, challenger or same_as_champion."""

    passed: bool
    kind: str
    reason: str
    clauses: tuple[Clause, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "kind": self.kind, "reason": self.reason,
                "clauses": [c.to_dict() for c in self.clauses]}

    @classmethod
    def from_dict(cls, d: Doc | None) -> Gate | None:
        if not d:
            return None
        return cls(passed=bool(d["passed"]), kind=d.get("kind", ""), reason=d.get("reason", ""),
                   clauses=tuple(Clause.from_dict(c) for c in d.get("clauses") or []))


@dataclass(frozen=True, kw_only=True)
class TestFile:
    __test__ = False  # not a pytest class, whatever its name

    day: str
    uri: str
    sha256: str
    data_commit: str

    def to_dict(self) -> dict[str, Any]:
        return {"day": self.day, "uri": self.uri, "sha256": self.sha256, "data_commit": self.data_commit}

    @classmethod
    def from_dict(cls, d: Doc) -> TestFile:
        return cls(day=d["day"], uri=d["uri"], sha256=d["sha256"], data_commit=d.get("data_commit", ""))


@dataclass(frozen=True, kw_only=True)
class EvaluationReport:
    """A checkpoint judged on its held-out days, beside the baselines, the champion and a rival."""

    model: str
    partition: str
    task: str
    test_rows: int
    metrics: dict[str, float]
    primary_metric: str
    primary_interval: tuple[float, float]
    confidence_level: float
    bootstrap_samples: int
    threshold: float | None = None
    """Binary: the cut chosen on the validation days."""
    positive_rate: float | None = None
    classes: list[str] | None = None
    """Multiclass only, as are class_rates and per_class."""
    class_rates: dict[str, float] | None = None
    per_class: tuple[ClassScore, ...] | None = None
    slices: tuple[SliceScore, ...] = ()
    checkpoint_sha256: str = ""
    test_days: tuple[str, ...] = ()
    validation_days: tuple[str, ...] = ()
    skipped_days: dict[str, str] = field(default_factory=dict)
    test_files: tuple[TestFile, ...] = ()
    test_data_commit: str = ""
    baseline: Baselines | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    """The trainer's per-epoch losses."""
    champion: Champion | None = None
    deltas: dict[str, float] | None = None
    """Each metric, this model minus the champion (when compared)."""
    primary_delta: tuple[float, float, float] | None = None
    slice_regressions: tuple[SliceRegression, ...] = ()
    rival: Rival | None = None
    gate: Gate | None = None

    @property
    def primary_value(self) -> float:
        return self.metrics[self.primary_metric]

    @property
    def compared(self) -> bool:
        """Compared with a champion on the same rows (not a first model, not the champion's own weights)."""
        return self.deltas is not None

    def to_dict(self) -> dict[str, Any]:
        multiclass = {} if self.classes is None else {
            "classes": self.classes, "class_rates": self.class_rates,
            "per_class": [c.to_dict() for c in self.per_class or ()]}
        out = {
            "model": self.model, "partition": self.partition, "task": self.task, "test_rows": self.test_rows,
            "positive_rate": self.positive_rate, **multiclass, "threshold": self.threshold, "metrics": self.metrics,
            "primary_metric": self.primary_metric, "primary_interval": list(self.primary_interval),
            "confidence_level": self.confidence_level, "bootstrap_samples": self.bootstrap_samples,
            "slices": [s.to_dict() for s in self.slices], "checkpoint_sha256": self.checkpoint_sha256,
            "test_days": list(self.test_days), "validation_days": list(self.validation_days),
            "skipped_days": self.skipped_days, "test_files": [f.to_dict() for f in self.test_files],
            "test_data_commit": self.test_data_commit,
            "baseline": self.baseline.to_dict() if self.baseline else None, "history": self.history,
            "champion": self.champion.to_dict() if self.champion else None, "deltas": self.deltas,
            "primary_delta": list(self.primary_delta) if self.primary_delta else None,
            "slice_regressions": [r.to_dict() for r in self.slice_regressions],
            "rival": self.rival.to_dict() if self.rival else None,
        }
        if self.gate is not None:
            out["gate"] = self.gate.to_dict()
        return out

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, d: Doc) -> EvaluationReport:
        per_class = d.get("per_class")
        return cls(
            model=d.get("model", ""), partition=d.get("partition", ""), task=d.get("task", ""),
            test_rows=int(d.get("test_rows") or 0), metrics=dict(d.get("metrics") or {}),
            primary_metric=d.get("primary_metric", ""),
            primary_interval=tuple(d.get("primary_interval") or (float("nan"), float("nan"))),
            confidence_level=float(d.get("confidence_level", 0.95)),
            bootstrap_samples=int(d.get("bootstrap_samples", 0)), threshold=d.get("threshold"),
            positive_rate=d.get("positive_rate"), classes=d.get("classes"), class_rates=d.get("class_rates"),
            per_class=None if per_class is None else tuple(ClassScore.from_dict(c) for c in per_class),
            slices=tuple(SliceScore.from_dict(s) for s in d.get("slices") or []),
            checkpoint_sha256=d.get("checkpoint_sha256", ""), test_days=tuple(d.get("test_days") or ()),
            validation_days=tuple(d.get("validation_days") or ()), skipped_days=dict(d.get("skipped_days") or {}),
            test_files=tuple(TestFile.from_dict(f) for f in d.get("test_files") or []),
            test_data_commit=d.get("test_data_commit", ""), baseline=Baselines.from_dict(d.get("baseline")),
            history=list(d.get("history") or []), champion=Champion.from_dict(d.get("champion")),
            deltas=d.get("deltas"), primary_delta=_triple(d.get("primary_delta")),
            slice_regressions=tuple(SliceRegression.from_dict(r) for r in d.get("slice_regressions") or []),
            rival=Rival.from_dict(d.get("rival")), gate=Gate.from_dict(d.get("gate")))

    @classmethod
    def from_json(cls, data: bytes | str) -> EvaluationReport:
        return cls.from_dict(json.loads(data))
