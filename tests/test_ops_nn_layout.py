"""Tests of the matmul, nn and layout ops: type inference, references, errors.

Each reference is checked against an independent computation: plain NumPy for the
layout ops, slow loops for conv2d and the pools, and, where installed, PyTorch and
onnxruntime (the semantics these ops promise are theirs).
"""
from __future__ import annotations

import importlib
import itertools
import pathlib
import sys
import types

import ml_dtypes
import numpy as np
import pytest

from byoc.errors import TypeInferenceError


def _load_ops():
    """Imports byoc.ops. While the sibling op modules (elementwise, reduction,
    normalization) are still being written, loads just the modules these tests need."""
    ops_folder = pathlib.Path(__file__).parent.parent / "byoc" / "ops"
    siblings = ("elementwise", "reduction", "normalization")
    try:
        importlib.import_module("byoc.ops")
    except ImportError:
        if all((ops_folder / f"{name}.py").exists() for name in siblings):
            raise
        package = types.ModuleType("byoc.ops")
        package.__path__ = [str(ops_folder)]
        sys.modules["byoc.ops"] = package
        for name in ("linalg", "nn", "layout"):
            importlib.import_module(f"byoc.ops.{name}")


_load_ops()

from byoc.interpreter import interpret  # noqa: E402
from byoc.ir import FunctionBuilder, TensorType, TupleType  # noqa: E402
from byoc.ir.op import get_op  # noqa: E402
from byoc.ir.types import dtype_of_numpy, numpy_dtype  # noqa: E402

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min
rng = np.random.default_rng(0)


def random(shape, dtype="float32"):
    if np.dtype(numpy_dtype(dtype)).kind in "iu":
        return rng.integers(-5, 6, size=shape).astype(numpy_dtype(dtype))
    return rng.standard_normal(shape).astype(numpy_dtype(dtype))


def call_type(op_name, *input_types, **attrs):
    """The inferred type of `op_name` applied to inputs of the given (shape, dtype)s."""
    fb = FunctionBuilder()
    params = [fb.param(f"x{i}", shape, dtype) for i, (shape, dtype) in enumerate(input_types)]
    return fb.call(op_name, *params, **attrs).type


def evaluate(op_name, *inputs, **attrs):
    """Builds a one-op function, runs the reference, and checks that it returned exactly
    the inferred dtype and shape. Returns (inferred type, result)."""
    fb = FunctionBuilder()
    params = [fb.param(f"x{i}", x.shape, dtype_of_numpy(x.dtype)) for i, x in enumerate(inputs)]
    result_var = fb.call(op_name, *params, **attrs)
    call = fb.bindings[-1].value
    result = get_op(op_name).reference(*inputs, **call.attrs)
    expected_types = result_var.type.fields if isinstance(result_var.type, TupleType) else (result_var.type,)
    results = result if isinstance(result_var.type, TupleType) else (result,)
    assert len(results) == len(expected_types)
    for value, expected in zip(results, expected_types, strict=True):
        assert isinstance(value, np.ndarray)
        assert value.dtype == numpy_dtype(expected.dtype), (value.dtype, expected)
        assert value.shape == expected.shape, (value.shape, expected)
    return result_var.type, result


# ================================================================= matmul


