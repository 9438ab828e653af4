"""Pattern builders for the epilogues library kernels fuse after a GEMM or conv (the
cutlass and cudnn backends' tables): a bias vector, a residual of the result's shape and
an activation, each added around a core pattern.

    conv = is_op("conv2d")(wildcard().named("data"), wildcard().named("weight")).named("conv2d")
    with_activation(with_residual(with_bias(conv)), ("relu", "gelu"))
"""
from __future__ import annotations

from . import is_op, wildcard

ACTIVATIONS = ("gelu", "relu", "silu", "sigmoid", "hard_swish")  # hard_swish: MobileNetV3's


def add_either_order(x, y):
    """add(x, y) in either argument order."""
    return is_op("add")(x, y) | is_op("add")(y, x)


def with_bias(core):
    return add_either_order(core, wildcard().has_rank(1).named("bias"))


def with_residual(core):
    return add_either_order(core, wildcard().named("residual"))


def with_activation(core, activations=ACTIVATIONS):
    options = [is_op(name)(core).named("activation") for name in activations]
    pattern = options[0]
    for option in options[1:]:
        pattern = pattern | option
    return pattern


def conv2d():
    """conv2d(data, weight), named for the checks."""
    return is_op("conv2d")(wildcard().named("data"), wildcard().named("weight")).named("conv2d")


def conv2d_epilogue_patterns(check, activations=ACTIVATIONS) -> list:
    """(name, pattern, check) of conv2d [+ bias] [+ residual] [-> activation], larger
    first: the epilogue act(conv + bias + residual), ResNet's `relu(bn(conv(x)) + shortcut)`
    once batch norm is folded into the bias."""
    plain = conv2d()

    def activated(core):
        return with_activation(core, activations)

    return [
        ("conv2d_bias_residual_activation", activated(with_residual(with_bias(plain))), check),
        ("conv2d_bias_residual", with_residual(with_bias(plain)), check),
        ("conv2d_bias_activation", activated(with_bias(plain)), check),
        ("conv2d_bias", with_bias(plain), check),
        ("conv2d_residual_activation", activated(with_residual(plain)), check),
        ("conv2d_activation", activated(plain), check),
        ("conv2d", plain, check),
    ]


def conv_epilogue_flaw(match, out_channels: int) -> str | None:
    """Why a conv2d_epilogue_patterns match's epilogue cannot be fused, or None: a bias that
    is not one value per output channel, a residual of another shape or dtype than the
    output, an unknown GELU approximation."""
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


__all__ = ["ACTIVATIONS", "add_either_order", "conv2d", "conv2d_epilogue_patterns", "conv_epilogue_flaw",
           "with_activation", "with_bias", "with_residual"]
