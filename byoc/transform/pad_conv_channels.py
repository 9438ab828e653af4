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

Where the conv's input is computed by another such conv (constant filters, groups 1) through
an elementwise chain read by nothing else, the producer is widened instead of the input
padded: it gets C' - C zero filters, each chain constant that varies along the channels C' -
C zeros, so the chain computes C' channels of which the consumer's zero filter channels
ignore the extra ones (finite: the chain's ops are those mapping finite values to finite
ones, WIDENABLE_OPS). C' is then the multiple of 8 above C, also below 4 channels. No pad
runs, and the producer's output channels are a multiple of 8 too, which the GEMM kernels
need:

    %h = conv2d(%x, W1[2,1,1,8])                   %h = conv2d(%x, W1'[8,1,1,8])
    %a = add(%h, b1[2])                   ->       %a = add(%h, b1'[8])
    %s = multiply(%a, sigmoid(%a))                 %s = multiply(%a, sigmoid(%a))
    %y = conv2d(%s, W2[8,1,1,2])                   %y = conv2d(%s, W2'[8,1,1,8])

(the squeeze-and-excitation block of EfficientNet: its 2 to 48 squeezed channels took a pad
and a GEMM that no 16-byte kernel runs, about 10 us a block at batch 32 on an H200).

Runs where ConvertConvLayout runs (targets whose conv kernels are NHWC): it rewrites, in
main, conv2d calls with data_layout NHWC, groups 1, a Constant weight (OHWI) and a dtype
in `dtypes`. Leaves alone convs with a weight computed at run time, grouped convs (their
channels per group change the grouping), other layouts and dtypes.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Var, vars_read
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


# Elementwise ops that map finite inputs to finite outputs (0 in the widened channels stays
# finite through them, and the consumer's zero filter channels then ignore it).
WIDENABLE_OPS = frozenset({"add", "subtract", "multiply", "maximum", "minimum", "relu", "leaky_relu", "clip",
                           "sigmoid", "hard_sigmoid", "hard_swish", "silu", "gelu", "tanh", "erf", "elu",
                           "abs", "negative", "identity", "cast"})


def pad_conv_channels(mod: IRModule, dtypes=("float16", "bfloat16")) -> IRModule:
    main = mod["main"]
    widen = _widenings(main, dtypes)
    bindings, changed = [], False
    renamed: dict = {}  # a widened binding's var -> its var of the widened type

    def arg(expr):
        return renamed.get(expr, expr) if isinstance(expr, Var) else expr
    for binding in main.bindings:
        value = binding.value
        if _pads(value, dtypes):  # its input padded (or read widened) first, then perhaps widened itself
            data, weight = arg(value.args[0]), value.args[1]
            channels = weight.type.shape[3]
            if data.type.shape[3] == channels:  # not widened: pad the input
                pad = Call("pad", [data], {"pads": [0, 0, 0, 0, 0, 0, 0, padded_channels(channels) - channels]})
                data = Var(f"{binding.var.name_hint}_input_padded", pad.type)
                bindings.append(Binding(data, pad))
            filled = np.pad(np.asarray(weight.data), [(0, 0), (0, 0), (0, 0), (0, data.type.shape[3] - channels)])
            value = Call(value.op, [data, Constant(filled, weight.type.dtype)], dict(value.attrs))
            changed = True
        if binding.var in widen:
            value = _widened(value.op, [arg(a) for a in value.args], value.attrs, widen[binding.var])
            renamed[binding.var] = Var(binding.var.name_hint, value.type)
            bindings.append(Binding(renamed[binding.var], value))
            changed = True
            continue
        if isinstance(value, Call) and any(isinstance(a, Var) and a in renamed for a in value.args):
            value = Call(value.op, [arg(a) for a in value.args], dict(value.attrs))
        bindings.append(binding if value is binding.value else Binding(binding.var, value))
    if not changed:
        return mod
    mod = mod.copy()
    mod["main"] = Function(main.params, bindings, arg(main.result), main.ret_type, main.attrs)
    return mod


def _widenings(main: Function, dtypes) -> dict:
    """binding var -> channels to add, for the producer conv and elementwise ops of every
    conv whose input is widened instead of padded (the module docstring): the ops between
    the producer and the consumer, each read only by them (x * sigmoid(x) reads x twice)."""
    readers: dict = {}
    for binding in main.bindings:  # every read counts: a tuple or a tuple item reading a var too
        for a in vars_read(binding.value):
            readers.setdefault(a, set()).add(binding.var)
    outputs = set(vars_read(main.result))
    defined = {b.var: b.value for b in main.bindings}
    widen: dict = {}
    for binding in main.bindings:
        if not _pads(binding.value, dtypes):
            continue
        channels = binding.value.args[0].type.shape[3]
        region = _region(binding.value.args[0], channels, defined)
        if region is None or any(v in widen or v in outputs for v in region) or \
                any(not readers.get(v, set()) <= region | {binding.var} for v in region):
            continue
        # a multiple of 8 even below 4 channels: zero filters cost nothing, and the producer's
        # output channels are then a GEMM kernel's 16-byte extent too
        widen.update({v: -(-channels // VECTOR_CHANNELS) * VECTOR_CHANNELS - channels for v in region})
    return widen


def _region(data, channels: int, defined: dict) -> set | None:
    """The vars from one dense conv of `channels` output channels to `data` through
    widenable elementwise ops, or None when `data` is not computed that way."""
    region, producer, frontier = set(), None, [data]
    while frontier:
        var = frontier.pop()
        if var in region:
            continue
        value = defined.get(var) if isinstance(var, Var) else None
        if not isinstance(value, Call) or not isinstance(value.op, Op):
            return None
        if _is_dense_conv(value) and value.args[1].type.shape[0] == channels:
            if producer is not None:
                return None  # one producer: two would each need the other's channels
            producer = var
        elif value.op.name in WIDENABLE_OPS:
            inputs = [a for a in value.args if isinstance(a, Var)]
            if not inputs or any(tuple(a.type.shape[-1:]) != (channels,) for a in inputs) or \
                    not all(_widenable_constant(a, channels) for a in value.args if not isinstance(a, Var)):
                return None
            frontier.extend(inputs)
        else:
            return None
        region.add(var)
    return region if producer is not None else None


def _is_dense_conv(value) -> bool:
    return (isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "conv2d"
            and len(value.args) == 2 and isinstance(value.args[1], Constant)
            and value.attrs["data_layout"] == "NHWC" and value.attrs["groups"] == 1)


def _widenable_constant(expr, channels: int) -> bool:
    """A constant operand of the chain: a scalar, or one that broadcasts along the channels
    or holds one value per channel on its last axis."""
    return isinstance(expr, Constant) and (expr.type.ndim == 0 or expr.type.shape[-1] in (1, channels))


def _widened(op, args, attrs, extra: int) -> Call:
    """The call op(args) computing `extra` more channels: a conv's filters get zero output
    filters, the chain's per-channel constants zeros on their last axis (args are already
    the widened vars)."""
    if op.name == "conv2d":
        data, weight = args
        filled = np.pad(np.asarray(weight.data), [(0, extra), (0, 0), (0, 0), (0, 0)])
        return Call(op, [data, Constant(filled, weight.type.dtype)], dict(attrs))
    widened = []
    for a in args:
        if isinstance(a, Constant) and a.type.ndim > 0 and a.type.shape[-1] > 1:
            pads = [(0, 0)] * (a.type.ndim - 1) + [(0, extra)]
            a = Constant(np.pad(np.asarray(a.data), pads), a.type.dtype)
        widened.append(a)
    return Call(op, widened, dict(attrs))


def _pads(value, dtypes) -> bool:
    if not (isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "conv2d"):
        return False
    data, weight = value.args[:2]
    attrs = value.attrs
    return (len(value.args) == 2 and attrs["data_layout"] == "NHWC" and attrs["groups"] == 1 and
            isinstance(weight, Constant) and data.type.dtype in dtypes and data.type.ndim == 4 and
            padded_channels(data.type.shape[3]) != data.type.shape[3])
