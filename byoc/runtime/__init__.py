"""Loads a built model.so and runs it from Python (the library itself needs no Python).

    module = byoc.runtime.load("model.so")
    outputs = module.run(input_ids=ids, attention_mask=mask)

Inputs are NumPy arrays for the cpu target, and CuPy arrays or torch CUDA tensors for
the cuda target (anything with __cuda_array_interface__). Outputs come back as the same
kind of array as the first input (NumPy, CuPy or torch), freshly allocated, or are
written into `out=` arrays the caller provides (a list or tuple, one per output; a single
array for a model with one output). Arrays must be in native byte order. A tensor of any
other library that offers DLPack (`__dlpack__`, e.g. JAX) is taken without a copy, and its
outputs come back through that library's from_dlpack. A strided input is copied once into
a row-major array; out= arrays are written in place and must be row-major.
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
# The runtime's C/C++ headers (byoc_model.h, byoc_float16.h): on the include path of the
# host code and of every CPU compile unit that converts 16-bit floats
INCLUDE_DIR = C_ABI_HEADER.parent


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


# DLPack device types (dlpack.h): where a producer's tensor lives
_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST = 1, 2, 3


def _readable_input(array, what: str, expected_shape=None):
    """An input as the array interfaces can describe it, row-major: a tensor offered only
    through DLPack (`__dlpack__`: JAX, PyTorch-likes, NumPy >= 1.22) is taken without a copy
    by NumPy's or CuPy's from_dlpack; a strided NumPy, CuPy or torch array of the expected
    shape is copied once into a row-major one (as onnxruntime does), since the library
    reads inputs densely. One of another shape is left for the library's check to name
    (a broadcast view can claim a shape no copy could hold)."""
    if _dlpack_only(array):
        array = _from_dlpack(array, what)
    if expected_shape is not None and tuple(getattr(array, "shape", ())) != tuple(expected_shape):
        return array
    flags = getattr(array, "flags", None)
    if flags is not None and getattr(flags, "c_contiguous", True) is False and hasattr(array, "copy"):
        return array.copy(order="C")  # NumPy, CuPy
    is_contiguous = getattr(array, "is_contiguous", None)
    if type(array).__module__.startswith("torch") and callable(is_contiguous) and not is_contiguous():
        return array.contiguous()
    return array


# Array types read through their own interfaces. Checked by module name first: a CuPy or
# torch CUDA array builds its __cuda_array_interface__ dict on every access (microseconds
# of a run's hot path), so hasattr() on it would cost as much as reading it.
_INTERFACE_MODULES = ("numpy", "cupy", "torch")


def _dlpack_only(array) -> bool:
    """Whether `array` offers DLPack but neither array interface (JAX, other libraries)."""
    if type(array).__module__.startswith(_INTERFACE_MODULES) or not hasattr(array, "__dlpack__"):
        return False
    return not (hasattr(array, "__array_interface__") or hasattr(array, "__cuda_array_interface__"))


def _from_dlpack(array, what: str):
    try:
        device_type, _ = array.__dlpack_device__()
        if device_type in (_DLPACK_CPU, _DLPACK_CUDA_HOST):
            return np.from_dlpack(array)
        if device_type == _DLPACK_CUDA:
            return _cupy(f"{what}: taking a CUDA tensor through DLPack").from_dlpack(array)
    except ByocRuntimeError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever the producer raised, named
        raise ByocRuntimeError(f"{what}: taking {type(array).__name__} through DLPack raised "
                               f"{type(error).__name__}: {error}") from error
    raise ByocRuntimeError(f"{what}: a DLPack tensor on device type {device_type}; expected one in CPU (1) or "
                           f"CUDA (2) memory")


def _dlpack_returner(like):
    """For an input offered only through DLPack: its library's from_dlpack (jax.numpy's,
    a module's own), so that outputs come back as the caller's kind; else None."""
    if like is None or not _dlpack_only(like):
        return None
    module = sys.modules.get(type(like).__module__)
    root = sys.modules.get(type(like).__module__.split(".")[0])
    for candidate in (module, getattr(root, "numpy", None), root):
        function = getattr(candidate, "from_dlpack", None)
        if callable(function):
            return function
    return None


class _Prepared:
    """A caller array described as a DLTensor (keeps the shape/stride buffers alive)."""

    def __init__(self, array, what: str, expected_dtype: str, writable: bool = False, expected_shape=None):
        if not writable:
            array = _readable_input(array, what, expected_shape)
        self.array = array
        if type(array).__module__.startswith("torch") and getattr(array, "is_cuda", False):
            self._describe_torch_cuda(array, what, expected_dtype)
            return
        try:  # the interfaces may be properties of the caller's class that raise
            # each read once: CuPy builds the dict anew on every access (a hot path)
            interface, device = getattr(array, "__cuda_array_interface__", None), _DEVICE_CUDA
            if interface is None:
                interface, device = getattr(array, "__array_interface__", None), _DEVICE_CPU
            if interface is None and hasattr(array, "numpy") and hasattr(array, "device"):  # a torch CPU tensor
                self.array = array = array.numpy()
                interface, device = array.__array_interface__, _DEVICE_CPU
            if interface is None:
                raise ByocRuntimeError(f"{what}: expected a NumPy, CuPy or torch array, got {type(array).__name__}")
        except ByocRuntimeError:
            raise
        except Exception as error:  # noqa: BLE001 - whatever the caller's object raised, named
            raise ByocRuntimeError(f"{what}: reading its array interface raised {type(error).__name__}: "
                                   f"{error}") from error
        try:
            self._describe(array, interface, device, what, expected_dtype, writable)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError) as error:
            raise ByocRuntimeError(f"{what}: its {'__cuda_array_interface__' if device == _DEVICE_CUDA else '__array_interface__'} "
                                   f"is malformed ({type(error).__name__}: {error}); expected a dict with 'shape' "
                                   f"(a tuple of ints), 'typestr', 'data' (pointer, read_only) and optional "
                                   f"'strides'") from None

    def _describe(self, array, interface, device, what, expected_dtype, writable):
        shape = tuple(int(d) for d in interface["shape"])
        if any(d < 0 for d in shape):
            raise ValueError(f"negative dims in shape {shape}")
        typestr = interface["typestr"]
        if not isinstance(typestr, str) or len(typestr) < 2:
            raise ValueError(f"typestr {typestr!r} is not a NumPy type string")
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
        data = int(data)
        if not 0 <= data < 1 << 64:
            raise ValueError(f"data pointer {data} is not a 64-bit address")
        if writable and read_only:
            raise ByocRuntimeError(f"{what}: the out= array is read-only; pass a writeable array")
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        strides = interface.get("strides")
        self.strides = None
        if strides is not None:
            if len(strides) != len(shape):
                raise ValueError(f"{len(strides)} strides for {len(shape)} dims")
            if any(int(s) % itemsize for s in strides):
                raise ByocRuntimeError(f"{what}: strides {tuple(strides)} (bytes) are not multiples of the "
                                       f"element size {itemsize}; expected a contiguous array")
            self.strides = (ctypes.c_int64 * max(len(shape), 1))(*[int(s) // itemsize for s in strides])
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
        self.path = _resolved(_check_path(path))
        self._handle = None
        self._lib = _open_library(self.path)
        try:
            self._create(weights_path)
        except BaseException:
            _close_library(self._lib)  # a refused library stays mapped in no process
            raise

    def _create(self, weights_path):
        lib = self._lib
        lib.byoc_model_metadata.restype = ctypes.c_char_p
        lib.byoc_last_error.restype = ctypes.c_char_p
        lib.byoc_model_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.byoc_model_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DLTensor), ctypes.c_int32,
                                       ctypes.POINTER(_DLTensor), ctypes.c_int32, ctypes.c_void_p]
        lib.byoc_model_destroy.argtypes = [ctypes.c_void_p]
        if hasattr(lib, "byoc_model_status"):  # libraries built before it lack it
            lib.byoc_model_status.argtypes = [ctypes.c_void_p]
        self.metadata = _read_metadata(lib, self.path)
        if weights_path is None and self.metadata["weights"]["location"] == "sidecar":
            weights_path = os.path.splitext(self.path)[0] + ".safetensors"
        elif weights_path is not None and self.metadata["weights"]["location"] != "sidecar":
            # the library would ignore it: say so rather than run with other weights than asked
            raise ByocRuntimeError(f"{os.path.basename(self.path)} embeds its weights; weights_path="
                                   f"{str(weights_path)!r} is only for a library built with a .safetensors sidecar")
        if weights_path is not None:
            weights_path = _checked_weights_path(weights_path)
        handle = ctypes.c_void_p()
        path_arg = str(weights_path).encode() if weights_path is not None else None
        if lib.byoc_model_create(ctypes.byref(handle), path_arg) != 0:
            raise ByocRuntimeError(f"{os.path.basename(self.path)}: {self._error()}")
        self._handle = handle
        self.device = "cuda" if self.metadata["target"].startswith("cuda") else "cpu"
        self.input_names = [t["name"] for t in self.metadata["inputs"]]
        self.output_names = [t["name"] for t in self.metadata["outputs"]]
        self._input_dtypes = [t["dtype"] for t in self.metadata["inputs"]]
        self._input_shapes = [tuple(t["shape"]) for t in self.metadata["inputs"]]
        self._output_dtypes = [t["dtype"] for t in self.metadata["outputs"]]

    def _error(self) -> str:
        message = self._lib.byoc_last_error()
        return message.decode("utf-8", "replace") if message else "(the library gave no error message)"

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
                outputs.append(_cupy("allocating the outputs (pass torch tensors, or out= arrays)")
                               .empty(spec["shape"], dtype=dtype))
        return outputs

    def run(self, *args, out=None, stream=None, **kwargs):
        """Run once. Returns one array, or a tuple when the model has several outputs."""
        if self._handle is None:
            raise ByocRuntimeError("this module was closed")
        inputs = self._order_inputs(args, kwargs)
        prepared_inputs = [_Prepared(a, f"input {n!r}", d, expected_shape=shape)
                           for a, n, d, shape in zip(inputs, self.input_names, self._input_dtypes,
                                                     self._input_shapes)]
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
        if out is None:
            returner = _dlpack_returner(inputs[0] if inputs else None)
            if returner is not None:  # outputs of the caller's kind, through DLPack (no copy)
                try:
                    outputs = [returner(output) for output in outputs]
                except Exception as error:  # noqa: BLE001 - the caller's library refused; name it
                    raise ByocRuntimeError(
                        f"returning the outputs through {getattr(returner, '__module__', '?')}.from_dlpack "
                        f"raised {type(error).__name__}: {error}; pass out= arrays to receive them instead") from error
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
            if stream is not None:
                raise ByocRuntimeError(f"stream=: this model runs on the cpu; expected no stream, got "
                                       f"{type(stream).__name__}")
            return None
        if stream is not None:
            return _stream_handle(stream)
        first = inputs[0] if inputs else None
        if first is not None and type(first).__module__.startswith("torch"):
            import torch
            return torch.cuda.current_stream().cuda_stream
        try:
            import cupy
            return cupy.cuda.get_current_stream().ptr
        except ImportError:
            return None

    def _warmed_up(self, method: str, args, kwargs, repeat, warmup) -> list:
        """The outputs a timing loop reuses, after `warmup` runs into them (the device
        synchronized); `repeat` and `warmup` checked for `method`'s message."""
        for name, value, least in (("repeat", repeat, 1), ("warmup", warmup, 0)):
            if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)) or value < least:
                raise ByocRuntimeError(f"{method}(): {name} must be an integer >= {least}, got {value!r}")
        outputs = self.run(*args, **kwargs)
        outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
        for _ in range(warmup):
            self.run(*args, out=outputs, **kwargs)
        self._synchronize()
        return outputs

    def benchmark(self, *args, repeat: int = 100, warmup: int = 10, **kwargs) -> float:
        """Mean milliseconds per run (inputs reused), measured with the device synchronized."""
        import time
        outputs = self._warmed_up("benchmark", args, kwargs, repeat, warmup)
        start = time.perf_counter()
        for _ in range(repeat):
            self.run(*args, out=outputs, **kwargs)
        self._synchronize()
        return (time.perf_counter() - start) * 1e3 / repeat

    def latencies(self, *args, repeat: int = 100, warmup: int = 10, **kwargs) -> list:
        """Milliseconds of each of `repeat` runs (inputs and outputs reused), each waited for
        before the next starts, as trtexec and onnxruntime's perf test time latency: for
        percentiles. benchmark() is the throughput view (runs queued back to back)."""
        import time
        outputs = self._warmed_up("latencies", args, kwargs, repeat, warmup)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            self.run(*args, out=outputs, **kwargs)
            self._synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        return times

    def _synchronize(self):
        if self.device == "cuda":
            try:
                import cupy
                cupy.cuda.runtime.deviceSynchronize()
            except ImportError:
                try:
                    import torch
                except ImportError:
                    raise ByocRuntimeError("synchronizing the GPU needs CuPy or torch; install byoc[cuda]") from None
                torch.cuda.synchronize()

    def synchronize(self):
        """Wait for the GPU work queued so far, then raise a byoc.RuntimeError if one of the
        finished runs met an error only its kernels could see (an out-of-range Gather index:
        clamped, never read outside the table, and its outputs are wrong). Without this,
        such an error is raised by the next run()."""
        self._synchronize()
        with self._run_lock:
            if self._handle is not None and hasattr(self._lib, "byoc_model_status"):
                if self._lib.byoc_model_status(self._handle) != 0:
                    raise ByocRuntimeError(self._error())

    def close(self):
        if getattr(self, "_handle", None) is None:
            return
        with self._run_lock:  # not while another thread's run() uses the model
            if self._handle is not None:
                self._lib.byoc_model_destroy(self._handle)
                self._handle = None
                _close_library(self._lib)  # a long-lived process loading many models keeps none

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _read_metadata(lib, path: str) -> dict:
    """The library's metadata JSON, checked against what this runtime reads from it: a
    corrupted or foreign file is a byoc.RuntimeError naming the key at fault."""
    lib.byoc_model_metadata.restype = ctypes.c_char_p
    raw = lib.byoc_model_metadata()
    name = os.path.basename(path)
    if raw is None:
        raise ByocRuntimeError(f"{name}: byoc_model_metadata() returned NULL; expected a JSON object")
    try:
        metadata = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ByocRuntimeError(f"{name}: its metadata is not valid UTF-8 JSON ({error}); the file is corrupted "
                               f"or not a byoc library: rebuild it") from None
    validate_metadata(metadata, name)
    return metadata


