"""Loads a built model.so and runs it from Python (the library itself needs no Python).

    module = byoc.runtime.load("model.so")
    outputs = module.run(input_ids=ids, attention_mask=mask)

Inputs are NumPy arrays for the cpu target, and CuPy arrays or torch CUDA tensors for
the cuda target (anything with __cuda_array_interface__). Outputs come back as the same
kind of array as the first input (NumPy, CuPy or torch), freshly allocated, or are
written into `out=` arrays the caller provides (a list or tuple, one per output; a single
array for a model with one output). Arrays must be in native byte order.
"""
from __future__ import annotations

import ctypes
import json
import numbers
import os
import sys
import threading
from pathlib import Path

import numpy as np

from ..errors import RuntimeError as ByocRuntimeError
from ..ir.types import numpy_dtype

C_ABI_HEADER = Path(__file__).with_name("byoc_model.h")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


# NumPy dtype kind/size -> DLPack (code, bits); typestr as in the array interfaces
_TYPESTR_DLPACK = {"f4": (2, 32), "f2": (2, 16), "f8": (2, 64), "i8": (0, 64), "i4": (0, 32),
                   "i2": (0, 16), "i1": (0, 8), "u1": (1, 8), "b1": (6, 8)}
_DEVICE_CPU, _DEVICE_CUDA = 1, 2
_NATIVE_BYTE_ORDER = "<" if sys.byteorder == "little" else ">"
_TORCH_DLPACK = {"torch.float32": (2, 32), "torch.float16": (2, 16), "torch.float64": (2, 64),
                 "torch.bfloat16": (4, 16), "torch.int64": (0, 64), "torch.int32": (0, 32),
                 "torch.int16": (0, 16), "torch.int8": (0, 8), "torch.uint8": (1, 8), "torch.bool": (6, 8)}


def _dlpack_dtype(typestr: str, descr=None) -> tuple[int, int] | None:
    """(code, bits), or None for a type byoc cannot pass (uint16, complex, object, ...)."""
    key = typestr[1:]
    if key == "V2" or (descr and "bfloat16" in str(descr)):
        return 4, 16
    return _TYPESTR_DLPACK.get(key)


def _unsupported_dtype(what: str, dtype, expected_dtype) -> ByocRuntimeError:
    return ByocRuntimeError(f"{what}: dtype {dtype} is not supported; expected {expected_dtype}")


