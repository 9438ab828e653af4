"""MarkCompilerFunctionsAsExtern: compiled functions keep only their signature.

Every global with a Compiler attribute (the backends have generated code for it by now)
becomes an extern declaration: same name (its symbol), same parameter and result types,
no body, and the attribute Extern=1, with Device where PinDevices set one (PlanDevices
reads it as the function's device); every other attribute (Compiler, global_symbol,
Composite, Primitive, Inline...) is dropped, as in TVM's pass of the same name. Calls keep referring to the global by name, so they need no change. Leaves alone:
functions without a Compiler attribute.
"""
from __future__ import annotations

from ..ir.expr import Function
from ..ir.module import IRModule


def mark_compiler_functions_as_extern(mod: IRModule) -> IRModule:
    mod = mod.copy()
    for name in list(mod.functions):
        function = mod[name]
        if "Compiler" in function.attrs:
            kept = {"Device": function.attrs["Device"]} if "Device" in function.attrs else {}
            mod[name] = Function(function.params, None, None, function.ret_type, {"Extern": 1, **kept})
    return mod