_TENSOR_DTYPES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"}


def validate_metadata(metadata, name: str = "library") -> None:
    """A byoc.RuntimeError naming the first key of `metadata` that is missing or not of the
    form byoc writes (format byoc-model version 1)."""
    def bad(key, expected, got):
        return ByocRuntimeError(f"{name}: metadata key {key!r} is {got!r}; expected {expected} (the library is "
                                f"corrupted or was not built by this byoc: rebuild it)")

    def field(where, key, kinds, expected):
        if not isinstance(where, dict) or key not in where:
            raise ByocRuntimeError(f"{name}: metadata has no key {key!r}; expected {expected} (the library is "
                                   f"corrupted or was not built by this byoc: rebuild it)")
        value = where[key]
        if not isinstance(value, kinds) or isinstance(value, bool):  # no field of it is a bool
            raise bad(key, expected, value)
        return value

    if not isinstance(metadata, dict):
        raise bad("(top level)", "a JSON object", type(metadata).__name__)
    if field(metadata, "format", str, "'byoc-model'") != "byoc-model":
        raise bad("format", "'byoc-model'", metadata["format"])
    if field(metadata, "version", int, "1") != 1:
        raise bad("version", "1 (this byoc reads version 1)", metadata["version"])
    field(metadata, "target", str, "a target string")
    for role in ("inputs", "outputs"):
        for index, tensor in enumerate(field(metadata, role, list, "a list of tensors")):
            key = f"{role}[{index}]"
            if not isinstance(tensor, dict):
                raise bad(key, "an object with name, shape and dtype", tensor)
            field(tensor, "name", str, f"{key}.name: a string")
            shape = field(tensor, "shape", list, f"{key}.shape: a list of dims")
            if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 63 for d in shape):
                raise bad(f"{key}.shape", "a list of non-negative int64 dims", shape)
            if field(tensor, "dtype", str, f"{key}.dtype") not in _TENSOR_DTYPES:
                raise bad(f"{key}.dtype", f"one of {sorted(_TENSOR_DTYPES)}", tensor["dtype"])
            if tensor.get("device", "cuda") not in ("cpu", "cuda"):
                raise bad(f"{key}.device", "'cpu' or 'cuda'", tensor["device"])
    weights = field(metadata, "weights", dict, "an object with bytes and location")
    if field(weights, "location", str, "weights.location") not in ("embedded", "sidecar"):
        raise bad("weights.location", "'embedded' or 'sidecar'", weights["location"])
    if field(weights, "bytes", int, "weights.bytes: an integer") < 0:
        raise bad("weights.bytes", "a non-negative integer", weights["bytes"])


