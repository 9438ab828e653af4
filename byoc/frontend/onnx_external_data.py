"""Tensors whose bytes live in files beside the model (ONNX "external data"), as torch's
default exporter writes every model's weights (`model.onnx` + `model.onnx.data`) and as any
model over protobuf's 2 GiB limit must be stored.

`ExternalData(folder)` reads them the way onnxruntime does, from inside the model's folder
only: a tensor's `location` is a relative path that must stay in that folder once links are
resolved (an absolute path, `..`, or a link out of the folder is refused, as it could read
any file of the machine), and must name a regular file (a FIFO or a device would block or
never end). `offset` and `length` are checked against the file and the tensor's dims. Each
file is mapped once (mmap), and a tensor is a view of its bytes: a model of several GiB is
not copied into memory to be imported.
"""
from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

from ..errors import ModelError


class ExternalData:
    """The external data files of one model, read from `folder` (the model file's folder);
    `folder` None: the model came as bytes or a ModelProto, and has no folder to read from."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self._maps: dict[Path, memoryview] = {}

    def read(self, tensor, what: str, needed: int) -> memoryview:
        """The `needed` bytes of `tensor` (a TensorProto with data_location EXTERNAL)."""
        entries = {}
        for entry in tensor.external_data:
            if entry.key in entries:
                raise ModelError(f"{what} lists external_data key {entry.key!r} twice; expected each key once")
            entries[entry.key] = entry.value
        location = entries.get("location")
        if not location:
            raise ModelError(f"{what} stores its data externally but names no file (external_data has no "
                             f"'location'); expected the data file's path relative to the model")
        if self.folder is None:
            raise ModelError(f"{what} stores its data in the external file {location!r}; pass the model's path "
                             f"(byoc reads the data files beside it), or load it with onnx.load(path) and pass "
                             f"the ModelProto with its data")
        offset = _non_negative(entries.get("offset", "0"), what, "offset")
        length = _non_negative(entries["length"], what, "length") if "length" in entries else None
        data = self._file(location, what)
        end = len(data) if length is None else offset + length
        if offset > len(data) or end > len(data):
            raise ModelError(f"{what}: its external data ({location!r}, offset {offset}, length "
                             f"{'to the end' if length is None else length}) lies past the end of the file "
                             f"({len(data)} bytes); expected the bytes inside the file")
        if end - offset != needed:
            raise ModelError(f"{what} has {end - offset} bytes of external data in {location!r}; its dims need "
                             f"{needed}")
        return data[offset:end]

    def _file(self, location: str, what: str) -> memoryview:
        folder = self.folder.resolve()
        relative = Path(location)
        if relative.is_absolute() or location.startswith(("/", "\\")) or ".." in relative.parts or \
                "\\" in location or ":" in location or "\0" in location:
            raise ModelError(f"{what}: external data location {location!r} is not a path inside the model's "
                             f"folder; expected a relative path without '..'")
        try:
            path = (folder / relative).resolve(strict=True)
        except (OSError, RuntimeError) as error:  # missing, a link loop, no permission
            raise ModelError(f"{what}: its external data file {location!r} cannot be opened beside the model "
                             f"in {str(folder)!r}: {getattr(error, 'strerror', None) or error}") from None
        if path != folder and folder not in path.parents:
            raise ModelError(f"{what}: external data location {location!r} leads out of the model's folder "
                             f"(to {str(path)!r}); expected a file inside {str(folder)!r}")
        if path in self._maps:
            return self._maps[path]
        try:
            # non-blocking: opening a FIFO for reading would wait for a writer
            descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            try:
                info = os.fstat(descriptor)
                if not stat.S_ISREG(info.st_mode):
                    raise ModelError(f"{what}: external data location {location!r} is not a regular file; "
                                     f"expected the data file the exporter wrote")
                view = memoryview(mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)) if info.st_size \
                    else memoryview(b"")
            finally:
                os.close(descriptor)
        except OSError as error:
            raise ModelError(f"{what}: its external data file {location!r} cannot be read: "
                             f"{error.strerror or error}") from None
        self._maps[path] = view
        return view


def _non_negative(text: str, what: str, key: str) -> int:
    # ASCII digits only: str.isdigit() also takes '²', which int() then refuses
    if not text or not all("0" <= c <= "9" for c in text) or len(text) > 20:
        raise ModelError(f"{what}: external_data {key} is {text!r}; expected a non-negative integer")
    return int(text)