class _Prepared:
    """A caller array described as a DLTensor (keeps the shape/stride buffers alive)."""

    def __init__(self, array, what: str, expected_dtype: str, writable: bool = False):
        self.array = array
        if type(array).__module__.startswith("torch") and getattr(array, "is_cuda", False):
            self._describe_torch_cuda(array, what, expected_dtype)
            return
        if hasattr(array, "__cuda_array_interface__"):
            interface, device = array.__cuda_array_interface__, _DEVICE_CUDA
        elif hasattr(array, "__array_interface__"):
            interface, device = array.__array_interface__, _DEVICE_CPU
        elif hasattr(array, "numpy") and hasattr(array, "device"):  # a torch CPU tensor
            self.array = array = array.numpy()
            interface, device = array.__array_interface__, _DEVICE_CPU
        else:
            raise ByocRuntimeError(f"{what}: expected a NumPy, CuPy or torch array, got {type(array).__name__}")
        shape = tuple(int(d) for d in interface["shape"])
        typestr = interface["typestr"]
        dtype = getattr(array, "dtype", typestr)
        if typestr[0] not in ("|", _NATIVE_BYTE_ORDER):
            # the C side reads native words: a byte-swapped array would give wrong numbers
            raise ByocRuntimeError(
                f"{what}: dtype {dtype} is not in native byte order; convert it first, e.g. "
                f"x.astype(x.dtype.newbyteorder('='))")
        if typestr[1:] == "V2" and hasattr(array, "dtype"):
            typestr = "<V2"
        dlpack = _dlpack_dtype(typestr, getattr(array, "dtype", None))
        if dlpack is None:
            raise _unsupported_dtype(what, dtype, expected_dtype)
        code, bits = dlpack
        itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 1
        data, read_only = interface["data"] if interface.get("data") else (0, False)
        if writable and read_only:
            raise ByocRuntimeError(f"{what}: the out= array is read-only; pass a writeable array")
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        strides = interface.get("strides")
        self.strides = None
        if strides is not None:
            self.strides = (ctypes.c_int64 * max(len(shape), 1))(*[s // itemsize for s in strides])
        self.tensor = _DLTensor(
            data=data, device=_DLDevice(device, 0), ndim=len(shape), dtype=_DLDataType(code, bits, 1),
            shape=self.shape, strides=self.strides, byte_offset=0)


    def _describe_torch_cuda(self, tensor, what: str, expected_dtype: str):
        """A torch CUDA tensor read field by field: its __cuda_array_interface__ builds a
        dict and checks autograd state on every access, tens of microseconds per run that
        a batch-1 model (a few tens of microseconds on the GPU) would spend in Python."""
        dlpack = _TORCH_DLPACK.get(str(tensor.dtype))
        if dlpack is None:
            raise _unsupported_dtype(what, tensor.dtype, expected_dtype)
        code, bits = dlpack
        shape = tensor.shape
        rank = len(shape)
        self.shape = (ctypes.c_int64 * max(rank, 1))(*shape)
        self.strides = (ctypes.c_int64 * max(rank, 1))(*tensor.stride())
        self.tensor = _DLTensor(
            data=tensor.data_ptr(), device=_DLDevice(_DEVICE_CUDA, tensor.get_device()), ndim=rank,
            dtype=_DLDataType(code, bits, 1), shape=self.shape, strides=self.strides, byte_offset=0)


class Module:
    """A loaded model: run() it as often as you like; close() (or garbage collection)
    frees its memory. One Module runs one call at a time: its intermediate tensors live in
    one arena, so run() calls from several threads take turns (a lock; ctypes releases the
    GIL, and two runs at once would overwrite each other's intermediates). On the cuda
    target run() returns once the work is queued on its stream: runs queued on different
    streams must be ordered by the caller (or use one Module per stream)."""

    def __init__(self, path, weights_path=None):
        self._run_lock = threading.Lock()
        self.path = str(Path(_check_path(path)).resolve())
        self._lib = lib = _open_library(self.path)
        lib.byoc_model_metadata.restype = ctypes.c_char_p
        lib.byoc_last_error.restype = ctypes.c_char_p
        lib.byoc_model_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.byoc_model_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DLTensor), ctypes.c_int32,
                                       ctypes.POINTER(_DLTensor), ctypes.c_int32, ctypes.c_void_p]
        lib.byoc_model_destroy.argtypes = [ctypes.c_void_p]
        self.metadata = json.loads(lib.byoc_model_metadata().decode("utf-8"))
        if weights_path is None and self.metadata["weights"]["location"] == "sidecar":
            weights_path = os.path.splitext(self.path)[0] + ".safetensors"
        elif weights_path is not None and self.metadata["weights"]["location"] != "sidecar":
            # the library would ignore it: say so rather than run with other weights than asked
            raise ByocRuntimeError(f"{os.path.basename(self.path)} embeds its weights; weights_path="
                                   f"{str(weights_path)!r} is only for a library built with a .safetensors sidecar")
        handle = ctypes.c_void_p()
        path_arg = str(weights_path).encode() if weights_path is not None else None
        if lib.byoc_model_create(ctypes.byref(handle), path_arg) != 0:
            raise ByocRuntimeError(f"{os.path.basename(self.path)}: {self._error()}")
        self._handle = handle
        self.device = "cuda" if self.metadata["target"].startswith("cuda") else "cpu"
        self.input_names = [t["name"] for t in self.metadata["inputs"]]
        self.output_names = [t["name"] for t in self.metadata["outputs"]]
        self._input_dtypes = [t["dtype"] for t in self.metadata["inputs"]]
        self._output_dtypes = [t["dtype"] for t in self.metadata["outputs"]]

    def _error(self) -> str:
        return self._lib.byoc_last_error().decode("utf-8", "replace")

    def _order_inputs(self, args, kwargs) -> list:
        names = self.input_names
        if len(args) > len(names):
            raise ByocRuntimeError(f"expected at most {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        values = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise ByocRuntimeError(f"unknown input {name!r}; the model's inputs are {names}")
            if name in values:
                raise ByocRuntimeError(f"input {name!r} given twice")
            values[name] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise ByocRuntimeError(f"missing input(s) {missing}; the model's inputs are {names}")
        return [values[n] for n in names]

    def _allocate_outputs(self, like):
        specs = self.metadata["outputs"]
        outputs = []
        for spec in specs:
            dtype = numpy_dtype(spec["dtype"])
            # an output PlanDevices delivers in host memory ("device": "cpu") is a NumPy array
            if self.device == "cpu" or spec.get("device") == "cpu":
                outputs.append(np.empty(spec["shape"], dtype=dtype))
            elif type(like).__module__.startswith("torch"):
                import torch
                torch_dtype = getattr(torch, spec["dtype"])
                outputs.append(torch.empty(spec["shape"], dtype=torch_dtype, device=like.device))
            else:
                import cupy
                outputs.append(cupy.empty(spec["shape"], dtype=dtype))
        return outputs

    def run(self, *args, out=None, stream=None, **kwargs):
        """Run once. Returns one array, or a tuple when the model has several outputs."""
        if self._handle is None:
            raise ByocRuntimeError("this module was closed")
        inputs = self._order_inputs(args, kwargs)
        prepared_inputs = [_Prepared(a, f"input {n!r}", d)
                           for a, n, d in zip(inputs, self.input_names, self._input_dtypes)]
        outputs = self._caller_outputs(out) if out is not None else self._allocate_outputs(
            inputs[0] if inputs else None)
        prepared_outputs = [_Prepared(a, f"output {n!r}", d, writable=True)
                            for a, n, d in zip(outputs, self.output_names, self._output_dtypes)]
        input_array = (_DLTensor * max(len(prepared_inputs), 1))(*[p.tensor for p in prepared_inputs])
        output_array = (_DLTensor * max(len(prepared_outputs), 1))(*[p.tensor for p in prepared_outputs])
        stream_pointer = self._stream_pointer(stream, inputs)
        with self._run_lock:
            if self._handle is None:
                raise ByocRuntimeError("this module was closed")
            status = self._lib.byoc_model_run(self._handle, input_array, len(prepared_inputs),
                                              output_array, len(prepared_outputs), stream_pointer)
            if status != 0:
                raise ByocRuntimeError(self._error())  # last_error is per thread: read it here
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _caller_outputs(self, out) -> list:
        """out= as a list: one array per output (a single array when the model has one)."""
        names = self.output_names
        if isinstance(out, (list, tuple)):
            outputs = list(out)
        elif len(names) == 1:
            outputs = [out]  # as run() returns a single array for a single output
        else:
            raise ByocRuntimeError(f"out=: expected a list or tuple of {len(names)} arrays (one per output: "
                                   f"{', '.join(names)}), got {type(out).__name__}")
        if len(outputs) != len(names):
            raise ByocRuntimeError(f"out=: expected {len(names)} arrays (one per output: {', '.join(names)}), "
                                   f"got {len(outputs)}")
        return outputs

    def _stream_pointer(self, stream, inputs):
        if self.device != "cuda":
            return None
        if stream is not None:
            return getattr(stream, "ptr", getattr(stream, "cuda_stream", stream))
        first = inputs[0] if inputs else None
        if first is not None and type(first).__module__.startswith("torch"):
            import torch
            return torch.cuda.current_stream().cuda_stream
        try:
            import cupy
            return cupy.cuda.get_current_stream().ptr
        except ImportError:
            return None

    def benchmark(self, *args, repeat: int = 100, warmup: int = 10, **kwargs) -> float:
        """Mean milliseconds per run (inputs reused), measured with the device synchronized."""
        import time
        for name, value, least in (("repeat", repeat, 1), ("warmup", warmup, 0)):
            if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)) or value < least:
                raise ByocRuntimeError(f"benchmark(): {name} must be an integer >= {least}, got {value!r}")
        outputs = self.run(*args, **kwargs)
        outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
        for _ in range(warmup):
            self.run(*args, out=outputs, **kwargs)
        self._synchronize()
        start = time.perf_counter()
        for _ in range(repeat):
            self.run(*args, out=outputs, **kwargs)
        self._synchronize()
        return (time.perf_counter() - start) * 1e3 / repeat

    def _synchronize(self):
        if self.device == "cuda":
            import cupy
            cupy.cuda.runtime.deviceSynchronize()

    def close(self):
        if getattr(self, "_handle", None) is None:
            return
        with self._run_lock:  # not while another thread's run() uses the model
            if self._handle is not None:
                self._lib.byoc_model_destroy(self._handle)
                self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _check_path(path):
    if not isinstance(path, (str, os.PathLike)):
        raise ByocRuntimeError(f"expected a path to a byoc .so, got "
                               f"{'None' if path is None else type(path).__name__}")
    return path


