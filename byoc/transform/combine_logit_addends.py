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

Also where the second add sees the scores with their batch axis split in two, as Swin's
shifted windows add their mask per window:

    %s1 = add(%scores, %bias)                       [B*W, H, N, N] + [1, H, N, N]
    %r1 = reshape(%s1, [B, W, H, N, N])
    %s2 = add(%r1, %mask)                           + [1, W, 1, N, N]
    %r2 = reshape(%s2, [B*W, H, N, N])      ->      %r2 = add(%scores, const(bias + mask))
    %p = softmax(%r2, axis=-1)                      %p = softmax(%r2, axis=-1)

when bias and mask are constants and their sum, at the scores' full shape, is at most
MAX_COMBINED_BYTES (Swin-T at batch 8: 7.4 MB at its largest): a constant the fused
attention reads per batch and head.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Var, is_op_call
from ..ir.module import IRModule
from .bindings import BindingIndex, rewrite_until_stable


# the largest constant sum of a bias and a per-window mask this pass writes
MAX_COMBINED_BYTES = 64 << 20


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
        if is_op_call(outer, ("reshape",)) and only_reader(outer_var) == index:
            windowed = _windowed(outer, outer_var, producers, only_reader, outer_index)
            if windowed is not None:
                scores, combined = windowed
                bindings[outer_index] = Binding(outer_var, Call("add", [scores, combined]))
                return Function(function.params, bindings, function.result, function.ret_type, function.attrs)
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


def _windowed(merge: Call, merge_var: Var, producers: dict, only_reader, merge_index: int):
    """(scores, the constant bias + mask at the scores' shape) of
    reshape(add(reshape(add(scores, bias)), mask)) whose reshapes split the scores' batch
    axis in two and merge it back (the module docstring), or None."""
    def producer(var, reader_index, op):
        if not isinstance(var, Var) or var not in producers:
            return None, None
        index, value = producers[var]
        if not is_op_call(value, (op,)) or only_reader(var) != reader_index:
            return None, None
        return index, value
    window_add_index, window_add = producer(merge.args[0], merge_index, "add")
    if window_add is None:
        return None
    split_var = next((a for a in window_add.args if isinstance(a, Var) and a.type == window_add.type), None)
    mask = next((a for a in window_add.args if a is not split_var), None)
    split_index, split = producer(split_var, window_add_index, "reshape")
    if split is None or not isinstance(mask, Constant):
        return None
    _, biased = producer(split.args[0], split_index, "add")
    if biased is None:
        return None
    scores_type = merge_var.type
    full = [a for a in biased.args if not isinstance(a, Constant) and a.type == scores_type]
    bias = next((a for a in biased.args if isinstance(a, Constant)), None)
    if len(full) != 1 or bias is None or split.args[0].type != scores_type:
        return None
    scores_shape, split_shape = tuple(scores_type.shape), tuple(split.type.shape)
    if len(split_shape) != len(scores_shape) + 1 or split_shape[2:] != scores_shape[1:] or \
            split_shape[0] * split_shape[1] != scores_shape[0]:
        return None  # not the batch axis split in two
    if scores_type.size * np.dtype(np.asarray(bias.data).dtype).itemsize > MAX_COMBINED_BYTES:
        return None
    try:
        at_split = np.broadcast_to(np.asarray(bias.data), scores_shape).reshape(split_shape)
        combined = (at_split + np.broadcast_to(np.asarray(mask.data), split_shape)).reshape(scores_shape)
    except ValueError:
        return None  # an addend that does not broadcast where it is added
    return full[0], Constant(np.ascontiguousarray(combined.astype(np.asarray(bias.data).dtype)), bias.type.dtype)
