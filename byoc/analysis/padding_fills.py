"""The padding analysis (analysis/padding.py): what the elements where a dim is padded may
hold as they flow through the ops. The runtime pads every input with zeros; a constant,
finite values, large negatives (a softmax gives them exactly zero weight) or anything."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..ir.expr import Constant
from ..ir.types import TensorType

# ops that compute each output element from the input elements at the same index
# (broadcasting), or only move elements without combining them along any axis
_KEEP_ROWS_APART = {"transpose", "broadcast_to", "expand_dims", "squeeze", "trilu", "device_copy", "on_device",
                    "identity"}
# ops outside the elemwise/broadcast categories whose result element is computed from the
# operands' elements at its own index (broadcasting from the right)
_ELEMENTWISE_LIKE = {"where", "trilu", "device_copy", "on_device", "identity"}
# attributes that only say shapes (they differ between the sizes where the dim is in them)
_SHAPE_ATTRIBUTES = {"reshape": {"shape"}, "broadcast_to": {"shape"}, "strided_slice": {"end"}}


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