# resolved path -> (device, inode, size, mtime) of the file when this process first
# dlopen()ed it under that name. The dynamic loader hands back the library it already has
# for a name it has seen, so a .so rebuilt at the same path (a workdir built again) would
# silently run the old code.
_first_opened: dict = {}
_first_opened_lock = threading.Lock()


def _open_library(path) -> ctypes.CDLL:
    """The library at `path`, checked to be one byoc built (it exports byoc_model_metadata).
    A file that changed since this process first loaded that path is loaded from a private
    copy (removed once loaded), so the loader cannot return the earlier one."""
    resolved = str(Path(path).resolve())
    try:
        stat = os.stat(resolved)
        state = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        with _first_opened_lock:
            first = _first_opened.setdefault(resolved, state)
        if first == state:
            lib = ctypes.CDLL(resolved, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        else:
            lib = _open_private_copy(resolved)
    except OSError as error:
        raise ByocRuntimeError(f"cannot load {path}: {error}") from None
    if not hasattr(lib, "byoc_model_metadata"):
        raise ByocRuntimeError(f"{path}: not a byoc library: it has no byoc_model_metadata")
    return lib


def _open_private_copy(path: str) -> ctypes.CDLL:
    import shutil
    import tempfile
    try:  # beside the library: a directory it loads from (a temporary one may be noexec)
        handle, copy = tempfile.mkstemp(prefix=".byoc-load-", suffix=".so", dir=os.path.dirname(path))
    except OSError:
        handle, copy = tempfile.mkstemp(prefix="byoc-load-", suffix=".so")
    try:
        with os.fdopen(handle, "wb") as destination, open(path, "rb") as source:
            shutil.copyfileobj(source, destination)
        return ctypes.CDLL(copy, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    finally:
        os.unlink(copy)  # the loaded mapping stays valid


def metadata_of(path) -> dict:
    """A library's metadata JSON, read without creating the model (no weights loaded)."""
    lib = _open_library(_check_path(path))
    lib.byoc_model_metadata.restype = ctypes.c_char_p
    return json.loads(lib.byoc_model_metadata().decode("utf-8"))


def load(path, weights_path=None) -> Module:
    """Load a model library built by byoc."""
    return Module(path, weights_path)
