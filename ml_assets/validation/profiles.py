"""What is ordinary for a daily signal: its weekly and yearly profile, its scale, and how it moves
with the other columns. Fitted once on the history, by least squares, robustly.

Why a fitted profile and a recent level rather than the same weeks of earlier years: a column that
grows from year to year is never like last year's same weeks (its level differs), and is always like
last week's (the season moves slowly). Taking the calendar out with a profile fitted on several years
and comparing what remains with the last weeks judges a day against both, and a level that moves
with a trend is absorbed by the recent level.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from ml_assets.spec.calibration import Signal
from ml_assets.validation.signals import fourier, weekday

HARMONICS = 3
YEARLY_MIN_DAYS = 700  # about two years: a profile of one year cannot be told from that year's weather
WEEKLY_MIN_DAYS = 56
YEARLY_SCALE_MIN_DAYS = 1461  # four years: a season's spread from one or two years is mostly those years' weather
RIDGE = 0.05  # of the days, on standardized inputs: a relation fitted on two years must hold on the third
MIN_R2 = 0.15  # a relation must explain this share of a column's deviations to be judged


def _trend(x: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling mean, ignoring missing days (half the window must be there)."""
    series = pl.Series(x).fill_nan(None)
    return series.rolling_mean(window, min_samples=window // 2, center=True).fill_null(np.nan).to_numpy()


def fit_profile(x: np.ndarray, days: list[dt.date]) -> tuple[list[float] | None, list[float] | None]:
    """Weekly offsets (Monday first, summing to 0) and yearly Fourier coefficients of the series ``x``
    on ``days``; None for a profile the history is too short to fit."""
    ok = np.isfinite(x)
    if ok.sum() < WEEKLY_MIN_DAYS:
        return None, None
    yearly = ok.sum() >= YEARLY_MIN_DAYS
    when = np.array(days, dtype="datetime64[D]")
    y = x - _trend(x, 365 if yearly else 7)
    parts = [np.eye(7)[weekday(when)]]
    if yearly:
        parts.append(fourier(when, HARMONICS))
    design = np.hstack(parts)
    use = ok & np.isfinite(y)
    if use.sum() < design.shape[1] * 4:
        return None, None
    coef = _robust_lstsq(design[use], y[use])
    weekly = coef[:7] - coef[:7].mean()
    return ([round(float(v), 8) for v in weekly],
            [round(float(v), 8) for v in coef[7:]] if yearly else None)


def _robust_lstsq(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares, once more without the points more than 5 robust sd off (holidays, outages)."""
    coef = np.linalg.lstsq(design, y, rcond=None)[0]
    res = y - design @ coef
    keep = np.abs(res - np.median(res)) <= 5 * max(robust_scale(res), 1e-12)
    if keep.sum() >= design.shape[1] * 4:
        coef = np.linalg.lstsq(design[keep], y[keep], rcond=None)[0]
    return coef


SCALE_HARMONICS = 2
SCALE_RANGE = 3.0  # a season's scale stays within 1/3..3 of the year's


def fit_yearly_scale(deviation: np.ndarray, days: list[dt.date]) -> list[float] | None:
    """Fourier coefficients of log(scale) by day of the year, from a signal's deviations (None on
    under ``YEARLY_SCALE_MIN_DAYS`` of them): least squares on log(deviation^2), robustly, with a floor of a
    quarter of the scale so that days at exactly their level do not weigh as minus infinity."""
    ok = np.isfinite(deviation)
    if ok.sum() < YEARLY_SCALE_MIN_DAYS:
        return None
    floor = 0.25 * robust_scale(deviation)
    y = np.log(deviation[ok] ** 2 + floor ** 2)
    basis = fourier(np.array(days, dtype="datetime64[D]")[ok], SCALE_HARMONICS)
    coef = _robust_lstsq(np.hstack([np.ones((len(y), 1)), basis]), y)[1:] / 2
    return [round(float(v), 8) for v in coef]


def seasonal(coef: list[float] | None, days: np.ndarray) -> np.ndarray:
    """The factor of a scale on each of ``days`` (datetime64[D]): 1 without a yearly scale."""
    if coef is None:
        return np.ones(len(days))
    return np.clip(np.exp(fourier(days, len(coef) // 2) @ np.asarray(coef)), 1 / SCALE_RANGE, SCALE_RANGE)


def robust_scale(x: np.ndarray) -> float:
    """1.4826 x MAD, at least half the sd (a share that is 0 or 1 on most days has a MAD near 0); never 0."""
    v = x[np.isfinite(x)]
    if not len(v):
        return 1.0
    mad = 1.4826 * float(np.median(np.abs(v - np.median(v))))
    return max(mad, 0.5 * float(np.std(v)), 1e-9, 1e-9 * float(np.max(np.abs(v))))


LAG = "@-1"  # a relation's input of the day before: "temp_max:mean@-1"


def lagged(values: np.ndarray) -> np.ndarray:
    """Each day's row of the day before (NaN for the first)."""
    return np.vstack([np.full((1, values.shape[1]), np.nan), values[:-1]])


def _ridge(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    sd = X.std(axis=0)
    sd[sd == 0] = 1.0
    Z = X / sd
    return np.linalg.solve(Z.T @ Z + RIDGE * len(y) * np.eye(X.shape[1]), Z.T @ y) / sd


def held_out_r2(X: np.ndarray, y: np.ndarray) -> float:
    """The share of ``y``'s variance a relation explains on the half of the history it was not fitted
    on (rows in time order; each half predicted from the other)."""
    half = len(y) // 2
    folds = ((slice(0, half), slice(half, None)), (slice(half, None), slice(0, half)))
    err = np.concatenate([y[test] - X[test] @ _ridge(X[fit], y[fit]) for fit, test in folds])
    spread = np.concatenate([y[test] - y[fit].mean() for fit, test in folds])
    return 1 - float(err @ err) / max(float(spread @ spread), 1e-300)


def fit_relations(signals: dict[str, Signal], deviation: np.ndarray) -> dict[str, dict[str, float]]:
    """For each numeric column's mean: ridge coefficients predicting its daily deviation from the other
    numeric columns' on the same day and the day before, and its own the day before (the night after a
    hot day is warm: a column shifted by a day breaks that), where they explain at least ``MIN_R2`` of
    it on the half of the history they were not fitted on. The categories' shares are inputs only where
    they explain more there: a category whose meaning changed within the history (a weather label that
    stopped saying "rain") would make the relation wrong on both sides of the change."""
    keys = list(signals)
    means = [i for i, k in enumerate(keys) if signals[k].measure == "mean" and signals[k].column != "label"]
    shares = [i for i, k in enumerate(keys) if signals[k].measure.startswith("share=")]
    if len(means) < 2 and not (means and shares):
        return {}
    both = np.hstack([deviation, lagged(deviation)])
    out = {}
    for i in means:
        best: tuple[float, list[int]] | None = None
        for pool in ([j for j in means if j != i], [j for j in means + shares if j != i]):
            inputs = pool + [len(keys) + j for j in means + shares if j in pool or j == i]
            rows = np.all(np.isfinite(both[:, [i, *inputs]]), axis=1)
            if rows.sum() < 60 or not pool:
                continue
            r2 = held_out_r2(both[rows][:, inputs], both[rows, i])
            if best is None or r2 > best[0]:
                best = (r2, inputs)
        if best is None or best[0] < MIN_R2:
            continue
        inputs = best[1]
        rows = np.all(np.isfinite(both[:, [i, *inputs]]), axis=1)
        coef = _ridge(both[rows][:, inputs], both[rows, i])
        out[keys[i]] = {(keys[j] if j < len(keys) else keys[j - len(keys)] + LAG): round(float(c), 8)
                        for j, c in zip(inputs, coef, strict=True)}
    return out
