"""RecognizeRMSNorm: RMSNorm written out as arithmetic becomes one rms_norm call.

Exporters write the RMSNorm of LLaMA, Mistral, Qwen2, T5 and their kin as

    %square = power(%x, 2.0)                      (or multiply(%x, %x))
    %mean = mean(%square, axes=[-1], keepdims=true)
    %variance = add(%mean, epsilon)
    %inverse = reciprocal(sqrt(%variance))        (or divide(1.0, sqrt(..)), rsqrt(..),
    %normalized = multiply(%x, %inverse)           power(.., -0.5); or divide(%x, sqrt(..)))
    %y = multiply(gamma, %normalized)             (gamma optional, a constant vector)
                                      ->  %y = rms_norm(%x, gamma, axis=-1, epsilon=epsilon)

Unfused, that is four to six kernels and as many passes over the activations (the
LLaMA-style decoder of the speed issue spent 17 reductions and 50 elementwise kernels a run
on them); `rms_norm` is one pass, with float32 statistics in every backend that takes it.

Rewrites, in every function, a matched chain over the last axis whose intermediates have no
other reader, with a scalar constant epsilon >= 0 and, where there is one, a constant gamma
of the last axis's size (without one, gamma is a vector of ones). Leaves alone: means over
other or several axes, intermediates read elsewhere, a gamma that is not constant or
scales anything but the last axis, and integer tensors. Runs before ConvertToFloat16, on the
model's own dtype.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function
from ..ir.module import IRModule
from ..pattern import is_op, match, wildcard
from .fuse_ops_by_pattern import _uses


def _scalar(value: float | None = None):
    """A scalar constant (of the given value, where one is given)."""
    def check(expr):
        if not isinstance(expr, Constant) or expr.data.size != 1:
            return False
        return value is None or float(np.asarray(expr.data, np.float64).reshape(-1)[0]) == value
    return wildcard().where(check)


def _commutative(op, a, b):
    return is_op(op)(a, b) | is_op(op)(b, a)


def _rms_norm_pattern():
    x = wildcard().named("x")
    square = is_op("power")(wildcard().named("squared"), _scalar(2.0)) | \
        is_op("multiply")(wildcard().named("squared"), wildcard().named("squared_too"))
    variance = _commutative("add", is_op("mean")(square).named("mean"), _scalar().named("epsilon"))
    root = is_op("sqrt")(variance)
    inverse = is_op("rsqrt")(variance) | is_op("reciprocal")(root) | is_op("divide")(_scalar(1.0), root) | \
        is_op("power")(variance, _scalar(-0.5))
    normalized = _commutative("multiply", x, inverse) | is_op("divide")(x, root)
    gamma = wildcard().where(lambda e: isinstance(e, Constant)).named("gamma")
    return _commutative("multiply", normalized.named("normalized"), gamma) | normalized.named("normalized")


def recognize_rms_norm(mod: IRModule) -> IRModule:
    return mod.map_bodies(_rewrite)


def _rms_norm_call(found, root) -> Call | None:
    """The rms_norm call the match computes, or None where one of the checks fails."""
    x = found["x"]
    named = found.named
    if named["squared"] is not x or named.get("squared_too", x) is not x:
        return None
    dtype = x.type.dtype
    if not isinstance(dtype, str) or not dtype.startswith(("float", "bfloat")) or len(x.type.shape) < 1:
        return None
    rank = len(x.type.shape)
    mean = found.producers[named["mean"]]
    if [int(a) % rank for a in mean.attrs["axes"]] != [rank - 1] or not mean.attrs["keepdims"]:
        return None
    epsilon = float(np.asarray(named["epsilon"].data, np.float64).reshape(-1)[0])
    if not np.isfinite(epsilon) or epsilon < 0:
        return None
    if tuple(root.type.shape) != tuple(x.type.shape) or root.type.dtype != dtype:
        return None
    channels = x.type.shape[-1]
    gamma = named.get("gamma")
    if gamma is None:
        gamma_data = np.ones((channels,), dtype)
    else:
        shape = tuple(gamma.type.shape)
        if gamma.type.dtype != dtype or not shape or shape[-1] != channels or any(s != 1 for s in shape[:-1]) \
                or len(shape) > rank:
            return None
        gamma_data = np.asarray(gamma.data).reshape(channels)
    return Call("rms_norm", [x, Constant(np.ascontiguousarray(gamma_data), dtype)],
                {"axis": -1, "epsilon": epsilon})


def _rewrite(function: Function) -> Function:
    bindings = list(function.bindings)
    producers = {b.var: b.value for b in bindings if isinstance(b.value, Call)}
    uses = _uses(function)
    replaced, removed = {}, set()
    pattern = _rms_norm_pattern()
    for binding in reversed(bindings):
        root = binding.var
        if root in removed or root in replaced or not isinstance(binding.value, Call):
            continue
        found = match(pattern, root, producers)
        if found is None:
            continue
        inner = [v for v in found.matched if v is not root]
        if any(len(uses.get(v, [])) != 1 for v in inner) or any(v in removed for v in found.matched):
            continue
        call = _rms_norm_call(found, root)
        if call is None:
            continue
        replaced[root] = call
        removed.update(inner)
    if not replaced:
        return function
    new_bindings = [Binding(b.var, replaced[b.var]) if b.var in replaced else b
                    for b in bindings if b.var not in removed]
    return Function(function.params, new_bindings, function.result, function.ret_type, function.attrs)
