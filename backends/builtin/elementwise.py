"""Fused elementwise functions: the op -> C expression table, and the plain dict that
templates/builtin/elementwise.j2 renders into a CUDA kernel or a CPU loop.

One output element per iteration: every parameter is loaded at the output index projected
onto its own (broadcast) shape, then the body's bindings are evaluated in order as C
statements in their compute types (16-bit floats in float, rounded back to their dtype
after every op, as the NumPy references do), and the last one is stored.

A function may start with views of its parameters: chains of layout ops (strided_slice,
transpose, reshape, squeeze, expand_dims) that views.py composes into one (shape, strides,
offset) over the parameter. Each such view is read in place as one more input, at its
offset plus the output coordinates times its strides (negative for a reversed slice): the
slices and transposes that feed an elementwise chain cost no copy (SwiGLU's gate and up
halves of one GEMM, rotary embeddings' rotated heads).

The expressions follow the references in byoc/ops/elementwise.py exactly: integer
arithmetic wraps (through unsigned types), integer division truncates and x / 0 == 0,
Python-style mod for fmod=False, maximum/minimum/clip let NaN win, round is half-to-even
(rint in the default rounding mode), and the helpers named byoc_* are defined in
templates/builtin/prelude.j2 for both targets.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...errors import BuildError
from ...ir.expr import Constant, Function, Var
from ...ir.types import TensorType
from .dtypes import (COMPUTE_TYPES, element_size, SIXTEEN_BIT_FLOATS, WRAPPING_TYPES, float_literal,
                     int_literal, is_float, is_signed_int, storage_type, value_literal)

# Kernels index with 32-bit integers when every index fits (faster division and fewer
# registers on the GPU), else with 64-bit ones.
INT32_INDEX_LIMIT = 2 ** 31 - 1
CUDA_THREADS_PER_BLOCK = 256
# Enough blocks to fill any current GPU several times over; the grid-stride loop does the rest.
CUDA_MAX_BLOCKS = 65535
# Elements per thread iteration of the vectorized CUDA kernel for 4-byte types (16-byte
# loads); twice as many for 2- and 1-byte ones (elementwise_kernel).
CUDA_VECTOR_WIDTH = 4


@dataclass(frozen=True)
class Operand:
    """What an expression renderer knows of its inputs: their dtype (all inputs of one op
    share a dtype, except where's condition) and the result dtype."""
    dtype: str        # the input dtype (x for where)
    result_dtype: str
    attrs: dict

    @property
    def c_type(self) -> str:
        return COMPUTE_TYPES[self.dtype]

    def math(self, name: str) -> str:
        """The C math function for this compute type: expf for float, exp for double."""
        return name + ("f" if self.c_type == "float" else "")

    def number(self, value: float) -> str:
        return float_literal(value, self.c_type)

    def wrapping(self, a: str, operator: str, b: str) -> str:
        """`a operator b` with the two's-complement wraparound of the dtype."""
        unsigned = WRAPPING_TYPES[self.dtype]
        return f"({self.c_type})(({unsigned}){a} {operator} ({unsigned}){b})"


Renderer = Callable[[Operand, list], str]


def _by_kind(float_form: Renderer, int_form: Renderer | None = None) -> Renderer:
    """A renderer that picks the float or the integer form by the input dtype."""
    def render(op: Operand, args) -> str:
        if is_float(op.dtype) or int_form is None:
            return float_form(op, args)
        return int_form(op, args)
    return render


def _math(name: str) -> Renderer:
    return lambda op, a: f"{op.math(name)}({a[0]})"


def _negative_int(op: Operand, a) -> str:
    return op.wrapping("0", "-", a[0])


def _abs_int(op: Operand, a) -> str:
    if not is_signed_int(op.dtype):
        return a[0]
    return f"({a[0]} < 0 ? {_negative_int(op, a)} : {a[0]})"


def _gelu(op: Operand, a) -> str:
    x = a[0]
    if op.attrs["approximate"] == "tanh":
        # 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u), as the reference computes it
        u = f"{op.number(0.7978845608028654)} * ({x} + {op.number(0.044715)} * {x} * {x} * {x})"
        return f"({x} * byoc_sigmoid({op.number(2.0)} * {u}))"
    # 0.5 * x * (1 + erf(x / sqrt(2))) == 0.5 * x * erfc(-x / sqrt(2)), without cancellation
    return f"({op.number(0.5)} * {x} * {op.math('erfc')}(-{x} * {op.number(0.7071067811865476)}))"


def _clip(op: Operand, a) -> str:
    low, high = op.attrs["min"], op.attrs["max"]
    value = a[0]
    if not is_float(op.dtype):
        # Bounds beyond an integer dtype's range move to its ends (as _clip_bounds does).
        from ...ops.elementwise import _clip_bounds
        from ...ir.types import numpy_dtype
        low, high = _clip_bounds(numpy_dtype(op.dtype), low, high)
        bound = lambda v: f"({op.c_type})({int_literal(v)})"  # noqa: E731
    else:
        bound = op.number
    if low is not None:
        value = f"byoc_maximum({value}, {bound(low)})"
    if high is not None:
        value = f"byoc_minimum({value}, {bound(high)})"
    return value


def _divide_int(op: Operand, a) -> str:
    helper = "byoc_divide_signed" if is_signed_int(op.dtype) else "byoc_divide_unsigned"
    return f"{helper}({a[0]}, {a[1]})"


def _power_int(op: Operand, a) -> str:
    unsigned = WRAPPING_TYPES[op.dtype]
    return f"byoc_power_int<{op.c_type}, {unsigned}>({a[0]}, {a[1]})"


def _mod(op: Operand, a) -> str:
    fmod = op.attrs["fmod"]
    if is_float(op.dtype):
        return f"{op.math('fmod')}({a[0]}, {a[1]})" if fmod else f"byoc_mod_float({a[0]}, {a[1]})"
    if not is_signed_int(op.dtype):
        return f"({a[1]} == 0 ? ({op.c_type})0 : ({op.c_type})({a[0]} % {a[1]}))"
    helper = "byoc_fmod_signed" if fmod else "byoc_mod_signed"
    return f"{helper}({a[0]}, {a[1]})"


def _infix(operator: str) -> Renderer:
    return lambda op, a: f"({a[0]} {operator} {a[1]})"


def _wrapping_infix(operator: str) -> Renderer:
    return _by_kind(_infix(operator), lambda op, a: op.wrapping(a[0], operator, a[1]))


# op name -> renderer of its C expression from the C expressions of its arguments.
EXPRESSIONS: dict[str, Renderer] = {
    # unary
    "negative": _by_kind(lambda op, a: f"(-{a[0]})", _negative_int),
    "abs": _by_kind(_math("fabs"), _abs_int),
    "exp": _math("exp"),
    "log": _math("log"),
    "sqrt": _math("sqrt"),
    "rsqrt": lambda op, a: f"({op.number(1.0)} / {op.math('sqrt')}({a[0]}))",
    "reciprocal": lambda op, a: f"({op.number(1.0)} / {a[0]})",
    "erf": _math("erf"),
    "tanh": _math("tanh"),
    "sigmoid": lambda op, a: f"byoc_sigmoid({a[0]})",
    "relu": lambda op, a: f"({a[0]} < ({op.c_type})0 ? ({op.c_type})0 : {a[0]})",  # NaN stays NaN
    "gelu": _gelu,
    "silu": lambda op, a: f"({a[0]} * byoc_sigmoid({a[0]}))",
    "floor": _math("floor"),
    "ceil": _math("ceil"),
    "round": _math("rint"),  # half to even in the default rounding mode
    "sin": _math("sin"),
    "cos": _math("cos"),
    "sign": _by_kind(
        lambda op, a: f"({a[0]} > 0 ? {op.number(1)} : ({a[0]} < 0 ? {op.number(-1)} : {a[0]}))",
        lambda op, a: f"({op.c_type})(({a[0]} > 0) - ({a[0]} < 0))"),
    "softplus": lambda op, a: (f"(({a[0]} > 0 ? {a[0]} : {op.number(0)}) + "
                               f"{op.math('log1p')}({op.math('exp')}(-{op.math('fabs')}({a[0]}))))"),
    "leaky_relu": lambda op, a: f"({a[0]} >= 0 ? {a[0]} : {op.number(op.attrs['alpha'])} * {a[0]})",
    "elu": lambda op, a: f"({a[0]} > 0 ? {a[0]} : {op.number(op.attrs['alpha'])} * {op.math('expm1')}({a[0]}))",
    "hard_sigmoid": lambda op, a: (f"byoc_clip({op.number(op.attrs['alpha'])} * {a[0]} + "
                                   f"{op.number(op.attrs['beta'])}, {op.number(0)}, {op.number(1)})"),
    "hard_swish": lambda op, a: (f"({a[0]} * byoc_clip({a[0]} / {op.number(6)} + {op.number(0.5)}, "
                                 f"{op.number(0)}, {op.number(1)}))"),
    "clip": _clip,
    "logical_not": lambda op, a: f"(!{a[0]})",
    "identity": lambda op, a: a[0],
    # binary
    "add": _wrapping_infix("+"),
    "subtract": _wrapping_infix("-"),
    "multiply": _wrapping_infix("*"),
    "divide": _by_kind(_infix("/"), _divide_int),
    "power": _by_kind(lambda op, a: f"{op.math('pow')}({a[0]}, {a[1]})", _power_int),
    "maximum": lambda op, a: f"byoc_maximum({a[0]}, {a[1]})",
    "minimum": lambda op, a: f"byoc_minimum({a[0]}, {a[1]})",
    "mod": _mod,
    "equal": _infix("=="),
    "not_equal": _infix("!="),
    "less": _infix("<"),
    "less_equal": _infix("<="),
    "greater": _infix(">"),
    "greater_equal": _infix(">="),
    "logical_and": _infix("&&"),
    "logical_or": _infix("||"),
    "logical_xor": _infix("!="),
    # ternary
    "where": lambda op, a: f"({a[0]} ? {a[1]} : {a[2]})",
    # cast: rendered by cast_expression (it needs both dtypes)
    "cast": lambda op, a: cast_expression(a[0], op.dtype, op.result_dtype),
}


def cast_expression(value: str, source: str, target: str) -> str:
    """`value` (in source's compute type) converted to target's compute type: to bool
    tests x != 0; floats to integers truncate toward zero; integers wrap."""
    if target == "bool":
        return value if source == "bool" else f"({value} != 0)"
    return f"({COMPUTE_TYPES[target]})({value})"


# ---------------------------------------------------------------- loads and stores

# byoc dtype -> the prelude helpers converting a stored element to its compute type and back.
LOAD_HELPERS = {"float16": "byoc_load_float16", "bfloat16": "byoc_load_bfloat16"}
STORE_HELPERS = {"float16": "byoc_store_float16", "bfloat16": "byoc_store_bfloat16"}
ROUND_HELPERS = {"float16": "byoc_round_float16", "bfloat16": "byoc_round_bfloat16"}


def _dense_strides(shape) -> list[int]:
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= size
    return strides[::-1]


def broadcast_strides(input_shape, output_shape, input_strides=None) -> list[int]:
    """Element strides of an input read at each output index (0 where it broadcasts); the
    input dense unless `input_strides` (a view's) are given."""
    rank = len(output_shape)
    padding = rank - len(input_shape)
    aligned = (1,) * padding + tuple(input_shape)
    strides = _dense_strides(aligned) if input_strides is None else [0] * padding + list(input_strides)
    return [0 if size == 1 else stride for size, stride in zip(aligned, strides)]


def merge_dims(shape, strides_per_operand):
    """Drop size-1 dims and merge neighbours that every operand walks contiguously, so
    that index arithmetic has as few divisions as possible. Returns (shape, strides)."""
    kept = [d for d, size in enumerate(shape) if size != 1]
    new_shape: list[int] = []
    new_strides: list[list[int]] = [[] for _ in strides_per_operand]
    for d in kept:
        mergeable = new_shape and all(
            strides[-1] == operand[d] * shape[d] for strides, operand in zip(new_strides, strides_per_operand))
        if mergeable:
            new_shape[-1] *= shape[d]
            for strides, operand in zip(new_strides, strides_per_operand):
                strides[-1] = operand[d]
        else:
            new_shape.append(shape[d])
            for strides, operand in zip(new_strides, strides_per_operand):
                strides.append(operand[d])
    return new_shape, new_strides


def is_elementwise_function(func: Function) -> bool:
    """Elementwise ops, after views of the parameters (the module docstring), ending in an
    elementwise op."""
    from .partition import ELEMENTWISE_CATEGORIES
    from .views import CHAIN_OPS
    viewed = set(func.params)
    for binding in func.bindings:
        op_name, category = getattr(binding.value.op, "name", None), getattr(binding.value.op, "category", None)
        if op_name in CHAIN_OPS and len(binding.value.args) == 1 and binding.value.args[0] in viewed:
            viewed.add(binding.var)
        elif category not in ELEMENTWISE_CATEGORIES:
            return False
    return bool(func.bindings) and getattr(func.bindings[-1].value.op, "category", None) in ELEMENTWISE_CATEGORIES


def _parameter_views(symbol: str, func: Function) -> dict:
    """Var -> (parameter index, View): the parameters themselves (dense), and the views of
    them at the start of `func` (views.chain_views)."""
    from .views import View, chain_views
    params = list(func.params)
    views = chain_views(func.bindings, lambda var: View.dense(var.type.shape) if var in params else None)
    if views is None:
        raise BuildError(f"builtin codegen: {symbol}: a layout op is not a strided view of a parameter")
    return {**{param: (index, View.dense(param.type.shape)) for index, param in enumerate(params)},
            **{var: (params.index(root), view) for var, (root, view) in views.items()}}


def _statements(symbol: str, func: Function, names: dict) -> list:
    """One C statement per binding of `func` (`names`: Var -> its C name so far; the
    bindings' names are added)."""
    statements = []
    for number, binding in enumerate(func.bindings):
        call = binding.value
        if binding.var in names:
            continue  # a view of a parameter, loaded as an input of its own
        args = []
        for arg in call.args:
            if isinstance(arg, Constant):
                args.append(value_literal(arg.data.reshape(-1)[0], arg.type.dtype))
            elif arg in names:
                args.append(names[arg])
            else:
                raise BuildError(
                    f"builtin codegen: {symbol}: argument of {call.op.name} is neither a parameter, "
                    f"an earlier binding nor a scalar constant")
        renderer = EXPRESSIONS.get(call.op.name)
        if renderer is None:
            raise BuildError(f"builtin codegen: {symbol}: no elementwise expression for op {call.op.name!r}")
        input_dtype = call.args[1].type.dtype if call.op.name == "where" else call.args[0].type.dtype
        result_dtype = call.type.dtype
        expression = renderer(Operand(input_dtype, result_dtype, call.attrs), args)
        is_output = number == len(func.bindings) - 1
        if result_dtype in SIXTEEN_BIT_FLOATS and not is_output:
            expression = f"{ROUND_HELPERS[result_dtype]}({expression})"
        name = f"t{number}"
        names[binding.var] = name
        statements.append({"type": COMPUTE_TYPES[result_dtype], "name": name, "expression": expression})
    return statements


def elementwise_kernel(symbol: str, func: Function, target_kind: str) -> dict:
    """The plain dict templates/builtin/elementwise.j2 renders for one fused function."""
    output_type: TensorType = func.ret_type
    output_shape = output_type.shape
    size = output_type.size

    params = list(func.params)
    views = _parameter_views(symbol, func)
    # what the elementwise ops read: parameters as they are, and views of them
    read = [v for b in func.bindings if b.var not in views for v in b.value.args if v in views]
    operands = [p for p in params if p in read] + [v for v in dict.fromkeys(read) if v not in params]
    strides, offsets, args = [], [], []
    for operand in operands:
        arg, view = views[operand]
        dense = operand in params
        strides.append(broadcast_strides(view.shape, output_shape, None if dense else view.strides))
        offsets.append(0 if dense else view.offset)
        args.append(arg)
    dense = _dense_strides(output_shape)
    dims, merged_strides = merge_dims(output_shape, strides + [dense])
    output_strides = merged_strides[-1]

    inputs = []
    names: dict[Var, str] = {}
    for index, (operand, operand_strides) in enumerate(zip(operands, merged_strides[:-1])):
        dtype = operand.type.dtype
        if operand in params and operand.type.size == 1:
            access = "scalar"
        elif operand_strides == output_strides and offsets[index] == 0:
            access = "full"
        else:
            access = "strided"
        names[operand] = f"x{index}"
        inputs.append({
            "index": index,
            "arg": args[index],
            "offset": offsets[index],
            "storage": storage_type(dtype, target_kind),
            "compute": COMPUTE_TYPES[dtype],
            "load": LOAD_HELPERS.get(dtype, ""),
            "access": access,
            "strides": operand_strides,
            "value": names[operand],
        })
    for var in views:  # views only other views read: never loaded
        names.setdefault(var, "")

    statements = _statements(symbol, func, names)

    if func.result not in names:
        raise BuildError(f"builtin codegen: {symbol}: the result must be one of the body's bindings")
    # 32-bit indices where every index fits: the output's, and each view's farthest element
    # (a view reads a parameter that may be larger than the output)
    reach = max([size] + [params[arg].type.size for arg in set(args)])
    index_type = "int32_t" if reach <= INT32_INDEX_LIMIT else "int64_t"
    blocks = max(1, min(CUDA_MAX_BLOCKS, -(-size // CUDA_THREADS_PER_BLOCK)))
    # 16-byte accesses where every buffer has 2-byte (or smaller) elements, else 16 bytes for
    # 4-byte ones. Broadcast inputs allow it when the innermost dim holds whole vectors, so
    # that the lanes of one vector differ only in that dim's coordinate (a bias over NHWC
    # channels, a per-channel scale).
    element_bytes = max(element_size(dtype) for dtype in [p.type.dtype for p in params] + [output_type.dtype])
    width = CUDA_VECTOR_WIDTH * 2 if element_bytes <= 2 else CUDA_VECTOR_WIDTH
    strided = any(i["access"] == "strided" for i in inputs)
    vectorizable = size >= width and (not strided or dims[-1] % width == 0)
    vector_width = width if vectorizable else 0
    vector_blocks = max(1, min(CUDA_MAX_BLOCKS, -(-(size // width) // CUDA_THREADS_PER_BLOCK)))
    return {
        "symbol": symbol,
        "size": size,
        "index_type": index_type,
        # A coordinate is computed only where some broadcast input needs it.
        "dims": [{"index": d, "size": s,
                  "used": any(i["access"] == "strided" and i["strides"][d] for i in inputs)}
                 for d, s in enumerate(dims)],
        "needs_coordinates": any(i["access"] == "strided" for i in inputs),
        "inputs": inputs,
        "statements": statements,
        "output": {
            "storage": storage_type(output_type.dtype, target_kind),
            "store": STORE_HELPERS.get(output_type.dtype, ""),
            "value": names[func.result],
        },
        "threads": CUDA_THREADS_PER_BLOCK,
        "blocks": blocks,
        "vector_width": vector_width,
        "vector_blocks": vector_blocks,
    }
