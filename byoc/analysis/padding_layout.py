"""The padding analysis (analysis/padding.py): where a reshape merges the padded dim with the
axes outside it, the factor of each axis outside the dim (its layout), through the ops
that keep rows apart, until a reshape gives the dim its own axis again."""
from __future__ import annotations

from ..ir.types import TensorType
from .padding_fills import _ELEMENTWISE_LIKE, _Argument


def _result_layout(op: str, call, arguments: list, out_axes, small_type, large_type) -> tuple:
    """(why not, the result's layout: {axis carrying the dim: the factor of the axis outside
    it}). Ops that keep rows apart (_mixes let them through) move the dim's rows along with
    their axes; where operands meet (elementwise, a contraction) they must hold them alike."""
    from ..ir.op import OP_REGISTRY
    if not out_axes:
        return None, {}
    if op == "reshape":
        return _reshape_layout(arguments[0], small_type, large_type, out_axes)
    if all(outer == 1 for argument in arguments for outer in argument.layout.values()):
        return None, {axis: 1 for axis in out_axes}  # the dim leads every axis it is in, before and after
    out_ndim = large_type.ndim if isinstance(large_type, TensorType) else 0
    placed: dict = {}  # result axis -> the layouts its operands bring
    category = getattr(OP_REGISTRY.get(op), "category", "opaque")

    def place(argument, mapping):
        for axis, outer in argument.layout.items():
            target = mapping(axis)
            if target is not None:
                placed.setdefault(target, set()).add(outer)

    def rank(argument):
        return argument.value.type.ndim if isinstance(argument.value.type, TensorType) else 0

    if category in ("elemwise", "broadcast") or op in _ELEMENTWISE_LIKE or op == "broadcast_to":
        for argument in arguments:  # numpy broadcasting lines the axes up from the right
            place(argument, lambda axis, shift=out_ndim - rank(argument): axis + shift)
    elif op == "transpose":
        perm = [int(a) for a in (call.attrs.get("axes") or list(reversed(range(out_ndim))))]
        place(arguments[0], lambda axis: perm.index(axis))
    elif op == "matmul":
        a, b = arguments[0], arguments[1]
        ra, rb = rank(a), rank(b)
        contracted = {}  # the contraction: a row of a meets the same column of b
        for argument, own, rows, to in ((a, ra - 1, ra - 2 if ra >= 2 else None, out_ndim - 2 if rb >= 2 else
                                         out_ndim - 1),
                                        (b, rb - 2 if rb >= 2 else 0, rb - 1 if rb >= 2 else None, out_ndim - 1)):
            for axis, outer in argument.layout.items():
                if axis == own:
                    contracted.setdefault(outer, argument)
                elif axis == rows:
                    placed.setdefault(to, set()).add(outer)
                else:  # a batch axis, lined up from the right
                    placed.setdefault(axis + out_ndim - rank(argument), set()).add(outer)
        if len(contracted) > 1:
            return "it contracts the dim of operands that hold its rows in different places of their axes", {}
    elif op == "gather":
        axis_of = int(call.attrs.get("axis", 0)) % max(rank(arguments[0]), 1)
        indices = rank(arguments[1])
        place(arguments[0], lambda axis: axis if axis < axis_of else axis + indices - 1 if axis > axis_of else None)
        place(arguments[1], lambda axis: axis_of + axis)
    elif op in ("softmax", "log_softmax", "layer_norm", "rms_norm", "batch_norm", "strided_slice", "split", "concat",
                "pad", "tile", "cumsum", "gather_elements"):
        for argument in arguments if op == "concat" else arguments[:1]:  # the axes stay where they are
            place(argument, lambda axis: axis)
    elif op in ("expand_dims", "squeeze") or category == "reduce":
        # the axes that hold the dim keep their order (a sum along one, its padded terms zero, drops it)
        reduced = set()
        if category == "reduce":
            from ..ops.reduction import reduced_axes
            ndim = rank(arguments[0])
            reduced = {int(call.attrs["axis"]) % ndim} if op in ("argmax", "argmin") else \
                set(reduced_axes(op, call.attrs.get("axes") or (), ndim))
        kept = sorted(axis for axis in arguments[0].layout if axis not in reduced)
        if len(kept) != len(out_axes):
            return "byoc does not know where it moves the axes that hold the dim", {}
        place(arguments[0], lambda axis: sorted(out_axes)[kept.index(axis)] if axis in kept else None)
    else:
        return ("its operand holds the dim inside another axis (a reshape merged them), and byoc does not know "
                "where it moves those rows"), {}
    layout = {}
    for axis in out_axes:
        outers = placed.get(axis, {1})
        if len(outers) > 1:
            return (f"its operands hold the dim's rows in different places of axis {axis} (one of them merged it "
                    f"with the axes outside it), so real rows would meet padded ones"), {}
        layout[axis] = next(iter(outers))
    return None, layout


