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
        return _rewritten(function, table, index, source)
    return None


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
