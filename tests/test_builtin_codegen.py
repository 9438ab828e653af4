"""Tests of the built-in backend: partitioning (IR text before/after) and codegen.

Codegen tests render every case's builtin functions into one source, compile it (g++ with
the CPU shim; nvcc for CUDA), call each symbol through ctypes with the calling
convention of codegen.py, and compare main's results with byoc.interpret. CUDA runs are
`@pytest.mark.gpu` (skipped without a GPU); without one, the CUDA source is only compiled.
"""
from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc.backends.builtin.codegen import generate
from byoc.backends.builtin.partition import builtin_functions, partition_builtin
from byoc.errors import TypeInferenceError
from byoc.interpreter import interpret
from byoc.ir import (Call, Constant, Function, FunctionBuilder, IRModule, TensorType, Tuple,
                     TupleGetItem, Var, assert_structural_equal, get_op, list_ops, parse)
from byoc.ir.types import numpy_dtype
from gpu_probe import gpu_present

REPO = Path(__file__).resolve().parent.parent
SHIM_DIR = REPO / "backends" / "builtin" / "shim"
INCLUDE_DIR = REPO / "byoc" / "runtime"  # byoc_float16.h
CPU_SHIM_SOURCES = sorted((SHIM_DIR / "cpu").glob("*.cpp")) if (SHIM_DIR / "cpu").is_dir() else []
CUDA_SHIM_SOURCES = sorted((SHIM_DIR / "cuda").glob("*.cu")) if (SHIM_DIR / "cuda").is_dir() else []

# The runtime's error channel, for the test libraries: keeps the last report.
ERROR_CHANNEL_SOURCE = r"""
#include <string>
static thread_local std::string last_report;
extern "C" int byoc_report_error(const char* symbol, const char* message) {
  last_report = std::string(symbol) + ": " + message;
  return 1;
}
extern "C" const char* byoc_test_last_report(void) { return last_report.c_str(); }
"""


# ================================================================= partitioning


def test_partition_fuses_chains_stops_at_shared_values_and_lowers_split():
    before = parse("""
def @main(%x: Tensor[(4, 6), float32], %w: Tensor[(6, 6), float32]) -> Tuple[Tensor[(4, 2), float32], Tensor[(4, 4), float32], Tensor[(4, 6), float32]] {
  %m = matmul(%x, %w)
  %a = add(%m, const([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], float32))
  %g = gelu(%a)
  %t = multiply(%g, const(2.0, float32))
  %s = softmax(%a)
  %parts = split(%t, axis=1, sizes=[2, 4])
  %p0 = %parts.0
  %p1 = %parts.1
  %r = relu(%p1)
  return (%p0, %r, %s)
}
""")
    # %a is read by gelu and by softmax: it ends its group and is not recomputed; the
    # 6-element constant is a parameter, the scalar 2.0 stays inside; split becomes slices,
    # and the slice only relu reads is read in place by relu's kernel (a view of %t).
    expected = parse("""
def @main(%x: Tensor[(4, 6), float32], %w: Tensor[(6, 6), float32]) -> Tuple[Tensor[(4, 2), float32], Tensor[(4, 4), float32], Tensor[(4, 6), float32]] {
  %f0 = fn (%a0: Tensor[(4, 6), float32], %a1: Tensor[(6, 6), float32]) -> Tensor[(4, 6), float32] [Compiler="builtin", Composite="builtin.matmul"] {
    %a2 = matmul(%a0, %a1)
    return %a2
  }
  %m = %f0(%x, %w)
  %f1 = fn (%b0: Tensor[(4, 6), float32], %b1: Tensor[(6,), float32]) -> Tensor[(4, 6), float32] [Compiler="builtin", Composite="builtin.elementwise"] {
    %b2 = add(%b0, %b1)
    return %b2
  }
  %a = %f1(%m, const([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], float32))
  %f2 = fn (%c0: Tensor[(4, 6), float32]) -> Tensor[(4, 6), float32] [Compiler="builtin", Composite="builtin.elementwise"] {
    %c1 = gelu(%c0)
    %c2 = multiply(%c1, const(2.0, float32))
    return %c2
  }
  %t = %f2(%a)
  %f3 = fn (%d0: Tensor[(4, 6), float32]) -> Tensor[(4, 6), float32] [Compiler="builtin", Composite="builtin.softmax"] {
    %d1 = softmax(%d0)
    return %d1
  }
  %s = %f3(%a)
  %f4 = fn (%e0: Tensor[(4, 6), float32]) -> Tensor[(4, 2), float32] [Compiler="builtin", Composite="builtin.strided_slice"] {
    %e1 = strided_slice(%e0, begin=[0], end=[2], axes=[1])
    return %e1
  }
  %q0 = %f4(%t)
  %f5 = fn (%g0: Tensor[(4, 6), float32]) -> Tensor[(4, 4), float32] [Compiler="builtin", Composite="builtin.elementwise"] {
    %g1 = strided_slice(%g0, begin=[2], end=[6], axes=[1])
    %g2 = relu(%g1)
    return %g2
  }
  %r = %f5(%t)
  return (%q0, %r, %s)
}
""")
    after = partition_builtin(before)
    assert_structural_equal(after, expected)
    _check_same_results(before, after)


def test_partition_keeps_other_backends_functions_and_tuple_uses():
    before = parse("""
def @main(%x: Tensor[(2, 8), float32]) -> Tuple[Tuple[Tensor[(2, 4), float32], Tensor[(2, 4), float32]], Tensor[(2, 8), float32]] {
  %other = fn (%q: Tensor[(2, 8), float32]) -> Tensor[(2, 8), float32] [Compiler="cutlass", Composite="cutlass.relu"] {
    %0 = relu(%q)
    return %0
  }
  %y = %other(%x)
  %e = exp(%y)
  %parts = split(%e, axis=-1, sizes=[4, 4])
  %n = negative(%e)
  return (%parts, %n)
}
""")
    expected = parse("""
def @main(%x: Tensor[(2, 8), float32]) -> Tuple[Tuple[Tensor[(2, 4), float32], Tensor[(2, 4), float32]], Tensor[(2, 8), float32]] {
  %other = fn (%q: Tensor[(2, 8), float32]) -> Tensor[(2, 8), float32] [Compiler="cutlass", Composite="cutlass.relu"] {
    %0 = relu(%q)
    return %0
  }
  %y = %other(%x)
  %f0 = fn (%a0: Tensor[(2, 8), float32]) -> Tensor[(2, 8), float32] [Compiler="builtin", Composite="builtin.elementwise"] {
    %a1 = exp(%a0)
    return %a1
  }
  %e = %f0(%y)
  %f1 = fn (%b0: Tensor[(2, 8), float32]) -> Tensor[(2, 4), float32] [Compiler="builtin", Composite="builtin.strided_slice"] {
    %b1 = strided_slice(%b0, begin=[0], end=[4], axes=[1])
    return %b1
  }
  %s0 = %f1(%e)
  %f2 = fn (%c0: Tensor[(2, 8), float32]) -> Tensor[(2, 4), float32] [Compiler="builtin", Composite="builtin.strided_slice"] {
    %c1 = strided_slice(%c0, begin=[4], end=[8], axes=[1])
    return %c1
  }
  %s1 = %f2(%e)
  %parts = (%s0, %s1)
  %f3 = fn (%d0: Tensor[(2, 8), float32]) -> Tensor[(2, 8), float32] [Compiler="builtin", Composite="builtin.elementwise"] {
    %d1 = negative(%d0)
    return %d1
  }
  %n = %f3(%e)
  return (%parts, %n)
}
""")
    after = partition_builtin(before)
    assert_structural_equal(after, expected)
    _check_same_results(before, after)


def test_partition_does_not_fuse_across_an_outside_path():
    # %b reads %a directly and through softmax(%a): fusing a into b's group would make
    # the group both feed and read softmax. %a has two readers, so its group ends there.
    before = parse("""
def @main(%x: Tensor[(3, 5), float32]) -> Tensor[(3, 5), float32] {
  %a = tanh(%x)
  %s = softmax(%a)
  %b = add(%a, %s)
  %c = sqrt(%b)
  return %c
}
""")
    after = partition_builtin(before)
    composites = [f.attrs["Composite"] for _, f in builtin_functions(after["main"])]
    assert composites == ["builtin.elementwise", "builtin.softmax", "builtin.elementwise"]
    sizes = [len(f.bindings) for _, f in builtin_functions(after["main"])]
    assert sizes == [1, 1, 2]
    _check_same_results(before, after)


def test_partition_reshape_kinds_and_canonical_params():
    before = parse("""
def @main(%x: Tensor[(2, 3), float32]) -> Tensor[(6,), float32] {
  %a = multiply(%x, %x)
  %b = add(%a, %x)
  %r = reshape(%b, shape=[-1])
  return %r
}
""")
    after = partition_builtin(before)
    functions = builtin_functions(after["main"])
    assert [f.attrs["Composite"] for _, f in functions] == ["builtin.elementwise", "builtin.reshape"]
    assert len(functions[0][1].params) == 1  # %x is passed once, though read three times
    _check_same_results(before, after)


def _check_same_results(before: IRModule, after: IRModule):
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(p.type.shape).astype(numpy_dtype(p.type.dtype)) for p in before["main"].params]
    expected = interpret(before, *inputs)
    got = interpret(after, *inputs)
    for e, g in zip(_flatten(expected), _flatten(got), strict=True):
        np.testing.assert_array_equal(e, g)


def _flatten(value):
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


# ================================================================= test cases


@dataclass
class Case:
    """A one-function-or-so model: `main` to partition, compile and compare."""
    name: str
    mod: IRModule
    inputs: list
    tolerance: tuple = (1e-5, 1e-6)  # (rtol, atol) for floats; other dtypes compare exactly


