"""The spec's ``monitoring:`` section: the limits the champion's live metrics and drift are held to
(ml_assets.scoring.monitor). Each limit has a warn level and a blocking level; the blocking level is
what retraining on evidence acts on."""

from __future__ import annotations

from pydantic import Field, model_validator

from ml_assets.spec.base import StrictModel


class MetricLimit(StrictModel):
    """For a metric where higher is better, ``*_below``; where lower is better, ``*_above``."""

    warn_below: float | None = None
    block_below: float | None = None
    warn_above: float | None = None
    block_above: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> MetricLimit:
        below, above = (self.warn_below, self.block_below), (self.warn_above, self.block_above)
        if all(v is None for v in (*below, *above)):
            raise ValueError("give a warn and/or block level (warn_below/block_below or warn_above/block_above)")
        if any(v is not None for v in below) and any(v is not None for v in above):
            raise ValueError("give *_below or *_above levels, not both")
        if None not in below and self.block_below > self.warn_below:
            raise ValueError(f"block_below {self.block_below} is above warn_below {self.warn_below}: the blocking "
                             "level must be the worse one")
        if None not in above and self.block_above < self.warn_above:
            raise ValueError(f"block_above {self.block_above} is below warn_above {self.warn_above}: the blocking "
                             "level must be the worse one")
        return self

    @property
    def higher_is_better(self) -> bool:
        return self.warn_below is not None or self.block_below is not None


class DriftLimit(StrictModel):
    """A population stability index (PSI) limit: drift counts when the PSI is above the level and the
    snapshot's test of the two samples (Kolmogorov-Smirnov for numbers, chi-square for categories)
    is below ``monitoring.significance`` (both sample sizes count)."""

    warn_above: float | None = Field(default=None, gt=0)
    block_above: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> DriftLimit:
        if self.warn_above is None and self.block_above is None:
            raise ValueError("give warn_above and/or block_above")
        if None not in (self.warn_above, self.block_above) and self.block_above < self.warn_above:
            raise ValueError(f"block_above {self.block_above} is below warn_above {self.warn_above}: the blocking "
                             "level must be the worse one")
        return self


class MonitoringSpec(StrictModel):
    metrics: dict[str, MetricLimit] = Field(default={}, description=(
        "limits on the champion's live metrics of a day, by metric name (of the task's metrics)"))
    prediction_drift: DriftLimit | None = Field(default=None, description=(
        "PSI of the day's predictions against the champion's on its own training window"))
    feature_drift: DriftLimit | None = Field(default=None, description=(
        "PSI of the day's most drifted feature against the champion's training window"))
    min_labeled_rows: int = Field(default=100, ge=1, description=(
        "fewer labelled rows on a day: its live metrics are pending, not judged"))
    min_rows: int = Field(default=100, ge=1, description="fewer scored rows: drift is not judged")
    significance: float = Field(default=0.001, gt=0, lt=0.5, description=(
        "the drift tests' significance, shared (Bonferroni) by the features of a day"))
    bootstrap_samples: int = Field(default=500, ge=100, le=10000, description="resamples of the live metrics' intervals")
