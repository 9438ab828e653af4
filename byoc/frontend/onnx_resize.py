"""ONNX Resize, evaluated at import time: exporters write it where a model interpolates a
constant (BEiT's relative position bias table resized to the image's window, position
embeddings resized to the input) with sizes that come from shapes; byoc computes the result
as a constant. A Resize of a tensor computed at run time (an upsampling layer) is refused,
naming the node: byoc has no resize kernel yet.

`resize(x, ...)` is the NumPy implementation: per resized axis a [out, in] matrix of
interpolation weights (nearest: one-hot; linear: two taps; cubic: four), applied one axis
after another (ONNX's N-D modes are separable), in float64.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelError
from ..ir.expr import Constant
from .onnx import check_folded_size, converter

_MODES = ("nearest", "linear", "cubic")
_TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _text(value, default):
    value = default if value is None else value
    return value.decode() if isinstance(value, bytes) else value


def source_coordinates(out_size: int, in_size: int, scale: float, transform: str) -> np.ndarray:
    """Where each output position lies in the input (ONNX's coordinate_transformation_mode)."""
    x = np.arange(out_size, dtype=np.float64)
    if transform == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if transform == "half_pixel_symmetric":
        adjustment = out_size / (scale * in_size)
        center = in_size / 2
        return center * (1 - adjustment) + (x + 0.5) / scale - 0.5
    if transform == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_size > 1 else np.zeros_like(x)
    if transform == "align_corners":
        # the resized length as a real number (in_size * scale), not the rounded output size
        resized = in_size * scale
        return x * (in_size - 1) / (resized - 1) if out_size > 1 else np.zeros_like(x)
    return x / scale  # asymmetric


def axis_weights(out_size: int, in_size: int, scale: float, mode: str, transform: str, nearest_mode: str,
                 cubic_a: float, exclude_outside: bool) -> np.ndarray:
    """The [out_size, in_size] matrix that resizes one axis."""
    x = source_coordinates(out_size, in_size, scale, transform)
    weights = np.zeros((out_size, in_size), np.float64)
    rows = np.arange(out_size)
    if mode == "nearest":
        index = {"round_prefer_floor": np.ceil(x - 0.5), "round_prefer_ceil": np.floor(x + 0.5),
                 "floor": np.floor(x), "ceil": np.ceil(x)}[nearest_mode]
        weights[rows, np.clip(index, 0, in_size - 1).astype(np.int64)] = 1.0
        return weights
    if mode == "linear":
        x = np.clip(x, 0, in_size - 1)
        low = np.floor(x).astype(np.int64)
        high = np.minimum(low + 1, in_size - 1)
        fraction = x - low
        np.add.at(weights, (rows, low), 1 - fraction)
        np.add.at(weights, (rows, high), fraction)
        return weights
    base = np.floor(x).astype(np.int64)
    t = x - base
    for offset, distance in ((-1, 1 + t), (0, t), (1, 1 - t), (2, 2 - t)):
        d = np.abs(distance)
        coefficient = np.where(d <= 1, ((cubic_a + 2) * d - (cubic_a + 3)) * d * d + 1,
                               ((cubic_a * d - 5 * cubic_a) * d + 8 * cubic_a) * d - 4 * cubic_a)
        tap = base + offset
        inside = (tap >= 0) & (tap < in_size)
        if exclude_outside:
            coefficient = np.where(inside, coefficient, 0.0)
        np.add.at(weights, (rows, np.clip(tap, 0, in_size - 1)), coefficient)
    if exclude_outside:
        weights /= weights.sum(axis=1, keepdims=True)
    return weights


def resize(x: np.ndarray, out_shape: tuple, scales: tuple, *, mode: str, transform: str, nearest_mode: str,
           cubic_a: float, exclude_outside: bool) -> np.ndarray:
    result = x.astype(np.float64)
    for axis, (out_size, in_size, scale) in enumerate(zip(out_shape, x.shape, scales)):
        if out_size == in_size and scale == 1.0:
            continue
        weights = axis_weights(out_size, in_size, scale, mode, transform, nearest_mode, cubic_a, exclude_outside)
        result = np.moveaxis(np.tensordot(weights, result, axes=(1, axis)), 0, axis)
    if x.dtype.kind in "iu":
        result = np.rint(result)
    return result.astype(x.dtype)


@converter("Resize")
def _resize(ctx, node, inputs, attrs):
    x = inputs[0]
    mode = _text(attrs.get("mode"), "nearest")
    transform = _text(attrs.get("coordinate_transformation_mode"), "half_pixel")
    nearest_mode = _text(attrs.get("nearest_mode"), "round_prefer_floor")
    policy = _text(attrs.get("keep_aspect_ratio_policy"), "stretch")
    if mode not in _MODES or nearest_mode not in _NEAREST or policy not in ("stretch", "not_larger", "not_smaller"):
        raise ModelError(f"{ctx.node_label}: mode={mode!r}, nearest_mode={nearest_mode!r}, "
                         f"keep_aspect_ratio_policy={policy!r}; expected a mode of {_MODES}, a nearest_mode of "
                         f"{_NEAREST} and a policy of stretch, not_larger or not_smaller")
    if transform not in _TRANSFORMS:
        ctx.unsupported(f"coordinate_transformation_mode={transform!r} (byoc takes {', '.join(_TRANSFORMS)})")
    for flag in ("exclude_outside", "antialias"):
        if attrs.get(flag, 0) not in (0, 1):
            raise ModelError(f"{ctx.node_label}: {flag}={attrs[flag]}; expected 0 or 1")
    roi = inputs[1] if len(inputs) > 1 else None
    if roi is not None and len(ctx.shape(roi)) != 1:
        raise ModelError(f"{ctx.node_label}: input 'roi' of shape {list(ctx.shape(roi))}; expected a 1-D tensor")
    if attrs.get("antialias", 0):
        ctx.unsupported("antialias=1 (byoc resizes without an antialiasing filter)")
    if not isinstance(x, (np.ndarray, Constant)):
        ctx.unsupported("input 'X' is computed at run time; byoc resizes constants only, at import time "
                        "(it has no resize kernel)")
    data = np.asarray(ctx.known(x, "X"))
    if mode != "nearest" and data.dtype.kind != "f":
        raise ModelError(f"{ctx.node_label}: mode={mode!r} of a {data.dtype} tensor; expected a float tensor")
    rank = data.ndim
    axes = [a % rank if -rank <= a < rank else None for a in attrs.get("axes", range(rank))]
    if None in axes or len(set(axes)) != len(axes):
        raise ModelError(f"{ctx.node_label}: axes={list(attrs.get('axes'))} for a rank-{rank} input; expected "
                         f"distinct axes in [-{rank}, {rank})")
    scales_in = inputs[2] if len(inputs) > 2 else None
    sizes_in = inputs[3] if len(inputs) > 3 else None
    scales_given = scales_in is not None and ctx.shape(scales_in) != (0,)
    sizes_given = sizes_in is not None and ctx.shape(sizes_in) != (0,)
    if scales_given == sizes_given:
        raise ModelError(f"{ctx.node_label}: expected exactly one of its inputs 'scales' and 'sizes'")
    out_shape, scales = list(data.shape), [1.0] * rank
    if scales_given:
        given = np.asarray(ctx.known(scales_in, "scales"), dtype=np.float64).reshape(-1)
        if len(given) != len(axes) or not np.all(np.isfinite(given)) or np.any(given <= 0):
            raise ModelError(f"{ctx.node_label}: scales {given.tolist()}; expected {len(axes)} positive numbers")
        for axis, scale in zip(axes, given):
            scales[axis] = float(scale)
            out_shape[axis] = int(math.floor(data.shape[axis] * scale))
    else:
        given = ctx.known_ints(sizes_in, "sizes")
        if len(given) != len(axes) or any(size < 0 for size in given):
            raise ModelError(f"{ctx.node_label}: sizes {list(given)}; expected {len(axes)} non-negative sizes")
        ratios = [size / data.shape[axis] if data.shape[axis] else 1.0 for axis, size in zip(axes, given)]
        if policy != "stretch":
            common = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [common] * len(axes)
            given = [int(math.floor(data.shape[axis] * common + 0.5)) for axis in axes]
        for axis, size, ratio in zip(axes, given, ratios):
            out_shape[axis], scales[axis] = int(size), float(ratio)
    check_folded_size(math.prod(out_shape), data.dtype.itemsize, f"of shape {out_shape}")
    if any(dim == 0 for dim in data.shape) and math.prod(out_shape):
        raise ModelError(f"{ctx.node_label}: resizing an empty input of shape {list(data.shape)} to "
                         f"{out_shape}; expected a non-empty input")
    return [resize(data, tuple(out_shape), tuple(scales), mode=mode, transform=transform,
                   nearest_mode=nearest_mode, cubic_a=float(attrs.get("cubic_coeff_a", -0.75)),
                   exclude_outside=bool(attrs.get("exclude_outside", 0)))]
