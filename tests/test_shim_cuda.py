"""Tests of the CUDA shim (backends/builtin/shim/cuda/): every function of byoc_shim.h.

Without a GPU (CI): every .cu compiles for sm_90 and sm_80 with host warnings as errors.
With one (`pytest -m gpu`, skipped otherwise): the sources are built once per session
into a shared library (nvcc -shared, cuBLASLt), loaded with ctypes and called on cupy
device buffers on the current cupy stream, against the NumPy references of byoc/ops
(`get_op(name).reference`). Data movement must match bit for bit; arithmetic within a
tolerance per dtype (the GPU sums in a different order than NumPy).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import pathlib
import subprocess

import numpy as np
import pytest

import byoc  # noqa: F401  (registers the ops)
from byoc.ir import get_op
from byoc.toolchain.locate import cuda_home, cuda_include_dirs, cuda_link_flags, find_cxx
from shim_abi import BF16, DTYPE_CODES, FLOATS, I64, INT, SIZE, TOLERANCES  # the shim ABI (tests/shim_abi.py)
from shim_abi import SIGNATURES as CPU_SIGNATURES
from shim_abi import (ACTIVATIONS, SQUEEZE_EXCITATION_CASES, squeeze_excitation_inputs,
                      squeeze_excitation_reference)
from gpu_probe import gpu_present

SHIM_DIR = pathlib.Path(__file__).resolve().parent.parent / "backends" / "builtin" / "shim"
CUDA_DIR = SHIM_DIR / "cuda"
CUDA_SOURCES = sorted(CUDA_DIR.glob("*.cu"))
ARCHES = ("sm_90", "sm_80")


def needs_nvcc(test):
    """Compiles CUDA with nvcc (marked nvcc: minutes on 2 cores with an empty object cache;
    `-m "not nvcc"` leaves these out); skipped where nvcc is not installed."""
    return pytest.mark.nvcc(pytest.mark.skipif(cuda_home() is None, reason="nvcc not installed")(test))


def nvcc_command(source: pathlib.Path, output: pathlib.Path, arches=ARCHES) -> list[str]:
    command = [str(cuda_home() / "bin" / "nvcc"), "-std=c++17", "-O3", "-Xcompiler", "-fPIC,-Wall,-Wextra,-Werror",
               "-Werror", "all-warnings"]
    for arch in arches:
        number = arch.split("_")[1]
        command += ["-gencode", f"arch=compute_{number},code=sm_{number}"]
    for include in cuda_include_dirs():
        command += ["-I", str(include)]
    return command + ["-c", str(source), "-o", str(output)]


def compile_all(directory: pathlib.Path, arches=ARCHES) -> list[pathlib.Path]:
    """Compiles every .cu (one nvcc per file, in parallel); returns the objects."""
    def compile_one(source):
        output = directory / f"{source.stem}.o"
        result = subprocess.run(nvcc_command(source, output, arches), capture_output=True, text=True)
        return source, output, result

    objects = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(CUDA_SOURCES) or 1) as pool:
        for source, output, result in pool.map(compile_one, CUDA_SOURCES):
            assert result.returncode == 0, f"{source.name}:\n{result.stdout}\n{result.stderr}"
            assert "warning" not in (result.stdout + result.stderr).lower(), result.stdout + result.stderr
            objects.append(output)
    return objects


@needs_nvcc
def test_cuda_shim_compiles_for_sm90_and_sm80(tmp_path):
    assert CUDA_SOURCES, "no .cu files in backends/builtin/shim/cuda"
    objects = compile_all(tmp_path)
    symbols = subprocess.run(["nm", "--defined-only", *map(str, objects)], capture_output=True, text=True).stdout
    header = (SHIM_DIR / "byoc_shim.h").read_text()
    # Every function the header declares is defined (and exported with C linkage).
    declared = {line.split("(")[0].split()[-1].lstrip("*") for line in header.splitlines()
                if "byoc_shim_" in line and "(" in line and not line.lstrip().startswith(("*", "/*"))}
    for name in declared:
        assert f" T {name}\n" in symbols, f"{name} is declared in byoc_shim.h but not defined"


# ================================================================= the GPU library

def gpu_available() -> bool:
    return gpu_present()  # the driver's answer (tests/gpu_probe.py)


# The CUDA shim's entry points: the CPU shim's and the GEMM heuristic's count.
SIGNATURES = {**CPU_SIGNATURES,
              "byoc_shim_matmul_heuristic_count": [INT, I64, I64, I64, I64, INT, INT, I64, I64, I64, SIZE]}
NO_STREAM = ("byoc_shim_conv2d_workspace", "byoc_shim_matmul_heuristic_count")


class Shim:
    """The loaded library: shim.<name without byoc_shim_>(...) calls a function on the
    current cupy stream and returns its code; `check` asserts success."""

    def __init__(self, library: ctypes.CDLL, cupy):
        self.library, self.cupy = library, cupy
        for name, argtypes in SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes = argtypes
            function.restype = SIZE if name.endswith("_workspace") else INT
        library.byoc_shim_last_error.restype = ctypes.c_char_p
        library.byoc_shim_last_error.argtypes = []

    def __getattr__(self, name):
        full = f"byoc_shim_{name}"
        function = getattr(self.library, full)
        if full in NO_STREAM:
            return function
        return lambda *args: function(*args, self.cupy.cuda.get_current_stream().ptr)

    def last_error(self) -> str:
        return self.library.byoc_shim_last_error().decode()

    def check(self, code):
        assert code == 0, self.last_error()

    def expect_error(self, code, function, *fragments):
        assert code != 0
        message = self.last_error()
        assert f"byoc_shim_{function}" in message, message
        for fragment in fragments:
            assert fragment in message, message


@pytest.fixture(scope="session")
def cupy():
    if not gpu_available():
        pytest.skip("no GPU (cupy with a visible device is needed)")
    import cupy
    return cupy


@pytest.fixture(scope="session")
def shim(cupy, tmp_path_factory) -> Shim:
    if cuda_home() is None:
        pytest.skip("nvcc is not installed")
    build = tmp_path_factory.mktemp("shim_cuda")
    objects = compile_all(build, arches=("sm_90",))  # the lent GPU is an H100
    library = build / "libbyoc_shim_cuda.so"
    # Linked as the toolchain links a model: the host compiler, static cudart, cuBLASLt.
    link = [find_cxx(), "-shared", "-o", str(library), *map(str, objects), *cuda_link_flags(["-lcublasLt"])]
    result = subprocess.run(link, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return Shim(ctypes.CDLL(str(library)), cupy)


class Device:
    """Host arrays <-> raw device buffers (bytes), so that every dtype (bfloat16, bool,
    odd-sized void) travels the same way. Buffers stay alive while this object does."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.buffers = []

    def put(self, array) -> int | None:
        if array is None:
            return None
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        buffer = self.cupy.asarray(raw) if raw.size else self.cupy.zeros(256, self.cupy.uint8)
        self.buffers.append(buffer)
        return buffer.data.ptr

    def empty(self, shape, dtype, fill=0) -> tuple[int, tuple]:
        """A device buffer of shape/dtype filled with `fill` (so untouched cells show)."""
        host = np.full(shape, fill, dtype=dtype)
        pointer = self.put(host)
        return pointer, (self.buffers[-1], tuple(shape), np.dtype(dtype))

    def get(self, handle) -> np.ndarray:
        buffer, shape, dtype = handle
        self.cupy.cuda.get_current_stream().synchronize()
        count = int(np.prod(shape, dtype=np.int64))
        return buffer.get()[:count * dtype.itemsize].view(dtype).reshape(shape)


