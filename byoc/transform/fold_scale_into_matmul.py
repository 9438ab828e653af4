"""FoldScaleIntoMatmul: a per-channel constant scale of a GEMM's output goes into its weight.

    %y = matmul(%x, W)                            %y = matmul(%x, W * s)
    %z = add(%y, b)                       ->      %z = add(%y, b * s)
    %t = transpose(%z, axes=[0, 3, 1, 2])         %t = transpose(%z, axes=[0, 3, 1, 2])
    %u = multiply(s', %t)                         (%u is %t; its readers read %t)

where s' holds one value per output channel of the matmul (N of W's [K, N]) along the axis
that channel lands on after the optional transpose, and s is those values as a vector.
(x W + b) s = x (W s) + b s: the scale is computed once at build time and the run does one
kernel less per block. ConvNeXt's and CaiT's layer scale (`gamma * x` after the MLP) is
this form, through the permute back to channels-first; the residual add that follows then
reads the GEMM directly and fuses into its epilogue.

Rewrites, in every function with a body, multiply(s', y) or multiply(y, s') with s' a
floating-point Constant of more than one element and y (through at most one transpose) a
matmul by a constant 2-D weight, or such a matmul plus a constant bias along the last axis,
each intermediate read only by the next, s' of y's dtype and shape broadcasting to y's
along one axis only: the one holding the matmul's N. Leaves alone: scales along other
axes, computed weights or scales, intermediates read elsewhere, scalar scales
(HoistScalarFactors' and FoldConstant's), and, given `underflow_below` (the smallest normal
number of the precision the build converts to: float16's 6.1e-5), a scale that would take
a weight or bias element from a normal number below it (a layer scale of 1e-6 times weights
of 0.02 is zero in float16, where the unfolded product keeps it).
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Var, is_op_call
from ..ir.module import IRModule
from ..ir.types import is_float
from .bindings import BindingIndex, rewrite_until_stable


def fold_scale_into_matmul(mod: IRModule, underflow_below: float | None = None) -> IRModule:
    return mod.map_bodies(lambda function: rewrite_until_stable(
        function, lambda f: _fold_once(f, underflow_below)))


def _fold_once(function: Function, underflow_below: float | None) -> Function | None:
    table = BindingIndex(function)
    bindings = table.bindings
    for index, binding in enumerate(bindings):
        if not is_op_call(binding.value, ("multiply",)) or not is_float(binding.var.type.dtype):
            continue
        for position in (0, 1):
            scale, scaled = binding.value.args[position], binding.value.args[1 - position]
            folded = _fold(scale, scaled, index, table, underflow_below)
            if folded is None:
                continue
            for at, new_binding in folded:
                bindings[at] = new_binding
            # the multiply is gone: the value it scaled (read by it alone) takes its name
            produced_at = table.producers[scaled][0]
            bindings[produced_at] = Binding(binding.var, bindings[produced_at].value)
            del bindings[index]
            return Function(function.params, bindings, function.result, function.ret_type, function.attrs)
    return None


def _fold(scale, scaled, multiply_index: int, table: BindingIndex, underflow_below: float | None):
    """[(binding index, new binding)] that put the scale into the weight and bias, or None."""
    if not isinstance(scale, Constant) or scale.type.size <= 1 or scale.type.dtype != scaled.type.dtype:
        return None
    if tuple(np.broadcast_shapes(scale.type.shape, scaled.type.shape)) != tuple(scaled.type.shape):
        return None
    chain = _producer_chain(scaled, multiply_index, table)
    if chain is None:
        return None
    matmul_index, bias_index, transpose_index = chain
    matmul = table.bindings[matmul_index]
    weight = matmul.value.args[1]
    channels = weight.type.shape[1]
    # the axis of `scaled` that holds the matmul's last axis (its N)
    rank = len(scaled.type.shape)
    channel_axis = rank - 1
    if transpose_index is not None:
        from ..ops.layout import _transpose_axes  # axes=() reverses the dims
        axes = list(_transpose_axes("transpose", table.bindings[transpose_index].value.attrs["axes"], rank))
        channel_axis = axes.index(rank - 1)
    padded = (1,) * (rank - len(scale.type.shape)) + tuple(scale.type.shape)
    if any(size != 1 for axis, size in enumerate(padded) if axis != channel_axis) or padded[channel_axis] != channels:
        return None
    vector = np.asarray(scale.data).reshape(channels)
    replacements = []
    dtype = weight.data.dtype
    scaled_weight = weight.data * vector.astype(dtype)[None, :]
    if _underflows(weight.data, scaled_weight, underflow_below):
        return None
    new_weight = Constant(np.ascontiguousarray(scaled_weight), weight.type.dtype)
    replacements.append((matmul_index, Binding(matmul.var, Call("matmul", [matmul.value.args[0], new_weight],
                                                                  matmul.value.attrs))))
    if bias_index is not None:
        add = table.bindings[bias_index]
        args = list(add.value.args)
        at = 0 if isinstance(args[0], Constant) else 1
        bias = args[at]
        scaled_bias = bias.data * vector.astype(bias.data.dtype).reshape((1,) * (len(bias.type.shape) - 1) + (channels,))
        if _underflows(bias.data, scaled_bias, underflow_below):
            return None
        args[at] = Constant(np.ascontiguousarray(scaled_bias), bias.type.dtype)
        replacements.append((bias_index, Binding(add.var, Call("add", args, add.value.attrs))))
    return replacements


def _underflows(before, after, smallest_normal: float | None) -> bool:
    """Whether scaling took an element from a normal magnitude below `smallest_normal`."""
    if smallest_normal is None:
        return False
    before, after = np.abs(np.asarray(before, np.float64)), np.abs(np.asarray(after, np.float64))
    return bool(np.any((after < smallest_normal) & (before >= smallest_normal)))


def _producer_chain(scaled, reader: int, table: BindingIndex):
    """(matmul index, bias add index or None, transpose index or None) of
    [transpose(] [add(] matmul(x, W) [, b)] [)] ending at `scaled`, each read only by the
    next; else None."""
    def produced(var, reader_index, names):
        if not isinstance(var, Var) or var not in table.producers or table.only_reader(var) != reader_index:
            return None
        index, value = table.producers[var]
        return (index, value) if is_op_call(value, names) else None

    transpose_index = bias_index = None
    step = produced(scaled, reader, ("transpose", "add", "matmul"))
    if step is not None and step[1].op.name == "transpose":
        transpose_index = step[0]
        step = produced(step[1].args[0], step[0], ("add", "matmul"))
    if step is not None and step[1].op.name == "add":
        bias_index = step[0]
        left, right = step[1].args
        bias, product = (left, right) if isinstance(left, Constant) else (right, left)
        if not isinstance(bias, Constant) or isinstance(product, Constant) or not bias.type.shape or \
                any(size != 1 for size in bias.type.shape[:-1]) or \
                tuple(np.broadcast_shapes(bias.type.shape, product.type.shape)) != tuple(product.type.shape):
            return None
        step = produced(product, step[0], ("matmul",))
    if step is None or step[1].op.name != "matmul":
        return None
    weight = step[1].args[1]
    if not isinstance(weight, Constant) or len(weight.type.shape) != 2 or \
            (bias_index is not None and _bias_of(table, bias_index).type.shape[-1] != weight.type.shape[1]):
        return None
    return step[0], bias_index, transpose_index


def _bias_of(table, bias_index):
    left, right = table.bindings[bias_index].value.args
    return left if isinstance(left, Constant) else right
