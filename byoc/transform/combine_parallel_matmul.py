"""CombineParallelMatmul: matmuls that read the same input with constant weights become
one matmul over the weights side by side, and each reader takes its columns back as a
last-axis slice.

    %q = matmul(%x, Wq)                       %qkv = matmul(%x, concat(Wq, Wk, Wv))
    %qb = add(%q, bq)                ->       %qkvb = add(%qkv, concat(bq, bk, bv))
    %k = matmul(%x, Wk)                       %qb = strided_slice(%qkvb, begin=[0], end=[Nq], axes=[-1])
    %kb = add(%k, bk)                         %kb = strided_slice(%qkvb, begin=[Nq], end=[Nq+Nk], ...)
    %v = matmul(%x, Wv)                       %v = strided_slice(%qkvb, begin=[Nq+Nk], end=[N], ...)

Why: the Q, K and V projections of BERT or ViT at batch 1 are three GEMMs of 128 rows, each
too small to fill an H100 (a few dozen tiles for 132 SMs); one GEMM three times as wide
fills it in about the time of one of them. The attention pattern reads Q, K and V in place
as slices of one buffer (backends/cutlass/attention.py), so the slices cost no copy there.
This is TVM's CombineParallelDense.

Rewrites, in every function with a body, each group of two or more `matmul(%x, W)` calls
that read the same variable %x, where every W is a 2-D Constant of one dtype and one K and
every N is a multiple of 8 (so that each slice starts on a 16-byte boundary, which vector
loads and TMA need of a row's start). A member whose matmul is read only by `add(mm, b)`
(either order) with a constant vector b of length N carries its bias into the combined
add; when some members have a bias, the others get zeros there. The combined call is
placed where the first member was; a member's result variable (its add's, or its
matmul's) is then bound to its slice.

Leaves alone: matmuls whose weight is not a constant (batched attention matmuls), weights
of other ranks, a group of one, and everything after the bias (activations and residual
adds stay per member, after the slice). Unused bindings are left to dead_code_elimination.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Var, is_op_call
from ..ir.module import IRModule
from ..ir.types import TensorType
from .fuse_ops_by_pattern import _uses

# A slice starts on a 16-byte boundary of a 2-byte element only at multiples of 8.
COLUMN_ALIGNMENT = 8


def combine_parallel_matmul(mod: IRModule) -> IRModule:
    return mod.map_bodies(_combine)


def _weight(call: Call):
    """The [K, N] constant weight of `matmul(x, W)`, or None."""
    weight = call.args[1]
    if not isinstance(weight, Constant) or not isinstance(weight.type, TensorType) or weight.type.ndim != 2:
        return None
    return weight


def _combine(function: Function) -> Function:
    bindings = list(function.bindings)
    uses = _uses(function)
    groups: dict = {}  # input var -> [binding index of each member matmul]
    for index, binding in enumerate(bindings):
        value = binding.value
        if is_op_call(value, ("matmul",)) and isinstance(value.args[0], Var) and _weight(value) is not None \
                and isinstance(value.args[0].type, TensorType) and value.args[0].type.ndim >= 2:
            groups.setdefault(value.args[0], []).append(index)

    combined = [members for members in (_compatible(bindings, members) for members in groups.values())
                if len(members) >= 2]
    weights = _side_by_side([[_weight(bindings[index].value) for index in members] for members in combined])
    replaced: dict[int, list] = {}  # binding index -> the bindings that take its place
    for members, weight in zip(combined, weights):
        replaced.update(_plan(bindings, members, uses, weight))
    if not replaced:
        return function
    rebuilt = []
    for index, binding in enumerate(bindings):
        if index in replaced:
            rebuilt.extend(replaced[index])
        else:
            rebuilt.append(binding)
    return Function(function.params, rebuilt, function.result, function.ret_type, function.attrs)


def _compatible(bindings, members) -> list:
    """The members that share the first one's weight dtype and K, with aligned N."""
    first = _weight(bindings[members[0]].value)
    kept = []
    for index in members:
        weight = _weight(bindings[index].value)
        k, n = weight.type.shape
        if weight.type.dtype == first.type.dtype and k == first.type.shape[0] and n % COLUMN_ALIGNMENT == 0:
            kept.append(index)
    return kept


def _bias_of(bindings, index, uses):
    """(add's binding index, the bias Constant) when the matmul at `index` is read only by
    add(mm, b) with a constant vector b of its N; else None."""
    var = bindings[index].var
    readers = uses.get(var, [])
    if len(readers) != 1 or readers[0] >= len(bindings):
        return None
    reader = bindings[readers[0]].value
    if not is_op_call(reader, ("add",)):
        return None
    other = [arg for arg in reader.args if arg is not var]
    n = var.type.shape[-1]
    if len(other) != 1 or not isinstance(other[0], Constant) or tuple(other[0].type.shape) != (n,) or \
            bindings[readers[0]].var.type != var.type:
        return None
    return readers[0], other[0]


def _side_by_side(groups: list) -> list:
    """Each group's weights side by side, one Constant each. On several threads (NumPy's
    copies let go of the GIL): the groups of a 1 GB decoder are 16 copies of 30-70 MB, a
    strided copy each, and its warm build waits for them."""
    from ..threads import map_on_threads
    return map_on_threads(lambda weights: Constant(np.concatenate([np.asarray(w.data) for w in weights], axis=1),
                                                   weights[0].type.dtype), groups)


def _plan(bindings, members, uses, combined_weight: Constant) -> dict:
    first_call = bindings[members[0]].value
    source = first_call.args[0]
    widths = [int(_weight(bindings[index].value).type.shape[1]) for index in members]
    biases = [_bias_of(bindings, index, uses) for index in members]
    name = bindings[members[0]].var.name_hint + "_combined"

    matmul = Call(first_call.op, [source, combined_weight], dict(first_call.attrs))
    combined = Var(name, matmul.type)
    new = [Binding(combined, matmul)]
    if any(bias is not None for bias in biases):
        bias_dtype = next(bias[1].type.dtype for bias in biases if bias is not None)
        parts = [np.asarray(bias[1].data) if bias is not None else np.zeros(width, np.dtype(bias_dtype))
                 for bias, width in zip(biases, widths)]
        add = Call("add", [combined, Constant(np.concatenate(parts), bias_dtype)])
        with_bias = Var(name + "_bias", add.type)
        new.append(Binding(with_bias, add))
        combined = with_bias

    plan: dict[int, list] = {}
    axis = combined.type.ndim - 1
    begin = 0
    for index, width, bias in zip(members, widths, biases):
        piece = Call("strided_slice", [combined], {"begin": [begin], "end": [begin + width], "axes": [axis]})
        begin += width
        if bias is not None:
            add_index = bias[0]
            new.append(Binding(bindings[add_index].var, piece))
            plan[add_index] = []
        else:
            new.append(Binding(bindings[index].var, piece))
        plan.setdefault(index, [])
    plan[members[0]] = new
    return plan