@pytest.fixture
def dev(cupy):
    return Device(cupy)


# ---------------------------------------------------------------- helpers

rng = np.random.default_rng(4321)


def npdtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def random(shape, dtype="float32", low=-5, high=6):
    dtype = npdtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(max(low, 0) if dtype.kind == "u" else low, high, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def code(dtype) -> int:
    return DTYPE_CODES[np.dtype(dtype)]


def int64s(values):
    values = list(values) or [0]
    return (ctypes.c_int64 * len(values))(*values)


def assert_close(actual, expected, dtype=None, atol_scale=1.0):
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    name = str(dtype or actual.dtype)
    if name in TOLERANCES:
        rtol, atol = TOLERANCES[name]
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol,
                                   atol=atol * atol_scale)
    else:
        np.testing.assert_array_equal(actual, expected)


def assert_same_bits(actual, expected):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert actual.tobytes() == expected.tobytes()


def view_arguments(base: np.ndarray, view: np.ndarray):
    """(in_offset, in_strides) in elements of a NumPy view of `base`."""
    itemsize = base.itemsize
    offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // itemsize
    return offset, [s // itemsize for s in view.strides]


gpu = pytest.mark.gpu

# ---------------------------------------------------------------- copy_strided, tile, trilu

MOVE_DTYPES = ["float32", "float16", "bfloat16", "int64", "int8", "bool"]


@gpu
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_copy_strided_transpose_broadcast_slice(shim, dev, dtype):
    x = random((2, 3, 5), dtype)
    big = random((6, 8, 64), dtype)  # wide enough rows for the vectorized (16-byte) path
    cases = [
        (x, get_op("transpose").reference(x, axes=(2, 0, 1)), np.transpose(x, (2, 0, 1))),
        (x, get_op("broadcast_to").reference(x[:, :1], shape=(4, 2, 3, 5)), np.broadcast_to(x[:, :1], (4, 2, 3, 5))),
        # Negative steps: a reversed slice reads backwards from an offset.
        (x, get_op("strided_slice").reference(x, begin=(-1, 2, 4), end=(-2**63, 0, 0), axes=(), strides=(-1, -2, -3)),
         x[::-1, 2:0:-2, 4:0:-3]),
        (big, np.ascontiguousarray(big[1:5, ::2, 16:48]), big[1:5, ::2, 16:48]),
        (big, np.ascontiguousarray(big[:, 3:, 1:63]), big[:, 3:, 1:63]),  # misaligned start: narrower words
        (big, np.ascontiguousarray(big[::-1, :, :]), big[::-1, :, :]),
        (big, np.ascontiguousarray(big.transpose(2, 0, 1)), big.transpose(2, 0, 1)),
    ]
    for base, expected, view in cases:
        source = dev.put(base)
        out, handle = dev.empty(expected.shape, base.dtype)
        offset, strides = view_arguments(base, view)
        shim.check(shim.copy_strided(source, out, base.itemsize, expected.ndim, int64s(expected.shape), offset,
                                     int64s(strides), None))
        assert_same_bits(dev.get(handle), expected)


@gpu
def test_copy_strided_concat_with_out_strides(shim, dev):
    a, b = random((3, 2, 4)), random((3, 5, 4))
    expected = get_op("concat").reference(a, b, axis=1)
    out, handle = dev.empty(expected.shape, np.float32)
    out_strides = [s // 4 for s in expected.strides]
    for part, start in ((a, 0), (b, 2)):
        shim.check(shim.copy_strided(dev.put(part), out + start * out_strides[1] * 4, 4, 3, int64s(part.shape), 0,
                                     int64s([s // 4 for s in part.strides]), int64s(out_strides)))
    assert_same_bits(dev.get(handle), expected)


@gpu
def test_copy_strided_scalar_odd_element_size_and_empty(shim, dev):
    x = np.frombuffer(bytes(range(36)), dtype="V3").reshape(3, 4)  # 3-byte elements
    expected = np.ascontiguousarray(x.T)
    out, handle = dev.empty(expected.shape, expected.dtype)
    shim.check(shim.copy_strided(dev.put(x), out, 3, 2, int64s((4, 3)), 0, int64s((1, 4)), None))
    assert dev.get(handle).tobytes() == expected.tobytes()
    scalar = np.array([1.0, 7.5], np.float64)
    target, handle = dev.empty((1,), np.float64)
    shim.check(shim.copy_strided(dev.put(scalar), target, 8, 0, None, 1, None, None))
    assert dev.get(handle)[0] == 7.5
    shim.check(shim.copy_strided(None, None, 4, 2, int64s((0, 3)), 0, int64s((3, 1)), None))  # nothing to copy


@gpu
def test_copy_strided_errors(shim, dev):
    x = dev.put(np.zeros(4, np.float32))
    shim.expect_error(shim.copy_strided(x, x, 4, 9, int64s([1] * 9), 0, int64s([1] * 9), None), "copy_strided", "ndim")
    shim.expect_error(shim.copy_strided(x, x, 4, 1, int64s([-1]), 0, int64s([1]), None), "copy_strided", "shape[0]")
    shim.expect_error(shim.copy_strided(None, x, 4, 1, int64s([4]), 0, int64s([1]), None), "copy_strided", "in")
    shim.expect_error(shim.copy_strided(x, x, 0, 1, int64s([4]), 0, int64s([1]), None), "copy_strided", "elem_size")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bool"])
@pytest.mark.parametrize("shape, repeats", [((2, 1, 3), (2, 3, 1)), ((1,), (5,)), ((3, 2), (1, 3)), ((2, 3), (0, 2)),
                                            ((2, 16), (3, 2))])
def test_tile(shim, dev, dtype, shape, repeats):
    x = random(shape, dtype)
    expected = get_op("tile").reference(x, repeats=repeats)
    out, handle = dev.empty(expected.shape, x.dtype)
    shim.check(shim.tile(dev.put(x), out, x.itemsize, x.ndim, int64s(shape), int64s(repeats)))
    assert_same_bits(dev.get(handle), expected)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float64"])
@pytest.mark.parametrize("shape", [(2, 4, 5), (5, 3), (1, 1), (3, 37, 41)])
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("k", [-2, 0, 1, 7])
def test_trilu(shim, dev, dtype, shape, upper, k):
    x = random(shape, dtype)
    expected = get_op("trilu").reference(x, upper=upper, k=k)
    out, handle = dev.empty(x.shape, x.dtype, 3)
    batch = int(np.prod(shape[:-2]))
    shim.check(shim.trilu(dev.put(x), out, x.itemsize, batch, shape[-2], shape[-1], int(upper), k))
    assert_same_bits(dev.get(handle), expected)


# ---------------------------------------------------------------- gather, gather_elements

@gpu
@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "int8"])
def test_gather(shim, dev, index_dtype, axis, dtype):
    data = random((3, 5, 8), dtype)
    size = data.shape[axis]
    indices = rng.integers(-size, size, size=(2, 3)).astype(index_dtype)
    indices[0, 0] = -size  # the most negative index is still in range
    expected = get_op("gather").reference(data, indices, axis=axis)
    out, handle = dev.empty(expected.shape, data.dtype)
    outer, inner = int(np.prod(data.shape[:axis])), int(np.prod(data.shape[axis + 1:]))
    shim.check(shim.gather(dev.put(data), dev.put(indices), out, data.itemsize, code(index_dtype), outer, size, inner,
                           indices.size))
    assert_same_bits(dev.get(handle), expected)


@gpu
def test_gather_errors(shim, dev):
    data, indices, out = dev.put(random((3, 4))), dev.put(np.array([0, 1], np.int64)), dev.put(np.zeros(6, np.float32))
    shim.expect_error(shim.gather(data, indices, out, 4, code("float32"), 3, 4, 1, 2), "gather", "index_dtype")
    shim.expect_error(shim.gather(data, indices, out, 4, code("int64"), -1, 4, 1, 2), "gather", "outer")
    shim.expect_error(shim.gather(data, indices, out, 4, code("int64"), 3, 0, 1, 2), "gather", "out of range")


@gpu
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float64"])
def test_gather_elements(shim, dev, axis, index_dtype, dtype):
    data = random((4, 5, 3), dtype)
    shape = [2, 4, 3]  # smaller than data off the axis: the reference crops
    shape[axis] = 6
    size = data.shape[axis]
    indices = rng.integers(-size, size, size=shape).astype(index_dtype)
    expected = get_op("gather_elements").reference(data, indices, axis=axis)
    out, handle = dev.empty(expected.shape, data.dtype)
    shim.check(shim.gather_elements(dev.put(data), dev.put(indices), out, data.itemsize, code(index_dtype), 3,
                                    int64s(data.shape), int64s(shape), axis))
    assert_same_bits(dev.get(handle), expected)


@gpu
def test_gather_elements_errors(shim, dev):
    data, indices, out = dev.put(random((3, 4))), dev.put(np.zeros((3, 4), np.int64)), dev.put(np.zeros(12, np.float32))
    shim.expect_error(shim.gather_elements(data, indices, out, 4, code("int64"), 2, int64s((3, 4)), int64s((3, 5)), 0),
                      "gather_elements", "shape[1]")
    shim.expect_error(shim.gather_elements(data, indices, out, 4, code("int64"), 2, int64s((3, 4)), int64s((3, 4)), 2),
                      "gather_elements", "axis")


# ---------------------------------------------------------------- pad

PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2}


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "uint8", "bool"])
@pytest.mark.parametrize("mode", list(PAD_MODES))
@pytest.mark.parametrize("pads", [(1, 0, 2, 2, 3, 1), (0, -1, 2, -1, 2, 0), (2, 1, 0, 0, 0, 3)])
def test_pad(shim, dev, dtype, mode, pads):
    x = random((3, 4, 5), dtype)
    value = 2.5 if npdtype(dtype).kind == "f" else 7.0
    expected = get_op("pad").reference(x, pads=pads, mode=mode, value=value)
    out, handle = dev.empty(expected.shape, x.dtype)
    shim.check(shim.pad(dev.put(x), out, code(x.dtype), 3, int64s(x.shape), int64s(pads[:3]), int64s(pads[3:]),
                        PAD_MODES[mode], value))
    assert_same_bits(dev.get(handle), expected)


@gpu
def test_pad_errors(shim, dev):
    x, out = dev.put(random((2, 3))), dev.put(np.zeros(100, np.float32))
    shim.expect_error(shim.pad(x, out, 0, 2, int64s((2, 3)), int64s((0, 3)), int64s((0, 0)), 1, 0.0), "pad", "reflect")
    shim.expect_error(shim.pad(x, out, 0, 2, int64s((2, 3)), int64s((-2, 0)), int64s((-1, 0)), 0, 0.0), "pad", "crop")
    shim.expect_error(shim.pad(x, out, 0, 2, int64s((2, 3)), int64s((0, 0)), int64s((0, 0)), 3, 0.0), "pad", "mode")


# ---------------------------------------------------------------- cumsum

@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64", "int8"])
@pytest.mark.parametrize("shape, axis", [((3, 7, 4), 0), ((3, 7, 4), 1), ((3, 7, 4), 2), ((2, 3000), 1),
                                         ((1, 5000), 1)])
@pytest.mark.parametrize("exclusive, reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_cumsum(shim, dev, dtype, shape, axis, exclusive, reverse):
    x = random(shape, dtype, low=-100, high=100)  # int8 sums wrap around
    expected = get_op("cumsum").reference(x, axis=axis, exclusive=exclusive, reverse=reverse)
    out, handle = dev.empty(x.shape, x.dtype)
    outer, inner = int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis + 1:]))
    shim.check(shim.cumsum(dev.put(x), out, code(x.dtype), outer, x.shape[axis], inner, int(exclusive), int(reverse)))
    # Long float scans add in a different order (tiles, then a carry): errors grow with n.
    assert_close(dev.get(handle), expected, dtype, atol_scale=np.sqrt(x.shape[axis]))


