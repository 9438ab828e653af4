"""Elementwise ops: unary math, binary arithmetic and comparisons with NumPy broadcasting,
`where`, and `cast`.

Every op keeps its input's dtype, except comparisons and logical ops (bool) and cast (its
`dtype` attribute); binary ops and where broadcast their inputs like NumPy and need
inputs of one dtype (a frontend inserts casts where ONNX would have promoted).

The references are the golden model: they compute float16/bfloat16 in float32 and round
the result once (as onnxruntime does; NumPy's own 16-bit float arithmetic is slow or, for
bfloat16, unreliable), and integer arithmetic wraps around like C. Where a textbook
formula loses precision (1 + erf(x) for very negative x, exp(x) - 1 near 0, sigmoid of
a large negative x) they use a formulation that does not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import TypeInferenceError
from ..ir.op import AttrSpec, register_op
from ..ir.types import FLOAT_DTYPES, INT_DTYPES, NUMPY_DTYPES, TensorType, numpy_dtype
from ._common import checked_broadcast, checked_tensor, compute_dtype


@dataclass(frozen=True)
class Dtypes:
    """A set of dtypes an input accepts, with the words an error message uses for it."""
    description: str
    members: tuple[str, ...]

    def __str__(self) -> str:
        if self.members == (self.description,):  # "bool", not "bool (bool)"
            return self.description
        return f"{self.description} ({', '.join(self.members)})"


FLOATS = Dtypes("a float dtype", FLOAT_DTYPES)
NUMBERS = Dtypes("a numeric dtype", FLOAT_DTYPES + INT_DTYPES)
SIGNED_NUMBERS = Dtypes("a signed numeric dtype", FLOAT_DTYPES + tuple(d for d in INT_DTYPES if d != "uint8"))
BOOLS = Dtypes("bool", ("bool",))
ANY_DTYPE = Dtypes("any dtype", tuple(NUMPY_DTYPES))


def checked_input(op_name: str, input_name: str, type_, dtypes: Dtypes) -> TensorType:
    """Input `input_name` of `op_name`, checked to be a tensor of one of `dtypes`."""
    return checked_tensor(op_name, input_name, type_, dtypes.members, str(dtypes))


# ================================================================= erf


# erf(x) = 2/sqrt(pi) * x * exp(-x^2) * sum_n (2x^2)^n / (2n+1)!!: a series of positive
# terms (no cancellation), used below _ERF_SPLIT, where 33 terms reach double precision.
# Above it, erfc(x) = exp(-x^2) / sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))),
# a continued fraction that 60 levels evaluate to double precision for x >= 2.
# Checked against mpmath: erf within 1e-15 relative; erfc within 1e-15 from the split on,
# and 1e-13 below it, where erfc = 1 - erf loses a few digits to cancellation.
_ERF_SPLIT = 2.0
_ERF_SERIES = [1.0]
for _n in range(1, 33):
    _ERF_SERIES.append(_ERF_SERIES[-1] * 2 / (2 * _n + 1))
_ERFC_FRACTION_DEPTH = 60


def _erf_series(a: np.ndarray) -> np.ndarray:
    square = a * a
    total = np.full_like(a, _ERF_SERIES[-1])
    for coefficient in reversed(_ERF_SERIES[:-1]):
        total = total * square + coefficient
    return (2 / math.sqrt(math.pi)) * a * np.exp(-square) * total


def _exp_minus_square(a: np.ndarray) -> np.ndarray:
    """exp(-a*a) without the rounding error of a*a, which exp would magnify by a*a
    (1e-14 relative at a = 7): split a = high + low where high has few enough bits
    that high*high is exact."""
    high = np.round(a * 64) / 64
    low = a - high
    product = np.exp(-high * high) * np.exp(-(2 * high + low) * low)
    return np.where(np.isinf(a), 0.0, product)  # inf - inf made NaN of exp(-inf) == 0


def _erfc_fraction(a: np.ndarray) -> np.ndarray:
    denominator = a.copy()
    for k in range(_ERFC_FRACTION_DEPTH, 0, -1):
        denominator = a + (k / 2) / denominator
    return _exp_minus_square(a) / math.sqrt(math.pi) / denominator


def _erf_and_erfc(x) -> tuple[np.ndarray, np.ndarray]:
    """erf(x) and erfc(x) = 1 - erf(x) in float64, vectorized (NumPy has neither)."""
    x = np.asarray(x, dtype=np.float64)
    magnitude = np.abs(x)
    erf = np.empty_like(magnitude)
    erfc = np.empty_like(magnitude)
    small = magnitude < _ERF_SPLIT  # False for NaN: NaN goes through the fraction, stays NaN
    with np.errstate(all="ignore"):
        erf[small] = _erf_series(magnitude[small])
        erfc[small] = 1 - erf[small]
        erfc[~small] = _erfc_fraction(magnitude[~small])
        erf[~small] = 1 - erfc[~small]
    # erf is odd; erfc(-a) = 2 - erfc(a)
    return np.copysign(erf, x), np.where(x < 0, 2 - erfc, erfc)


def erf(x) -> np.ndarray:
    """The error function in float64, accurate to about 1e-15 relative."""
    return _erf_and_erfc(x)[0]


def erfc(x) -> np.ndarray:
    """The complementary error function 1 - erf(x) in float64, accurate to 1e-13 relative."""
    return _erf_and_erfc(x)[1]


# ================================================================= unary ops


def _sigmoid(x):
    # 1 / (1 + exp(-x)) overflows for very negative x; exp(-|x|) never does, and
    # e / (1 + e) keeps full relative precision where the result is tiny.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _gelu(x, *, approximate):
    if approximate == "tanh":
        # 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u), without the cancellation for x << 0
        u = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
        return x * _sigmoid(2 * u)
    # 0.5 * x * (1 + erf(x / sqrt(2))) == 0.5 * x * erfc(-x / sqrt(2)), in float64
    wide = x.astype(np.float64)
    return 0.5 * wide * erfc(-wide / math.sqrt(2))


def _check_gelu(op_name, x, attrs):
    if attrs["approximate"] not in ("none", "tanh"):
        raise TypeInferenceError(
            f"{op_name}: attribute approximate={attrs['approximate']!r} is not 'none' or 'tanh'")


def _clip(x, *, min, max):  # noqa: A002 - the attribute names
    low, high = _clip_bounds(x.dtype, min, max)
    if low is not None:
        x = np.maximum(x, np.asarray(low, dtype=x.dtype))
    if high is not None:
        x = np.minimum(x, np.asarray(high, dtype=x.dtype))
    # min > max gives max everywhere, as in onnxruntime and PyTorch
    return x


def _clip_bounds(dtype, low, high):
    """The bounds of clip as values of `dtype`. For an integer dtype, bounds beyond its
    range (infinities included) are moved to the end of the range: they clip nothing, or
    everything to that end."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu":
        return low, high
    info = np.iinfo(dtype)

    def to_integer(bound):
        if bound is None:
            return None
        if math.isinf(bound):
            return info.max if bound > 0 else info.min
        return min(max(int(bound), int(info.min)), int(info.max))

    return to_integer(low), to_integer(high)



