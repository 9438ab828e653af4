"""Tests of the elementwise, reduction and normalization ops: registry entries, type
inference, references and error messages.

References are checked against hand-computed values, float64 NumPy/`math` oracles and,
where installed, onnxruntime (whose semantics these ops promise).
"""
from __future__ import annotations

import importlib
import math
import pathlib
import sys
import time
import types

import ml_dtypes
import numpy as np
import pytest

from byoc.errors import TypeInferenceError


def _load_ops():
    """Imports byoc.ops; while the sibling op modules (linalg, nn, layout) are still being
    written, loads just the modules these tests need."""
    ops_folder = pathlib.Path(__file__).parent.parent / "byoc" / "ops"
    siblings = ("linalg", "nn", "layout")
    try:
        importlib.import_module("byoc.ops")
    except ImportError:
        if all((ops_folder / f"{name}.py").exists() for name in siblings):
            raise
        package = types.ModuleType("byoc.ops")
        package.__path__ = [str(ops_folder)]
        sys.modules["byoc.ops"] = package
        for name in ("elementwise", "reduction", "normalization"):
            importlib.import_module(f"byoc.ops.{name}")


_load_ops()

from byoc.interpreter import interpret  # noqa: E402
from byoc.ir import FunctionBuilder, TensorType  # noqa: E402
from byoc.ir.op import REQUIRED, get_op  # noqa: E402
from byoc.ir.types import FLOAT_DTYPES, INT_DTYPES, dtype_of_numpy, numpy_dtype  # noqa: E402
from byoc.ops.elementwise import BINARY_OPS, UNARY_OPS, erf, erfc  # noqa: E402

rng = np.random.default_rng(0)
BF16 = ml_dtypes.bfloat16
INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max

math_erf = np.vectorize(math.erf, otypes=[np.float64])
math_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def random(shape, dtype="float32", low=-5, high=6):
    if np.dtype(numpy_dtype(dtype)).kind in "iu":
        return rng.integers(max(low, 0) if dtype == "uint8" else low, high, size=shape).astype(numpy_dtype(dtype))
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    return (rng.standard_normal(shape) * 2).astype(numpy_dtype(dtype))


def call_type(op_name, *input_types, **attrs):
    """The inferred type of `op_name` applied to inputs of the given (shape, dtype)s."""
    fb = FunctionBuilder()
    params = [fb.param(f"x{i}", shape, dtype) for i, (shape, dtype) in enumerate(input_types)]
    return fb.call(op_name, *params, **attrs).type


def evaluate(op_name, *inputs, **attrs):
    """Builds a one-op function, runs the reference, and checks that it returned an array
    of exactly the inferred dtype and shape. Returns (inferred type, result)."""
    inputs = [np.asarray(x) for x in inputs]
    fb = FunctionBuilder()
    params = [fb.param(f"x{i}", x.shape, dtype_of_numpy(x.dtype)) for i, x in enumerate(inputs)]
    result_var = fb.call(op_name, *params, **attrs)
    call = fb.bindings[-1].value
    result = get_op(op_name).reference(*inputs, **call.attrs)
    assert isinstance(result, np.ndarray), type(result)
    assert result.dtype == numpy_dtype(result_var.type.dtype), (result.dtype, result_var.type)
    assert result.shape == result_var.type.shape, (result.shape, result_var.type)
    return result_var.type, result


def as_f32(x):
    return np.asarray(x).astype(np.float32)


# ================================================================= the registry


UNARY_NAMES = [
    "negative", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "erf", "tanh", "sigmoid", "relu",
    "gelu", "silu", "floor", "ceil", "round", "sin", "cos", "sign", "softplus", "leaky_relu", "elu",
    "hard_sigmoid", "hard_swish", "clip", "logical_not", "identity", "cast"]
BINARY_NAMES = [
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "mod", "equal", "not_equal",
    "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_xor", "where"]
REDUCE_NAMES = ["sum", "mean", "max", "min", "prod", "argmax", "argmin"]
OPAQUE_NAMES = ["softmax", "log_softmax", "layer_norm", "batch_norm", "rms_norm"]

EXPECTED_ATTRS = {
    "gelu": {"approximate": "none"},
    "leaky_relu": {"alpha": 0.01},
    "elu": {"alpha": 1.0},
    "hard_sigmoid": {"alpha": 0.2, "beta": 0.5},
    "clip": {"min": None, "max": None},
    "cast": {"dtype": REQUIRED},
    "mod": {"fmod": False},
    **{name: {"axes": (), "keepdims": False} for name in ("sum", "mean", "max", "min", "prod")},
    "argmax": {"axis": 0, "keepdims": False, "select_last_index": False},
    "argmin": {"axis": 0, "keepdims": False, "select_last_index": False},
    "softmax": {"axis": -1},
    "log_softmax": {"axis": -1},
    "layer_norm": {"axis": -1, "epsilon": 1e-5},
    "batch_norm": {"epsilon": 1e-5, "axis": 1},
    "rms_norm": {"axis": -1, "epsilon": 1e-6},
}
EXPECTED_ARITY = {
    **{name: 1 for name in UNARY_NAMES + REDUCE_NAMES + ["softmax", "log_softmax"]},
    **{name: 2 for name in BINARY_NAMES}, "where": 3, "layer_norm": 3, "batch_norm": 5, "rms_norm": 2,
}


@pytest.mark.parametrize("name", UNARY_NAMES + BINARY_NAMES + REDUCE_NAMES + OPAQUE_NAMES)
def test_registry_entry(name):
    op = get_op(name)
    expected_category = ("elemwise" if name in UNARY_NAMES else "broadcast" if name in BINARY_NAMES
                         else "reduce" if name in REDUCE_NAMES else "opaque")
    assert op.category == expected_category
    assert op.num_inputs == EXPECTED_ARITY[name]
    assert {attr: spec.default for attr, spec in op.attrs.items()} == EXPECTED_ATTRS.get(name, {})
    assert op.doc and "\n" not in op.doc


def test_unknown_and_missing_attributes():
    with pytest.raises(TypeInferenceError, match=r"relu: unknown attribute\(s\) alpha; allowed: none"):
        call_type("relu", ((2,), "float32"), alpha=0.1)
    with pytest.raises(TypeInferenceError, match=r"sum: unknown attribute\(s\) axis; allowed: axes, keepdims"):
        call_type("sum", ((2,), "float32"), axis=0)
    with pytest.raises(TypeInferenceError, match="cast: required attribute 'dtype' is missing"):
        call_type("cast", ((2,), "float32"))
    with pytest.raises(TypeInferenceError, match="cast: attribute dtype='float8' is not a dtype"):
        call_type("cast", ((2,), "float32"), dtype="float8")
    with pytest.raises(TypeInferenceError, match="leaky_relu: attribute alpha='x' is not a number"):
        call_type("leaky_relu", ((2,), "float32"), alpha="x")
    with pytest.raises(TypeInferenceError, match="gelu: attribute approximate='fast' is not 'none' or 'tanh'"):
        call_type("gelu", ((2,), "float32"), approximate="fast")


