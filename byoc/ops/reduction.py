"""Reductions: sum, mean, prod, max and min over a set of axes, and argmax/argmin along one.

`axes` lists the reduced axes (negative values count from the end); the empty default
reduces every axis. The result keeps the input's dtype (argmax/argmin give int64 indices)
and, with keepdims, each reduced axis as a dimension of size 1.

The references accumulate 16-bit floats in float32 and integers in int64 (exact; the
cast back wraps around like an accumulator of the input's width). Reductions over an
empty set follow ONNX: sum 0, prod 1, max -inf (or the dtype's minimum), min +inf (or
its maximum); the mean of nothing is NaN for floats and 0 for integers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import TypeInferenceError
from ..ir.op import AttrSpec, register_op
from ..ir.types import TensorType
from ._common import accumulate_dtype, checked_axis, compute_dtype
from .elementwise import NUMBERS, checked_input


def reduced_axes(op_name: str, axes, ndim: int) -> tuple[int, ...]:
    """The axes an `axes` attribute reduces, normalized and sorted (all of them for ())."""
    if not axes:
        return tuple(range(ndim))
    normalized = [checked_axis(op_name, axis, ndim, "axis") for axis in axes]
    if len(set(normalized)) != len(normalized):
        raise TypeInferenceError(
            f"{op_name}: axes {tuple(axes)} name the same axis more than once (rank {ndim})")
    return tuple(sorted(normalized))


def reduced_shape(shape, axes, keepdims: bool) -> tuple[int, ...]:
    """`shape` with `axes` removed, or set to 1 with keepdims."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduced_count(shape, axes) -> int:
    return int(np.prod([shape[i] for i in axes], dtype=np.int64))


# ================================================================= sum, mean, prod, max, min


def _sum(x, axes, keepdims):
    return np.sum(x.astype(accumulate_dtype(x.dtype), copy=False), axis=axes, keepdims=keepdims)


def _prod(x, axes, keepdims):
    return np.prod(x.astype(accumulate_dtype(x.dtype), copy=False), axis=axes, keepdims=keepdims)


def _mean(x, axes, keepdims):
    count = _reduced_count(x.shape, axes)
    total = _sum(x, axes, keepdims)
    if total.dtype.kind == "f":
        return total / count  # NaN for an empty set
    if count == 0:
        return np.zeros_like(total)
    # An integer mean truncates toward zero, like ONNX ReduceMean's integer division.
    quotient = total // count
    return quotient + ((quotient * count != total) & (total < 0)).astype(quotient.dtype)


def _extreme(function: Callable, identity_sign: int):
    """max or min; over an empty set, -inf/+inf (floats) or the dtype's min/max (integers)."""
    def reduce(x, axes, keepdims):
        x = x.astype(compute_dtype(x.dtype), copy=False)
        if _reduced_count(x.shape, axes):
            return function(x, axis=axes, keepdims=keepdims)
        if x.dtype.kind == "f":
            identity = identity_sign * np.inf
        else:
            info = np.iinfo(x.dtype)
            identity = info.max if identity_sign > 0 else info.min
        return function(x, axis=axes, keepdims=keepdims, initial=identity)
    return reduce


@dataclass(frozen=True)
class ReduceOp:
    """`function(x, axes, keepdims)` reduces x over a tuple of normalized axes."""
    function: Callable
    doc: str


REDUCE_OPS: dict[str, ReduceOp] = {
    "sum": ReduceOp(_sum, "Sum over axes (all axes when axes is empty)."),
    "mean": ReduceOp(_mean, "Arithmetic mean over axes (all when empty); integer means truncate toward zero."),
    "prod": ReduceOp(_prod, "Product over axes (all axes when axes is empty)."),
    "max": ReduceOp(_extreme(np.max, -1), "Maximum over axes (all axes when axes is empty)."),
    "min": ReduceOp(_extreme(np.min, +1), "Minimum over axes (all axes when axes is empty)."),
}

REDUCE_ATTRS = {"axes": AttrSpec("ints", ()), "keepdims": AttrSpec("bool", False)}


def _make_reduce_infer(name: str):
    def infer(arg_types, attrs) -> TensorType:
        x = checked_input(name, "x", arg_types[0], NUMBERS)
        axes = reduced_axes(name, attrs["axes"], x.ndim)
        return TensorType(reduced_shape(x.shape, axes, attrs["keepdims"]), x.dtype)
    return infer


def _make_reduce_reference(name: str, spec: ReduceOp):
    def reference(x, *, axes, keepdims):
        axes = reduced_axes(name, axes, x.ndim)
        with np.errstate(all="ignore"):  # integer overflow wraps; the mean of nothing is NaN
            result = spec.function(x, axes, keepdims)
        return np.asarray(result).astype(x.dtype, copy=False)
    return reference


for _name, _spec in REDUCE_OPS.items():
    register_op(_name, num_inputs=1, infer=_make_reduce_infer(_name),
                reference=_make_reduce_reference(_name, _spec), attrs=REDUCE_ATTRS,
                category="reduce", doc=_spec.doc)


# ================================================================= argmax, argmin

ARG_ATTRS = {
    "axis": AttrSpec("int", 0),
    "keepdims": AttrSpec("bool", False),
    "select_last_index": AttrSpec("bool", False),
}


def _make_arg_infer(name: str):
    def infer(arg_types, attrs) -> TensorType:
        x = checked_input(name, "x", arg_types[0], NUMBERS)
        axis = checked_axis(name, attrs["axis"], x.ndim)
        if x.shape[axis] == 0:
            raise TypeInferenceError(
                f"{name}: axis {attrs['axis']} of input x {x.shape} is empty; there is no index to return")
        return TensorType(reduced_shape(x.shape, (axis,), attrs["keepdims"]), "int64")
    return infer


def _make_arg_reference(function: Callable):
    def reference(x, *, axis, keepdims, select_last_index):
        x = x.astype(compute_dtype(x.dtype), copy=False)
        axis = axis % x.ndim
        if select_last_index:
            # The first extreme of the reversed axis is the last one of the original.
            index = x.shape[axis] - 1 - function(np.flip(x, axis), axis=axis)
        else:
            index = function(x, axis=axis)
        if keepdims:
            index = np.expand_dims(index, axis)
        return np.asarray(index, dtype=np.int64)
    return reference


register_op("argmax", num_inputs=1, infer=_make_arg_infer("argmax"),
            reference=_make_arg_reference(np.argmax), attrs=ARG_ATTRS, category="reduce",
            doc="Index (int64) of the largest element along axis; the first one, or the last with select_last_index.")
register_op("argmin", num_inputs=1, infer=_make_arg_infer("argmin"),
            reference=_make_arg_reference(np.argmin), attrs=ARG_ATTRS, category="reduce",
            doc="Index (int64) of the smallest element along axis; the first one, or the last with select_last_index.")