def _reshape_groups(in_shape, out_shape):
    """The reshape's groups of axes whose extents multiply to the same number, as pairs
    (input axes, output axes), in order; None when they do not line up."""
    groups, i, j = [], 0, 0
    while i < len(in_shape) or j < len(out_shape):
        group_in, group_out, p_in, p_out = [], [], 1, 1
        if i < len(in_shape):
            group_in.append(i)
            p_in *= in_shape[i]
            i += 1
        if j < len(out_shape):
            group_out.append(j)
            p_out *= out_shape[j]
            j += 1
        while p_in != p_out:
            if p_in < p_out and i < len(in_shape):
                group_in.append(i)
                p_in *= in_shape[i]
                i += 1
            elif p_out < p_in and j < len(out_shape):
                group_out.append(j)
                p_out *= out_shape[j]
                j += 1
            else:
                return None
        groups.append((group_in, group_out))
    return groups


def _reshape_layout(argument: "_Argument", small_type, large_type, out_axes) -> tuple:
    """(why not, the result's layout) of a reshape of `argument`. In a group of axes (read
    as one row-major axis) the dim's index s lies at o * (S * inner) + s * inner + i, where
    o runs over the factor outside it: the group's real elements are those with s below the
    smaller size wherever the dim sits, so the reshape keeps the padded rows apart when one
    axis of each side holds the dim and the factor outside it in the group is the same on
    both sides ([B, S, H] -> [B*S, H] and back)."""
    from math import prod
    in_small, in_large = argument.small.type.shape, argument.value.type.shape
    out_small, out_large = small_type.shape, large_type.shape
    groups = _reshape_groups(in_large, out_large)
    if groups is None:
        return "its groups of axes do not line up", {}
    layout = {}
    for group_in, group_out in groups:
        held_in = [axis for axis in group_in if axis in argument.layout]
        held_out = [axis for axis in group_out if axis in out_axes]
        if not held_in and not held_out:
            continue
        if not held_in or not held_out:
            return "it moves the dim into another group of axes", {}
        if len(held_in) > 1 or len(held_out) > 1:
            return "it merges two axes that both grow with the dim, or splits one into two", {}
        a, k = held_in[0], held_out[0]
        outer = prod(in_large[g] for g in group_in if g < a) * argument.layout[a]
        after_in = prod(in_large[g] for g in group_in if g > a)
        # the dim and what lies inside it, flattened, at each size
        inner_large = in_large[a] // argument.layout[a] * after_in
        inner_small = in_small[a] // argument.layout[a] * after_in
        before_out = prod(out_large[g] for g in group_out if g < k)
        after_out = prod(out_large[g] for g in group_out if g > k)
        if outer % before_out or inner_large % after_out or inner_small % after_out or \
                out_large[k] != outer // before_out * (inner_large // after_out) or \
                out_small[k] != outer // before_out * (inner_small // after_out):
            return "it moves the dim's rows across other axes (padded rows would land between real ones)", {}
        layout[k] = outer // before_out
    return None, layout
