"""Fitting a calibration on a source's history (``ml-assets calibrate MODEL --start --end``).

The history's days are read from the source, in memory, as raw_data reads them; nothing is written
but the calibration file. For each judged column and measure (``signals``) the daily series gets its
weekly and yearly profile and its robust scale; each test's statistic is computed on every day of
the history as the gate computes it, its tail is fitted (exponential beyond its 90th percentile,
geometric for runs), and one tail probability is chosen for all tests: the largest that keeps the
history's blocked days at or under half the target rate (the other half is the margin for days the
calibration never saw). Each test's limit is where its tail reaches that probability, so a column
that varies more gets a wider limit.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable

import numpy as np
import polars as pl

from ml_assets.spec import ModelSpec
from ml_assets.spec.calibration import Calibration, Signal, Test
from ml_assets.validation.gate import RELATION_LEVEL_DAYS, Gate
from ml_assets.validation.judged import NUMERIC, judged_columns
from ml_assets.validation.label_drift import DAY, binary_labels
from ml_assets.validation.label_fit import fit_label_model
from ml_assets.validation.profiles import (
    fit_profile,
    fit_relations,
    fit_yearly_scale,
    robust_scale,
    seasonal,
)
from ml_assets.validation.signals import SPREAD_MIN_ROWS, Daily, daily, profile, signal_key

LEVEL_DAYS = 28
WINDOWS = {"deviation": (1, 3), "level": (7, 28), "dispersion": (7, 28), "relation": (1, 3, 7), "coupling": (7, 28),
           "alignment": (7, 28),
           "share": (1, 3), "run": (1,)}
MAX_SHARES = 8  # categories of at least 5% of rows each get a share signal
MAX_MISSING_SHARE, MAX_GAP_DAYS = 0.02, 3
IN_SAMPLE_SHARE = 0.5  # of the target rate, on the history itself
MIN_JUDGED_DAYS = 200


class CalibrationError(ValueError):
    """Calibration cannot be made from this history; nothing was written."""


def min_days(target_rate: float) -> int:
    """Days a calibration needs: the level's and the longest window's, then enough judged days to
    see the target rate a few times."""
    return LEVEL_DAYS + max(WINDOWS["level"]) + max(MIN_JUDGED_DAYS, math.ceil(3 / target_rate))


def check_range(spec: ModelSpec, start: dt.date, end: dt.date, given: set[dt.date], target_rate: float) -> list[dt.date]:
    """The range's missing days, or a CalibrationError saying what the range has and what it needs."""
    if not 0 < target_rate <= 0.2:
        raise CalibrationError(f"--target-rate {target_rate} is outside (0, 0.2]: it is the share of ordinary days "
                               "the checks may block")
    span = (end - start).days + 1
    need = min_days(target_rate)
    missing = [start + dt.timedelta(days=i) for i in range(span) if start + dt.timedelta(days=i) not in given]
    if span - len(missing) < need:
        raise CalibrationError(f"{spec.name}: {start}..{end} gives {span - len(missing)} day(s) of rows; calibration "
                               f"at a target rate of {target_rate:g} needs at least {need} (the {LEVEL_DAYS}-day level, "
                               f"the {max(WINDOWS['level'])}-day window, then days to judge). Nothing was written.")
    longest, run = 0, 0
    for i in range(span):
        run = run + 1 if start + dt.timedelta(days=i) not in given else 0
        longest = max(longest, run)
    if len(missing) > MAX_MISSING_SHARE * span or longest > MAX_GAP_DAYS:
        shown = ", ".join(str(d) for d in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise CalibrationError(f"{spec.name}: {start}..{end} has gaps: {span - len(missing)} of its {span} days have "
                               f"rows ({len(missing)} missing: {shown}; the longest gap {longest} days). Calibration "
                               f"needs at least {math.ceil((1 - MAX_MISSING_SHARE) * span)} of them and no gap longer "
                               f"than {MAX_GAP_DAYS} days: choose a range the source covers. Nothing was written.")
    return missing


def plan(spec: ModelSpec, rows: pl.DataFrame) -> dict[str, Signal]:
    """The signals of the judged columns and the label, before fitting."""
    signals: dict[str, Signal] = {}
    per_day = rows.group_by(DAY).len()["len"]
    many = float(per_day.median() or 0) >= SPREAD_MIN_ROWS
    for column, dtype in judged_columns(spec).items():
        if column not in rows.columns:
            continue
        signals[signal_key(column, "nulls")] = Signal(column=column, measure="nulls")
        if dtype in NUMERIC:
            values = rows[column].cast(pl.Float64).drop_nulls()
            values = values.filter(values.is_finite())
            if values.n_unique() < 2:
                continue  # constant on the whole history: only its nulls are judged
            low, high = values.quantile(0.01) or 0.0, values.quantile(0.99) or 0.0
            log = bool(values.min() > 0 and low > 0 and high / low >= 4)
            signals[signal_key(column, "mean")] = Signal(column=column, measure="mean", log=log)
            signals[signal_key(column, "run")] = Signal(column=column, measure="run")
            if many:
                signals[signal_key(column, "spread")] = Signal(column=column, measure="spread")
        else:
            counts = rows[column].cast(pl.String).drop_nulls().value_counts(sort=True, name="n")
            vocabulary = sorted(counts[column].to_list())
            signals[signal_key(column, "new")] = Signal(column=column, measure="new", vocabulary=vocabulary)
            share = counts["n"] / max(rows.height, 1)
            for value in counts.filter(share >= 0.05)[column].head(MAX_SHARES).to_list():
                signals[signal_key(column, f"share={value}")] = Signal(column=column, measure=f"share={value}")
    for name in binary_labels(spec):
        measure = "rate" if name == "label" else f"rate={name.removeprefix('class ')}"
        signals[signal_key("label", measure)] = Signal(column="label", measure=measure)
    if (model := fit_label_model(spec, rows)) is not None:
        signals[signal_key("label", "fit")] = Signal(column="label", measure="fit", terms=model[0], centers=model[1])
    return signals


def _tests(signals: dict[str, Signal]) -> list[Test]:
    """Every test of the signals, with no limit yet."""
    out = []
    for key, sig in signals.items():
        if sig.measure in ("nulls", "new"):
            kinds: tuple[str, ...] = ("share",)
        elif sig.measure == "run":
            kinds = ("run",)
        else:
            # The mean square of a share's or a rate's days (0 or 1 on a one-row day) is its season's, not
            # a change of its spread: dispersion is judged on the numeric columns' own measures.
            spread = ("dispersion",) if sig.measure in ("mean", "spread") and sig.column != "label" else ()
            kinds = ("deviation", "level", *spread) + (("relation", "coupling", "alignment") if sig.relation else ())
        for kind in kinds:
            for w in WINDOWS[kind]:
                out.append(Test(signal=key, kind=kind, window=w, limit=math.inf, tail=(0.0, 0.0), median=0.0))
    return out


def _draft(spec: ModelSpec, start: dt.date, end: dt.date, days: int, missing: list[dt.date], target: float,
           signals: dict[str, Signal], tests: list[Test], columns: dict[str, str]) -> Calibration:
    return Calibration(model=spec.name, start=start, end=end, days=days, missing=missing, target_rate=target,
                       tail_p=0.5, in_sample_rate=0.0, judged_days=0, level_days=LEVEL_DAYS, schema=columns,
                       signals=signals, tests=tests)


def _statistics(cal: Calibration, data: Daily) -> np.ndarray:
    published = data.rows > 0
    gate = Gate(cal)
    stats = np.full((len(data.days), len(cal.tests)), np.nan)
    for t, row in gate.run(data, published, 0, decide=lambda d, s: bool(published[d])):
        stats[t] = row
    return stats


def calibrate(spec: ModelSpec, rows: pl.DataFrame, start: dt.date, end: dt.date, missing: list[dt.date],
              target_rate: float = 0.01, say: Callable[[str], None] = lambda _: None) -> Calibration:
    """Fit the calibration of ``spec`` on ``rows`` (the history's rows, their day in ``__day``)."""
    days = [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]
    columns = {c: col.dtype for c, col in spec.data_schema.columns.items()}
    signals = plan(spec, rows)
    data = daily(spec, signals, rows, days)
    say(f"{len(days)} days, {len(signals)} signals of {len(judged_columns(spec))} columns and the label")
    for key, sig in signals.items():
        if sig.measure not in ("nulls", "new", "run"):
            weekly, yearly = fit_profile(data.column(key), days)
            signals[key] = sig.model_copy(update={"weekly": weekly, "yearly": yearly})
    # First pass: each signal's deviation from its profile and level, for its scale and relations.
    first = _draft(spec, start, end, len(days) - len(missing), missing, target_rate, signals,
                   [Test(signal=k, kind="deviation", window=1, limit=math.inf, tail=(0.0, 0.0), median=0.0)
                    for k in signals], columns)
    signed = Gate(first).deviations(data, data.rows > 0)
    when = np.array(days, dtype="datetime64[D]")
    for i, key in enumerate(signals):
        sig = signals[key]
        if sig.measure not in ("nulls", "new", "run"):
            yearly = fit_yearly_scale(signed[:, i], days) if sig.measure == "mean" else None
            signals[key] = sig.model_copy(update={"scale": robust_scale(signed[:, i] / seasonal(yearly, when)),
                                                  "yearly_scale": yearly})
    for key, coef in fit_relations(signals, signed).items():
        signals[key] = signals[key].model_copy(update={"relation": coef})
    for key, (scale, yearly) in _relation_scales(_draft(spec, start, end, 0, missing, target_rate, signals, [], columns),
                                                 data).items():
        signals[key] = signals[key].model_copy(update={"relation_scale": scale, "relation_yearly_scale": yearly})
    for key, sig in signals.items():
        if sig.measure == "run":
            signals[key] = sig.model_copy(update={"common": _common(data.column(key))})
    draft = _draft(spec, start, end, len(days) - len(missing), missing, target_rate, signals, _tests(signals), columns)
    stats = _statistics(draft, data)
    say(f"{len(draft.tests)} tests computed on every day")
    return _fit_limits(draft, stats, days, data.rows > 0)


def _relation_scales(draft: Calibration, data: Daily) -> dict[str, tuple[float, list[float] | None]]:
    """Each relation's robust sd of what it leaves, less that error's own level (as the gate takes it)."""
    gate = Gate(draft)
    errors = gate.errors(data.values - profile(draft.signals, gate.keys, data.days))
    published = data.rows > 0
    level = np.full_like(errors, np.nan)
    for t in range(len(errors)):
        level[t] = gate.levels(errors, published, t, [1], RELATION_LEVEL_DAYS)[1]
    related = [k for k in gate.keys if draft.signals[k].relation]
    when = np.array(data.days, dtype="datetime64[D]")
    out = {}
    for i, k in enumerate(related):
        left = errors[:, i] - level[:, i]
        yearly = fit_yearly_scale(left, data.days) if draft.signals[k].yearly is not None else None
        out[k] = (robust_scale(left / seasonal(yearly, when)), yearly)
    return out


def _common(values: np.ndarray) -> list[float]:
    """Values held on 5% of days or more (as a whole day's value): a run of one is ordinary."""
    v = values[~np.isnan(values)]
    if not len(v):
        return []
    uniq, counts = np.unique(v, return_counts=True)
    return [float(x) for x in uniq[counts >= 0.05 * len(values)]]


def _tail(kind: str, values: np.ndarray) -> tuple[float, float, float]:
    """The statistic's median, and its tail: (u, beta) with P(X > u + x) = p_u * exp(-x / beta)."""
    v = values[np.isfinite(values)]
    if not len(v):
        return 0.0, 0.0, 0.0
    median = float(np.median(v))
    if kind == "run":
        started = v[v >= 1]
        q = (np.sum(started >= 2) + 1) / (len(started) + 2)
        return median, 1.0, float(-1 / math.log(q))
    u = float(np.quantile(v, 0.9))
    excess = v[v > u] - u
    return median, u, float(excess.mean()) if len(excess) >= 5 else 0.0


def _limit(kind: str, u: float, beta: float, top: float, p: float) -> float:
    if kind == "run":
        return u + beta * math.log(1 / p)
    if beta <= 0:
        return top + max(1e-9, 1e-6 * abs(top))
    return u + beta * math.log(0.1 / p) if p < 0.1 else u


def _fit_limits(draft: Calibration, stats: np.ndarray, days: list[dt.date], given: np.ndarray) -> Calibration:
    """Limits at one tail probability for all tests, the largest keeping the history's blocked days
    at or under ``IN_SAMPLE_SHARE`` of the target. A day is judged when it has rows and its signals a
    level to be compared with."""
    level = [i for i, t in enumerate(draft.tests) if t.kind in ("deviation", "level")]
    judged = given & (np.any(np.isfinite(stats[:, level]), axis=1) if level else np.any(np.isfinite(stats), axis=1))
    if judged.sum() < MIN_JUDGED_DAYS:
        raise CalibrationError(f"{draft.model}: only {int(judged.sum())} day(s) of {draft.start}..{draft.end} could be "
                               f"judged (a signal needs {LEVEL_DAYS // 2} days of its level before it); calibration "
                               f"needs at least {MIN_JUDGED_DAYS}. Nothing was written.")
    tails = [_tail(t.kind, stats[judged, i]) for i, t in enumerate(draft.tests)]
    tops = [float(np.nanmax(stats[judged, i])) if np.any(np.isfinite(stats[judged, i])) else 0.0
            for i in range(len(draft.tests))]
    goal = draft.target_rate * IN_SAMPLE_SHARE
    chosen, rate = 1e-9, 0.0
    for p in np.logspace(math.log10(min(draft.target_rate, 0.05)), -9, 81):
        limits = np.array([_limit(t.kind, u, b, top, p) for t, (_, u, b), top in zip(draft.tests, tails, tops, strict=True)])
        with np.errstate(invalid="ignore"):
            blocked = np.any(stats[judged] > limits, axis=1)
        if blocked.mean() <= goal:
            chosen, rate = float(p), float(blocked.mean())
            break
    tests = []
    judged_days = np.array(days, dtype="datetime64[D]")[judged]
    for i, (test, (median, u, beta), top) in enumerate(zip(draft.tests, tails, tops, strict=True)):
        limit = _limit(test.kind, u, beta, top, chosen)
        with np.errstate(invalid="ignore"):
            over = judged_days[stats[judged, i] > limit]
        tests.append(test.model_copy(update={"limit": round(limit, 6), "tail": (round(u, 6), round(beta, 6)),
                                             "median": round(median, 6),
                                             "blocked": [d.astype(dt.date) for d in over]}))
    cal = draft.model_copy(update={"tests": tests, "tail_p": chosen, "in_sample_rate": round(rate, 6),
                                   "judged_days": int(judged.sum())})
    data = cal.model_dump(mode="json", by_alias=True)
    return Calibration.model_validate({**data, "version": Calibration.model_validate(data).content_hash()})
