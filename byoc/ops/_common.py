"""Helpers shared by the op definitions: shape rules and attribute checks."""
from __future__ import annotations

import numpy as np

from ..errors import TypeInferenceError
from ..ir.types import TensorType, numpy_dtype


def tensor(type_, what: str = "input") -> TensorType:
    if not isinstance(type_, TensorType):
        raise TypeInferenceError(f"{what} must be a tensor, got {type_}")
    return type_


def normalize_axis(axis: int, ndim: int, what: str = "axis") -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise TypeInferenceError(f"{what} {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim if ndim else 0


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise TypeInferenceError(
            "shapes " + ", ".join(str(tuple(s)) for s in shapes) + " do not broadcast") from None


def same_dtype(types, op_name: str) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise TypeInferenceError(
            f"{op_name} needs inputs of one dtype, got " + ", ".join(t.dtype for t in types))
    return dtypes.pop()


def as_numpy(dtype: str):
    return numpy_dtype(dtype)


# NumPy has no fast 16-bit float arithmetic, and bfloat16 would round every partial
# result; references compute these in float32 and cast the result back.
_SIXTEEN_BIT_FLOATS = (np.dtype("float16"), numpy_dtype("bfloat16"))


def _as_numpy_dtype(dtype) -> np.dtype:
    """A NumPy dtype from a byoc dtype name or anything np.dtype accepts."""
    return numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)


def compute_dtype(dtype) -> np.dtype:
    """The dtype a reference computes in: float32 for float16/bfloat16, else `dtype` itself."""
    dtype = _as_numpy_dtype(dtype)
    return np.dtype("float32") if dtype in _SIXTEEN_BIT_FLOATS else dtype


def accumulate_dtype(dtype) -> np.dtype:
    """The dtype a reference sums products in: float32 for 16-bit floats, int64 for every
    integer type (exact; casting the result back wraps like a same-width accumulator),
    else `dtype` itself."""
    dtype = _as_numpy_dtype(dtype)
    if dtype.kind in "iu":
        return np.dtype("int64")
    return compute_dtype(dtype)


# ---------------------------------------------------------------- input and axis checks
# Shared by the elementwise, reduction and normalization ops: each error names the op,
# the input (or attribute) at fault and what was expected.


def checked_tensor(op_name: str, input_name: str, type_, dtypes=None, expected: str | None = None) -> TensorType:
    """Input `input_name` of `op_name` as a TensorType, after checking that it is a tensor
    whose dtype is one of `dtypes` (any dtype when None). `expected` describes the
    allowed dtypes in the error message (default: the list of them)."""
    result = tensor(type_, f"{op_name}: input {input_name}")
    if dtypes is not None and result.dtype not in dtypes:
        raise TypeInferenceError(
            f"{op_name}: input {input_name} has dtype {result.dtype}; "
            f"expected {expected or 'one of ' + ', '.join(dtypes)}")
    return result


def checked_axis(op_name: str, axis: int, ndim: int, what: str = "axis") -> int:
    """`axis` (negative values count from the end) as an index in 0..ndim-1. Unlike
    `normalize_axis`, a rank-0 tensor has no axis at all."""
    if ndim == 0:
        raise TypeInferenceError(f"{op_name}: {what} {axis} is out of range: the input is a scalar (rank 0)")
    if not -ndim <= axis < ndim:
        raise TypeInferenceError(
            f"{op_name}: {what} {axis} is out of range for a tensor of rank {ndim} "
            f"(expected {-ndim}..{ndim - 1})")
    return axis % ndim


def checked_broadcast(op_name: str, inputs) -> tuple[int, ...]:
    """The NumPy broadcast shape of `inputs`, a list of (input name, TensorType)."""
    try:
        return tuple(np.broadcast_shapes(*(t.shape for _, t in inputs)))
    except ValueError:
        listing = ", ".join(f"{name} {t.shape}" for name, t in inputs)
        raise TypeInferenceError(f"{op_name}: input shapes do not broadcast: {listing}") from None
