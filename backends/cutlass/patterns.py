"""The cutlass pattern table: GEMMs with their epilogues, and batched attention matmuls.

Rows are tried in order (larger patterns first). Every check returns None or the reason
the kernel cannot take the match; the partition report shows the reasons and the work
falls to the next backend.
"""
from __future__ import annotations

from byoc.backend import PatternEntry
from byoc.pattern import is_op, wildcard

FLOAT_TYPES = ("float16", "bfloat16")
ACTIVATIONS = ("gelu", "relu", "silu", "sigmoid")


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


def pattern_table() -> list:
    plain = dense()
    return [
        PatternEntry("dense_bias_residual", with_residual(with_bias(plain)), check_dense),
        PatternEntry("dense_bias_activation", with_activation(with_bias(plain)), check_dense),
        PatternEntry("dense_bias", with_bias(plain), check_dense),
        PatternEntry("dense_activation", with_activation(plain), check_dense),
        PatternEntry("dense", plain, check_dense),
        PatternEntry("batched_matmul_nt",
                     is_op("matmul")(wildcard().named("a"),
                                     is_op("transpose")(wildcard().named("b")).named("transpose")).named("matmul"),
                     check_transposed_batched),
        PatternEntry("batched_matmul", is_op("matmul")(wildcard().named("a"), wildcard().named("b")).named("matmul"),
                     check_batched),
    ]
