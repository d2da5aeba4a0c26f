"""The calibration document: drift limits fitted on a source's own history (``ml-assets calibrate``).

It lives beside the spec (``<model>.calibration.json``, or ``calibration.json`` beside a component's
``defs.yaml``) and is read into ``validation.calibration`` when the spec loads, so it is part of the
snapshot's code version: a new calibration is a new way of judging days. Data only: the fitting is
``ml_assets.validation.calibrate``, the judging ``ml_assets.validation.gate``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Literal

from pydantic import Field, model_validator

from ml_assets.spec.base import StrictModel

FORMAT = 1
# The gate's statistics as this code computes them: limits fitted on other statistics mean nothing to
# it. Bump it whenever a test's statistic changes; older calibrations are then refused at load.
METHOD = 2
RELATION_LEVEL_DAYS = 91  # a relation's own level: a break in one column is not absorbed in a few weeks
Kind = Literal["deviation", "level", "dispersion", "relation", "coupling", "alignment", "run", "share"]


class Signal(StrictModel):
    """A daily series of one column (its mean, a category's share, its null share, ...) and what is
    ordinary for it: its weekly and yearly profile; the rest is compared with its recent level."""

    column: str = Field(description="the raw column (or 'label') the series describes")
    measure: str = Field(description="mean, spread, nulls, new, run, share=<value>, rate, rate=<class>, fit (the "
                         "label's log-loss under the model of what it meant on the history)")
    log: bool = Field(default=False, description="the daily mean is taken of log(value): a positive column whose "
                      "weekly and yearly swings scale with its level")
    weekly: list[float] | None = Field(default=None, description="7 offsets, Monday first")
    yearly: list[float] | None = Field(default=None, description="Fourier coefficients of the day of the year: "
                                       "cos 1, sin 1, cos 2, sin 2, ...")
    scale: float = Field(default=1.0, gt=0, description="robust sd of a day's deviation from its profile and level")
    yearly_scale: list[float] | None = Field(default=None, description=(
        "Fourier coefficients of the log of the scale by day of the year (a summer's days vary more than a "
        "winter's): the scale on a day is ``scale`` times their exp, within 1/3..3"))
    relation: dict[str, float] = Field(default={}, description=(
        "coefficients predicting this column's deviation from the other columns' on the same day"))
    relation_scale: float = Field(default=1.0, gt=0, description=(
        "robust sd of what the relation leaves, less its own level over the days before"))
    relation_yearly_scale: list[float] | None = Field(default=None, description="as ``yearly_scale``, of the relation's")
    common: list[float] = Field(default=[], description="values that hold 5% of days or more: a run of one is ordinary")
    vocabulary: list[str] = Field(default=[], description="the values seen during calibration (categoricals)")
    terms: dict[str, float] = Field(default={}, description="fit: the logistic model's coefficients by input")
    centers: dict[str, list[float]] = Field(default={}, description="fit: each numeric input's mean and sd")


class Test(StrictModel):
    """One judgement of one signal, and its calibrated limit."""

    signal: str = Field(description="the key of its signal in ``signals``")
    kind: Kind
    window: int = Field(ge=1, description="days pooled (the day and the window's days before it on main)")
    limit: float = Field(description="the statistic above which the day is blocked")
    tail: tuple[float, float] = Field(description=(
        "the statistic's natural variability on the history: its 90th percentile and the mean excess over "
        "it (an exponential tail, extrapolated to the limit)"))
    median: float = Field(description="the statistic's median on the history")
    blocked: list[dt.date] = Field(default=[], description="history days past the limit")

    @property
    def name(self) -> str:
        return f"{self.signal} {self.kind}" + (f" over {self.window} days" if self.window > 1 else "")


class Calibration(StrictModel):
    format: int = FORMAT
    method: int = Field(default=METHOD, description="the version of the gate's statistics the limits were fitted on")
    model: str
    start: dt.date
    end: dt.date
    days: int = Field(description="days of the range the source gave")
    missing: list[dt.date] = Field(default=[], description="days of the range the source did not give")
    target_rate: float = Field(gt=0, le=0.2)
    tail_p: float = Field(gt=0, lt=1, description="each test's tail probability at its limit")
    in_sample_rate: float = Field(description="share of the history's judged days blocked at these limits")
    judged_days: int
    level_days: int = Field(default=28, description="a signal's recent level: the median of this many days before "
                            "the window")
    schema_: dict[str, str] = Field(alias="schema", description="the raw columns and dtypes it was made for")
    signals: dict[str, Signal]
    tests: list[Test]
    version: str = Field(default="", description="sha256 of the document without this field")

    @model_validator(mode="after")
    def _versioned(self) -> Calibration:
        if self.format != FORMAT or self.method != METHOD:
            raise ValueError(f"calibration of {self.model}: made for format {self.format}, method {self.method}; this "
                             f"version judges with format {FORMAT}, method {METHOD}: calibrate again")
        if self.version and self.version != self.content_hash():
            raise ValueError(f"calibration of {self.model}: version {self.version[:12]} does not match its content "
                             f"({self.content_hash()[:12]}): the file was edited by hand; calibrate again")
        return self

    def content_hash(self) -> str:
        data = self.model_dump(mode="json", by_alias=True, exclude={"version"})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    @property
    def history_days(self) -> int:
        """Days before a day that its judgement reads from main."""
        def longest(*kinds: str) -> int:
            return max((t.window for t in self.tests if t.kind in kinds), default=0)

        runs = max((int(t.limit) + 1 for t in self.tests if t.kind == "run"), default=0)
        # A relation reads the day before its window's days; its error's level, RELATION_LEVEL_DAYS
        # before that; an alignment, two days before its window.
        return max(longest("deviation", "level", "dispersion", "share") + self.level_days,
                   longest("relation", "coupling") + RELATION_LEVEL_DAYS + 1, longest("alignment") + 2, runs, 1)

    def schema_changes(self, columns: dict[str, str]) -> list[str]:
        """How the spec's raw columns differ from the ones this calibration was made for."""
        added = [f"{c} (added)" for c in columns if c not in self.schema_]
        removed = [f"{c} (removed)" for c in self.schema_ if c not in columns]
        retyped = [f"{c} ({self.schema_[c]} -> {columns[c]})" for c in columns
                   if c in self.schema_ and self.schema_[c] != columns[c]]
        return added + removed + retyped
