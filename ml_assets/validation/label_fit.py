"""The label's relationship to the features, as one daily signal: the mean log-loss of a small
logistic model fitted on the calibration's history (the judged features, the day of the year and the
weekday). A label that flips, or stops meaning what it meant, is predicted worse by the model of what it
used to mean, whatever its rate; a season in which the label is harder to predict is in the signal's
yearly profile.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ml_assets.spec import ModelSpec
from ml_assets.validation.judged import NUMERIC, judged_columns
from ml_assets.validation.label_drift import DAY, binary_labels

SAMPLE_ROWS = 200_000
MAX_CATEGORIES = 20
HARMONICS = 2


def _inputs(spec: ModelSpec) -> tuple[list[str], list[str]]:
    """The features the model reads as they are from the raw rows: numeric and categorical."""
    raw = judged_columns(spec)
    features = set(spec.features.numeric_names) | set(spec.features.categorical_names)
    numeric = [c for c in raw if c in features and raw[c] in NUMERIC]
    categorical = [c for c in raw if c in features and raw[c] not in NUMERIC]
    return numeric, categorical


def _calendar(day: pl.Expr) -> list[pl.Expr]:
    doy = day.dt.ordinal_day().cast(pl.Float64) - 1
    out = []
    for k in range(1, HARMONICS + 1):
        angle = 2 * np.pi * k * doy / 365.25
        out += [angle.cos().alias(f"cos{k}"), angle.sin().alias(f"sin{k}")]
    weekday = day.dt.weekday()  # Monday 1 .. Sunday 7
    out += [(weekday == d).cast(pl.Float64).alias(f"dow{d}") for d in range(2, 8)]
    return out


def design(terms: dict[str, float], centers: dict[str, list[float]]) -> list[pl.Expr]:
    """The model's inputs as polars expressions over the rows (their day in ``__day``)."""
    exprs = [*_calendar(pl.col(DAY))]
    for name in terms:
        kind, _, rest = name.partition(":")
        if kind == "x":
            mean, sd = centers[rest]
            exprs.append(((pl.col(rest).cast(pl.Float64) - mean) / sd).fill_nan(0.0).fill_null(0.0).alias(name))
        elif kind == "null":
            exprs.append(pl.col(rest).is_null().cast(pl.Float64).alias(name))
        elif kind == "cat":
            column, _, value = rest.partition("=")
            exprs.append((pl.col(column).cast(pl.String) == value).fill_null(False).cast(pl.Float64).alias(name))
    return exprs


def log_loss(terms: dict[str, float], centers: dict[str, list[float]], label: pl.Expr) -> pl.Expr:
    """Each row's log-loss under the model, as an expression over the columns ``design`` adds."""
    logit = pl.lit(terms.get("intercept", 0.0))
    for name, coef in terms.items():
        if name != "intercept":
            logit = logit + pl.col(name) * coef
    p = (1 / (1 + (-logit).exp())).clip(1e-6, 1 - 1e-6)
    y = label.cast(pl.Float64)
    return -(y * p.log() + (1 - y) * (1 - p).log())


def fit_label_model(spec: ModelSpec, rows: pl.DataFrame) -> tuple[dict[str, float], dict[str, list[float]]] | None:
    """Coefficients (by term) and the numeric inputs' mean and sd; None without a binary label or features."""
    labels = binary_labels(spec)
    numeric, categorical = _inputs(spec)
    if "label" not in labels or not (numeric or categorical):
        return None
    frame = rows.with_columns(labels["label"].alias("__y")).filter(pl.col("__y").is_not_null())
    if frame.height > SAMPLE_ROWS:
        frame = frame.sample(SAMPLE_ROWS, seed=0)
    if frame.height < 100 or frame["__y"].n_unique() < 2:
        return None
    centers, terms = {}, {}
    for c in numeric:
        values = frame[c].cast(pl.Float64).fill_nan(None)
        centers[c] = [float(values.mean() or 0.0), float(values.std() or 1.0) or 1.0]
        terms[f"x:{c}"] = 0.0
        if values.null_count():
            terms[f"null:{c}"] = 0.0
    for c in categorical:
        top = frame[c].cast(pl.String).drop_nulls().value_counts(sort=True, name="n")
        for value in top.filter(pl.col("n") >= 0.01 * frame.height)[c].head(MAX_CATEGORIES).to_list():
            terms[f"cat:{c}={value}"] = 0.0
    table = frame.with_columns(design(terms, centers))
    names = [*(f"cos{k}" for k in range(1, HARMONICS + 1)), *(f"sin{k}" for k in range(1, HARMONICS + 1)),
             *(f"dow{d}" for d in range(2, 8)), *terms]
    X = np.column_stack([np.ones(table.height), table.select(names).to_numpy()])
    coef = _logistic(X, table["__y"].cast(pl.Float64).to_numpy())
    return {"intercept": float(coef[0]), **{n: round(float(c), 8) for n, c in zip(names, coef[1:], strict=True)}}, centers


def _logistic(X: np.ndarray, y: np.ndarray, ridge: float = 1.0, steps: int = 30) -> np.ndarray:
    """Ridge-penalized logistic regression by Newton's method."""
    w = np.zeros(X.shape[1])
    penalty = ridge * np.eye(X.shape[1])
    penalty[0, 0] = 0.0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-np.clip(X @ w, -30, 30)))
        grad = X.T @ (p - y) + penalty @ w
        hess = (X * (p * (1 - p))[:, None]).T @ X + penalty
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w
