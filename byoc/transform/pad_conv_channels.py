"""PadConvChannels: an NHWC conv whose input channels a vectorised kernel cannot load
(C not a multiple of 8) reads its input zero-padded to C' channels, and its constant filter
gets C' - C zero channels, so the result is unchanged.

    %y = conv2d(%x, W[K,R,S,3], data_layout="NHWC", ...)
->  %xp = pad(%x, pads=[0, 0, 0, 0, 0, 0, 0, 1])
    %y = conv2d(%xp, W'[K,R,S,4], data_layout="NHWC", ...)     W' = W with a zero channel

C' is 4 for C < 4 (an RGB image: CUTLASS's fixed-channel iterator loads one 8-byte pixel
per filter tap, see backends/cutlass/conv_kernels.py) and the next multiple of 8 above (16-byte
loads) otherwise. The stem of every torchvision CNN and the patch embedding of a ViT are
such convs; without this they fall to an im2col and a GEMM (ResNet-50 at batch 32: about
0.6 ms of 2.2). The pad runs once, on the image, at the boundary of the conv chain.

Runs where ConvertConvLayout runs (targets whose conv kernels are NHWC): it rewrites, in
main, conv2d calls with data_layout NHWC, groups 1, a Constant weight (OHWI) and a dtype
in `dtypes`. Leaves alone convs with a weight computed at run time, grouped convs (their
channels per group change the grouping), other layouts and dtypes.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Var
from ..ir.module import IRModule
from ..ir.op import Op

SMALL_CHANNELS = 4
VECTOR_CHANNELS = 8


def padded_channels(channels: int) -> int:
    if channels % VECTOR_CHANNELS == 0 or channels == SMALL_CHANNELS:
        return channels
    if channels < SMALL_CHANNELS:
        return SMALL_CHANNELS
    return -(-channels // VECTOR_CHANNELS) * VECTOR_CHANNELS


def pad_conv_channels(mod: IRModule, dtypes=("float16", "bfloat16")) -> IRModule:
    main = mod["main"]
    bindings, changed = [], False
    for binding in main.bindings:
        value = binding.value
        if _pads(value, dtypes):
            data, weight = value.args
            channels = data.type.shape[3]
            extra = padded_channels(channels) - channels
            pad = Call("pad", [data], {"pads": [0, 0, 0, 0, 0, 0, 0, extra]})
            padded = Var(f"{binding.var.name_hint}_input_padded", pad.type)
            filled = np.pad(np.asarray(weight.data), [(0, 0), (0, 0), (0, 0), (0, extra)])
            bindings.append(Binding(padded, pad))
            bindings.append(Binding(binding.var, Call(value.op, [padded, Constant(filled, weight.type.dtype)],
                                                      dict(value.attrs))))
            changed = True
        else:
            bindings.append(binding)
    if not changed:
        return mod
    mod = mod.copy()
    mod["main"] = Function(main.params, bindings, main.result, main.ret_type, main.attrs)
    return mod


def _pads(value, dtypes) -> bool:
    if not (isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "conv2d"):
        return False
    data, weight = value.args[:2]
    attrs = value.attrs
    return (len(value.args) == 2 and attrs["data_layout"] == "NHWC" and attrs["groups"] == 1 and
            isinstance(weight, Constant) and data.type.dtype in dtypes and data.type.ndim == 4 and
            padded_channels(data.type.shape[3]) != data.type.shape[3])
