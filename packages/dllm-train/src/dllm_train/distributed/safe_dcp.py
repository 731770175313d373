"""Reading `torch.distributed.checkpoint` shards without unpickling arbitrary objects.

DCP's `FileSystemReader` reads a checkpoint's `.metadata` with `pickle.load`, and its default
planner reads every non-tensor item with `torch.load(weights_only=False)`: resuming a run folder
from elsewhere could run code. `SafeReader` unpickles `.metadata` with an allowlist (DCP's own
metadata classes, `torch.Size`, dtypes, layouts, paths) and `SafeLoadPlanner` reads the items with
`torch.load(weights_only=True)`. What they refuse raises `ValueError` naming the file.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_DCP = "torch.distributed.checkpoint."
_OTHERS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
           ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
           ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata: classes of `torch.distributed.checkpoint.*`, `torch.Size`, dtypes,
    `torch.serialization._get_layout`, paths; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _OTHERS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module.startswith(_DCP):
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not a class of checkpoint metadata")


class SafeReader(FileSystemReader):
    """`FileSystemReader` whose `.metadata` is unpickled with an allowlist (`_MetadataUnpickler`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as fh:
            try:
                metadata = _MetadataUnpickler(fh).load()
            except pickle.UnpicklingError as err:
                raise ValueError(f"{path} holds objects other than checkpoint metadata ({err}), which only "
                                 "unpickling (running code from the file) could read: refused") from None
        if not isinstance(metadata, Metadata):
            raise ValueError(f"{path} holds a {type(metadata).__name__}, not checkpoint metadata: refused")
        storage = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage.load_id = self.load_id
        metadata.storage_meta = storage
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """`DefaultLoadPlanner` reading non-tensor items with `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise ValueError(f"checkpoint item {read_item.dest_index.fqn} holds objects other than tensors and "
                             f"plain data ({str(err).splitlines()[0]}): refused") from None
        if self.flatten_state_dict:  # as DefaultLoadPlanner.load_bytes, with the object read safely
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


__all__ = ["SafeLoadPlanner", "SafeReader"]
