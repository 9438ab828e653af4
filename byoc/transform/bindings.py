"""What the local rewrites of a function's bindings share: who produces and who reads each
value, and running a one-rewrite-at-a-time pass until nothing changes."""
from __future__ import annotations

from ..ir.expr import Function
from .fuse_ops_by_pattern import _uses


class BindingIndex:
    """A function's bindings by variable: `producers[var]` is (binding index, value),
    `uses[var]` the indices of the bindings that read it (len(bindings): the result)."""

    def __init__(self, function: Function):
        self.bindings = list(function.bindings)
        self.producers = {binding.var: (index, binding.value) for index, binding in enumerate(self.bindings)}
        self.uses = _uses(function)

    def only_reader(self, var) -> int | None:
        """The index of the one binding that reads `var`, or None where it has several or none."""
        readers = self.uses.get(var, [])
        return readers[0] if len(readers) == 1 else None


def rewrite_until_stable(function: Function, rewrite_once) -> Function:
    """`rewrite_once(function)` (a new Function, or None when there is nothing left to
    rewrite) applied until it returns None: one rewrite at a time, since each changes the
    uses the next one checks."""
    rewritten = rewrite_once(function)
    while rewritten is not None:
        function = rewritten
        rewritten = rewrite_once(function)
    return function