# ---------------------------------------------------------------- reductions

REDUCE_KINDS = {"sum": 0, "mean": 1, "max": 2, "min": 3, "prod": 4}


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8"])
@pytest.mark.parametrize("kind", list(REDUCE_KINDS))
@pytest.mark.parametrize("shape", [(3, 17, 5), (1, 300, 1), (4, 1, 3), (2, 0, 3), (1, 9, 301), (37, 100, 1),
                                   (3, 9000, 1), (2, 2000, 33), (3, 0, 1), (1, 7000, 3), (1, 3000, 64),
                                   (1, 5, 2)])
def test_reduce(shim, dev, dtype, kind, shape):
    if kind == "prod":
        x = rng.uniform(0.99, 1.01, size=shape).astype(npdtype(dtype)) if dtype in FLOATS else random(shape, dtype, -3, 4)
    else:
        x = random(shape, dtype, -50, 50)
    expected = get_op(kind).reference(x, axes=(1,), keepdims=False)
    out, handle = dev.empty(expected.shape, x.dtype, 9)
    shim.check(shim.reduce(dev.put(x), out, code(x.dtype), REDUCE_KINDS[kind], *shape))
    scale = np.sqrt(shape[1]) if kind in ("sum", "prod") else 1.0
    assert_close(dev.get(handle), expected, dtype, atol_scale=max(scale, 1.0) * (10 if kind == "sum" else 1))


