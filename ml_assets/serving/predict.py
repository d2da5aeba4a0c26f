"""One prediction function for evaluation, the registered pyfunc and batch inference."""

from __future__ import annotations

import numpy as np
import polars as pl

from ml_assets.trainer.checkpoint import LoadedCheckpoint


def predict(loaded: LoadedCheckpoint, frame: pl.DataFrame) -> np.ndarray:
    """Feature rows -> probabilities of the positive class [n] (binary classification), of each
    class [n, K] in the order of ``meta["classes"]`` (multiclass), or values [n] (regression),
    through the fitted feature state that travels with the weights."""
    import torch

    from ml_assets.features.state import transform

    encoded = transform(frame, loaded.feature_state)
    if loaded.meta.get("family") == "xgboost":
        return _boosted(loaded, encoded)
    with torch.no_grad():
        out = loaded.model(torch.from_numpy(encoded.numeric), torch.from_numpy(encoded.categorical))
    if loaded.meta["task"] == "binary_classification":
        out = torch.sigmoid(out)
    elif loaded.meta["task"] == "multiclass_classification":
        # In float64: float32 softmax rows sum to 1 only within ~1e-7, and scorers check the sum.
        out = torch.softmax(out.double(), dim=1)
    return out.numpy().astype(np.float64)


def _boosted(loaded: LoadedCheckpoint, encoded) -> np.ndarray:
    """A booster's predictions: its objective already gives probabilities (binary:logistic,
    multi:softprob) or values (reg:squarederror)."""
    import xgboost

    from ml_assets.trainer.booster_data import inputs

    matrix = xgboost.DMatrix(inputs(encoded), feature_names=loaded.meta["feature_names"],
                             feature_types=loaded.meta["feature_types"], enable_categorical=True)
    out = loaded.model.predict(matrix).astype(np.float64)
    if loaded.meta["task"] == "multiclass_classification":
        out = out / out.sum(axis=1, keepdims=True)  # float32 rows sum to 1 only within ~1e-7
    return out
