"""UnflattenBatchTranspose: a transpose of the last two axes done on a tensor whose leading
axes were merged into one, and split again after, is that transpose on the tensor itself.

    %k3 = reshape(%k, shape=[-1, S, D])               (%k: [B, H, S, D])
    %kt3 = transpose(%k3, axes=[0, 2, 1])     ->      %kt = transpose(%k, axes=[0, 1, 3, 2])
    %kt = reshape(%kt3, shape=[B, H, D, S])

torch's ONNX exporter writes K^T of scaled_dot_product_attention this way (a 3-D
transpose between two reshapes); the fused attention pattern reads K^T as a transpose of
K's heads, and the two reshapes would be two more copies where no kernel fuses them.

Rewrites, in every function with a body, reshape(transpose(reshape(x, [N, a, b]), [0, 2, 1]),
[*lead, b, a]) where N = prod(lead), the inner reshape and the transpose each read only by
the next; the outer reshape becomes the 4-D (or n-D) transpose. Where x is not
[*lead, a, b] (grouped-query attention's repeated heads, [B, Hkv, G, S, D] against [B, H];
rotary embeddings' halves, [B, H, S, 2, D/2]), x is reshaped to [*lead, a, b] first (the
same elements in the same order), as repeat_kv writes it for the eager attention:

    %k3 = reshape(%k5, shape=[-1, S, D])               (%k5: [B, Hkv, G, S, D])
    %kt3 = transpose(%k3, axes=[0, 2, 1])     ->      %k = reshape(%k5, shape=[B, H, S, D])
    %kt = reshape(%kt3, shape=[B, H, D, S])           %kt = transpose(%k, axes=[0, 1, 3, 2])

Leaves alone: an outer reshape whose last two axes are not the transpose's (b, a) or
whose leading axes hold other than N elements, other permutations, intermediate values
read elsewhere.
"""
from __future__ import annotations

import math

from ..ir.expr import Binding, Call, Function, Var, is_op_call
from ..ir.module import IRModule
from .bindings import BindingIndex


def unflatten_batch_transpose(mod: IRModule) -> IRModule:
    return mod.map_bodies(_unflatten)


def _unflatten(function: Function) -> Function:
    table = BindingIndex(function)
    bindings = []
    for index, binding in enumerate(table.bindings):
        source = _unflattened_source(binding, index, table)
        if source is None:
            bindings.append(binding)
            continue
        *lead, columns, rows = binding.var.type.shape
        if tuple(source.type.shape) != (*lead, rows, columns):
            reshape = Call("reshape", [source], {"shape": [*lead, rows, columns]})
            source = Var(f"{binding.var.name_hint}_unflattened", reshape.type)
            bindings.append(Binding(source, reshape))
        rank = len(lead) + 2
        axes = list(range(rank - 2)) + [rank - 1, rank - 2]
        bindings.append(Binding(binding.var, Call("transpose", [source], {"axes": axes})))
    if len(bindings) == len(table.bindings) and all(a is b for a, b in zip(bindings, table.bindings)):
        return function
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)


def _unflattened_source(binding, index: int, bindings: BindingIndex):
    """x of reshape(transpose(reshape(x, [N, a, b]), [0, 2, 1]), [*lead, b, a]), or None."""
    def single_reader_producer(var, reader, op_name):
        if not isinstance(var, Var) or var not in bindings.producers or bindings.uses.get(var, []) != [reader]:
            return None
        position, value = bindings.producers[var]
        return (position, value) if is_op_call(value, (op_name,)) else None

    if not is_op_call(binding.value, ("reshape",)):
        return None
    transposed = single_reader_producer(binding.value.args[0], index, "transpose")
    if transposed is None or [int(a) % 3 for a in transposed[1].attrs["axes"]] != [0, 2, 1]:
        return None
    flattened = single_reader_producer(transposed[1].args[0], transposed[0], "reshape")
    if flattened is None:
        return None
    # reshape(x, [N, a, b]) is reshape(x, [*lead, a, b]) merged: row-major order is the
    # same whatever x's own shape (rotary embeddings leave K as [B, H, S, 2, D/2] halves)
    flat_shape = tuple(flattened[1].type.shape)
    if len(flat_shape) != 3:
        return None
    count, rows, columns = flat_shape
    *out_lead, out_columns, out_rows = binding.var.type.shape
    if (out_columns, out_rows) != (columns, rows) or math.prod(out_lead) != count or not out_lead:
        return None
    return flattened[1].args[0]
