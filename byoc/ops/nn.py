"""Neural-network ops over 2-D images: conv2d and the pools.

Attributes follow ONNX: `pads` is (top, left, bottom, right), output sizes use ONNX's
formulas (ceil_mode included). Data is NCHW or NHWC; a conv's weight is OIHW for NCHW
data and OHWI for NHWC data.

The references transpose everything to NCHW/OIHW and work on a strided view of the
padded input holding every sliding window (no copy until the im2col matrix of conv2d),
so ResNet-sized convolutions run through BLAS in milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import TypeInferenceError
from ..ir.op import AttrSpec, register_op
from ..ir.types import FLOAT_DTYPES, INT_DTYPES, TensorType
from ._common import accumulate_dtype, compute_dtype, same_dtype, tensor


@dataclass(frozen=True)
class DataLayout:
    """Where a 4-D image layout keeps its channels and its (height, width) dims."""
    channel_axis: int
    spatial_axes: tuple[int, int]
    to_nchw: tuple[int, ...]    # transpose that turns this layout into NCHW
    from_nchw: tuple[int, ...]  # and back
    kernel_layout: str          # the conv2d weight layout that goes with it


@dataclass(frozen=True)
class KernelLayout:
    """Where a conv2d weight layout keeps its input channels and (height, width) dims;
    output channels are always axis 0."""
    in_channel_axis: int
    spatial_axes: tuple[int, int]
    to_oihw: tuple[int, ...]


DATA_LAYOUTS = {
    "NCHW": DataLayout(1, (2, 3), (0, 1, 2, 3), (0, 1, 2, 3), "OIHW"),
    "NHWC": DataLayout(3, (1, 2), (0, 3, 1, 2), (0, 2, 3, 1), "OHWI"),
}
KERNEL_LAYOUTS = {
    "OIHW": KernelLayout(1, (2, 3), (0, 1, 2, 3)),
    "OHWI": KernelLayout(3, (1, 2), (0, 3, 1, 2)),
}

CONV_DTYPES = FLOAT_DTYPES + INT_DTYPES
MAX_POOL_DTYPES = FLOAT_DTYPES + INT_DTYPES
AVG_POOL_DTYPES = FLOAT_DTYPES  # an integer mean would need a rounding rule


# ---------------------------------------------------------------- attribute checks


def _data_layout(op_name: str, layout: str, attr_name: str = "layout") -> DataLayout:
    if layout not in DATA_LAYOUTS:
        raise TypeInferenceError(
            f"{op_name}: {attr_name} {layout!r} is not supported; expected one of {', '.join(DATA_LAYOUTS)}")
    return DATA_LAYOUTS[layout]


def _check_ints(op_name: str, attr_name: str, values, count: int, minimum: int):
    """Checks that an attribute holds `count` integers, each at least `minimum`."""
    if len(values) != count or any(v < minimum for v in values):
        adjective = "positive" if minimum == 1 else "non-negative"
        raise TypeInferenceError(
            f"{op_name}: {attr_name} must be {count} {adjective} integers, got {values}")


def _image(op_name: str, type_, input_name: str, dtypes) -> TensorType:
    """Checks that an input is a 4-D tensor of one of `dtypes`."""
    image = tensor(type_, f"{op_name}: input {input_name}")
    if image.ndim != 4:
        raise TypeInferenceError(f"{op_name}: input {input_name} must be 4-D, got {image}")
    if image.dtype not in dtypes:
        raise TypeInferenceError(
            f"{op_name}: input {input_name} has dtype {image.dtype}; expected one of {', '.join(dtypes)}")
    return image


def _window_output_size(op_name: str, dim_name: str, size: int, kernel: int, stride: int,
                        pad_begin: int, pad_end: int, dilation: int, ceil_mode: bool) -> int:
    """How many windows fit along one spatial dim (ONNX's formula for conv and pools)."""
    effective_kernel = dilation * (kernel - 1) + 1
    span = size + pad_begin + pad_end - effective_kernel
    if span < 0:
        raise TypeInferenceError(
            f"{op_name}: the kernel {dim_name} {kernel} (dilated to {effective_kernel}) does not fit "
            f"the padded input {dim_name} {size} + {pad_begin} + {pad_end}")
    if not ceil_mode:
        return span // stride + 1
    count = -(-span // stride) + 1
    # As in ONNX and PyTorch: a last window that would start inside the right padding is dropped.
    if (count - 1) * stride >= size + pad_begin:
        count -= 1
    return count


def _output_spatial(op_name: str, spatial, kernel, strides, pads, dilations, ceil_mode) -> tuple[int, int]:
    return tuple(
        _window_output_size(op_name, dim_name, spatial[i], kernel[i], strides[i],
                            pads[i], pads[i + 2], dilations[i], ceil_mode)
        for i, dim_name in enumerate(("height", "width")))


def _with_spatial(shape, layout: DataLayout, channels: int, spatial) -> tuple[int, ...]:
    """`shape` with its channel count and (height, width) replaced, in `layout`."""
    result = list(shape)
    result[layout.channel_axis] = channels
    for axis, size in zip(layout.spatial_axes, spatial):
        result[axis] = size
    return tuple(result)


# ---------------------------------------------------------------- reference helpers


def _pad_spatial(data, pads_before, pads_after, fill):
    """Pads the last two dims of an NCHW array with `fill`."""
    width = ((0, 0), (0, 0), (pads_before[0], pads_after[0]), (pads_before[1], pads_after[1]))
    return np.pad(data, width, mode="constant", constant_values=fill)


def _sliding_windows(padded, kernel, strides, dilations, output_size):
    """A (N, C, OH, OW, KH, KW) view of every window of a padded NCHW array."""
    effective = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilations))
    windows = sliding_window_view(padded, effective, axis=(2, 3))
    return windows[:, :,
                   : (output_size[0] - 1) * strides[0] + 1: strides[0],
                   : (output_size[1] - 1) * strides[1] + 1: strides[1],
                   :: dilations[0], :: dilations[1]]


