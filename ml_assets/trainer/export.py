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

from ml_assets.layout import BOOSTER_FILE, FEATURE_STATE_FILE, META_FILE, WEIGHTS_FILE
from ml_assets.storage import patiently
from ml_assets.storage import read_verified as _read_verified
from ml_assets.trainer.build import rebuild
from ml_assets.trainer.config import DataRef

BOOSTER_FORMAT = "xgboost-ubj"


def _write(base: str, files: tuple[tuple[str, bytes], ...]) -> None:
    for name, data in files:
        def put(uri: str = f"{base}/{name}", data: bytes = data) -> None:
            with fsspec.open(uri, "wb", auto_mkdir=True) as fh:
                fh.write(data)

        patiently(f"{base}/{name}", put)


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
    _write(base, ((WEIGHTS_FILE, blob), (FEATURE_STATE_FILE, feature_state), (META_FILE, meta_bytes)))
    return {"uri": f"{base}/{WEIGHTS_FILE}", "sha256": weights_sha, "bytes": len(blob),
            "meta_uri": f"{base}/{META_FILE}", "meta_sha256": hashlib.sha256(meta_bytes).hexdigest()}


def export_booster(output_dir: str, booster: bytes, meta: dict, feature_state: bytes) -> dict:
    """A gradient-boosted model's export: model.ubj (XGBoost's UBJSON, parsed as data when loaded),
    feature_state.json and meta.json pinning both, as ``export_model`` writes a network's."""
    base = output_dir.rstrip("/")
    sha = hashlib.sha256(booster).hexdigest()
    meta = {**meta, "format": BOOSTER_FORMAT, "weights_file": BOOSTER_FILE, "weights_sha256": sha,
            "feature_state_sha256": hashlib.sha256(feature_state).hexdigest()}
    meta_bytes = json.dumps(meta, indent=1, sort_keys=True).encode()
    _write(base, ((BOOSTER_FILE, booster), (FEATURE_STATE_FILE, feature_state), (META_FILE, meta_bytes)))
    return {"uri": f"{base}/{BOOSTER_FILE}", "sha256": sha, "bytes": len(booster),
            "meta_uri": f"{base}/{META_FILE}", "meta_sha256": hashlib.sha256(meta_bytes).hexdigest()}


def load_booster(data: bytes):
    """An xgboost.Booster from UBJSON bytes already verified by their sha256 (no pickle: XGBoost parses
    the model as data)."""
    import xgboost

    return xgboost.Booster(model_file=bytearray(data))


@dataclass
class LoadedCheckpoint:
    model: torch.nn.Module
    """A network in eval mode, or an ``xgboost.Booster`` (meta["family"] == "xgboost")."""
    meta: dict
    feature_state: dict


def load_checkpoint(weights: DataRef, meta: DataRef, code_path: str = "") -> LoadedCheckpoint:
    """An exported model, every file verified against its sha256; no pickle anywhere. A factory's
    model is rebuilt from its pinned code (searched in ``code_path`` first)."""

    meta_dict = json.loads(_read_verified(meta.uri, meta.sha256))
    if meta_dict.get("weights_sha256") != weights.sha256:
        raise ValueError(f"{meta.uri} describes weights {meta_dict.get('weights_sha256')}, not {weights.sha256}")
    if meta_dict.get("format") not in ("safetensors", BOOSTER_FORMAT):
        raise ValueError(f"{meta.uri}: export format {meta_dict.get('format')!r} is not 'safetensors' or "
                         f"{BOOSTER_FORMAT!r}")
    base = weights.uri.rsplit("/", 1)[0]
    state = json.loads(_read_verified(f"{base}/{FEATURE_STATE_FILE}", meta_dict["feature_state_sha256"]))
    if meta_dict["format"] == BOOSTER_FORMAT:
        return LoadedCheckpoint(load_booster(_read_verified(weights.uri, weights.sha256)), meta_dict, state)
    model = rebuild(meta_dict, code_path)
    model.load_state_dict(safetensors_load(_read_verified(weights.uri, weights.sha256)))
    model.eval()
    return LoadedCheckpoint(model, meta_dict, state)