def test_arity_and_tuple_inputs():
    with pytest.raises(TypeInferenceError, match="add takes 2 inputs, got 1"):
        call_type("add", ((2,), "float32"))
    fb = FunctionBuilder()
    x = fb.param("x", (2,), "float32")
    pair = fb.tuple(x, x)
    with pytest.raises(TypeInferenceError, match=r"relu: input x must be a tensor, got Tuple\["):
        fb.call("relu", pair)
    with pytest.raises(TypeInferenceError, match=r"add: input b must be a tensor, got Tuple\["):
        fb.call("add", x, pair)
    with pytest.raises(TypeInferenceError, match=r"layer_norm: input beta must be a tensor"):
        fb.call("layer_norm", x, x, pair)


# ================================================================= unary ops


def _gelu_oracle(x):
    return 0.5 * x * math_erfc(-x / math.sqrt(2))


def _gelu_tanh_oracle(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


# name -> (float64 oracle, input transform keeping the oracle's domain)
UNARY_ORACLES = {
    "negative": (np.negative, None),
    "abs": (np.abs, None),
    "exp": (np.exp, None),
    "log": (np.log, lambda x: np.abs(x) + 0.01),
    "sqrt": (np.sqrt, np.abs),
    "rsqrt": (lambda x: 1 / np.sqrt(x), lambda x: np.abs(x) + 0.01),
    "reciprocal": (lambda x: 1 / x, lambda x: np.where(np.abs(x) < 0.01, 0.5, x)),
    "erf": (math_erf, None),
    "tanh": (np.tanh, None),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), None),
    "relu": (lambda x: np.maximum(x, 0), None),
    "gelu": (_gelu_oracle, None),
    "silu": (lambda x: x / (1 + np.exp(-x)), None),
    "floor": (np.floor, None),
    "ceil": (np.ceil, None),
    "round": (np.round, None),
    "sin": (np.sin, None),
    "cos": (np.cos, None),
    "sign": (np.sign, None),
    "softplus": (lambda x: np.log1p(np.exp(x)), None),
    "leaky_relu": (lambda x: np.where(x >= 0, x, 0.01 * x), None),
    "elu": (lambda x: np.where(x > 0, x, np.expm1(x)), None),
    "hard_sigmoid": (lambda x: np.clip(0.2 * x + 0.5, 0, 1), None),
    "hard_swish": (lambda x: x * np.clip(x / 6 + 0.5, 0, 1), None),
    "clip": (lambda x: x, None),
    "identity": (lambda x: x, None),
}
FLOAT_ONLY = ["exp", "log", "sqrt", "rsqrt", "reciprocal", "erf", "tanh", "sigmoid", "gelu", "silu",
              "floor", "ceil", "round", "sin", "cos", "softplus", "leaky_relu", "elu", "hard_sigmoid",
              "hard_swish"]
INTEGER_OK = ["negative", "abs", "relu", "sign", "clip", "identity"]


def test_unary_table_covers_the_brief():
    assert set(UNARY_OPS) == set(UNARY_ORACLES) | {"logical_not"}
    assert set(FLOAT_ONLY) | set(INTEGER_OK) | {"logical_not"} == set(UNARY_OPS)


def _unary_input(name, shape, dtype):
    x = rng.standard_normal(shape) * 3
    transform = UNARY_ORACLES[name][1]
    if transform is not None:
        x = transform(x)
    return x.astype(numpy_dtype(dtype))


@pytest.mark.parametrize("name", sorted(UNARY_ORACLES))
def test_unary_float32_matches_float64_oracle(name):
    x = _unary_input(name, (3, 40), "float32")
    type_, result = evaluate(name, x)
    assert type_ == TensorType((3, 40), "float32")
    np.testing.assert_allclose(result, UNARY_ORACLES[name][0](x.astype(np.float64)), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(UNARY_ORACLES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_unary_other_floats(name, dtype):
    x = _unary_input(name, (50,), dtype)
    type_, result = evaluate(name, x)
    assert type_ == TensorType((50,), dtype)
    expected = UNARY_ORACLES[name][0](x.astype(np.float64))
    if dtype == "float64":
        np.testing.assert_allclose(result, expected, rtol=1e-13, atol=1e-15)
    else:
        # within about one unit in the last place of the 16-bit result
        rtol = {"float16": 1e-3, "bfloat16": 8e-3}[dtype]
        np.testing.assert_allclose(as_f32(result), expected, rtol=rtol, atol=rtol * 1e-3)


@pytest.mark.parametrize("name", ["negative", "abs", "relu", "sign", "identity"])
@pytest.mark.parametrize("dtype", ["int64", "int32", "int8"])
def test_unary_integers(name, dtype):
    x = random((4, 5), dtype)
    type_, result = evaluate(name, x)
    assert type_ == TensorType((4, 5), dtype)
    np.testing.assert_array_equal(result, UNARY_ORACLES[name][0](x))


def test_unary_integer_edge_cases():
    _, result = evaluate("negative", np.array([INT64_MIN, 1], np.int64))
    np.testing.assert_array_equal(result, [INT64_MIN, -1])  # wraps, as in C
    _, result = evaluate("abs", np.array([-128, -3, 5], np.int8))
    np.testing.assert_array_equal(result, np.array([-128, 3, 5], np.int8))
    _, result = evaluate("relu", np.array([0, 7, 255], np.uint8))
    np.testing.assert_array_equal(result, [0, 7, 255])
    with pytest.raises(TypeInferenceError, match="negative: input x has dtype uint8; expected a signed numeric dtype"):
        call_type("negative", ((2,), "uint8"))


@pytest.mark.parametrize("name", FLOAT_ONLY)
@pytest.mark.parametrize("dtype", ["int64", "bool"])
def test_float_only_ops_reject_integers_and_bools(name, dtype):
    with pytest.raises(TypeInferenceError, match=rf"^{name}: input x has dtype {dtype}; expected a float dtype "
                                                 r"\(float64, float32, float16, bfloat16\)$"):
        call_type(name, ((2, 3), dtype))


@pytest.mark.parametrize("name", ["negative", "abs", "relu", "sign", "clip"])
def test_numeric_ops_reject_bools(name):
    with pytest.raises(TypeInferenceError, match=f"{name}: input x has dtype bool; expected a"):
        call_type(name, ((2,), "bool"))


def test_unary_hand_computed_values():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.7], np.float32)
    np.testing.assert_array_equal(evaluate("round", x)[1], [-2, -2, -0, 0, 2, 2, 4])  # ties to even
    np.testing.assert_array_equal(evaluate("floor", x)[1], [-3, -2, -1, 0, 1, 2, 3])
    np.testing.assert_array_equal(evaluate("ceil", x)[1], [-2, -1, -0, 1, 2, 3, 4])
    np.testing.assert_array_equal(evaluate("sign", np.array([-3.0, 0.0, 2.0], np.float32))[1], [-1, 0, 1])
    np.testing.assert_allclose(evaluate("relu", np.array([-1.0, 0.0, 2.0], np.float32))[1], [0, 0, 2])
    np.testing.assert_allclose(evaluate("leaky_relu", np.array([-2.0, 3.0], np.float32), alpha=0.1)[1], [-0.2, 3])
    np.testing.assert_allclose(evaluate("elu", np.array([-1.0, 2.0], np.float32), alpha=2.0)[1],
                               [2 * (math.exp(-1) - 1), 2], rtol=1e-6)
    np.testing.assert_allclose(evaluate("hard_sigmoid", np.array([-10, 0, 1, 10], np.float32), alpha=0.5, beta=0.25)[1],
                               [0, 0.25, 0.75, 1])
    np.testing.assert_allclose(evaluate("hard_swish", np.array([-4, 0, 1, 4], np.float32))[1],
                               [0, 0, 1 * (1 / 6 + 0.5), 4])
    np.testing.assert_allclose(evaluate("gelu", np.array([0.0, 1.0, -1.0], np.float32))[1],
                               [0, 0.8413447460685429, -0.15865525393145707], rtol=1e-6)
    np.testing.assert_allclose(evaluate("rsqrt", np.array([4.0, 0.25], np.float32))[1], [0.5, 2])
    np.testing.assert_array_equal(evaluate("logical_not", np.array([True, False]))[1], [False, True])