SEAL_MAGIC = b"BYOCSEAL"
SEAL_BYTES = len(SEAL_MAGIC) + 32  # the magic, then the SHA-256 of every byte before it


def seal_library(path) -> None:
    """Appends the seal that load() checks before the dynamic loader sees the file: the
    SHA-256 of the whole library (ELF loaders ignore bytes after the ELF data). A damaged
    dynamic section or symbol table would crash the loader itself; with the seal, any
    changed byte is a clear error instead."""
    import hashlib
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    with open(path, "ab") as file:
        file.write(SEAL_MAGIC + digest.digest())


def _check_seal(path: str, size: int) -> None:
    import hashlib
    with open(path, "rb") as file:
        if size < SEAL_BYTES:
            raise ByocRuntimeError(f"cannot load {path}: not a byoc library (too short for its seal)")
        file.seek(size - SEAL_BYTES)
        trailer = file.read(SEAL_BYTES)
        if trailer[:len(SEAL_MAGIC)] != SEAL_MAGIC:
            raise ByocRuntimeError(f"cannot load {path}: not a byoc library, or one changed after the build "
                                   f"(strip, patchelf, a copy cut short): it does not end in byoc's seal; "
                                   f"rebuild it")
        file.seek(0)
        digest, left = hashlib.sha256(), size - SEAL_BYTES
        while left:
            block = file.read(min(left, 1 << 20))
            if not block:
                break
            digest.update(block)
            left -= len(block)
        if left or digest.digest() != trailer[len(SEAL_MAGIC):]:
            raise ByocRuntimeError(f"cannot load {path}: its bytes do not match the seal written at the build: the "
                                   f"file is corrupted or was changed after the build; rebuild it")