@pytest.mark.parametrize("a_shape, b_shape, expected", [
    ((2, 3), (3, 4), (2, 4)),
    ((3,), (3, 4), (4,)),
    ((2, 3), (3,), (2,)),
    ((3,), (3,), ()),
    ((5, 2, 3), (3, 4), (5, 2, 4)),
    ((5, 1, 2, 3), (6, 3, 4), (5, 6, 2, 4)),
    ((2, 0), (0, 3), (2, 3)),
])
def test_matmul_shapes_and_values(a_shape, b_shape, expected):
    a, b = random(a_shape), random(b_shape)
    type_, result = evaluate("matmul", a, b)
    assert type_ == TensorType(expected, "float32")
    np.testing.assert_allclose(result, np.matmul(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)


def test_matmul_integers_accumulate_exactly():
    a = np.full((2, 4), 2**20, dtype=np.int64)
    b = np.full((4, 3), 2**20, dtype=np.int64)
    _, result = evaluate("matmul", a, b)
    assert (result == 4 * 2**40).all()
    small = rng.integers(-100, 100, size=(3, 50)).astype(np.int32)
    _, result = evaluate("matmul", small, small.T.copy())
    np.testing.assert_array_equal(result, small.astype(np.int64) @ small.T.astype(np.int64))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmul_16_bit_floats(dtype):
    a, b = random((4, 8), dtype), random((8, 5), dtype)
    type_, result = evaluate("matmul", a, b)
    assert type_.dtype == dtype
    expected = (a.astype(np.float32) @ b.astype(np.float32)).astype(numpy_dtype(dtype))
    np.testing.assert_array_equal(result.astype(np.float32), expected.astype(np.float32))


def test_matmul_errors():
    with pytest.raises(TypeInferenceError, match=r"matmul: inner dimensions differ: \(2, 3\) @ \(4, 5\)"):
        call_type("matmul", ((2, 3), "float32"), ((4, 5), "float32"))
    with pytest.raises(TypeInferenceError, match="matmul.*float32, float16"):
        call_type("matmul", ((2, 3), "float32"), ((3, 5), "float16"))
    with pytest.raises(TypeInferenceError, match="matmul: batch dimensions"):
        call_type("matmul", ((2, 2, 3), "float32"), ((4, 3, 5), "float32"))
    with pytest.raises(TypeInferenceError, match="matmul: input a must have rank >= 1"):
        call_type("matmul", ((), "float32"), ((3,), "float32"))


# ================================================================= conv2d: naive references


def naive_conv2d(x, w, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1):
    """NCHW / OIHW convolution, one output element at a time."""
    batch, channels, height, width = x.shape
    out_channels, group_channels, kernel_height, kernel_width = w.shape
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    out_height = (height + pads[0] + pads[2] - dilations[0] * (kernel_height - 1) - 1) // strides[0] + 1
    out_width = (width + pads[1] + pads[3] - dilations[1] * (kernel_width - 1) - 1) // strides[1] + 1
    out_per_group = out_channels // groups
    result = np.zeros((batch, out_channels, out_height, out_width))
    for n, o, i, j in itertools.product(range(batch), range(out_channels), range(out_height), range(out_width)):
        group = o // out_per_group
        total = 0.0
        for c, kh, kw in itertools.product(range(group_channels), range(kernel_height), range(kernel_width)):
            total += (padded[n, group * group_channels + c, i * strides[0] + kh * dilations[0],
                             j * strides[1] + kw * dilations[1]] * w[o, c, kh, kw])
        result[n, o, i, j] = total
    return result


CONV_CASES = [
    # (data shape NCHW, weight shape OIHW, attrs)
    ((1, 3, 5, 5), (4, 3, 3, 3), {}),
    ((2, 3, 7, 6), (4, 3, 3, 2), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 8, 8), (3, 2, 3, 3), {"dilations": [2, 3], "pads": [2, 0, 1, 3]}),
    ((1, 4, 6, 6), (6, 2, 3, 3), {"groups": 2, "strides": [1, 2], "pads": [1, 1, 1, 1]}),
    ((2, 4, 5, 5), (4, 1, 3, 3), {"groups": 4, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 3, 6, 5), (6, 1, 2, 2), {"groups": 3, "strides": [2, 1], "dilations": [2, 1]}),  # depthwise x2
    ((1, 2, 4, 4), (3, 2, 1, 1), {"strides": [3, 3]}),
]


