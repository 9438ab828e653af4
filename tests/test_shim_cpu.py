"""Tests of the CPU shim (backends/builtin/shim/cpu/): every function of byoc_shim.h,
built once per session with g++ into a temporary shared library and called through
ctypes, against the NumPy references of byoc/ops (`get_op(name).reference`).

Data movement must match bit for bit; arithmetic within a tolerance per dtype (the shim
sums in a different order than NumPy's pairwise sums and BLAS).
"""
from __future__ import annotations

import ctypes
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import byoc  # noqa: F401  (registers the ops)
from byoc.ir import get_op
from shim_abi import BF16, DTYPE_CODES, FLOATS, INT, SIGNATURES, SIZE, TOLERANCES  # the shim ABI (tests/shim_abi.py)
from shim_abi import (ACTIVATIONS, SQUEEZE_EXCITATION_CASES, squeeze_excitation_inputs,
                      squeeze_excitation_reference)

SHIM_DIR = pathlib.Path(__file__).resolve().parent.parent / "backends" / "builtin" / "shim"
CPU_SOURCES = sorted((SHIM_DIR / "cpu").glob("*.cpp"))


class Shim:
    """The loaded library: shim.<name without byoc_shim_>(...) calls a function and
    returns its code; `check` asserts success."""

    def __init__(self, library: ctypes.CDLL):
        self.library = library
        for name, argtypes in SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes = argtypes
            function.restype = SIZE if name.endswith("_workspace") else INT
        library.byoc_shim_last_error.restype = ctypes.c_char_p
        library.byoc_shim_last_error.argtypes = []

    def __getattr__(self, name):
        function = getattr(self.library, f"byoc_shim_{name}")
        return lambda *args: function(*args, None) if not name.endswith("_workspace") else function(*args)

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
def shim(tmp_path_factory) -> Shim:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    build = tmp_path_factory.mktemp("shim_cpu")
    from byoc.runtime import INCLUDE_DIR  # byoc_float16.h
    flags = ["-O2", "-std=c++17", "-fPIC", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE_DIR}"]
    # One g++ per source, in parallel, then one link.
    jobs = [(subprocess.Popen([compiler, *flags, "-c", str(source), "-o", str(build / f"{source.stem}.o")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT), source) for source in CPU_SOURCES]
    for job, source in jobs:
        output, _ = job.communicate()
        assert job.returncode == 0, f"{source.name}:\n{output.decode()}"
    library = build / "libbyoc_shim_cpu.so"
    subprocess.run([compiler, "-shared", "-o", str(library), *(str(build / f"{s.stem}.o") for s in CPU_SOURCES)],
                   check=True)
    return Shim(ctypes.CDLL(str(library)))


# ---------------------------------------------------------------- helpers

rng = np.random.default_rng(1234)


def random(shape, dtype="float32", low=-5, high=6):
    dtype = np.dtype(BF16 if dtype == "bfloat16" else dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(max(low, 0) if dtype.kind == "u" else low, high, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def npdtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def code(dtype) -> int:
    return DTYPE_CODES[np.dtype(dtype)]


def ptr(array) -> int | None:
    return None if array is None else array.ctypes.data


def int64s(values):
    values = list(values) or [0]
    return (ctypes.c_int64 * len(values))(*values)


def assert_close(actual, expected, dtype=None):
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    name = str(dtype or actual.dtype)
    if name in TOLERANCES:
        rtol, atol = TOLERANCES[name]
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol)
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


# ---------------------------------------------------------------- copy_strided

MOVE_DTYPES = ["float32", "float16", "bfloat16", "int64", "int8", "bool"]


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_copy_strided_transpose_broadcast_slice(shim, dtype):
    x = random((2, 3, 5), dtype)
    cases = [
        (get_op("transpose").reference(x, axes=(2, 0, 1)), np.transpose(x, (2, 0, 1))),
        (get_op("broadcast_to").reference(x[:, :1], shape=(4, 2, 3, 5)), np.broadcast_to(x[:, :1], (4, 2, 3, 5))),
        # Negative steps: a reversed slice reads backwards from an offset.
        (get_op("strided_slice").reference(x, begin=(-1, 2, 4), end=(-2**63, 0, 0), axes=(), strides=(-1, -2, -3)),
         x[::-1, 2:0:-2, 4:0:-3]),
    ]
    for expected, view in cases:
        out = np.empty(expected.shape, x.dtype)
        offset, strides = view_arguments(x, view)
        shim.check(shim.copy_strided(ptr(x), ptr(out), x.itemsize, out.ndim, int64s(out.shape), offset,
                                     int64s(strides), None))
        assert_same_bits(out, expected)


def test_copy_strided_concat_with_out_strides(shim):
    a, b = random((3, 2, 4)), random((3, 5, 4))
    expected = get_op("concat").reference(a, b, axis=1)
    out = np.zeros_like(expected)
    out_strides = [s // 4 for s in out.strides]
    for part, start in ((a, 0), (b, 2)):
        destination = out[:, start:]
        shim.check(shim.copy_strided(ptr(part), ptr(destination), 4, 3, int64s(part.shape), 0,
                                     int64s([s // 4 for s in part.strides]), int64s(out_strides)))
    assert_same_bits(out, expected)


def test_concat_of_parts_in_bytes_and_its_errors(shim):
    """byoc_shim_concat: parts of rows of any byte width (an empty one among them) land side
    by side in each output row; negative sizes and missing pointers are errors."""
    parts = [random((3, 4, 2), "float16"), random((3, 0, 2), "float16"), random((3, 1, 2), "float16")]
    expected = np.concatenate(parts, axis=1)
    out = np.empty_like(expected)
    pointers = (ctypes.c_void_p * 3)(*[ptr(part) for part in parts])
    shim.check(shim.concat(pointers, 3, int64s([p.shape[1] * 2 * 2 for p in parts]), 3, ptr(out)))
    assert out.tobytes() == expected.tobytes()
    shim.check(shim.concat(pointers, 3, int64s([16, 0, 4]), 0, None))  # no rows: nothing to read
    shim.expect_error(shim.concat(pointers, 3, int64s([16, -1, 4]), 3, ptr(out)), "concat", "row_bytes[1] is -1")
    shim.expect_error(shim.concat(pointers, 2, None, 3, ptr(out)), "concat", "row_bytes")
    shim.expect_error(shim.concat(pointers, 3, int64s([16, 0, 4]), 3, None), "concat", "out")


def test_copy_strided_scalar_odd_element_size_and_empty(shim):
    x = np.frombuffer(bytes(range(36)), dtype="V3").reshape(3, 4)  # 3-byte elements
    expected = np.ascontiguousarray(x.T)
    out = np.empty_like(expected)
    shim.check(shim.copy_strided(ptr(x), ptr(out), 3, 2, int64s((4, 3)), 0, int64s((1, 4)), None))
    assert out.tobytes() == expected.tobytes()
    scalar, target = np.array([7.5], np.float64), np.zeros(1)
    shim.check(shim.copy_strided(ptr(scalar), ptr(target), 8, 0, None, 0, None, None))
    assert target[0] == 7.5
    shim.check(shim.copy_strided(None, None, 4, 2, int64s((0, 3)), 0, int64s((3, 1)), None))  # nothing to copy


def test_copy_strided_errors(shim):
    x = np.zeros(4, np.float32)
    shim.expect_error(shim.copy_strided(ptr(x), ptr(x), 4, 9, int64s([1] * 9), 0, int64s([1] * 9), None),
                      "copy_strided", "ndim")
    shim.expect_error(shim.copy_strided(ptr(x), ptr(x), 4, 1, int64s([-1]), 0, int64s([1]), None),
                      "copy_strided", "shape[0]")
    shim.expect_error(shim.copy_strided(None, ptr(x), 4, 1, int64s([4]), 0, int64s([1]), None), "copy_strided", "in")
    shim.expect_error(shim.copy_strided(ptr(x), ptr(x), 0, 1, int64s([4]), 0, int64s([1]), None),
                      "copy_strided", "elem_size")


# ---------------------------------------------------------------- tile, trilu

@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bool"])
@pytest.mark.parametrize("shape, repeats", [((2, 1, 3), (2, 3, 1)), ((1,), (5,)), ((3, 2), (1, 3)), ((2, 3), (0, 2))])
def test_tile(shim, dtype, shape, repeats):
    x = random(shape, dtype)
    expected = get_op("tile").reference(x, repeats=repeats)
    out = np.empty(expected.shape, x.dtype)
    shim.check(shim.tile(ptr(x), ptr(out), x.itemsize, x.ndim, int64s(shape), int64s(repeats)))
    assert_same_bits(out, expected)


def test_tile_errors(shim):
    x = np.zeros(4, np.float32)
    shim.expect_error(shim.tile(ptr(x), ptr(x), 4, 1, int64s([4]), int64s([-1])), "tile", "repeats")
    shim.expect_error(shim.tile(ptr(x), ptr(x), 4, 1, None, int64s([1])), "tile", "in_shape")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float64"])
@pytest.mark.parametrize("shape", [(2, 4, 5), (5, 3), (1, 1)])
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("k", [-2, 0, 1, 7])
def test_trilu(shim, dtype, shape, upper, k):
    x = random(shape, dtype)
    expected = get_op("trilu").reference(x, upper=upper, k=k)
    out = np.full_like(x, 3)
    batch = int(np.prod(shape[:-2]))
    shim.check(shim.trilu(ptr(x), ptr(out), x.itemsize, batch, shape[-2], shape[-1], int(upper), k))
    assert_same_bits(out, expected)


# ---------------------------------------------------------------- gather, gather_elements

@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_gather(shim, index_dtype, axis, dtype):
    data = random((3, 5, 4), dtype)
    size = data.shape[axis]
    indices = rng.integers(-size, size, size=(2, 3)).astype(index_dtype)
    indices[0, 0] = -size  # the most negative index is still in range
    expected = get_op("gather").reference(data, indices, axis=axis)
    out = np.empty(expected.shape, data.dtype)
    outer, inner = int(np.prod(data.shape[:axis])), int(np.prod(data.shape[axis + 1:]))
    shim.check(shim.gather(ptr(data), ptr(indices), ptr(out), data.itemsize, code(index_dtype), outer, size, inner,
                           indices.size))
    assert_same_bits(out, expected)


def test_gather_errors(shim):
    data, out = random((3, 4)), np.empty((3, 2), np.float32)
    for bad in (4, -5):
        indices = np.array([0, bad], np.int64)
        shim.expect_error(shim.gather(ptr(data), ptr(indices), ptr(out), 4, code("int64"), 3, 4, 1, 2),
                          "gather", f"index {bad}", "out of range")
    indices = np.array([0, 1], np.int64)
    shim.expect_error(shim.gather(ptr(data), ptr(indices), ptr(out), 4, code("float32"), 3, 4, 1, 2),
                      "gather", "index_dtype")
    shim.expect_error(shim.gather(ptr(data), ptr(indices), ptr(out), 4, code("int64"), -1, 4, 1, 2), "gather", "outer")


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
def test_gather_elements(shim, axis, index_dtype):
    data = random((4, 5, 3), "bfloat16")
    shape = [2, 4, 3]  # smaller than data off the axis: the reference crops
    shape[axis] = 6
    size = data.shape[axis]
    indices = rng.integers(-size, size, size=shape).astype(index_dtype)
    expected = get_op("gather_elements").reference(data, indices, axis=axis)
    out = np.empty(expected.shape, data.dtype)
    shim.check(shim.gather_elements(ptr(data), ptr(indices), ptr(out), 2, code(index_dtype), 3, int64s(data.shape),
                                    int64s(shape), axis))
    assert_same_bits(out, expected)


def test_gather_elements_errors(shim):
    data, out = random((3, 4)), np.empty((3, 4), np.float32)
    indices = np.zeros((3, 4), np.int64)
    indices[2, 1] = 3
    shim.expect_error(shim.gather_elements(ptr(data), ptr(indices), ptr(out), 4, code("int64"), 2, int64s((3, 4)),
                                           int64s((3, 4)), 0), "gather_elements", "index 3")
    shim.expect_error(shim.gather_elements(ptr(data), ptr(indices), ptr(out), 4, code("int64"), 2, int64s((3, 4)),
                                           int64s((3, 5)), 0), "gather_elements", "shape[1]")
    shim.expect_error(shim.gather_elements(ptr(data), ptr(indices), ptr(out), 4, code("int64"), 2, int64s((3, 4)),
                                           int64s((3, 4)), 2), "gather_elements", "axis")


# ---------------------------------------------------------------- pad

PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "uint8", "bool"])
@pytest.mark.parametrize("mode", list(PAD_MODES))
@pytest.mark.parametrize("pads", [(1, 0, 2, 2, 3, 1), (0, -1, 2, -1, 2, 0), (2, 1, 0, 0, 0, 3)])
def test_pad(shim, dtype, mode, pads):
    x = random((3, 4, 5), dtype)
    value = 2.5 if npdtype(dtype).kind == "f" else 7.0
    expected = get_op("pad").reference(x, pads=pads, mode=mode, value=value)
    out = np.empty(expected.shape, x.dtype)
    shim.check(shim.pad(ptr(x), ptr(out), code(x.dtype), 3, int64s(x.shape), int64s(pads[:3]), int64s(pads[3:]),
                        PAD_MODES[mode], value))
    assert_same_bits(out, expected)


def test_pad_errors(shim):
    x, out = random((2, 3)), np.empty((10, 10), np.float32)
    shim.expect_error(shim.pad(ptr(x), ptr(out), 0, 2, int64s((2, 3)), int64s((0, 3)), int64s((0, 0)), 1, 0.0),
                      "pad", "reflect")
    shim.expect_error(shim.pad(ptr(x), ptr(out), 0, 2, int64s((2, 3)), int64s((-2, 0)), int64s((-1, 0)), 0, 0.0),
                      "pad", "crop")
    shim.expect_error(shim.pad(ptr(x), ptr(out), 0, 2, int64s((2, 3)), int64s((0, 0)), int64s((0, 0)), 3, 0.0),
                      "pad", "mode")
    shim.expect_error(shim.pad(ptr(x), ptr(out), 42, 2, int64s((2, 3)), int64s((0, 0)), int64s((0, 0)), 0, 0.0),
                      "pad", "dtype")


# ---------------------------------------------------------------- cumsum

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64", "int8"])
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("exclusive, reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_cumsum(shim, dtype, axis, exclusive, reverse):
    x = random((3, 7, 4), dtype, low=-100, high=100)  # int8 sums wrap around
    expected = get_op("cumsum").reference(x, axis=axis, exclusive=exclusive, reverse=reverse)
    out = np.empty_like(x)
    outer, inner = int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis + 1:]))
    shim.check(shim.cumsum(ptr(x), ptr(out), code(x.dtype), outer, x.shape[axis], inner, int(exclusive), int(reverse)))
    assert_close(out, expected, dtype)


def test_cumsum_errors(shim):
    x = np.zeros(4, bool)
    shim.expect_error(shim.cumsum(ptr(x), ptr(x), code(bool), 1, 4, 1, 0, 0), "cumsum", "bool")
    shim.expect_error(shim.cumsum(ptr(x), None, code("int8"), 1, 4, 1, 0, 0), "cumsum", "out")


# ---------------------------------------------------------------- reductions

REDUCE_KINDS = {"sum": 0, "mean": 1, "max": 2, "min": 3, "prod": 4}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8"])
@pytest.mark.parametrize("kind", list(REDUCE_KINDS))
@pytest.mark.parametrize("shape", [(3, 17, 5), (1, 300, 1), (4, 1, 3), (2, 0, 3), (1, 9, 301)])
def test_reduce(shim, dtype, kind, shape):
    if kind == "prod":
        x = rng.uniform(0.6, 1.4, size=shape).astype(npdtype(dtype)) if dtype in FLOATS else random(shape, dtype, -3, 4)
    else:
        x = random(shape, dtype, -50, 50)
    expected = get_op(kind).reference(x, axes=(1,), keepdims=False)
    out = np.empty(expected.shape, x.dtype)
    shim.check(shim.reduce(ptr(x), ptr(out), code(x.dtype), REDUCE_KINDS[kind], *shape))
    assert_close(out, expected, dtype)


def test_reduce_nan_and_negative_mean(shim):
    x = np.array([[1.0, np.nan, 3.0], [2.0, -1.0, np.inf]], np.float32)
    for kind in ("max", "min"):
        out = np.empty(2, np.float32)
        shim.check(shim.reduce(ptr(x), ptr(out), 0, REDUCE_KINDS[kind], 2, 3, 1))
        np.testing.assert_array_equal(out, get_op(kind).reference(x, axes=(1,), keepdims=False))
    ints = np.array([[-7, 0, 0], [7, 1, 0]], np.int32)  # means -7/3 and 8/3 truncate toward zero
    out = np.empty(2, np.int32)
    shim.check(shim.reduce(ptr(ints), ptr(out), code(np.int32), 1, 2, 3, 1))
    np.testing.assert_array_equal(out, get_op("mean").reference(ints, axes=(1,), keepdims=False))


def test_reduce_errors(shim):
    x = np.zeros(4, np.float32)
    shim.expect_error(shim.reduce(ptr(x), ptr(x), 0, 5, 1, 4, 1), "reduce", "kind")
    shim.expect_error(shim.reduce(ptr(x), ptr(x), 0, 0, 1, -4, 1), "reduce", "n ")
    shim.expect_error(shim.reduce(ptr(x), ptr(x), code(bool), 0, 1, 4, 1), "reduce", "bool")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64", "int8"])
@pytest.mark.parametrize("op_name", ["argmax", "argmin"])
@pytest.mark.parametrize("select_last_index", [False, True])
@pytest.mark.parametrize("shape", [(3, 8, 5), (1, 33, 1), (2, 1, 3)])
def test_arg_reduce(shim, dtype, op_name, select_last_index, shape):
    x = random(shape, "int8", 0, 3).astype(npdtype(dtype))  # few values: many ties
    expected = get_op(op_name).reference(x, axis=1, keepdims=False, select_last_index=select_last_index)
    out = np.empty(expected.shape, np.int64)
    shim.check(shim.arg_reduce(ptr(x), ptr(out), code(x.dtype), int(op_name == "argmin"), *shape,
                               int(select_last_index)))
    np.testing.assert_array_equal(out, expected)


def test_arg_reduce_nan_and_errors(shim):
    x = np.array([1.0, np.nan, 5.0, np.nan], np.float32)
    for select_last_index in (False, True):
        for kind, op_name in enumerate(("argmax", "argmin")):
            out = np.empty(1, np.int64)
            shim.check(shim.arg_reduce(ptr(x), ptr(out), 0, kind, 1, 4, 1, int(select_last_index)))
            assert out[0] == get_op(op_name).reference(x, axis=0, keepdims=False, select_last_index=select_last_index)
    out = np.empty(1, np.int64)
    shim.expect_error(shim.arg_reduce(ptr(x), ptr(out), 0, 0, 1, 0, 1, 0), "arg_reduce", "empty")
    shim.expect_error(shim.arg_reduce(ptr(x), ptr(out), 0, 2, 1, 4, 1, 0), "arg_reduce", "kind")


# ---------------------------------------------------------------- normalizations

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(3, 10, 1), (2, 7, 5), (1, 1, 4), (1, 3, 300)])
def test_softmax(shim, dtype, log, shape):
    x = (random(shape, "float32") * 4).astype(npdtype(dtype))
    x.flat[0] = -np.inf  # an exp of 0 (a whole -inf slice would give NaN in both)
    op_name = "log_softmax" if log else "softmax"
    expected = get_op(op_name).reference(x, axis=1)
    out = np.empty_like(x)
    shim.check(shim.softmax(ptr(x), ptr(out), code(x.dtype), *shape, int(log)))
    assert_close(out, expected, dtype)


def test_softmax_all_negative_infinity_is_nan(shim):
    x = np.full((1, 4, 1), -np.inf, np.float32)
    out = np.empty_like(x)
    shim.check(shim.softmax(ptr(x), ptr(out), 0, 1, 4, 1, 0))
    assert np.isnan(out).all() and np.isnan(get_op("softmax").reference(x, axis=1)).all()
    shim.expect_error(shim.softmax(ptr(x), ptr(out), code(np.int64), 1, 4, 1, 0), "softmax", "int64")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rows, n", [(4, 33), (1, 1), (3, 512)])
def test_layer_norm_and_rms_norm(shim, dtype, rows, n):
    x = (random((rows, n)) * 3 + 1).astype(npdtype(dtype))
    gamma, beta = random((n,), dtype), random((n,), dtype)
    out = np.empty_like(x)
    shim.check(shim.layer_norm(ptr(x), ptr(gamma), ptr(beta), ptr(out), code(x.dtype), rows, n, 1e-5))
    assert_close(out, get_op("layer_norm").reference(x, gamma, beta, axis=-1, epsilon=1e-5), dtype)
    shim.check(shim.layer_norm(ptr(x), ptr(gamma), None, ptr(out), code(x.dtype), rows, n, 1e-5))  # no beta
    assert_close(out, get_op("layer_norm").reference(x, gamma, np.zeros_like(beta), axis=-1, epsilon=1e-5), dtype)
    shim.check(shim.rms_norm(ptr(x), ptr(gamma), ptr(out), code(x.dtype), rows, n, 1e-6))
    assert_close(out, get_op("rms_norm").reference(x, gamma, axis=-1, epsilon=1e-6), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("batch, pixels, channels, squeeze, activation, gate, biases", SQUEEZE_EXCITATION_CASES)
@pytest.mark.parametrize("scale", [False, True])
def test_squeeze_excitation(shim, dtype, batch, pixels, channels, squeeze, activation, gate, biases, scale):
    x, w1, b1, w2, b2 = squeeze_excitation_inputs(rng, batch, pixels, channels, squeeze, npdtype(dtype), biases)
    out = np.empty((batch, pixels, channels) if scale else (batch, channels), x.dtype)
    shim.check(shim.squeeze_excitation(ptr(x), ptr(w1), ptr(b1), ptr(w2), ptr(b2), ptr(out), code(x.dtype), batch,
                                       pixels, channels, squeeze, ACTIVATIONS[activation], 0.0, 0.0,
                                       ACTIVATIONS[gate], 1 / 6, 0.5, int(scale)))
    assert_close(out, squeeze_excitation_reference(x, w1, b1, w2, b2, activation, gate, scale=scale), dtype)


def test_squeeze_excitation_refuses_what_it_does_not_compute(shim):
    x, w1, b1, w2, b2 = squeeze_excitation_inputs(rng, 2, 3, 16, 4, np.float64, True)
    out = np.empty((2, 16))
    args = (ptr(x), ptr(w1), ptr(b1), ptr(w2), ptr(b2), ptr(out))
    shim.expect_error(shim.squeeze_excitation(*args, code(x.dtype), 2, 3, 16, 4, 1, 0.0, 0.0, 4, 0.0, 0.0, 0),
                      "squeeze_excitation", "float64 is not supported")
    shim.expect_error(shim.squeeze_excitation(*args, 0, 2, 3, 12, 4, 1, 0.0, 0.0, 4, 0.0, 0.0, 0),
                      "squeeze_excitation", "channels is 12; expected a multiple of 8")
    shim.expect_error(shim.squeeze_excitation(*args, 0, 2, 3, 16, 4, 9, 0.0, 0.0, 4, 0.0, 0.0, 0),
                      "squeeze_excitation", "activation 9 is not a byoc_activation")
    shim.expect_error(shim.squeeze_excitation(*args, 0, 2, 0, 16, 4, 1, 0.0, 0.0, 4, 0.0, 0.0, 0),
                      "squeeze_excitation", "pixels")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, axis", [((2, 3, 4, 5), 1), ((6, 7), 1), ((5, 3), 0)])
def test_batch_norm(shim, dtype, shape, axis):
    x = random(shape, dtype)
    channels = shape[axis]
    scale, bias, mean = (random((channels,), dtype) for _ in range(3))
    var = rng.uniform(0.5, 2.0, size=channels).astype(npdtype(dtype))
    expected = get_op("batch_norm").reference(x, scale, bias, mean, var, epsilon=1e-3, axis=axis)
    out = np.empty_like(x)
    outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    shim.check(shim.batch_norm(ptr(x), ptr(scale), ptr(bias), ptr(mean), ptr(var), ptr(out), code(x.dtype), outer,
                               channels, inner, 1e-3))
    assert_close(out, expected, dtype)


def test_norm_errors(shim):
    x = np.zeros((2, 4), np.float32)
    shim.expect_error(shim.layer_norm(ptr(x), None, None, ptr(x), 0, 2, 4, 1e-5), "layer_norm", "gamma")
    shim.expect_error(shim.rms_norm(ptr(x), ptr(x), ptr(x), 0, -2, 4, 1e-5), "rms_norm", "rows")
    shim.expect_error(shim.batch_norm(ptr(x), ptr(x), ptr(x), None, ptr(x), ptr(x), 0, 1, 2, 4, 1e-5),
                      "batch_norm", "mean")


# ---------------------------------------------------------------- matmul

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int64", "int8"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (67, 33, 129), (5, 70, 3), (130, 9, 300), (4, 6, 0)])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul(shim, dtype, m, n, k, trans_a, trans_b):
    batch = 2
    a = random((batch, m, k), dtype, -3, 4)
    b = random((batch, k, n), dtype, -3, 4)
    expected = get_op("matmul").reference(a, b)
    # Stored operands: transposed copies when asked for.
    a_stored = np.ascontiguousarray(a.transpose(0, 2, 1)) if trans_a else a
    b_stored = np.ascontiguousarray(b.transpose(0, 2, 1)) if trans_b else b
    out = np.full(expected.shape, 9, expected.dtype)
    shim.check(shim.matmul(ptr(a_stored), ptr(b_stored), ptr(out), code(a.dtype), batch, m, n, k, int(trans_a),
                           int(trans_b), m * k, k * n, m * n, -1, None, 0))
    if dtype in TOLERANCES:
        rtol, atol = TOLERANCES[dtype]
        scale = max(1.0, float(np.sqrt(k)))  # errors grow with the length of the dot products
        np.testing.assert_allclose(out.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol * scale)
    else:
        np.testing.assert_array_equal(out, expected)  # int8 wraps like the reference


def test_matmul_broadcast_batch_stride(shim):
    a, b = random((4, 7)), random((3, 7, 5))  # one a for every batch: stride 0
    expected = get_op("matmul").reference(a, b)
    out = np.empty(expected.shape, np.float32)
    shim.check(shim.matmul(ptr(a), ptr(b), ptr(out), 0, 3, 4, 5, 7, 0, 0, 0, 35, 20, -1, None, 0))
    assert_close(out, expected)


def test_matmul_errors(shim):
    x = np.zeros(4, np.float32)
    shim.expect_error(shim.matmul(ptr(x), ptr(x), ptr(x), 0, 1, -2, 2, 2, 0, 0, 0, 0, 0, -1, None, 0), "matmul", "m ")
    shim.expect_error(shim.matmul(None, ptr(x), ptr(x), 0, 1, 2, 2, 1, 0, 0, 0, 0, 0, -1, None, 0), "matmul", "a ")
    shim.expect_error(shim.matmul(ptr(x), ptr(x), ptr(x), code(bool), 1, 2, 2, 1, 0, 0, 0, 0, 0, -1, None, 0),
                      "matmul", "bool")


# ---------------------------------------------------------------- conv2d

CONV_CASES = [
    # (batch, channels, height, width, out_channels, kernel, strides, pads, dilations, groups)
    (2, 3, 9, 8, 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (1, 4, 11, 7, 6, (3, 2), (2, 3), (0, 2, 1, 0), (1, 1), 2),
    (1, 6, 10, 10, 6, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 6),  # depthwise, dilated
    (3, 5, 6, 6, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    (1, 2, 5, 13, 3, (5, 1), (1, 2), (3, 0, 3, 1), (1, 3), 1),
    (1, 70, 6, 5, 66, (2, 2), (1, 1), (1, 0, 0, 1), (1, 1), 1),  # more than one GEMM block of rows/depth
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(shim, dtype, layout, case):
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
    assert shim.conv2d_workspace(code(data.dtype), nhwc, *sizes, groups) == 0
    bias = random((out_channels,), dtype)
    for with_bias in (False, True):
        out = np.full(expected.shape, 5, data.dtype)
        shim.check(shim.conv2d(ptr(data), ptr(weight), ptr(bias) if with_bias else None, ptr(out), code(data.dtype),
                               nhwc, *sizes, *strides, pads[0], pads[1], *dilations, groups, None, 0))
        channel_axis = 1 if layout == "NCHW" else 3
        shape = [1, 1, 1, 1]
        shape[channel_axis] = out_channels
        wanted = expected
        if with_bias:
            wanted = (expected.astype(np.float64) + bias.astype(np.float64).reshape(shape)).astype(data.dtype)
        if dtype in TOLERANCES:
            rtol, atol = TOLERANCES[dtype]
            depth = channels // groups * kernel[0] * kernel[1]
            np.testing.assert_allclose(out.astype(np.float64), wanted.astype(np.float64), rtol=rtol,
                                       atol=atol * max(1.0, np.sqrt(depth)) * 4)
        else:
            np.testing.assert_array_equal(out, wanted)


def test_conv2d_errors(shim):
    x = np.zeros(64, np.float32)
    args = lambda **changes: [changes.get(k, v) for k, v in dict(  # noqa: E731
        in_=ptr(x), weight=ptr(x), bias=None, out=ptr(x), dtype=0, layout=0, batch=1, in_channels=4, in_h=2, in_w=2,
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
    ((1, 70, 6, 6), (2, 3), (1, 2), (0, 1, 1, 1), (1, 2), False),  # more channels than one NHWC chunk
]


# (op, count_include_pad, dtype): max pools any number, average pools floats only.
POOL_KINDS = [("max_pool2d", False, dtype) for dtype in FLOATS + ["int64", "int8"]] + [
    ("avg_pool2d", count_include_pad, dtype) for count_include_pad in (False, True) for dtype in FLOATS]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("op_name, count_include_pad, dtype", POOL_KINDS)
def test_pool2d(shim, dtype, layout, case, op_name, count_include_pad):
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
    out = np.full(expected.shape, 3, data.dtype)
    shim.check(shim.pool2d(ptr(data), ptr(out), code(data.dtype), int(op_name == "avg_pool2d"), int(layout == "NHWC"),
                           batch, channels, height, width, out_h, out_w, *kernel, *strides, *pads, *dilations,
                           int(count_include_pad)))
    assert_close(out, expected, dtype)


def test_pool2d_errors(shim):
    x = np.zeros(16, np.int64)
    common = (1, 1, 4, 4, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 0)
    shim.expect_error(shim.pool2d(ptr(x), ptr(x), code(np.int64), 1, 0, *common), "pool2d", "int64")
    shim.expect_error(shim.pool2d(ptr(x), ptr(x), code(np.int64), 2, 0, *common), "pool2d", "kind")
    bad = list(common)
    bad[13] = -1  # pad_right
    shim.expect_error(shim.pool2d(ptr(x), ptr(x), code(np.int64), 0, 0, *bad), "pool2d", "pad_right")


# ---------------------------------------------------------------- 16-bit float conversions

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_rounding_matches_numpy(shim, dtype):
    """Every bit pattern survives load/store (cumsum over one element), and the sum of
    two values rounds to nearest even like NumPy/ml_dtypes (subnormals, ties, overflow)."""
    patterns = np.arange(1 << 16, dtype=np.uint16).view(npdtype(dtype))
    out = np.empty_like(patterns)
    shim.check(shim.cumsum(ptr(patterns), ptr(out), code(patterns.dtype), patterns.size, 1, 1, 0, 0))
    finite = ~np.isnan(patterns.astype(np.float32))
    assert_same_bits(out[finite], patterns[finite])
    assert np.isnan(out[~finite].astype(np.float32)).all()

    pairs = rng.integers(0, 1 << 16, size=(20000, 2), dtype=np.uint16).view(npdtype(dtype))
    pairs[:100, 1] = pairs[:100, 0]  # doubling: carries into the exponent, overflow to inf
    with np.errstate(over="ignore"):  # sums past the largest finite value become inf
        expected = get_op("sum").reference(pairs, axes=(1,), keepdims=False)
    out = np.empty(expected.shape, pairs.dtype)
    shim.check(shim.reduce(ptr(pairs), ptr(out), code(pairs.dtype), 0, pairs.shape[0], 2, 1))
    finite = ~np.isnan(expected.astype(np.float32))
    assert_same_bits(out[finite], expected[finite])
    assert np.isnan(out[~finite].astype(np.float32)).all()


def test_last_error_is_per_failure(shim):
    x = np.zeros(4, np.float32)
    shim.expect_error(shim.trilu(None, ptr(x), 4, 1, 2, 2, 1, 0), "trilu", "in is NULL")
    shim.check(shim.trilu(ptr(x), ptr(x), 4, 1, 2, 2, 1, 0))  # success leaves the last message alone
    assert "byoc_shim_trilu" in shim.last_error()


def test_a_shim_built_for_some_dtypes_refuses_the_others_by_name(tmp_path):
    """BYOC_SHIM_DTYPES (a model build passes the dtypes its code names): kernels for those
    dtypes only; another dtype is a clear error naming the function, not a crash. A float16
    BERT's layer norm family compiles in a fraction of the time."""
    from byoc.backends.builtin import shim_dtype_mask
    from byoc.runtime import INCLUDE_DIR
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    mask = shim_dtype_mask({"BYOC_FLOAT32", "BYOC_INT64"})
    assert mask == 0b10001
    sources = [SHIM_DIR / "cpu" / "common.cpp", SHIM_DIR / "cpu" / "norm.cpp"]
    library = tmp_path / "libnorm.so"
    subprocess.run([compiler, "-O1", "-std=c++17", "-fPIC", "-shared", "-Wall", "-Werror", f"-I{INCLUDE_DIR}",
                    f"-DBYOC_SHIM_DTYPES={mask:#x}", *map(str, sources), "-o", str(library)], check=True)
    lib = ctypes.CDLL(str(library))
    lib.byoc_shim_layer_norm.argtypes = SIGNATURES["byoc_shim_layer_norm"]
    lib.byoc_shim_last_error.restype = ctypes.c_char_p
    for dtype, compiled in (("float32", True), ("float64", False), ("float16", False)):
        x = random((3, 8), dtype)
        gamma, beta, out = np.ones(8, x.dtype), np.zeros(8, x.dtype), np.empty_like(x)
        status = lib.byoc_shim_layer_norm(ptr(x), ptr(gamma), ptr(beta), ptr(out), code(npdtype(dtype)), 3, 8, 1e-5,
                                          None)
        if compiled:
            assert status == 0, lib.byoc_shim_last_error()
        else:
            message = lib.byoc_shim_last_error().decode()
            assert status != 0 and "byoc_shim_layer_norm" in message and "no kernels in this library's shim" in message