def _check_library_file(path: str) -> None:
    """Checks that `path` is a whole ELF shared object before the dynamic loader maps it: a
    FIFO or device would block or be read forever, and a truncated file maps pages past its
    end, which fault (SIGBUS) when the loader touches them."""
    import stat as stat_module
    import struct
    try:
        info = os.stat(path)
    except (OSError, ValueError) as error:
        raise ByocRuntimeError(f"cannot load {path}: {error}") from None
    if not stat_module.S_ISREG(info.st_mode):
        kind = "a directory" if stat_module.S_ISDIR(info.st_mode) else "not a regular file"
        raise ByocRuntimeError(f"cannot load {path}: it is {kind}; expected a byoc .so file")
    size = info.st_size

    def corrupt(why):
        return ByocRuntimeError(f"cannot load {path}: {why}; the file is truncated or corrupted "
                                f"(expected a whole ELF shared object as byoc builds it)")
    try:
        with open(path, "rb") as file:
            header = file.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF":
                raise ByocRuntimeError(f"cannot load {path}: not an ELF shared object (no ELF header); "
                                       f"expected a .so built by byoc")
            if header[4] != 2 or header[5] != (1 if sys.byteorder == "little" else 2):
                raise corrupt("its ELF class or byte order is not this machine's (64-bit, native)")
            endian = "<" if header[5] == 1 else ">"
            (e_type, _machine, _version, _entry, e_phoff, e_shoff, _flags, _ehsize, e_phentsize, e_phnum,
             e_shentsize, e_shnum, _shstrndx) = struct.unpack(endian + "HHIQQQIHHHHHH", header[16:64])
            if e_type != 3:
                raise ByocRuntimeError(f"cannot load {path}: ELF type {e_type} is not a shared object (3)")
            if e_phentsize != 56 or e_phnum == 0 or e_phoff + e_phnum * 56 > size:
                raise corrupt(f"its program headers ({e_phnum} at offset {e_phoff}) lie outside its {size} bytes")
            if e_shnum and (e_shentsize != 64 or e_shoff + e_shnum * 64 > size):
                raise corrupt(f"its section headers ({e_shnum} at offset {e_shoff}) lie outside its {size} bytes")
            file.seek(e_phoff)
            table = file.read(e_phnum * 56)
            for index in range(e_phnum):
                p_type, _flags, p_offset, _vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack_from(
                    endian + "IIQQQQQQ", table, index * 56)
                if p_type == 1 and p_offset + p_filesz > size:  # PT_LOAD: mapped from the file
                    raise corrupt(f"segment {index} needs bytes {p_offset}..{p_offset + p_filesz} of the file, "
                                  f"which has {size}")
            if e_shnum:
                file.seek(e_shoff)
                table = file.read(e_shnum * 64)
                for index in range(e_shnum):
                    (_name, sh_type, _flags, _addr, sh_offset, sh_size, *_rest) = struct.unpack_from(
                        endian + "IIQQQQIIQQ", table, index * 64)
                    if sh_type != 8 and sh_offset + sh_size > size:  # SHT_NOBITS takes no file bytes
                        raise corrupt(f"section {index} needs bytes {sh_offset}..{sh_offset + sh_size}, "
                                      f"beyond its {size}")
        _check_seal(path, size)
    except OSError as error:
        raise ByocRuntimeError(f"cannot load {path}: {error}") from None


