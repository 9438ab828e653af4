"""ShrinkBroadcastConstants: a constant operand of a broadcasting op keeps one slice of each
axis along which its values repeat and another operand supplies the extent.

    %y = add(%x: [32, 512, 768], const([32, 512, 768]))   # every batch row the same
    ->
    %y = add(%x: [32, 512, 768], const([1, 512, 768]))

FoldConstant folds what a model computes from constants alone, and exporters build some of
that at the full shape of the activations it meets: transformers' BERT adds its token-type
and position embeddings, gathered at `expand`ed all-zero token types and position ids, as
one [batch, sequence, hidden] tensor. Folded, that is 25 MB of weights at batch 32 and
sequence 512 (and in every shape bucket of a dynamic-shape library), all of it repeats of
one slice; broadcasting gives the op the same values from the slice.

Rewrites, in every function with a body, each call of a broadcasting op (binary arithmetic,
comparisons, `where`) whose operands include a constant: along each axis of the constant
(right-aligned, as broadcasting aligns them) where the constant's extent is more than 1, all
its slices are equal bit for bit (so -0.0 is not 0.0), and the operands' broadcast shape
without that extent is still the call's shape (another operand has it), the constant keeps
its first slice, where that saves at least `min_saved_bytes` (1 MiB: a small constant is
not worth a shape the backends' patterns may not take, such as a bias of one element). The
result and its type are unchanged; exactly: each element of the result reads the same bits.

The builder runs it after recording the simplified module that shape buckets compare
(analysis/padding.py): a constant shrunk at one bucket's size and not at another's would
look like the start of the other's there.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, is_op_call
from ..ir.module import IRModule
from ..ir.types import TensorType
from ..ops._common import broadcast_shapes
from ..ops.elementwise import BINARY_OPS

BROADCASTING_OPS = tuple(BINARY_OPS) + ("where",)


MIN_SAVED_BYTES = 1 << 20


def shrink_broadcast_constants(mod: IRModule, min_saved_bytes: int = MIN_SAVED_BYTES) -> IRModule:
    return mod.map_bodies(lambda function: _shrink(function, min_saved_bytes))


def _shrink(function: Function, min_saved_bytes: int) -> Function:
    bindings, changed = [], False
    for binding in function.bindings:
        value = binding.value
        if is_op_call(value, BROADCASTING_OPS) and isinstance(binding.var.type, TensorType) and \
                any(isinstance(arg, Constant) for arg in value.args):
            args = _shrunk_args(value.args, tuple(binding.var.type.shape), min_saved_bytes)
            if args is not None:
                value = Call(value.op, args, value.attrs)
                changed = True
        bindings.append(binding if value is binding.value else Binding(binding.var, value))
    if not changed:
        return function
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)


def _shrunk_args(args: list, shape: tuple, min_saved_bytes: int) -> list | None:
    """The call's operands with their constants shrunk, or None where none shrinks."""
    if not all(isinstance(arg.type, TensorType) for arg in args):
        return None
    shapes = [tuple(arg.type.shape) for arg in args]
    args = list(args)
    changed = False
    for index, arg in enumerate(args):
        if not isinstance(arg, Constant) or arg.data.nbytes <= min_saved_bytes:
            continue
        data, trial = arg.data, list(shapes)
        for axis in range(data.ndim):
            if data.shape[axis] == 1:
                continue
            trial[index] = data.shape[:axis] + (1,) + data.shape[axis + 1:]
            # with the extent 1 here, another operand must still give the call its shape
            if broadcast_shapes(*trial) != shape or not _repeats_along(data, axis):
                trial[index] = data.shape  # no other operand has the extent, or the slices differ
                continue
            data = data[(slice(None),) * axis + (slice(0, 1),)]
        if data is not arg.data and arg.data.nbytes - data.nbytes >= min_saved_bytes:
            args[index] = Constant(np.ascontiguousarray(data), arg.type.dtype)
            shapes = trial  # the next constant's checks see this one shrunk
            changed = True
    return args if changed else None


def _repeats_along(data: np.ndarray, axis: int) -> bool:
    """Whether every slice of `data` along `axis` has the first one's bits (NaN repeats a
    NaN of the same bits; -0.0 does not repeat 0.0)."""
    bits = data.view(f"u{data.itemsize}") if data.itemsize in (1, 2, 4, 8) else data
    first = bits[(slice(None),) * axis + (slice(0, 1),)]
    second = bits[(slice(None),) * axis + (slice(1, 2),)]
    # most constants differ already in their second slice: a small comparison says so
    return bool(np.array_equal(second, first)) and bool(np.array_equal(bits, np.broadcast_to(first, bits.shape)))

