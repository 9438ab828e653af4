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

from typing import NamedTuple

import numpy as np

from ..ir.expr import Call, Constant, Tuple, TupleGetItem
from ..ir.types import TensorType, TupleType

# ops that compute each output element from the input elements at the same index
# (broadcasting), or only move elements without combining them along any axis
_KEEP_ROWS_APART = {"transpose", "broadcast_to", "expand_dims", "squeeze", "trilu", "device_copy", "on_device",
                    "identity"}
# ops outside the elemwise/broadcast categories whose result element is computed from the
# operands' elements at its own index (broadcasting from the right)
_ELEMENTWISE_LIKE = {"where", "trilu", "device_copy", "on_device", "identity"}
# attributes that only say shapes (they differ between the sizes where the dim is in them)
_SHAPE_ATTRIBUTES = {"reshape": {"shape"}, "broadcast_to": {"shape"}, "strided_slice": {"end"}}


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


class _Argument(NamedTuple):
    value: object  # the large program's argument
    axes: frozenset  # its axes carrying the dim
    # axis -> _Fill: what its elements padded along that axis (and real along the others
    # carrying the dim) may hold: what the real rows of the ops after it read
    fills: dict
    padded: object  # _Fill: what any padded element may hold (None: none is)
    real: object  # _Fill: what its real elements hold
    layout: dict  # axis carrying the dim -> the factor of that axis outside the dim (1: the dim leads it)
    small: object  # the smaller program's argument


class _Fill(NamedTuple):
    """What the elements where the dim is padded may hold (the runtime pads each input with
    zeros): "const" (all equal to `value`), "finite", "vanish" (at most -1e4, or minus
    infinity: a softmax gives them exactly zero weight), "bounded" (finite or vanishing: no
    NaN, no plus infinity), or "any"."""
    kind: str
    value: object = None


_ANY, _FINITE, _VANISH, _BOUNDED = _Fill("any"), _Fill("finite"), _Fill("vanish"), _Fill("bounded")
# A mask value this low gives exactly zero weight after a softmax: exp(-6e4 + score - max)
# underflows to 0.0 in float32 unless a score exceeds the row's maximum by 59,000. HF
# masks add finfo.min (float32 -3.4e38, float16 -65504, or minus infinity).
_VANISHING = -6e4
# elementwise ops that keep finite inputs finite
_FINITE_OPS = {"add", "subtract", "multiply", "maximum", "minimum", "negative", "abs", "relu", "gelu", "tanh",
               "sigmoid", "erf", "silu", "cast", "clip", "identity", "sin", "cos", "round", "floor", "ceil",
               "sign", "hard_sigmoid", "hard_swish", "leaky_relu", "elu", "softplus", "equal", "not_equal", "less",
               "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_xor", "logical_not",
               "where", "device_copy", "on_device", "trilu"}


def _zero(type_):
    return False if isinstance(type_, TensorType) and type_.dtype == "bool" else 0


def _is(fill, what: str) -> bool:
    if fill is None or fill.kind == "any":
        return False
    value = float(fill.value) if fill.kind == "const" else None
    if what == "const":
        return fill.kind == "const"
    if what == "zero":
        return fill.kind == "const" and value == 0.0
    if what == "finite":
        return fill.kind == "finite" or (value is not None and np.isfinite(value))
    if what == "vanishes":
        return fill.kind == "vanish" or (value is not None and value <= _VANISHING)
    if what == "no_nan":
        return _is(fill, "finite") or _is(fill, "vanishes") or fill.kind == "bounded"
    raise ValueError(what)


def _describe(fill) -> str:
    if fill is None:
        return "unknown"
    return f"{fill.value!r}" if fill.kind == "const" else {"finite": "finite values", "vanish": "large negatives",
                                                             "bounded": "finite or large negatives"}.get(fill.kind,
                                                                                                         "unknown")


def _join(fills) -> "_Fill":
    fills = list(fills)
    if not fills:
        return _FINITE
    if all(f == fills[0] for f in fills) and fills[0].kind != "const" or \
            all(f.kind == "const" and f.value == fills[0].value for f in fills):
        return fills[0]
    for what, fill in (("finite", _FINITE), ("vanishes", _VANISH), ("no_nan", _BOUNDED)):
        if all(_is(f, what) for f in fills):
            return fill
    return _ANY


