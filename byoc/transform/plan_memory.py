"""PlanMemory: static storage for every intermediate tensor of the final main.

An analysis, not a rewrite: it reads main after MarkCompilerFunctionsAsExtern (a flat list
of `%v = @extern(...)` bindings) and returns a MemoryPlan that the host code uses.

Liveness comes from uses, not from allocation sites (as in TVM's Relax liveness
analysis): a tensor is live from the binding that defines it to the last binding that
reads it; the function's results live to the end; caller-owned inputs and constants are
not planned; a tuple or a TupleGetItem keeps every tensor it refers to alive as long as
the tuple itself is used. So does a call to a "view" symbol (a backend function whose
result only reinterprets its first argument, e.g. a reshape): its result gets no storage
of its own, and the argument's tensor lives as long as the view is used.

Placement is greedy over lifetimes: tensors taken in some order each take the lowest
256-byte-aligned offset that does not overlap any already placed tensor whose lifetime
intersects its own. The order matters and no one order is best for every graph, so three
are tried and the smallest arena kept: by size (largest first, then by first
definition), by size then longest lifetime, and by area (size x lifetime). It is not
optimal in general, but on the long chains of deep-learning graphs it lands at or close
to the lower bound (the largest sum of simultaneously live bytes), which the plan reports
next to the no-reuse sum.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..ir.expr import Call, Function, GlobalVar, Tuple, TupleGetItem, Var
from ..ir.types import TensorType, numpy_dtype

ALIGNMENT = 256


def _align(value: int) -> int:
    return (value + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _bytes(type_: TensorType) -> int:
    return math.prod(type_.shape) * numpy_dtype(type_.dtype).itemsize


@dataclass
class Lifetime:
    var: Var
    first: int  # index of the defining binding
    last: int  # index of the last binding that reads it (len(bindings) for results)
    size: int


@dataclass
class MemoryPlan:
    offsets: dict = field(default_factory=dict)  # Var -> byte offset in the arena
    lifetimes: list = field(default_factory=list)
    planned_bytes: int = 0  # the arena size
    no_reuse_bytes: int = 0  # every tensor in its own aligned slot
    lower_bound_bytes: int = 0  # the most bytes live at any one point

    def summary(self) -> dict:
        return {"planned_bytes": self.planned_bytes, "no_reuse_bytes": self.no_reuse_bytes,
                "lower_bound_bytes": self.lower_bound_bytes, "tensors": len(self.lifetimes),
                "reuse_factor": round(self.no_reuse_bytes / self.planned_bytes, 2) if self.planned_bytes else None,
                "over_lower_bound": round(self.planned_bytes / self.lower_bound_bytes, 3)
                if self.lower_bound_bytes else None}


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
        lifetimes.append(Lifetime(var, start, last[var], _bytes(var.type)))
    return lifetimes


def _place(order: list) -> tuple[int, dict]:
    """(arena bytes, Var -> offset) placing `order`'s tensors first-fit in that order."""
    placed: list[tuple[int, int, Lifetime]] = []  # (offset, end, lifetime)
    offsets = {}
    for item in order:
        conflicts = sorted((o, e) for o, e, other in placed
                           if not (other.last < item.first or item.last < other.first))
        offset = 0
        for start, stop in conflicts:
            if offset + item.size <= start:
                break  # fits in the gap before this conflict
            offset = max(offset, _align(stop))
        offsets[item.var] = offset
        placed.append((offset, offset + item.size, item))
    return _align(max((end for _, end, _ in placed), default=0)), offsets


def is_view_call(value, views) -> bool:
    """A call to one of the `views` symbols (whose result reinterprets its first argument)
    on a computed tensor (a view of a constant stays a call: its storage is the weights')."""
    return (isinstance(value, Call) and isinstance(value.op, GlobalVar) and value.op.name in views
            and len(value.args) >= 1 and isinstance(value.args[0], Var))


def plan_memory(func: Function, exclude: set | None = None, views=frozenset()) -> MemoryPlan:
    """Offsets for the tensors of `func` (main after MarkCompilerFunctionsAsExtern);
    `views`: see analyze_liveness."""
    lifetimes = analyze_liveness(func, exclude, views)
    orders = (lambda l: (-l.size, l.first),
              lambda l: (-l.size, l.first - l.last, l.first),
              lambda l: (-l.size * (l.last - l.first + 1), l.first))
    planned, offsets = min((_place(sorted(lifetimes, key=order)) for order in orders), key=lambda p: p[0])
    no_reuse = sum(_align(l.size) for l in lifetimes)
    lower_bound = 0
    for step in range(len(func.bindings) + 1):
        live = sum(_align(l.size) for l in lifetimes if l.first <= step <= l.last)
        lower_bound = max(lower_bound, live)
    return MemoryPlan(offsets=offsets, lifetimes=lifetimes, planned_bytes=planned,
                      no_reuse_bytes=no_reuse, lower_bound_bytes=lower_bound)
