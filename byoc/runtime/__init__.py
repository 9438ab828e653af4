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
import math
import numbers
import os
import threading
from pathlib import Path

import numpy as np

from ..errors import RuntimeError as ByocRuntimeError
from ..ir.types import numpy_dtype
from .arrays import _DLTensor, _Prepared, _cupy, _dlpack_only, _dlpack_returner, _from_dlpack, _stream_handle
from .library_file import (SEAL_BYTES, SEAL_MAGIC, _check_path, _checked_weights_path, _close_library,  # noqa: F401
                           _open_library, _read_metadata, _resolved, embedded_weights, metadata_of, seal_library,
                           validate_metadata)

__all__ = ["load", "Module", "metadata_of", "seal_library", "embedded_weights", "validate_metadata", "SEAL_BYTES",
           "SEAL_MAGIC",
           "ByocRuntimeError", "C_ABI_HEADER", "INCLUDE_DIR"]

C_ABI_HEADER = Path(__file__).with_name("byoc_model.h")
# The runtime's C/C++ headers (byoc_model.h, byoc_float16.h): on the include path of the
# host code and of every CPU compile unit that converts 16-bit floats
INCLUDE_DIR = C_ABI_HEADER.parent


def model_runtime_sources(cuda: bool) -> list:
    """The static model runtime's sources (its interface to a model's generated host code
    is model_runtime.h); a cuda model's add the CUDA part."""
    return [INCLUDE_DIR / "model_runtime.cc", INCLUDE_DIR / "model_run.cc", INCLUDE_DIR / "model_program.cc",
            INCLUDE_DIR / "model_padding.cc"] + \
        ([INCLUDE_DIR / "model_runtime_cuda.cc"] if cuda else [])


