"""The cutlass pattern table: multi-head attention as one fused kernel, GEMMs with their
epilogues, batched attention matmuls (attention the fused kernel refuses), and NHWC 2-D
convolutions with their epilogues (bias, residual add, activation).

Rows are tried in order (larger patterns first). Every check returns None or the reason
the kernel cannot take the match; the partition report shows the reasons and the work
falls to the next backend. A GEMM or conv match is taken only where a candidate kernel
supports its problem (kernels.unsupported_reason: the rules of CUTLASS's can_implement), so
that no partition is made that the built library would refuse at run time. The checks do
not know the arch the build targets: a kernel of either family (sm_90, sm_80) will do.
"""
from __future__ import annotations

import math

from byoc.backend import PatternEntry
from byoc.pattern import is_const, is_op, wildcard
from byoc.pattern.epilogues import (add_either_order, conv2d_epilogue_patterns, conv_epilogue_flaw, with_activation,
                                    with_bias, with_residual)

from .conv_kernels import filter_size_flaw, im2col_flaw, tensor_bytes_flaw
from .kernels import ELEMENTS, ConvProblem, GemmProblem, unsupported_reason

FLOAT_TYPES = tuple(ELEMENTS)
_add = add_either_order


def dense():
    return is_op("matmul")(wildcard().named("a"), wildcard().named("b")).named("matmul")


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
    reason = _check_epilogue(match, n)
    if reason:
        return reason
    # shared weights: A's leading dims fold into the GEMM's rows (codegen.gemm_problem)
    return unsupported_reason(GemmProblem(
        m=math.prod(a.type.shape[:-1]), n=n, k=k, batch=1, dtype=dtype, b_transposed=False,
        activation=_activation(match), has_bias="bias" in match.named, has_residual="residual" in match.named))


def _activation(match) -> str | None:
    """The epilogue activation of a match, by its kernels' name (codegen reads it alike)."""
    if "activation" not in match.named:
        return None
    call = match.call_of("activation")
    if call.op.name == "gelu":
        return "gelu" if call.attrs.get("approximate", "none") == "none" else "gelu_tanh"
    return call.op.name


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
    return unsupported_reason(GemmProblem(
        m=a.type.shape[-2], n=out.type.shape[-1], k=a.type.shape[-1], batch=math.prod(a.type.shape[:-2]),
        dtype=dtype, b_transposed="transpose" in match.named))


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
    chain; its probabilities may be guarded against NaN): Q, K, V are whatever feeds the
    head-split reshapes, or the fused QKV projection
    when they are its slices (then one parameter, read at three offsets), or a [B, S, H, D]
    value computed outside (a cast that SinkReshapes put after the reshape of an input), or
    heads [B, H, S, D] computed outside (rotary embeddings applied to them); K's and V's
    heads may be repeated for grouped-query attention (read in place)."""
    def source():
        return is_op("strided_slice")(wildcard()) | wildcard()

    def split():
        return is_op("reshape")(source()) | wildcard()

    def heads():
        return is_op("transpose")(split())

    def shared_heads():  # repeat_kv: reshape(broadcast_to(expand_dims(kv, [2]), ..), ..)
        return is_op("reshape")(is_op("broadcast_to")(is_op("expand_dims")(heads() | wildcard())))

    # the two-transpose form first: the wildcard of split() would take its inner transpose
    keys = is_op("transpose")(shared_heads() | heads()) | is_op("transpose")(split())
    scores = is_op("matmul")(heads() | wildcard(), keys)
    scores = with_scale(scores) | scores
    scores = _add(scores, wildcard()) | scores
    probabilities = is_op("softmax")(scores)
    # torch's exporter guards scaled_dot_product_attention's probabilities against NaN (rows
    # whose every key is masked with -inf): where(isnan(p), 0, p), isnan imported as p != p
    guarded = is_op("where")(is_op("not_equal")(probabilities, probabilities), is_const(), probabilities)
    context = is_op("transpose")(is_op("matmul")(guarded | probabilities, shared_heads() | heads() | wildcard()))
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


# A stem conv of 4 input channels (RGB padded by PadConvChannels) with at most this many
# multiply-adds per output pixel (R*S*4*K: MobileNetV3's 3x3 into 16 channels is 576,
# EfficientNet's into 32 is 1152) is left to the built-in backend's direct kernel
# (backends/builtin/shim/cuda/depthwise.cuh, few_channels_kernel): CUTLASS's fixed-channel
# implicit GEMM took 75 and 130 us on them at batch 32 (H200) for a few us of arithmetic.
# Larger ones (ResNet's 7x7 into 64: 12,544) need the tensor cores.
DIRECT_STEM_MAX_MACS = 2048


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
    out_channels = weight.type.shape[0]
    batch, height, width, channels = data.type.shape
    _, out_h, out_w, _ = out.type.shape
    problem = ConvProblem(batch, height, width, channels, out_channels, weight.type.shape[1], weight.type.shape[2],
                          out_h, out_w, tuple(attrs["strides"]), tuple(attrs["pads"]), tuple(attrs["dilations"]),
                          dtype, _activation(match), "bias" in match.named, "residual" in match.named)
    # Past one arch's limits the conv is refused for both: a target whose kernels could not
    # run it would fail the build, where the built-in backend runs it. Then C of 4 (an RGB
    # stem PadConvChannels padded) is the fixed-channel kernels', other C and every K must
    # be multiples of 8.
    flaw = filter_size_flaw(problem) or im2col_flaw(problem) or tensor_bytes_flaw(problem) or \
        conv_epilogue_flaw(match, out_channels) or unsupported_reason(problem)
    macs = weight.type.shape[1] * weight.type.shape[2] * channels * out_channels
    if flaw is None and channels == 4 and macs <= DIRECT_STEM_MAX_MACS:
        return (f"4 input channels and {macs} multiply-adds a pixel (at most {DIRECT_STEM_MAX_MACS}): the built-in "
                f"backend's direct kernel runs it; an implicit GEMM of depth {macs // out_channels} leaves the "
                f"tensor cores idle")
    return flaw


def conv2d_patterns() -> list:
    """conv2d [+ bias] [+ residual] [-> activation] (pattern/epilogues.py)."""
    return [PatternEntry(*entry) for entry in conv2d_epilogue_patterns(check_conv2d)]


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
