"""Regression metrics: RMSE, MAE and R² of one prediction per row."""

from __future__ import annotations

import numpy as np

from ml_assets.evaluation.inputs import MetricError, _pair


def _rmse(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def _mae(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y)))


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0:
        raise MetricError(f"every target is the same value ({y[0]:g}); R² is undefined")
    return float(1 - np.sum((y - pred) ** 2) / ss_tot)


def regression_metrics(y, pred) -> dict[str, float]:
    """RMSE, MAE and R² (R² raises MetricError when every target is the same value)."""
    y, pred = _pair(y, pred)
    return {"rmse": _rmse(y, pred), "mae": _mae(y, pred), "r2": _r2(y, pred)}