class Module:
    """A loaded model: run() it as often as you like; close() (or garbage collection)
    frees its memory. One Module runs one call at a time: its intermediate tensors live in
    one arena, so run() calls from several threads take turns (a lock; ctypes releases the
    GIL, and two runs at once would overwrite each other's intermediates). On the cuda
    target run() returns once the work is queued on its stream: runs queued on different
    streams must be ordered by the caller (or use one Module per stream)."""

    def __init__(self, path, weights_path=None, device=None):
        self._run_lock = threading.Lock()
        self.path = _resolved(_check_path(path))
        self._handle = None
        if device is not None and (not isinstance(device, numbers.Integral) or isinstance(device, (bool, np.bool_))
                                   or device < 0):
            raise ByocRuntimeError(f"device={device!r}: expected a CUDA device number >= 0, or None for the "
                                   f"current device")
        # the CUDA device the model runs on (None: the calling thread's current one at load)
        self.device_id = None if device is None else int(device)
        self._lib = _open_library(self.path)
        try:
            self._create(weights_path)
        except BaseException:
            _close_library(self._lib)  # a refused library stays mapped in no process
            raise

    def _create_model(self, weights_path) -> ctypes.c_void_p:
        """A new native model with the weights of `weights_path` (None: the library's own) on
        this module's device; a byoc.RuntimeError with the library's reason when it refuses."""
        lib = self._lib
        handle = ctypes.c_void_p()
        path_arg = str(weights_path).encode() if weights_path is not None else None
        if hasattr(lib, "byoc_model_create_on_device"):
            status = lib.byoc_model_create_on_device(ctypes.byref(handle), path_arg,
                                                     -1 if self.device_id is None else self.device_id)
        elif self.device_id is not None:
            raise ByocRuntimeError(f"{os.path.basename(self.path)} was built before libraries took a device; "
                                   f"device={self.device_id} cannot be honored: rebuild it (or load it without device=)")
        else:
            status = lib.byoc_model_create(ctypes.byref(handle), path_arg)
        if status != 0:
            raise ByocRuntimeError(f"{os.path.basename(self.path)}: {self._error()}")
        return handle

    def _create(self, weights_path):
        lib = self._lib
        lib.byoc_model_metadata.restype = ctypes.c_char_p
        lib.byoc_last_error.restype = ctypes.c_char_p
        lib.byoc_model_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        if hasattr(lib, "byoc_model_create_on_device"):  # libraries built before it lack it
            lib.byoc_model_create_on_device.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                                        ctypes.c_int32]
        lib.byoc_model_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DLTensor), ctypes.c_int32,
                                       ctypes.POINTER(_DLTensor), ctypes.c_int32, ctypes.c_void_p]
        lib.byoc_model_destroy.argtypes = [ctypes.c_void_p]
        if hasattr(lib, "byoc_model_status"):  # libraries built before it lack it
            lib.byoc_model_status.argtypes = [ctypes.c_void_p]
        if hasattr(lib, "byoc_model_arch"):  # libraries built before it lack it
            lib.byoc_model_arch.argtypes = [ctypes.c_void_p]
        self.metadata = _read_metadata(lib, self.path)
        if weights_path is None and self.metadata["weights"]["location"] == "sidecar":
            weights_path = os.path.splitext(self.path)[0] + ".safetensors"
        if weights_path is not None:
            self._check_weights_honored(weights_path)
        if weights_path is not None:
            weights_path = _checked_weights_path(weights_path)
        self._handle = self._create_model(weights_path)
        self.device = "cuda" if self.metadata["target"].startswith("cuda") else "cpu"
        if self.device_id is None and self.device == "cuda":
            # the model lives on the device that was current at load: runs launch there
            # (the runtime's), and so do its outputs, default stream and load_weights
            self.device_id = _current_cuda_device()
        self.input_names = [t["name"] for t in self.metadata["inputs"]]
        self.output_names = [t["name"] for t in self.metadata["outputs"]]
        self._input_dtypes = [t["dtype"] for t in self.metadata["inputs"]]
        self._output_dtypes = [t["dtype"] for t in self.metadata["outputs"]]
        # A library with shape buckets holds a program per bucket: run() takes the one whose
        # input shapes the inputs have (a static library: one, the metadata's own).
        self.variants = self.metadata.get("variants") or [
            {"dims": {}, "inputs": self.metadata["inputs"], "outputs": self.metadata["outputs"]}]

    def _variant_for(self, inputs) -> tuple:
        """(the variant run() takes for `inputs`, the shapes of its inputs and outputs in that
        run): the one whose
        input shapes they have, else the smallest one they fit padded (as the runtime picks:
        least input bytes); a library of one takes any (the runtime's checks name a wrong
        shape)."""
        def output_shapes(variant, sizes):
            return [[extent // variant["dims"][dim] * sizes[dim] if dim else extent
                     for extent, dim in zip(t["shape"], t.get("axis_dims") or [None] * len(t["shape"]))]
                    for t in variant["outputs"]]
        if len(self.variants) == 1:
            return self.variants[0], *self._declared_shapes(self.variants[0])
        shapes = [tuple(getattr(array, "shape", ())) for array in inputs]
        for variant in self.variants:
            if shapes == [tuple(t["shape"]) for t in variant["inputs"]]:
                return variant, *self._declared_shapes(variant)
        best = None
        for variant in self.variants:
            sizes = _padded_sizes(variant, shapes)
            if sizes is not None:
                cost = sum(int(np.prod(t["shape"])) * numpy_dtype(t["dtype"]).itemsize for t in variant["inputs"])
                if best is None or cost < best[0]:
                    best = (cost, variant, sizes)
        if best is not None:
            return best[1], shapes, output_shapes(best[1], best[2])
        given = ", ".join(f"{name} {shape}" for name, shape in zip(self.input_names, shapes))
        buckets = "; ".join(", ".join(f"{t['name']} {tuple(t['shape'])}" for t in variant["inputs"])
                            for variant in self.variants)
        padded = ", ".join(f"{name} from {dim['range'][0]} to {dim['range'][1]}"
                           for name, dim in sorted((self.metadata.get("dims") or {}).items()) if dim.get("range"))
        if padded:
            raise ByocRuntimeError(f"the inputs' shapes ({given}) fit none of the shapes this model was built for: "
                                   f"{buckets} (padded: {padded})")
        raise ByocRuntimeError(f"the inputs' shapes ({given}) are none of the shapes this model was built for: "
                               f"{buckets}")

    @staticmethod
    def _declared_shapes(variant: dict) -> tuple:
        return [t["shape"] for t in variant["inputs"]], [t["shape"] for t in variant["outputs"]]

    def _check_weights_honored(self, weights_path):
        """A weights file given for a library that embeds its weights replaces them (new
        weights of the same program, from `byoc refit`); a library built before weights
        files carried a program id would ignore it: say so rather than run other weights."""
        if not self.metadata.get("program_id") and self.metadata["weights"]["location"] != "sidecar":
            raise ByocRuntimeError(f"{os.path.basename(self.path)} embeds its weights and was built before libraries "
                                   f"took new weights; weights_path={str(weights_path)!r} would be ignored: rebuild it")

    def load_weights(self, weights_path):
        """Run with the weights in `weights_path` from now on: a weights file of this
        library's program (`byoc refit` writes one from new weights; another build of the
        same model and config writes one as its sidecar). The model is created anew with
        them (both sets of weights are in memory for that moment), then the old one freed;
        a file the library refuses (another program, a wrong checksum) raises and leaves the
        module running with its weights. Runs queued on the GPU are finished first (they read
        the old weights and memory)."""
        self._check_weights_honored(weights_path)
        weights_path = _checked_weights_path(weights_path)
        with self._run_lock:
            if self._handle is None:
                raise ByocRuntimeError("this module was closed")
            handle = self._create_model(weights_path)
            old, self._handle = self._handle, handle
            self._lib.byoc_model_destroy(old)

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

    def _allocate_outputs(self, like, specs):
        outputs = []
        for spec in specs:
            try:
                outputs.append(self._allocate_output(like, spec))
            except MemoryError as error:  # NumPy's, torch's (a RuntimeError subclass) or CuPy's
                size = math.prod(spec["shape"]) * numpy_dtype(spec["dtype"]).itemsize
                raise ByocRuntimeError(f"output {spec.get('name', '?')!r} of shape {tuple(spec['shape'])} "
                                       f"({spec['dtype']}, {size} bytes) could not be allocated: {error}; pass out= "
                                       f"arrays, or run on a device with the memory") from None
        return outputs

    def _allocate_output(self, like, spec):
        dtype = numpy_dtype(spec["dtype"])
        on_host = self.device == "cpu" or spec.get("device") == "cpu"
        if on_host and _torch_cpu_tensor(like) and spec["dtype"] != "bfloat16":
            # a torch caller on the cpu gets torch tensors (NumPy has no bfloat16 view of one)
            import torch
            return torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]))
        if on_host:
            # an output PlanDevices delivers in host memory ("device": "cpu") is a NumPy array
            return np.empty(spec["shape"], dtype=dtype)
        if type(like).__module__.startswith("torch"):
            import torch
            return torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]), device=like.device)
        cupy = _cupy("allocating the outputs (pass torch tensors, or out= arrays)")
        if self.device_id is None:
            return cupy.empty(spec["shape"], dtype=dtype)
        with cupy.cuda.Device(self.device_id):
            return cupy.empty(spec["shape"], dtype=dtype)

    def run(self, *args, out=None, stream=None, **kwargs):
        """Run once. Returns one array, or a tuple when the model has several outputs."""
        if self._handle is None:
            raise ByocRuntimeError("this module was closed")
        inputs = given = self._order_inputs(args, kwargs)
        if len(self.variants) > 1:  # the shapes choose the program: a DLPack-only tensor shows its shape once taken
            inputs = [_from_dlpack(a, f"input {n!r}") if _dlpack_only(a) else a for a, n in zip(inputs, self.input_names)]
        variant, input_shapes, output_shapes = self._variant_for(inputs)
        prepared_inputs = [_Prepared(a, f"input {n!r}", d, expected_shape=tuple(shape))
                           for a, n, d, shape in zip(inputs, self.input_names, self._input_dtypes, input_shapes)]
        outputs = self._caller_outputs(out) if out is not None else self._allocate_outputs(
            inputs[0] if inputs else None, [{**t, "shape": shape} for t, shape in zip(variant["outputs"], output_shapes)])
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
            returner = _dlpack_returner(given[0] if given else None)
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
        # the current stream of the model's device (each device has its own)
        first = inputs[0] if inputs else None
        if first is not None and type(first).__module__.startswith("torch"):
            import torch
            return torch.cuda.current_stream(self.device_id).cuda_stream
        try:
            import cupy
        except ImportError:
            return None
        if self.device_id is None:
            return cupy.cuda.get_current_stream().ptr
        with cupy.cuda.Device(self.device_id):
            return cupy.cuda.get_current_stream().ptr

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
            except ImportError:
                try:
                    import torch
                except ImportError:
                    raise ByocRuntimeError("synchronizing the GPU needs CuPy or torch; install byoc[cuda]") from None
                torch.cuda.synchronize(self.device_id)
                return
            if self.device_id is None:
                cupy.cuda.runtime.deviceSynchronize()
            else:
                with cupy.cuda.Device(self.device_id):
                    cupy.cuda.runtime.deviceSynchronize()

    @property
    def arch(self) -> str | None:
        """The arch whose kernels this module runs ("sm_90"): of a library built for several
        (config `arch`), the one chosen for its device; None on the cpu."""
        if self.device != "cuda":
            return None
        if not hasattr(self._lib, "byoc_model_arch"):
            return self.metadata.get("arch")
        return f"sm_{self._lib.byoc_model_arch(self._handle)}"

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


