"""The caller's arrays as the C ABI's DLTensors: NumPy, CuPy and torch arrays read through
their array interfaces, anything else through DLPack (`__dlpack__`), each checked against
the model's dtype and shape; outputs returned through the caller's library; the stream a
caller's arrays run on."""
from __future__ import annotations

import ctypes
import numbers
import sys

import numpy as np

from ..errors import RuntimeError as ByocRuntimeError


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
    """For an input offered only through DLPack: its library's from_dlpack, so that outputs
    come back as the caller's kind; else None. The library is the array's Array API
    namespace (`__array_namespace__()`: jax.numpy for JAX arrays, whose class lives in
    jaxlib), else the module of its class, or that package's `numpy`."""
    if like is None or not _dlpack_only(like):
        return None
    namespace = None
    if callable(getattr(like, "__array_namespace__", None)):
        try:
            namespace = like.__array_namespace__()
        except Exception:  # noqa: BLE001 - a namespace that cannot be had: the module's below
            namespace = None
    module = sys.modules.get(type(like).__module__)
    root = sys.modules.get(type(like).__module__.split(".")[0])
    for candidate in (namespace, module, getattr(root, "numpy", None), root):
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
        device_id = _cuda_device_id(array, data) if device == _DEVICE_CUDA else 0
        self.tensor = _DLTensor(
            data=data, device=_DLDevice(device, device_id), ndim=len(shape), dtype=_DLDataType(code, bits, 1),
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


def _cuda_device_id(array, pointer: int) -> int:
    """The CUDA device an array with __cuda_array_interface__ lives on (the interface does
    not say): a CuPy array's (its MemoryPointer's device_id), else what the driver says of
    its pointer (through CuPy), else 0. The runtime refuses a tensor of another device than
    the model's."""
    device_id = getattr(getattr(array, "data", None), "device_id", None)
    if isinstance(device_id, int):
        return device_id
    if pointer:
        try:
            import cupy
            return int(cupy.cuda.runtime.pointerGetAttributes(pointer).device)
        except Exception:  # noqa: BLE001 - no CuPy, or a pointer the driver does not know
            pass
    return 0


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