@pytest.mark.parametrize("data_shape, weight_shape, attrs", CONV_CASES)
def test_conv2d_matches_naive_loops(data_shape, weight_shape, attrs):
    x, w = random(data_shape), random(weight_shape)
    type_, result = evaluate("conv2d", x, w, **attrs)
    expected = naive_conv2d(x, w, **attrs)
    assert type_ == TensorType(expected.shape, "float32")
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("data_shape, weight_shape, attrs", CONV_CASES)
def test_conv2d_nhwc_matches_nchw(data_shape, weight_shape, attrs):
    x, w = random(data_shape), random(weight_shape)
    _, nchw = evaluate("conv2d", x, w, **attrs)
    type_, nhwc = evaluate("conv2d", x.transpose(0, 2, 3, 1).copy(), w.transpose(0, 2, 3, 1).copy(),
                           data_layout="NHWC", kernel_layout="OHWI", **attrs)
    assert type_.shape == nchw.transpose(0, 2, 3, 1).shape
    np.testing.assert_allclose(nhwc, nchw.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("data_shape, weight_shape, attrs", CONV_CASES)
def test_conv2d_matches_torch(data_shape, weight_shape, attrs):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x, w = random(data_shape), random(weight_shape)
    _, result = evaluate("conv2d", x, w, **attrs)
    top, left, bottom, right = attrs.get("pads", (0, 0, 0, 0))
    padded = functional.pad(torch.from_numpy(x), (left, right, top, bottom))
    expected = functional.conv2d(padded, torch.from_numpy(w), stride=tuple(attrs.get("strides", (1, 1))),
                                 dilation=tuple(attrs.get("dilations", (1, 1))), groups=attrs.get("groups", 1))
    np.testing.assert_allclose(result, expected.numpy(), rtol=1e-4, atol=1e-4)


def test_conv2d_integer_and_16_bit_dtypes():
    x, w = random((1, 2, 4, 4), "int32"), random((3, 2, 3, 3), "int32")
    _, result = evaluate("conv2d", x, w, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(result, naive_conv2d(x, w, pads=(1, 1, 1, 1)).astype(np.int32))
    for dtype in ("float16", "bfloat16"):
        x, w = random((1, 2, 4, 4), dtype), random((3, 2, 3, 3), dtype)
        type_, result = evaluate("conv2d", x, w)
        assert type_.dtype == dtype
        np.testing.assert_allclose(result.astype(np.float32), naive_conv2d(x.astype(np.float32), w.astype(np.float32)),
                                   rtol=2e-2, atol=5e-2)


def test_conv2d_resnet_sized_layer_is_fast():
    import time
    x, w = random((8, 64, 32, 32)), random((64, 64, 3, 3))
    start = time.perf_counter()
    _, result = evaluate("conv2d", x, w, pads=[1, 1, 1, 1])
    assert result.shape == (8, 64, 32, 32)
    assert time.perf_counter() - start < 5.0


def test_conv2d_through_interpreter():
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (1, 3, 8, 8))
        w = fb.param("w", (4, 3, 3, 3))
        y = fb.call("conv2d", x, w, strides=[2, 2], pads=[1, 1, 1, 1])
        fb.ret(fb.call("max_pool2d", y, kernel=[2, 2], strides=[2, 2]))
    x_value, w_value = random((1, 3, 8, 8)), random((4, 3, 3, 3))
    result = interpret(fb.module(), x_value, w_value)
    conv = naive_conv2d(x_value, w_value, strides=(2, 2), pads=(1, 1, 1, 1))
    expected = conv.reshape(1, 4, 2, 2, 2, 2).max(axis=(3, 5))
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


def test_conv2d_errors():
    with pytest.raises(TypeInferenceError, match="conv2d: weight .* expects 2 input channels per group, "
                                                 "but data .* has 3 channels"):
        call_type("conv2d", ((1, 3, 5, 5), "float32"), ((4, 2, 3, 3), "float32"))
    with pytest.raises(TypeInferenceError, match="conv2d: data .* has 6 channels, which groups=4 does not divide"):
        call_type("conv2d", ((1, 6, 5, 5), "float32"), ((4, 2, 3, 3), "float32"), groups=4)
    with pytest.raises(TypeInferenceError, match="conv2d: weight .* has 5 output channels, which groups=2"):
        call_type("conv2d", ((1, 4, 5, 5), "float32"), ((5, 2, 3, 3), "float32"), groups=2)
    with pytest.raises(TypeInferenceError, match="conv2d: data_layout 'NCWH' is not supported; "
                                                 "expected one of NCHW, NHWC"):
        call_type("conv2d", ((1, 3, 5, 5), "float32"), ((4, 3, 3, 3), "float32"), data_layout="NCWH")
    with pytest.raises(TypeInferenceError, match="conv2d: kernel_layout 'OIHW' does not go with "
                                                 "data_layout 'NHWC'; expected 'OHWI'"):
        call_type("conv2d", ((1, 5, 5, 3), "float32"), ((4, 3, 3, 3), "float32"), data_layout="NHWC")
    with pytest.raises(TypeInferenceError, match="conv2d: the kernel height 3 .* does not fit"):
        call_type("conv2d", ((1, 3, 2, 5), "float32"), ((4, 3, 3, 3), "float32"))
    with pytest.raises(TypeInferenceError, match=r"conv2d: pads must be 4 non-negative integers, got \(1, 1\)"):
        call_type("conv2d", ((1, 3, 5, 5), "float32"), ((4, 3, 3, 3), "float32"), pads=[1, 1])
    with pytest.raises(TypeInferenceError, match="conv2d: input weight must be 4-D"):
        call_type("conv2d", ((1, 3, 5, 5), "float32"), ((4, 3, 3), "float32"))
    with pytest.raises(TypeInferenceError, match="conv2d needs inputs of one dtype"):
        call_type("conv2d", ((1, 3, 5, 5), "float32"), ((4, 3, 3, 3), "float16"))


# ================================================================= pools


def onnx_pool_output_size(size, kernel, stride, pad_begin, pad_end, dilation, ceil_mode):
    effective = dilation * (kernel - 1) + 1
    span = size + pad_begin + pad_end - effective
    count = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (count - 1) * stride >= size + pad_begin:
        count -= 1
    return count


def naive_pool(x, kind, kernel, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), ceil_mode=False,
               count_include_pad=False):
    """NCHW max or average pool, one tap at a time."""
    batch, channels, height, width = x.shape
    out_height = onnx_pool_output_size(height, kernel[0], strides[0], pads[0], pads[2], dilations[0], ceil_mode)
    out_width = onnx_pool_output_size(width, kernel[1], strides[1], pads[1], pads[3], dilations[1], ceil_mode)
    result = np.zeros((batch, channels, out_height, out_width))
    for n, c, i, j in itertools.product(range(batch), range(channels), range(out_height), range(out_width)):
        values, counted = [], 0
        for kh, kw in itertools.product(range(kernel[0]), range(kernel[1])):
            h = i * strides[0] - pads[0] + kh * dilations[0]
            w = j * strides[1] - pads[1] + kw * dilations[1]
            inside = 0 <= h < height and 0 <= w < width
            in_explicit_padding = -pads[0] <= h < height + pads[2] and -pads[1] <= w < width + pads[3]
            if inside:
                values.append(float(x[n, c, h, w]))
            if inside or (count_include_pad and in_explicit_padding):
                counted += 1
        if kind == "max":
            result[n, c, i, j] = max(values, default=-np.inf)
        else:
            result[n, c, i, j] = sum(values) / max(counted, 1)
    return result