@gpu
def test_reduce_nan_and_negative_mean(shim, dev):
    x = np.array([[1.0, np.nan, 3.0], [2.0, -1.0, np.inf]], np.float32)
    for kind in ("max", "min"):
        out, handle = dev.empty((2,), np.float32)
        shim.check(shim.reduce(dev.put(x), out, 0, REDUCE_KINDS[kind], 2, 3, 1))
        np.testing.assert_array_equal(dev.get(handle), get_op(kind).reference(x, axes=(1,), keepdims=False))
    ints = np.array([[-7, 0, 0], [7, 1, 0]], np.int32)  # means -7/3 and 8/3 truncate toward zero
    out, handle = dev.empty((2,), np.int32)
    shim.check(shim.reduce(dev.put(ints), out, code(np.int32), 1, 2, 3, 1))
    np.testing.assert_array_equal(dev.get(handle), get_op("mean").reference(ints, axes=(1,), keepdims=False))


@gpu
def test_reduce_errors(shim, dev):
    x = dev.put(np.zeros(4, np.float32))
    shim.expect_error(shim.reduce(x, x, 0, 5, 1, 4, 1), "reduce", "kind")
    shim.expect_error(shim.reduce(x, x, 0, 0, 1, -4, 1), "reduce", "n ")
    shim.expect_error(shim.reduce(x, x, code(bool), 0, 1, 4, 1), "reduce", "bool")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64", "int8"])
@pytest.mark.parametrize("op_name", ["argmax", "argmin"])
@pytest.mark.parametrize("select_last_index", [False, True])
@pytest.mark.parametrize("shape", [(3, 8, 5), (1, 33, 1), (2, 1, 3), (4, 5000, 1), (2, 700, 40), (1, 3000, 6)])
def test_arg_reduce(shim, dev, dtype, op_name, select_last_index, shape):
    x = random(shape, "int8", 0, 3).astype(npdtype(dtype))  # few values: many ties
    expected = get_op(op_name).reference(x, axis=1, keepdims=False, select_last_index=select_last_index)
    out, handle = dev.empty(expected.shape, np.int64, -5)
    shim.check(shim.arg_reduce(dev.put(x), out, code(x.dtype), int(op_name == "argmin"), *shape,
                               int(select_last_index)))
    np.testing.assert_array_equal(dev.get(handle), expected)


@gpu
def test_arg_reduce_nan_and_errors(shim, dev):
    x = np.array([1.0, np.nan, 5.0, np.nan], np.float32)
    for select_last_index in (False, True):
        for kind, op_name in enumerate(("argmax", "argmin")):
            out, handle = dev.empty((1,), np.int64)
            shim.check(shim.arg_reduce(dev.put(x), out, 0, kind, 1, 4, 1, int(select_last_index)))
            assert dev.get(handle)[0] == get_op(op_name).reference(x, axis=0, keepdims=False,
                                                                   select_last_index=select_last_index)
    out = dev.put(np.zeros(1, np.int64))
    shim.expect_error(shim.arg_reduce(dev.put(x), out, 0, 0, 1, 0, 1, 0), "arg_reduce", "empty")
    shim.expect_error(shim.arg_reduce(dev.put(x), out, 0, 2, 1, 4, 1, 0), "arg_reduce", "kind")


# ---------------------------------------------------------------- normalizations

@gpu
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(3, 10, 1), (2, 7, 5), (1, 1, 4), (1, 3, 300), (37, 1000, 1), (3, 1023, 1),
                                   (4, 3000, 1), (2, 20000, 1), (19, 128, 1), (5, 64, 1), (3, 1024, 1),
                                   (2, 96, 1),
                                   # short rows (fewer than 32 packs of 16 bytes: 4 or 8 lanes a
                                   # row, several rows a warp), row counts off the warp's rows
                                   (1001, 200, 1), (5, 8, 1), (20001, 96, 1)])
def test_softmax(shim, dev, dtype, log, shape):
    x = (random(shape, "float32") * 4).astype(npdtype(dtype))
    x.flat[0] = -np.inf  # an exp of 0 (a whole -inf slice would give NaN in both)
    op_name = "log_softmax" if log else "softmax"
    expected = get_op(op_name).reference(x, axis=1)
    out, handle = dev.empty(x.shape, x.dtype)
    shim.check(shim.softmax(dev.put(x), out, code(x.dtype), *shape, int(log)))
    assert_close(dev.get(handle), expected, dtype)


@gpu
def test_softmax_all_negative_infinity_is_nan_and_errors(shim, dev):
    x = np.full((1, 4, 1), -np.inf, np.float32)
    out, handle = dev.empty(x.shape, np.float32)
    shim.check(shim.softmax(dev.put(x), out, 0, 1, 4, 1, 0))
    assert np.isnan(dev.get(handle)).all() and np.isnan(get_op("softmax").reference(x, axis=1)).all()
    shim.expect_error(shim.softmax(dev.put(x), out, code(np.int64), 1, 4, 1, 0), "softmax", "int64")