def _current_cuda_device():
    """The calling thread's current CUDA device as CuPy or torch (if loaded) sees it, else None."""
    try:
        import cupy
        return int(cupy.cuda.runtime.getDevice())
    except Exception:  # noqa: BLE001 - no CuPy: torch's view, if torch is in use
        import sys
        torch = sys.modules.get("torch")
        try:
            return int(torch.cuda.current_device()) if torch is not None else None
        except Exception:  # noqa: BLE001
            return None


def _torch_cpu_tensor(array) -> bool:
    return type(array).__module__.startswith("torch") and not getattr(array, "is_cuda", True)


def load(path, weights_path=None, device=None) -> Module:
    """Load a model library built by byoc. `weights_path`: a weights file of its program
    (default: the library's own weights; its .safetensors sidecar beside it when it was
    built with params: sidecar), e.g. one `byoc refit` wrote. `device`: the CUDA device it
    runs on (None: the calling thread's current device); its inputs, outputs and stream
    must be that device's."""
    return Module(path, weights_path, device)


def _padded_sizes(variant: dict, shapes: list) -> dict | None:
    """The sizes of the padded dims that input `shapes` imply for `variant` (its axis_dims),
    or None where they do not fit it (the runtime's rule, model_padding.cc: fits)."""
    sizes = {}
    if len(shapes) != len(variant["inputs"]):
        return None
    for tensor, shape in zip(variant["inputs"], shapes):
        declared = tensor["shape"]
        if len(shape) != len(declared):
            return None
        for extent, size, dim in zip(shape, declared, tensor.get("axis_dims") or [None] * len(declared)):
            if dim is None:
                if extent != size:
                    return None
                continue
            factor = size // variant["dims"][dim]
            if factor < 1 or not 1 <= extent <= size or extent % factor or sizes.setdefault(dim, extent // factor) != extent // factor:
                return None
    return {**variant["dims"], **sizes}
