"""The cudnn pattern table: NHWC 2-D convolutions of any window, stride, dilation and
grouping (dense, grouped, depthwise) with their epilogue act(conv + bias + residual), each
one cuDNN operation graph (engine/cudnn_conv.cc). Larger patterns first; every check
returns None or why cuDNN's graph cannot take the match (the partition report shows it).

Whether cuDNN has an engine for a conv is known only on a GPU: a build that can measure
times every plan the heuristics propose (plans.py) and a conv none of them runs fails
there, which `partition: measured` reads as the candidate's failure."""
from __future__ import annotations

import math

from byoc.backend import PatternEntry, partition_target
from byoc.pattern.epilogues import conv2d_epilogue_patterns, conv_epilogue_flaw

DTYPES = ("float32", "float16", "bfloat16")
# cuDNN's pointwise modes for byoc's activations (hard_swish has none)
ACTIVATIONS = ("relu", "gelu", "silu", "sigmoid")
# cuDNN indexes a tensor with 32-bit integers
MAX_ELEMENTS = (1 << 31) - 1


def check_conv2d(match) -> str | None:
    data, weight, out = match["data"], match["weight"], match.output
    attrs = match.call_of("conv2d").attrs
    dtype = out.type.dtype
    if dtype not in DTYPES:
        return f"dtype {dtype} (cuDNN's graph here takes {', '.join(DTYPES)})"
    target = partition_target("cudnn")
    if dtype == "float32" and target is not None and not target.attrs["tf32"]:
        return ("float32 with tf32 off (without TF32 tensor cores cuDNN 9 has no engine for many fused float32 "
                "convs; tf32: true lets cudnn take them)")
    if attrs["data_layout"] != "NHWC":
        return (f"data_layout {attrs['data_layout']} (the cudnn backend takes NHWC; ConvertConvLayout rewrites NCHW "
                f"chains, float32 ones only with tf32 on)")
    for name, tensor in (("data", data), ("weight", weight), ("output", out)):
        if math.prod(tensor.type.shape) > MAX_ELEMENTS:
            return f"the {name} has {math.prod(tensor.type.shape)} elements (cuDNN indexes at most {MAX_ELEMENTS})"
    return conv_epilogue_flaw(match, weight.type.shape[0])


def pattern_table() -> list:
    return [PatternEntry(*entry) for entry in conv2d_epilogue_patterns(check_conv2d, ACTIVATIONS)]
