"""The trained model as it leaves the trainer: ``model.safetensors``, ``feature_state.json`` and
``meta.json`` (which rebuilds the model and pins the other two by sha256), with nothing pickled, and
``load_checkpoint``, which reads such an export back with every file verified against its sha256."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import fsspec
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from ml_assets.layout import FEATURE_STATE_FILE, META_FILE, WEIGHTS_FILE
from ml_assets.storage import read_verified as _read_verified
from ml_assets.trainer.build import rebuild
from ml_assets.trainer.config import DataRef


def _contiguous(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}


def export_model(output_dir: str, weights: dict[str, torch.Tensor], meta: dict, feature_state: bytes) -> dict:
    """Write model.safetensors, feature_state.json and meta.json (which rebuilds the model and pins
    the other two by sha256). Returns URIs and digests."""
    base = output_dir.rstrip("/")
    blob = safetensors_save(_contiguous(weights))
    weights_sha = hashlib.sha256(blob).hexdigest()
    meta = {**meta, "format": "safetensors", "weights_file": WEIGHTS_FILE, "weights_sha256": weights_sha,
            "feature_state_sha256": hashlib.sha256(feature_state).hexdigest()}
    meta_bytes = json.dumps(meta, indent=1, sort_keys=True).encode()
    for name, data in ((WEIGHTS_FILE, blob), (FEATURE_STATE_FILE, feature_state), (META_FILE, meta_bytes)):
        with fsspec.open(f"{base}/{name}", "wb", auto_mkdir=True) as fh:
            fh.write(data)
    return {"uri": f"{base}/{WEIGHTS_FILE}", "sha256": weights_sha, "bytes": len(blob),
            "meta_uri": f"{base}/{META_FILE}", "meta_sha256": hashlib.sha256(meta_bytes).hexdigest()}


@dataclass
class LoadedCheckpoint:
    model: torch.nn.Module
    meta: dict
    feature_state: dict


def load_checkpoint(weights: DataRef, meta: DataRef, code_path: str = "") -> LoadedCheckpoint:
    """An exported model, every file verified against its sha256; no pickle anywhere. A factory's
    model is rebuilt from its pinned code (searched in ``code_path`` first)."""

    meta_dict = json.loads(_read_verified(meta.uri, meta.sha256))
    if meta_dict.get("weights_sha256") != weights.sha256:
        raise ValueError(f"{meta.uri} describes weights {meta_dict.get('weights_sha256')}, not {weights.sha256}")
    if meta_dict.get("format") != "safetensors":
        raise ValueError(f"{meta.uri}: export format {meta_dict.get('format')!r} is not 'safetensors'")
    base = weights.uri.rsplit("/", 1)[0]
    state = json.loads(_read_verified(f"{base}/{FEATURE_STATE_FILE}", meta_dict["feature_state_sha256"]))
    model = rebuild(meta_dict, code_path)
    model.load_state_dict(safetensors_load(_read_verified(weights.uri, weights.sha256)))
    model.eval()
    return LoadedCheckpoint(model, meta_dict, state)