def _check_clip(op_name, x, attrs):
    for name in ("min", "max"):
        bound = attrs[name]
        if bound is None:
            continue
        if math.isnan(bound):
            raise TypeInferenceError(f"{op_name}: attribute {name} is NaN")
        if x.dtype in INT_DTYPES and math.isfinite(bound) and not float(bound).is_integer():
            raise TypeInferenceError(
                f"{op_name}: attribute {name}={bound} is not a whole number, but input x has "
                f"integer dtype {x.dtype}")


@dataclass(frozen=True)
class UnaryOp:
    """A unary elementwise op. `function` gets the input in its compute dtype (float32 for
    16-bit floats) and the attributes; its result is cast back to the input's dtype."""
    function: Callable
    dtypes: Dtypes
    doc: str
    attrs: dict = field(default_factory=dict)
    check: Callable | None = None  # (op_name, input type, attrs): attribute checks beyond their kinds


UNARY_OPS: dict[str, UnaryOp] = {
    "negative": UnaryOp(np.negative, SIGNED_NUMBERS, "Elementwise -x (integers wrap around)."),
    "abs": UnaryOp(np.abs, NUMBERS, "Elementwise |x| (integers wrap around: abs(INT_MIN) == INT_MIN)."),
    "exp": UnaryOp(np.exp, FLOATS, "Elementwise e**x."),
    "log": UnaryOp(np.log, FLOATS, "Elementwise natural logarithm (-inf at 0, NaN below)."),
    "sqrt": UnaryOp(np.sqrt, FLOATS, "Elementwise square root (NaN below 0)."),
    "rsqrt": UnaryOp(lambda x: 1 / np.sqrt(x), FLOATS, "Elementwise 1 / sqrt(x)."),
    "reciprocal": UnaryOp(np.reciprocal, FLOATS, "Elementwise 1 / x."),
    "erf": UnaryOp(erf, FLOATS, "Elementwise error function."),
    "tanh": UnaryOp(np.tanh, FLOATS, "Elementwise hyperbolic tangent."),
    "sigmoid": UnaryOp(_sigmoid, FLOATS, "Elementwise logistic function 1 / (1 + exp(-x))."),
    "relu": UnaryOp(lambda x: np.maximum(x, 0), NUMBERS, "Elementwise max(x, 0)."),
    "gelu": UnaryOp(
        _gelu, FLOATS,
        "Elementwise GELU: 0.5*x*(1 + erf(x/sqrt(2))), or its tanh approximation (approximate='tanh').",
        attrs={"approximate": AttrSpec("str", "none")}, check=_check_gelu),
    "silu": UnaryOp(lambda x: x * _sigmoid(x), FLOATS, "Elementwise x * sigmoid(x) (swish)."),
    "floor": UnaryOp(np.floor, FLOATS, "Elementwise round toward -inf."),
    "ceil": UnaryOp(np.ceil, FLOATS, "Elementwise round toward +inf."),
    "round": UnaryOp(np.rint, FLOATS, "Elementwise round to nearest, ties to even."),
    "sin": UnaryOp(np.sin, FLOATS, "Elementwise sine."),
    "cos": UnaryOp(np.cos, FLOATS, "Elementwise cosine."),
    "sign": UnaryOp(np.sign, NUMBERS, "Elementwise sign: -1, 0 or 1 (NaN stays NaN)."),
    "softplus": UnaryOp(lambda x: np.logaddexp(x, 0), FLOATS, "Elementwise log(1 + exp(x)), without overflow."),
    "leaky_relu": UnaryOp(
        lambda x, *, alpha: np.where(x >= 0, x, alpha * x), FLOATS,
        "Elementwise x for x >= 0, alpha * x below.",
        attrs={"alpha": AttrSpec("float", 0.01)}),
    "elu": UnaryOp(
        lambda x, *, alpha: np.where(x > 0, x, alpha * np.expm1(x)), FLOATS,
        "Elementwise x for x > 0, alpha * (exp(x) - 1) below.",
        attrs={"alpha": AttrSpec("float", 1.0)}),
    "hard_sigmoid": UnaryOp(
        lambda x, *, alpha, beta: np.clip(alpha * x + beta, 0, 1), FLOATS,
        "Elementwise max(0, min(1, alpha * x + beta)).",
        attrs={"alpha": AttrSpec("float", 0.2), "beta": AttrSpec("float", 0.5)}),
    "hard_swish": UnaryOp(
        lambda x: x * np.clip(x / 6 + 0.5, 0, 1), FLOATS,
        "Elementwise x * max(0, min(1, x / 6 + 0.5))."),
    "clip": UnaryOp(
        _clip, NUMBERS,
        "Elementwise min(max(x, min), max); a missing bound does not clip (min > max gives max).",
        attrs={"min": AttrSpec("optional_float", None), "max": AttrSpec("optional_float", None)},
        check=_check_clip),
    "logical_not": UnaryOp(np.logical_not, BOOLS, "Elementwise boolean not."),
    "identity": UnaryOp(np.copy, ANY_DTYPE, "Returns its input unchanged."),
}


