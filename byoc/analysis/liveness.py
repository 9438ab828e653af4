"""Liveness of the tensors of a flat function (main after MarkCompilerFunctionsAsExtern:
`%v = @extern(...)` bindings): where each is defined and where it is last read.

Liveness comes from uses, not from allocation sites (as in TVM's Relax liveness
analysis): a tensor is live from the binding that defines it to the last binding that
reads it; the function's results live to the end; caller-owned inputs and constants are
left out; a tuple or a TupleGetItem keeps every tensor it refers to alive as long as the
tuple itself is used. So does a call to a "view" symbol (a backend function whose result
only reinterprets its first argument, e.g. a reshape): its result is no tensor of its
own, and the argument's tensor lives as long as the view is used. PlanMemory
(transform/plan_memory.py) places tensors by these lifetimes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.expr import Call, Function, GlobalVar, Tuple, TupleGetItem, Var
from ..ir.types import TensorType, numpy_dtype


@dataclass
class Lifetime:
    var: Var
    first: int  # index of the defining binding
    last: int  # index of the last binding that reads it (len(bindings) for results)
    size: int


def tensor_bytes(type_: TensorType) -> int:
    return math.prod(type_.shape) * numpy_dtype(type_.dtype).itemsize


def analyze_liveness(func: Function, exclude: set | None = None, views=frozenset()) -> list[Lifetime]:
    """First definition and last use of every tensor bound in `func` (params and the
    Vars in `exclude` are left out: the caller owns them). Calls to the global symbols
    named in `views` are views of their first argument."""
    exclude = set(exclude or ())
    end = len(func.bindings)
    first: dict = {}
    last: dict = {}
    # A Var bound to a Tuple or TupleGetItem is a view: it maps to the tensors it shows.
    # tuple_fields[var][i] lists the tensors behind field i of a tuple-valued view.
    tuple_fields: dict = {}
    view_of: dict = {}

    def tensors_of(expr) -> list:
        if isinstance(expr, Var):
            if expr in tuple_fields:
                return [t for field_tensors in tuple_fields[expr] for t in field_tensors]
            return view_of.get(expr, [expr])
        if isinstance(expr, Tuple):
            return [t for f in expr.fields for t in tensors_of(f)]
        if isinstance(expr, TupleGetItem):
            source = expr.tuple_value
            if isinstance(source, Var) and source in tuple_fields:
                return list(tuple_fields[source][expr.index])
            if isinstance(source, Tuple):
                return tensors_of(source.fields[expr.index])
            return tensors_of(source)
        if isinstance(expr, Call):
            return [t for a in expr.args for t in tensors_of(a)]
        return []  # constants and globals need no storage

    for index, binding in enumerate(func.bindings):
        var, value = binding.var, binding.value
        for used in tensors_of(value):
            last[used] = max(last.get(used, index), index)
        if isinstance(value, Tuple):
            tuple_fields[var] = [tensors_of(f) for f in value.fields]
        elif isinstance(value, TupleGetItem) or isinstance(value, Var):
            view_of[var] = tensors_of(value)
        elif is_view_call(value, views):
            view_of[var] = tensors_of(value.args[0])
        else:
            first[var] = index
            last.setdefault(var, index)
    for used in tensors_of(func.result):
        last[used] = end
    lifetimes = []
    for var, start in first.items():
        if var in exclude or not isinstance(var.type, TensorType):
            continue
        lifetimes.append(Lifetime(var, start, last[var], tensor_bytes(var.type)))
    return lifetimes


def is_view_call(value, views) -> bool:
    """A call to one of the `views` symbols (whose result reinterprets its first argument)
    on a computed tensor (a view of a constant stays a call: its storage is the weights')."""
    return (isinstance(value, Call) and isinstance(value.op, GlobalVar) and value.op.name in views
            and len(value.args) >= 1 and isinstance(value.args[0], Var))
