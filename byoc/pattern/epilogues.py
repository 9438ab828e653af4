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


__all__ = ["ACTIVATIONS", "add_either_order", "with_activation", "with_bias", "with_residual"]
