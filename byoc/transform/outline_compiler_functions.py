"""OutlineCompilerFunctions: every Compiler function becomes a unique global.

Finds functions with a Compiler attribute bound inline in main or nested in other local
functions (including those marked Inline=1: they are outlined all the same, because a
backend compiles them into a separate extern symbol, whatever a user asked of the
inliner), and makes each a global of the module called from where it was bound.

Symbol cache: before a function is looked up, its non-scalar Constants (the weights) are
lifted into extra parameters that the caller passes, so the functions of the layers of a
transformer, which differ only in their weights, are structurally equal. Structurally
equal functions share ONE global named by a deterministic symbol,
`<backend>_<first 12 hex digits of the structural hash>` (a C identifier; the global's
name is the symbol, also kept as global_symbol). Leaves alone: functions without a
Compiler attribute and the bodies of the outlined functions (composites stay local).
"""
from __future__ import annotations

import re

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, GlobalVar, Var
from ..ir.module import IRModule
from ..ir.structural import structural_equal, structural_hash


def _is_scalar(constant: Constant) -> bool:
    return constant.data.size <= 1


def _lift_constants(function: Function) -> tuple[Function, list]:
    """Non-scalar constants used as call arguments in the function's body -> parameters."""
    lifted: list[Constant] = []
    params = list(function.params)
    new_params: dict = {}

    def replace(arg):
        if isinstance(arg, Constant) and not _is_scalar(arg):
            key = id(arg)
            if key not in new_params:
                param = Var(f"c{len(lifted)}", arg.type)
                new_params[key] = param
                lifted.append(arg)
            return new_params[key]
        return arg

    body = []
    for binding in function.bindings:
        value = binding.value
        if isinstance(value, Call):
            value = Call(value.op, [replace(a) for a in value.args], value.attrs, type_=value.type)
        body.append(Binding(binding.var, value))
    if not lifted:
        return function, []
    return Function(params + [new_params[id(c)] for c in lifted], body, function.result, function.ret_type,
                    function.attrs), lifted


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text) or "backend"


class _SymbolCache:
    def __init__(self, mod: IRModule):
        self.mod = mod
        self.by_hash: dict[int, list[tuple[Function, str]]] = {}

    def symbol_for(self, function: Function) -> str:
        backend = _sanitize(str(function.attrs["Compiler"]))
        # the symbol ignores attributes that do not change the code (Inline, global_symbol)
        key_function = function.with_attrs(Inline=None, global_symbol=None)
        digest = structural_hash(key_function)
        for existing, symbol in self.by_hash.get(digest, []):
            if structural_equal(existing, key_function):
                return symbol
        symbol = f"{backend}_{digest & (2 ** 48 - 1):012x}"
        while symbol in self.mod:
            symbol += "_"
        self.by_hash.setdefault(digest, []).append((key_function, symbol))
        self.mod[symbol] = key_function.with_attrs(global_symbol=symbol)
        return symbol


def outline_compiler_functions(mod: IRModule) -> IRModule:
    mod = mod.copy()
    cache = _SymbolCache(mod)
    for name in list(mod.functions):
        function = mod[name]
        if function.is_extern or "Compiler" in function.attrs:
            continue
        mod[name] = _outline_in(function, cache)
    return mod


def _outline_in(function: Function, cache: _SymbolCache) -> Function:
    local = {}  # var of an inline Compiler function -> that function
    bindings = []
    changed = False
    for binding in function.bindings:
        value = binding.value
        if isinstance(value, Function):
            if "Compiler" in value.attrs:
                local[binding.var] = value
                changed = True
                continue
            inner = _outline_in(value, cache) if value.bindings else value
            if inner is not value:
                changed = True
            bindings.append(Binding(binding.var, inner))
            continue
        if isinstance(value, Call) and (isinstance(value.op, Var) and value.op in local or
                                        isinstance(value.op, Function) and "Compiler" in value.op.attrs):
            target = local[value.op] if isinstance(value.op, Var) else value.op
            lifted_function, lifted = _lift_constants(target)
            symbol = cache.symbol_for(lifted_function)
            callee = GlobalVar(symbol, lifted_function.type)
            bindings.append(Binding(binding.var, Call(callee, list(value.args) + lifted, type_=value.type)))
            changed = True
            continue
        bindings.append(binding)
    if not changed:
        return function
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)
