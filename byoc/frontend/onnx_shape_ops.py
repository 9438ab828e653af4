"""Converters of ONNX's shape and layout ops (Shape, Constant, Range, Reshape, Transpose,
Concat, Split, Slice, Gather, Pad, ...) into IR calls or, where every input is known,
folded values; each registers itself with `onnx.converter`."""
from __future__ import annotations

import math

import numpy as np
import onnx

from ..errors import ModelError
from .onnx import check_folded_size, converter


# ---- shapes and layout --------------------------------------------------------------

@converter("Shape")
def _shape(ctx, node, inputs, attrs):
    shape = np.asarray(ctx.shape(inputs[0]), dtype=np.int64)
    start, end = attrs.get("start", 0), attrs.get("end", None)
    return [shape[start:end]]


@converter("Size")
def _size(ctx, node, inputs, attrs):
    return [np.asarray(math.prod(ctx.shape(inputs[0])), dtype=np.int64)]


_CONSTANT_NUMBERS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                     "value_ints": np.int64}


@converter("Constant")
def _constant(ctx, node, inputs, attrs):
    if len(attrs) != 1:  # the spec: exactly one of its attributes gives the value
        raise ModelError(f"attributes {sorted(attrs)} given; expected exactly one of "
                         f"{', '.join(sorted(onnx.defs.get_schema('Constant', ctx.opset, '').attributes))}")
    if "value" in attrs:
        return [ctx._tensor_to_array(attrs["value"], f"{ctx.node_label} value")]
    for key, dtype in _CONSTANT_NUMBERS.items():
        if key in attrs:
            return [np.asarray(attrs[key], dtype=dtype)]
    ctx.unsupported(f"a Constant given by {sorted(attrs)} (byoc reads value, value_float(s), value_int(s))")


@converter("ConstantOfShape")
def _constant_of_shape(ctx, node, inputs, attrs):
    shape = ctx.known_ints(inputs[0], "input")
    if any(d < 0 for d in shape):
        raise ModelError(f"input 'input' (the shape) is {list(shape)}; expected non-negative dims")
    fill = np.zeros((), dtype=np.float32)
    if "value" in attrs:
        fill = ctx._tensor_to_array(attrs["value"], f"{ctx.node_label} value")
        if fill.size != 1:
            raise ModelError(f"attribute 'value' has shape {list(fill.shape)}; expected a one-element tensor")
    check_folded_size(math.prod(shape), fill.dtype.itemsize, f"of shape {list(shape)}")
    return [np.full(shape, fill.reshape(-1)[0], dtype=fill.dtype)]


@converter("Range")
def _range(ctx, node, inputs, attrs):
    start, limit, delta = (ctx.known(v, n) for v, n in zip(inputs, ("start", "limit", "delta")))
    first, last, step = (ctx.known_scalar(v, n) for v, n in zip(inputs, ("start", "limit", "delta")))
    if step == 0:
        raise ModelError("input 'delta' is 0; expected a non-zero step")
    if not all(math.isfinite(v) for v in (first, last, step)):
        raise ModelError(f"start={first}, limit={last}, delta={step}; expected finite numbers")
    # ONNX's element count; Python ints keep int64 bounds exact
    count = max(math.ceil((last - first) / step) if isinstance(step, float) else -((first - last) // step), 0)
    check_folded_size(count, np.asarray(start).dtype.itemsize,
                       f"of {count} elements from start={first}, limit={last}, delta={step}")
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))  # one element each
    return [np.arange(start, limit, delta).astype(start.dtype)]


@converter("Reshape")
def _reshape(ctx, node, inputs, attrs):
    x = inputs[0]
    target = list(ctx.known_ints(inputs[1], "shape"))
    in_shape = ctx.shape(x)
    if not attrs.get("allowzero", 0):  # 0 copies the input's dim
        copied = [i for i, d in enumerate(target) if d == 0 and i >= len(in_shape)]
        if copied:
            raise ModelError(f"input 'shape' {target} has 0 (copy the input's dim) at position(s) {copied}, "
                             f"but the input has rank {len(in_shape)}; expected 0s only within its rank")
        target = [in_shape[i] if d == 0 else d for i, d in enumerate(target)]
    elif 0 in target and -1 in target:  # the spec calls this invalid: -1 cannot be inferred
        raise ModelError(f"input 'shape' {target} has both 0 and -1 with allowzero=1; expected at most one "
                         f"of them")
    return [ctx.call("reshape", x, shape=tuple(target), name=node.output[0])]


