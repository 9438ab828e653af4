"""DeadCodeElimination: drop bindings nobody reads and globals nobody calls.

Rewrites:

- In every function with a body (nested local functions included), a binding whose
  variable is not read by a later binding or by the result is removed. Every call is
  treated as pure, because the IR has no side effects: a call's only effect is its
  result. Removal cascades: a binding read only by removed bindings is removed too.
- Global functions not reachable from `entry_functions` (through calls, or any other
  reference to their GlobalVar, in reachable bodies) are removed. Extern declarations
  are globals like any other: kept while something reachable refers to them, removed
  otherwise.

Leaves alone: parameters (even unused ones: they are the function's signature), the
order of the remaining bindings and globals, and all attributes.
"""
from __future__ import annotations

from ..ir.expr import Binding, Call, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from ..ir.module import IRModule


def dead_code_elimination(mod: IRModule, entry_functions=("main",)) -> IRModule:
    """A new module without unused bindings and without globals that the entry functions
    cannot reach. Raises ValueError when an entry function is not in the module."""
    if isinstance(entry_functions, str):
        entry_functions = (entry_functions,)
    missing = [name for name in entry_functions if name not in mod]
    if missing:
        raise ValueError(
            f"dead_code_elimination: entry function(s) {', '.join('@' + n for n in missing)} "
            f"not in the module; it has {', '.join('@' + n for n in mod) or 'no globals'}")

    # Remove dead bindings first: a global called only from a dead binding is unreachable.
    functions = {name: _remove_unused_bindings(func) for name, func in mod.items()}
    reachable = _reachable_globals(functions, entry_functions)
    kept = {name: func for name, func in functions.items() if name in reachable}
    return IRModule(kept, mod.attrs)


# ---------------------------------------------------------------- unused bindings


def _remove_unused_bindings(func: Function) -> Function:
    if func.is_extern:
        return func
    used: set[Var] = set()
    _collect_vars(func.result, used)
    kept_reversed = []
    # Back to front: by the time a binding is looked at, every reader of it has been.
    for binding in reversed(func.bindings):
        if binding.var not in used:
            continue
        value = binding.value
        if isinstance(value, Function):
            value = _remove_unused_bindings(value)
        _collect_vars(value, used)
        kept_reversed.append(Binding(binding.var, value))
    return Function(func.params, kept_reversed[::-1], func.result, func.ret_type, func.attrs)


def _collect_vars(expr: Expr, into: set[Var]):
    """Add every Var that `expr` reads (callees included) to `into`."""
    for node in _walk(expr):
        if isinstance(node, Var):
            into.add(node)


# ---------------------------------------------------------------- unreachable globals


def _reachable_globals(functions: dict[str, Function], entry_functions) -> set[str]:
    reachable: set[str] = set()
    to_visit = list(entry_functions)
    while to_visit:
        name = to_visit.pop()
        if name in reachable or name not in functions:
            continue
        reachable.add(name)
        to_visit.extend(_referenced_globals(functions[name]))
    return reachable


def _referenced_globals(func: Function) -> set[str]:
    if func.is_extern:
        return set()
    return {node.name for node in _walk(func) if isinstance(node, GlobalVar)}


# ---------------------------------------------------------------- traversal


def _walk(expr: Expr):
    """Every node under `expr` (itself included), nested functions' bodies included."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Call):
            stack.append(node.op)
            stack.extend(node.args)
        elif isinstance(node, Tuple):
            stack.extend(node.fields)
        elif isinstance(node, TupleGetItem):
            stack.append(node.tuple_value)
        elif isinstance(node, Function) and not node.is_extern:
            stack.extend(binding.value for binding in node.bindings)
            stack.append(node.result)