def test_gelu_tanh_approximation():
    x = np.linspace(-6, 6, 101).astype(np.float32)
    _, result = evaluate("gelu", x, approximate="tanh")
    np.testing.assert_allclose(result, _gelu_tanh_oracle(x.astype(np.float64)), rtol=1e-5, atol=1e-7)
    # and it differs from the exact form
    assert np.abs(result - evaluate("gelu", x)[1]).max() > 1e-4


def test_transcendentals_stay_accurate_at_the_extremes():
    x = np.array([-80.0, -30.0, -20.0, 30.0, 100.0], np.float32)
    with np.errstate(all="raise"):  # no warnings leak out of the references
        _, sigmoid = evaluate("sigmoid", x)
        _, softplus = evaluate("softplus", x)
        _, silu = evaluate("silu", x)
    wide = x.astype(np.float64)
    np.testing.assert_allclose(sigmoid, np.exp(-np.logaddexp(0, -wide)), rtol=1e-6)  # 1.8e-35, not 0
    assert sigmoid[-1] == 1 and evaluate("sigmoid", np.array([-100.0], np.float32))[1][0] > 0  # subnormal
    np.testing.assert_allclose(softplus, np.logaddexp(0, wide), rtol=1e-6)  # softplus(100) == 100, not inf
    np.testing.assert_allclose(silu, wide * np.exp(-np.logaddexp(0, -wide)), rtol=1e-6)
    # gelu of a very negative x: 0.5*x*(1 + erf) would cancel to 0
    _, gelu = evaluate("gelu", np.array([-8.0, -6.0], np.float32))
    np.testing.assert_allclose(gelu, _gelu_oracle(np.array([-8.0, -6.0])), rtol=1e-6)
    assert gelu[0] < 0
    # elu near 0: exp(x) - 1 in float32 would lose most digits
    _, elu = evaluate("elu", np.array([-1e-6], np.float32))
    np.testing.assert_allclose(elu, np.expm1(np.float64(np.float32(-1e-6))), rtol=1e-6)
    _, result = evaluate("exp", np.array([100.0], np.float32))
    assert np.isinf(result).all()
    _, result = evaluate("log", np.array([0.0, -1.0], np.float32))
    assert result[0] == -np.inf and np.isnan(result[1])


def test_erf_matches_math_erf():
    x = np.concatenate([np.linspace(-7, 7, 20001), np.geomspace(1e-30, 30, 2000), [0.0, 1.9999999, 2.0, 2.0000001]])
    np.testing.assert_allclose(erf(x), math_erf(x), rtol=2e-15, atol=1e-300)
    np.testing.assert_allclose(erf(-x), -math_erf(x), rtol=2e-15, atol=1e-300)
    # math.erfc itself is off by up to 7e-14 in the far tail
    np.testing.assert_allclose(erfc(x), math_erfc(x), rtol=2e-13, atol=1e-300)
    np.testing.assert_allclose(erfc(-x), math_erfc(-x), rtol=2e-13, atol=1e-300)
    negative = -np.abs(x)
    np.testing.assert_allclose(erfc(negative), math_erfc(negative), rtol=2e-15)  # 1 <= erfc <= 2
    special = erf(np.array([np.inf, -np.inf, np.nan, -0.0]))
    assert special[0] == 1 and special[1] == -1 and np.isnan(special[2]) and np.signbit(special[3])


def test_erf_is_fast_enough_for_a_million_elements():
    x = rng.standard_normal(1_000_000).astype(np.float32) * 3
    start = time.perf_counter()
    evaluate("erf", x)
    assert time.perf_counter() - start < 3


def test_clip():
    x = np.array([-3.0, -1.0, 0.5, 2.0, 9.0], np.float32)
    np.testing.assert_array_equal(evaluate("clip", x, min=-1.5, max=2.5)[1], [-1.5, -1, 0.5, 2, 2.5])
    np.testing.assert_array_equal(evaluate("clip", x, min=0.0)[1], [0, 0, 0.5, 2, 9])
    np.testing.assert_array_equal(evaluate("clip", x, max=0.0)[1], [-3, -1, 0, 0, 0])
    np.testing.assert_array_equal(evaluate("clip", x, min=2.0, max=1.0)[1], [1, 1, 1, 1, 1])  # min > max: max
    np.testing.assert_array_equal(evaluate("clip", x)[1], x)
    # float16: the bounds round to the dtype like everything else
    _, result = evaluate("clip", np.array([0.0, 1.0], np.float16), min=0.1)
    assert result.dtype == np.float16 and result[0] == np.float16(0.1)
    # integers: whole-number bounds; bounds beyond the dtype's range clip nothing
    ints = np.array([-200, -5, 0, 5, 100], np.int64)
    np.testing.assert_array_equal(evaluate("clip", ints, min=-10, max=10)[1], [-10, -5, 0, 5, 10])
    np.testing.assert_array_equal(evaluate("clip", ints.astype(np.int8) // 2, min=-1e30, max=float("inf"))[1],
                                  ints.astype(np.int8) // 2)
    np.testing.assert_array_equal(evaluate("clip", np.array([0, 255], np.uint8), min=-5.0, max=300.0)[1], [0, 255])
    big = np.array([INT64_MIN, 0, INT64_MAX], np.int64)
    np.testing.assert_array_equal(evaluate("clip", big, min=float(INT64_MIN), max=float(INT64_MAX))[1], big)
    with pytest.raises(TypeInferenceError, match="clip: attribute min=0.5 is not a whole number, but input x "
                                                 "has integer dtype int32"):
        call_type("clip", ((2,), "int32"), min=0.5)
    with pytest.raises(TypeInferenceError, match="clip: attribute max is NaN"):
        call_type("clip", ((2,), "float32"), max=float("nan"))


def test_logical_not_takes_only_bools():
    with pytest.raises(TypeInferenceError, match="^logical_not: input x has dtype float32; expected bool$"):
        call_type("logical_not", ((2,), "float32"))


def test_identity_keeps_any_dtype_and_copies():
    for dtype in ("bool", "uint8", "bfloat16"):
        x = random((3,), dtype)
        type_, result = evaluate("identity", x)
        assert type_.dtype == dtype
        np.testing.assert_array_equal(result.astype(np.float32), x.astype(np.float32))
        assert result is not x


def test_unary_on_scalars_returns_arrays():
    type_, result = evaluate("exp", np.array(1.0, np.float32))
    assert type_ == TensorType((), "float32") and result.shape == ()
    np.testing.assert_allclose(result, math.e, rtol=1e-7)


# ================================================================= cast


def test_cast_values():
    x = np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 3.0], np.float32)
    type_, result = evaluate("cast", x, dtype="int32")
    assert type_ == TensorType((6,), "int32")
    np.testing.assert_array_equal(result, [-2, 0, 0, 0, 2, 3])  # truncates toward zero
    np.testing.assert_array_equal(evaluate("cast", x, dtype="bool")[1], [True, True, False, True, True, True])
    np.testing.assert_array_equal(evaluate("cast", np.array([True, False]), dtype="float32")[1], [1.0, 0.0])
    np.testing.assert_array_equal(evaluate("cast", np.array([300, -1], np.int32), dtype="uint8")[1], [44, 255])
    _, result = evaluate("cast", np.array([1.0, 1.00390625, 3.14159], np.float32), dtype="bfloat16")
    np.testing.assert_array_equal(as_f32(result), [1.0, 1.0, 3.140625])  # round to nearest even
    _, result = evaluate("cast", np.array([1.5, -2.75], BF16), dtype="int64")
    np.testing.assert_array_equal(result, [1, -2])
    _, result = evaluate("cast", np.array([0.0, -0.5], BF16), dtype="bool")
    np.testing.assert_array_equal(result, [False, True])
    _, result = evaluate("cast", np.array([70000.0, 1.0 / 3], np.float64), dtype="float16")
    assert np.isinf(result[0]) and result[1] == np.float16(1.0 / 3)
    _, result = evaluate("cast", np.array(2.5, np.float32), dtype="float64")
    assert result.shape == () and result.dtype == np.float64