def _cupy(purpose: str):
    try:
        import cupy
    except ImportError:
        raise ByocRuntimeError(f"{purpose} needs CuPy, which is not installed: install byoc[cuda] "
                               f"(cupy-cuda13x)") from None
    return cupy


def _stream_handle(stream) -> int:
    """The cudaStream_t of a stream object: a CuPy stream (.ptr), a torch stream
    (.cuda_stream), an object with __cuda_stream__ (the CUDA stream protocol), or 0 for the
    legacy default stream. A bare integer other than 0 is refused: the library would take
    any number for a stream and crash on one that is not; wrap a raw handle you own in
    cupy.cuda.ExternalStream(handle) or torch.cuda.ExternalStream(handle)."""
    if hasattr(stream, "__cuda_stream__"):
        try:
            _version, handle = stream.__cuda_stream__()
        except (TypeError, ValueError) as error:
            raise ByocRuntimeError(f"stream=: __cuda_stream__() of {type(stream).__name__} did not return "
                                   f"(version, handle): {error}") from None
    elif hasattr(stream, "ptr"):
        handle = stream.ptr
    elif hasattr(stream, "cuda_stream"):
        handle = stream.cuda_stream
    elif isinstance(stream, numbers.Integral) and not isinstance(stream, bool) and int(stream) == 0:
        return 0
    else:
        raise ByocRuntimeError(
            f"stream=: expected a CuPy or torch stream (or 0 for the legacy default stream), got "
            f"{type(stream).__name__} {stream!r}; wrap a raw cudaStream_t in cupy.cuda.ExternalStream(handle)")
    if not isinstance(handle, numbers.Integral) or not 0 <= int(handle) < 1 << 64:
        raise ByocRuntimeError(f"stream=: {type(stream).__name__} gave handle {handle!r}; expected a pointer")
    return int(handle)


