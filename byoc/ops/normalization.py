"""Normalizations: softmax, log_softmax, layer_norm, batch_norm (inference form), rms_norm.

All take and give float tensors of the input's shape and dtype. The references compute
16-bit floats in float32 (as onnxruntime does) and round once at the end; softmax
subtracts the maximum first so that exp never overflows, and the variances are the
population variances of the centered values (two passes, no cancellation).
"""
from __future__ import annotations

import numpy as np

from ..errors import TypeInferenceError
from ..ir.op import AttrSpec, register_op
from ..ir.types import TensorType
from ._common import checked_axis, compute_dtype
from .elementwise import FLOATS, checked_input


# ================================================================= softmax, log_softmax


def _make_softmax_infer(name: str):
    def infer(arg_types, attrs) -> TensorType:
        x = checked_input(name, "x", arg_types[0], FLOATS)
        checked_axis(name, attrs["axis"], x.ndim)
        return x
    return infer


def _shifted(x, axis):
    """x minus its maximum along axis, in the compute dtype (an all -inf slice gives NaN,
    as in onnxruntime)."""
    work = x.astype(compute_dtype(x.dtype), copy=False)
    if work.size == 0:
        return work
    return work - np.max(work, axis=axis, keepdims=True)


def _softmax_reference(x, *, axis):
    with np.errstate(all="ignore"):
        exponentials = np.exp(_shifted(x, axis))
        result = exponentials / np.sum(exponentials, axis=axis, keepdims=True)
    return np.asarray(result).astype(x.dtype, copy=False)


def _log_softmax_reference(x, *, axis):
    with np.errstate(all="ignore"):
        shifted = _shifted(x, axis)
        result = shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return np.asarray(result).astype(x.dtype, copy=False)


register_op(
    "softmax", num_inputs=1, infer=_make_softmax_infer("softmax"), reference=_softmax_reference,
    attrs={"axis": AttrSpec("int", -1)}, category="opaque",
    doc="exp(x) / sum(exp(x)) along axis.")
register_op(
    "log_softmax", num_inputs=1, infer=_make_softmax_infer("log_softmax"), reference=_log_softmax_reference,
    attrs={"axis": AttrSpec("int", -1)}, category="opaque",
    doc="log(softmax(x)) along axis, computed as x - max - log(sum(exp(x - max))).")


# ================================================================= layer_norm, rms_norm


def _check_affine_param(op_name: str, input_name: str, param: TensorType, x: TensorType, axis: int):
    """A per-element parameter of layer_norm/rms_norm: x's dtype, and a shape that
    broadcasts to the normalized dims x.shape[axis:]."""
    if param.dtype != x.dtype:
        raise TypeInferenceError(
            f"{op_name}: input {input_name} has dtype {param.dtype}; expected {x.dtype}, the dtype of x")
    normalized = x.shape[axis:]
    fits = param.ndim <= len(normalized)
    if fits:
        try:
            fits = tuple(np.broadcast_shapes(param.shape, normalized)) == normalized
        except ValueError:
            fits = False
    if not fits:
        raise TypeInferenceError(
            f"{op_name}: input {input_name} of shape {param.shape} does not broadcast to the "
            f"normalized dims {normalized} (x.shape[{axis}:] of x {x.shape})")


def _infer_layer_norm(arg_types, attrs) -> TensorType:
    x = checked_input("layer_norm", "x", arg_types[0], FLOATS)
    axis = checked_axis("layer_norm", attrs["axis"], x.ndim)
    for name, type_ in zip(("gamma", "beta"), arg_types[1:]):
        _check_affine_param("layer_norm", name, checked_input("layer_norm", name, type_, FLOATS), x, axis)
    return x


def _infer_rms_norm(arg_types, attrs) -> TensorType:
    x = checked_input("rms_norm", "x", arg_types[0], FLOATS)
    axis = checked_axis("rms_norm", attrs["axis"], x.ndim)
    _check_affine_param("rms_norm", "gamma", checked_input("rms_norm", "gamma", arg_types[1], FLOATS), x, axis)
    return x


