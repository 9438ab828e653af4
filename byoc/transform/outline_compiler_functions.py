"""OutlineCompilerFunctions: every Compiler function becomes a unique global.

Finds functions with a Compiler attribute bound inline in main or nested in other local
functions, and makes each a global of the module, called from where it was bound. It
outlines even functions that carry Inline=1: a backend compiles them into a separate
extern symbol whatever a user asked of an inliner (Inline is dropped from the global,
where it means nothing).

    %test_region = fn (%p0: T) -> T [Compiler="test", Inline=1] {
      %r = add(%p0, const([...]))
      return %r
    }
    %y = %test_region(%x)
becomes
    %y = @test_3f2a9c01b4de(%x, const([...]))
    def @test_3f2a9c01b4de(%p0: T, %c0: W) -> T [Compiler="test", global_symbol="test_3f2a9c01b4de"] {...}

Symbol cache: before a function is looked up, its non-scalar Constants (the weights),
also those inside its composites, are lifted into extra trailing parameters that the
caller passes, so the functions of the layers of a transformer, which differ only in
their weights, are structurally equal. Structurally equal functions share ONE global,
named by a deterministic symbol `<backend>_<first 12 hex digits of the structural hash>`
(a C identifier: the global's name is the symbol, also kept as global_symbol until
MarkCompilerFunctionsAsExtern). Compiler globals already in the module are in the cache
from the start, so an inlined copy of one calls it. Leaves alone: functions without a
Compiler attribute, Compiler globals, and the bodies of the outlined functions
(composites stay local functions inside them).
"""
from __future__ import annotations

import re

from ..ir.expr import Binding, Call, Constant, Function, GlobalVar, Tuple, Var
from ..ir.module import IRModule
from ..ir.structural import structural_equal, structural_hash


def _is_scalar(constant: Constant) -> bool:
    return constant.data.size <= 1


def _lift_constants(function: Function) -> tuple[Function, list]:
    """The function with its non-scalar Constants turned into extra trailing parameters,
    and those Constants (what callers must now pass), in first-use order.

    Reaches into local functions (the composites inside a Compiler function): a composite
    gets its own extra parameters, and its call inside `function` passes the constants,
    which are then lifted again, to parameters of `function`. Scalar constants stay: they
    are part of the code (an epsilon, a literal in an elementwise body), not weights.
    """
    lifted: list[Constant] = []
    param_of: dict[int, Var] = {}  # id(Constant) -> its new parameter
    extra_args_of: dict = {}  # local function var -> (its new var, the constants its calls pass)

    def replace(arg):
        if isinstance(arg, Tuple):
            return Tuple([replace(field) for field in arg.fields])
        if isinstance(arg, Constant) and not _is_scalar(arg):
            if id(arg) not in param_of:
                param_of[id(arg)] = Var(f"c{len(lifted)}", arg.type)
                lifted.append(arg)
            return param_of[id(arg)]
        return arg

    body = []
    for binding in function.bindings:
        var, value = binding.var, binding.value
        if isinstance(value, Function) and value.bindings:
            value, inner_lifted = _lift_constants(value)
            if inner_lifted:  # its type gained parameters: a new variable for it
                new_var = Var(var.name_hint, value.type)
                extra_args_of[var] = (new_var, inner_lifted)
                var = new_var
        elif isinstance(value, Call):
            callee, args = value.op, list(value.args)
            if isinstance(callee, Var) and callee in extra_args_of:
                callee, extra = extra_args_of[callee]
                args += extra
            value = Call(callee, [replace(a) for a in args], value.attrs, type_=value.type)
        elif isinstance(value, Tuple):
            value = replace(value)
        body.append(Binding(var, value))
    if not lifted:  # (a composite's lifted constants are always lifted here too)
        return function, []
    new_params = [param_of[id(c)] for c in lifted]
    return Function(list(function.params) + new_params, body, function.result, function.ret_type,
                    function.attrs), lifted


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text) or "backend"


class _SymbolCache:
    def __init__(self, mod: IRModule, symbol_suffix: str = ""):
        self.mod = mod
        self.symbol_suffix = symbol_suffix
        self.by_hash: dict[int, list[tuple[Function, str]]] = {}
        for name, function in mod.functions.items():
            if "Compiler" in function.attrs and not function.is_extern:
                key_function = self._key(function)
                self.by_hash.setdefault(structural_hash(key_function), []).append((key_function, name))

    @staticmethod
    def _key(function: Function) -> Function:
        """What identifies the code: attributes that do not change it are left out."""
        return function.with_attrs(Inline=None, global_symbol=None)

    def symbol_for(self, function: Function, share: bool = True) -> str:
        """The global of `function`: an equal one's where there is one and `share`, else new."""
        backend = _sanitize(str(function.attrs["Compiler"]))
        key_function = self._key(function)
        digest = structural_hash(key_function)
        for existing, symbol in self.by_hash.get(digest, []) if share else ():
            if structural_equal(existing, key_function):
                return symbol
        base = f"{backend}_{digest & (2 ** 48 - 1):012x}{self.symbol_suffix}"
        symbol, suffix = base, 1
        while symbol in self.mod:  # a hash collision: _2, _3, ... (a double "__" is reserved in C++)
            suffix += 1
            symbol = f"{base}_{suffix}"
        self.by_hash.setdefault(digest, []).append((key_function, symbol))
        self.mod[symbol] = key_function.with_attrs(global_symbol=symbol)
        return symbol


def outline_compiler_functions(mod: IRModule, symbol_suffix: str = "", unshared=()) -> IRModule:
    """`symbol_suffix` ends every new symbol (`_b1`: the programs of one library's shape
    buckets define their functions under names of their own). The functions of the backends
    in `unshared` are not shared: each call gets a global of its own (`_2`, `_3`, ... after
    the first), so a backend that keeps state per function keeps it per call."""
    mod = mod.copy()
    cache = _SymbolCache(mod, symbol_suffix)
    for name in list(mod.functions):
        function = mod[name]
        if function.is_extern or "Compiler" in function.attrs:
            continue
        mod[name] = _outline_in(function, cache, frozenset(unshared))
    return mod


def _outline_in(function: Function, cache: _SymbolCache, unshared: frozenset = frozenset()) -> Function:
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
            inner = _outline_in(value, cache, unshared) if value.bindings else value
            if inner is not value:
                changed = True
            bindings.append(Binding(binding.var, inner))
            continue
        if isinstance(value, Call) and (isinstance(value.op, Var) and value.op in local or
                                        isinstance(value.op, Function) and "Compiler" in value.op.attrs):
            target = local[value.op] if isinstance(value.op, Var) else value.op
            lifted_function, lifted = _lift_constants(target)
            symbol = cache.symbol_for(lifted_function, share=str(target.attrs["Compiler"]) not in unshared)
            callee = GlobalVar(symbol, lifted_function.type)
            bindings.append(Binding(binding.var, Call(callee, list(value.args) + lifted, type_=value.type)))
            changed = True
            continue
        bindings.append(binding)
    if not changed:
        return function
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)
