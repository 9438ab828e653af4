"""SimplifyIdentityGather: a gather that takes every slice of its axis once, in order, is a
reshape.

    %g = gather(%x, const([[0, 1, ..., n-1]]), axis=a)   ->   %g = reshape(%x, shape=S)

Exporters write index arithmetic where a view would do: transformers builds its padding
mask with per-position index functions (`mask[batch_idx, kv_idx]`), which the TorchScript
exporter emits as a Gather of the flattened mask at `arange(batch) * seq + arange(seq)`,
a constant once FoldConstant has run. Left as it is, every model pays a gather kernel and
the mask's elementwise preparation is split around it.

Rewrites, in every function with a body, `gather(%x, c, axis=a)` where c is a constant
whose values, read in row-major order, are 0, 1, ..., n-1 with n = %x's extent along a;
the result keeps the gather's type: S = %x.shape[:a] + c.shape + %x.shape[a+1:]. Leaves
alone indices that repeat, skip, wrap (negative) or permute, and non-constant indices.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, is_op_call
from ..ir.module import IRModule
from ..ir.types import TensorType


def simplify_identity_gather(mod: IRModule) -> IRModule:
    return mod.map_bodies(_simplify)


def _simplify(function: Function) -> Function:
    bindings, changed = [], False
    for binding in function.bindings:
        value = binding.value
        if is_op_call(value, ("gather",)) and _is_identity(value):
            shape = list(binding.var.type.shape)
            bindings.append(Binding(binding.var, Call("reshape", [value.args[0]], {"shape": shape})))
            changed = True
        else:
            bindings.append(binding)
    if not changed:
        return function
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)


def _is_identity(gather: Call) -> bool:
    data, indices = gather.args
    if not isinstance(indices, Constant) or not isinstance(data.type, TensorType) or data.type.ndim == 0:
        return False
    axis = gather.attrs.get("axis", 0) % data.type.ndim
    extent = data.type.shape[axis]
    values = indices.data.reshape(-1)
    return isinstance(extent, int) and values.size == extent and \
        bool(np.array_equal(values, np.arange(extent, dtype=values.dtype)))