def _classify(data) -> "_Fill":
    values = np.asarray(data)
    if values.size == 0:
        return _FINITE
    if values.dtype.kind in "biu":
        first = values.reshape(-1)[0].item()
        return _Fill("const", first) if np.all(values == values.reshape(-1)[0]) else _FINITE
    numbers = values.astype(np.float64)
    first = numbers.reshape(-1)[0]
    if not np.isnan(first) and np.all(numbers == first):
        return _Fill("const", float(first))
    finite = np.isfinite(numbers)
    vanish = numbers <= _VANISHING
    if finite.all():
        return _FINITE
    if vanish.all():
        return _VANISH
    return _BOUNDED if (finite | vanish).all() else _ANY


def _constant_fills(small: Constant, large: Constant, axes) -> tuple:
    """What the larger program's constant holds where it extends the smaller's: (per axis,
    padded along it and real along the others; anywhere padded; its real elements)."""
    a, b = np.asarray(small.data), np.asarray(large.data)
    real = tuple(slice(0, extent) for extent in a.shape)
    fills = {}
    for axis in axes:
        index = list(real)
        index[axis] = slice(a.shape[axis], None)
        fills[axis] = _classify(b[tuple(index)])
    outside = np.ones(b.shape, bool)
    outside[real] = False
    return fills, (_classify(b[outside]) if axes else None), _classify(a)


def _whole(argument: "_Argument") -> "_Fill":
    """What any element of the argument may hold."""
    return argument.real if argument.padded is None else _join([argument.real, argument.padded])


def _result_fills(op: str, call, arguments: list, out_axes, out_type) -> tuple:
    """What the result's padded elements may hold: (per axis carrying the dim, padded along
    it and real along the others; anywhere padded). An over-approximation: "any" where unsure."""
    from ..ir.op import OP_REGISTRY
    if not out_axes:
        return {}, None
    wholes = [_whole(argument) for argument in arguments]
    if op == "split":  # each part keeps the input's axes (_mixes refused a split along the dim)
        return {axis: arguments[0].fills.get(axis, _ANY) for axis in out_axes}, arguments[0].padded or _ANY
    if not isinstance(out_type, TensorType):
        whole = _join(wholes)
        return {axis: whole for axis in out_axes}, whole
    category = getattr(OP_REGISTRY.get(op), "category", "opaque")
    out_ndim = out_type.ndim
    if category in ("elemwise", "broadcast") or op in _ELEMENTWISE_LIKE:
        fills = {}
        for axis in out_axes:
            operands = []
            for argument in arguments:
                rank = argument.value.type.ndim if isinstance(argument.value.type, TensorType) else 0
                own = axis - (out_ndim - rank)
                operands.append(argument.fills[own] if own in argument.fills else argument.real)
            fills[axis] = _elementwise_fill(op, call, arguments, operands)
        return fills, _elementwise_fill(op, call, arguments, wholes)
    first = arguments[0]
    if op == "transpose":
        perm = call.attrs.get("axes") or list(reversed(range(out_ndim)))
        return {axis: first.fills.get(int(perm[axis]), _ANY) for axis in out_axes}, first.padded or _ANY
    if op == "softmax":
        axis = int(call.attrs["axis"]) % out_ndim
        # a padded row also reads entries padded along the softmax axis too: `padded`
        rows = {a: _FINITE if _is(first.fills.get(a), "no_nan") and _is(first.padded, "no_nan") else _ANY
                for a in out_axes}
        if axis in rows:
            rows[axis] = _Fill("const", 0.0)  # _mixes let it through: the mask drove them to minus infinity
        return rows, _FINITE if _is(wholes[0], "no_nan") else _ANY
    if op == "pad" and any(call.attrs["pads"]):
        # the padded rows' new elements hold the pad value (or, reflected or edge, their neighbours')
        added = _classify(np.asarray(call.attrs.get("value", 0.0))) if call.attrs.get("mode", "constant") == \
            "constant" else _join([*first.fills.values(), first.real])
        carried = sorted(first.fills)
        if len(carried) == len(out_axes):
            return ({axis: _join([first.fills[own], added]) for axis, own in zip(sorted(out_axes), carried)},
                    _join([first.padded or _ANY, added]))
        return {axis: _ANY for axis in out_axes}, _ANY
    if op in ("reshape", "expand_dims", "squeeze", "broadcast_to", "strided_slice", "tile", "pad"):
        # they keep the order of the axes that carry the dim: the k-th of the result's is the k-th of the input's
        carried = sorted(first.fills)
        if len(carried) == len(out_axes):
            return {axis: first.fills[own] for axis, own in zip(sorted(out_axes), carried)}, first.padded or _ANY
        whole = _join([*first.fills.values(), first.padded or _ANY])
        return {axis: whole for axis in out_axes}, whole
    if op == "gather":
        rows = first.real if not first.fills else _join([first.real, first.padded or _ANY])
        return {axis: rows for axis in out_axes}, rows
    # matmul, normalizations, reductions over other axes, convolutions, pooling: finite in, finite out
    finite = _FINITE if all(_is(whole, "finite") for whole in wholes) else _ANY
    return {axis: finite for axis in out_axes}, finite


