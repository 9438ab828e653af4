"""Layout ops: they move, select or repeat elements without arithmetic on them.

Semantics follow ONNX where it has the op (Slice, Gather, GatherElements, Unsqueeze,
Pad, Trilu, Tile, CumSum) so that the frontend maps one ONNX node to one call; shapes
are always static, so every attribute is a plain list of integers.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import TypeInferenceError
from ..ir.op import AttrSpec, register_op
from ..ir.types import FLOAT_DTYPES, INT_DTYPES, TensorType, TupleType
from ._common import accumulate_dtype, normalize_axis, same_dtype, tensor

INDEX_DTYPES = ("int32", "int64")


def _axes(op_name: str, attr_name: str, axes, ndim: int) -> list[int]:
    """`axes` with negative entries resolved against `ndim`; out of range or repeated
    axes are errors."""
    resolved = [normalize_axis(axis, ndim, f"{op_name}: {attr_name} entry") for axis in axes]
    if len(set(resolved)) != len(resolved):
        raise TypeInferenceError(f"{op_name}: {attr_name} {tuple(axes)} names an axis twice")
    return resolved


def _index_tensor(op_name: str, type_, input_name: str = "indices") -> TensorType:
    indices = tensor(type_, f"{op_name}: input {input_name}")
    if indices.dtype not in INDEX_DTYPES:
        raise TypeInferenceError(
            f"{op_name}: input {input_name} has dtype {indices.dtype}; expected one of {', '.join(INDEX_DTYPES)}")
    return indices


def _wrap_indices(op_name: str, indices, size: int):
    """ONNX index semantics: -size <= index < size, negative ones count from the end."""
    indices = np.asarray(indices, dtype=np.int64)
    out_of_range = (indices < -size) | (indices >= size)
    if out_of_range.any():
        bad = indices[out_of_range].flat[0]
        raise IndexError(f"{op_name}: index {bad} is out of range for an axis of size {size}")
    return np.where(indices < 0, indices + size, indices)


# ---------------------------------------------------------------- reshape


def _reshape_target(source: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """The static shape `target` names for a tensor of shape `source` (one -1 is inferred)."""
    size = math.prod(source)
    if any(d < -1 for d in target):
        raise TypeInferenceError(f"reshape: shape {target} has a negative dimension other than -1")
    inferred = [i for i, d in enumerate(target) if d == -1]
    if len(inferred) > 1:
        raise TypeInferenceError(f"reshape: shape {target} has more than one -1")
    if inferred:
        known = math.prod(d for d in target if d != -1)
        if known == 0:
            raise TypeInferenceError(
                f"reshape: cannot infer the -1 in {target}: the other dims multiply to 0")
        if size % known:
            raise TypeInferenceError(
                f"reshape: cannot reshape {source} ({size} elements) to {target}: "
                f"{size} is not a multiple of {known}")
        target = target[:inferred[0]] + (size // known,) + target[inferred[0] + 1:]
    if math.prod(target) != size:
        raise TypeInferenceError(
            f"reshape: cannot reshape {source} ({size} elements) to {target} ({math.prod(target)} elements)")
    return target


def _infer_reshape(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "reshape: input x")
    return TensorType(_reshape_target(x.shape, attrs["shape"]), x.dtype)


def _reshape_reference(x, *, shape):
    return x.reshape(_reshape_target(x.shape, shape))


register_op(
    "reshape", num_inputs=1, infer=_infer_reshape, reference=_reshape_reference,
    attrs={"shape": AttrSpec("ints")}, category="injective",
    doc="Same elements in a new static shape; one -1 is inferred, 0 is a literal empty dim.")


# ---------------------------------------------------------------- transpose


def _transpose_axes(op_name: str, axes, ndim: int) -> tuple[int, ...]:
    if not axes:
        return tuple(reversed(range(ndim)))
    if sorted(axes) != list(range(ndim)):
        raise TypeInferenceError(
            f"{op_name}: axes {tuple(axes)} are not a permutation of 0..{ndim - 1} "
            f"(the input has rank {ndim})")
    return tuple(axes)


def transpose_keeps_order(shape, axes) -> bool:
    """Whether transpose(x of `shape`, `axes`) moves only axes of size 1: the axes of more
    than one element keep their order, so the result holds x's elements in x's order (a
    reshape of x, run as a view)."""
    moved = [axis for axis in _transpose_axes("transpose", axes, len(shape)) if shape[axis] != 1]
    return moved == sorted(moved)


def _infer_transpose(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "transpose: input x")
    axes = _transpose_axes("transpose", attrs["axes"], x.ndim)
    return TensorType(tuple(x.shape[axis] for axis in axes), x.dtype)


def _transpose_reference(x, *, axes):
    return np.transpose(x, _transpose_axes("transpose", axes, x.ndim))


register_op(
    "transpose", num_inputs=1, infer=_infer_transpose, reference=_transpose_reference,
    attrs={"axes": AttrSpec("ints", ())}, category="injective",
    doc="Permutes the dims (axes=() reverses them).")


# ---------------------------------------------------------------- broadcast_to


def _infer_broadcast_to(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "broadcast_to: input x")
    target = attrs["shape"]
    try:
        result = tuple(np.broadcast_shapes(x.shape, target)) if min(target, default=0) >= 0 else None
    except ValueError:
        result = None
    if result != target:
        raise TypeInferenceError(
            f"broadcast_to: cannot broadcast {x.shape} to {target}; "
            f"expected a shape that {x.shape} broadcasts to unchanged")
    return TensorType(target, x.dtype)


def _broadcast_to_reference(x, *, shape):
    return np.ascontiguousarray(np.broadcast_to(x, shape))


register_op(
    "broadcast_to", num_inputs=1, infer=_infer_broadcast_to, reference=_broadcast_to_reference,
    attrs={"shape": AttrSpec("ints")}, category="injective",
    doc="Repeats size-1 and missing leading dims to a target shape (NumPy broadcasting).")


# ---------------------------------------------------------------- concat


def _infer_concat(arg_types, attrs) -> TensorType:
    inputs = [tensor(t, f"concat: input {i}") for i, t in enumerate(arg_types)]
    dtype = same_dtype(inputs, "concat")
    first = inputs[0]
    if first.ndim == 0:
        raise TypeInferenceError("concat: inputs must have rank >= 1, got a scalar")
    axis = normalize_axis(attrs["axis"], first.ndim, "concat: axis")
    for index, other in enumerate(inputs[1:], start=1):
        same_elsewhere = (other.ndim == first.ndim and all(
            a == b for d, (a, b) in enumerate(zip(first.shape, other.shape)) if d != axis))
        if not same_elsewhere:
            raise TypeInferenceError(
                f"concat: input {index} has shape {other.shape}; expected rank {first.ndim} and the "
                f"dims of input 0 {first.shape} on every axis but {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    return TensorType(tuple(shape), dtype)


def _concat_reference(*xs, axis):
    return np.concatenate(xs, axis=axis)


register_op(
    "concat", num_inputs=(1, None), infer=_infer_concat, reference=_concat_reference,
    attrs={"axis": AttrSpec("int")}, category="injective",
    doc="Joins tensors along an existing axis.")


# ---------------------------------------------------------------- split


def _infer_split(arg_types, attrs) -> TupleType:
    x = tensor(arg_types[0], "split: input x")
    if x.ndim == 0:
        raise TypeInferenceError("split: input x must have rank >= 1, got a scalar")
    axis = normalize_axis(attrs["axis"], x.ndim, "split: axis")
    sizes = attrs["sizes"]
    if not sizes or any(size < 0 for size in sizes):
        raise TypeInferenceError(f"split: sizes must be one or more non-negative integers, got {sizes}")
    if sum(sizes) != x.shape[axis]:
        raise TypeInferenceError(
            f"split: sizes {sizes} sum to {sum(sizes)}, but axis {axis} of {x.shape} has size {x.shape[axis]}")
    fields = []
    for size in sizes:
        shape = list(x.shape)
        shape[axis] = size
        fields.append(TensorType(tuple(shape), x.dtype))
    return TupleType(tuple(fields))


def _split_reference(x, *, axis, sizes):
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


register_op(
    "split", num_inputs=1, infer=_infer_split, reference=_split_reference,
    attrs={"axis": AttrSpec("int", 0), "sizes": AttrSpec("ints")}, category="injective",
    doc="Cuts a tensor along an axis into pieces of the given sizes; returns a tuple.")


# ---------------------------------------------------------------- strided_slice


def _slice_bounds(size: int, begin: int, end: int, step: int) -> tuple[slice, int]:
    """ONNX Slice on one axis of `size`: the Python slice it takes and its length.

    Negative begin/end count from the end; then both are clamped, to [0, size] for a
    positive step and to [0, size-1] / [-1, size-1] for a negative one, so INT64_MAX and
    INT64_MIN as `end` mean "to the end" and "through index 0"."""
    if size == 0:
        return slice(0, 0, 1), 0
    if begin < 0:
        begin += size
    if end < 0:
        end += size
    if step > 0:
        begin = min(max(begin, 0), size)
        end = min(max(end, 0), size)
        length = max(0, -(-(end - begin) // step))
        return slice(begin, end, step), length
    begin = min(max(begin, 0), size - 1)
    end = min(max(end, -1), size - 1)
    length = max(0, -(-(begin - end) // -step))
    # A Python slice reads an end of -1 as "the last element"; None means "past index 0".
    return slice(begin, None if end == -1 else end, step), length


def _slices(x_shape, begin, end, axes, strides) -> tuple[tuple[slice, ...], tuple[int, ...]]:
    """Checks strided_slice's attributes against `x_shape`; returns the per-axis slices
    and the result shape."""
    ndim = len(x_shape)
    axes = axes or tuple(range(len(begin)))
    strides = strides or (1,) * len(begin)
    if not len(begin) == len(end) == len(axes) == len(strides):
        raise TypeInferenceError(
            f"strided_slice: begin {begin}, end {end}, axes {axes} and strides {strides} "
            f"must have the same length")
    if 0 in strides:
        raise TypeInferenceError(f"strided_slice: strides {strides} contain a 0")
    slices = [slice(None)] * ndim
    shape = list(x_shape)
    for axis, start, stop, step in zip(_axes("strided_slice", "axes", axes, ndim), begin, end, strides):
        slices[axis], shape[axis] = _slice_bounds(x_shape[axis], start, stop, step)
    return tuple(slices), tuple(shape)


def _infer_strided_slice(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "strided_slice: input x")
    _, shape = _slices(x.shape, attrs["begin"], attrs["end"], attrs["axes"], attrs["strides"])
    return TensorType(shape, x.dtype)


def _strided_slice_reference(x, *, begin, end, axes, strides):
    slices, _ = _slices(x.shape, begin, end, axes, strides)
    return np.ascontiguousarray(x[slices])


register_op(
    "strided_slice", num_inputs=1, infer=_infer_strided_slice, reference=_strided_slice_reference,
    attrs={
        "begin": AttrSpec("ints"),
        "end": AttrSpec("ints"),
        "axes": AttrSpec("ints", ()),
        "strides": AttrSpec("ints", ()),
    },
    category="injective",
    doc="ONNX Slice: begin/end/strides per axis, negative indices and steps, clamped bounds.")


# ---------------------------------------------------------------- gather


def _infer_gather(arg_types, attrs) -> TensorType:
    data = tensor(arg_types[0], "gather: input data")
    indices = _index_tensor("gather", arg_types[1])
    if data.ndim == 0:
        raise TypeInferenceError("gather: input data must have rank >= 1, got a scalar")
    axis = normalize_axis(attrs["axis"], data.ndim, "gather: axis")
    return TensorType(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype)


def _gather_reference(data, indices, *, axis):
    axis = axis % data.ndim
    # Scalar indices into a 1-D tensor give a NumPy scalar; the interpreter works with arrays.
    return np.asarray(np.take(data, _wrap_indices("gather", indices, data.shape[axis]), axis=axis))


register_op(
    "gather", num_inputs=2, infer=_infer_gather, reference=_gather_reference,
    attrs={"axis": AttrSpec("int", 0)}, category="injective",
    doc="Takes slices along an axis at the given indices (numpy.take; negative indices wrap).")


def _infer_gather_elements(arg_types, attrs) -> TensorType:
    data = tensor(arg_types[0], "gather_elements: input data")
    indices = _index_tensor("gather_elements", arg_types[1])
    if data.ndim == 0 or indices.ndim != data.ndim:
        raise TypeInferenceError(
            f"gather_elements: input indices {indices.shape} must have the rank of data {data.shape} (>= 1)")
    axis = normalize_axis(attrs["axis"], data.ndim, "gather_elements: axis")
    for dim, (data_size, index_size) in enumerate(zip(data.shape, indices.shape)):
        if dim != axis and index_size > data_size:
            raise TypeInferenceError(
                f"gather_elements: input indices {indices.shape} is larger than data {data.shape} "
                f"on axis {dim}; expected at most {data_size} there")
    return TensorType(indices.shape, data.dtype)


def _gather_elements_reference(data, indices, *, axis):
    axis = axis % data.ndim
    # Off the gathered axis, output element i reads data at i: crop data to the indices' extent.
    crop = tuple(slice(None) if dim == axis else slice(0, size) for dim, size in enumerate(indices.shape))
    indices = _wrap_indices("gather_elements", indices, data.shape[axis])
    return np.take_along_axis(data[crop], indices, axis=axis)


register_op(
    "gather_elements", num_inputs=2, infer=_infer_gather_elements, reference=_gather_elements_reference,
    attrs={"axis": AttrSpec("int", 0)}, category="injective",
    doc="ONNX GatherElements: out[i][j] = data[indices[i][j]][j] for axis 0, and so on.")


# ---------------------------------------------------------------- squeeze / expand_dims


def _squeezed_axes(x_shape, axes) -> list[int]:
    if not axes:
        return [axis for axis, size in enumerate(x_shape) if size == 1]
    resolved = _axes("squeeze", "axes", axes, len(x_shape))
    for axis in resolved:
        if x_shape[axis] != 1:
            raise TypeInferenceError(
                f"squeeze: axis {axis} of {tuple(x_shape)} has size {x_shape[axis]}; expected 1")
    return resolved


def _infer_squeeze(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "squeeze: input x")
    removed = _squeezed_axes(x.shape, attrs["axes"])
    return TensorType(tuple(size for axis, size in enumerate(x.shape) if axis not in removed), x.dtype)


def _squeeze_reference(x, *, axes):
    return np.squeeze(x, axis=tuple(_squeezed_axes(x.shape, axes)))


register_op(
    "squeeze", num_inputs=1, infer=_infer_squeeze, reference=_squeeze_reference,
    attrs={"axes": AttrSpec("ints", ())}, category="injective",
    doc="Removes size-1 dims (axes=() removes all of them).")


def _expanded_shape(x_shape, axes) -> tuple[int, ...]:
    """ONNX Unsqueeze: `axes` are positions in the output, whose rank is ndim + len(axes)."""
    if not axes:
        raise TypeInferenceError("expand_dims: axes must name at least one new axis")
    output_rank = len(x_shape) + len(axes)
    inserted = set(_axes("expand_dims", "axes", axes, output_rank))
    remaining = iter(x_shape)
    return tuple(1 if axis in inserted else next(remaining) for axis in range(output_rank))


def _infer_expand_dims(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "expand_dims: input x")
    return TensorType(_expanded_shape(x.shape, attrs["axes"]), x.dtype)


def _expand_dims_reference(x, *, axes):
    return x.reshape(_expanded_shape(x.shape, axes))


register_op(
    "expand_dims", num_inputs=1, infer=_infer_expand_dims, reference=_expand_dims_reference,
    attrs={"axes": AttrSpec("ints")}, category="injective",
    doc="Inserts size-1 dims at the given output positions (ONNX Unsqueeze).")


# ---------------------------------------------------------------- pad

# byoc pad mode -> NumPy pad mode
PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge"}


def _check_pad(x: TensorType, pads, mode: str) -> tuple[int, ...]:
    """Checks pad's attributes against `x`; returns the result shape."""
    if mode not in PAD_MODES:
        raise TypeInferenceError(f"pad: mode {mode!r} is not supported; expected one of {', '.join(PAD_MODES)}")
    if len(pads) != 2 * x.ndim:
        raise TypeInferenceError(
            f"pad: pads {pads} must hold {2 * x.ndim} integers (all begins, then all ends) "
            f"for an input of rank {x.ndim}")
    shape = []
    for axis, size in enumerate(x.shape):
        before, after = pads[axis], pads[axis + x.ndim]
        # Negative pads crop (as in ONNX); what is left is then padded.
        kept = size + min(before, 0) + min(after, 0)
        if kept < 0:
            raise TypeInferenceError(f"pad: pads {pads} crop more than the {size} elements of axis {axis}")
        largest = max(before, after, 0)
        # PyTorch and onnxruntime limit reflection to one mirror image; NumPy would go on.
        if mode == "reflect" and largest > 0 and largest >= kept:
            raise TypeInferenceError(
                f"pad: reflect padding of {largest} on axis {axis} needs more than {largest} elements there, "
                f"got {kept}")
        if mode == "edge" and largest > 0 and kept == 0:
            raise TypeInferenceError(f"pad: edge padding of axis {axis} needs at least one element there")
        shape.append(kept + max(before, 0) + max(after, 0))
    return tuple(shape)


