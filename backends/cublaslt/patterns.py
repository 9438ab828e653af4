"""The cublaslt backend's pattern table: a GEMM (matmul) with the epilogues the engine
fuses (bias, then GELU or ReLU, or a residual add), each with a check whose refusal reason
goes to the partition report."""
from __future__ import annotations

from byoc.backend import PatternEntry
from byoc.pattern import is_op, wildcard

FLOAT_TYPES = ("float32", "float16", "bfloat16")


def _add(x, y):
    return is_op("add")(x, y) | is_op("add")(y, x)


def _check(match) -> str | None:
    a, b, out = match["a"], match["b"], match.output
    if out.type.dtype not in FLOAT_TYPES:
        return f"dtype {out.type.dtype} (the engine takes float32, float16, bfloat16)"
    batch_a, batch_b = a.type.shape[:-2], b.type.shape[:-2]
    if len(b.type.shape) > 2 and tuple(batch_a) != tuple(batch_b):
        return "batch dims broadcast partially (the engine needs equal batches or a 2-D B)"
    if len(a.type.shape) < 2 or len(b.type.shape) < 2:
        return "a vector operand"
    if "bias" in match.named and len(match["bias"].type.shape) != 1:
        return "bias is not a vector"
    if "residual" in match.named and tuple(match["residual"].type.shape) != tuple(out.type.shape):
        return "residual does not have the output's shape"
    return None


def pattern_table() -> list:
    dense = is_op("matmul")(wildcard().named("a"), wildcard().named("b")).named("matmul")
    bias = _add(dense, wildcard().has_rank(1).named("bias"))
    activated = is_op("gelu")(bias) | is_op("relu")(bias)
    return [
        PatternEntry("dense_bias_residual", _add(bias, wildcard().named("residual")), _check),
        PatternEntry("dense_bias_activation", activated, _check),
        PatternEntry("dense_bias", bias, _check),
        PatternEntry("dense", dense, _check),
    ]