POOL_CASES = [
    ((1, 2, 5, 5), {"kernel": [2, 2]}),
    ((2, 3, 6, 7), {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 5, 5), {"kernel": [2, 2], "strides": [2, 2], "ceil_mode": True}),
    ((1, 2, 6, 6), {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": True}),
    ((1, 1, 7, 5), {"kernel": [3, 2], "strides": [3, 2], "pads": [1, 0, 1, 0], "ceil_mode": True}),
    ((1, 2, 8, 8), {"kernel": [2, 3], "dilations": [2, 2], "pads": [0, 1, 2, 1]}),
    ((1, 1, 4, 4), {"kernel": [3, 3], "strides": [2, 2], "pads": [0, 0, 2, 2], "ceil_mode": True}),
]


@pytest.mark.parametrize("kind, extra", [
    ("max", {}), ("avg", {"count_include_pad": False}), ("avg", {"count_include_pad": True})])
@pytest.mark.parametrize("data_shape, attrs", POOL_CASES)
def test_pools_match_naive_loops(kind, extra, data_shape, attrs):
    x = random(data_shape)
    type_, result = evaluate(f"{kind}_pool2d", x, **attrs, **extra)
    expected = naive_pool(x, kind, **attrs, **extra)
    assert type_ == TensorType(expected.shape, "float32")
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("data_shape, attrs", POOL_CASES)
def test_pools_nhwc_match_nchw(kind, data_shape, attrs):
    x = random(data_shape)
    _, nchw = evaluate(f"{kind}_pool2d", x, **attrs)
    _, nhwc = evaluate(f"{kind}_pool2d", x.transpose(0, 2, 3, 1).copy(), layout="NHWC", **attrs)
    np.testing.assert_allclose(nhwc, nchw.transpose(0, 2, 3, 1), rtol=1e-6)


TORCH_POOL_CASES = [
    # symmetric pads of at most half the kernel: what torch accepts
    ((1, 2, 5, 5), dict(kernel=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=True)),
    ((2, 3, 6, 6), dict(kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=True)),
    ((1, 2, 7, 9), dict(kernel=[3, 2], strides=[2, 3], pads=[1, 1, 1, 1], ceil_mode=False)),
    ((1, 1, 8, 8), dict(kernel=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=True)),
    ((1, 2, 10, 9), dict(kernel=[2, 3], strides=[2, 2], pads=[1, 0, 1, 0], dilations=[2, 3], ceil_mode=True)),
]


@pytest.mark.parametrize("data_shape, attrs", TORCH_POOL_CASES)
def test_max_pool2d_matches_torch(data_shape, attrs):
    torch = pytest.importorskip("torch")
    x = random(data_shape)
    _, result = evaluate("max_pool2d", x, **attrs)
    expected = torch.nn.functional.max_pool2d(
        torch.from_numpy(x), tuple(attrs["kernel"]), tuple(attrs["strides"]), tuple(attrs["pads"][:2]),
        tuple(attrs.get("dilations", (1, 1))), ceil_mode=attrs["ceil_mode"])
    np.testing.assert_array_equal(result, expected.numpy())


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("data_shape, attrs", [c for c in TORCH_POOL_CASES if "dilations" not in c[1]])
def test_avg_pool2d_matches_torch(count_include_pad, data_shape, attrs):
    torch = pytest.importorskip("torch")
    x = random(data_shape)
    _, result = evaluate("avg_pool2d", x, count_include_pad=count_include_pad, **attrs)
    expected = torch.nn.functional.avg_pool2d(
        torch.from_numpy(x), tuple(attrs["kernel"]), tuple(attrs["strides"]), tuple(attrs["pads"][:2]),
        ceil_mode=attrs["ceil_mode"], count_include_pad=count_include_pad)
    np.testing.assert_allclose(result, expected.numpy(), rtol=1e-5, atol=1e-6)


def test_max_pool2d_integers_and_bfloat16():
    x = random((1, 2, 5, 5), "int8")
    _, result = evaluate("max_pool2d", x, kernel=[3, 3], pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(result, naive_pool(x, "max", [3, 3], pads=(1, 1, 1, 1)).astype(np.int8))
    x = random((1, 2, 5, 5), "bfloat16")
    type_, result = evaluate("avg_pool2d", x, kernel=[2, 2])
    assert type_.dtype == "bfloat16"
    np.testing.assert_allclose(result.astype(np.float32), naive_pool(x.astype(np.float32), "avg", [2, 2]),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("layout, shape, expected_shape", [
    ("NCHW", (2, 3, 4, 5), (2, 3, 1, 1)),
    ("NHWC", (2, 4, 5, 3), (2, 1, 1, 3)),
])
def test_global_pools(layout, shape, expected_shape):
    x = random(shape)
    spatial = (2, 3) if layout == "NCHW" else (1, 2)
    type_, result = evaluate("global_avg_pool2d", x, layout=layout)
    assert type_ == TensorType(expected_shape, "float32")
    np.testing.assert_allclose(result, x.mean(axis=spatial, keepdims=True), rtol=1e-6)
    type_, result = evaluate("global_max_pool2d", x, layout=layout)
    assert type_ == TensorType(expected_shape, "float32")
    np.testing.assert_array_equal(result, x.max(axis=spatial, keepdims=True))
    _, half = evaluate("global_avg_pool2d", x.astype(np.float16), layout=layout)
    assert half.dtype == np.float16


def test_pool_errors():
    with pytest.raises(TypeInferenceError, match="max_pool2d: required attribute 'kernel' is missing"):
        call_type("max_pool2d", ((1, 2, 5, 5), "float32"))
    with pytest.raises(TypeInferenceError, match="max_pool2d: layout 'HWCN' is not supported"):
        call_type("max_pool2d", ((1, 2, 5, 5), "float32"), kernel=[2, 2], layout="HWCN")
    with pytest.raises(TypeInferenceError, match="global_avg_pool2d: layout 'NCW' is not supported"):
        call_type("global_avg_pool2d", ((1, 2, 5, 5), "float32"), layout="NCW")
    with pytest.raises(TypeInferenceError, match=r"avg_pool2d: kernel must be 2 positive integers, got \(2,\)"):
        call_type("avg_pool2d", ((1, 2, 5, 5), "float32"), kernel=[2])
    with pytest.raises(TypeInferenceError, match="avg_pool2d: input data has dtype int32"):
        call_type("avg_pool2d", ((1, 2, 5, 5), "int32"), kernel=[2, 2])
    with pytest.raises(TypeInferenceError, match="max_pool2d: the kernel width 6"):
        call_type("max_pool2d", ((1, 2, 5, 5), "float32"), kernel=[2, 6])
    with pytest.raises(TypeInferenceError, match="global_max_pool2d: input data must be 4-D"):
        call_type("global_max_pool2d", ((2, 5, 5), "float32"))


# ================================================================= onnxruntime cross-checks


def run_onnx_node(op_type, inputs, **attributes):
    """Runs one ONNX node on onnxruntime (the semantics the layout ops follow)."""
    pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    from onnx import helper

    names = [f"input{i}" for i in range(len(inputs))]
    node = helper.make_node(op_type, names, ["output"], **attributes)
    graph = helper.make_graph(
        [node], "single_node",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
         for name, value in zip(names, inputs)],
        [helper.make_tensor_value_info("output", helper.np_dtype_to_tensor_dtype(inputs[0].dtype), None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip(names, inputs)))[0]


@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("data_shape, attrs", [c for c in POOL_CASES if "dilations" not in c[1]])
def test_pools_match_onnxruntime(kind, data_shape, attrs):
    x = random(data_shape)
    op_name = "max_pool2d" if kind == "MaxPool" else "avg_pool2d"
    _, result = evaluate(op_name, x, **attrs)
    expected = run_onnx_node(kind, [x], kernel_shape=attrs["kernel"], strides=attrs.get("strides", [1, 1]),
                             pads=attrs.get("pads", [0, 0, 0, 0]), ceil_mode=int(attrs.get("ceil_mode", False)))
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


# ================================================================= reshape, transpose, broadcast_to


@pytest.mark.parametrize("source, target, expected", [
    ((2, 3, 4), (6, 4), (6, 4)),
    ((2, 3, 4), (-1, 4), (6, 4)),
    ((2, 3, 4), (2, -1), (2, 12)),
    ((2, 3, 4), (24,), (24,)),
    ((1,), (), ()),
    ((0, 3), (3, 0), (3, 0)),
    ((0, 3), (0, 5, 7), (0, 5, 7)),
])
def test_reshape(source, target, expected):
    x = random(source)
    type_, result = evaluate("reshape", x, shape=list(target))
    assert type_ == TensorType(expected, "float32")
    np.testing.assert_array_equal(result, x.reshape(expected))


def test_reshape_errors():
    with pytest.raises(TypeInferenceError, match=r"reshape: cannot reshape \(2, 3\) \(6 elements\) to \(4, 2\)"):
        call_type("reshape", ((2, 3), "float32"), shape=[4, 2])
    with pytest.raises(TypeInferenceError, match=r"reshape: cannot reshape \(2, 3\) \(6 elements\) to \(4, -1\)"):
        call_type("reshape", ((2, 3), "float32"), shape=[4, -1])
    with pytest.raises(TypeInferenceError, match="reshape: shape .* has more than one -1"):
        call_type("reshape", ((2, 3), "float32"), shape=[-1, -1])
    with pytest.raises(TypeInferenceError, match="reshape: cannot infer the -1"):
        call_type("reshape", ((0, 3), "float32"), shape=[0, -1])
    with pytest.raises(TypeInferenceError, match="reshape: required attribute 'shape'"):
        call_type("reshape", ((2, 3), "float32"))


def test_transpose():
    x = random((2, 3, 4))
    type_, result = evaluate("transpose", x)
    assert type_.shape == (4, 3, 2)
    np.testing.assert_array_equal(result, x.T)
    type_, result = evaluate("transpose", x, axes=[1, 2, 0])
    assert type_.shape == (3, 4, 2)
    np.testing.assert_array_equal(result, np.moveaxis(x, 0, 2))
    with pytest.raises(TypeInferenceError, match=r"transpose: axes \(0, 0, 1\) are not a permutation of 0..2"):
        call_type("transpose", ((2, 3, 4), "float32"), axes=[0, 0, 1])
    with pytest.raises(TypeInferenceError, match="transpose: axes .* not a permutation"):
        call_type("transpose", ((2, 3, 4), "float32"), axes=[1, 0])


def test_broadcast_to():
    x = random((3, 1))
    type_, result = evaluate("broadcast_to", x, shape=[2, 3, 4])
    assert type_ == TensorType((2, 3, 4), "float32")
    np.testing.assert_array_equal(result, np.tile(x, (2, 1, 4)))
    with pytest.raises(TypeInferenceError, match=r"broadcast_to: cannot broadcast \(3, 2\) to \(3, 4\)"):
        call_type("broadcast_to", ((3, 2), "float32"), shape=[3, 4])
    with pytest.raises(TypeInferenceError, match=r"broadcast_to: cannot broadcast \(3, 4\) to \(4,\)"):
        call_type("broadcast_to", ((3, 4), "float32"), shape=[4])


# ================================================================= concat, split


def test_concat():
    a, b, c = random((2, 1, 4)), random((2, 3, 4)), random((2, 0, 4))
    type_, result = evaluate("concat", a, b, c, axis=-2)
    assert type_ == TensorType((2, 4, 4), "float32")
    np.testing.assert_array_equal(result, np.concatenate([a, b, c], axis=1))
    type_, result = evaluate("concat", a, axis=0)
    np.testing.assert_array_equal(result, a)
    with pytest.raises(TypeInferenceError, match=r"concat: input 1 has shape \(3, 3, 4\); expected rank 3 "
                                                 r"and the dims of input 0 \(2, 1, 4\) on every axis but 1"):
        call_type("concat", ((2, 1, 4), "float32"), ((3, 3, 4), "float32"), axis=1)
    with pytest.raises(TypeInferenceError, match="concat needs inputs of one dtype"):
        call_type("concat", ((2, 1), "float32"), ((2, 1), "int32"), axis=1)
    with pytest.raises(TypeInferenceError, match="concat: axis 2 is out of range"):
        call_type("concat", ((2, 1), "float32"), ((2, 1), "float32"), axis=2)
    with pytest.raises(TypeInferenceError, match="concat takes 1..any inputs, got 0"):
        call_type("concat", axis=0)


def test_split():
    x = random((2, 7))
    type_, result = evaluate("split", x, axis=-1, sizes=[2, 0, 5])
    assert type_ == TupleType((TensorType((2, 2), "float32"), TensorType((2, 0), "float32"),
                               TensorType((2, 5), "float32")))
    np.testing.assert_array_equal(result[0], x[:, :2])
    np.testing.assert_array_equal(result[2], x[:, 2:])
    with FunctionBuilder() as fb:
        value = fb.param("x", (2, 7))
        pieces = fb.call("split", value, axis=1, sizes=[3, 4])
        fb.ret(fb.get_item(pieces, 1))
    np.testing.assert_array_equal(interpret(fb.module(), x), x[:, 3:])
    with pytest.raises(TypeInferenceError, match=r"split: sizes \(2, 4\) sum to 6, but axis 1 of \(2, 7\) has size 7"):
        call_type("split", ((2, 7), "float32"), axis=1, sizes=[2, 4])


# ================================================================= strided_slice


@pytest.mark.parametrize("attrs, expected_index", [
    (dict(begin=[1], end=[3]), np.s_[1:3]),
    (dict(begin=[0, 1], end=[INT64_MAX, -1], strides=[2, 1]), np.s_[::2, 1:-1]),
    (dict(begin=[-1], end=[INT64_MIN], axes=[1], strides=[-1]), np.s_[:, ::-1]),
    (dict(begin=[4], end=[0], strides=[-2]), np.s_[4:0:-2]),
    (dict(begin=[10], end=[-10], strides=[-1]), np.s_[::-1]),  # clamped from both sides
    (dict(begin=[-100], end=[100], axes=[-1]), np.s_[:, :]),
    (dict(begin=[3], end=[1]), np.s_[3:1]),  # empty
    (dict(begin=[2, -3], end=[INT64_MAX, INT64_MIN], axes=[1, 0], strides=[1, -1]), np.s_[-3::-1, 2:]),
])
def test_strided_slice(attrs, expected_index):
    x = random((6, 5))
    type_, result = evaluate("strided_slice", x, **attrs)
    expected = x[expected_index]
    assert type_.shape == expected.shape
    np.testing.assert_array_equal(result, expected)
    onnx_inputs = [x, np.array(attrs["begin"], np.int64), np.array(attrs["end"], np.int64)]
    onnx_inputs.append(np.array(attrs.get("axes", range(len(attrs["begin"]))), np.int64))
    onnx_inputs.append(np.array(attrs.get("strides", [1] * len(attrs["begin"])), np.int64))
    np.testing.assert_array_equal(result, run_onnx_node("Slice", onnx_inputs))


def test_strided_slice_errors():
    with pytest.raises(TypeInferenceError, match="strided_slice: begin .* must have the same length"):
        call_type("strided_slice", ((6, 5), "float32"), begin=[0, 1], end=[2])
    with pytest.raises(TypeInferenceError, match="strided_slice: strides .* contain a 0"):
        call_type("strided_slice", ((6, 5), "float32"), begin=[0], end=[2], strides=[0])
    with pytest.raises(TypeInferenceError, match="strided_slice: axes .* names an axis twice"):
        call_type("strided_slice", ((6, 5), "float32"), begin=[0, 0], end=[2, 2], axes=[1, -1])


# ================================================================= gather, gather_elements


def test_gather():
    vector = random((5,))
    type_, result = evaluate("gather", vector, np.array(-2, dtype=np.int64))
    assert type_ == TensorType((), "float32") and result == vector[3]
    data = random((4, 3, 2))
    indices = np.array([[0, -1], [2, 1], [-4, 3]], dtype=np.int64)
    type_, result = evaluate("gather", data, indices, axis=0)
    assert type_ == TensorType((3, 2, 3, 2), "float32")
    np.testing.assert_array_equal(result, data[indices % 4])
    type_, result = evaluate("gather", data, np.array(-1, dtype=np.int32), axis=1)
    assert type_ == TensorType((4, 2), "float32")
    np.testing.assert_array_equal(result, data[:, 2])
    with pytest.raises(IndexError, match="gather: index 4 is out of range for an axis of size 4"):
        evaluate("gather", data, np.array([4], dtype=np.int64))
    with pytest.raises(TypeInferenceError, match="gather: input indices has dtype float32"):
        call_type("gather", ((4, 3), "float32"), ((2,), "float32"))


def test_gather_elements():
    data = random((3, 4))
    indices = np.array([[0, 2, -1], [1, 0, 3]], dtype=np.int64)
    type_, result = evaluate("gather_elements", data, indices, axis=1)
    assert type_ == TensorType((2, 3), "float32")
    expected = np.array([[data[i, indices[i, j] % 4] for j in range(3)] for i in range(2)])
    np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(result, run_onnx_node("GatherElements", [data, indices], axis=1))
    indices = np.array([[2, 0], [1, 1], [0, 2], [1, 0]], dtype=np.int32)
    _, result = evaluate("gather_elements", data, indices, axis=0)
    np.testing.assert_array_equal(result, run_onnx_node("GatherElements", [data, indices], axis=0))
    with pytest.raises(TypeInferenceError, match="gather_elements: input indices .* must have the rank of data"):
        call_type("gather_elements", ((3, 4), "float32"), ((3,), "int64"))
    with pytest.raises(TypeInferenceError, match="gather_elements: input indices .* is larger than data"):
        call_type("gather_elements", ((3, 4), "float32"), ((2, 5), "int64"), axis=0)


# ================================================================= squeeze, expand_dims


def test_squeeze_and_expand_dims():
    x = random((1, 3, 1, 2))
    type_, result = evaluate("squeeze", x)
    assert type_.shape == (3, 2)
    np.testing.assert_array_equal(result, x.reshape(3, 2))
    type_, _ = evaluate("squeeze", x, axes=[-2])
    assert type_.shape == (1, 3, 2)
    with pytest.raises(TypeInferenceError, match=r"squeeze: axis 1 of \(1, 3, 1, 2\) has size 3; expected 1"):
        call_type("squeeze", ((1, 3, 1, 2), "float32"), axes=[1])

    x = random((3, 2))
    type_, result = evaluate("expand_dims", x, axes=[0, -1])
    assert type_.shape == (1, 3, 2, 1)
    np.testing.assert_array_equal(result, x[None, :, :, None])
    type_, _ = evaluate("expand_dims", x, axes=[3, 1])
    assert type_.shape == (3, 1, 2, 1)
    with pytest.raises(TypeInferenceError, match="expand_dims: axes entry 4 is out of range"):
        call_type("expand_dims", ((3, 2), "float32"), axes=[4])
    with pytest.raises(TypeInferenceError, match="expand_dims: axes .* names an axis twice"):
        call_type("expand_dims", ((3, 2), "float32"), axes=[0, -4])


# ================================================================= pad, trilu, tile, cumsum


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[1, 2, 0, 1], [0, 0, 2, 2], [-1, 1, 1, -2]])
def test_pad_matches_onnxruntime(mode, pads):
    x = random((4, 5))
    type_, result = evaluate("pad", x, pads=pads, mode=mode, value=1.5)
    onnx_inputs = [x, np.array(pads, np.int64)]
    if mode == "constant":
        onnx_inputs.append(np.array(1.5, np.float32))
    expected = run_onnx_node("Pad", onnx_inputs, mode=mode)
    assert type_.shape == expected.shape
    np.testing.assert_array_equal(result, expected)


def test_pad_values_and_errors():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    _, result = evaluate("pad", x, pads=[0, 1, 0, 0], value=7)
    np.testing.assert_array_equal(result, [[7, 0, 1, 2], [7, 3, 4, 5]])
    with pytest.raises(TypeInferenceError, match="pad: pads .* must hold 4 integers"):
        call_type("pad", ((2, 3), "float32"), pads=[1, 1])
    with pytest.raises(TypeInferenceError, match="pad: mode 'wrap' is not supported"):
        call_type("pad", ((2, 3), "float32"), pads=[1, 1, 1, 1], mode="wrap")
    with pytest.raises(TypeInferenceError, match="pad: reflect padding of 2 on axis 0"):
        call_type("pad", ((2, 3), "float32"), pads=[2, 0, 0, 0], mode="reflect")


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("k", [-1, 0, 2])
def test_trilu(upper, k):
    x = random((2, 3, 4))
    type_, result = evaluate("trilu", x, upper=upper, k=k)
    assert type_ == TensorType((2, 3, 4), "float32")
    rows, columns = np.indices((3, 4))
    keep = (columns - rows >= k) if upper else (columns - rows <= k)
    np.testing.assert_array_equal(result, np.where(keep, x, 0))
    with pytest.raises(TypeInferenceError, match="trilu: input x must have rank >= 2"):
        call_type("trilu", ((3,), "float32"))


def test_tile():
    x = random((2, 3))
    type_, result = evaluate("tile", x, repeats=[2, 1])
    assert type_.shape == (4, 3)
    np.testing.assert_array_equal(result, np.concatenate([x, x]))
    with pytest.raises(TypeInferenceError, match="tile: repeats .* must be 2 non-negative integers"):
        call_type("tile", ((2, 3), "float32"), repeats=[2])


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_cumsum_matches_onnxruntime(exclusive, reverse, dtype):
    x = random((3, 4), dtype)
    type_, result = evaluate("cumsum", x, axis=1, exclusive=exclusive, reverse=reverse)
    assert type_ == TensorType((3, 4), dtype)
    expected = run_onnx_node("CumSum", [x, np.array(1, np.int64)], exclusive=int(exclusive), reverse=int(reverse))
    np.testing.assert_allclose(result, expected, rtol=1e-6)


def test_layout_ops_keep_bfloat16():
    x = random((2, 3, 4), "bfloat16")
    for op_name, attrs in [("transpose", {}), ("reshape", {"shape": [6, 4]}), ("tile", {"repeats": [1, 2, 1]}),
                           ("pad", {"pads": [0, 1, 0, 0, 1, 0], "value": 2.0}), ("trilu", {}),
                           ("strided_slice", {"begin": [0], "end": [-1], "axes": [2]}),
                           ("cumsum", {"axis": 0})]:
        type_, result = evaluate(op_name, x, **attrs)
        assert type_.dtype == "bfloat16" and result.dtype == ml_dtypes.bfloat16, op_name


def test_categories_and_docs():
    expected = {"matmul": "opaque", "conv2d": "opaque", "max_pool2d": "opaque", "avg_pool2d": "opaque",
                "global_avg_pool2d": "opaque", "global_max_pool2d": "opaque", "reshape": "injective",
                "transpose": "injective", "broadcast_to": "injective", "concat": "injective",
                "split": "injective", "strided_slice": "injective", "gather": "injective",
                "gather_elements": "injective", "squeeze": "injective", "expand_dims": "injective",
                "pad": "injective", "trilu": "injective", "tile": "injective", "cumsum": "opaque"}
    for op_name, category in expected.items():
        op = get_op(op_name)
        assert op.category == category, op_name
        assert op.doc and "\n" not in op.doc, op_name