TOLERANCES = {"float32": (2e-5, 2e-6), "float64": (1e-12, 1e-14), "float16": (2e-3, 2e-3),
              "bfloat16": (1.6e-2, 1.6e-2)}
FLOATS = ("float32", "float16", "bfloat16", "float64")
INTS = ("int64", "int32", "int16", "int8", "uint8")
ALL_DTYPES = FLOATS + INTS + ("bool",)


def random_array(rng, shape, dtype, low=None, high=None):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in INTS:
        low = -20 if low is None else low
        high = 20 if high is None else high
        if dtype == "uint8":
            low = max(low, 0)
        return rng.integers(low, high + 1, size=shape).astype(numpy_dtype(dtype))
    values = rng.standard_normal(shape) * 2.0 if low is None else rng.uniform(low, high, size=shape)
    return np.asarray(values).astype(numpy_dtype(dtype))


def make_case(name, op_name, arg_specs, attrs=None, rng=None, constants=()) -> Case | None:
    """A case calling `op_name` on parameters of `arg_specs` ([(shape, dtype, (low, high))]),
    or None where the op does not take those dtypes."""
    rng = rng or np.random.default_rng(zlib.crc32(name.encode()))
    params, args, inputs = [], [], []
    for index, (shape, dtype, value_range) in enumerate(arg_specs):
        data = random_array(rng, shape, dtype, *value_range)
        if index in constants:
            args.append(Constant(data))
            continue
        var = Var(f"in{index}", TensorType(shape, dtype))
        params.append(var)
        args.append(var)
        inputs.append(data)
    try:
        call = Call(get_op(op_name), args, attrs or {})
    except TypeInferenceError:
        return None
    out = Var("out", call.type)
    from byoc.ir import Binding
    mod = IRModule({"main": Function(params, [Binding(out, call)], out)})
    dtype = call.type.dtype if isinstance(call.type, TensorType) else "float32"
    tolerance = max(TOLERANCES.get(dtype, (0, 0)), TOLERANCES.get(arg_specs[0][1], (0, 0)))
    return Case(name, mod, inputs, tolerance)


# Value ranges that keep references defined (casts of out-of-range floats are undefined).
UNARY_RANGES = {"acos": (-1, 1)}


def elementwise_cases() -> list[Case]:
    cases = []
    rng = np.random.default_rng(1)
    for op_name in list_ops():
        op = get_op(op_name)
        if op.category not in ("elemwise", "broadcast") or op_name == "cast":
            continue
        arity = op.num_inputs if isinstance(op.num_inputs, int) else op.num_inputs[0]
        variants = ATTR_VARIANTS.get(op_name, [{}])
        for dtype, attrs in itertools.product(ALL_DTYPES, variants):
            if op_name == "where":
                specs = [((3, 1, 5), "bool", ()), ((4, 5), dtype, ()), ((3, 4, 1), dtype, ())]
            elif arity == 2:
                low_high = (-3, 3) if op_name == "power" and dtype in INTS else ()
                specs = [((3, 4, 5), dtype, ()), ((4, 1), dtype, low_high)]
            else:
                specs = [((2, 3, 7), dtype, ())]
            label = "_".join(f"{k}{v}" for k, v in attrs.items())
            case = make_case(f"{op_name}_{dtype}{'_' + label if label else ''}", op_name, specs, attrs, rng)
            if case is not None:
                cases.append(case)
    # every cast, with values every target can hold
    for source, target in itertools.product(ALL_DTYPES, ALL_DTYPES):
        value_range = (0, 100) if source in FLOATS else ()
        case = make_case(f"cast_{source}_to_{target}", "cast", [((5, 6), source, value_range)],
                         {"dtype": target}, rng)
        if case is not None:
            cases.append(case)
    # a scalar constant inside the body and a full-size one as a parameter
    cases.append(make_case("add_scalar_constant_float16", "add", [((8,), "float16", ()), ((), "float16", ())],
                           rng=rng, constants=(1,)))
    cases.append(make_case("multiply_tensor_constant_int32", "multiply",
                           [((4, 8), "int32", ()), ((4, 8), "int32", ())], rng=rng, constants=(1,)))
    cases.append(fused_chain_case())
    # broadcasts in the vectorized CUDA kernel: the innermost dim holds whole vectors (8 lanes
    # for 1- and 2-byte types, 4 for wider ones); a bias along it, a per-row scale constant
    # along it, and both at once
    for dtype in ("float16", "bfloat16", "float32", "int8", "int64"):
        cases.append(make_case(f"add_channel_bias_{dtype}", "add", [((2, 3, 5, 16), dtype, ()), ((16,), dtype, ())],
                               rng=rng))
        cases.append(make_case(f"multiply_row_scale_{dtype}", "multiply",
                               [((3, 4, 24), dtype, ()), ((3, 4, 1), dtype, ())], rng=rng))
        cases.append(make_case(f"add_row_and_channel_{dtype}", "add", [((3, 1, 8), dtype, ()), ((3, 5, 1), dtype, ())],
                               rng=rng))
    return cases


ATTR_VARIANTS = {
    "gelu": [{"approximate": "none"}, {"approximate": "tanh"}],
    "clip": [{"min": -1.0, "max": 2.0}, {"min": 0.5}, {"max": -0.5}, {"min": 3.0, "max": 1.0}],
    "leaky_relu": [{"alpha": 0.1}],
    "elu": [{"alpha": 0.7}],
    "hard_sigmoid": [{"alpha": 0.3, "beta": 0.4}],
    "mod": [{"fmod": False}, {"fmod": True}],
}


def fused_chain_case() -> Case:
    """A GELU-MLP-like chain with broadcast, casts through float16, a comparison and where."""
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (2, 3, 8))
        bias = fb.param("bias", (8,))
        gate = fb.param("gate", (3, 1), "float16")
        a = fb.call("add", x, bias)
        g = fb.call("gelu", a, approximate="tanh")
        h = fb.call("cast", g, dtype="float16")
        m = fb.call("multiply", h, gate)
        positive = fb.call("greater", m, Constant(np.float16(0.0)))
        y = fb.call("where", positive, m, Constant(np.float16(-1.0)))
        z = fb.call("cast", y, dtype="float32")
        fb.ret(fb.call("clip", z, min=-0.5, max=2.0))
    rng = np.random.default_rng(7)
    inputs = [random_array(rng, p.type.shape, p.type.dtype) for p in fb.func.params]
    return Case("fused_chain", fb.module(), inputs, TOLERANCES["float16"])


