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
  axis, and reshapes;
- where a reshape merges the dim with the axes outside it (GPT-2's Conv1D views [B, S, H] as
  [B*S, H] for its Gemm), each batch's padded rows lie between the real rows of the next: the
  analysis follows, per axis that carries the dim, the factor outside it (its layout), and
  lets such rows through ops that keep rows apart and line up operands of one layout (a row
  of one operand meets the same row of the other), until a reshape gives the dim its own
  axis again. An output must hold the dim leading its axis (the runtime cuts its padded rows
  off the end);
- no reduction, softmax or normalization, matmul contraction, concat, split, pad, cumsum or
  pooling window runs along it;
- every constant is the same in both, or (one of the dim's size: position ids, masks) the
  smaller one is the start of the larger;
- except where the padded elements provably add nothing: the runtime pads every input with
  zeros, and the analysis follows what the padded elements then hold (a constant, finite
  values, large negatives, or anything: `_Fill`). A softmax may run along the dim where its
  padded entries are large negatives (an attention mask input padded with zeros adds
  finfo.min to the padded keys; a causal mask hides every key after a real query), since
  their weights are then exactly zero; a contraction (probabilities times values) or a sum
  may run along it where the padded terms are exact zeros times finite values. So BERT's
  sequence pads, with its mask; an attention without one does not. A query row whose every
  real key the caller masks has no defined attention (uniform over whatever keys there
  are): such a row's result is not kept exact.
Otherwise it names the first op that mixes the padded rows into the others. Ops it does not
know count as mixing.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Tuple, TupleGetItem
from ..ir.types import TensorType, TupleType
from .padding_fills import (_ANY, _FINITE, _KEEP_ROWS_APART, _SHAPE_ATTRIBUTES, _Argument,
                            _constant_fills, _describe, _Fill, _is, _real_fill, _result_fills, _zero)
from .padding_layout import _result_layout

def padding_problem(small, large, output_names=None) -> str | None:
    """None when the dim whose size differs between the IRModules `small` and `large` can
    be padded (see the module docstring), else why not. `output_names`: the model's names of
    main's results, for the reasons that name one."""
    main_small, main_large = small["main"], large["main"]
    if len(main_small.bindings) != len(main_large.bindings) or len(main_small.params) != len(main_large.params):
        return (f"the programs of the two sizes differ in structure ({len(main_small.bindings)} and "
                f"{len(main_large.bindings)} ops)")
    varying: dict = {}  # large Var -> the axes carrying the dim
    layouts: dict = {}  # large Var -> {axis carrying the dim: the factor of the axis outside it (1: it leads)}
    fills: dict = {}  # large Var -> ({axis carrying the dim: what its padded elements may hold}, anywhere)
    reals: dict = {}  # large Var -> what its real elements may hold
    for p_small, p_large in zip(main_small.params, main_large.params):
        axes = _varying_axes(p_small.type, p_large.type)
        if axes is None:
            return f"input {p_large.name_hint!r} has another rank in the two programs"
        varying[p_large] = axes
        layouts[p_large] = {axis: 1 for axis in axes}
        zero = _Fill("const", _zero(p_large.type))  # the runtime pads every input with zeros
        fills[p_large] = ({axis: zero for axis in axes}, zero if axes else None)
        reals[p_large] = _FINITE  # the caller's data
    for position, (b_small, b_large) in enumerate(zip(main_small.bindings, main_large.bindings)):
        v_small, v_large = b_small.value, b_large.value
        where = f"%{b_large.var.name_hint} (op #{position})"
        if isinstance(v_small, TupleGetItem) and isinstance(v_large, TupleGetItem) and \
                v_small.index == v_large.index and v_large.tuple_value in varying:
            # a field of a split's result: it carries the dim where the tuple does
            out_axes = _varying_axes(b_small.var.type, b_large.var.type)
            source_fills, source_padded = fills.get(v_large.tuple_value, ({}, None))
            if out_axes is None or not out_axes <= varying[v_large.tuple_value]:
                return f"{where}: the programs of the two sizes differ in structure"
            varying[b_large.var] = out_axes
            layouts[b_large.var] = {axis: layouts.get(v_large.tuple_value, {}).get(axis, 1) for axis in out_axes}
            fills[b_large.var] = ({axis: source_fills.get(axis, _ANY) for axis in out_axes},
                                  source_padded if out_axes else None)
            reals[b_large.var] = reals.get(v_large.tuple_value, _ANY)
            continue
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
                arg_fills, arg_padded, arg_real = _constant_fills(arg_small, arg_large, axes)
                layout = {axis: 1 for axis in axes}  # the smaller constant is the start of the larger
            else:
                axes = varying.get(arg_large, frozenset())
                arg_fills, arg_padded = fills.get(arg_large, ({}, None))
                arg_real = reals.get(arg_large, _FINITE)
                layout = layouts.get(arg_large, {axis: 1 for axis in axes})
            arguments.append(_Argument(arg_large, axes, arg_fills, arg_padded, arg_real, layout, arg_small))
        out_axes = _varying_axes(b_small.var.type, b_large.var.type)
        if out_axes is None:
            return f"{where} {op}: its result has another rank in the two programs"
        problem = _mixes(op, v_small, v_large, arguments, out_axes, b_large.var.type)
        if problem:
            return f"{where} {op}: {problem}"
        problem, layouts[b_large.var] = _result_layout(op, v_large, arguments, out_axes, b_small.var.type,
                                                       b_large.var.type)
        if problem:
            return f"{where} {op}: {problem}"
        varying[b_large.var] = out_axes
        fills[b_large.var] = _result_fills(op, v_large, arguments, out_axes, b_large.var.type)
        reals[b_large.var] = _real_fill(op, v_large, arguments, b_large.var.type)
    results = main_large.result.fields if isinstance(main_large.result, Tuple) else (main_large.result,)
    for position, result in enumerate(results):
        if any(outer != 1 for outer in layouts.get(result, {}).values()):
            name = output_names[position] if output_names and position < len(output_names) else \
                getattr(result, "name_hint", None) or f"#{position}"
            return (f"output {name!r} holds the dim inside another axis (a reshape merged them): its padded "
                    f"rows lie between real ones, and the runtime cuts an output's padded rows off the end")
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
    ins = [argument.axes for argument in arguments]
    first = arguments[0].value if arguments else None
    ndim = first.type.ndim if first is not None and isinstance(first.type, TensorType) else 0
    changed = sorted(k for k in set(attrs) | set(call_small.attrs) if call_small.attrs.get(k) != attrs.get(k))
    if set(changed) - _SHAPE_ATTRIBUTES.get(op, set()):
        # a value read off the dim's size (a clip bound, a trilu diagonal): not the same computation
        return f"its attributes {changed} depend on the dim's size"
    if category in ("elemwise", "broadcast") or op in _KEEP_ROWS_APART:
        out_ndim = out_type.ndim if isinstance(out_type, TensorType) else 0
        for arg, axes, *_ in arguments:
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
        if op == "sum" and all(_is(arguments[0].fills.get(axis), "zero") for axis in reduced & ins[0]):
            return None  # the padded elements add nothing
        return f"it reduces over the dim (axis {sorted(reduced & ins[0])})" if reduced & ins[0] else None
    if op == "softmax" and int(attrs["axis"]) % ndim in ins[0]:
        # padded entries a mask drove to (nearly) minus infinity: their exp is exactly zero
        axis = int(attrs["axis"]) % ndim
        if _is(arguments[0].fills.get(axis), "vanishes"):
            return None
        return (f"it runs along the dim (axis {axis}), and its padded entries are "
                f"{_describe(arguments[0].fills.get(axis))}, not masked out (a mask input padded with zeros "
                f"would drive them to minus infinity)")
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
        a, b = arguments[0].value.type, arguments[1].value.type
        contracted_a = a.ndim - 1
        contracted_b = b.ndim - 2 if b.ndim >= 2 else 0
        if contracted_a in ins[0] or contracted_b in ins[1]:
            fill_a, fill_b = arguments[0].fills.get(contracted_a), arguments[1].fills.get(contracted_b)
            # padded terms that are exactly zero (a probability the mask zeroed) times finite ones
            if (_is(fill_a, "zero") and _is(fill_b, "finite")) or (_is(fill_b, "zero") and _is(fill_a, "finite")):
                return None
            return "it sums over the dim (the contraction axis)"
        return None
    if op == "gather":
        axis = int(attrs["axis"]) % ndim
        indices = arguments[1].value
        if axis in ins[0]:
            # index 0, a row every size run() serves (down to 1) has: BERT's pooler reads token 0
            if isinstance(indices, Constant) and not ins[1] and np.all(np.asarray(indices.data) == 0):
                return None
            return f"it indexes along the dim (axis {axis} of its data)"
        extent = first.type.shape[axis]
        for a in ins[1]:
            fill = arguments[1].fills.get(a)
            in_range = isinstance(indices, Constant) or (
                _is(fill, "const") and -extent <= int(fill.value) < extent and
                _is(arguments[1].padded, "const") and -extent <= int(arguments[1].padded.value) < extent)
            if not in_range:
                return "its padded indices are computed (they could be out of range)"
        return None
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
            # the first row at every size run() serves (down to 1): BERT's pooler reads token 0
            inside = begin == 0 and stride > 0 and end_small == end_large == 1
            if axis in ins[0] and not whole and not inside:
                return f"it slices part of the dim (axis {axis})"
        return None
    if op == "pad":
        pads = attrs["pads"]
        return "it pads along the dim" if any(pads[a] or pads[a + ndim] for a in ins[0]) else None
    if op == "tile":
        return "it repeats along the dim" if any(attrs["repeats"][a] != 1 for a in ins[0]) else None
    if op == "reshape":
        return None  # _result_layout follows where the dim's rows go
    return "byoc does not know whether it keeps a padded dim's rows apart"


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
    # an axis whose extent changes with two dims ([B*S, V]): neither can be padded along it
    # (the runtime pads one axis per dim), whatever the other's verdict
    changing: dict = {}  # (tensor position, axis) -> the dims its extent changes with
    for name in {n for dims in buckets for n in dims}:
        for number, dims in enumerate(buckets):
            for other, other_dims in enumerate(buckets):
                if other_dims[name] == dims[name] or any(other_dims[k] != v for k, v in dims.items() if k != name):
                    continue
                for position, ((_, shape), (_, other_shape)) in enumerate(zip(tensors[number], tensors[other])):
                    for axis, (extent, other_extent) in enumerate(zip(shape, other_shape)):
                        if extent != other_extent:
                            changing.setdefault((position, axis), set()).add(name)
    for (position, axis), names in sorted(changing.items()):
        if len(names) > 1:
            tensor = tensors[0][position][0]
            for name in sorted(names):
                if verdicts.get(name, "") is None:
                    verdicts[name] = (f"axis {axis} of {tensor!r} changes with {' and '.join(sorted(names))} "
                                      f"(their rows interleave)")
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
