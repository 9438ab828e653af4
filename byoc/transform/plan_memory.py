"""PlanMemory: static storage for every intermediate tensor of the final main.

An analysis, not a rewrite: it reads main after MarkCompilerFunctionsAsExtern (a flat list
of `%v = @extern(...)` bindings) and returns a MemoryPlan that the host code uses.

Lifetimes come from byoc/analysis/liveness.py: a tensor is live from the binding that
defines it to the last binding that reads it; caller-owned inputs and constants are not
planned; a view (a tuple, a TupleGetItem, a call to a "view" symbol such as a reshape)
gets no storage of its own and keeps the tensors behind it alive.

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

from dataclasses import dataclass, field

from ..analysis.liveness import Lifetime, analyze_liveness
from ..ir.expr import Function

ALIGNMENT = 256


def _align(value: int) -> int:
    return (value + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


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