def shim_cases() -> list[Case]:
    """Every op that is not elementwise, in fp32 and where meaningful fp16/bf16/int."""
    rng = np.random.default_rng(2)
    cases: list[Case | None] = []

    def add(name, op_name, specs, attrs=None, constants=()):
        cases.append(make_case(name, op_name, specs, attrs, rng, constants))

    for dtype in ("float32", "float16", "int32"):
        add(f"reshape_{dtype}", "reshape", [((2, 3, 4), dtype, ())], {"shape": [6, -1]})
        add(f"transpose_{dtype}", "transpose", [((2, 3, 4, 5), dtype, ())], {"axes": [0, 2, 3, 1]})
        add(f"concat_{dtype}", "concat", [((2, 3), dtype, ()), ((2, 5), dtype, ()), ((2, 1), dtype, ())], {"axis": 1})
    # one byoc_shim_concat for every part: NHWC channels in 16-byte words, rows of 3 bytes
    # (one-byte words), the outermost axis (one row), and more parts than one launch takes
    add("concat_channels_float16", "concat", [((2, 3, 3, 16), "float16", ()), ((2, 3, 3, 8), "float16", ()),
                                              ((2, 3, 3, 24), "float16", ())], {"axis": 3})
    add("concat_odd_rows_uint8", "concat", [((4, 3), "uint8", ()), ((4, 1), "uint8", ())], {"axis": 1})
    add("concat_outermost", "concat", [((2, 3), "float32", ()), ((1, 3), "float32", ())], {"axis": 0})
    add("concat_70_parts", "concat", [((2, 1 + index % 3, 2), "float16", ()) for index in range(70)], {"axis": 1})
    add("squeeze", "squeeze", [((2, 1, 3, 1), "float32", ())], {"axes": [1]})
    add("expand_dims", "expand_dims", [((2, 3), "bfloat16", ())], {"axes": [0, 3]})
    add("transpose_reverse", "transpose", [((3, 4, 5), "float64", ())])
    add("broadcast_to", "broadcast_to", [((3, 1), "float32", ())], {"shape": [2, 3, 4]})
    add("broadcast_to_bool", "broadcast_to", [((1, 4), "bool", ())], {"shape": [3, 4]})
    add("strided_slice", "strided_slice", [((6, 7, 8), "float32", ())],
        {"begin": [1, -1, 0], "end": [5, 0, 8], "strides": [2, -2, 3]})
    add("strided_slice_axes", "strided_slice", [((4, 10), "int64", ())],
        {"begin": [2], "end": [2 ** 63 - 1], "axes": [1]})
    add("split_as_slices", "split", [((4, 9), "float32", ())], {"axis": 1, "sizes": [2, 3, 4]})
    add("tile", "tile", [((2, 3), "float32", ())], {"repeats": [2, 3]})
    add("gather", "gather", [((5, 4, 3), "float32", ()), ((2, 3), "int64", (-4, 3))], {"axis": 1})
    add("gather_int32_indices", "gather", [((6, 4), "float16", ()), ((5,), "int32", (0, 5))], {"axis": 0})
    add("gather_scalar_index", "gather", [((6, 4), "float32", ()), ((), "int64", (0, 5))], {"axis": 0},
        constants=(1,))
    add("gather_elements", "gather_elements", [((4, 5), "float32", ()), ((3, 5), "int64", (-4, 3))], {"axis": 0})
    add("pad_constant", "pad", [((2, 3), "float32", ())], {"pads": [1, 0, 2, 3], "value": 1.5})
    add("pad_reflect", "pad", [((3, 4), "float32", ())], {"pads": [1, 2, 1, 1], "mode": "reflect"})
    add("pad_edge_crop", "pad", [((3, 4), "int32", ())], {"pads": [-1, 2, 1, -1], "mode": "edge"})
    add("trilu_upper", "trilu", [((2, 4, 5), "float32", ())], {"upper": True, "k": 1})
    add("trilu_lower", "trilu", [((4, 4), "int64", ())], {"upper": False, "k": -1})
    add("cumsum", "cumsum", [((3, 4, 5), "float32", ())], {"axis": 1})
    add("cumsum_exclusive_reverse", "cumsum", [((3, 6), "int32", ())], {"axis": -1, "exclusive": True, "reverse": True})
    for op_name in ("sum", "mean", "max", "min", "prod"):
        for dtype in ("float32", "float16", "int32"):
            value_range = (0.5, 1.5) if op_name == "prod" and dtype != "int32" else ((-2, 2) if op_name == "prod" else ())
            add(f"{op_name}_{dtype}_last", op_name, [((4, 6), dtype, value_range)], {"axes": [-1]})
            add(f"{op_name}_{dtype}_two_groups", op_name, [((3, 4, 5, 2), dtype, value_range)],
                {"axes": [0, 2], "keepdims": True})
        add(f"{op_name}_all", op_name, [((3, 4, 5), "float32", ())])
        add(f"{op_name}_size_one_axis", op_name, [((3, 1, 5), "float32", ())], {"axes": [1]})
    add("mean_int32_two_groups", "mean", [((3, 4, 5), "int32", ())], {"axes": [0, 2]})
    for op_name in ("argmax", "argmin"):
        add(f"{op_name}", op_name, [((3, 5, 4), "float32", ())], {"axis": 1})
        add(f"{op_name}_last_keepdims", op_name, [((3, 6), "int32", (0, 2))],
            {"axis": -1, "keepdims": True, "select_last_index": True})
    for dtype in ("float32", "float16", "bfloat16"):
        add(f"softmax_{dtype}", "softmax", [((2, 3, 16), dtype, ())], {"axis": -1})
        add(f"log_softmax_middle_{dtype}", "log_softmax", [((2, 5, 3), dtype, ())], {"axis": 1})
        add(f"layer_norm_{dtype}", "layer_norm", [((4, 32), dtype, ()), ((32,), dtype, ()), ((32,), dtype, ())])
        add(f"rms_norm_{dtype}", "rms_norm", [((4, 32), dtype, ()), ((32,), dtype, ())])
        add(f"batch_norm_{dtype}", "batch_norm",
            [((2, 3, 4, 5), dtype, ()), ((3,), dtype, ()), ((3,), dtype, ()), ((3,), dtype, ()),
             ((3,), dtype, (0.5, 2.0))])
    add("layer_norm_two_axes_broadcast_gamma", "layer_norm",
        [((3, 4, 8), "float32", ()), ((8,), "float32", ()), ((1, 8), "float32", ())], {"axis": -2})
    for dtype in ("float32", "float16", "bfloat16", "int32", "float64"):
        add(f"matmul_{dtype}", "matmul", [((5, 7), dtype, ()), ((7, 3), dtype, ())])
    add("matmul_batched_weights", "matmul", [((2, 4, 5, 6), "float32", ()), ((6, 3), "float32", ())])
    add("matmul_shared_a", "matmul", [((5, 6), "float32", ()), ((3, 6, 2), "float32", ())])
    add("matmul_same_batch", "matmul", [((3, 5, 6), "float16", ()), ((3, 6, 2), "float16", ())])
    add("matmul_uneven_broadcast", "matmul", [((2, 1, 5, 6), "float32", ()), ((1, 3, 6, 2), "float32", ())])
    add("matmul_vector_matrix", "matmul", [((6,), "float32", ()), ((2, 6, 3), "float32", ())])
    add("matmul_matrix_vector", "matmul", [((4, 6), "float32", ()), ((6,), "float32", ())])
    add("matmul_vector_vector", "matmul", [((6,), "float32", ()), ((6,), "float32", ())])
    for dtype in ("float32", "float16"):
        add(f"conv2d_{dtype}", "conv2d", [((2, 3, 9, 8), dtype, ()), ((4, 3, 3, 3), dtype, ())],
            {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]})
    add("conv2d_groups", "conv2d", [((1, 4, 6, 6), "float32", ()), ((6, 2, 3, 3), "float32", ())], {"groups": 2})
    add("conv2d_depthwise", "conv2d", [((1, 4, 6, 6), "float32", ()), ((4, 1, 3, 3), "float32", ())],
        {"groups": 4, "pads": [1, 1, 1, 1]})
    add("conv2d_nhwc", "conv2d", [((2, 7, 6, 3), "float32", ()), ((5, 3, 2, 3), "float32", ())],
        {"data_layout": "NHWC", "kernel_layout": "OHWI", "pads": [1, 1, 0, 0]})
    add("conv2d_int32", "conv2d", [((1, 2, 5, 5), "int32", (-3, 3)), ((3, 2, 2, 2), "int32", (-3, 3))])
    for dtype in ("float32", "float16"):
        add(f"max_pool2d_{dtype}", "max_pool2d", [((2, 3, 9, 8), dtype, ())],
            {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
        add(f"avg_pool2d_{dtype}", "avg_pool2d", [((2, 3, 9, 8), dtype, ())],
            {"kernel": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]})
    add("avg_pool2d_include_pad", "avg_pool2d", [((1, 2, 6, 6), "float32", ())],
        {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": True})
    add("avg_pool2d_ceil_include_pad", "avg_pool2d", [((1, 2, 6, 6), "float32", ())],
        {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": True, "ceil_mode": True})
    add("max_pool2d_ceil_nhwc", "max_pool2d", [((1, 7, 7, 3), "float32", ())],
        {"kernel": [2, 2], "strides": [2, 2], "ceil_mode": True, "layout": "NHWC"})
    add("max_pool2d_int8", "max_pool2d", [((1, 2, 5, 5), "int8", ())], {"kernel": [2, 2]})
    for dtype in ("float32", "float16"):
        add(f"global_avg_pool2d_{dtype}", "global_avg_pool2d", [((2, 3, 5, 4), dtype, ())])
        add(f"global_max_pool2d_nhwc_{dtype}", "global_max_pool2d", [((2, 5, 4, 3), dtype, ())], {"layout": "NHWC"})
    return [case for case in cases if case is not None]


def conv_epilogue_cases() -> list[Case]:
    """Depthwise and grouped NHWC convs in 16-bit floats (and dense ones of 4 input channels)
    with the elementwise chains that become their epilogues (Composite="builtin.conv2d_epilogue"):
    bias + ReLU; stride 2, a 5x5 window,
    bias + hard swish + a full-size residual; bfloat16 with a clip; a 5x5 window with SiLU;
    channels 24 and 40 (not powers of two) and odd spatial sizes, so every index is off the
    tiles."""
    cases = []
    specs = [  # name, dtype, (batch, h, w, channels), window, strides, pads, chain
        ("dw_bias_relu_float16", "float16", (2, 9, 7, 16), 3, [1, 1], [1, 1, 1, 1], "relu"),
        ("dw_stride2_hard_swish_residual_float16", "float16", (2, 11, 10, 24), 5, [2, 2], [2, 2, 2, 2],
         "hard_swish_residual"),
        ("dw_bias_clip_bfloat16", "bfloat16", (1, 6, 5, 40), 3, [1, 1], [0, 1, 2, 1], "clip"),
        ("dw_5x5_bias_silu_float16", "float16", (2, 8, 13, 32), 5, [1, 1], [2, 2, 2, 2], "silu"),
        # dense convs of 4 input channels (few_channels_kernel): a stride-2 stem into 24
        # channels with SiLU, a 4x4 stride-4 patchify in bfloat16, uneven pads
        ("stem_3x3_stride2_silu_float16", "float16", (2, 15, 13, 4), 3, [2, 2], [1, 1, 1, 1], "silu"),
        ("stem_4x4_stride4_relu_bfloat16", "bfloat16", (1, 16, 12, 4), 4, [4, 4], [0, 1, 0, 2], "relu"),
        # an RGB image of 3 channels unpadded, and one channel (odd output widths: a thread's
        # second pixel falls past the row's end)
        ("stem_3ch_3x3_stride2_relu_float16", "float16", (2, 15, 13, 3), 3, [2, 2], [1, 1, 1, 1], "relu"),
        ("stem_1ch_5x5_clip_bfloat16", "bfloat16", (1, 9, 11, 1), 5, [1, 1], [2, 2, 2, 2], "clip"),
        # grouped convs of whole 8-channel vectors (grouped_conv.cuh): RegNet's 8 channels a
        # group at stride 2 with odd sizes; 16 in, 24 out a group (a channel multiplier) in
        # bfloat16 with SiLU
        ("grouped_g8_stride2_relu_float16", "float16", (2, 13, 11, 48), 3, [2, 2], [1, 1, 1, 1], "relu"),
        ("grouped_16to24_silu_bfloat16", "bfloat16", (1, 7, 9, 32), 3, [1, 1], [1, 1, 1, 1], "silu"),
    ]
    for name, dtype, (batch, h, w, channels), window, strides, pads, chain in specs:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        out_channels = 24 if name.startswith("stem") else channels
        groups = 1 if name.startswith("stem") else channels
        if name.startswith("grouped_g8"):
            groups = channels // 8
        elif name.startswith("grouped_16to24"):
            groups, out_channels = 2, 48
        with FunctionBuilder("main") as fb:
            x = fb.param("x", (batch, h, w, channels), dtype)
            weight = fb.param("weight", (out_channels, window, window, channels // groups), dtype)
            bias = fb.param("bias", (out_channels,), dtype)
            conv = fb.call("conv2d", x, weight, strides=strides, pads=pads, groups=groups,
                           data_layout="NHWC", kernel_layout="OHWI")
            y = fb.call("add", conv, bias)
            if chain == "relu":
                y = fb.call("relu", y)
            elif chain == "clip":
                y = fb.call("clip", y, min=0.0, max=6.0)
            elif chain == "silu":
                y = fb.call("multiply", y, fb.call("sigmoid", y))
            else:
                residual = fb.param("residual", conv.type.shape, dtype)
                y = fb.call("add", fb.call("hard_swish", y), residual)
            fb.ret(y)
        inputs = [random_array(rng, p.type.shape, p.type.dtype) for p in fb.func.params]
        cases.append(Case(name, fb.module(), inputs, TOLERANCES[dtype]))
    return cases


ELEMENTWISE_CASES = elementwise_cases()
SHIM_CASES = shim_cases() + conv_epilogue_cases()


def test_every_registered_op_has_a_case():
    covered = set()
    for case in ELEMENTWISE_CASES + SHIM_CASES:
        for binding in case.mod["main"].bindings:
            covered.add(binding.value.op.name)
    # Device annotations (on_device, device_copy) never reach a backend: PlanDevices
    # removes on_device and the host code performs device_copy.
    annotations = {name for name in list_ops() if get_op(name).category == "annotation"}
    assert sorted(set(list_ops()) - covered - annotations) == []


# ================================================================= compiling and running


@dataclass
class Partitioned:
    """A case after partitioning: main, and each builtin function's symbol by variable."""
    case: Case
    main: Function
    symbols: dict  # Var -> symbol


def partition_cases(cases: list[Case], prefix: str) -> tuple[list[Partitioned], dict]:
    partitioned, functions = [], {}
    for case_index, case in enumerate(cases):
        main = partition_builtin(case.mod)["main"]
        symbols = {}
        for function_index, (var, func) in enumerate(builtin_functions(main)):
            symbol = f"{prefix}{case_index}_{function_index}"
            symbols[var] = symbol
            functions[symbol] = func
        partitioned.append(Partitioned(case, main, symbols))
    return partitioned, functions


def compile_command(kind: str, sources, output: Path, shared: bool = True) -> list[str]:
    if kind == "cpu":
        return (["g++", "-std=c++17", "-O1", "-fPIC", "-I", str(SHIM_DIR), "-I", str(INCLUDE_DIR)]
                + (["-shared"] if shared else ["-c"]) + [str(s) for s in sources] + ["-o", str(output)])
    return (["nvcc", "-std=c++17", "-O2", "-gencode", "arch=compute_90,code=sm_90", "-Xcompiler", "-fPIC",
             "-I", str(SHIM_DIR)] + (["-shared"] if shared else ["-c"]) + [str(s) for s in sources]
            + ["-o", str(output)] + (["-lcublasLt", "-lcublas"] if shared else []))


def run_command(command: list[str]):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{result.stderr[-6000:]}")


class CompiledLibrary:
    def __init__(self, path: Path, workspace: dict):
        self.library = ctypes.CDLL(str(path))
        self.workspace = workspace
        self.library.byoc_test_last_report.restype = ctypes.c_char_p

    def symbol(self, name: str):
        function = getattr(self.library, name)
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        return function

    def last_report(self) -> str:
        return self.library.byoc_test_last_report().decode()


def build_cpu_library(functions: dict, workdir: Path, shim_objects=()) -> CompiledLibrary:
    generated = generate(functions, "cpu")
    source = workdir / f"partitions{generated.suffix}"
    source.write_text(generated.source)
    channel = workdir / "error_channel.cc"
    channel.write_text(ERROR_CHANNEL_SOURCE)
    library = workdir / "partitions.so"
    run_command(compile_command("cpu", [source, channel, *shim_objects], library))
    return CompiledLibrary(library, generated.workspace_bytes)


class HostMemory:
    """Buffers for the CPU target: NumPy arrays, host pointers."""
    stream = None

    def upload(self, array: np.ndarray):
        array = np.ascontiguousarray(array)
        return array, array.ctypes.data

    def empty(self, nbytes: int):
        buffer = np.zeros(max(nbytes, 1), dtype=np.uint8)
        return buffer, buffer.ctypes.data

    def download(self, buffer, type_: TensorType) -> np.ndarray:
        return buffer[:type_.nbytes].view(numpy_dtype(type_.dtype)).reshape(type_.shape).copy()

    def synchronize(self):
        pass


def run_partitioned(item: Partitioned, library: CompiledLibrary, memory) -> list:
    """Run main: builtin calls through the compiled symbols, tuples as the interpreter does."""
    env: dict = {}
    keep_alive = []
    for param, value in zip(item.main.params, item.case.inputs):
        env[param] = value

    def value_of(expr):
        if isinstance(expr, Constant):
            return expr.data
        if isinstance(expr, Tuple):
            return tuple(value_of(field) for field in expr.fields)
        return env[expr]

    for binding in item.main.bindings:
        value = binding.value
        if isinstance(value, Function):
            continue
        if isinstance(value, Tuple):
            env[binding.var] = value_of(value)
        elif isinstance(value, TupleGetItem):
            env[binding.var] = value_of(value.tuple_value)[value.index]
        else:
            symbol = item.symbols[value.op]
            pointers = []
            for arg in value.args:
                holder, pointer = memory.upload(np.asarray(value_of(arg)))
                keep_alive.append(holder)
                pointers.append(pointer)
            out_type = binding.var.type
            out_buffer, out_pointer = memory.empty(out_type.nbytes)
            workspace_bytes = library.workspace[symbol]
            workspace, workspace_pointer = memory.empty(workspace_bytes)
            keep_alive.extend([out_buffer, workspace])
            args = (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
            results = (ctypes.c_void_p * 1)(out_pointer)
            status = library.symbol(symbol)(args, results, workspace_pointer, workspace_bytes, memory.stream)
            assert status == 0, f"{symbol} failed: {library.last_report()}"
            memory.synchronize()
            env[binding.var] = memory.download(out_buffer, out_type)
    return _flatten(value_of(item.main.result))


def check_case(item: Partitioned, library: CompiledLibrary, memory):
    case = item.case
    expected = _flatten(interpret(case.mod, *case.inputs))
    got = run_partitioned(item, library, memory)
    for e, g in zip(expected, got, strict=True):
        assert e.shape == g.shape and e.dtype == g.dtype
        if e.dtype.kind == "f" or e.dtype == numpy_dtype("bfloat16"):
            rtol, atol = case.tolerance
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol,
                                       equal_nan=True, err_msg=case.name)
        else:
            np.testing.assert_array_equal(g, e, err_msg=case.name)


# ================================================================= CPU


@pytest.fixture(scope="module")
def workdir():
    path = Path(tempfile.mkdtemp(prefix="byoc_builtin_test_"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def elementwise_cpu(workdir):
    partitioned, functions = partition_cases(ELEMENTWISE_CASES, "elementwise_case")
    directory = workdir / "elementwise_cpu"
    directory.mkdir()
    return partitioned, build_cpu_library(functions, directory)


@pytest.fixture(scope="module")
def cpu_shim_objects(workdir):
    if not CPU_SHIM_SOURCES:
        pytest.skip("the CPU shim (backends/builtin/shim/cpu/*.cpp) is not there yet")
    directory = workdir / "shim_cpu"
    directory.mkdir()
    objects = []
    for source in CPU_SHIM_SOURCES:
        target = directory / (source.stem + ".o")
        run_command(["g++", "-std=c++17", "-O2", "-fPIC", "-I", str(SHIM_DIR), "-I", str(INCLUDE_DIR),
                     "-I", str(source.parent),
                     "-c", str(source), "-o", str(target)])
        objects.append(target)
    return objects


@pytest.fixture(scope="module")
def shim_cpu(workdir, cpu_shim_objects):
    partitioned, functions = partition_cases(SHIM_CASES, "shim_case")
    directory = workdir / "shim_calls_cpu"
    directory.mkdir()
    return partitioned, build_cpu_library(functions, directory, cpu_shim_objects)


@pytest.mark.parametrize("index", range(len(ELEMENTWISE_CASES)), ids=[c.name for c in ELEMENTWISE_CASES])
def test_elementwise_cpu(elementwise_cpu, index):
    partitioned, library = elementwise_cpu
    check_case(partitioned[index], library, HostMemory())


@pytest.mark.parametrize("index", range(len(SHIM_CASES)), ids=[c.name for c in SHIM_CASES])
def test_shim_calls_cpu(shim_cpu, index):
    partitioned, library = shim_cpu
    check_case(partitioned[index], library, HostMemory())


def test_shim_failure_is_reported_with_the_symbol(shim_cpu):
    """A shim error comes back as a nonzero status and a report naming the symbol."""
    partitioned, library = shim_cpu
    item = next(p for p in partitioned if p.case.name == "gather")
    symbol = next(iter(item.symbols.values()))
    data = np.zeros((5, 4, 3), np.float32)
    indices = np.full((2, 3), 99, np.int64)  # out of range: the CPU shim reports it
    out = np.zeros((5, 2, 3, 3), np.float32)
    args = (ctypes.c_void_p * 2)(data.ctypes.data, indices.ctypes.data)
    results = (ctypes.c_void_p * 1)(out.ctypes.data)
    assert library.symbol(symbol)(args, results, None, 0, None) != 0
    assert library.last_report().startswith(symbol + ": ")


def test_generated_names_only():
    """Model-given names never reach the source; symbols must be C identifiers."""
    from byoc.errors import BuildError
    with FunctionBuilder("main") as fb:
        x = fb.param('x"); system("rm -rf /"); //', (4,))
        fb.ret(fb.call("exp", x, name="*/ #include <evil>\n"))
    main = partition_builtin(fb.module())["main"]
    (_, func), = builtin_functions(main)
    source = generate({"builtin_exp": func}, "cpu").source
    assert "system" not in source and "evil" not in source
    with pytest.raises(BuildError):
        generate({"bad symbol": func}, "cpu")


def test_conv2d_workspace_mirror_matches_the_shim(workdir, cpu_shim_objects):
    """The build-time workspace of conv2d is the shim's own formula."""
    from byoc.backends.builtin.shim_calls import conv2d_workspace_bytes
    shapes = [("BYOC_FLOAT32", "float32", 0, (2, 3, 9, 8, 4, 3, 3, 5, 4, 1)),
              ("BYOC_FLOAT16", "float16", 1, (1, 8, 16, 16, 16, 1, 1, 16, 16, 2)),
              ("BYOC_FLOAT32", "float32", 0, (1, 4, 6, 6, 4, 3, 3, 6, 6, 4))]
    lines = ["#include <cstdio>", '#include "byoc_shim.h"', "int main() {"]
    for enum, _, layout, sizes in shapes:
        lines.append(f'  std::printf("%zu\\n", byoc_shim_conv2d_workspace({enum}, {layout}, '
                     + ", ".join(map(str, sizes)) + "));")
    lines.append("  return 0;\n}")
    program = workdir / "conv_workspace.cc"
    program.write_text("\n".join(lines))
    binary = workdir / "conv_workspace"
    run_command(["g++", "-std=c++17", "-I", str(SHIM_DIR), "-I", str(INCLUDE_DIR), str(program),
                 *map(str, cpu_shim_objects),
                 "-o", str(binary)])
    printed = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.split()
    expected = [conv2d_workspace_bytes("cpu", dtype, layout, *sizes) for _, dtype, layout, sizes in shapes]
    assert [int(v) for v in printed] == expected


# ================================================================= CUDA


@pytest.mark.nvcc
def test_cuda_source_compiles(workdir):
    """Every case's CUDA source compiles for sm_90 (no GPU needed)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    _, elementwise = partition_cases(ELEMENTWISE_CASES, "elementwise_case")
    _, shim = partition_cases(SHIM_CASES, "shim_case")
    generated = generate({**elementwise, **shim}, "cuda")
    source = workdir / f"partitions_cuda{generated.suffix}"
    source.write_text(generated.source)
    run_command(compile_command("cuda", [source], workdir / "partitions_cuda.o", shared=False))


def _gpu_available() -> bool:
    return gpu_present()  # the driver's answer (tests/gpu_probe.py)


class DeviceMemory:
    """Buffers for the CUDA target: raw bytes in cupy arrays, device pointers."""

    def __init__(self):
        import cupy
        self.cupy = cupy
        self.stream = cupy.cuda.get_current_stream().ptr

    def upload(self, array: np.ndarray):
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        device = self.cupy.asarray(raw if raw.size else np.zeros(1, np.uint8))
        return device, device.data.ptr

    def empty(self, nbytes: int):
        device = self.cupy.zeros(max(nbytes, 1), dtype=self.cupy.uint8)
        return device, device.data.ptr

    def download(self, buffer, type_: TensorType) -> np.ndarray:
        return buffer.get()[:type_.nbytes].view(numpy_dtype(type_.dtype)).reshape(type_.shape)

    def synchronize(self):
        self.cupy.cuda.get_current_stream().synchronize()


@pytest.fixture(scope="module")
def cuda_library(workdir):
    if not _gpu_available():
        pytest.skip("no GPU (cupy with a visible device is needed)")
    if not CUDA_SHIM_SOURCES:
        pytest.skip("the CUDA shim (backends/builtin/shim/cuda/*.cu) is not there yet")
    elementwise, elementwise_functions = partition_cases(ELEMENTWISE_CASES, "elementwise_case")
    shim, shim_functions = partition_cases(SHIM_CASES, "shim_case")
    generated = generate({**elementwise_functions, **shim_functions}, "cuda")
    directory = workdir / "cuda"
    directory.mkdir()
    source = directory / f"partitions{generated.suffix}"
    source.write_text(generated.source)
    channel = directory / "error_channel.cc"
    channel.write_text(ERROR_CHANNEL_SOURCE)
    library = directory / "partitions.so"
    run_command(compile_command("cuda", [source, channel, *CUDA_SHIM_SOURCES], library))
    return elementwise + shim, CompiledLibrary(library, generated.workspace_bytes)


ALL_CASES = ELEMENTWISE_CASES + SHIM_CASES


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(ALL_CASES)), ids=[c.name for c in ALL_CASES])
def test_cuda(cuda_library, index):
    partitioned, library = cuda_library
    check_case(partitioned[index], library, DeviceMemory())


# ---------------------------------------------------------------- layout chains

def test_partition_runs_a_layout_chain_as_one_function():
    """slice -> reshape -> transpose (attention's Q of a fused QKV projection) becomes one
    builtin.layout function; a slice that only an elementwise op reads is read in place by
    that op's kernel (a view of the projection: no copy at all)."""
    before = parse("""
def @main(%qkv: Tensor[(2, 4, 24), float32]) -> Tuple[Tensor[(2, 2, 4, 4), float32], Tensor[(2, 4, 8), float32]] {
  %q = strided_slice(%qkv, begin=[0], end=[8], axes=[2])
  %q4 = reshape(%q, shape=[2, 4, 2, 4])
  %qt = transpose(%q4, axes=[0, 2, 1, 3])
  %v = strided_slice(%qkv, begin=[16], end=[24], axes=[2])
  %r = relu(%v)
  return (%qt, %r)
}
""")
    expected = parse("""
def @main(%qkv: Tensor[(2, 4, 24), float32]) -> Tuple[Tensor[(2, 2, 4, 4), float32], Tensor[(2, 4, 8), float32]] {
  %f0 = fn (%a0: Tensor[(2, 4, 24), float32]) -> Tensor[(2, 2, 4, 4), float32] [Compiler="builtin", Composite="builtin.layout"] {
    %a1 = strided_slice(%a0, begin=[0], end=[8], axes=[2])
    %a2 = reshape(%a1, shape=[2, 4, 2, 4])
    %a3 = transpose(%a2, axes=[0, 2, 1, 3])
    return %a3
  }
  %qt = %f0(%qkv)
  %f1 = fn (%b0: Tensor[(2, 4, 24), float32]) -> Tensor[(2, 4, 8), float32] [Compiler="builtin", Composite="builtin.elementwise"] {
    %b1 = strided_slice(%b0, begin=[16], end=[24], axes=[2])
    %b2 = relu(%b1)
    return %b2
  }
  %r = %f1(%qkv)
  return (%qt, %r)
}
""")
    after = partition_builtin(before)
    assert_structural_equal(after, expected)
    _check_same_results(before, after)


def test_partition_fuses_a_depthwise_conv_with_its_elementwise_readers():
    """A float16 NHWC depthwise conv whose readers are all in one elementwise group joins it
    as one builtin.conv2d_epilogue function (bias + ReLU; SiLU, which reads the conv twice);
    a conv whose output is also read elsewhere (here: returned) stays a conv of its own."""
    before = parse("""
def @main(%x: Tensor[(1, 5, 5, 16), float16], %w: Tensor[(16, 3, 3, 1), float16], %b: Tensor[(16,), float16]) -> Tuple[Tensor[(1, 5, 5, 16), float16], Tensor[(1, 5, 5, 16), float16]] {
  %c = conv2d(%x, %w, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
  %y = add(%c, %b)
  %r = relu(%y)
  %c2 = conv2d(%r, %w, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
  %s = sigmoid(%c2)
  %m = multiply(%c2, %s)
  %c3 = conv2d(%m, %w, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
  %n = negative(%c3)
  return (%c3, %n)
}
""")
    expected = parse("""
def @main(%x: Tensor[(1, 5, 5, 16), float16], %w: Tensor[(16, 3, 3, 1), float16], %b: Tensor[(16,), float16]) -> Tuple[Tensor[(1, 5, 5, 16), float16], Tensor[(1, 5, 5, 16), float16]] {
  %f0 = fn (%a0: Tensor[(1, 5, 5, 16), float16], %a1: Tensor[(16, 3, 3, 1), float16], %a2: Tensor[(16,), float16]) -> Tensor[(1, 5, 5, 16), float16] [Compiler="builtin", Composite="builtin.conv2d_epilogue"] {
    %a3 = conv2d(%a0, %a1, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
    %a4 = add(%a3, %a2)
    %a5 = relu(%a4)
    return %a5
  }
  %r = %f0(%x, %w, %b)
  %f1 = fn (%b0: Tensor[(1, 5, 5, 16), float16], %b1: Tensor[(16, 3, 3, 1), float16]) -> Tensor[(1, 5, 5, 16), float16] [Compiler="builtin", Composite="builtin.conv2d_epilogue"] {
    %b2 = conv2d(%b0, %b1, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
    %b3 = sigmoid(%b2)
    %b4 = multiply(%b2, %b3)
    return %b4
  }
  %m = %f1(%r, %w)
  %f2 = fn (%d0: Tensor[(1, 5, 5, 16), float16], %d1: Tensor[(16, 3, 3, 1), float16]) -> Tensor[(1, 5, 5, 16), float16] [Compiler="builtin", Composite="builtin.conv2d"] {
    %d2 = conv2d(%d0, %d1, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
    return %d2
  }
  %c3 = %f2(%m, %w)
  %f3 = fn (%e0: Tensor[(1, 5, 5, 16), float16]) -> Tensor[(1, 5, 5, 16), float16] [Compiler="builtin", Composite="builtin.elementwise"] {
    %e1 = negative(%e0)
    return %e1
  }
  %n = %f3(%c3)
  return (%c3, %n)
}
""")
    after = partition_builtin(before)
    assert_structural_equal(after, expected)
    _check_same_results(before, after)


def test_partition_fuses_a_grouped_conv_of_whole_vectors_with_its_elementwise_readers():
    """A float16 NHWC grouped conv whose groups are whole 8-channel vectors (RegNet's 3x3:
    8 channels a group; here also 8 in, 16 out) joins its bias + ReLU as one
    builtin.conv2d_epilogue function (grouped_conv.cuh on CUDA); groups of 4 channels do not."""
    before = parse("""
def @main(%x: Tensor[(1, 5, 5, 32), float16], %w: Tensor[(32, 3, 3, 8), float16], %b: Tensor[(32,), float16], %w2: Tensor[(64, 3, 3, 8), float16], %w4: Tensor[(64, 3, 3, 4), float16]) -> Tensor[(1, 5, 5, 64), float16] {
  %c = conv2d(%x, %w, pads=[1, 1, 1, 1], groups=4, data_layout="NHWC", kernel_layout="OHWI")
  %y = add(%c, %b)
  %r = relu(%y)
  %c2 = conv2d(%r, %w2, pads=[1, 1, 1, 1], groups=4, data_layout="NHWC", kernel_layout="OHWI")
  %r2 = relu(%c2)
  %c4 = conv2d(%r2, %w4, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
  %r4 = relu(%c4)
  return %r4
}
""")
    expected = parse("""
def @main(%x: Tensor[(1, 5, 5, 32), float16], %w: Tensor[(32, 3, 3, 8), float16], %b: Tensor[(32,), float16], %w2: Tensor[(64, 3, 3, 8), float16], %w4: Tensor[(64, 3, 3, 4), float16]) -> Tensor[(1, 5, 5, 64), float16] {
  %f0 = fn (%a0: Tensor[(1, 5, 5, 32), float16], %a1: Tensor[(32, 3, 3, 8), float16], %a2: Tensor[(32,), float16]) -> Tensor[(1, 5, 5, 32), float16] [Compiler="builtin", Composite="builtin.conv2d_epilogue"] {
    %a3 = conv2d(%a0, %a1, pads=[1, 1, 1, 1], groups=4, data_layout="NHWC", kernel_layout="OHWI")
    %a4 = add(%a3, %a2)
    %a5 = relu(%a4)
    return %a5
  }
  %r = %f0(%x, %w, %b)
  %f1 = fn (%b0: Tensor[(1, 5, 5, 32), float16], %b1: Tensor[(64, 3, 3, 8), float16]) -> Tensor[(1, 5, 5, 64), float16] [Compiler="builtin", Composite="builtin.conv2d_epilogue"] {
    %b2 = conv2d(%b0, %b1, pads=[1, 1, 1, 1], groups=4, data_layout="NHWC", kernel_layout="OHWI")
    %b3 = relu(%b2)
    return %b3
  }
  %r2 = %f1(%r, %w2)
  %f2 = fn (%d0: Tensor[(1, 5, 5, 64), float16], %d1: Tensor[(64, 3, 3, 4), float16]) -> Tensor[(1, 5, 5, 64), float16] [Compiler="builtin", Composite="builtin.conv2d"] {
    %d2 = conv2d(%d0, %d1, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
    return %d2
  }
  %c4 = %f2(%r2, %w4)
  %f3 = fn (%e0: Tensor[(1, 5, 5, 64), float16]) -> Tensor[(1, 5, 5, 64), float16] [Compiler="builtin", Composite="builtin.elementwise"] {
    %e1 = relu(%e0)
    return %e1
  }
  %r4 = %f3(%c4)
  return %r4
}
""")
    after = partition_builtin(before)
    assert_structural_equal(after, expected)
    _check_same_results(before, after)


def test_partition_gives_an_elementwise_group_to_one_conv_only():
    """relu(conv(x) + conv(y)), both depthwise: the group is the first conv's epilogue and
    reads the second conv's output, which stays a conv of its own (a kernel runs one conv)."""
    before = parse("""
def @main(%x: Tensor[(1, 5, 5, 16), float16], %y: Tensor[(1, 5, 5, 16), float16], %w: Tensor[(16, 3, 3, 1), float16]) -> Tensor[(1, 5, 5, 16), float16] {
  %c1 = conv2d(%x, %w, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
  %c2 = conv2d(%y, %w, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
  %s = add(%c1, %c2)
  %r = relu(%s)
  return %r
}
""")
    expected = parse("""
def @main(%x: Tensor[(1, 5, 5, 16), float16], %y: Tensor[(1, 5, 5, 16), float16], %w: Tensor[(16, 3, 3, 1), float16]) -> Tensor[(1, 5, 5, 16), float16] {
  %f0 = fn (%a0: Tensor[(1, 5, 5, 16), float16], %a1: Tensor[(16, 3, 3, 1), float16]) -> Tensor[(1, 5, 5, 16), float16] [Compiler="builtin", Composite="builtin.conv2d"] {
    %a2 = conv2d(%a0, %a1, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
    return %a2
  }
  %c2 = %f0(%y, %w)
  %f1 = fn (%b0: Tensor[(1, 5, 5, 16), float16], %b1: Tensor[(16, 3, 3, 1), float16], %b2: Tensor[(1, 5, 5, 16), float16]) -> Tensor[(1, 5, 5, 16), float16] [Compiler="builtin", Composite="builtin.conv2d_epilogue"] {
    %b3 = conv2d(%b0, %b1, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
    %b4 = add(%b3, %b2)
    %b5 = relu(%b4)
    return %b5
  }
  %r = %f1(%x, %w, %c2)
  return %r
}
""")
    after = partition_builtin(before)
    assert_structural_equal(after, expected)
    _check_same_results(before, after)


def test_partition_report_counts_the_builtin_functions_that_fuse_ops():
    """The partition report counts a builtin function that runs several ops as one kernel
    under its kind (here a depthwise conv with bias, ReLU and sigmoid as its epilogue, and
    a two-op elementwise group reading the transpose of the epilogue's result in place)."""
    from byoc.transform.partition import partition_for
    before = parse("""
def @main(%x: Tensor[(1, 5, 5, 16), float16], %w: Tensor[(16, 3, 3, 1), float16], %b: Tensor[(16,), float16]) -> Tuple[Tensor[(1, 5, 5, 16), float16], Tensor[(1, 5, 5, 16), float16]] {
  %c = conv2d(%x, %w, pads=[1, 1, 1, 1], groups=16, data_layout="NHWC", kernel_layout="OHWI")
  %y = add(%c, %b)
  %r = relu(%y)
  %s = sigmoid(%r)
  %t = transpose(%s, axes=[0, 2, 1, 3])
  %n = negative(%t)
  %e = exp(%n)
  return (%s, %e)
}
""")
    _, report = partition_for(before, [], finalize=partition_builtin)
    builtin = report.to_json()["backends"]["builtin"]
    assert builtin["patterns"] == {"conv2d_epilogue": 1, "elementwise": 1}, report.to_text()
    assert builtin["composites"] == 2 and builtin["partitions"] == 2
    assert report.to_json()["copies_per_run"] == {}


@pytest.mark.parametrize("change", ["float32", "nchw", "channels_12", "broadcast_reader"])
def test_partition_leaves_other_convs_unfused(change):
    """Only what depthwise.cuh computes fuses: not float32, not NCHW, not channels that are
    no multiple of 8, and not a conv that its group reads broadcast to a larger shape."""
    dtype = "float32" if change == "float32" else "float16"
    channels = 12 if change == "channels_12" else 16
    layout = ("NCHW", "OIHW") if change == "nchw" else ("NHWC", "OHWI")
    x_shape = (1, channels, 5, 5) if change == "nchw" else (1, 5, 5, channels)
    w_shape = (channels, 1, 3, 3) if change == "nchw" else (channels, 3, 3, 1)
    with FunctionBuilder("main") as fb:
        x = fb.param("x", x_shape, dtype)
        w = fb.param("w", w_shape, dtype)
        conv = fb.call("conv2d", x, w, pads=[1, 1, 1, 1], groups=channels, data_layout=layout[0],
                       kernel_layout=layout[1])
        if change == "broadcast_reader":
            other = fb.param("other", (2, 1, 5, 5, channels), dtype)
            fb.ret(fb.call("add", conv, other))
        else:
            fb.ret(fb.call("relu", conv))
    main = partition_builtin(fb.module())["main"]
    assert [f.attrs["Composite"] for _, f in builtin_functions(main)] == ["builtin.conv2d", "builtin.elementwise"]


LAYOUT_CHAINS = {
    # name: (input shape, [(op, attrs), ...] applied in turn, layout functions expected)
    "attention_k": ((2, 5, 48), [("strided_slice", dict(begin=[16], end=[32], axes=[2])),
                                 ("reshape", dict(shape=[2, 5, 4, 4])),
                                 ("transpose", dict(axes=[0, 2, 3, 1]))], 1),
    "steps_and_negative": ((6, 7, 8), [("transpose", dict(axes=[2, 0, 1])),
                                       ("strided_slice", dict(begin=[7, 1], end=[-9, 6], axes=[0, 2], strides=[-2, 2])),
                                       ("expand_dims", dict(axes=[1])),
                                       ("transpose", dict(axes=[3, 1, 2, 0]))], 1),
    "squeeze_between": ((3, 1, 4, 6), [("transpose", dict(axes=[1, 0, 3, 2])),
                                       ("squeeze", dict(axes=[0])),
                                       ("strided_slice", dict(begin=[1], end=[5], axes=[1]))], 1),
    # merging two transposed dims is no view: the chain stops before the reshape
    "reshape_breaks": ((4, 6, 8), [("transpose", dict(axes=[1, 0, 2])),
                                   ("reshape", dict(shape=[24, 8])),
                                   ("strided_slice", dict(begin=[2], end=[20], axes=[0], strides=[3]))], 0),
}


@pytest.mark.parametrize("name", sorted(LAYOUT_CHAINS))
def test_layout_chains_run_as_one_copy_and_match_the_interpreter(name, tmp_path):
    shape, steps, chains = LAYOUT_CHAINS[name]
    with FunctionBuilder("main") as fb:
        y = fb.param("x", shape, "float32")
        for op, attrs in steps:
            y = fb.call(op, y, **attrs)
        fb.ret(y)
    mod = fb.module()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    library = byoc.build(mod, config="cpu", workdir=str(tmp_path / "w"))
    partitioned = (tmp_path / "w" / "partitioned.ir").read_text()
    assert partitioned.count('Composite="builtin.layout"') == chains
    np.testing.assert_array_equal(library.load().run(x), byoc.interpret(mod, x=x))


def views_model(dtype):
    """Rotary embeddings and SwiGLU over views of their inputs (the test below)."""
    rng = np.random.default_rng(5)
    with FunctionBuilder("main") as fb:
        qkv = fb.param("qkv", (2, 6, 3 * 16), dtype)  # 2 heads of 8, three projections
        q = fb.call("strided_slice", qkv, begin=[16], end=[32], axes=[2])
        q = fb.call("transpose", fb.call("reshape", q, shape=[2, 6, 2, 8]), axes=[0, 2, 1, 3])
        halves = fb.call("reshape", q, shape=[2, 2, 6, 2, 4])
        swapped = fb.call("strided_slice", halves, begin=[-1], end=[-2 ** 63 + 1], axes=[3], strides=[-1])
        cos = rng.standard_normal((1, 1, 6, 2, 4)).astype(dtype)
        sin = rng.standard_normal((1, 1, 6, 2, 4)).astype(dtype)
        rotated = fb.call("add", fb.call("multiply", halves, cos), fb.call("multiply", swapped, sin))
        gate_up = fb.param("gate_up", (2, 6, 32), dtype)
        gate = fb.call("strided_slice", gate_up, begin=[0], end=[16], axes=[2])
        up = fb.call("strided_slice", gate_up, begin=[16], end=[32], axes=[2])
        swiglu = fb.call("multiply", fb.call("multiply", gate, fb.call("sigmoid", gate)), up)
        fb.ret(rotated, swiglu)
    inputs = {"qkv": rng.standard_normal((2, 6, 48)).astype(dtype), "gate_up": rng.standard_normal((2, 6, 32)).astype(dtype)}
    return fb.module(), inputs


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_elementwise_kernels_read_views_of_their_parameters_in_place(precision, tmp_path):
    """Rotary embeddings over heads sliced and transposed out of a fused projection, with
    rotate_half as a reversed view, and SwiGLU over two slices of one tensor: each runs as
    one elementwise kernel reading its views in place (offsets, transposed and negative
    strides), with no copy; the results match the interpreter's."""
    mod, inputs = views_model(precision)
    library = byoc.build(mod, config={"target": "cpu", "backends": ["builtin"]}, workdir=str(tmp_path / "w"))
    report = library.report.to_json()
    assert report["copies_per_run"] == {} and report["calls_per_run"] == 2, library.report.to_text()
    got = library.load().run(**inputs)
    want = byoc.interpret(mod, **inputs)
    # sigmoid's expf may differ from NumPy's by an ulp; in float16 the build's silu (RecognizeSiLU)
    # rounds x * sigmoid(x) once where the interpreter rounds the sigmoid first
    tolerance = 2e-3 if precision == "float16" else 1e-6
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tolerance, atol=tolerance)


def test_views_that_do_not_compose_over_each_other_stay_outside_the_group(tmp_path):
    """t = transpose(x) read by an add and through reshape -> slice: the slice's chain is a
    view of t, but merging t's transposed dims is not a view of x, so t is not pulled in
    (the build failed in codegen); a view of a group member is never a view of a parameter."""
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (4, 4), "float32")
        t = fb.call("transpose", x, axes=[1, 0])
        sliced = fb.call("strided_slice", fb.call("reshape", t, shape=[16]), begin=[0], end=[4], axes=[0])
        y = fb.call("exp", x)
        u = fb.call("transpose", y, axes=[1, 0])
        fb.ret(fb.call("add", t, sliced), fb.call("add", u, y))
    mod = fb.module()
    library = byoc.build(mod, config={"target": "cpu", "backends": ["builtin"]}, workdir=str(tmp_path / "w"))
    x = np.arange(16, dtype=np.float32).reshape(4, 4) / 7
    for got, want in zip(library.load().run(x=x), byoc.interpret(mod, x=x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_depthwise_epilogue_reads_a_view_from_the_right_argument(tmp_path):
    """The conv's epilogue adds a bias and a slice of another tensor: each input reads its
    own argument (a view's parameter index is mapped like the others'), in the CUDA source."""
    from byoc.backends.builtin.conv_epilogue import conv_epilogue_cuda
    from byoc.backends.builtin.partition import partition_builtin
    with FunctionBuilder("main") as fb:
        big = fb.param("big", (1, 5, 5, 32), "float16")
        half = fb.call("strided_slice", big, begin=[16], end=[32], axes=[3])
        x = fb.param("x", (1, 5, 5, 16), "float16")
        conv = fb.call("conv2d", x, fb.param("w", (16, 3, 3, 1), "float16"), pads=(1, 1, 1, 1), groups=16,
                       data_layout="NHWC", kernel_layout="OHWI")
        fb.ret(fb.call("add", fb.call("add", conv, fb.param("bias", (16,), "float16")), half))
    partitioned = partition_builtin(fb.module())
    (func,) = [b.value for b in partitioned["main"].bindings if isinstance(b.value, byoc.ir.Function)
               and b.value.attrs.get("Composite") == "builtin.conv2d_epilogue"]
    kernel = conv_epilogue_cuda("epilogue", func)
    params = {p: i for i, p in enumerate(func.params)}
    by_type = {tuple(p.type.shape): i for p, i in params.items()}
    args = {tuple(i["strides"]) if i["access"] == "strided" else i["access"]: i["arg"] for i in kernel["inputs"][1:]}
    assert sorted(args.values()) == sorted([by_type[(16,)], by_type[(1, 5, 5, 32)]]), kernel["inputs"]
    view = next(i for i in kernel["inputs"] if i.get("offset"))
    assert view["arg"] == by_type[(1, 5, 5, 32)] and view["offset"] == 16


@pytest.mark.parametrize("window, strides, dilations, groups, launch", [
    (3, [1, 1], [1, 1], 16, "launch_common_window<__half, int32_t, 3, 1>"),
    (5, [2, 2], [1, 1], 16, "launch_common_window<__half, int32_t, 5, 2>"),
    (7, [1, 1], [1, 1], 16, "launch_common_window<__half, int32_t, 7, 1>"),
    (7, [2, 2], [1, 1], 16, "launch_window<__half, int32_t, 0, 0, 0>"),  # not unrolled: the generic kernel
    (3, [1, 1], [2, 2], 16, "launch_window<__half, int32_t, 0, 0, 0>"),
    (3, [2, 1], [1, 1], 16, "launch_window<__half, int32_t, 0, 0, 0>"),
    (3, [2, 2], [1, 1], 1, "launch_few_channels<4>"),
    (3, [2, 2], [1, 1], 2, "launch_grouped<8, 8>"),  # grouped_conv.cuh: two groups of 8 channels
])
def test_conv_epilogue_names_the_launcher_of_its_window(window, strides, dilations, groups, launch):
    """A conv2d_epilogue's generated code calls the depthwise.cuh launcher of its own window
    (depthwise.cuh's common_window, mirrored), so that it instantiates only the kernels that
    can run it; a dense conv of 4 channels calls the few-channel kernel, a grouped one
    grouped_conv.cuh's with its group widths."""
    from byoc.backends.builtin.conv_epilogue import conv_epilogue_cuda
    channels = 16 if groups > 1 else 4
    with FunctionBuilder("main") as fb:  # groups 16: depthwise; 2: grouped
        x = fb.param("x", (1, 15, 15, channels), "float16")
        w = fb.param("w", (16, window, window, channels // groups), "float16")
        conv = fb.call("conv2d", x, w, strides=strides, dilations=dilations, groups=groups,
                       data_layout="NHWC", kernel_layout="OHWI")
        fb.ret(fb.call("relu", conv))
    partitioned = partition_builtin(fb.module())
    (func,) = [b.value for b in partitioned["main"].bindings if isinstance(b.value, byoc.ir.Function)
               and b.value.attrs.get("Composite") == "builtin.conv2d_epilogue"]
    assert conv_epilogue_cuda("epilogue", func)["conv"]["launch"] == launch


def test_a_concat_reads_its_slices_and_transposes_in_place(tmp_path):
    """A roll (concat of two slices of one tensor, as the exporters write torch.roll) and a
    concat of a transpose are one builtin.concat_views function each, copying every part
    from its view; a slice also read elsewhere stays a copy of its own. The cpu build
    matches the interpreter."""
    before = parse("""
def @main(%x: Tensor[(2, 5, 3), float32], %y: Tensor[(5, 2, 4), float32]) -> Tuple[Tensor[(2, 5, 3), float32], Tensor[(2, 5, 7), float32], Tensor[(2, 2, 3), float32]] {
  %tail = strided_slice(%x, begin=[3], end=[5], axes=[1])
  %head = strided_slice(%x, begin=[0], end=[3], axes=[1])
  %rolled = concat(%tail, %head, axis=1)
  %t = transpose(%y, axes=[1, 0, 2])
  %t2 = strided_slice(%t, begin=[0], end=[5], axes=[1], strides=[1])
  %z = concat(%x, %t2, axis=2)
  return (%rolled, %z, %tail)
}
""")
    after = partition_builtin(before)
    composites = [b.value.attrs.get("Composite") for b in after["main"].bindings if isinstance(b.value, Function)]
    assert composites == ["builtin.strided_slice", "builtin.concat_views", "builtin.concat_views"], composites
    (roll, joined) = [b.value for b in after["main"].bindings if isinstance(b.value, Function)
                      and b.value.attrs.get("Composite") == "builtin.concat_views"]
    assert [b.value.op.name for b in roll.bindings] == ["strided_slice", "concat"]  # the tail is a copy already
    assert [b.value.op.name for b in joined.bindings] == ["transpose", "strided_slice", "concat"]
    _check_same_results(before, after)
    library = byoc.build(before, target="cpu", config={"backends": ["builtin"]}, workdir=str(tmp_path / "w"))
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 5, 3)).astype(np.float32), rng.standard_normal((5, 2, 4)).astype(np.float32)
    for got, want in zip(library.load().run(x=x, y=y), interpret(before, x, y), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_stem_conv_reads_the_image_before_its_channel_pad():
    """A conv the few-channel kernel takes that reads a zero pad of the channels alone (an
    RGB image padded 3 -> 4 by PadConvChannels) reads the 3-channel image instead, its
    filters cut to the 3 channels the pad kept: no pad kernel. A pad of other axes too, or
    of another value, stays, and so does one before a conv with no elementwise epilogue."""
    w4 = np.arange(8 * 3 * 3 * 4, dtype=np.float16).reshape(8, 3, 3, 4) / 64
    w4[..., 0] = 0  # the pad added a channel before the image's (pads begin at 1)
    const4 = f"const({w4.tolist()}, float16)"
    const3 = f"const({np.ascontiguousarray(w4[..., 1:]).tolist()}, float16)"
    program = """
def @main(%x: Tensor[(1, 9, 9, 3), float16]) -> Tensor[(1, 5, 5, 8), float16] {{
  %p = pad(%x, pads={pads}, value={value})
  %c = conv2d(%p, {weight}, strides=[2, 2], pads=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI")
  %r = relu(%c)
  return %r
}}
"""
    before = parse(program.format(pads=[0, 0, 0, 1, 0, 0, 0, 0], value=0.0, weight=const4))
    after = partition_builtin(before)
    expected = parse("""
def @main(%x: Tensor[(1, 9, 9, 3), float16]) -> Tensor[(1, 5, 5, 8), float16] {
  %f0 = fn (%a0: Tensor[(1, 9, 9, 3), float16]) -> Tensor[(1, 9, 9, 4), float16] [Compiler="builtin", Composite="builtin.pad"] {
    %a1 = pad(%a0, pads=[0, 0, 0, 1, 0, 0, 0, 0])
    return %a1
  }
  %p = %f0(%x)
  %f1 = fn (%b0: Tensor[(1, 9, 9, 3), float16], %b1: Tensor[(8, 3, 3, 3), float16]) -> Tensor[(1, 5, 5, 8), float16] [Compiler="builtin", Composite="builtin.conv2d_epilogue"] {
    %b2 = conv2d(%b0, %b1, strides=[2, 2], pads=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI")
    %b3 = relu(%b2)
    return %b3
  }
  %r = %f1(%x, WEIGHT)
  return %r
}
""".replace("WEIGHT", const3))
    assert_structural_equal(after, expected)  # the dead pad goes with dead code elimination
    _check_same_results(before, after)
    for pads, value in (([0, 1, 0, 1, 0, 0, 0, 0], 0.0), ([0, 0, 0, 1, 0, 0, 0, 0], 1.0)):
        kept = partition_builtin(parse(program.format(pads=pads, value=value, weight=const4)))
        (conv,) = [b.value for b in kept["main"].bindings if isinstance(b.value, byoc.ir.Function)
                   and b.value.attrs.get("Composite") == "builtin.conv2d_epilogue"]
        assert conv.params[0].type.shape[3] == 4, (pads, value)
    # a conv with no elementwise epilogue runs in the shim's conv2d, whose direct kernel takes
    # 4 channels only: it keeps its pad
    alone = partition_builtin(parse(program.format(pads=[0, 0, 0, 1, 0, 0, 0, 0], value=0.0, weight=const4)
                                    .replace("%r = relu(%c)", "%r = max_pool2d(%c, kernel=[1, 1], layout=\"NHWC\")")))
    (conv,) = [b.value for b in alone["main"].bindings if isinstance(b.value, byoc.ir.Function)
               and b.value.attrs.get("Composite") == "builtin.conv2d"]
    assert conv.params[0].type.shape[3] == 4


def test_a_transpose_of_unit_axes_is_a_view(tmp_path):
    """A transpose that moves only axes of size 1 (a pooled NHWC (N, 1, 1, C) back to NCHW)
    is partitioned as the reshape it is: a view, no call; a transpose that reorders real
    axes stays a copy. The cpu build matches the interpreter."""
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (2, 3, 4, 5), "float32")
        pooled = fb.call("global_avg_pool2d", x, layout="NHWC")
        nchw = fb.call("transpose", pooled, axes=[0, 3, 1, 2])
        fb.ret(fb.call("exp", nchw), fb.call("transpose", x, axes=[0, 3, 1, 2]))
    mod = fb.module()
    partitioned = partition_builtin(mod)
    composites = [b.value.attrs.get("Composite") for b in partitioned["main"].bindings
                  if isinstance(b.value, byoc.ir.Function)]
    assert composites == ["builtin.global_avg_pool2d", "builtin.reshape", "builtin.elementwise",
                          "builtin.transpose"], composites
    library = byoc.build(mod, config={"target": "cpu", "backends": ["builtin"]}, workdir=str(tmp_path / "w"))
    assert library.report.to_json()["copies_per_run"] == {"transpose": 1}, library.report.to_text()
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    for got, want in zip(library.load().run(x=x), byoc.interpret(mod, x=x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_layout_op_of_a_cast_input_is_read_as_a_view(tmp_path):
    """transpose(cast(x)) (an image cast to float16, then moved to NHWC) partitions as one
    elementwise function computing cast(transpose(x)), the transpose a view it reads in
    place: one call, no copy. A cast of an elementwise result keeps its group (the
    transpose copies that group's float16 output, as before)."""
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (2, 3, 4, 5), "float32")
        image = fb.call("transpose", fb.call("cast", x, dtype="float16"), axes=[0, 2, 3, 1])
        grouped = fb.call("transpose", fb.call("cast", fb.call("exp", x), dtype="float16"), axes=[0, 2, 3, 1])
        fb.ret(image, grouped)
    mod = fb.module()
    partitioned = partition_builtin(mod)
    composites = [b.value.attrs.get("Composite") for b in partitioned["main"].bindings
                  if isinstance(b.value, byoc.ir.Function)]
    assert composites == ["builtin.elementwise", "builtin.elementwise", "builtin.transpose"], composites
    first = next(b.value for b in partitioned["main"].bindings if isinstance(b.value, byoc.ir.Function))
    assert [b.value.op.name for b in first.bindings] == ["transpose", "cast"]
    library = byoc.build(mod, config={"target": "cpu", "backends": ["builtin"]}, workdir=str(tmp_path / "w"))
    assert library.report.to_json()["copies_per_run"] == {"transpose": 1}, library.report.to_text()
    data = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    for got, want in zip(library.load().run(x=data), byoc.interpret(mod, x=data), strict=True):
        np.testing.assert_array_equal(got, want)


def test_reshape_strides_of_views():
    from byoc.backends.builtin.views import reshape_strides
    assert reshape_strides((2, 3, 4), (12, 4, 1), (6, 4)) == [4, 1]  # dense: merge
    assert reshape_strides((8, 128, 768), (294912, 2304, 1), (8, 128, 12, 64)) == [294912, 2304, 64, 1]  # a slice
    assert reshape_strides((3, 4), (1, 3), (12,)) is None  # a transposed view cannot merge
    assert reshape_strides((3, 4), (1, 3), (3, 2, 2)) == [1, 6, 3]  # but can split
    assert reshape_strides((1, 5, 1), (99, 2, 7), (5,)) == [2]
    assert reshape_strides((0, 4), (4, 1), (2, 0)) == [0, 1]


def test_a_build_compiles_only_the_shim_families_its_code_calls(tmp_path):
    """The shim is compiled per op family: an elementwise model links common only, a
    conv model conv and what conv calls into (linalg: its GEMMs), and a call no
    family defines takes every file (the link then names it). CUDA and CPU alike."""
    from byoc.backends.builtin import SHIM_DIR, shim_sources
    names = lambda paths: [p.stem for p in paths]  # noqa: E731
    assert names(shim_sources(SHIM_DIR / "cuda", set())) == ["common"]
    assert names(shim_sources(SHIM_DIR / "cuda", {"byoc_shim_conv2d"})) == ["common", "conv", "linalg"]
    assert names(shim_sources(SHIM_DIR / "cuda", {"byoc_shim_pad", "byoc_shim_softmax"})) == ["common", "pad", "softmax"]
    assert names(shim_sources(SHIM_DIR / "cpu", {"byoc_shim_reduce"})) == ["common", "reduce"]
    every = names(shim_sources(SHIM_DIR / "cuda", None))
    assert every == names(shim_sources(SHIM_DIR / "cuda", {"byoc_shim_no_such_function"}))
    assert set(every) >= {"common", "conv", "gather", "layout", "linalg", "norm", "pad", "pool", "reduce", "softmax"}

    with FunctionBuilder("main") as fb:
        x = fb.param("x", (4, 8), "float32")
        fb.ret(fb.call("relu", fb.call("add", x, np.ones(8, np.float32))))
    library = byoc.build(fb.module(), target="cpu", config={"backends": ["builtin"]}, workdir=str(tmp_path / "w"))
    ninja = (tmp_path / "w" / "build.ninja").read_text()
    assert "shim_cpu_common.o" in ninja and "shim_cpu_conv_pool.o" not in ninja
    x = np.arange(32, dtype=np.float32).reshape(4, 8) - 16
    np.testing.assert_array_equal(library.load().run(x=x), np.maximum(x + 1, 0))