def _trailing_axes(x, axis) -> tuple[int, ...]:
    return tuple(range(axis % x.ndim, x.ndim))


def _layer_norm_reference(x, gamma, beta, *, axis, epsilon):
    work = compute_dtype(x.dtype)
    values, gamma, beta = (a.astype(work, copy=False) for a in (x, gamma, beta))
    axes = _trailing_axes(values, axis)
    with np.errstate(all="ignore"):
        centered = values - np.mean(values, axis=axes, keepdims=True)
        variance = np.mean(centered * centered, axis=axes, keepdims=True)
        # gamma and beta broadcast to x.shape[axis:], the trailing dims: NumPy aligns them there.
        result = centered / np.sqrt(variance + epsilon) * gamma + beta
    return np.asarray(result).astype(x.dtype, copy=False)


def _rms_norm_reference(x, gamma, *, axis, epsilon):
    work = compute_dtype(x.dtype)
    values, gamma = (a.astype(work, copy=False) for a in (x, gamma))
    axes = _trailing_axes(values, axis)
    with np.errstate(all="ignore"):
        mean_square = np.mean(values * values, axis=axes, keepdims=True)
        result = values / np.sqrt(mean_square + epsilon) * gamma
    return np.asarray(result).astype(x.dtype, copy=False)


register_op(
    "layer_norm", num_inputs=3, infer=_infer_layer_norm, reference=_layer_norm_reference,
    attrs={"axis": AttrSpec("int", -1), "epsilon": AttrSpec("float", 1e-5)}, category="opaque",
    doc="(x - mean) / sqrt(var + epsilon) * gamma + beta, over dims axis..ndim-1.")
register_op(
    "rms_norm", num_inputs=2, infer=_infer_rms_norm, reference=_rms_norm_reference,
    attrs={"axis": AttrSpec("int", -1), "epsilon": AttrSpec("float", 1e-6)}, category="opaque",
    doc="x / sqrt(mean(x**2) + epsilon) * gamma, over dims axis..ndim-1.")


# ================================================================= batch_norm

BATCH_NORM_PARAMS = ("scale", "bias", "mean", "var")


def _infer_batch_norm(arg_types, attrs) -> TensorType:
    x = checked_input("batch_norm", "x", arg_types[0], FLOATS)
    axis = checked_axis("batch_norm", attrs["axis"], x.ndim)
    channels = x.shape[axis]
    for name, type_ in zip(BATCH_NORM_PARAMS, arg_types[1:]):
        param = checked_input("batch_norm", name, type_, FLOATS)
        if param.dtype != x.dtype:
            raise TypeInferenceError(
                f"batch_norm: input {name} has dtype {param.dtype}; expected {x.dtype}, the dtype of x")
        if param.shape != (channels,):
            raise TypeInferenceError(
                f"batch_norm: input {name} has shape {param.shape}; expected ({channels},), "
                f"the size of axis {attrs['axis']} of x {x.shape}")
    return x


def _batch_norm_reference(x, scale, bias, mean, var, *, epsilon, axis):
    work = compute_dtype(x.dtype)
    axis = axis % x.ndim
    # The 1-D parameters apply along `axis`: give them x's rank with size-1 trailing dims.
    along_axis = (-1,) + (1,) * (x.ndim - axis - 1)
    scale, bias, mean, var = (p.astype(work, copy=False).reshape(along_axis) for p in (scale, bias, mean, var))
    with np.errstate(all="ignore"):
        result = (x.astype(work, copy=False) - mean) / np.sqrt(var + epsilon) * scale + bias
    return np.asarray(result).astype(x.dtype, copy=False)


register_op(
    "batch_norm", num_inputs=5, infer=_infer_batch_norm, reference=_batch_norm_reference,
    attrs={"epsilon": AttrSpec("float", 1e-5), "axis": AttrSpec("int", 1)}, category="opaque",
    doc="Inference batch norm: (x - mean) / sqrt(var + epsilon) * scale + bias, parameters along axis.")
