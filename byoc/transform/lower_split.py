"""LowerSplit: every `split` in main becomes one `strided_slice` per piece.

    %t = split(%x, axis=-1, sizes=[768, 768, 768])      %t_0 = strided_slice(%x, begin=[0], end=[768], axes=[2])
    %q = %t.0                                    ->      %t_1 = strided_slice(%x, begin=[768], end=[1536], axes=[2])
    %k = %t.1                                            %t_2 = strided_slice(%x, begin=[1536], end=[2304], axes=[2])

and every `%t.i` is replaced by piece i. Runs before partitioning, so that patterns see the
slices (cutlass's fused attention reads Q, K and V straight out of a fused QKV projection
through them) and so that every builtin function returns one tensor, which is what the
host's calling convention (`results[0]`) and the memory planner expect. Where the tuple
itself is used (returned, passed to a call), a Tuple of the pieces is bound in its place.
"""
from __future__ import annotations

from ..ir.expr import Binding, Call, Expr, Function, Tuple, TupleGetItem, Var, substitute_vars, vars_read
from ..ir.module import IRModule
from ..ir.op import Op, get_op


def lower_split(mod: IRModule) -> IRModule:
    """A new module whose main has no split calls."""
    return mod.with_function("main", lower_split_in(mod["main"]))


def lower_split_in(main: Function) -> Function:
    """`main` with each split replaced by strided_slices and its tuple items by the pieces."""
    return lower_split_with_pieces(main)[0]


def lower_split_with_pieces(main: Function) -> tuple[Function, dict, dict]:
    """lower_split_in(main), the split var -> the piece vars it became, and each tuple-item
    var of a split -> the piece it names (what PinDevices needs to carry pins over)."""
    if not any(_is_split(b.value) for b in main.bindings):
        return main, {}, {}
    tuple_uses = _uses_other_than_get_item(main)
    pieces_of: dict[Var, list[Var]] = {}
    alias: dict[Var, Var] = {}  # tuple-item variable -> the piece it names
    bindings: list[Binding] = []
    for binding in main.bindings:
        value = substitute_vars(binding.value, alias)
        if _is_split(value):
            pieces = _split_pieces(binding.var, value)
            bindings.extend(pieces)
            pieces_of[binding.var] = [piece.var for piece in pieces]
            if binding.var in tuple_uses:
                bindings.append(Binding(binding.var, Tuple(pieces_of[binding.var])))
        elif isinstance(value, TupleGetItem) and value.tuple_value in pieces_of:
            alias[binding.var] = pieces_of[value.tuple_value][value.index]
        else:
            bindings.append(Binding(binding.var, value))
    lowered = Function(main.params, bindings, substitute_vars(main.result, alias), main.ret_type, main.attrs)
    return lowered, pieces_of, alias


def _is_split(value: Expr) -> bool:
    return isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "split"


def _split_pieces(split_var: Var, split: Call) -> list[Binding]:
    (data,) = split.args
    axis = split.attrs["axis"] % data.type.ndim
    pieces = []
    begin = 0
    for index, size in enumerate(split.attrs["sizes"]):
        piece = Call(get_op("strided_slice"), [data],
                     {"begin": [begin], "end": [begin + size], "axes": [axis]})
        pieces.append(Binding(Var(f"{split_var.name_hint}_{index}", piece.type), piece))
        begin += size
    return pieces


def _uses_other_than_get_item(main: Function) -> set[Var]:
    """Variables read by something other than a TupleGetItem of them."""
    used: set[Var] = set()
    for binding in main.bindings:
        value = binding.value
        if isinstance(value, TupleGetItem) and isinstance(value.tuple_value, Var):
            continue
        used.update(vars_read(value))
    used.update(vars_read(main.result))
    return used