def _make_unary_infer(name: str, spec: UnaryOp):
    def infer(arg_types, attrs) -> TensorType:
        x = checked_input(name, "x", arg_types[0], spec.dtypes)
        if spec.check is not None:
            spec.check(name, x, attrs)
        return x
    return infer


def _make_unary_reference(spec: UnaryOp):
    def reference(x, **attrs):
        work = x.astype(compute_dtype(x.dtype), copy=False)
        # Overflow to inf, log(0) and the like are the defined results, not accidents.
        with np.errstate(all="ignore"):
            result = spec.function(work, **attrs)
        return np.asarray(result).astype(x.dtype, copy=False)
    return reference


for _name, _spec in UNARY_OPS.items():
    register_op(_name, num_inputs=1, infer=_make_unary_infer(_name, _spec),
                reference=_make_unary_reference(_spec), attrs=_spec.attrs,
                category="elemwise", doc=_spec.doc)


# ================================================================= cast


def _infer_cast(arg_types, attrs) -> TensorType:
    x = checked_input("cast", "x", arg_types[0], ANY_DTYPE)
    return TensorType(x.shape, attrs["dtype"])


def _cast_reference(x, *, dtype):
    target = numpy_dtype(dtype)
    # bfloat16 and float16 widen to float32 exactly; NumPy and ml_dtypes convert from there.
    # Float to integer truncates toward zero like C (NaN, infinities and values out of the
    # target's range are undefined there, and give whatever NumPy gives here); float to
    # bool is x != 0.
    source = x.astype(compute_dtype(x.dtype), copy=False)
    with np.errstate(all="ignore"):
        return np.asarray(source.astype(target))