def _ceil_overhang(spatial, kernel, strides, pads, dilations, output_size):
    """How far the last window reaches past the explicit right/bottom padding (ceil_mode)."""
    return tuple(
        max(0, (output_size[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1
            - (spatial[i] + pads[i] + pads[i + 2]))
        for i in range(2))


# ---------------------------------------------------------------- conv2d


def _infer_conv2d(arg_types, attrs) -> TensorType:
    data = _image("conv2d", arg_types[0], "data", CONV_DTYPES)
    weight = _image("conv2d", arg_types[1], "weight", CONV_DTYPES)
    dtype = same_dtype([data, weight], "conv2d")
    layout = _data_layout("conv2d", attrs["data_layout"], "data_layout")
    if attrs["kernel_layout"] != layout.kernel_layout:
        raise TypeInferenceError(
            f"conv2d: kernel_layout {attrs['kernel_layout']!r} does not go with data_layout "
            f"{attrs['data_layout']!r}; expected {layout.kernel_layout!r}")
    kernel_layout = KERNEL_LAYOUTS[layout.kernel_layout]
    _check_ints("conv2d", "strides", attrs["strides"], 2, 1)
    _check_ints("conv2d", "pads", attrs["pads"], 4, 0)
    _check_ints("conv2d", "dilations", attrs["dilations"], 2, 1)
    groups = attrs["groups"]
    if groups < 1:
        raise TypeInferenceError(f"conv2d: groups must be positive, got {groups}")

    channels = data.shape[layout.channel_axis]
    out_channels = weight.shape[0]
    weight_in_channels = weight.shape[kernel_layout.in_channel_axis]
    if channels % groups:
        raise TypeInferenceError(
            f"conv2d: data {data.shape} has {channels} channels, which groups={groups} does not divide")
    if channels // groups != weight_in_channels:
        raise TypeInferenceError(
            f"conv2d: weight {weight.shape} ({attrs['kernel_layout']}) expects {weight_in_channels} "
            f"input channels per group, but data {data.shape} has {channels} channels in "
            f"{groups} group(s), {channels // groups} per group")
    if out_channels % groups:
        raise TypeInferenceError(
            f"conv2d: weight {weight.shape} has {out_channels} output channels, "
            f"which groups={groups} does not divide")

    spatial = [data.shape[axis] for axis in layout.spatial_axes]
    kernel = [weight.shape[axis] for axis in kernel_layout.spatial_axes]
    if 0 in kernel:
        raise TypeInferenceError(
            f"conv2d: weight {weight.shape} ({attrs['kernel_layout']}) has an empty kernel {tuple(kernel)}; "
            f"expected a height and width of at least 1")
    output_spatial = _output_spatial("conv2d", spatial, kernel, attrs["strides"], attrs["pads"],
                                     attrs["dilations"], ceil_mode=False)
    return TensorType(_with_spatial(data.shape, layout, out_channels, output_spatial), dtype)


def _conv2d_reference(data, weight, *, strides, pads, dilations, groups, data_layout, kernel_layout):
    result_dtype = data.dtype
    work_dtype = accumulate_dtype(result_dtype)
    layout = DATA_LAYOUTS[data_layout]
    data = data.transpose(layout.to_nchw).astype(work_dtype, copy=False)
    weight = weight.transpose(KERNEL_LAYOUTS[kernel_layout].to_oihw).astype(work_dtype, copy=False)

    batch, channels = data.shape[:2]
    out_channels, group_channels, kernel_height, kernel_width = weight.shape
    out_per_group = out_channels // groups
    padded = _pad_spatial(data, pads[:2], pads[2:], 0)
    output_size = _output_spatial("conv2d", data.shape[2:], weight.shape[2:], strides, pads,
                                  dilations, ceil_mode=False)
    windows = _sliding_windows(padded, weight.shape[2:], strides, dilations, output_size)

    # im2col per group: (groups, N*OH*OW, C/groups*KH*KW) @ (groups, C/groups*KH*KW, O/groups)
    windows = windows.reshape(batch, groups, group_channels, *output_size, kernel_height, kernel_width)
    columns = windows.transpose(1, 0, 3, 4, 2, 5, 6).reshape(
        groups, batch * output_size[0] * output_size[1], group_channels * kernel_height * kernel_width)
    filters = weight.reshape(groups, out_per_group, -1).transpose(0, 2, 1)
    products = np.matmul(columns, filters)  # (groups, N*OH*OW, O/groups)

    result = products.reshape(groups, batch, *output_size, out_per_group)
    result = result.transpose(1, 0, 4, 2, 3).reshape(batch, out_channels, *output_size)
    return np.ascontiguousarray(result.transpose(layout.from_nchw)).astype(result_dtype)


register_op(
    "conv2d", num_inputs=2, infer=_infer_conv2d, reference=_conv2d_reference,
    attrs={
        "strides": AttrSpec("ints", (1, 1)),
        "pads": AttrSpec("ints", (0, 0, 0, 0)),
        "dilations": AttrSpec("ints", (1, 1)),
        "groups": AttrSpec("int", 1),
        "data_layout": AttrSpec("str", "NCHW"),
        "kernel_layout": AttrSpec("str", "OIHW"),
    },
    category="opaque",
    doc="2-D convolution (cross-correlation) with strides, pads, dilations and groups.")


# ---------------------------------------------------------------- windowed pools


def _infer_pool(op_name: str, dtypes, arg_types, attrs) -> TensorType:
    data = _image(op_name, arg_types[0], "data", dtypes)
    layout = _data_layout(op_name, attrs["layout"])
    _check_ints(op_name, "kernel", attrs["kernel"], 2, 1)
    _check_ints(op_name, "strides", attrs["strides"], 2, 1)
    _check_ints(op_name, "pads", attrs["pads"], 4, 0)
    _check_ints(op_name, "dilations", attrs["dilations"], 2, 1)
    spatial = [data.shape[axis] for axis in layout.spatial_axes]
    output_spatial = _output_spatial(op_name, spatial, attrs["kernel"], attrs["strides"], attrs["pads"],
                                     attrs["dilations"], attrs["ceil_mode"])
    channels = data.shape[layout.channel_axis]
    return TensorType(_with_spatial(data.shape, layout, channels, output_spatial), data.dtype)


def _infer_max_pool2d(arg_types, attrs) -> TensorType:
    return _infer_pool("max_pool2d", MAX_POOL_DTYPES, arg_types, attrs)


def _infer_avg_pool2d(arg_types, attrs) -> TensorType:
    return _infer_pool("avg_pool2d", AVG_POOL_DTYPES, arg_types, attrs)


def _pool_windows(op_name, data, kernel, strides, pads, dilations, ceil_mode, fill):
    """The (N, C, OH, OW, KH, KW) windows of an NCHW array padded with `fill`, including
    the overhang that ceil_mode's last window needs."""
    output_size = _output_spatial(op_name, data.shape[2:], kernel, strides, pads, dilations, ceil_mode)
    overhang = _ceil_overhang(data.shape[2:], kernel, strides, pads, dilations, output_size)
    padded = _pad_spatial(data, pads[:2], (pads[2] + overhang[0], pads[3] + overhang[1]), fill)
    return _sliding_windows(padded, kernel, strides, dilations, output_size), output_size, overhang


def _max_pool2d_reference(data, *, kernel, strides, pads, dilations, ceil_mode, layout):
    result_dtype = data.dtype
    data_layout = DATA_LAYOUTS[layout]
    data = data.transpose(data_layout.to_nchw).astype(compute_dtype(result_dtype), copy=False)
    # Padding never wins a max: -inf for floats, the smallest value for integers.
    fill = -np.inf if data.dtype.kind == "f" else np.iinfo(data.dtype).min
    windows, _, _ = _pool_windows("max_pool2d", data, kernel, strides, pads, dilations, ceil_mode, fill)
    result = windows.max(axis=(4, 5))
    return np.ascontiguousarray(result.transpose(data_layout.from_nchw)).astype(result_dtype)


def _avg_pool2d_reference(data, *, kernel, strides, pads, dilations, ceil_mode, count_include_pad, layout):
    result_dtype = data.dtype
    data_layout = DATA_LAYOUTS[layout]
    data = data.transpose(data_layout.to_nchw).astype(compute_dtype(result_dtype), copy=False)
    windows, output_size, overhang = _pool_windows(
        "avg_pool2d", data, kernel, strides, pads, dilations, ceil_mode, 0)
    sums = windows.sum(axis=(4, 5))

    # The divisor is the number of window elements that count, found by pooling a mask:
    # the real input, plus the explicit padding with count_include_pad (as in ONNX and
    # PyTorch, never the overhang of a ceil_mode window).
    mask = np.ones((1, 1) + data.shape[2:], dtype=data.dtype)
    if count_include_pad:
        mask = _pad_spatial(mask, pads[:2], pads[2:], 1)
        mask = _pad_spatial(mask, (0, 0), overhang, 0)
    else:
        mask = _pad_spatial(mask, pads[:2], (pads[2] + overhang[0], pads[3] + overhang[1]), 0)
    counts = _sliding_windows(mask, kernel, strides, dilations, output_size).sum(axis=(4, 5))
    # A window entirely in the padding (only possible when a pad is as large as the
    # kernel) averages nothing; it yields 0 rather than a division by zero.
    result = sums / np.maximum(counts, 1)
    return np.ascontiguousarray(result.transpose(data_layout.from_nchw)).astype(result_dtype)


_POOL_ATTRS = {
    "kernel": AttrSpec("ints"),
    "strides": AttrSpec("ints", (1, 1)),
    "pads": AttrSpec("ints", (0, 0, 0, 0)),
    "dilations": AttrSpec("ints", (1, 1)),
    "ceil_mode": AttrSpec("bool", False),
}

register_op(
    "max_pool2d", num_inputs=1, infer=_infer_max_pool2d, reference=_max_pool2d_reference,
    attrs={**_POOL_ATTRS, "layout": AttrSpec("str", "NCHW")},
    category="opaque",
    doc="2-D max pooling (ONNX MaxPool: padding is -inf, ceil_mode drops windows starting in the padding).")

register_op(
    "avg_pool2d", num_inputs=1, infer=_infer_avg_pool2d, reference=_avg_pool2d_reference,
    attrs={**_POOL_ATTRS, "count_include_pad": AttrSpec("bool", False), "layout": AttrSpec("str", "NCHW")},
    category="opaque",
    doc="2-D average pooling (ONNX AveragePool output sizes and count_include_pad).")


# ---------------------------------------------------------------- global pools


def _infer_global_pool(op_name: str, dtypes, arg_types, attrs) -> TensorType:
    data = _image(op_name, arg_types[0], "data", dtypes)
    layout = _data_layout(op_name, attrs["layout"])
    spatial = tuple(data.shape[axis] for axis in layout.spatial_axes)
    if 0 in spatial:
        raise TypeInferenceError(
            f"{op_name}: input data {data.shape} ({attrs['layout']}) has an empty image {spatial}; "
            f"expected height and width of at least 1")
    channels = data.shape[layout.channel_axis]
    return TensorType(_with_spatial(data.shape, layout, channels, (1, 1)), data.dtype)


def _infer_global_avg_pool2d(arg_types, attrs) -> TensorType:
    return _infer_global_pool("global_avg_pool2d", AVG_POOL_DTYPES, arg_types, attrs)


def _infer_global_max_pool2d(arg_types, attrs) -> TensorType:
    return _infer_global_pool("global_max_pool2d", MAX_POOL_DTYPES, arg_types, attrs)


def _global_avg_pool2d_reference(data, *, layout):
    axes = DATA_LAYOUTS[layout].spatial_axes
    return data.astype(compute_dtype(data.dtype), copy=False).mean(axis=axes, keepdims=True).astype(data.dtype)


def _global_max_pool2d_reference(data, *, layout):
    return data.max(axis=DATA_LAYOUTS[layout].spatial_axes, keepdims=True)


register_op(
    "global_avg_pool2d", num_inputs=1, infer=_infer_global_avg_pool2d,
    reference=_global_avg_pool2d_reference, attrs={"layout": AttrSpec("str", "NCHW")},
    category="opaque",
    doc="Mean over height and width, keeping them as size-1 dims.")

register_op(
    "global_max_pool2d", num_inputs=1, infer=_infer_global_max_pool2d,
    reference=_global_max_pool2d_reference, attrs={"layout": AttrSpec("str", "NCHW")},
    category="opaque",
    doc="Maximum over height and width, keeping them as size-1 dims.")
