"""CombineLogitAddends: the additive terms of softmax logits are summed first and added to
the scores once.

    %s1 = add(%scores, %bias)                  %m = add(%bias, %mask)
    %s2 = add(%s1, %mask)              ->      %s2 = add(%scores, %m)
    %p = softmax(%s2, axis=-1)                 %p = softmax(%s2, axis=-1)

T5 adds a relative position bias [1, H, S, S] and the padding mask [B, 1, 1, S] to its
attention scores one after the other; the fused attention kernel takes one additive term
(backends/cutlass/attention.py), so with two the whole attention fell apart into batched
GEMMs, copies and a softmax. ALiBi and other biased attentions have the same shape.

Rewrites, in every function with a body, `softmax(add(add(x, a), b))` (either argument
order in both adds) where the inner add is read only by the outer one and the outer only by
the softmax, and x is the one operand of the inner add that has the logits' own type (the
scores; a constant never is). The new add of a and b is placed where the outer add was.
Leaves alone chains read elsewhere and adds whose operands are both of the logits' type.
The sum is rounded in another order (a + b first), as any fused attention would.
"""
from __future__ import annotations

from ..ir.expr import Binding, Call, Constant, Function, Var, is_op_call
from ..ir.module import IRModule
from .bindings import BindingIndex, rewrite_until_stable


def combine_logit_addends(mod: IRModule) -> IRModule:
    return mod.map_bodies(_combine)


def _combine(function: Function) -> Function:
    return rewrite_until_stable(function, _combine_once)  # one chain at a time


def _combine_once(function: Function) -> Function | None:
    table = BindingIndex(function)
    bindings, producers, only_reader = table.bindings, table.producers, table.only_reader

    for index, binding in enumerate(bindings):
        if not is_op_call(binding.value, ("softmax",)) or not isinstance(binding.value.args[0], Var):
            continue
        outer_var = binding.value.args[0]
        outer_index, outer = producers.get(outer_var, (None, None))
        if not is_op_call(outer, ("add",)) or only_reader(outer_var) != index:
            continue
        split = _split(outer, outer_var, producers, only_reader, outer_index)
        if split is None:
            continue
        scores, first, second = split
        addends = Call("add", [first, second])
        combined = Var(f"{outer_var.name_hint}_addends", addends.type)
        bindings[outer_index] = Binding(combined, addends)
        bindings.insert(outer_index + 1, Binding(outer_var, Call("add", [scores, combined])))
        return Function(function.params, bindings, function.result, function.ret_type, function.attrs)
    return None


def _split(outer: Call, outer_var: Var, producers: dict, only_reader, outer_index: int):
    """(scores, inner addend, outer addend) of add(add(scores, a), b), or None."""
    for inner_position in (0, 1):
        inner_var = outer.args[inner_position]
        if not isinstance(inner_var, Var) or inner_var not in producers:
            continue
        _, inner = producers[inner_var]
        if not is_op_call(inner, ("add",)) or only_reader(inner_var) != outer_index:
            continue
        full = [arg for arg in inner.args if not isinstance(arg, Constant) and arg.type == outer_var.type]
        if len(full) != 1:
            return None
        scores = full[0]
        first = inner.args[1] if inner.args[0] is scores else inner.args[0]
        second = outer.args[1 - inner_position]
        return scores, first, second
    return None