def _real_fill(op: str, call, arguments: list, out_type) -> "_Fill":
    """What the result's real elements may hold (as the unpadded program computes them)."""
    from ..ir.op import OP_REGISTRY
    reals = [argument.real for argument in arguments]
    if not isinstance(out_type, TensorType):
        return _join(reals)
    category = getattr(OP_REGISTRY.get(op), "category", "opaque")
    if category in ("elemwise", "broadcast") or op in _ELEMENTWISE_LIKE:
        return _elementwise_fill(op, call, arguments, reals)
    if op == "softmax":
        return _FINITE if all(_is(r, "no_nan") for r in reals) else _ANY
    if op in ("transpose", "reshape", "expand_dims", "squeeze", "broadcast_to", "strided_slice", "tile", "split",
              "concat", "gather"):
        return _join(reals)
    return _FINITE if all(_is(r, "finite") for r in reals) else _ANY


def _elementwise_fill(op: str, call, arguments: list, operands: list) -> "_Fill":
    """The elementwise op's result where one operand is padded (`operands`: what each
    operand holds there)."""
    if op == "where":
        condition, if_true, if_false = operands
        if condition.kind == "const":
            return if_true if condition.value else if_false
        return _join([if_true, if_false])
    if op == "logical_and" and any(f.kind == "const" and not f.value for f in operands):
        return _Fill("const", False)
    if op == "logical_or" and any(f.kind == "const" and f.value for f in operands):
        return _Fill("const", True)
    if op == "multiply" and any(_is(f, "zero") for f in operands) and all(_is(f, "finite") for f in operands):
        return _Fill("const", 0.0)
    if operands and all(f.kind == "const" for f in operands):
        from ..ir.op import OP_REGISTRY
        from ..ir.types import numpy_dtype
        try:
            values = [np.asarray(f.value, dtype=numpy_dtype(a.value.type.dtype)) for f, a in zip(operands, arguments)]
            result = np.asarray(OP_REGISTRY[op].reference(*values, **call.attrs)).reshape(-1)[0].item()
            return _ANY if isinstance(result, float) and np.isnan(result) else _Fill("const", result)
        except Exception:  # noqa: BLE001 - an op whose reference needs more than scalars: say less
            pass
    if op in ("add", "subtract") and len(operands) == 2:
        first, second = operands
        if _is(first, "vanishes") and _is(second, "finite"):
            return _VANISH  # a large negative plus a finite score stays a large negative
        if op == "add" and _is(second, "vanishes") and _is(first, "finite"):
            return _VANISH
        if _is(first, "no_nan") and (_is(second, "finite") or (op == "add" and _is(second, "no_nan"))) and \
                not (_is(first, "finite") and _is(second, "finite")):
            return _BOUNDED  # no plus infinity to meet a minus one
    if op == "multiply" and len(operands) == 2:
        for scaled, scale in (operands, operands[::-1]):
            if _is(scaled, "vanishes") and scale.kind == "const" and 1.0 <= float(scale.value) < np.inf:
                return _VANISH  # scaled up, still at most -1e4
    if op in ("cast", "device_copy", "on_device", "identity") and _is(operands[0], "vanishes"):
        # to a float type: a large negative stays one (or becomes minus infinity)
        return _VANISH if str(call.attrs.get("dtype", "float")).startswith(("float", "bfloat")) else _ANY
    if op == "exp" and _is(operands[0], "vanishes"):
        return _Fill("const", 0.0)
    if op in _FINITE_OPS and all(_is(f, "finite") for f in operands):
        return _FINITE
    if op in ("maximum", "minimum", "cast", "where") and all(_is(f, "no_nan") for f in operands):
        return _BOUNDED
    return _ANY


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
