"""UnbindStackedHeads: Q, K and V taken from a permuted view of the fused projection become
slices of the projection, each split into heads on its own.

timm's and torchvision's attention (ViT, DeiT, Swin, ...) write

    qkv = linear(x).reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)        (or qkv[0], qkv[1], qkv[2])

which the exporters emit as a reshape, a 5-D transpose and a split into squeezes or a gather
of each constant index. Run as written, the transpose copies the whole projection and each
piece is copied again; the fused attention pattern reads Q, K and V as head splits of
slices of the projection (transformers' form), in place. Piece i is that:

    %r = reshape(%x, [B, N, 3, H, D])                %qi = strided_slice(%x, begin=[i*H*D],
    %t = transpose(%r, [2, 0, 3, 1, 4])      ->             end=[(i+1)*H*D], axes=[-1])
    %pi = gather(%t, i)  (or squeeze(split(%t).i))   %ri = reshape(%qi, [B, N, H, D])
                                                     %pi = transpose(%ri, [0, 2, 1, 3])

Rewrites, in every function with a body, such a chain where the reshape splits only the
last axis of %x (its leading dims unchanged, the new ones G, then the rest), the transpose
moves G to the front and is read only by the pieces, and every reader of the transpose
takes one piece: gather of a scalar constant index along axis 0, or a split along axis 0
into pieces of 1 each of whose items is read only by a squeeze of axis 0. Leaves alone
every other reader of the transpose (the whole chain then stays) and reshapes that regroup
the leading dims.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, TupleGetItem, Var, is_op_call
from ..ir.module import IRModule
from .bindings import BindingIndex, rewrite_until_stable


def unbind_stacked_heads(mod: IRModule) -> IRModule:
    return mod.map_bodies(lambda function: rewrite_until_stable(function, _unbind_once))


def _unbind_once(function: Function) -> Function | None:
    table = BindingIndex(function)
    for index, binding in enumerate(table.bindings):
        found = _stacked(binding, index, table)
        if found is None:
            continue
        return _rewritten(function, table, *found)
    return None


def _stacked(binding, index, table):
    """(source %x, the reshape's shape, the axis of G in it, the transpose's axes,
    {binding index: piece}) for a transpose of the form above whose readers all take one
    piece; else None."""
    if not is_op_call(binding.value, ("transpose",)):
        return None
    reshaped = binding.value.args[0]
    if not isinstance(reshaped, Var) or reshaped not in table.producers or table.only_reader(reshaped) != index:
        return None
    _, reshape = table.producers[reshaped]
    if not is_op_call(reshape, ("reshape",)):
        return None
    source = reshape.args[0]
    lead = tuple(source.type.shape[:-1])
    shape = tuple(reshaped.type.shape)
    if not lead or shape[:len(lead)] != lead or len(shape) < len(lead) + 2:
        return None
    group_axis = len(lead)
    rank = len(shape)
    from ..ops.layout import _transpose_axes  # axes=() reverses the dims
    perm = list(_transpose_axes("transpose", binding.value.attrs["axes"], rank))
    if perm[0] != group_axis or shape[group_axis] < 2:
        return None
    pieces = {}
    for reader in table.uses.get(binding.var, []):
        if reader >= len(table.bindings):
            return None  # the function's result
        taken = _pieces_taken(table.bindings[reader], reader, binding.var, table)
        if taken is None:
            return None
        pieces.update(taken)
    return (source, shape, group_axis, perm, pieces) if pieces else None


def _pieces_taken(reader, reader_index, stacked, table):
    """{binding index of the value that is piece i: i} for one reader of the stacked
    tensor, or None where the reader is something else."""
    value = reader.value
    if is_op_call(value, ("gather",)) and value.args[0] is stacked and int(value.attrs["axis"]) == 0:
        index = value.args[1]
        if isinstance(index, Constant) and np.asarray(index.data).ndim == 0:
            piece = int(np.asarray(index.data))
            size = stacked.type.shape[0]
            if -size <= piece < size:
                return {reader_index: piece % size}
        return None
    if is_op_call(value, ("split",)) and int(value.attrs["axis"]) == 0 and all(int(s) == 1 for s in value.attrs["sizes"]):
        taken = {}
        for item_index in table.uses.get(reader.var, []):
            if item_index >= len(table.bindings):
                return None
            item = table.bindings[item_index]
            if not isinstance(item.value, TupleGetItem):
                return None
            squeezes = table.uses.get(item.var, [])
            if len(squeezes) != 1 or squeezes[0] >= len(table.bindings):
                return None
            squeeze = table.bindings[squeezes[0]].value
            if not is_op_call(squeeze, ("squeeze",)) or [int(a) for a in squeeze.attrs["axes"]] != [0]:
                return None
            taken[squeezes[0]] = item.value.index
        return taken
    return None


def _rewritten(function, table, source, shape, group_axis, perm, pieces):
    """The function with each piece's binding replaced by slice, reshape and transpose."""
    piece_size = math.prod(shape[group_axis + 1:])
    piece_shape = [size for axis, size in enumerate(shape) if axis != group_axis]
    piece_perm = [axis - (axis > group_axis) for axis in perm[1:]]
    last_axis = len(source.type.shape) - 1
    bindings = []
    for index, binding in enumerate(table.bindings):
        if index not in pieces:
            bindings.append(binding)
            continue
        piece, name = pieces[index], binding.var.name_hint
        sliced = Call("strided_slice", [source], {"begin": [piece * piece_size], "end": [(piece + 1) * piece_size],
                                                  "axes": [last_axis], "strides": [1]})
        sliced_var = Var(f"{name}_slice", sliced.type)
        reshaped = Call("reshape", [sliced_var], {"shape": piece_shape})
        reshaped_var = Var(f"{name}_heads", reshaped.type)
        bindings += [Binding(sliced_var, sliced), Binding(reshaped_var, reshaped),
                     Binding(binding.var, Call("transpose", [reshaped_var], {"axes": piece_perm}))]
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)
