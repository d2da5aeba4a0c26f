"""The spec's ``validation`` section: what a day's rows must satisfy before they are merged into main."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ml_assets.spec.base import CUSTOM_CHECK, StrictModel
from ml_assets.spec.calibration import Calibration


class HolidaySpec(StrictModel):
    country: str = Field(description="ISO 3166-1 alpha-2 code of the public-holiday calendar, e.g. US")
    subdivision: str | None = Field(default=None, description="state or province code within the country")
    window_days: int = Field(default=1, ge=0, le=7, description="days either side of a holiday that count as near it")
    tolerance: float = Field(default=0.5, gt=0, lt=1, description="allowed relative deviation on days near a holiday")

    @model_validator(mode="after")
    def _known_calendar(self) -> HolidaySpec:
        from ml_assets.calendar import CalendarError, supported

        try:
            supported(self.country, self.subdivision)
        except CalendarError as exc:
            raise ValueError(str(exc)) from None
        return self


class VolumeSpec(StrictModel):
    tolerance: float = Field(default=0.2, gt=0, lt=1, description="allowed relative deviation from the expected rows")
    weeks: int = Field(default=4, ge=1, le=52, description="same weekday over this many past weeks makes the expectation")
    min_history: int = Field(default=2, ge=1, description="fewer past days than this: the check passes, saying so")
    holidays: HolidaySpec | None = Field(default=None, description=(
        "public holidays: days near one get the holiday tolerance, and leave the expectation of other days"))
    # 0.001 rather than 0.01: the check runs every day, so its false alarms add up over a year.
    significance: float = Field(default=0.001, gt=0, lt=0.5, description=(
        "a change beyond the tolerance fails only when a Poisson count with the expected mean lands this far off "
        "with at most this probability (two-sided): a day of 2 rows where 1 is expected is not judged a change"))
    min_rows: int = Field(default=1, ge=0, description=(
        "a day with fewer rows fails whatever the history (0: an empty day is judged like any other, for sparse sources)"))


class FreshnessSpec(StrictModel):
    max_outside_fraction: float = Field(default=0.01, ge=0, le=1,
                                        description="share of rows dated outside the partition's day that is tolerated")


class ColumnDrift(StrictModel):
    psi: float | None = Field(default=None, gt=0)
    ks: float | None = Field(default=None, gt=0, le=1)
    wasserstein: float | None = Field(default=None, gt=0, description="a limit here makes Wasserstein block on this column")
    judged: bool = Field(default=True, description=(
        "false: the column's drift is expected (e.g. temperature over the seasons) and never judged; the "
        "check says so"))


class SeasonalDrift(StrictModel):
    """Columns that follow the calendar (temperature, daylight, holiday traffic), judged against the
    same weeks one period earlier instead of the weeks just before: a season is not a break."""

    columns: list[str] = Field(min_length=1, description=(
        "drift columns (declared features) judged against the same weeks a period earlier"))
    period_days: int = Field(default=364, ge=7, le=731, description=(
        "how far back the seasonal reference lies: 364 (52 weeks: the same weekdays a year earlier), 7 for a "
        "weekly pattern"))
    margin_days: int = Field(default=14, ge=0, le=90, description=(
        "the seasonal reference is the current window widened by this many days on each side, a period earlier"))
    periods: int = Field(default=3, ge=1, le=10, description=(
        "the same weeks of up to this many earlier periods, as many as the store holds: one year's weather "
        "differs from the next, several years' span what is ordinary for the season"))


class DriftSpec(StrictModel):
    reference_days: int = Field(default=14, ge=1, le=366, description="validated days on main before the current window")
    min_reference_days: int = Field(default=7, ge=1, description="fewer: drift is not judged, and the check says so")
    current_days: int = Field(default=1, ge=1, le=366, description=(
        "the current window: the partition's day and the days on main just before it, pooled (a sparse source "
        "compares its last weeks with the months before them)"))
    # 0.001 rather than 0.01: overlapping windows are tested every day, and at 0.01 about one simulated year
    # in four of one row a day with no drift at all failed somewhere (docs/data-validation.md).
    significance: float = Field(default=0.001, gt=0, lt=0.5, description=(
        "a limit counts as exceeded only when the two-sample test (KS, chi-square, binomial) also rejects at this "
        "level, shared by the day's tests (Bonferroni): noise in a few rows cannot fail the check"))
    min_rows: int = Field(default=30, ge=1, description=(
        "a column (or the label) with fewer non-null rows in the current window or the reference is not judged"))
    min_expected_count: float = Field(default=5, gt=0, description=(
        "categories are pooled until each expects this many rows of the current window under the reference's mix"))
    psi: float = Field(default=0.25, gt=0, description="population stability index limit for categoricals")
    ks: float = Field(default=0.2, gt=0, le=1, description="two-sample Kolmogorov-Smirnov statistic limit")
    wasserstein: float | None = Field(default=None, gt=0, description=(
        "Wasserstein distance limit, in reference standard deviations; unset: reported as an effect size only"))
    label_rate_z: float = Field(default=8.0, gt=0, description=(
        "limit on the day's label rate, as a robust z-score of its log-odds against the reference days' "
        "(median, 1.4826 x MAD, at least 0.3); binary classification, and each class of a multiclass label"))
    label_auc_min: float = Field(default=0.5, ge=0, le=1, description=(
        "the reference days' label rates by feature value must rank the day's labels at least this well "
        "(ROC-AUC); binary classification, and each class of a multiclass label"))
    columns: dict[str, ColumnDrift] = Field(default={}, description="per-column limits overriding the defaults")
    seasonal: SeasonalDrift | None = Field(default=None, description=(
        "columns judged against the same weeks a period (a year) earlier; not judged until the store holds them"))

    def seasonal_reference(self, day: dt.date) -> list[tuple[dt.date, dt.date]]:
        """The first and last day of each span of ``day``'s seasonal reference, the latest first (none
        when the spec declares no seasonal columns)."""
        if self.seasonal is None:
            return []
        start = day - dt.timedelta(days=self.current_days - 1)
        margin = dt.timedelta(days=self.seasonal.margin_days)
        spans = []
        for n in range(1, self.seasonal.periods + 1):
            back = dt.timedelta(days=n * self.seasonal.period_days)
            spans.append((start - back - margin, day - back + margin))
        return spans

    def seasonal_lookback_days(self) -> int:
        """How many days before a day its seasonal reference reaches."""
        if self.seasonal is None:
            return 0
        return self.current_days + self.seasonal.periods * self.seasonal.period_days + self.seasonal.margin_days

    @model_validator(mode="after")
    def _windows_fit(self) -> DriftSpec:
        if self.current_days > self.reference_days:
            raise ValueError(f"current_days ({self.current_days}) is larger than reference_days ({self.reference_days}): "
                             "the reference must span at least the window it is compared with")
        if self.seasonal is not None and self.seasonal.period_days < self.current_days + 2 * self.seasonal.margin_days:
            raise ValueError(f"seasonal.period_days ({self.seasonal.period_days}) is shorter than the current window "
                             f"and its margins ({self.current_days} + 2 x {self.seasonal.margin_days}): the seasonal "
                             "reference would overlap the window it is compared with")
        if self.min_reference_days > self.reference_days:
            raise ValueError(f"min_reference_days ({self.min_reference_days}) is larger than reference_days "
                             f"({self.reference_days}): drift could never be judged")
        return self


class QuarantineSpec(StrictModel):
    max_fraction: float = Field(gt=0, lt=1, description="the partition passes while quarantined rows stay at or under this share")


class CheckSettings(StrictModel):
    severity: Literal["block", "warn"] = Field(default="block", description=(
        "block: a failure stops the merge into main; warn: a failure is reported (severity WARN) and never stops it"))
    enabled: bool = Field(default=True, description="false: the check does not run and is not declared on the asset")


class Waiver(StrictModel):
    day: dt.date = Field(description="the partition")
    checks: list[str] = Field(min_length=1, description="the checks whose failure on that day is accepted")
    reason: str = Field(min_length=10, description="why: it is recorded on the check result and the merge into main")


class ValidationSpec(StrictModel):
    volume: VolumeSpec = VolumeSpec()
    freshness: FreshnessSpec = FreshnessSpec()
    drift: DriftSpec = DriftSpec()
    quarantine: QuarantineSpec | None = Field(
        default=None, description="write rows failing row-level checks aside instead of failing the day")
    custom_checks: list[str] = Field(
        default=[], description="'module:function' taking the day's rows, returning a boolean per row (True: ok) or one bool")
    waivers: list[Waiver] = Field(default=[], description=(
        "accepted failures of named checks on named days (a real anomaly, inspected by a person); every other "
        "check still blocks"))
    checks: dict[str, CheckSettings] = Field(default={}, description=(
        "per check name: severity (block, the default, or warn) and enabled (true by default)"))
    calibration: Calibration | None = Field(default=None, description=(
        "drift limits fitted on the source's history by `ml-assets calibrate`: read from the file beside the "
        "spec (<model>.calibration.json, or calibration.json beside a component's defs.yaml); with one, the "
        "drift check judges each column against its calibrated limits"))

    @model_validator(mode="after")
    def _waived_checks_exist(self) -> ValidationSpec:
        from ml_assets.validation.names import CHECKS, custom_check_name

        known = [*CHECKS, *(custom_check_name(t) for t in self.custom_checks)]
        if unknown := [c for c in self.checks if c not in known]:
            raise ValueError(f"checks: unknown check(s) {unknown}; the checks are {known}")
        seen = set()
        for i, waiver in enumerate(self.waivers):
            unknown = [c for c in waiver.checks if c not in known]
            if unknown:
                raise ValueError(f"waivers[{i}] ({waiver.day}): unknown check(s) {unknown}; the checks are {known}")
            if waiver.day in seen:
                raise ValueError(f"waivers[{i}]: {waiver.day} is waived twice; list its checks in one waiver")
            seen.add(waiver.day)
        return self

    @field_validator("custom_checks")
    @classmethod
    def _importable_names(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not CUSTOM_CHECK.match(v)]
        if bad:
            raise ValueError(f"{bad} are not 'package.module:function'")
        return value
