"""Loading a checkpoint written by the trainer: every file verified, weights loaded with weights_only."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import torch

from ml_assets.trainer.config import DataRef
from ml_assets.trainer.data import read_verified
from ml_assets.trainer.model import TabularMLP, build_model


@dataclass
class LoadedCheckpoint:
    model: TabularMLP
    meta: dict
    feature_state: dict


def load_checkpoint(weights: DataRef, meta: DataRef) -> LoadedCheckpoint:
    meta_dict = json.loads(read_verified(meta))
    if meta_dict["weights_sha256"] != weights.sha256:
        raise ValueError(f"{meta.uri} describes weights {meta_dict['weights_sha256']}, not {weights.sha256}")
    base = weights.uri.rsplit("/", 1)[0]
    state = json.loads(read_verified(DataRef(uri=f"{base}/feature_state.json", sha256=meta_dict["feature_state_sha256"])))
    model = build_model(meta_dict["model_config"])
    model.load_state_dict(torch.load(io.BytesIO(read_verified(weights)), weights_only=True))
    model.eval()
    return LoadedCheckpoint(model, meta_dict, state)