@gpu
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rows, n", [(4, 33), (1, 1), (3, 512), (9, 768), (5, 1023), (3, 4096), (2, 8192),
                                     (2, 20000), (17, 128), (3, 64), (4, 1024), (2, 1025), (3, 96),
                                     # short rows: 4 or 8 lanes a row (see test_softmax)
                                     (1001, 200), (5, 8), (20001, 96)])
def test_layer_norm_and_rms_norm(shim, dev, dtype, rows, n):
    x = (random((rows, n)) * 3 + 1).astype(npdtype(dtype))
    gamma, beta = random((n,), dtype), random((n,), dtype)
    ptrs = dev.put(x), dev.put(gamma), dev.put(beta)
    out, handle = dev.empty(x.shape, x.dtype)
    shim.check(shim.layer_norm(ptrs[0], ptrs[1], ptrs[2], out, code(x.dtype), rows, n, 1e-5))
    assert_close(dev.get(handle), get_op("layer_norm").reference(x, gamma, beta, axis=-1, epsilon=1e-5), dtype)
    shim.check(shim.layer_norm(ptrs[0], ptrs[1], None, out, code(x.dtype), rows, n, 1e-5))  # no beta
    assert_close(dev.get(handle),
                 get_op("layer_norm").reference(x, gamma, np.zeros_like(beta), axis=-1, epsilon=1e-5), dtype)
    shim.check(shim.rms_norm(ptrs[0], ptrs[1], out, code(x.dtype), rows, n, 1e-6))
    assert_close(dev.get(handle), get_op("rms_norm").reference(x, gamma, axis=-1, epsilon=1e-6), dtype)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("batch, pixels, channels, squeeze, activation, gate, biases", SQUEEZE_EXCITATION_CASES)
@pytest.mark.parametrize("scale", [False, True])
def test_squeeze_excitation(shim, dev, dtype, batch, pixels, channels, squeeze, activation, gate, biases, scale):
    x, w1, b1, w2, b2 = squeeze_excitation_inputs(rng, batch, pixels, channels, squeeze, npdtype(dtype), biases)
    out, handle = dev.empty((batch, pixels, channels) if scale else (batch, channels), x.dtype, fill=np.nan)
    shim.check(shim.squeeze_excitation(dev.put(x), dev.put(w1), dev.put(b1), dev.put(w2), dev.put(b2), out,
                                       code(x.dtype), batch, pixels, channels, squeeze, ACTIVATIONS[activation], 0.0,
                                       0.0, ACTIVATIONS[gate], 1 / 6, 0.5, int(scale)))
    assert_close(dev.get(handle), squeeze_excitation_reference(x, w1, b1, w2, b2, activation, gate, scale=scale),
                 dtype)


@gpu
def test_squeeze_excitation_refuses_a_misaligned_input(shim, dev):
    x, w1, b1, w2, b2 = squeeze_excitation_inputs(rng, 2, 3, 16, 4, np.float16, True)
    out, _ = dev.empty((2, 16), np.float16)
    shim.expect_error(shim.squeeze_excitation(dev.put(x) + 2, dev.put(w1), dev.put(b1), dev.put(w2), dev.put(b2), out,
                                              code(x.dtype), 2, 3, 16, 4, 1, 0.0, 0.0, 4, 0.0, 0.0, 0),
                      "squeeze_excitation", "16-byte aligned")


@gpu
def test_layer_norm_misaligned_gamma_uses_scalar_loads(shim, dev):
    rows, n = 3, 64
    x = random((rows, n))
    gamma_storage = random((n + 1,))
    gamma, beta = gamma_storage[1:], random((n,))
    out, handle = dev.empty(x.shape, x.dtype)
    shim.check(shim.layer_norm(dev.put(x), dev.put(gamma_storage) + 4, dev.put(beta), out, 0, rows, n, 1e-5))
    assert_close(dev.get(handle), get_op("layer_norm").reference(x, gamma, beta, axis=-1, epsilon=1e-5))


@gpu
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, axis", [((2, 3, 4, 5), 1), ((6, 7), 1), ((5, 3), 0)])
def test_batch_norm(shim, dev, dtype, shape, axis):
    x = random(shape, dtype)
    channels = shape[axis]
    scale, bias, mean = (random((channels,), dtype) for _ in range(3))
    var = rng.uniform(0.5, 2.0, size=channels).astype(npdtype(dtype))
    expected = get_op("batch_norm").reference(x, scale, bias, mean, var, epsilon=1e-3, axis=axis)
    out, handle = dev.empty(x.shape, x.dtype)
    outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    shim.check(shim.batch_norm(dev.put(x), dev.put(scale), dev.put(bias), dev.put(mean), dev.put(var), out,
                               code(x.dtype), outer, channels, inner, 1e-3))
    assert_close(dev.get(handle), expected, dtype)


@gpu
def test_norm_errors(shim, dev):
    x = dev.put(np.zeros((2, 4), np.float32))
    shim.expect_error(shim.layer_norm(x, None, None, x, 0, 2, 4, 1e-5), "layer_norm", "gamma")
    shim.expect_error(shim.rms_norm(x, x, x, 0, -2, 4, 1e-5), "rms_norm", "rows")
    shim.expect_error(shim.batch_norm(x, x, x, None, x, x, 0, 1, 2, 4, 1e-5), "batch_norm", "mean")


# ---------------------------------------------------------------- matmul

WORKSPACE_BYTES = 32 * 1024 * 1024