def _checked_weights_path(path) -> str:
    """A sidecar path the C side can open: a regular file (a FIFO would block create()),
    with no NUL byte (C would read the path only up to it, and open another file)."""
    import stat as stat_module
    if not isinstance(path, (str, os.PathLike)):
        raise ByocRuntimeError(f"weights_path: expected a path to a .safetensors file, got {type(path).__name__}")
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\0" in text:
        raise ByocRuntimeError(f"weights_path {text!r} contains a NUL byte; expected a file path")
    try:
        info = os.stat(text)
    except OSError as error:
        raise ByocRuntimeError(f"weights file {text!r} cannot be read: {error.strerror or error}") from None
    if not stat_module.S_ISREG(info.st_mode):
        raise ByocRuntimeError(f"weights file {text!r} is not a regular file; expected the library's "
                               f".safetensors sidecar")
    return text


def _resolved(path) -> str:
    try:
        return str(Path(path).resolve(strict=True))
    except (OSError, RuntimeError, ValueError) as error:  # missing, a symlink loop, a NUL byte
        raise ByocRuntimeError(f"cannot load {path}: {error}") from None


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
    resolved = _resolved(path)
    _check_library_file(resolved)
    try:
        stat = os.stat(resolved)
        state = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        with _first_opened_lock:
            first = _first_opened.setdefault(resolved, state)
        if first == state:
            lib = ctypes.CDLL(resolved, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        else:
            lib = _open_private_copy(resolved)
    except (OSError, UnicodeDecodeError) as error:  # the loader's message may not be UTF-8
        raise ByocRuntimeError(f"cannot load {path}: {error}") from None
    missing = [name for name in _REQUIRED_SYMBOLS if not hasattr(lib, name)]
    if missing:
        _close_library(lib)
        raise ByocRuntimeError(f"{path}: not a byoc library: it has no {', '.join(missing)}")
    return lib


# What a byoc library exports (byoc_model.h); byoc_model_status is newer and optional.
_REQUIRED_SYMBOLS = ("byoc_model_metadata", "byoc_model_create", "byoc_model_run", "byoc_model_destroy",
                     "byoc_last_error")


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
    try:
        return _read_metadata(lib, str(path))
    finally:
        _close_library(lib)


def _close_library(lib: ctypes.CDLL) -> None:
    """Drops this CDLL's reference to the library (each CDLL is one dlopen; the library is
    unmapped when the last goes). Nothing may call into `lib` afterwards."""
    import _ctypes
    try:
        _ctypes.dlclose(lib._handle)
    except OSError:
        pass


def load(path, weights_path=None) -> Module:
    """Load a model library built by byoc."""
    return Module(path, weights_path)
