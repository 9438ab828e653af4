"""Whether a named dim can be padded: does the program built for a larger size of the dim
compute, on the elements that exist at a smaller size, exactly what the program of the
smaller size computes? Then an input of any size up to a shape bucket's can run in that
bucket, padded along the dim, with its outputs cut back (TensorRT's optimization profiles
serve a range of shapes with one engine; here a bucket's program is static, so padding is
what lets it serve the sizes below it).

`padding_problem(small, large)` compares the two simplified modules of two sizes of one dim
(everything else equal), op by op. An axis whose extent differs between them carries the
dim. The dim can be padded when every op keeps the rows along such axes apart:
- elementwise and broadcasting ops, transposes, gathers by index, slices that take the whole
  axis, and reshapes that keep the dim the outermost factor of its group (B*S rows of a
  [B, S, H] tensor: the first b*S rows are the first b batches);
- no reduction, softmax or normalization, matmul contraction, concat, split, pad, cumsum or
  pooling window runs along it;
- every constant is the same in both, or (one of the dim's size: position ids, masks) the
  smaller one is the start of the larger.
Otherwise it names the first op that mixes the padded rows into the others, e.g. BERT's
sequence: the attention's softmax runs over the keys, which padding would add to. Ops it does
not know count as mixing.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Tuple
from ..ir.types import TensorType, TupleType

# ops that compute each output element from the input elements at the same index
# (broadcasting), or only move elements without combining them along any axis
_KEEP_ROWS_APART = {"transpose", "broadcast_to", "expand_dims", "squeeze", "trilu", "device_copy", "on_device",
                    "identity"}
# attributes that only say shapes (they differ between the sizes where the dim is in them)
_SHAPE_ATTRIBUTES = {"reshape": {"shape"}, "broadcast_to": {"shape"}, "strided_slice": {"end"}}


def padding_problem(small, large) -> str | None:
    """None when the dim whose size differs between the IRModules `small` and `large` can
    be padded (see the module docstring), else why not."""
    main_small, main_large = small["main"], large["main"]
    if len(main_small.bindings) != len(main_large.bindings) or len(main_small.params) != len(main_large.params):
        return (f"the programs of the two sizes differ in structure ({len(main_small.bindings)} and "
                f"{len(main_large.bindings)} ops)")
    varying: dict = {}  # large Var -> the axes carrying the dim
    for p_small, p_large in zip(main_small.params, main_large.params):
        axes = _varying_axes(p_small.type, p_large.type)
        if axes is None:
            return f"input {p_large.name_hint!r} has another rank in the two programs"
        varying[p_large] = axes
    for position, (b_small, b_large) in enumerate(zip(main_small.bindings, main_large.bindings)):
        v_small, v_large = b_small.value, b_large.value
        where = f"%{b_large.var.name_hint} (op #{position})"
        if not (isinstance(v_small, Call) and isinstance(v_large, Call)) or \
                getattr(v_small.op, "name", None) != getattr(v_large.op, "name", None):
            return f"{where}: the programs of the two sizes differ in structure"
        op = v_large.op.name
        arguments = []
        for arg_small, arg_large in zip(_flat(v_small.args), _flat(v_large.args)):
            if isinstance(arg_large, Constant):
                axes, problem = _constant_axes(arg_small, arg_large)
                if problem:
                    return f"{where} {op}: {problem}"
            else:
                axes = varying.get(arg_large, frozenset())
            arguments.append((arg_large, axes))
        out_axes = _varying_axes(b_small.var.type, b_large.var.type)
        if out_axes is None:
            return f"{where} {op}: its result has another rank in the two programs"
        problem = _mixes(op, v_small, v_large, arguments, out_axes, b_large.var.type)
        if problem:
            return f"{where} {op}: {problem}"
        varying[b_large.var] = out_axes
    return None


def _flat(args):
    for arg in args:
        if isinstance(arg, Tuple):
            yield from _flat(arg.fields)
        else:
            yield arg


def _varying_axes(small_type, large_type):
    """The axes whose extents differ (the union over a tuple's fields); None when ranks differ."""
    if isinstance(large_type, TupleType):
        if not isinstance(small_type, TupleType) or len(small_type.fields) != len(large_type.fields):
            return None
        axes = frozenset()
        for s, l in zip(small_type.fields, large_type.fields):
            field = _varying_axes(s, l)
            if field is None:
                return None
            axes |= field
        return axes
    if not isinstance(large_type, TensorType) or not isinstance(small_type, TensorType):
        return frozenset()
    if small_type.ndim != large_type.ndim:
        return None
    return frozenset(a for a, (s, l) in enumerate(zip(small_type.shape, large_type.shape)) if s != l)


def _constant_axes(small: Constant, large: Constant):
    """(the constant's axes of the dim, None) when the smaller program's constant is the start
    of the larger's (or equal), else (None, why not)."""
    if not isinstance(small, Constant):
        return None, "a constant in one program is computed in the other"
    a, b = np.asarray(small.data), np.asarray(large.data)
    if a.ndim != b.ndim or a.dtype != b.dtype:
        return None, "a constant has another rank or type in the two programs"
    axes = frozenset(i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y)
    if any(x > y for x, y in zip(a.shape, b.shape)):
        return None, "a constant is smaller in the program of the larger size"
    start = b[tuple(slice(0, x) for x in a.shape)]
    if not np.array_equal(start, a, equal_nan=a.dtype.kind == "f"):
        return None, (f"a constant {tuple(b.shape)} depends on the dim's size (it is not the same where both "
                      f"programs have it)")
    return axes, None


def _axis_list(value, ndim) -> list:
    if value is None:
        return list(range(ndim))
    values = value if isinstance(value, (list, tuple)) else [value]
    return [int(v) % ndim for v in values] if ndim else []


def _mixes(op: str, call_small, call_large, arguments: list, out_axes, out_type) -> str | None:
    """Why `op` would mix padded rows into the others, or None."""
    from ..ir.op import OP_REGISTRY
    attrs = call_large.attrs
    category = getattr(OP_REGISTRY.get(op), "category", "opaque")
    ins = [axes for _, axes in arguments]
    first = arguments[0][0] if arguments else None
    ndim = first.type.ndim if first is not None and isinstance(first.type, TensorType) else 0
    changed = sorted(k for k in set(attrs) | set(call_small.attrs) if call_small.attrs.get(k) != attrs.get(k))
    if set(changed) - _SHAPE_ATTRIBUTES.get(op, set()):
        # a value read off the dim's size (a clip bound, a trilu diagonal): not the same computation
        return f"its attributes {changed} depend on the dim's size"
    if category in ("elemwise", "broadcast") or op in _KEEP_ROWS_APART:
        out_ndim = out_type.ndim if isinstance(out_type, TensorType) else 0
        for (arg, axes) in arguments:
            rank = arg.type.ndim if isinstance(arg.type, TensorType) else 0
            if op in ("transpose", "expand_dims", "squeeze"):  # axes move: each varying one lands on a varying one
                continue
            if any(axis + out_ndim - rank not in out_axes for axis in axes):
                # a size-1 axis at the small size that broadcast against a fixed one
                return "it broadcasts the dim against an axis of fixed size"
        return None
    if category == "reduce":
        if op in ("argmax", "argmin"):
            reduced = {int(attrs["axis"]) % ndim}
        else:
            from ..ops.reduction import reduced_axes
            reduced = set(reduced_axes(op, attrs.get("axes") or (), ndim))  # () reduces every axis
        return f"it reduces over the dim (axis {sorted(reduced & ins[0])})" if reduced & ins[0] else None
    if op in ("softmax", "log_softmax", "cumsum", "gather_elements", "concat", "split"):
        axis = int(attrs["axis"]) % ndim
        if any(axis in axes for axes in ins):
            return f"it runs along the dim (axis {axis})"
        return None
    if op in ("layer_norm", "rms_norm"):
        normalized = set(range(int(attrs["axis"]) % ndim, ndim))
        return f"it normalizes over the dim (axes {sorted(normalized & ins[0])})" if normalized & ins[0] else None
    if op == "batch_norm":
        return "it runs along the dim (its channel axis)" if int(attrs["axis"]) % ndim in ins[0] else None
    if op == "matmul":
        a, b = arguments[0][0].type, arguments[1][0].type
        contracted_a = a.ndim - 1
        contracted_b = b.ndim - 2 if b.ndim >= 2 else 0
        if contracted_a in ins[0] or contracted_b in ins[1]:
            return "it sums over the dim (the contraction axis)"
        return None
    if op == "gather":
        axis = int(attrs["axis"]) % ndim
        return f"it indexes along the dim (axis {axis} of its data)" if axis in ins[0] else None
    if op in ("conv2d", "max_pool2d", "avg_pool2d", "global_avg_pool2d", "global_max_pool2d"):
        if ins[0] - {0} or any(ins[1:]):
            return "its window or channels run along the dim (only the batch axis can be padded)"
        return None
    if op == "strided_slice":
        axes = _axis_list(attrs.get("axes"), ndim)
        strides = attrs.get("strides") or [1] * len(axes)
        for axis, begin, end_small, end_large, stride in zip(axes, attrs["begin"], call_small.attrs["end"],
                                                            attrs["end"], strides):
            whole = begin == 0 and stride == 1 and end_small >= call_small.args[0].type.shape[axis] and \
                end_large >= first.type.shape[axis]
            if axis in ins[0] and not whole:
                return f"it slices part of the dim (axis {axis})"
        return None
    if op == "pad":
        pads = attrs["pads"]
        return "it pads along the dim" if any(pads[a] or pads[a + ndim] for a in ins[0]) else None
    if op == "tile":
        return "it repeats along the dim" if any(attrs["repeats"][a] != 1 for a in ins[0]) else None
    if op == "reshape":
        return _reshape_problem(first.type.shape, out_type.shape, ins[0], out_axes)
    return "byoc does not know whether it keeps a padded dim's rows apart"


def _reshape_problem(in_shape, out_shape, in_axes, out_axes) -> str | None:
    """None when the reshape keeps the dim the outermost factor of its group on both sides
    (the first b*S rows of [B*S, H] are the first b of [B, S, H]), else why not."""
    i = j = 0
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
                return "its groups of axes do not line up"
        for group, shape, axes in ((group_in, in_shape, in_axes), (group_out, out_shape, out_axes)):
            outer = next((a for a in group if shape[a] > 1), None)
            if set(group) & set(axes) - {outer}:
                return "it moves the dim inside other axes (padded rows would land between real ones)"
        if bool(set(group_in) & set(in_axes)) != bool(set(group_out) & set(out_axes)):
            return "it moves the dim into another group of axes"
    return None


def padded_axes(buckets: list, tensors: list, verdicts: dict) -> tuple:
    """Which axes of each bucket's caller tensors carry a paddable dim, as the runtime pads
    them: `buckets` the dims of each bucket, `tensors` each bucket's inputs then outputs as
    (name, shape), `verdicts` padding_problem's answer per dim (None: paddable). An axis
    carries dim D when its extent differs between two buckets that differ only in D; its
    extent must be the dim's size times a factor that is the same in every bucket (the
    runtime serves size s of a bucket of size S on that axis as factor * s of factor * S).
    Returns (per bucket, per tensor, per axis: the dim's name or None; the verdicts, with a
    dim whose axes do not scale so refused)."""
    verdicts = dict(verdicts)
    axes = [[[None] * len(shape) for _, shape in bucket_tensors] for bucket_tensors in tensors]
    for name, problem in list(verdicts.items()):
        if problem is not None:
            continue
        for number, dims in enumerate(buckets):
            other = next((o for o, d in enumerate(buckets)
                          if d[name] != dims[name] and all(d[k] == v for k, v in dims.items() if k != name)), None)
            if other is None:
                continue
            size, other_size = dims[name], buckets[other][name]
            for position, ((tensor, shape), (_, other_shape)) in enumerate(zip(tensors[number], tensors[other])):
                for axis, (extent, other_extent) in enumerate(zip(shape, other_shape)):
                    if extent == other_extent:
                        continue
                    if extent % size or extent * other_size != other_extent * size:
                        problem = (f"axis {axis} of {tensor!r} ({extent} at {name}={size}, {other_extent} at "
                                   f"{name}={other_size}) is not a multiple of the dim's size")
                    elif axes[number][position][axis] not in (None, name):
                        problem = f"axis {axis} of {tensor!r} carries {axes[number][position][axis]!r} too"
                    else:
                        axes[number][position][axis] = name
        if problem is not None:
            verdicts[name] = problem
            axes = [[[None if a == name else a for a in tensor] for tensor in bucket] for bucket in axes]
    return axes, verdicts
