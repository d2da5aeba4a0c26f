"""Predictions and metrics on held-out rows (pure: numpy, scikit-learn, torch)."""

from __future__ import annotations

import numpy as np
import polars as pl
import torch
from sklearn import metrics as skm

from ml_assets.features.state import transform
from ml_assets.trainer.checkpoint import LoadedCheckpoint


class MetricError(ValueError):
    pass


def predict(loaded: LoadedCheckpoint, frame: pl.DataFrame) -> np.ndarray:
    """Probabilities for classification, values for regression."""
    encoded = transform(frame, loaded.feature_state)
    with torch.no_grad():
        out = loaded.model(torch.from_numpy(encoded.numeric), torch.from_numpy(encoded.categorical))
    if loaded.meta["task"] == "binary_classification":
        out = torch.sigmoid(out)
    return out.numpy().astype(np.float64)


def compute_metrics(task: str, y: np.ndarray, pred: np.ndarray, names: list[str]) -> dict[str, float]:
    if len(y) == 0:
        raise MetricError("no held-out rows to evaluate on")
    result = {}
    if task == "binary_classification":
        if len(np.unique(y)) < 2:
            raise MetricError(f"held-out rows have a single class ({y[0]:.0f}); ROC-AUC and PR-AUC are undefined")
        clipped = np.clip(pred, 1e-7, 1 - 1e-7)
        table = {
            "roc_auc": lambda: skm.roc_auc_score(y, pred),
            "pr_auc": lambda: skm.average_precision_score(y, pred),
            "log_loss": lambda: skm.log_loss(y, clipped, labels=[0, 1]),
        }
    else:
        table = {
            "rmse": lambda: float(np.sqrt(skm.mean_squared_error(y, pred))),
            "mae": lambda: skm.mean_absolute_error(y, pred),
            "r2": lambda: skm.r2_score(y, pred),
        }
    for name in names:
        result[name] = float(table[name]())
    return result
