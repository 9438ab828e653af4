"""RotateHalfAsView: rotary embeddings' rotate_half is one reversed view and a sign, not two
slices, a negation and a concat.

transformers writes rotary position embeddings (LLaMA, Mistral, Qwen2, Phi, GPT-NeoX,
Falcon, ModernBERT, ...) as `q * cos + rotate_half(q) * sin` with

    rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])

which the exporters emit as two slices, a negative and a concat: four kernels a rotation, on
Q and K of every layer. The halves swapped are x viewed as [..., 2, D/2] read backwards along
the 2, and the minus sign is a constant:

    %b = strided_slice(%x, begin=[h], end=[D], axes=[-1])       %r = reshape(%x, [..., 2, h])
    %a = strided_slice(%x, begin=[0], end=[h], axes=[-1])  ->   %f = strided_slice(%r, begin=[-1], ...,
    %n = negative(%b)                                                 strides=[-1])  (one copy)
    %c = concat(%n, %a, axis=-1)                                %s = reshape(%f, [..., D])
    %y = multiply(%c, sin)                                      %y = multiply(%s, sin * [-1.., 1..])

Where the rotation's only reader multiplies it by a constant, the sign goes into that
constant; else the rotation is multiply(%s, sign). The values are the same to the bit
(negation and multiplication by -1 are exact).

Rewrites, in every function with a body, concat(negative(x[..., h:2h]), x[..., 0:h]) along
the last axis of x, with 2h = x's last dim, forward unit-step slices, each intermediate read
only by the next. Leaves alone: other slices, concats along other axes, and intermediates
read elsewhere.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Var, is_op_call
from ..ir.module import IRModule
from ..ir.types import is_float, numpy_dtype
from .bindings import BindingIndex, rewrite_until_stable

REVERSED_END = -(2 ** 63 - 1)  # past the first element, reading backwards (ONNX Slice's convention)


def rotate_half_as_view(mod: IRModule) -> IRModule:
    return mod.map_bodies(lambda function: rewrite_until_stable(function, _rewrite_once))


def _rewrite_once(function: Function) -> Function | None:
    table = BindingIndex(function)
    for index, binding in enumerate(table.bindings):
        source = _rotated_half_source(binding, index, table)
        if source is None:
            continue
        rotary = _rotary(table, index, source)
        if rotary is not None:
            return _rewritten_rotary(function, table, index, source, *rotary)
        return _rewritten(function, table, index, source)
    return None


def _rotary(table, concat_index: int, source):
    """(the add's index, the cos operand, the sin operand) where the rotation feeds
    add(multiply(x, cos), multiply(rotate_half(x), sin)) (in any operand order), each
    product read only by the add and cos and sin varying at most along the last axis as x
    does (their last dim is x's); else None."""
    bindings = table.bindings
    concat = bindings[concat_index].var
    width = source.type.shape[-1]

    def product_of(var, reader):
        """(the other operand) of multiply(var, other) bound at `reader`, or None."""
        value = bindings[reader].value
        if not is_op_call(value, ("multiply",)):
            return None
        first, second = value.args
        other = second if first is var else first if second is var else None
        shape = getattr(getattr(other, "type", None), "shape", None)
        if other is None or other is var or shape is None or not shape or shape[-1] != width or \
                len(shape) > len(source.type.shape) or other.type.dtype != source.type.dtype:
            return None
        if tuple(bindings[reader].var.type.shape) != tuple(source.type.shape):
            return None
        return other

    sin_at = table.only_reader(concat)
    if sin_at is None or sin_at >= len(bindings):
        return None
    sin = product_of(concat, sin_at)
    add_at = table.only_reader(bindings[sin_at].var)
    if sin is None or add_at is None or add_at >= len(bindings) or not is_op_call(bindings[add_at].value, ("add",)):
        return None
    left, right = bindings[add_at].value.args
    other = left if right is bindings[sin_at].var else right if left is bindings[sin_at].var else None
    if not isinstance(other, Var) or other not in table.producers or table.only_reader(other) != add_at:
        return None
    cos_at = table.producers[other][0]
    cos = product_of(source, cos_at)
    if cos is None:
        return None
    return add_at, cos_at, sin_at, cos, sin


def _rewritten_rotary(function, table, concat_at, source, add_at, cos_at, sin_at, cos, sin):
    """The whole rotation in the halves' space [..., 2, D/2]: x and its reversed view times
    cos and the signed sin, added, then reshaped back (a view); one elementwise kernel that
    reads x twice in place."""
    shape = list(source.type.shape)
    half, rank = shape[-1] // 2, len(shape)
    dtype = numpy_dtype(source.type.dtype)
    binding = table.bindings[add_at]
    name = binding.var.name_hint
    new = []

    def halves_of(operand, hint, sign=False):
        operand_shape = list(operand.type.shape[:-1]) + [2, half]
        if isinstance(operand, Constant):
            data = np.asarray(operand.data).reshape(operand_shape)
            if sign:
                data = data * np.array([[-1.0], [1.0]], dtype)
            return Constant(np.ascontiguousarray(data.astype(operand.data.dtype)), operand.type.dtype)
        call = Call("reshape", [operand], {"shape": operand_shape})
        var = Var(f"{name}_{hint}_halves", call.type)
        new.append(Binding(var, call))
        if not sign:
            return var
        signed = Call("multiply", [var, Constant(np.array([[-1.0], [1.0]], dtype), source.type.dtype)])
        signed_var = Var(f"{name}_{hint}_signed", signed.type)
        new.append(Binding(signed_var, signed))
        return signed_var

    halves = Call("reshape", [source], {"shape": shape[:-1] + [2, half]})
    halves_var = Var(f"{name}_halves", halves.type)
    new.append(Binding(halves_var, halves))
    swapped = Call("strided_slice", [halves_var], {"begin": [-1], "end": [REVERSED_END], "axes": [rank - 1],
                                                    "strides": [-1]})
    swapped_var = Var(f"{name}_swapped_halves", swapped.type)
    new.append(Binding(swapped_var, swapped))
    cos_halves, sin_halves = halves_of(cos, "cos"), halves_of(sin, "sin", sign=True)
    terms = []
    for hint, operand, factor in (("cos_term", halves_var, cos_halves), ("sin_term", swapped_var, sin_halves)):
        call = Call("multiply", [operand, factor])
        var = Var(f"{name}_{hint}", call.type)
        new.append(Binding(var, call))
        terms.append(var)
    total = Call("add", terms)
    total_var = Var(f"{name}_halves_sum", total.type)
    new += [Binding(total_var, total), Binding(binding.var, Call("reshape", [total_var], {"shape": shape}))]
    # the products and the rotation (its concat, negation and slices, each read only by the
    # next) are gone; the new bindings go where the add was, after everything they read
    negation, first_half = table.bindings[concat_at].value.args
    negation_at, first_at = table.producers[negation][0], table.producers[first_half][0]
    second_at = table.producers[table.bindings[negation_at].value.args[0]][0]
    gone = {cos_at, sin_at, concat_at, negation_at, first_at, second_at}
    bindings = [b for i, b in enumerate(table.bindings) if i not in gone]
    at = next(i for i, b in enumerate(bindings) if b is binding)
    bindings[at:at + 1] = new
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)


def _rotated_half_source(binding, index: int, table: BindingIndex):
    """x of concat(negative(x[..., h:]), x[..., :h]) along x's last axis, or None."""
    value = binding.value
    if not is_op_call(value, ("concat",)) or len(value.args) != 2 or not is_float(binding.var.type.dtype):
        return None
    rank = len(binding.var.type.shape)
    if rank == 0 or int(value.attrs["axis"]) % rank != rank - 1:
        return None
    negated, first_half = value.args

    def single_reader_call(var, reader, name):
        if not isinstance(var, Var) or var not in table.producers or table.only_reader(var) != reader:
            return None
        at, call = table.producers[var]
        return (at, call) if is_op_call(call, (name,)) else None

    negation = single_reader_call(negated, index, "negative")
    first = single_reader_call(first_half, index, "strided_slice")
    if negation is None or first is None:
        return None
    second = single_reader_call(negation[1].args[0], negation[0], "strided_slice")
    if second is None:
        return None
    source = first[1].args[0]
    if second[1].args[0] is not source or tuple(source.type.shape) != tuple(binding.var.type.shape):
        return None
    width = source.type.shape[-1]
    if width % 2 or width == 0:
        return None
    half = width // 2
    if _last_axis_range(first[1], rank) != (0, half) or _last_axis_range(second[1], rank) != (half, width):
        return None
    return source


def _last_axis_range(call, rank: int):
    """(start, stop) of a forward unit-step slice of only the last axis, else None."""
    attrs = call.attrs
    axes = [int(a) % rank for a in attrs["axes"]] if attrs["axes"] else list(range(len(attrs["begin"])))
    steps = [int(s) for s in attrs["strides"]] or [1] * len(axes)
    if axes != [rank - 1] or steps != [1]:
        return None
    size = call.args[0].type.shape[-1]
    start, stop, _ = slice(int(attrs["begin"][0]), int(attrs["end"][0]), 1).indices(size)
    return start, stop


def _rewritten(function, table, index, source):
    binding = table.bindings[index]
    shape = list(source.type.shape)
    half, rank = shape[-1] // 2, len(shape)
    name = binding.var.name_hint
    halves = Call("reshape", [source], {"shape": shape[:-1] + [2, half]})
    halves_var = Var(f"{name}_halves", halves.type)
    swapped = Call("strided_slice", [halves_var], {"begin": [-1], "end": [REVERSED_END], "axes": [rank - 1],
                                                    "strides": [-1]})
    swapped_var = Var(f"{name}_swapped_halves", swapped.type)
    unsigned_call = Call("reshape", [swapped_var], {"shape": shape})
    dtype = numpy_dtype(source.type.dtype)
    sign = np.concatenate([-np.ones(half), np.ones(half)]).astype(dtype)
    bindings = list(table.bindings)
    readers = table.uses.get(binding.var, [])
    scaled = _constant_multiply(bindings, readers, binding.var)
    new = [Binding(halves_var, halves), Binding(swapped_var, swapped)]
    if scaled is not None:  # the sign goes into the one constant the rotation is multiplied by
        reader_index, position, constant = scaled
        unsigned_var = Var(f"{name}_unsigned", unsigned_call.type)
        new.append(Binding(unsigned_var, unsigned_call))
        signed = Constant(np.asarray(constant.data) * sign, constant.type.dtype)
        reader = bindings[reader_index]
        args = list(reader.value.args)
        args[1 - position] = signed
        args[position] = unsigned_var
        bindings[reader_index] = Binding(reader.var, Call("multiply", args, reader.value.attrs))
        bindings[index:index + 1] = new  # the concat is gone (its one reader reads the view)
    else:
        unsigned_var = Var(f"{name}_unsigned", unsigned_call.type)
        new += [Binding(unsigned_var, unsigned_call),
                Binding(binding.var, Call("multiply", [unsigned_var, Constant(sign, source.type.dtype)]))]
        bindings[index:index + 1] = new
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)


def _constant_multiply(bindings, readers, var):
    """(reader index, position of `var` in it, the constant) where `var`'s only reader is a
    multiply by a constant of its dtype that does not broadcast `var` itself; else None."""
    if len(readers) != 1 or readers[0] >= len(bindings):
        return None
    reader = bindings[readers[0]]
    if not is_op_call(reader.value, ("multiply",)):
        return None
    for position in (0, 1):
        other = reader.value.args[1 - position]
        if reader.value.args[position] is var and isinstance(other, Constant) and \
                other.type.dtype == var.type.dtype and tuple(reader.var.type.shape) == tuple(var.type.shape) and \
                len(other.type.shape) <= len(var.type.shape):
            return readers[0], position, other
    return None