# ================================================================= binary ops


@pytest.mark.parametrize("a_shape, b_shape, expected", [
    ((2, 3), (2, 3), (2, 3)),
    ((2, 3), (3,), (2, 3)),
    ((4, 1, 3), (5, 1), (4, 5, 3)),
    ((), (2, 2), (2, 2)),
    ((0, 3), (1, 3), (0, 3)),
])
@pytest.mark.parametrize("name", ["add", "less"])
def test_binary_broadcasting(name, a_shape, b_shape, expected):
    a, b = random(a_shape), random(b_shape)
    type_, result = evaluate(name, a, b)
    assert type_ == TensorType(expected, "bool" if name == "less" else "float32")
    np.testing.assert_array_equal(result, (a + b) if name == "add" else (a < b))


def test_binary_type_errors():
    with pytest.raises(TypeInferenceError, match=r"^add: inputs a \(float32\) and b \(int64\) must have the same dtype$"):
        call_type("add", ((2,), "float32"), ((2,), "int64"))
    with pytest.raises(TypeInferenceError, match=r"^multiply: input shapes do not broadcast: a \(2, 3\), b \(4,\)$"):
        call_type("multiply", ((2, 3), "float32"), ((4,), "float32"))
    with pytest.raises(TypeInferenceError, match="add: input a has dtype bool; expected a numeric dtype"):
        call_type("add", ((2,), "bool"), ((2,), "bool"))
    with pytest.raises(TypeInferenceError, match="less: input a has dtype bool; expected a numeric dtype"):
        call_type("less", ((2,), "bool"), ((2,), "bool"))
    with pytest.raises(TypeInferenceError, match="logical_and: input a has dtype int32; expected bool"):
        call_type("logical_and", ((2,), "int32"), ((2,), "int32"))


# name -> float64/integer oracle
BINARY_ORACLES = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "power": lambda a, b: np.power(np.abs(a), b), "maximum": np.maximum, "minimum": np.minimum,
    "mod": np.mod, "equal": np.equal, "not_equal": np.not_equal, "less": np.less,
    "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal,
}


CORRECTLY_ROUNDED = ("add", "subtract", "multiply", "divide", "maximum", "minimum")


@pytest.mark.parametrize("name", sorted(BINARY_ORACLES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_binary_floats(name, dtype):
    a, b = random((3, 4), dtype), random((4,), dtype)
    if name == "power":
        a = np.abs(a.astype(np.float32)).astype(a.dtype)
    if name in ("equal", "not_equal"):
        b = a[1].copy()  # some equal pairs
    if name in ("divide", "mod"):
        b = np.where(np.abs(b.astype(np.float32)) < 0.1, 0.5, b.astype(np.float32)).astype(b.dtype)
    type_, result = evaluate(name, a, b)
    expected = BINARY_ORACLES[name](a.astype(np.float64), b.astype(np.float64))
    if BINARY_OPS[name].bool_result:
        assert type_ == TensorType((3, 4), "bool")
        np.testing.assert_array_equal(result, expected)
    else:
        assert type_ == TensorType((3, 4), dtype)
        if name in CORRECTLY_ROUNDED:
            # exactly one rounding of the exact result (also for 16-bit floats computed in float32)
            np.testing.assert_array_equal(as_f32(result), as_f32(expected.astype(numpy_dtype(dtype))))
        else:
            rtol = {"float16": 1e-3, "bfloat16": 8e-3}.get(dtype, 1e-6)
            np.testing.assert_allclose(as_f32(result), expected, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "maximum", "minimum"])
@pytest.mark.parametrize("dtype", ["int64", "int32", "int8", "uint8"])
def test_binary_integers(name, dtype):
    a, b = random((3, 4), dtype), random((3, 4), dtype)
    type_, result = evaluate(name, a, b)
    assert type_ == TensorType((3, 4), dtype)
    np.testing.assert_array_equal(result, BINARY_ORACLES[name](a, b))


def test_integer_overflow_wraps():
    _, result = evaluate("add", np.array([INT64_MAX], np.int64), np.array([1], np.int64))
    assert result[0] == INT64_MIN
    _, result = evaluate("multiply", np.array([100], np.int8), np.array([3], np.int8))
    assert result[0] == np.int8(44)


def test_integer_divide_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 6, -6, 0, 5, INT64_MIN], np.int64)
    b = np.array([2, 2, -2, -2, 3, -3, 4, 0, -1], np.int64)
    _, result = evaluate("divide", a, b)
    np.testing.assert_array_equal(result, [3, -3, -3, 3, 2, 2, 0, 0, INT64_MIN])  # x / 0 == 0; MIN / -1 wraps
    c_style = [int(x / y) if y else 0 for x, y in zip(a[:-1].tolist(), b[:-1].tolist())]
    np.testing.assert_array_equal(result[:-1], c_style)
    _, result = evaluate("divide", np.array([-128, 127], np.int8), np.array([3, -2], np.int8))
    np.testing.assert_array_equal(result, np.array([-42, -63], np.int8))
    _, result = evaluate("divide", np.array([250, 7], np.uint8), np.array([3, 2], np.uint8))
    np.testing.assert_array_equal(result, [83, 3])
    _, result = evaluate("divide", np.array([1.0, -1.0, 0.0], np.float32), np.array([0.0, 0.0, 0.0], np.float32))
    assert result[0] == np.inf and result[1] == -np.inf and np.isnan(result[2])