def matmul_tolerance(dtype, k):
    rtol, atol = TOLERANCES[dtype]
    return rtol, atol * max(1.0, float(np.sqrt(k)))  # errors grow with the length of the dot products


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int8"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (67, 33, 129), (5, 70, 3), (130, 9, 300), (4, 6, 0), (256, 128, 64)])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul(shim, dev, cupy, dtype, m, n, k, trans_a, trans_b):
    batch = 2
    a = random((batch, m, k), dtype, -3, 4)
    b = random((batch, k, n), dtype, -3, 4)
    expected = get_op("matmul").reference(a, b)
    a_stored = np.ascontiguousarray(a.transpose(0, 2, 1)) if trans_a else a
    b_stored = np.ascontiguousarray(b.transpose(0, 2, 1)) if trans_b else b
    workspace = cupy.empty(WORKSPACE_BYTES, cupy.uint8)
    out, handle = dev.empty(expected.shape, expected.dtype, 9)
    shim.check(shim.matmul(dev.put(a_stored), dev.put(b_stored), out, code(a.dtype), batch, m, n, k, int(trans_a),
                           int(trans_b), m * k, k * n, m * n, -1, workspace.data.ptr, WORKSPACE_BYTES))
    actual = dev.get(handle)
    if dtype in TOLERANCES:
        rtol, atol = matmul_tolerance(dtype, k)
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(actual, expected)  # int8 wraps like the reference


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_matmul_every_heuristic_index(shim, dev, cupy, dtype):
    """Each algo in 0..count-1 runs and agrees with the reference; the count is the
    tuning range; one past it is an error."""
    batch, m, n, k = 3, 96, 80, 72
    a, b = random((batch, m, k), dtype), random((batch, k, n), dtype)
    expected = get_op("matmul").reference(a, b)
    count = shim.matmul_heuristic_count(code(a.dtype), batch, m, n, k, 0, 0, m * k, k * n, m * n, WORKSPACE_BYTES)
    assert count >= 1, shim.last_error()
    workspace = cupy.empty(WORKSPACE_BYTES, cupy.uint8)
    a_pointer, b_pointer = dev.put(a), dev.put(b)
    rtol, atol = matmul_tolerance(dtype, k)
    for algo in range(count):
        out, handle = dev.empty(expected.shape, expected.dtype, 9)
        shim.check(shim.matmul(a_pointer, b_pointer, out, code(a.dtype), batch, m, n, k, 0, 0, m * k, k * n, m * n,
                               algo, workspace.data.ptr, WORKSPACE_BYTES))
        np.testing.assert_allclose(dev.get(handle).astype(np.float64), expected.astype(np.float64), rtol=rtol,
                                   atol=atol, err_msg=f"algo {algo}")
    out, _ = dev.empty(expected.shape, expected.dtype)
    shim.expect_error(shim.matmul(a_pointer, b_pointer, out, code(a.dtype), batch, m, n, k, 0, 0, m * k, k * n, m * n,
                                  count, workspace.data.ptr, WORKSPACE_BYTES), "matmul", "algo")
    assert shim.matmul_heuristic_count(code(np.int32), batch, m, n, k, 0, 0, 0, 0, 0, 0) == 1


@gpu
@pytest.mark.parametrize("workspace", [True, False])
def test_matmul_broadcast_batch_stride_and_no_workspace(shim, dev, cupy, workspace):
    a, b = random((4, 7)), random((3, 7, 5))  # one a for every batch: stride 0
    expected = get_op("matmul").reference(a, b)
    scratch = cupy.empty(WORKSPACE_BYTES, cupy.uint8)
    out, handle = dev.empty(expected.shape, np.float32)
    shim.check(shim.matmul(dev.put(a), dev.put(b), out, 0, 3, 4, 5, 7, 0, 0, 0, 35, 20, -1,
                           scratch.data.ptr if workspace else None, WORKSPACE_BYTES if workspace else 0))
    assert_close(dev.get(handle), expected)


@gpu
def test_matmul_odd_alignment_half(shim, dev, cupy):
    """Operands at odd element offsets (2-byte aligned) still multiply (narrower cuBLASLt
    kernels or the fallback)."""
    m, n, k = 33, 17, 45
    a, b = random((m, k), "float16"), random((k, n), "float16")
    expected = get_op("matmul").reference(a, b)
    a_pointer = dev.put(np.concatenate([np.zeros(1, np.float16), a.reshape(-1)])) + 2
    b_pointer = dev.put(np.concatenate([np.zeros(3, np.float16), b.reshape(-1)])) + 6
    out, handle = dev.empty(expected.shape, np.float16)
    shim.check(shim.matmul(a_pointer, b_pointer, out, code(a.dtype), 1, m, n, k, 0, 0, 0, 0, 0, -1, None, 0))
    rtol, atol = matmul_tolerance("float16", k)
    np.testing.assert_allclose(dev.get(handle).astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol)


@gpu
def test_matmul_errors(shim, dev):
    x = dev.put(np.zeros(4, np.float32))
    shim.expect_error(shim.matmul(x, x, x, 0, 1, -2, 2, 2, 0, 0, 0, 0, 0, -1, None, 0), "matmul", "m ")
    shim.expect_error(shim.matmul(None, x, x, 0, 1, 2, 2, 1, 0, 0, 0, 0, 0, -1, None, 0), "matmul", "a ")
    shim.expect_error(shim.matmul(x, x, x, code(bool), 1, 2, 2, 1, 0, 0, 0, 0, 0, -1, None, 0), "matmul", "bool")


# ---------------------------------------------------------------- conv2d

def conv2d_workspace_expected(dtype, layout, *sizes_and_groups):
    """What codegen.py plans at build time for the CUDA shim's conv2d (the shim must agree)."""
    from byoc.backends.builtin.shim_calls import conv2d_workspace_bytes
    return conv2d_workspace_bytes("cuda", np.dtype(dtype).name, int(layout), *sizes_and_groups)