def _infer_pad(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "pad: input x")
    return TensorType(_check_pad(x, attrs["pads"], attrs["mode"]), x.dtype)


def _pad_reference(x, *, pads, mode, value):
    ndim = x.ndim
    crop = tuple(slice(-min(pads[axis], 0), size + min(pads[axis + ndim], 0))
                 for axis, size in enumerate(x.shape))
    widths = [(max(pads[axis], 0), max(pads[axis + ndim], 0)) for axis in range(ndim)]
    options = {"constant_values": np.asarray(value).astype(x.dtype)} if mode == "constant" else {}
    return np.pad(x[crop], widths, mode=PAD_MODES[mode], **options)


register_op(
    "pad", num_inputs=1, infer=_infer_pad, reference=_pad_reference,
    attrs={
        "pads": AttrSpec("ints"),
        "mode": AttrSpec("str", "constant"),
        "value": AttrSpec("float", 0.0),
    },
    category="injective",
    doc="ONNX Pad: pads are all begins then all ends (negative crops); constant, reflect or edge.")


# ---------------------------------------------------------------- trilu


def _infer_trilu(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "trilu: input x")
    if x.ndim < 2:
        raise TypeInferenceError(f"trilu: input x must have rank >= 2, got {x}")
    return x


def _trilu_reference(x, *, upper, k):
    # np.triu / np.tril act on the last two dims of a stack of matrices, as ONNX Trilu does.
    return np.triu(x, k) if upper else np.tril(x, k)