def test_mod_semantics():
    a = np.array([7, -7, 7, -7, 6, 0], np.int32)
    b = np.array([3, 3, -3, -3, 3, 5], np.int32)
    np.testing.assert_array_equal(evaluate("mod", a, b)[1], [x % y for x, y in zip(a.tolist(), b.tolist())])
    np.testing.assert_array_equal(evaluate("mod", a, b, fmod=True)[1],
                                  [int(math.fmod(x, y)) for x, y in zip(a.tolist(), b.tolist())])
    np.testing.assert_array_equal(evaluate("mod", np.array([5], np.int64), np.array([0], np.int64))[1], [0])
    fa = np.array([5.5, -5.5, 5.5, -5.5], np.float32)
    fb = np.array([2.0, 2.0, -2.0, -2.0], np.float32)
    np.testing.assert_array_equal(evaluate("mod", fa, fb)[1], [1.5, 0.5, -0.5, -1.5])
    np.testing.assert_array_equal(evaluate("mod", fa, fb, fmod=True)[1], [1.5, -1.5, 1.5, -1.5])


def test_integer_power():
    a = np.array([2, -3, 5, 1, -1, -1, 2, 0, 0], np.int64)
    b = np.array([10, 3, 0, -4, -3, -2, -1, 0, 3], np.int64)
    _, result = evaluate("power", a, b)
    np.testing.assert_array_equal(result, [1024, -27, 1, 1, -1, 1, 0, 1, 0])
    _, result = evaluate("power", np.array([2], np.int32), np.array([31], np.int32))
    assert result.dtype == np.int32 and result[0] == np.iinfo(np.int32).min  # wraps
    _, result = evaluate("power", np.array([2.0, 4.0], np.float32), np.array([-1.0, 0.5], np.float32))
    np.testing.assert_array_equal(result, [0.5, 2.0])


def test_comparisons_and_logical_ops():
    a = np.array([1, 2, 3], np.int64)
    b = np.array([2, 2, 2], np.int64)
    for name, expected in [("equal", [0, 1, 0]), ("not_equal", [1, 0, 1]), ("less", [1, 0, 0]),
                           ("less_equal", [1, 1, 0]), ("greater", [0, 0, 1]), ("greater_equal", [0, 1, 1])]:
        type_, result = evaluate(name, a, b)
        assert type_ == TensorType((3,), "bool")
        np.testing.assert_array_equal(result, np.array(expected, bool))
    nan = np.array([np.nan, 1.0], np.float32)
    np.testing.assert_array_equal(evaluate("equal", nan, nan)[1], [False, True])
    np.testing.assert_array_equal(evaluate("not_equal", nan, nan)[1], [True, False])
    p = np.array([True, True, False, False])
    q = np.array([True, False, True, False])
    np.testing.assert_array_equal(evaluate("equal", p, q)[1], [True, False, False, True])
    np.testing.assert_array_equal(evaluate("logical_and", p, q)[1], [True, False, False, False])
    np.testing.assert_array_equal(evaluate("logical_or", p, q)[1], [True, True, True, False])
    type_, result = evaluate("logical_xor", p[:, None], q)
    assert type_ == TensorType((4, 4), "bool")
    np.testing.assert_array_equal(result, p[:, None] ^ q)


# ================================================================= where


def test_where():
    condition = np.array([[True], [False]])
    x = np.array([1.0, 2.0, 3.0], np.float32)
    y = np.array(-1.0, np.float32)
    type_, result = evaluate("where", condition, x, y)
    assert type_ == TensorType((2, 3), "float32")
    np.testing.assert_array_equal(result, [[1, 2, 3], [-1, -1, -1]])
    _, result = evaluate("where", np.array([True, False]), np.array([1.5, 2.5], BF16), np.array([7, 8], BF16))
    assert result.dtype == BF16
    np.testing.assert_array_equal(as_f32(result), [1.5, 8])
    _, result = evaluate("where", np.array([True, False]), np.array([INT64_MAX, 0]), np.array([0, INT64_MIN]))
    np.testing.assert_array_equal(result, [INT64_MAX, INT64_MIN])
    with pytest.raises(TypeInferenceError, match="where: input condition has dtype float32; expected bool"):
        call_type("where", ((2,), "float32"), ((2,), "float32"), ((2,), "float32"))
    with pytest.raises(TypeInferenceError, match=r"where: inputs x \(float32\) and y \(float16\) must have the same dtype"):
        call_type("where", ((2,), "bool"), ((2,), "float32"), ((2,), "float16"))
    with pytest.raises(TypeInferenceError, match=r"where: input shapes do not broadcast: condition \(3,\), x \(2,\), y \(2,\)"):
        call_type("where", ((3,), "bool"), ((2,), "float32"), ((2,), "float32"))


# ================================================================= reductions


@pytest.mark.parametrize("axes, keepdims, expected", [
    ((), False, ()),
    ((), True, (1, 1, 1)),
    ((1,), False, (2, 4)),
    ((-1,), True, (2, 3, 1)),
    ((0, 2), False, (3,)),
    ((2, -3), True, (1, 3, 1)),
    ((0, 1, 2), False, ()),
])
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod"])
def test_reduce_shapes_and_values(name, axes, keepdims, expected):
    x = random((2, 3, 4))
    type_, result = evaluate(name, x, axes=axes, keepdims=keepdims)
    assert type_ == TensorType(expected, "float32")
    numpy_function = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[name]
    oracle = numpy_function(x.astype(np.float64), axis=axes or None, keepdims=keepdims)
    np.testing.assert_allclose(result, oracle, rtol=1e-5, atol=1e-6)


def test_reduce_errors():
    with pytest.raises(TypeInferenceError, match=r"sum: axis 3 is out of range for a tensor of rank 3 \(expected -3..2\)"):
        call_type("sum", ((2, 3, 4), "float32"), axes=[3])
    with pytest.raises(TypeInferenceError, match=r"mean: axis -4 is out of range"):
        call_type("mean", ((2, 3, 4), "float32"), axes=[0, -4])
    with pytest.raises(TypeInferenceError, match=r"max: axes \(1, -2\) name the same axis more than once"):
        call_type("max", ((2, 3, 4), "float32"), axes=[1, -2])
    with pytest.raises(TypeInferenceError, match=r"min: axis 0 is out of range: the input is a scalar"):
        call_type("min", ((), "float32"), axes=[0])
    with pytest.raises(TypeInferenceError, match="sum: input x has dtype bool; expected a numeric dtype"):
        call_type("sum", ((2,), "bool"))
    with pytest.raises(TypeInferenceError, match=r"prod: attribute axes=1 is not a list of 64-bit integers"):
        call_type("prod", ((2,), "float32"), axes=1)


def test_reduce_scalar_input():
    type_, result = evaluate("sum", np.array(3.5, np.float32))
    assert type_ == TensorType((), "float32") and result == 3.5
    type_, result = evaluate("max", np.array(3, np.int64), keepdims=True)
    assert type_ == TensorType((), "int64") and result == 3