register_op(
    "cast", num_inputs=1, infer=_infer_cast, reference=_cast_reference,
    attrs={"dtype": AttrSpec("dtype")}, category="elemwise",
    doc="Converts to the dtype attribute: floats to integers truncate toward zero, to bool test x != 0.")


# ================================================================= binary ops


def _divide(a, b):
    if a.dtype.kind == "f":
        return a / b
    # C and ONNX truncate an integer quotient toward zero; NumPy's // floors, so step
    # back toward zero where the floored quotient is inexact and the signs differ.
    # Division by zero (undefined in C) gives 0.
    quotient = np.floor_divide(a, b)
    inexact = quotient * b != a
    quotient = quotient + (inexact & ((a < 0) != (b < 0))).astype(quotient.dtype)
    return np.where(b == 0, np.zeros_like(quotient), quotient)


def _power(a, b):
    if a.dtype.kind == "f":
        return np.power(a, b)
    # NumPy refuses negative integer exponents; C's pow cast back to an integer gives
    # 1 for a base of 1, +-1 by parity for -1 and 0 (truncated) for any other base
    # (0 ** negative is infinite in C, undefined as an integer; 0 here).
    negative = b < 0
    result = np.power(a, np.where(negative, np.zeros_like(b), b))
    inverse = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)).astype(a.dtype)
    return np.where(negative, inverse, result)


def _mod(a, b, *, fmod):
    # fmod=False: Python/NumPy semantics, the result takes the divisor's sign;
    # fmod=True: C fmod, the result takes the dividend's sign.
    # An integer modulo by zero gives 0 (NumPy's choice; undefined in C).
    return np.fmod(a, b) if fmod else np.mod(a, b)


@dataclass(frozen=True)
class BinaryOp:
    """A binary broadcast op. `function` gets both inputs in their compute dtype and the
    attributes; its result is cast to the input dtype, or to bool for predicates."""
    function: Callable
    dtypes: Dtypes
    doc: str
    bool_result: bool = False
    attrs: dict = field(default_factory=dict)


