"""BatchNormAsScaleShift: an inference batch norm that FoldBatchNorm left (no conv before it
to fold into) becomes the per-channel multiply and add it computes, so that it fuses with
its elementwise neighbours.

Rewrites, in every function with a body, every

    %y = batch_norm(%x, gamma, beta, mean, var)     (all four constant, channels on `axis`)

into

    %y_scaled = multiply(%x, s)                     s = gamma / sqrt(var + epsilon)
    %y = add(%y_scaled, t)                          t = beta - mean * s

with s and t computed in float64, stored in x's dtype and shaped [C, 1, ..., 1] to
broadcast along `axis` ([C] where it is the last axis). A pre-activation net's
batch_norm -> relu (DenseNet's every layer: the norm reads the concat of the features
before it) is then one elementwise kernel, not a norm kernel and a relu kernel; as the
ops it becomes, it also moves with ConvertConvLayout's NHWC regions like a conv bias.

The norm kernel computed x - mean in float32; the shift t = beta - mean * s is rounded to
the model's dtype instead (under float16: |mean * s| * 2^-11 at most, as TVM's
SimplifyInference does; the pass runs before ConvertToFloat16, on float32 constants).

Leaves alone: batch norms whose parameters are computed at run time (or arrive as
inputs: the ONNX conformance cases' norms), which the built-in backend runs as they are.
This is TVM's SimplifyInference for batch_norm.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Var
from ..ir.module import IRModule
from ..ir.op import get_op


def batch_norm_as_scale_shift(mod: IRModule) -> IRModule:
    """mod with every constant-parameter batch_norm a multiply and an add (see above)."""
    return mod.map_bodies(_rewrite)


def _rewrite(function: Function) -> Function:
    bindings, changed = [], False
    for binding in function.bindings:
        value = binding.value
        if not (isinstance(value, Call) and getattr(value.op, "name", None) == "batch_norm"
                and all(isinstance(arg, Constant) for arg in value.args[1:])):
            bindings.append(binding)
            continue
        x = value.args[0]
        rank = len(x.type.shape)
        axis = int(value.attrs["axis"]) % rank
        gamma, beta, mean, var = (np.asarray(arg.data, np.float64).reshape(-1) for arg in value.args[1:])
        scale = gamma / np.sqrt(var + float(value.attrs["epsilon"]))
        shift = beta - mean * scale
        shape = (-1,) + (1,) * (rank - 1 - axis)
        dtype = np.dtype(value.args[1].data.dtype)
        scaled = Var(f"{binding.var.name_hint}_scaled", binding.var.type)
        bindings.append(Binding(scaled, Call(get_op("multiply"), [x, Constant(scale.astype(dtype).reshape(shape))],
                                             {})))
        bindings.append(Binding(binding.var, Call(get_op("add"), [scaled, Constant(shift.astype(dtype).reshape(shape))],
                                                  {})))
        changed = True
    if not changed:
        return function
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)