def test_integer_reductions():
    x = np.array([[1, -2, 4], [-7, 5, 6]], np.int32)
    np.testing.assert_array_equal(evaluate("sum", x, axes=[1])[1], [3, 4])
    np.testing.assert_array_equal(evaluate("prod", x, axes=[0])[1], [-7, -10, 24])
    np.testing.assert_array_equal(evaluate("max", x)[1], 6)
    np.testing.assert_array_equal(evaluate("min", x, axes=[1], keepdims=True)[1], [[-2], [-7]])
    # the integer mean truncates toward zero: 3/3 -> 1, 4/3 -> 1, (-7-2)/2 -> -4 (not -5), 5/2 -> 2
    type_, result = evaluate("mean", x, axes=[1])
    assert type_ == TensorType((2,), "int32")
    np.testing.assert_array_equal(result, [1, 1])
    np.testing.assert_array_equal(evaluate("mean", x, axes=[0])[1], [-3, 1, 5])
    np.testing.assert_array_equal(evaluate("mean", np.array([-7, -2], np.int64))[1], -4)
    # sums wrap like an accumulator of the input's width
    big = np.array([2**31 - 1, 1], np.int32)
    assert evaluate("sum", big)[1] == np.int32(-2**31)
    assert evaluate("mean", big)[1] == (2**31) // 2  # exact: int64 sum, then the cast back
    assert evaluate("sum", np.array([200, 100], np.uint8))[1] == 44