BINARY_OPS: dict[str, BinaryOp] = {
    "add": BinaryOp(np.add, NUMBERS, "Elementwise a + b (integers wrap around)."),
    "subtract": BinaryOp(np.subtract, NUMBERS, "Elementwise a - b (integers wrap around)."),
    "multiply": BinaryOp(np.multiply, NUMBERS, "Elementwise a * b (integers wrap around)."),
    "divide": BinaryOp(_divide, NUMBERS, "Elementwise a / b; integer division truncates toward zero (x / 0 == 0)."),
    "power": BinaryOp(_power, NUMBERS, "Elementwise a ** b (integer a ** negative b as C's truncated pow)."),
    "maximum": BinaryOp(np.maximum, NUMBERS, "Elementwise max(a, b) (NaN wins)."),
    "minimum": BinaryOp(np.minimum, NUMBERS, "Elementwise min(a, b) (NaN wins)."),
    "mod": BinaryOp(
        _mod, NUMBERS,
        "Elementwise remainder: sign of b like Python (fmod=False) or sign of a like C fmod (fmod=True).",
        attrs={"fmod": AttrSpec("bool", False)}),
    "equal": BinaryOp(np.equal, ANY_DTYPE, "Elementwise a == b.", bool_result=True),
    "not_equal": BinaryOp(np.not_equal, ANY_DTYPE, "Elementwise a != b.", bool_result=True),
    "less": BinaryOp(np.less, NUMBERS, "Elementwise a < b.", bool_result=True),
    "less_equal": BinaryOp(np.less_equal, NUMBERS, "Elementwise a <= b.", bool_result=True),
    "greater": BinaryOp(np.greater, NUMBERS, "Elementwise a > b.", bool_result=True),
    "greater_equal": BinaryOp(np.greater_equal, NUMBERS, "Elementwise a >= b.", bool_result=True),
    "logical_and": BinaryOp(np.logical_and, BOOLS, "Elementwise boolean and.", bool_result=True),
    "logical_or": BinaryOp(np.logical_or, BOOLS, "Elementwise boolean or.", bool_result=True),
    "logical_xor": BinaryOp(np.logical_xor, BOOLS, "Elementwise boolean exclusive or.", bool_result=True),
}


def _make_binary_infer(name: str, spec: BinaryOp):
    def infer(arg_types, attrs) -> TensorType:
        a = checked_input(name, "a", arg_types[0], ANY_DTYPE)
        b = checked_input(name, "b", arg_types[1], ANY_DTYPE)
        if a.dtype != b.dtype:
            raise TypeInferenceError(
                f"{name}: inputs a ({a.dtype}) and b ({b.dtype}) must have the same dtype")
        checked_input(name, "a", a, spec.dtypes)
        shape = checked_broadcast(name, [("a", a), ("b", b)])
        return TensorType(shape, "bool" if spec.bool_result else a.dtype)
    return infer


def _make_binary_reference(spec: BinaryOp):
    def reference(a, b, **attrs):
        work = compute_dtype(a.dtype)
        # Overflow, division by zero and NaN are defined results here, not accidents.
        with np.errstate(all="ignore"):
            result = spec.function(a.astype(work, copy=False), b.astype(work, copy=False), **attrs)
        return np.asarray(result).astype(np.bool_ if spec.bool_result else a.dtype, copy=False)
    return reference


for _name, _spec in BINARY_OPS.items():
    register_op(_name, num_inputs=2, infer=_make_binary_infer(_name, _spec),
                reference=_make_binary_reference(_spec), attrs=_spec.attrs,
                category="broadcast", doc=_spec.doc)


# ================================================================= where


def _infer_where(arg_types, attrs) -> TensorType:
    condition = checked_input("where", "condition", arg_types[0], BOOLS)
    x = checked_input("where", "x", arg_types[1], ANY_DTYPE)
    y = checked_input("where", "y", arg_types[2], ANY_DTYPE)
    if x.dtype != y.dtype:
        raise TypeInferenceError(f"where: inputs x ({x.dtype}) and y ({y.dtype}) must have the same dtype")
    shape = checked_broadcast("where", [("condition", condition), ("x", x), ("y", y)])
    return TensorType(shape, x.dtype)


def _where_reference(condition, x, y):
    work = compute_dtype(x.dtype)  # selection is exact in any dtype; this avoids NumPy on bfloat16
    result = np.where(condition, x.astype(work, copy=False), y.astype(work, copy=False))
    return np.asarray(result).astype(x.dtype, copy=False)


register_op(
    "where", num_inputs=3, infer=_infer_where, reference=_where_reference, category="broadcast",
    doc="Elementwise x where condition is true, else y (the three inputs broadcast).")
