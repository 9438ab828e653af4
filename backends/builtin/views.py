"""Strided views: what a chain of layout ops (strided_slice, transpose and the reshape ops)
does to its input's indexing, so that the chain runs as ONE strided copy.

A View is (shape, strides, offset) in elements over a dense input. Every layout op maps a
view to a view, except a reshape that would have to merge dims the view does not walk
contiguously (a transposed view reshaped across the transposed dims): compose() then
returns None and the chain stops before that op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from byoc.ir.expr import Call
from byoc.ir.op import Op

from .elementwise import _dense_strides

CHAIN_OPS = ("strided_slice", "transpose", "reshape", "squeeze", "expand_dims")
COPYING_OPS = ("strided_slice", "transpose")  # alone, each costs a copy (reshapes are views)


@dataclass(frozen=True)
class View:
    shape: tuple
    strides: tuple
    offset: int = 0

    @staticmethod
    def dense(shape) -> "View":
        return View(tuple(shape), tuple(_dense_strides(shape)), 0)


def compose(view: View, call: Call) -> View | None:
    """The view after `call` (a CHAIN_OPS op reading `view`'s tensor), or None when it
    cannot be a view (see the module docstring)."""
    name, attrs = call.op.name, call.attrs
    out_shape = tuple(call.type.shape)
    if name == "transpose":
        from byoc.ops.layout import _transpose_axes
        axes = _transpose_axes("transpose", attrs["axes"], len(view.shape))
        return View(tuple(view.shape[a] for a in axes), tuple(view.strides[a] for a in axes), view.offset)
    if name == "strided_slice":
        from byoc.ops.layout import _slices
        slices, shape = _slices(view.shape, attrs["begin"], attrs["end"], attrs["axes"], attrs["strides"])
        offset, strides = view.offset, []
        for piece, size, stride in zip(slices, view.shape, view.strides):
            start, _, step = piece.indices(size) if size else (0, 0, 1)
            offset += start * stride
            strides.append(step * stride)
        return View(tuple(shape), tuple(strides), offset)
    if name in ("reshape", "squeeze", "expand_dims"):
        strides = reshape_strides(view.shape, view.strides, out_shape)
        return None if strides is None else View(out_shape, tuple(strides), view.offset)
    return None


def reshape_strides(shape, strides, new_shape) -> list[int] | None:
    """Strides that walk `new_shape` over the same elements, in the same row-major order,
    as (`shape`, `strides`) does; None when no such strides exist. Dims of size 1 get
    stride 0 (any stride would do)."""
    if math.prod(shape) != math.prod(new_shape):
        return None
    if math.prod(shape) == 0:
        return _dense_strides(new_shape)
    old = [(size, stride) for size, stride in zip(shape, strides) if size != 1]
    new_dims = [d for d, size in enumerate(new_shape) if size != 1]
    result = [0] * len(new_shape)
    old_index = new_index = 0
    while old_index < len(old) and new_index < len(new_dims):
        # The smallest blocks of old and new dims with equal element counts.
        old_start, new_start = old_index, new_index
        old_count, new_count = old[old_index][0], new_shape[new_dims[new_index]]
        while old_count != new_count:
            if old_count < new_count:
                old_index += 1
                old_count *= old[old_index][0]
            else:
                new_index += 1
                new_count *= new_shape[new_dims[new_index]]
        # The old block must be one contiguous run for the new dims to re-split it.
        for k in range(old_start, old_index):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        stride = old[old_index][1]
        for k in range(new_index, new_start - 1, -1):
            result[new_dims[k]] = stride
            stride *= new_shape[new_dims[k]]
        old_index += 1
        new_index += 1
    return result


def chain_views(bindings, outside_view) -> dict | None:
    """var -> (root, View) for each layout op among `bindings` (in binding order) that reads
    a view: `outside_view(var)` is the View of an input no binding here produced (None where
    it cannot be one), and root the value every view of a chain is a view of. None when
    some layout op is not a strided view of its root. The builtin partition (which chains
    may join an elementwise group) and its codegen (what each kernel input reads) agree
    through this one function."""
    views: dict = {}
    for binding in bindings:
        value = binding.value
        if not (isinstance(value, Call) and isinstance(value.op, Op) and value.op.name in CHAIN_OPS
                and len(value.args) == 1):
            continue
        source = value.args[0]
        if source in views:
            root, view = views[source]
        else:
            root, view = source, outside_view(source)
        composed = None if view is None else compose(view, value)
        if composed is None:
            return None
        views[binding.var] = (root, composed)
    return views