register_op(
    "trilu", num_inputs=1, infer=_infer_trilu, reference=_trilu_reference,
    attrs={"upper": AttrSpec("bool", True), "k": AttrSpec("int", 0)}, category="injective",
    doc="Keeps the upper (or lower) triangle of the last two dims from diagonal k, zeroing the rest.")


# ---------------------------------------------------------------- tile


def _infer_tile(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "tile: input x")
    repeats = attrs["repeats"]
    if len(repeats) != x.ndim or any(r < 0 for r in repeats):
        raise TypeInferenceError(
            f"tile: repeats {repeats} must be {x.ndim} non-negative integers, one per dim of {x.shape}")
    return TensorType(tuple(size * r for size, r in zip(x.shape, repeats)), x.dtype)


def _tile_reference(x, *, repeats):
    return np.tile(x, repeats)


register_op(
    "tile", num_inputs=1, infer=_infer_tile, reference=_tile_reference,
    attrs={"repeats": AttrSpec("ints")}, category="injective",
    doc="Repeats the whole tensor repeats[d] times along each dim d.")


# ---------------------------------------------------------------- cumsum

CUMSUM_DTYPES = FLOAT_DTYPES + INT_DTYPES


def _infer_cumsum(arg_types, attrs) -> TensorType:
    x = tensor(arg_types[0], "cumsum: input x")
    if x.dtype not in CUMSUM_DTYPES:
        raise TypeInferenceError(
            f"cumsum: input x has dtype {x.dtype}; expected one of {', '.join(CUMSUM_DTYPES)}")
    if x.ndim == 0:
        raise TypeInferenceError("cumsum: input x must have rank >= 1, got a scalar")
    normalize_axis(attrs["axis"], x.ndim, "cumsum: axis")
    return x


def _cumsum_reference(x, *, axis, exclusive, reverse):
    result_dtype = x.dtype
    work = x.astype(accumulate_dtype(result_dtype))
    if reverse:
        work = np.flip(work, axis)
    sums = np.cumsum(work, axis=axis)
    if exclusive:
        # Each element gets the sum of those strictly before it: shift by one, 0 first.
        shifted = np.zeros_like(sums)
        target = [slice(None)] * x.ndim
        source = [slice(None)] * x.ndim
        target[axis], source[axis] = slice(1, None), slice(None, -1)
        shifted[tuple(target)] = sums[tuple(source)]
        sums = shifted
    if reverse:
        sums = np.flip(sums, axis)
    return np.ascontiguousarray(sums).astype(result_dtype)


register_op(
    "cumsum", num_inputs=1, infer=_infer_cumsum, reference=_cumsum_reference,
    attrs={
        "axis": AttrSpec("int"),
        "exclusive": AttrSpec("bool", False),
        "reverse": AttrSpec("bool", False),
    },
    # A scan reads many inputs per output: not injective, so fusion keeps it on its own.
    category="opaque",
    doc="Running sum along an axis (ONNX CumSum: exclusive and reverse variants).")
