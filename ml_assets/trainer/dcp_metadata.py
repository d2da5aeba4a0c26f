"""DCP's ``.metadata`` read without arbitrary unpickling: it is a pickle, so it is read by an
unpickler that admits DCP's own metadata classes and nothing else (after the checkpoint manager
verified the file against its manifest, ml_assets.trainer.checkpoint_files)."""

from __future__ import annotations

import pickle

import torch
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

_ALLOWED_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                    "torch.distributed.checkpoint.planner")
_ALLOWED_GLOBALS = {("torch", "Size"), ("torch", "device"), ("collections", "OrderedDict"),
                    ("torch.serialization", "_get_layout")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        dtype_or_layout = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.layout
                                                             | torch.memory_format)
        if module in _ALLOWED_MODULES or (module, name) in _ALLOWED_GLOBALS or dtype_or_layout:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which a DCP metadata "
                                     "file never needs; refusing to load it")


class SafeFsspecReader(FsspecReader):
    """FsspecReader whose ``.metadata`` is read by an unpickler limited to DCP's metadata classes."""

    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
