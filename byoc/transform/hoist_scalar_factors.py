"""HoistScalarFactors: scalar factors of a matmul's operands multiply its product instead.

    %qs = multiply(%q, 0.5f)                      %kt = reshape(%k3, shape=[B, H, D, S])
    %ks = multiply(%k3, 0.5f)            ->       %s_unscaled = matmul(%q, %kt)
    %kt = reshape(%ks, shape=[B, H, D, S])        %s = multiply(%s_unscaled, 0.25f)
    %s = matmul(%qs, %kt)

torch's ONNX exporter writes scaled_dot_product_attention with each operand scaled by the
square root of the scale (Q * sqrt(c) @ (K^T * sqrt(c)), which keeps float16 scores in
range); a fused attention kernel takes one scale of the scores, and the scaled copies of Q
and K are two more kernels. A matmul is linear in each operand, so (a c1)(b c2) = (ab) c1 c2,
and a scalar commutes with the layout ops between (reshape, transpose, expand_dims,
squeeze, broadcast_to). The product is rounded once instead of three times.

Rewrites, in every function with a body, a matmul of two computed tensors (a GEMM with a
weight keeps its epilogues as they are: a scaled input there is for FoldConstant to fold
into the weight) whose operand is, through layout ops
each read only by the next, a multiply by a scalar floating-point constant (size 1, the
multiply's result the type of its other operand) read only by the chain; both operands'
factors at once, into one multiply after the matmul. Leaves alone: multiplies read
elsewhere, factors that are not scalar constants, integer matmuls.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Var, is_op_call
from ..ir.module import IRModule
from ..ir.types import is_float, numpy_dtype
from .bindings import BindingIndex, rewrite_until_stable

LAYOUT_OPS = ("reshape", "transpose", "expand_dims", "squeeze", "broadcast_to")


def hoist_scalar_factors(mod: IRModule) -> IRModule:
    return mod.map_bodies(_hoist)


def _hoist(function: Function) -> Function:
    return rewrite_until_stable(function, _hoist_once)  # one matmul at a time


def _hoist_once(function: Function) -> Function | None:
    table = BindingIndex(function)
    bindings, producers, only_reader = table.bindings, table.producers, table.only_reader

    for index, binding in enumerate(bindings):
        if not is_op_call(binding.value, ("matmul",)) or not is_float(binding.var.type.dtype) or \
                any(isinstance(arg, Constant) for arg in binding.value.args):
            continue
        factors = [_factor(arg, index, producers, only_reader) for arg in binding.value.args]
        found = [factor for factor in factors if factor is not None]
        if not found:
            continue
        for multiply_var, source, reader_index, _ in found:
            reader = bindings[reader_index]
            bindings[reader_index] = Binding(reader.var, _replace_arg(reader.value, multiply_var, source))
        matmul = bindings[index].value  # its operands may have been rewritten just now
        product = np.prod([value for *_, value in found], dtype=np.float64)
        unscaled = Var(f"{binding.var.name_hint}_unscaled", binding.var.type)
        scale = Constant(np.asarray(product, dtype=numpy_dtype(binding.var.type.dtype)))
        bindings[index] = Binding(unscaled, matmul)
        bindings.insert(index + 1, Binding(binding.var, Call("multiply", [unscaled, scale])))
        return Function(function.params, bindings, function.result, function.ret_type, function.attrs)
    return None


def _factor(arg, reader_index: int, producers: dict, only_reader):
    """(the multiply's var, its other operand, the index of the binding that reads the
    multiply, the factor) where `arg` is, through single-reader layout ops, a scalar
    multiply read only by that chain; else None."""
    current, reader = arg, reader_index
    while isinstance(current, Var) and current in producers and only_reader(current) == reader:
        index, value = producers[current]
        if is_op_call(value, LAYOUT_OPS):
            current, reader = value.args[0], index
            continue
        if not is_op_call(value, ("multiply",)):
            return None
        for position in (0, 1):
            factor, source = value.args[position], value.args[1 - position]
            if isinstance(factor, Constant) and factor.type.size == 1 and source.type == current.type and \
                    factor.type.dtype == current.type.dtype:
                number = float(np.asarray(factor.data, np.float64).reshape(-1)[0])
                if np.isfinite(number):
                    return current, source, reader, number
        return None
    return None


def _replace_arg(call: Call, old: Var, new) -> Call:
    return Call(call.op, [new if arg is old else arg for arg in call.args], call.attrs)
