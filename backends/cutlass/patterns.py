"""The cutlass pattern table: multi-head attention as one fused kernel, GEMMs with their
epilogues, batched attention matmuls (attention the fused kernel refuses), and NHWC 2-D
convolutions with their epilogues (bias, residual add, activation).

Rows are tried in order (larger patterns first). Every check returns None or the reason
the kernel cannot take the match; the partition report shows the reasons and the work
falls to the next backend.
"""
from __future__ import annotations

import math

from byoc.backend import PatternEntry
from byoc.pattern import is_const, is_op, wildcard

from .kernels import FIXED_CHANNELS

FLOAT_TYPES = ("float16", "bfloat16")
ACTIVATIONS = ("gelu", "relu", "silu", "sigmoid", "hard_swish")  # hard_swish: MobileNetV3's


def _add(x, y):
    """add(x, y) in either argument order."""
    return is_op("add")(x, y) | is_op("add")(y, x)


def dense():
    return is_op("matmul")(wildcard().named("a"), wildcard().named("b")).named("matmul")


def with_bias(core):
    return _add(core, wildcard().has_rank(1).named("bias"))


def with_activation(core):
    options = [is_op(name)(core).named("activation") for name in ACTIVATIONS]
    pattern = options[0]
    for option in options[1:]:
        pattern = pattern | option
    return pattern


def with_residual(core):
    return _add(core, wildcard().named("residual"))


def with_scale(core):
    """core / c or core * c for a scalar constant c: the epilogue's alpha (attention's
    scores / sqrt(d)). FuseOpsByPattern keeps the scalar in the body, where codegen reads it."""
    scale = is_const().named("scale")
    return (is_op("divide")(core, scale) | is_op("multiply")(core, scale) |
            is_op("multiply")(scale, core)).named("scale_op")


def check_scale(match) -> str | None:
    scale = match["scale"]
    if scale.type.size != 1:
        return f"scale of shape {tuple(scale.type.shape)} is not a scalar"
    import numpy as np
    value = float(np.asarray(scale.data, np.float64).reshape(-1)[0])
    if not np.isfinite(value) or (match.call_of("scale_op").op.name == "divide" and value == 0.0):
        return f"scale {value} is not a finite, nonzero number"
    return None


def check_dense(match) -> str | None:
    a, b, out = match["a"], match["b"], match.output
    dtype = out.type.dtype
    if dtype not in FLOAT_TYPES:
        return f"dtype {dtype} (cutlass kernels here take float16 or bfloat16)"
    if len(b.type.shape) != 2:
        return f"B has rank {len(b.type.shape)}; dense needs a 2-D weight (batched is another pattern)"
    if len(a.type.shape) < 2:
        return "A is a vector"
    k, n = b.type.shape
    if k % 8:
        return f"K={k} not a multiple of 8 (16-byte TMA alignment of fp16 rows)"
    if n % 8:
        return f"N={n} not a multiple of 8 (16-byte TMA alignment of fp16 rows)"
    return _check_epilogue(match, n)


def _check_epilogue(match, n) -> str | None:
    named = match.named
    if "bias" in named and tuple(named["bias"].type.shape) != (n,):
        return f"bias of shape {named['bias'].type.shape} is not a vector of N={n}"
    if "residual" in named and tuple(named["residual"].type.shape) != tuple(match.output.type.shape):
        return "residual does not have the output's shape (no broadcasting in the epilogue)"
    if "activation" in named and match.call_of("activation").attrs.get("approximate", "none") not in ("none", "tanh"):
        return "unknown gelu approximation"
    return None


def check_batched(match) -> str | None:
    a, b, out = match["a"], match["b"], match.output
    dtype = out.type.dtype
    if dtype not in FLOAT_TYPES:
        return f"dtype {dtype} (cutlass kernels here take float16 or bfloat16)"
    if len(a.type.shape) < 3 or len(b.type.shape) < 3:
        return "not a batched matmul (a dense pattern covers 2-D weights)"
    if tuple(a.type.shape[:-2]) != tuple(b.type.shape[:-2]):
        return f"batch dims {a.type.shape[:-2]} and {b.type.shape[:-2]} differ (no broadcasting)"
    k = a.type.shape[-1]
    n = out.type.shape[-1]
    if k % 8 or n % 8:
        return f"K={k} or N={n} not a multiple of 8 (16-byte TMA alignment)"
    return None


