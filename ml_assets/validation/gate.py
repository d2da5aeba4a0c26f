"""The calibrated drift gate: each day's signals against what is ordinary for them, with the limits
``ml-assets calibrate`` fitted on the source's own history (docs/data-validation.md, "Calibrated
limits").

A signal's day is compared with its expectation: its weekly and yearly profile (fitted once, at
calibration) plus its recent level (the median, after the profile, of the ``level_days`` days on main
before the window). What remains is what a trend or a season cannot explain. Each test reduces that
to one statistic:

- ``deviation``: the window's summed deviation in the signal's robust sd, ``|sum| / sqrt(n)``;
- ``relation``: the mean squared part of a column's deviation that the other columns' same-day
  deviations do not predict (a column shifted by a day, or swapped, no longer moves with the rest);
- ``alignment``: how much better the column's days fit the others' if it were a day late or a day
  early (a column shifted by a day fits the neighbouring day's better than its own);
- ``run``: days in a row a column held the very same value (a stuck sensor);
- ``share``: the window's share of null rows, or of values never seen before.

Only days on main count as history (a blocked day never reaches main), so a break stays blocked
until a person acts: it is never absorbed into the level it is compared with.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ml_assets.spec.calibration import RELATION_LEVEL_DAYS, Calibration, Test
from ml_assets.validation.profiles import LAG, lagged, seasonal
from ml_assets.validation.signals import Daily, profile


@dataclass(frozen=True)
class Finding:
    test: Test
    statistic: float

    def describe(self, cal: Calibration, day: dt.date) -> str:
        sig = cal.signals[self.test.signal]
        what = f"{sig.column}: {sig.measure}" + (f" over {self.test.window} days" if self.test.window > 1 else "")
        ref = reference(cal, self.test, day)
        if self.test.kind == "deviation" or (self.test.kind == "level" and sig.measure.startswith(("share", "rate"))):
            return f"{what} {self.statistic:.1f} sd from {ref} (limit {self.test.limit:.2f})"
        if self.test.kind == "level":
            return f"{what}: its median day {self.statistic:.1f} sd from {ref} (limit {self.test.limit:.2f})"
        if self.test.kind == "dispersion":
            return f"{what}: mean squared deviation {self.statistic:.1f} sd² from {ref} (limit {self.test.limit:.2f})"
        if self.test.kind == "relation":
            return f"{what} {self.statistic:.1f} sd from what the other columns predict ({ref}, limit {self.test.limit:.2f})"
        if self.test.kind == "alignment":
            return (f"{what}: fits the other columns' day before or after better than its own day, by a mean "
                    f"{self.statistic:.1f} sd² ({ref}, limit {self.test.limit:.2f}): shifted by a day?")
        if self.test.kind == "coupling":
            return (f"{what}: moves apart from the other columns, mean squared {self.statistic:.1f} sd² from what they "
                    f"predict ({ref}, limit {self.test.limit:.2f})")
        if self.test.kind == "run":
            return f"{what}: the same value {self.statistic:.0f} days in a row (limit {self.test.limit:.1f}, {ref})"
        return f"{what} {self.statistic:.3f} (limit {self.test.limit:.3f}, {ref})"


def reference(cal: Calibration, test: Test, day: dt.date) -> str:
    """What a test compared the day with, in words."""
    sig = cal.signals[test.signal]
    fitted = f"calibrated on {cal.start}..{cal.end}"
    if test.kind in ("relation", "coupling", "alignment"):
        others = ", ".join(sorted({cal.signals[k.removesuffix(LAG)].column for k in sig.relation}))
        return (f"{others} on the same day and the day before, as related on {cal.start}..{cal.end}, against the last "
                f"{RELATION_LEVEL_DAYS} days")
    if test.kind in ("deviation", "level", "dispersion"):
        last = day - dt.timedelta(days=test.window)
        first = last - dt.timedelta(days=cal.level_days - 1)
        seasons = [n for n, v in (("weekly", sig.weekly), ("yearly", sig.yearly)) if v is not None]
        after = f" after its {' and '.join(seasons)} profile {fitted}" if seasons else f" ({fitted})"
        return f"its recent level (the median of the days on main {first}..{last}){after}"
    if test.kind == "run":
        return f"runs of the same value on the history {fitted}"
    return f"the history {fitted}"




class Gate:
    """The statistics of a calibration's tests, day by day over ``Daily`` signals."""

    def __init__(self, cal: Calibration) -> None:
        self.cal = cal
        self.keys = list(cal.signals)
        self.index = {k: i for i, k in enumerate(self.keys)}
        sig = [cal.signals[k] for k in self.keys]
        self.scale = np.array([s.scale for s in sig])
        # A share's level is its mean: the median of days that are 0 or 1 is 0 or 1, not the share.
        self.mean_level = np.array([s.measure.startswith(("share", "rate")) for s in sig])
        self.limits = np.array([t.limit for t in cal.tests])
        own = ("deviation", "level", "dispersion")
        self.windows = sorted({t.window for t in cal.tests if t.kind in own} | {1})
        self.rel_windows = sorted({t.window for t in cal.tests if t.kind in ("relation", "coupling")})
        self.common = {self.index[k]: set(s.common) for k, s in cal.signals.items() if s.measure == "run"}
        related = [k for k in self.keys if cal.signals[k].relation]
        self.rel_pos = {self.index[k]: i for i, k in enumerate(related)}
        self.rel_coef = np.zeros((len(related), 2 * len(self.keys)))  # the same day's inputs, then the day before's
        for i, k in enumerate(related):
            for other, coef in cal.signals[k].relation.items():
                lag = other.endswith(LAG)
                self.rel_coef[i, self.index[other.removesuffix(LAG)] + lag * len(self.keys)] = coef
        self.rel_index = np.array([self.index[k] for k in related], dtype=int)
        self.rel_scale = np.array([cal.signals[k].relation_scale for k in related])
        self.by_kind: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        for kind in ("deviation", "level", "dispersion", "relation", "coupling", "alignment", "run", "share"):
            for w in {t.window for t in cal.tests if t.kind == kind}:
                rows = [i for i, t in enumerate(cal.tests) if t.kind == kind and t.window == w]
                sigs = np.array([self.index[cal.tests[i].signal] for i in rows])
                if kind in ("relation", "coupling", "alignment"):
                    sigs = np.array([self.rel_pos[s] for s in sigs])
                self.by_kind[(kind, w)] = (np.array(rows), sigs)

    def errors(self, resid: np.ndarray) -> np.ndarray:
        """What each related column's residual departs from what the others' predict (days x relations)."""
        if not len(self.rel_index):
            return np.zeros((len(resid), 0))
        inputs = np.hstack([resid, lagged(resid)])
        missing = np.isnan(inputs).astype(float) @ (self.rel_coef != 0).T  # any input missing: not judged
        values = resid[:, self.rel_index] - np.nan_to_num(inputs) @ self.rel_coef.T
        return np.where(missing > 0, np.nan, values)

    def misaligned(self, resid: np.ndarray) -> np.ndarray:
        """Per day and relation, the relation's error were the column a day late (its value is the day
        before's) and were it a day early, unscaled: (2, days, relations), NaN where an input is
        missing. The error as the column is, is ``errors``."""
        n, rel = len(self.keys), self.rel_index
        if not len(rel):
            return np.zeros((2, len(resid), 0))
        same, lag = self.rel_coef[:, :n], self.rel_coef[:, n:].copy()
        own = lag[np.arange(len(rel)), rel].copy()
        lag[np.arange(len(rel)), rel] = 0.0
        before, two = lagged(resid), lagged(lagged(resid))
        used = (same != 0) | (lag != 0)

        def predict(today: np.ndarray, yesterday: np.ndarray, own_before: np.ndarray) -> np.ndarray:
            missing = (np.isnan(today) | np.isnan(yesterday)).astype(float) @ used.T
            value = np.nan_to_num(today) @ same.T + np.nan_to_num(yesterday) @ lag.T + own_before * own
            return np.where(missing > 0, np.nan, value)

        late = resid[:, rel] - predict(before, two, before[:, rel])  # the column's day t is truly t-1
        early = before[:, rel] - predict(resid, before, two[:, rel])  # its day t-1 is truly t
        return np.stack([late, early])

    def run(self, data: Daily, published: np.ndarray, judge_from: int = 0,
            decide: Callable[[int, np.ndarray], bool] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Each day's statistics (one per test; NaN where not judged), from ``judge_from`` on.

        ``published[d]``: whether day ``d`` is on main. Days before ``judge_from`` are history as given;
        from there, ``decide(d, stats)`` says whether day ``d`` is published (default: it passes every
        limit), as the snapshot would decide it."""
        decide = decide or (lambda d, stats: not bool(np.any(stats > self.limits)))
        published = published.copy()
        resid = data.values - profile(self.cal.signals, self.keys, data.days)
        errors = self.errors(resid)
        scales = self.scales(data.days)
        shifted = self.misaligned(resid)
        state = _State(len(self.keys))
        unseen = _by_day(data)
        for t in range(len(data.days)):
            stats = self._day(t, data, resid, (errors, shifted), scales, published, state, unseen.get(t, []))
            if t >= judge_from:
                published[t] = decide(t, stats)
                if not published[t]:
                    self._withdraw(t, resid, errors, shifted)
                yield t, stats
            state.publish(t, published[t], data.values[t], self.common)
            if published[t]:
                for key, value, _ in unseen.get(t, []):
                    state.seen[(key, value)] = t

    def _withdraw(self, t: int, resid: np.ndarray, errors: np.ndarray, shifted: np.ndarray) -> None:
        """Day ``t`` is not on main: the two days after it read no "day before" from it, as the
        snapshot, which reads its history from main, would see them."""
        resid[t] = np.nan
        lo, hi = max(0, t - 1), min(len(resid), t + 3)
        errors[t + 1:hi] = self.errors(resid[lo:hi])[t + 1 - lo:]
        shifted[:, t + 1:hi] = self.misaligned(resid[lo:hi])[:, t + 1 - lo:]

    def scales(self, days: list[dt.date]) -> tuple[np.ndarray, np.ndarray]:
        """Each day's scale of every signal, and of every relation, with its season's factor."""
        when = np.array(days, dtype="datetime64[D]")
        sig = [self.cal.signals[k] for k in self.keys]
        own = np.column_stack([self.scale[i] * seasonal(s.yearly_scale, when) for i, s in enumerate(sig)] or
                              [np.zeros(len(days))])
        rel = [self.rel_scale[i] * seasonal(sig[s].relation_yearly_scale, when) for i, s in enumerate(self.rel_index)]
        return own, (np.column_stack(rel) if rel else np.zeros((len(days), 0)))

    def deviations(self, data: Daily, published: np.ndarray) -> np.ndarray:
        """Each day's signed deviation of every signal from its profile and recent level (unscaled)."""
        resid = data.values - profile(self.cal.signals, self.keys, data.days)
        return np.array([resid[t] - self.levels(resid, published, t, [1], self.cal.level_days, self.mean_level)[1]
                         for t in range(len(data.days))]).reshape(resid.shape)

    @staticmethod
    def levels(values: np.ndarray, published: np.ndarray, t: int, windows: list[int], days: int,
                mean: np.ndarray | None = None) -> dict[int, np.ndarray]:
        """Per window: each column's level over the ``days`` published days before the window (NaN with
        fewer than half of them)."""
        levels = {}
        for w in windows:
            lo, hi = max(0, t - w - days + 1), max(0, t - w + 1)
            past = values[lo:hi][published[lo:hi]]
            if not len(past):
                levels[w] = np.full(values.shape[1], np.nan)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a column with no value: NaN, not judged
                level = _nanmedian(past) if mean is None else np.where(mean, np.nanmean(past, axis=0), _nanmedian(past))
            levels[w] = np.where(np.sum(~np.isnan(past), axis=0) >= days // 2, level, np.nan)
        return levels

    def _day(self, t: int, data: Daily, resid: np.ndarray, errors: tuple[np.ndarray, np.ndarray],
             scales: tuple[np.ndarray, np.ndarray], published: np.ndarray, state: _State, unseen: list) -> np.ndarray:
        stats = np.full(len(self.cal.tests), np.nan)
        errors, shifted = errors
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: not judged
            levels = self.levels(resid, published, t, self.windows, self.cal.level_days, self.mean_level)
            rel_levels = self.levels(errors, published, t, self.rel_windows, RELATION_LEVEL_DAYS)
            for (kind, w), (rows, sigs) in self.by_kind.items():
                window = [d for d in range(max(0, t - w + 1), t) if published[d]] + [t]
                if kind in ("deviation", "level", "dispersion"):
                    z = (resid[window][:, sigs] - levels[w][sigs]) / scales[0][window][:, sigs]
                    stats[rows] = _pooled(kind, z, w)
                    if kind == "level":  # a share or a rate is bounded: its days are summed, as a count
                        stats[rows] = np.where(self.mean_level[sigs], _pooled("deviation", z, w), stats[rows])
                elif kind in ("relation", "coupling"):
                    kind_ = "deviation" if kind == "relation" else "dispersion"
                    stats[rows] = _pooled(kind_, (errors[window][:, sigs] - rel_levels[w][sigs]) / scales[1][window][:, sigs],
                                          w)
                elif kind == "alignment":  # the better of the two shifts, over the window
                    scale = scales[1][window][:, sigs]
                    aligned = (errors[window][:, sigs] / scale) ** 2
                    e = (shifted[:, window][:, :, sigs] / scale) ** 2
                    stats[rows] = np.fmax(_pooled("mean", aligned - e[0], w), _pooled("mean", aligned - e[1], w))
                elif kind == "share":
                    stats[rows] = self._shares(data, window, sigs, state, unseen, t)
                else:
                    stats[rows] = state.run_length(t, data.values[t], sigs, self.common)
        return stats

    def _shares(self, data: Daily, window: list[int], sigs: np.ndarray, state: _State, unseen: list,
                t: int) -> np.ndarray:
        """The window's share of null rows; for ``new``, the day's share of values never seen before
        (outside the vocabulary, and not on main in the last ``level_days`` days)."""
        vals = data.values[window][:, sigs]
        out = np.where(np.isnan(vals[-1]), np.nan, np.nanmean(vals, axis=0))
        for i, s in enumerate(sigs):
            key = self.keys[s]
            if self.cal.signals[key].measure == "new":
                recent = t - self.cal.level_days
                new = sum(n for k, value, n in unseen if k == key and state.seen.get((k, value), -10**9) < recent)
                out[i] = new / data.rows[t] if data.rows[t] else np.nan
        return out


def _pooled(kind: str, z: np.ndarray, w: int) -> np.ndarray:
    """A window's standardized deviations (days x columns) as one statistic per column: the size of
    their sum (``deviation``), their median (``level``) or their mean square (``dispersion``); NaN without the day itself or
    with fewer than half the window's days."""
    n = np.sum(~np.isnan(z), axis=0)
    if kind == "deviation":
        value = np.abs(np.nansum(z, axis=0)) / np.sqrt(np.maximum(n, 1))
    elif kind == "mean":
        value = np.nansum(z, axis=0) / np.maximum(n, 1)
    elif kind == "level":  # the window's median: a spike or two do not move it, a shifted level does
        value = np.abs(_nanmedian(z))
    else:
        value = np.nansum(z ** 2, axis=0) / np.maximum(n, 1)
    return np.where((n >= max(1, (w + 1) // 2)) & ~np.isnan(z[-1]), value, np.nan)


class _State:
    """What the days so far leave for the next: the runs of equal values, and when each unseen value
    was last on main."""

    def __init__(self, signals: int) -> None:
        self.last = np.full(signals, np.nan)
        self.length = np.zeros(signals)
        self.seen: dict[tuple[str, str], int] = {}

    def run_length(self, t: int, values: np.ndarray, sigs: np.ndarray, common: dict[int, set]) -> np.ndarray:
        v = values[sigs]
        same = (v == self.last[sigs]) & ~np.isnan(v)
        out = np.where(same, self.length[sigs] + 1, np.where(np.isnan(v), 0, 1)).astype(float)
        ordinary = np.array([bool(np.isnan(x)) or x in common[s] for s, x in zip(sigs, v, strict=True)])
        return np.where(ordinary, 0.0, out)

    def publish(self, t: int, published: bool, values: np.ndarray, common: dict[int, set]) -> None:
        if not published:
            return
        for s in common:
            v = values[s]
            if np.isnan(v):
                continue
            self.length[s] = self.length[s] + 1 if v == self.last[s] else 1
            self.last[s] = v


def _nanmedian(values: np.ndarray) -> np.ndarray:
    """Column medians ignoring NaN (NaN where a column has none): numpy's own is slow on small arrays."""
    ordered = np.sort(values, axis=0)  # NaN sorts last
    n = np.sum(~np.isnan(values), axis=0)
    cols = np.arange(values.shape[1])
    lo = ordered[np.maximum(n - 1, 0) // 2, cols]
    hi = ordered[np.minimum(n // 2, len(values) - 1), cols]
    return np.where(n > 0, np.where(n % 2 == 1, lo, (lo + hi) / 2), np.nan)


def _by_day(data: Daily) -> dict[int, list[tuple[str, str, int]]]:
    out: dict[int, list] = {}
    for day, key, value, rows in data.unseen.iter_rows():
        out.setdefault(day, []).append((key, value, rows))
    return out