def test_reductions_over_nothing():
    empty = np.zeros((2, 0), np.float32)
    np.testing.assert_array_equal(evaluate("sum", empty, axes=[1])[1], [0, 0])
    np.testing.assert_array_equal(evaluate("prod", empty, axes=[1])[1], [1, 1])
    np.testing.assert_array_equal(evaluate("max", empty, axes=[1])[1], [-np.inf, -np.inf])
    np.testing.assert_array_equal(evaluate("min", empty)[1], np.inf)
    assert np.isnan(evaluate("mean", empty)[1])
    empty_ints = np.zeros((0, 3), np.int8)
    np.testing.assert_array_equal(evaluate("max", empty_ints, axes=[0])[1], [-128] * 3)
    np.testing.assert_array_equal(evaluate("min", empty_ints, axes=[0])[1], [127] * 3)
    np.testing.assert_array_equal(evaluate("mean", empty_ints, axes=[0])[1], [0] * 3)
    # a zero-size dim that is not reduced is fine
    type_, result = evaluate("max", empty_ints, axes=[1])
    assert type_ == TensorType((0,), "int8")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_reductions_accumulate_in_float32(dtype):
    x = np.full((4096,), 1.0, numpy_dtype(dtype))
    # float16 counting one by one would stall at 2048, bfloat16 at 256
    assert as_f32(evaluate("sum", x)[1]) == 4096
    assert as_f32(evaluate("mean", x)[1]) == 1
    y = random((8, 16), dtype)
    np.testing.assert_allclose(as_f32(evaluate("sum", y, axes=[1])[1]), y.astype(np.float64).sum(axis=1),
                               rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(as_f32(evaluate("max", y, axes=[0])[1]), as_f32(y).max(axis=0))


def test_argmax_argmin():
    x = np.array([[3, 1, 3, 0], [0, 5, 5, -1]], np.float32)
    type_, result = evaluate("argmax", x)
    assert type_ == TensorType((4,), "int64")
    np.testing.assert_array_equal(result, [0, 1, 1, 0])
    np.testing.assert_array_equal(evaluate("argmax", x, axis=1)[1], [0, 1])
    np.testing.assert_array_equal(evaluate("argmax", x, axis=-1, select_last_index=True)[1], [2, 2])
    np.testing.assert_array_equal(evaluate("argmin", x, axis=1)[1], [3, 3])
    np.testing.assert_array_equal(evaluate("argmin", x, axis=0, select_last_index=True)[1], [1, 0, 0, 1])
    type_, result = evaluate("argmax", x, axis=1, keepdims=True)
    assert type_ == TensorType((2, 1), "int64")
    np.testing.assert_array_equal(result, [[0], [1]])
    type_, result = evaluate("argmin", np.array([4, 2, 2], np.int8))
    assert type_ == TensorType((), "int64") and result == 1
    _, result = evaluate("argmax", np.array([1.0, 3.0, 3.0], BF16), select_last_index=True)
    assert result == 2
    with pytest.raises(TypeInferenceError, match=r"argmax: axis 2 is out of range for a tensor of rank 2"):
        call_type("argmax", ((2, 3), "float32"), axis=2)
    with pytest.raises(TypeInferenceError, match=r"argmin: axis 1 of input x \(2, 0\) is empty"):
        call_type("argmin", ((2, 0), "float32"), axis=1)
    with pytest.raises(TypeInferenceError, match=r"argmax: axis 0 is out of range: the input is a scalar"):
        call_type("argmax", ((), "float32"))


# ================================================================= softmax


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_softmax_and_log_softmax(axis, dtype):
    x = random((3, 5), dtype)
    wide = x.astype(np.float64)
    shifted = wide - wide.max(axis=axis, keepdims=True)
    expected = np.exp(shifted) / np.exp(shifted).sum(axis=axis, keepdims=True)
    rtol = 1e-3 if dtype == "float16" else 1e-6
    type_, result = evaluate("softmax", x, axis=axis)
    assert type_ == TensorType((3, 5), dtype)
    np.testing.assert_allclose(as_f32(result), expected, rtol=rtol)
    type_, result = evaluate("log_softmax", x, axis=axis)
    np.testing.assert_allclose(as_f32(result), np.log(expected), rtol=rtol, atol=rtol)


def test_softmax_is_stable_and_errors_are_clear():
    x = np.array([1000.0, 1000.0, -1000.0], np.float32)
    np.testing.assert_allclose(evaluate("softmax", x)[1], [0.5, 0.5, 0])
    np.testing.assert_allclose(evaluate("log_softmax", x)[1], [-math.log(2), -math.log(2), -2000 - math.log(2)])
    type_, result = evaluate("softmax", np.zeros((2, 0), np.float32))
    assert type_ == TensorType((2, 0), "float32")
    with pytest.raises(TypeInferenceError, match="softmax: input x has dtype int32; expected a float dtype"):
        call_type("softmax", ((2, 3), "int32"))
    with pytest.raises(TypeInferenceError, match=r"log_softmax: axis 2 is out of range for a tensor of rank 2"):
        call_type("log_softmax", ((2, 3), "float32"), axis=2)


# ================================================================= layer_norm, rms_norm, batch_norm


def layer_norm_oracle(x, gamma, beta, axis, epsilon):
    x = x.astype(np.float64)
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma.astype(np.float64) + beta.astype(np.float64)


@pytest.mark.parametrize("x_shape, axis, param_shape", [
    ((2, 3, 8), -1, (8,)),
    ((2, 3, 8), 1, (3, 8)),
    ((2, 3, 8), 1, (8,)),
    ((2, 3, 8), -2, (1, 8)),
    ((2, 3, 8), 0, (3, 1)),
    ((4, 6), -1, ()),
])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_layer_norm(x_shape, axis, param_shape, dtype):
    x, gamma, beta = random(x_shape, dtype), random(param_shape, dtype), random(param_shape, dtype)
    type_, result = evaluate("layer_norm", x, gamma, beta, axis=axis, epsilon=1e-3)
    assert type_ == TensorType(x_shape, dtype)
    expected = layer_norm_oracle(x, gamma, beta, axis, 1e-3)
    tolerance = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    np.testing.assert_allclose(as_f32(result), expected, rtol=tolerance, atol=tolerance * 4)


def test_layer_norm_errors():
    with pytest.raises(TypeInferenceError, match=r"layer_norm: input gamma of shape \(3,\) does not broadcast to "
                                                 r"the normalized dims \(8,\) \(x.shape\[2:\] of x \(2, 3, 8\)\)"):
        call_type("layer_norm", ((2, 3, 8), "float32"), ((3,), "float32"), ((8,), "float32"))
    with pytest.raises(TypeInferenceError, match="layer_norm: input beta of shape \\(2, 3, 8\\) does not broadcast"):
        call_type("layer_norm", ((2, 3, 8), "float32"), ((3, 8), "float32"), ((2, 3, 8), "float32"), axis=1)
    with pytest.raises(TypeInferenceError, match="layer_norm: input beta has dtype float16; expected float32, the dtype of x"):
        call_type("layer_norm", ((2, 8), "float32"), ((8,), "float32"), ((8,), "float16"))
    with pytest.raises(TypeInferenceError, match="layer_norm: input x has dtype int64; expected a float dtype"):
        call_type("layer_norm", ((2, 8), "int64"), ((8,), "int64"), ((8,), "int64"))
    with pytest.raises(TypeInferenceError, match="layer_norm: axis 2 is out of range for a tensor of rank 2"):
        call_type("layer_norm", ((2, 8), "float32"), ((8,), "float32"), ((8,), "float32"), axis=2)


def test_rms_norm():
    x, gamma = random((2, 3, 8)), random((8,))
    type_, result = evaluate("rms_norm", x, gamma)
    assert type_ == TensorType((2, 3, 8), "float32")
    wide = x.astype(np.float64)
    expected = wide / np.sqrt((wide ** 2).mean(axis=-1, keepdims=True) + 1e-6) * gamma
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
    _, result = evaluate("rms_norm", x, random((3, 8)), axis=1, epsilon=0.5)
    assert result.shape == (2, 3, 8)
    _, result = evaluate("rms_norm", x.astype(np.float16), gamma.astype(np.float16))
    np.testing.assert_allclose(as_f32(result), expected, rtol=3e-3, atol=3e-3)
    with pytest.raises(TypeInferenceError, match=r"rms_norm: input gamma of shape \(3,\) does not broadcast"):
        call_type("rms_norm", ((2, 3, 8), "float32"), ((3,), "float32"))


@pytest.mark.parametrize("x_shape, axis", [((2, 3, 4, 5), 1), ((2, 3), 1), ((2, 5, 3), -1), ((3, 2, 2), 0)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_batch_norm(x_shape, axis, dtype):
    channels = x_shape[axis]
    x = random(x_shape, dtype)
    scale, bias, mean = (random((channels,), dtype) for _ in range(3))
    var = np.abs(random((channels,), dtype)) + np.asarray(0.5, numpy_dtype(dtype))
    type_, result = evaluate("batch_norm", x, scale, bias, mean, var, axis=axis, epsilon=1e-3)
    assert type_ == TensorType(x_shape, dtype)
    along = [1] * len(x_shape)
    along[axis] = channels
    f64 = [p.astype(np.float64).reshape(along) for p in (scale, bias, mean, var)]
    expected = (x.astype(np.float64) - f64[2]) / np.sqrt(f64[3] + 1e-3) * f64[0] + f64[1]
    tolerance = 1e-5 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(as_f32(result), expected, rtol=tolerance, atol=tolerance * 4)


def test_batch_norm_errors():
    x, c = ((2, 3, 4, 4), "float32"), ((3,), "float32")
    with pytest.raises(TypeInferenceError, match=r"batch_norm: input var has shape \(4,\); expected \(3,\), the size of axis 1 of x \(2, 3, 4, 4\)"):
        call_type("batch_norm", x, c, c, c, ((4,), "float32"))
    with pytest.raises(TypeInferenceError, match="batch_norm: input scale has dtype float16; expected float32"):
        call_type("batch_norm", x, ((3,), "float16"), c, c, c)
    with pytest.raises(TypeInferenceError, match="batch_norm: axis 4 is out of range for a tensor of rank 4"):
        call_type("batch_norm", x, c, c, c, c, axis=4)
    with pytest.raises(TypeInferenceError, match="batch_norm takes 5 inputs, got 4"):
        call_type("batch_norm", x, c, c, c)


# ================================================================= through the interpreter


def test_ops_run_through_the_interpreter():
    fb = FunctionBuilder()
    x = fb.param("x", (2, 4), "float32")
    gamma = fb.param("gamma", (4,), "float32")
    normalized = fb.call("layer_norm", x, gamma, np.zeros(4, np.float32))
    activated = fb.call("gelu", fb.call("add", normalized, 1.0))
    probabilities = fb.call("softmax", activated, axis=1)
    best = fb.call("argmax", probabilities, axis=1)
    fb.ret(fb.call("cast", best, dtype="int32"), fb.call("sum", probabilities, axes=[1]))
    data = random((2, 4))
    indices, totals = interpret(fb.module(), data, np.ones(4, np.float32))
    assert indices.dtype == np.int32 and indices.shape == (2,)
    np.testing.assert_allclose(totals, [1, 1], rtol=1e-6)
    ln = layer_norm_oracle(data, np.ones(4), np.zeros(4), -1, 1e-5)
    np.testing.assert_array_equal(indices, np.argmax(_gelu_oracle(ln + 1), axis=1))


# ================================================================= onnxruntime cross-checks


def run_onnx_node(op_type, inputs, outputs=1, opset=18, **attributes):
    """Runs one ONNX node on onnxruntime (the semantics these ops follow)."""
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    from onnx import helper
    input_names = [f"i{n}" for n in range(len(inputs))]
    node = helper.make_node(op_type, input_names, [f"o{n}" for n in range(outputs)], **attributes)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
         for name, x in zip(input_names, inputs)],
        [helper.make_empty_tensor_value_info(f"o{n}") for n in range(outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 21 else 10
    model = onnx.shape_inference.infer_shapes(model)  # gives the outputs their types
    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:
        if "NOT_IMPLEMENTED" in str(error) or "opset" in str(error).lower():
            pytest.skip(f"this onnxruntime cannot run {op_type} (opset {opset}): {error}")
        raise
    results = session.run(None, dict(zip(input_names, inputs)))
    return results[0] if outputs == 1 else results


ONNX_UNARY = [
    # (byoc op, attrs, ONNX op, ONNX attrs, opset)
    ("negative", {}, "Neg", {}, 18), ("abs", {}, "Abs", {}, 18), ("exp", {}, "Exp", {}, 18),
    ("tanh", {}, "Tanh", {}, 18), ("sigmoid", {}, "Sigmoid", {}, 18), ("relu", {}, "Relu", {}, 18),
    ("erf", {}, "Erf", {}, 18), ("floor", {}, "Floor", {}, 18), ("ceil", {}, "Ceil", {}, 18),
    ("round", {}, "Round", {}, 18), ("sin", {}, "Sin", {}, 18), ("cos", {}, "Cos", {}, 18),
    ("sign", {}, "Sign", {}, 18), ("softplus", {}, "Softplus", {}, 18),
    ("leaky_relu", {"alpha": 0.2}, "LeakyRelu", {"alpha": 0.2}, 18),
    ("elu", {"alpha": 0.7}, "Elu", {"alpha": 0.7}, 18),
    ("hard_sigmoid", {"alpha": 0.3, "beta": 0.4}, "HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 18),
    ("hard_swish", {}, "HardSwish", {}, 18),
    ("gelu", {}, "Gelu", {}, 20), ("gelu", {"approximate": "tanh"}, "Gelu", {"approximate": "tanh"}, 20),
    ("reciprocal", {}, "Reciprocal", {}, 18),
]


@pytest.mark.parametrize("name, attrs, onnx_op, onnx_attrs, opset", ONNX_UNARY)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_unary_matches_onnxruntime(name, attrs, onnx_op, onnx_attrs, opset, dtype):
    x = random((4, 64), dtype)
    x.flat[:8] = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.0, 3.0]  # round's ties
    if name == "reciprocal":
        x = np.where(np.abs(x) < 0.1, 1, x).astype(x.dtype)
    _, result = evaluate(name, x, **attrs)
    expected = run_onnx_node(onnx_op, [x], opset=opset, **onnx_attrs)
    tolerance = 1e-4 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(as_f32(result), as_f32(expected), rtol=tolerance, atol=tolerance * 1e-2)


ONNX_BINARY = [("add", "Add"), ("subtract", "Sub"), ("multiply", "Mul"), ("divide", "Div"), ("maximum", "Max"),
               ("minimum", "Min"), ("equal", "Equal"), ("less", "Less"), ("greater_equal", "GreaterOrEqual")]


@pytest.mark.parametrize("name, onnx_op", ONNX_BINARY)
@pytest.mark.parametrize("dtype", ["float32", "int64", "int32"])
def test_binary_matches_onnxruntime(name, onnx_op, dtype):
    a, b = random((3, 4), dtype, -20, 20), random((4,), dtype, -20, 20)
    if name == "divide":
        b = np.where(b == 0, 3, b).astype(b.dtype)
    _, result = evaluate(name, a, b)
    np.testing.assert_allclose(result, run_onnx_node(onnx_op, [a, b]), rtol=1e-6)


@pytest.mark.parametrize("fmod", [False, True])
@pytest.mark.parametrize("dtype", ["int64", "int32", "float32"])
def test_mod_matches_onnxruntime(fmod, dtype):
    if dtype == "float32" and not fmod:
        pytest.skip("ONNX Mod needs fmod=1 for floats")
    a, b = random((3, 8), dtype, -20, 20), random((8,), dtype, -20, 20)
    b = np.where(b == 0, 7, b).astype(b.dtype)
    _, result = evaluate("mod", a, b, fmod=fmod)
    np.testing.assert_allclose(result, run_onnx_node("Mod", [a, b], fmod=int(fmod)), rtol=1e-6)


def test_where_clip_cast_match_onnxruntime():
    condition = random((3, 1), "bool")
    x, y = random((3, 4)), random((4,))
    np.testing.assert_array_equal(evaluate("where", condition, x, y)[1], run_onnx_node("Where", [condition, x, y]))
    x = random((5, 6))
    expected = run_onnx_node("Clip", [x, np.array(-1.0, np.float32), np.array(0.5, np.float32)])
    np.testing.assert_array_equal(evaluate("clip", x, min=-1.0, max=0.5)[1], expected)
    x = np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 1e9], np.float32)
    for dtype, onnx_type in [("int32", 6), ("int64", 7), ("bool", 9), ("float16", 10)]:
        np.testing.assert_array_equal(evaluate("cast", x, dtype=dtype)[1], run_onnx_node("Cast", [x], to=onnx_type))


ONNX_REDUCE = [("sum", "ReduceSum"), ("mean", "ReduceMean"), ("max", "ReduceMax"), ("min", "ReduceMin"),
               ("prod", "ReduceProd")]


@pytest.mark.parametrize("name, onnx_op", ONNX_REDUCE)
@pytest.mark.parametrize("axes, keepdims", [((1,), False), ((0, -1), True), ((), False)])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_reductions_match_onnxruntime(name, onnx_op, axes, keepdims, dtype):
    x = random((2, 3, 4), dtype, -4, 5)
    _, result = evaluate(name, x, axes=axes, keepdims=keepdims)
    inputs = [x] + ([np.array(axes, np.int64)] if axes else [])
    expected = run_onnx_node(onnx_op, inputs, keepdims=int(keepdims))
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, onnx_op", [("argmax", "ArgMax"), ("argmin", "ArgMin")])
@pytest.mark.parametrize("axis, keepdims, select_last_index", [(0, False, False), (1, True, True), (-1, False, True)])
def test_arg_reductions_match_onnxruntime(name, onnx_op, axis, keepdims, select_last_index):
    x = random((4, 5, 3), "int32", -2, 3)  # plenty of ties
    _, result = evaluate(name, x, axis=axis, keepdims=keepdims, select_last_index=select_last_index)
    expected = run_onnx_node(onnx_op, [x], axis=axis, keepdims=int(keepdims), select_last_index=int(select_last_index))
    np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_normalizations_match_onnxruntime(dtype):
    tolerance = 1e-4 if dtype == "float32" else 3e-3
    x = random((2, 3, 8), dtype)
    for name, onnx_op in [("softmax", "Softmax"), ("log_softmax", "LogSoftmax")]:
        for axis in (-1, 1):
            _, result = evaluate(name, x, axis=axis)
            np.testing.assert_allclose(as_f32(result), as_f32(run_onnx_node(onnx_op, [x], axis=axis)),
                                       rtol=tolerance, atol=tolerance)
    gamma, beta = random((3, 8), dtype), random((3, 8), dtype)
    _, result = evaluate("layer_norm", x, gamma, beta, axis=1, epsilon=1e-4)
    expected = run_onnx_node("LayerNormalization", [x, gamma, beta], axis=1, epsilon=1e-4, opset=17)
    np.testing.assert_allclose(as_f32(result), as_f32(expected), rtol=tolerance, atol=tolerance)
    images = random((2, 3, 4, 4), dtype)
    scale, bias, mean = (random((3,), dtype) for _ in range(3))
    var = (np.abs(random((3,), dtype)) + 1).astype(numpy_dtype(dtype))
    _, result = evaluate("batch_norm", images, scale, bias, mean, var, epsilon=1e-3)
    expected = run_onnx_node("BatchNormalization", [images, scale, bias, mean, var], epsilon=1e-3, opset=15)
    np.testing.assert_allclose(as_f32(result), as_f32(expected), rtol=tolerance, atol=tolerance)


def test_rms_norm_matches_onnxruntime():
    x, gamma = random((2, 3, 8)), random((8,))
    _, result = evaluate("rms_norm", x, gamma, epsilon=1e-5)
    expected = run_onnx_node("RMSNormalization", [x, gamma], axis=-1, epsilon=1e-5, opset=23)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)


def test_all_dtypes_known():
    # the dtype groups these tests rely on
    assert set(FLOAT_DTYPES) == {"float64", "float32", "float16", "bfloat16"}
    assert "uint8" in INT_DTYPES