def check_scaled_batched(match) -> str | None:
    return check_batched(match) or check_scale(match)


def check_scaled_transposed_batched(match) -> str | None:
    return check_transposed_batched(match) or check_scale(match)


def check_transposed_batched(match) -> str | None:
    reason = check_batched(match)
    if reason:
        return reason
    rank = len(match["b"].type.shape)
    axes = tuple(match.call_of("transpose").attrs["axes"])
    expected = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    if axes != expected:
        return f"transpose axes {axes} do not swap the last two dims"
    return None


def batched():
    return is_op("matmul")(wildcard().named("a"), wildcard().named("b")).named("matmul")


def transposed_batched():
    return is_op("matmul")(wildcard().named("a"),
                           is_op("transpose")(wildcard().named("b")).named("transpose")).named("matmul")


def attention():
    """Multi-head attention from the projections to the merged heads (attention.py has the
    chain): Q, K, V are whatever feeds the head-split reshapes, or the fused QKV projection
    when they are its slices (then one parameter, read at three offsets), or a [B, S, H, D]
    value computed outside (a cast that SinkReshapes put after the reshape of an input)."""
    def source():
        return is_op("strided_slice")(wildcard()) | wildcard()

    def split():
        return is_op("reshape")(source()) | wildcard()

    def heads():
        return is_op("transpose")(split())

    # the two-transpose form first: the wildcard of split() would take its inner transpose
    keys = is_op("transpose")(heads()) | is_op("transpose")(split())
    scores = is_op("matmul")(heads(), keys)
    scores = with_scale(scores) | scores
    scores = _add(scores, wildcard()) | scores
    context = is_op("transpose")(is_op("matmul")(is_op("softmax")(scores), heads()))
    return is_op("reshape")(context) | context


def check_attention(match) -> str | None:
    from .attention import NotAttention, read_attention
    inside = {id(var) for var in match.matched}

    def producer(expr):
        if id(expr) not in inside:
            return None
        call = match.producers[expr]
        return call.op.name, list(call.args), call.attrs

    try:
        read_attention(match.output, producer)
    except NotAttention as reason:
        return str(reason)
    return None


def conv2d():
    return is_op("conv2d")(wildcard().named("data"), wildcard().named("weight")).named("conv2d")


# Past TMA im2col's limits (sm_90) the kernel cannot run: lower/upper corners are signed
# 8-bit and filter offsets unsigned 8-bit for 2-D convs; the sm_80 optimized iterator keeps
# one mask bit per filter position (R, S <= 32). Checked for both archs, as the check does
# not know which one the build targets.
IM2COL_CORNER_LIMIT = 128
IM2COL_OFFSET_LIMIT = 255
MAX_FILTER_SIZE = 32
INT32_BYTES = 1 << 31


