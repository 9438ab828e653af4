"""RecognizeGelu: GELU written out as arithmetic becomes one gelu call.

Exporters write GELU as `x * 0.5 * (1 + erf(x / sqrt(2)))` (in several orders of the
multiplications, and with `x * (1/sqrt(2))` for the division), and its tanh
approximation (GPT-2's `gelu_new`, `gelu_pytorch_tanh`) as
`0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))` with x^3 as `pow(x, 3)` or
`x * x * x`. Backends fuse `gelu` into GEMM epilogues, so recognizing it matters for
speed. Rewrites, in every function, a matched chain whose intermediates have no other use
into `gelu(x)` with approximate="none" (erf) or "tanh"; leaves alone chains whose
constants differ from those (within 1e-3), and chains with an intermediate used
elsewhere.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function
from ..ir.module import IRModule
from ..pattern import is_op, match, wildcard
from .fuse_ops_by_pattern import _uses


def _scalar(value: float):
    def check(expr):
        return isinstance(expr, Constant) and expr.data.size == 1 and \
            abs(float(np.asarray(expr.data, dtype=np.float64).reshape(-1)[0]) - value) < 1e-3 * max(1.0, abs(value))
    return wildcard().where(check)


def _commutative(op, a, b):
    return is_op(op)(a, b) | is_op(op)(b, a)


def _outer_forms(x, one_plus):
    """0.5 * x * one_plus, in the orders exporters write it."""
    half_x = _commutative("multiply", x, _scalar(0.5))
    return [
        _commutative("multiply", _commutative("multiply", x, one_plus), _scalar(0.5)),  # (x * (1+f)) * 0.5
        _commutative("multiply", half_x, one_plus),  # (x * 0.5) * (1+f)
        _commutative("multiply", x, _commutative("multiply", one_plus, _scalar(0.5))),
    ]


def _gelu_patterns():
    """(pattern, approximate) pairs."""
    x = wildcard().named("x")
    scaled = is_op("divide")(x, _scalar(math.sqrt(2))) | _commutative("multiply", x, _scalar(1 / math.sqrt(2)))
    one_plus_erf = _commutative("add", is_op("erf")(scaled), _scalar(1.0))
    cube = is_op("power")(x, _scalar(3.0)) | _commutative("multiply", _commutative("multiply", x, x), x)
    inner = _commutative("add", x, _commutative("multiply", cube, _scalar(0.044715)))
    one_plus_tanh = _commutative("add", is_op("tanh")(_commutative("multiply", inner, _scalar(math.sqrt(2 / math.pi)))),
                                 _scalar(1.0))
    return [(pattern, "none") for pattern in _outer_forms(x, one_plus_erf)] + \
        [(pattern, "tanh") for pattern in _outer_forms(x, one_plus_tanh)]


def recognize_gelu(mod: IRModule) -> IRModule:
    return mod.map_bodies(_rewrite)


def _rewrite(function: Function) -> Function:
    bindings = list(function.bindings)
    producers = {b.var: b.value for b in bindings if isinstance(b.value, Call)}
    uses = _uses(function)
    replaced, removed = {}, set()
    for binding in reversed(bindings):
        root = binding.var
        if root in removed or root not in producers:
            continue
        for pattern, approximate in _gelu_patterns():
            found = match(pattern, root, producers)
            if found is None:
                continue
            x = found["x"]
            inner = [v for v in found.matched if v is not root]
            if any(len(uses.get(v, [])) != 1 for v in inner) or any(v in removed for v in found.matched):
                continue
            if not isinstance(x.type.dtype, str) or not x.type.dtype.startswith(("float", "bfloat")):
                continue
            replaced[root] = Call("gelu", [x], {"approximate": approximate})
            removed.update(inner)
            break
    if not replaced:
        return function
    new_bindings = []
    for binding in bindings:
        if binding.var in removed:
            continue
        if binding.var in replaced:
            new_bindings.append(Binding(binding.var, replaced[binding.var]))
        else:
            new_bindings.append(binding)
    return Function(function.params, new_bindings, function.result, function.ret_type, function.attrs)
