"""FoldBatchNorm: an inference batch norm after a convolution becomes the convolution's
weights and a bias.

Rewrites, in main, every

    %c = conv2d(%x, W)                          (W constant; any layout, strides, groups)
    [%c = add(%c, b)]                           (b constant, per output channel)
    %y = batch_norm(%c, gamma, beta, mean, var)  (all constant, on the channel axis)

whose intermediate values are read only by the next binding, into

    %c = conv2d(%x, W * s)
    %y = add(%c, (b - mean) * s + beta)         with s = gamma / sqrt(var + epsilon)

the bias shaped as the ONNX importer writes a conv bias ((C, 1, 1) for NCHW, (C,) for
NHWC), so the epilogue patterns of the conv backends take it. The folding is computed
in float64 and stored in the weights' dtype; the result equals the unfolded graph up to
rounding. One op fewer per conv, and the conv + bias + relu chain of a ResNet block is
one fused kernel for CUTLASS.

Leaves alone: batch norms after anything else (they stay per-channel scale-and-shift
kernels), batch norms whose parameters are computed at run time, and convs whose
output is also read elsewhere (folding would change that other reader's input).
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Var, vars_read
from ..ir.module import IRModule
from ..ir.op import get_op

CHANNEL_AXIS = {"NCHW": 1, "NHWC": 3}


def fold_batch_norm(mod: IRModule) -> IRModule:
    """main with conv2d (+ bias) -> batch_norm chains folded (see the module docstring)."""
    return mod.with_function("main", _fold(mod["main"]))


def _fold(main: Function) -> Function:
    readers: dict = {}
    for index, binding in enumerate(main.bindings):
        for var in vars_read(binding.value):
            readers.setdefault(var, []).append(index)
    result_vars = set(vars_read(main.result))
    defined = {binding.var: index for index, binding in enumerate(main.bindings)}

    def only_reader(var, index) -> bool:
        return readers.get(var, []) == [index] and var not in result_vars

    replace: dict[int, list] = {}  # binding index -> the bindings that take its place
    drop: set[int] = set()
    for index, binding in enumerate(main.bindings):
        norm = binding.value
        if not _is_call(norm, "batch_norm") or not all(isinstance(a, Constant) for a in norm.args[1:]):
            continue
        source = norm.args[0]
        if not isinstance(source, Var) or source not in defined or not only_reader(source, index):
            continue
        bias, conv_index = None, defined[source]
        producer = main.bindings[conv_index].value
        if _is_call(producer, "add"):
            operands = [a for a in producer.args if isinstance(a, Var)]
            constants = [a for a in producer.args if isinstance(a, Constant)]
            if len(operands) != 1 or len(constants) != 1 or operands[0] not in defined:
                continue
            if not only_reader(operands[0], conv_index):
                continue
            bias, add_index = constants[0], conv_index
            conv_index = defined[operands[0]]
            producer = main.bindings[conv_index].value
        else:
            add_index = None
        if not _is_call(producer, "conv2d") or not isinstance(producer.args[1], Constant):
            continue
        layout = producer.attrs["data_layout"]
        out_type = main.bindings[conv_index].var.type
        channels = out_type.shape[CHANNEL_AXIS[layout]]
        if norm.attrs["axis"] % len(out_type.shape) != CHANNEL_AXIS[layout]:
            continue
        bias_vector = _channel_vector(bias, channels, layout) if bias is not None else np.zeros(channels)
        if bias_vector is None:
            continue
        gamma, beta, mean, var = (np.asarray(a.data, np.float64).reshape(-1) for a in norm.args[1:])
        scale = gamma / np.sqrt(var + float(norm.attrs["epsilon"]))
        weight = producer.args[1]
        # OIHW and OHWI both put the output channels first
        per_output_channel = scale.reshape((-1,) + (1,) * (len(weight.type.shape) - 1))
        new_weight = Constant((np.asarray(weight.data, np.float64) * per_output_channel).astype(weight.data.dtype))
        new_bias = ((bias_vector - mean) * scale + beta).astype(weight.data.dtype)
        bias_shape = (channels, 1, 1) if layout == "NCHW" else (channels,)
        conv_var = main.bindings[conv_index].var
        new_conv = Call(producer.op, [producer.args[0], new_weight], producer.attrs)
        replace[conv_index] = [Binding(conv_var, new_conv)]
        add = Call(get_op("add"), [conv_var, Constant(new_bias.reshape(bias_shape))], {})
        replace[index] = [Binding(binding.var, add)]
        if add_index is not None:
            drop.add(add_index)
    if not replace:
        return main
    bindings = []
    for index, binding in enumerate(main.bindings):
        if index in drop:
            continue
        bindings.extend(replace.get(index, [binding]))
    return Function(main.params, bindings, main.result, main.ret_type, main.attrs)


def _is_call(value, name: str) -> bool:
    return isinstance(value, Call) and getattr(value.op, "name", None) == name


def _channel_vector(bias: Constant, channels: int, layout: str):
    """The per-channel values of a conv bias constant (a scalar, or (C, 1, 1) for NCHW and
    (C,) for NHWC, leading 1s allowed), or None when it is not one."""
    data = np.asarray(bias.data, np.float64)
    if data.size == 1:
        return np.full(channels, data.reshape(-1)[0])
    shape = list(bias.type.shape)
    while shape and shape[0] == 1:
        shape.pop(0)
    expected = [channels, 1, 1] if layout == "NCHW" else [channels]
    return data.reshape(-1) if shape == expected else None
