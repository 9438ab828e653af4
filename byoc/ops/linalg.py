"""Linear algebra ops: matmul."""
from __future__ import annotations

import numpy as np

from ..errors import TypeInferenceError
from ..ir.op import register_op
from ..ir.types import FLOAT_DTYPES, INT_DTYPES, TensorType
from ._common import accumulate_dtype, broadcast_shapes, same_dtype, tensor

MATMUL_DTYPES = FLOAT_DTYPES + INT_DTYPES


def _infer_matmul(arg_types, attrs) -> TensorType:
    """numpy.matmul's shape rule: a 1-D operand is promoted to a matrix (a row for `a`,
    a column for `b`) and the added dimension is dropped from the result; the dims in
    front of the last two broadcast."""
    a = tensor(arg_types[0], "matmul: input a")
    b = tensor(arg_types[1], "matmul: input b")
    dtype = same_dtype([a, b], "matmul")
    if dtype not in MATMUL_DTYPES:
        raise TypeInferenceError(
            f"matmul: dtype {dtype} is not supported; expected one of {', '.join(MATMUL_DTYPES)}")
    for name, operand in (("a", a), ("b", b)):
        if operand.ndim == 0:
            raise TypeInferenceError(f"matmul: input {name} must have rank >= 1, got a scalar {operand}")

    a_matrix = (1,) + a.shape if a.ndim == 1 else a.shape
    b_matrix = b.shape + (1,) if b.ndim == 1 else b.shape
    if a_matrix[-1] != b_matrix[-2]:
        raise TypeInferenceError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape}")
    try:
        batch = broadcast_shapes(a_matrix[:-2], b_matrix[:-2])
    except TypeInferenceError:
        raise TypeInferenceError(
            f"matmul: batch dimensions {a_matrix[:-2]} and {b_matrix[:-2]} do not broadcast: "
            f"{a.shape} @ {b.shape}") from None

    rows = () if a.ndim == 1 else (a_matrix[-2],)
    columns = () if b.ndim == 1 else (b_matrix[-1],)
    return TensorType(batch + rows + columns, dtype)


def _matmul_reference(a, b):
    # 16-bit floats are multiplied in float32 and integers in int64 (exact; the cast back
    # wraps around like an accumulator of the input's width would).
    result_dtype = a.dtype
    work_dtype = accumulate_dtype(result_dtype)
    product = np.matmul(a.astype(work_dtype, copy=False), b.astype(work_dtype, copy=False))
    # Two vectors give a NumPy scalar; the interpreter works with arrays.
    return np.asarray(product).astype(result_dtype)


register_op(
    "matmul", num_inputs=2, infer=_infer_matmul, reference=_matmul_reference,
    category="opaque",
    doc="Matrix product with numpy.matmul semantics (1-D promotion, broadcast batch dims).")