def check_conv2d(match) -> str | None:
    data, weight, out = match["data"], match["weight"], match.output
    attrs = match.call_of("conv2d").attrs
    dtype = out.type.dtype
    if dtype not in FLOAT_TYPES:
        return f"dtype {dtype} (cutlass kernels here take float16 or bfloat16)"
    if attrs["data_layout"] != "NHWC":
        return f"data_layout {attrs['data_layout']} (cutlass convs take NHWC; ConvertConvLayout rewrites NCHW chains)"
    if attrs["groups"] != 1:
        return f"groups={attrs['groups']} (grouped and depthwise convs are not implicit GEMMs here)"
    channels, out_channels = data.type.shape[3], weight.type.shape[0]
    if channels % 8 and channels != FIXED_CHANNELS:
        return (f"C={channels} input channels neither a multiple of 8 (16-byte alignment of fp16 pixels) "
                f"nor {FIXED_CHANNELS} (the fixed-channel kernel; PadConvChannels pads convs with a constant filter)")
    if out_channels % 8:
        return f"K={out_channels} output channels not a multiple of 8 (16-byte alignment of fp16 pixels)"
    kernel = weight.type.shape[1:3]
    if max(kernel) > MAX_FILTER_SIZE:
        return f"filter {kernel[0]}x{kernel[1]} larger than {MAX_FILTER_SIZE} (sm80 iterator mask bits)"
    pads, dilations = attrs["pads"], attrs["dilations"]
    for axis in range(2):
        reach = (kernel[axis] - 1) * dilations[axis]
        if reach >= IM2COL_OFFSET_LIMIT:
            return f"dilated filter reach {reach} >= {IM2COL_OFFSET_LIMIT} (TMA im2col filter offsets)"
        lower_corner, upper_corner = -pads[axis], pads[axis + 2] - reach
        if not (-IM2COL_CORNER_LIMIT <= lower_corner < IM2COL_CORNER_LIMIT and
                -IM2COL_CORNER_LIMIT <= upper_corner < IM2COL_CORNER_LIMIT):
            return f"pads {tuple(pads)} with filter {tuple(kernel)} beyond TMA im2col's corner range"
    itemsize = 2
    for name, value in (("input", data), ("output", out)):
        if math.prod(value.type.shape) * itemsize >= INT32_BYTES:
            return f"{name} of {math.prod(value.type.shape) * itemsize} bytes needs 64-bit offsets"
    return _check_conv_epilogue(match, out_channels)


def _check_conv_epilogue(match, out_channels) -> str | None:
    named = match.named
    if "bias" in named and tuple(named["bias"].type.shape) != (out_channels,):
        return f"bias of shape {named['bias'].type.shape} is not a vector of K={out_channels} channels"
    if "residual" in named:
        residual = named["residual"].type
        if tuple(residual.shape) != tuple(match.output.type.shape) or residual.dtype != match.output.type.dtype:
            return "residual does not have the output's shape and dtype (no broadcasting in the epilogue)"
    if "activation" in named and match.call_of("activation").attrs.get("approximate", "none") not in ("none", "tanh"):
        return "unknown gelu approximation"
    return None


def conv2d_patterns() -> list:
    """conv2d [+ bias] [+ residual] [-> activation]: the epilogue computes
    act(conv + bias + residual), ResNet's `relu(bn(conv(x)) + shortcut)` once batch norm is
    folded into the bias."""
    plain = conv2d()
    return [
        PatternEntry("conv2d_bias_residual_activation", with_activation(with_residual(with_bias(plain))),
                     check_conv2d),
        PatternEntry("conv2d_bias_residual", with_residual(with_bias(plain)), check_conv2d),
        PatternEntry("conv2d_bias_activation", with_activation(with_bias(plain)), check_conv2d),
        PatternEntry("conv2d_bias", with_bias(plain), check_conv2d),
        PatternEntry("conv2d_residual_activation", with_activation(with_residual(plain)), check_conv2d),
        PatternEntry("conv2d_activation", with_activation(plain), check_conv2d),
        PatternEntry("conv2d", plain, check_conv2d),
    ]


def pattern_table() -> list:
    plain = dense()
    return [PatternEntry("attention", attention(), check_attention)] + conv2d_patterns() + [
        PatternEntry("dense_bias_residual", with_residual(with_bias(plain)), check_dense),
        PatternEntry("dense_residual", with_residual(plain), check_dense),
        PatternEntry("dense_bias_activation", with_activation(with_bias(plain)), check_dense),
        PatternEntry("dense_bias", with_bias(plain), check_dense),
        PatternEntry("dense_activation", with_activation(plain), check_dense),
        PatternEntry("dense", plain, check_dense),
        PatternEntry("batched_matmul_nt_scaled", with_scale(transposed_batched()), check_scaled_transposed_batched),
        PatternEntry("batched_matmul_scaled", with_scale(batched()), check_scaled_batched),
        PatternEntry("batched_matmul_nt", transposed_batched(), check_transposed_batched),
        PatternEntry("batched_matmul", batched(), check_batched),
    ]
