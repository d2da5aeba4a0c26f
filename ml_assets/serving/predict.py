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
    with torch.no_grad():
        out = loaded.model(torch.from_numpy(encoded.numeric), torch.from_numpy(encoded.categorical))
    if loaded.meta["task"] == "binary_classification":
        out = torch.sigmoid(out)
    elif loaded.meta["task"] == "multiclass_classification":
        # In float64: float32 softmax rows sum to 1 only within ~1e-7, and scorers check the sum.
        out = torch.softmax(out.double(), dim=1)
    return out.numpy().astype(np.float64)