@converter("Flatten")
def _flatten(ctx, node, inputs, attrs):
    shape = ctx.shape(inputs[0])
    axis = attrs.get("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise ModelError(f"attribute 'axis' is {axis}; expected -{len(shape)} to {len(shape)} for an input of "
                         f"rank {len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    target = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    return [ctx.call("reshape", inputs[0], shape=target, name=node.output[0])]


@converter("Transpose")
def _transpose(ctx, node, inputs, attrs):
    rank = len(ctx.shape(inputs[0]))
    perm = tuple(attrs.get("perm", tuple(reversed(range(rank)))))
    return [ctx.call("transpose", inputs[0], axes=perm, name=node.output[0])]


def _axes_from(ctx, inputs, attrs, index=1):
    if "axes" in attrs:
        return tuple(attrs["axes"])
    if len(inputs) > index and inputs[index] is not None:
        # the spec says 1-D; onnxruntime also reads a 0-D axes tensor, so byoc does
        return ctx.known_ints(inputs[index], "axes", allow_scalar=True)
    return None


@converter("Squeeze")
def _squeeze(ctx, node, inputs, attrs):
    axes = _axes_from(ctx, inputs, attrs)
    return [ctx.call("squeeze", inputs[0], axes=axes or (), name=node.output[0])]


@converter("Unsqueeze")
def _unsqueeze(ctx, node, inputs, attrs):
    axes = _axes_from(ctx, inputs, attrs)
    return [ctx.call("expand_dims", inputs[0], axes=axes, name=node.output[0])]


@converter("Expand")
def _expand(ctx, node, inputs, attrs):
    x = inputs[0]
    target = ctx.known_ints(inputs[1], "shape")
    try:
        shape = np.broadcast_shapes(ctx.shape(x), target)
    except ValueError:
        raise ModelError(f"{ctx.node_label}: cannot expand shape {ctx.shape(x)} to {target}") from None
    if tuple(shape) == ctx.shape(x):
        return [x]
    return [ctx.call("broadcast_to", x, shape=tuple(shape), name=node.output[0])]


@converter("Concat")
def _concat(ctx, node, inputs, attrs):
    # ONNX allows empty operands; they contribute nothing
    parts = [v for v in inputs if 0 not in ctx.shape(v)] or inputs[:1]
    return [ctx.call("concat", *parts, axis=attrs["axis"], name=node.output[0])]


@converter("Split")
def _split(ctx, node, inputs, attrs):
    x = inputs[0]
    rank = len(ctx.shape(x))
    axis = _checked_axis(attrs.get("axis", 0), rank)
    length = ctx.shape(x)[axis]
    count = len(node.output)
    if len(inputs) > 1 and inputs[1] is not None:
        if "num_outputs" in attrs:
            raise ModelError("both input 'split' and attribute 'num_outputs' given; expected one of them")
        sizes = ctx.known_ints(inputs[1], "split")
        if len(sizes) != count:
            raise ModelError(f"input 'split' has {len(sizes)} sizes {list(sizes)}, but the node has {count} "
                             f"outputs; expected one size per output")
    else:
        parts = attrs.get("num_outputs", count)
        if parts != count:
            raise ModelError(f"attribute 'num_outputs' is {parts}, but the node has {count} outputs; "
                             f"expected them to agree")
        chunk = -(-length // parts)  # the last chunk is smaller when it does not divide
        if chunk * (parts - 1) > length:
            raise ModelError(f"attribute 'num_outputs' is {parts}: {length} elements along axis {axis} do not "
                             f"make {parts} chunks of {chunk} with a smaller last one")
        sizes = tuple(min(chunk, length - i * chunk) for i in range(parts))
    result = ctx.call("split", x, axis=axis, sizes=sizes)
    if isinstance(result, tuple):
        return list(result)
    return [ctx.builder.get_item(result, i, name=name or None) for i, name in enumerate(node.output)]


def _checked_axis(axis: int, rank: int, attribute: str = "axis") -> int:
    """An axis attribute in -rank..rank-1, as 0..rank-1."""
    if not -rank <= axis < rank:
        raise ModelError(f"attribute {attribute!r} is {axis}; expected -{rank} to {rank - 1} for an input of "
                         f"rank {rank}")
    return axis % rank


@converter("Slice")
def _slice(ctx, node, inputs, attrs):
    x = inputs[0]
    starts, ends, axes, steps = (
        ctx.known_ints(value, name) if value is not None else ()
        for value, name in zip(inputs[1:] + [None] * (5 - len(inputs)), ("starts", "ends", "axes", "steps")))
    # clamp to int64-safe values the op can hold
    limit = np.iinfo(np.int64).max
    ends = tuple(max(min(e, limit), -limit) for e in ends)
    return [ctx.call("strided_slice", x, begin=starts, end=ends, axes=axes, strides=steps, name=node.output[0])]


@converter("Gather")
def _gather(ctx, node, inputs, attrs):
    return [ctx.call("gather", inputs[0], inputs[1], axis=attrs.get("axis", 0), name=node.output[0])]


@converter("GatherElements")
def _gather_elements(ctx, node, inputs, attrs):
    return [ctx.call("gather_elements", inputs[0], inputs[1], axis=attrs.get("axis", 0), name=node.output[0])]


@converter("Pad")
def _pad(ctx, node, inputs, attrs):
    x = inputs[0]
    rank = len(ctx.shape(x))
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "reflect", "edge"):
        ctx.unsupported(f"mode={mode!r} (byoc pads with constant, reflect or edge)")
    pads = list(ctx.known_ints(inputs[1], "pads"))
    value = 0.0
    if len(inputs) > 2 and inputs[2] is not None:
        value = float(ctx.known_scalar(inputs[2], "constant_value"))
    axes = list(range(rank))
    if len(inputs) > 3 and inputs[3] is not None:  # opset 18: pads given for some axes only
        axes = list(ctx.known_ints(inputs[3], "axes"))
        outside = [a for a in axes if not -rank <= a < rank]
        if outside:
            raise ModelError(f"input 'axes' {axes} has {outside} outside -{rank}..{rank - 1} for an input of "
                             f"rank {rank}")
        axes = [a % rank for a in axes]
        if len(set(axes)) != len(axes):
            raise ModelError(f"input 'axes' {axes} names an axis twice; expected each axis once")
    if len(pads) != 2 * len(axes):
        raise ModelError(f"input 'pads' has {len(pads)} values {pads}; expected 2 per padded axis "
                         f"({2 * len(axes)} for axes {axes})")
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        full[axis], full[rank + axis] = pads[i], pads[len(axes) + i]
    pads = full
    return [ctx.call("pad", x, pads=tuple(pads), mode=mode, value=value, name=node.output[0])]


@converter("Tile")
def _tile(ctx, node, inputs, attrs):
    repeats = ctx.known_ints(inputs[1], "repeats")
    return [ctx.call("tile", inputs[0], repeats=repeats, name=node.output[0])]


@converter("Trilu")
def _trilu(ctx, node, inputs, attrs):
    k = ctx.known_scalar(inputs[1], "k", "integer") if len(inputs) > 1 and inputs[1] is not None else 0
    return [ctx.call("trilu", inputs[0], upper=bool(attrs.get("upper", 1)), k=k, name=node.output[0])]


@converter("CumSum")
def _cumsum(ctx, node, inputs, attrs):
    axis = ctx.known_scalar(inputs[1], "axis", "integer")
    return [ctx.call("cumsum", inputs[0], axis=axis, exclusive=bool(attrs.get("exclusive", 0)),
                     reverse=bool(attrs.get("reverse", 0)), name=node.output[0])]


@converter("If")
def _if(ctx, node, inputs, attrs):
    """An If whose condition is known at import time (exporters write Python conditionals on
    shapes as If: DeBERTa's relative positions): the branch it takes, converted in place."""
    condition = ctx.known_scalar(inputs[0], "cond")
    branch = attrs["then_branch" if condition else "else_branch"]
    return ctx.inline_graph(branch, "then_branch" if condition else "else_branch")