CONV_CASES = [
    # (batch, channels, height, width, out_channels, kernel, strides, pads, dilations, groups)
    (2, 3, 9, 8, 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 4, 11, 7, 6, (3, 2), (2, 3), (0, 2, 1, 0), (1, 1), 2),
    (1, 6, 10, 10, 6, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 6),  # depthwise, dilated
    (3, 5, 6, 6, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),  # pointwise: cuBLASLt for floats
    (2, 16, 5, 5, 8, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 2, 5, 13, 3, (5, 1), (1, 2), (3, 0, 3, 1), (1, 3), 1),
    (1, 70, 6, 5, 66, (2, 2), (1, 1), (1, 0, 0, 1), (1, 1), 1),  # more than one GEMM tile of rows/depth
    (2, 8, 12, 12, 130, (3, 3), (2, 2), (1, 1, 0, 0), (1, 1), 2),
    (2, 20, 9, 9, 24, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),  # strided 1x1: im2col
    (1, 3, 1, 1, 5, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    # direct kernel for few outputs per group: depthwise x2 strided, MobileNet's 5x5, 4-channel groups
    (2, 8, 9, 7, 16, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8),
    (1, 24, 10, 10, 24, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 24),
    (1, 16, 6, 6, 12, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4),
    # depthwise with channels a multiple of 8: the vectorized NHWC kernel for 16-bit floats
    # (filters in shared memory); dilated; ConvNeXt's 7x7 over 768 channels (75 KB of filters)
    (2, 72, 11, 9, 72, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 72),
    (1, 16, 10, 10, 16, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 16),
    (1, 768, 7, 7, 768, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1), 768),
    # more 8-channel vectors (150,528) than one pass of the capped grid covers on an H100
    (4, 96, 56, 56, 96, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 96),
    # the unrolled windows (a thread per pair of output pixels): 3x3 stride 2 and 5x5 stride
    # 1, odd output widths (the last pair's second pixel is past the edge), uneven pads
    (2, 40, 13, 11, 40, (3, 3), (2, 2), (1, 0, 1, 1), (1, 1), 40),
    (1, 32, 9, 12, 32, (5, 5), (1, 1), (2, 1, 2, 3), (1, 1), 32),
    # 7x7 stride 1 (a thread per row of four output pixels): widths 13 and 7 end in a
    # partial row of 1 and 3 pixels
    (2, 24, 15, 13, 24, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1), 24),
    # outputs over the tiled kernel's sizes (28x28 at stride 1, 14x14 at stride 2) run on
    # the per-pixel-group kernel: every common window once
    (1, 8, 33, 31, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8),
    (1, 16, 60, 58, 16, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 16),
    (1, 8, 29, 30, 8, (5, 5), (1, 1), (2, 1, 2, 2), (1, 1), 8),
    (1, 8, 30, 29, 8, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1), 8),
    # the tiled kernel over several tiles each way, partial ones at the edges, channel
    # tiles ending past the last vector (9 vectors)
    (1, 72, 27, 26, 72, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 72),
    # dense convs of 4 input channels into a multiple of 8 (an image's stem): the direct
    # kernel for 16-bit floats in NHWC; a stride-2 3x3 and a 4x4 patchify with uneven pads
    (2, 4, 15, 13, 24, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    (1, 4, 16, 12, 16, (4, 4), (4, 4), (0, 1, 0, 2), (1, 1), 1),
    # grouped convs of whole 8-channel vectors: grouped_conv.cuh's kernel for 16-bit floats
    # in NHWC. RegNet's 8 channels a group (odd sizes, stride 2); 16 in and 32 out a group;
    # 440 channels in 55 groups (two slices of output vectors, 28 and 27); 64 channels a
    # group dilated (four slices of 4 vectors)
    (2, 16, 9, 7, 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    (1, 48, 11, 10, 48, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 6),
    (2, 32, 7, 9, 64, (3, 3), (1, 1), (1, 0, 1, 2), (1, 1), 2),
    (1, 440, 7, 7, 440, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 55),
    (1, 128, 9, 9, 128, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 2),
    # 32 output vectors a slice (8 pixel pairs a block pass): more pairs (9,216) than the
    # capped grid covers in one pass on an H100 or H200, even widths
    (2, 256, 96, 96, 256, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 32),
]


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64", "int8"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(shim, dev, cupy, dtype, layout, case):
    batch, channels, height, width, out_channels, kernel, strides, pads, dilations, groups = case
    data = random((batch, channels, height, width), dtype, -3, 4)
    weight = random((out_channels, channels // groups) + kernel, dtype, -3, 4)
    if layout == "NHWC":
        data, weight = np.ascontiguousarray(data.transpose(0, 2, 3, 1)), np.ascontiguousarray(weight.transpose(0, 2, 3, 1))
    kernel_layout = "OIHW" if layout == "NCHW" else "OHWI"
    expected = get_op("conv2d").reference(data, weight, strides=strides, pads=pads, dilations=dilations,
                                          groups=groups, data_layout=layout, kernel_layout=kernel_layout)
    out_h, out_w = expected.shape[2:] if layout == "NCHW" else expected.shape[1:3]
    nhwc = int(layout == "NHWC")
    sizes = (batch, channels, height, width, out_channels, kernel[0], kernel[1], out_h, out_w)
    needed = shim.conv2d_workspace(code(data.dtype), nhwc, *sizes, groups)
    assert needed == conv2d_workspace_expected(data.dtype, nhwc, *sizes, groups)
    scratch = cupy.empty(max(needed, 1), cupy.uint8)
    bias = random((out_channels,), dtype, -3, 4)
    data_pointer, weight_pointer, bias_pointer = dev.put(data), dev.put(weight), dev.put(bias)
    # With the workspace asked for (im2col + cuBLASLt for floats), and without any (the
    # implicit GEMM; the 1x1 GEMM needs none).
    for with_bias, with_workspace in ((False, True), (True, True), (True, False)):
        out, handle = dev.empty(expected.shape, data.dtype, 5)
        shim.check(shim.conv2d(data_pointer, weight_pointer, bias_pointer if with_bias else None, out,
                               code(data.dtype), nhwc, *sizes, *strides, pads[0], pads[1], *dilations, groups,
                               scratch.data.ptr if with_workspace else None, needed if with_workspace else 0))
        channel_axis = 1 if layout == "NCHW" else 3
        shape = [1, 1, 1, 1]
        shape[channel_axis] = out_channels
        wanted = expected
        if with_bias:
            if data.dtype.kind in "iu":
                wanted = (expected.astype(np.int64) + bias.astype(np.int64).reshape(shape)).astype(data.dtype)
            else:
                wanted = (expected.astype(np.float64) + bias.astype(np.float64).reshape(shape)).astype(data.dtype)
        actual = dev.get(handle)
        if dtype in TOLERANCES:
            rtol, atol = TOLERANCES[dtype]
            depth = channels // groups * kernel[0] * kernel[1]
            np.testing.assert_allclose(actual.astype(np.float64), wanted.astype(np.float64), rtol=rtol,
                                       atol=atol * max(1.0, np.sqrt(depth)) * 4)
        else:
            np.testing.assert_array_equal(actual, wanted)


@gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_im2col_in_chunks(shim, dev, cupy, layout):
    """Columns over the 64 MiB chunk limit: several GEMMs (NHWC by pixel rows, NCHW by
    images), each chunk at the start of the workspace."""
    batch, channels, size, out_channels = 2, 64, 128, 16
    data = random((batch, channels, size, size), "float32")
    weight = random((out_channels, channels, 3, 3), "float32")
    if layout == "NHWC":
        data, weight = np.ascontiguousarray(data.transpose(0, 2, 3, 1)), np.ascontiguousarray(weight.transpose(0, 2, 3, 1))
    kernel_layout = "OIHW" if layout == "NCHW" else "OHWI"
    expected = get_op("conv2d").reference(data, weight, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1),
                                          groups=1, data_layout=layout, kernel_layout=kernel_layout)
    nhwc = int(layout == "NHWC")
    sizes = (batch, channels, size, size, out_channels, 3, 3, size, size)
    needed = shim.conv2d_workspace(0, nhwc, *sizes, 1)
    assert needed == conv2d_workspace_expected(np.float32, nhwc, *sizes, 1)
    assert needed - (4 << 20) < batch * size * size * channels * 9 * 4  # really chunked
    scratch = cupy.empty(needed, cupy.uint8)
    out, handle = dev.empty(expected.shape, np.float32)
    shim.check(shim.conv2d(dev.put(data), dev.put(weight), None, out, 0, nhwc, *sizes, 1, 1, 1, 1, 1, 1, 1,
                           scratch.data.ptr, needed))
    assert_close(dev.get(handle), expected, "float32", atol_scale=30)


@gpu
def test_conv2d_errors(shim, dev):
    x = dev.put(np.zeros(64, np.float32))
    args = lambda **changes: [changes.get(k, v) for k, v in dict(  # noqa: E731
        in_=x, weight=x, bias=None, out=x, dtype=0, layout=0, batch=1, in_channels=4, in_h=2, in_w=2,
        out_channels=2, kernel_h=1, kernel_w=1, out_h=2, out_w=2, stride_h=1, stride_w=1, pad_top=0, pad_left=0,
        dilation_h=1, dilation_w=1, groups=1, workspace=None, workspace_bytes=0).items()]
    shim.check(shim.conv2d(*args()))
    shim.expect_error(shim.conv2d(*args(groups=3)), "conv2d", "groups")
    shim.expect_error(shim.conv2d(*args(layout=2)), "conv2d", "layout")
    shim.expect_error(shim.conv2d(*args(stride_h=0)), "conv2d", "stride_h")
    shim.expect_error(shim.conv2d(*args(weight=None)), "conv2d", "weight")
    shim.expect_error(shim.conv2d(*args(dtype=code(bool))), "conv2d", "bool")


# ---------------------------------------------------------------- pool2d

POOL_CASES = [
    # (shape NCHW, kernel, strides, pads, dilations, ceil_mode)
    ((2, 3, 9, 8), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((1, 2, 5, 5), (2, 2), (2, 2), (0, 0, 1, 0), (1, 1), True),   # ceil_mode overhang past explicit pads
    ((1, 4, 7, 6), (3, 2), (2, 3), (1, 0, 0, 1), (2, 1), True),
    ((2, 1, 4, 4), (4, 4), (1, 1), (3, 3, 3, 3), (1, 1), False),  # windows wholly in the padding
    ((1, 70, 6, 6), (2, 3), (1, 2), (0, 1, 1, 1), (1, 2), False),
    # channels a multiple of every dtype's 16-byte vector: NHWC takes the vectorised kernel
    ((2, 16, 9, 8), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((1, 32, 7, 6), (3, 2), (2, 3), (1, 0, 0, 1), (2, 1), True),
    ((1, 16, 4, 4), (4, 4), (1, 1), (3, 3, 3, 3), (1, 1), False),
]

POOL_KINDS = [("max_pool2d", False, dtype) for dtype in FLOATS + ["int64", "int8"]] + [
    ("avg_pool2d", count_include_pad, dtype) for count_include_pad in (False, True) for dtype in FLOATS]


@gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("op_name, count_include_pad, dtype", POOL_KINDS)
def test_pool2d(shim, dev, dtype, layout, case, op_name, count_include_pad):
    shape, kernel, strides, pads, dilations, ceil_mode = case
    data = random(shape, dtype)
    if layout == "NHWC":
        data = np.ascontiguousarray(data.transpose(0, 2, 3, 1))
    attrs = dict(kernel=kernel, strides=strides, pads=pads, dilations=dilations, ceil_mode=ceil_mode, layout=layout)
    if op_name == "avg_pool2d":
        attrs["count_include_pad"] = count_include_pad
    expected = get_op(op_name).reference(data, **attrs)
    batch, channels, height, width = shape
    out_h, out_w = expected.shape[2:] if layout == "NCHW" else expected.shape[1:3]
    out, handle = dev.empty(expected.shape, data.dtype, 3)
    shim.check(shim.pool2d(dev.put(data), out, code(data.dtype), int(op_name == "avg_pool2d"), int(layout == "NHWC"),
                           batch, channels, height, width, out_h, out_w, *kernel, *strides, *pads, *dilations,
                           int(count_include_pad)))
    assert_close(dev.get(handle), expected, dtype)


@gpu
def test_pool2d_errors(shim, dev):
    x = dev.put(np.zeros(16, np.int64))
    common = (1, 1, 4, 4, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 0)
    shim.expect_error(shim.pool2d(x, x, code(np.int64), 1, 0, *common), "pool2d", "int64")
    shim.expect_error(shim.pool2d(x, x, code(np.int64), 2, 0, *common), "pool2d", "kind")


# ---------------------------------------------------------------- 16-bit rounding, errors

@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_round_trip_and_sum_rounding(shim, dev, dtype):
    """Every bit pattern survives load/store (cumsum over one element), and the sum of two
    values rounds to nearest even like NumPy/ml_dtypes."""
    patterns = np.arange(1 << 16, dtype=np.uint16).view(npdtype(dtype))
    out, handle = dev.empty(patterns.shape, patterns.dtype)
    shim.check(shim.cumsum(dev.put(patterns), out, code(patterns.dtype), patterns.size, 1, 1, 0, 0))
    result = dev.get(handle)
    finite = ~np.isnan(patterns.astype(np.float32))
    assert_same_bits(result[finite], patterns[finite])
    assert np.isnan(result[~finite].astype(np.float32)).all()

    pairs = rng.integers(0, 1 << 16, size=(20000, 2), dtype=np.uint16).view(npdtype(dtype))
    with np.errstate(over="ignore"):
        expected = get_op("sum").reference(pairs, axes=(1,), keepdims=False)
    out, handle = dev.empty(expected.shape, pairs.dtype)
    shim.check(shim.reduce(dev.put(pairs), out, code(pairs.dtype), 0, pairs.shape[0], 2, 1))
    result = dev.get(handle)
    finite = ~np.isnan(expected.astype(np.float32))
    assert_same_bits(result[finite], expected[finite])


@gpu
def test_last_error_is_per_failure(shim, dev):
    x = dev.put(np.zeros(4, np.float32))
    shim.expect_error(shim.trilu(None, x, 4, 1, 2, 2, 1, 0), "trilu", "in is NULL")
    shim.check(shim.trilu(x, x, 4, 1, 2, 2, 1, 0))  # success leaves the last message alone
    assert "byoc_shim_trilu" in shim.last_error()
