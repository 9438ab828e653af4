"""MergeCompositeFunctions: group neighbouring composites of one backend into Compiler
functions.

Works on main, after FuseOpsByPattern has bound each composite as a local function with
Composite="<backend>.<pattern>" and called it (`%y = %f(...)`). Composite calls of one
backend that feed each other are grouped into maximal regions under one rule: every
member except the region's output has all of its uses inside the region. So each region
returns ONE tensor (the host's calling convention for extern functions), no value is
computed twice, and no region can form a cycle through an outside node: the only value
that leaves a region is its output, which every member feeds, so an outside node that
reads it cannot feed a member. A producer whose value is also read elsewhere (by a
composite of another backend, a plain op, main's result) therefore ends a region there.
Regions are grown from the back, so a diamond (A feeds B and C, both feed D) is one
region.

Each region becomes one local function with Compiler="<backend>", bound in main where its
output was bound, with the composites inside it as local functions:

    %test_region = fn (%p0: T, %p1: W, %p2: B) -> T [Compiler="test"] {
      %test_dense_bias = fn (...) -> T [Composite="test.dense_bias", Primitive=1] {...}
      %a = %test_dense_bias(%p0, %p1, %p2)
      %test_relu = fn (...) -> T [Composite="test.relu", Primitive=1] {...}
      %r = %test_relu(%a)
      return %r
    }
    %r = %test_region(%x, %w, %b)

Parameters are the region's outside values (Vars and Constants) in first-use order. A
backend registered with one_composite_per_function gets a Compiler function per
composite. Leaves alone: functions that already carry Compiler, plain op calls, and every
function but main.
"""
from __future__ import annotations

from ..ir.expr import Binding, Call, Function, Var
from ..ir.module import IRModule
from .fuse_ops_by_pattern import _uses, _vars_in


def _backend_of(function: Function) -> str | None:
    composite = function.attrs.get("Composite")
    if composite is None or "Compiler" in function.attrs:
        return None
    return composite.split(".", 1)[0]


def merge_composite_functions(mod: IRModule) -> IRModule:
    from ..backend import get_backend
    mod = mod.copy()
    main = mod["main"]
    bindings = list(main.bindings)
    local_functions = {b.var: b.value for b in bindings if isinstance(b.value, Function)}
    backend_of_call = {}  # binding index of a composite call -> its backend
    for index, binding in enumerate(bindings):
        value = binding.value
        if isinstance(value, Call) and isinstance(value.op, Var) and value.op in local_functions:
            backend = _backend_of(local_functions[value.op])
            if backend is not None:
                backend_of_call[index] = backend
    if not backend_of_call:
        return mod
    groups = _regions(main, bindings, backend_of_call,
                      single={b for b in set(backend_of_call.values()) if get_backend(b).one_composite_per_function})
    return _rewrite(mod, main, bindings, groups, backend_of_call, local_functions)


def _regions(main, bindings, backend_of_call, single) -> dict[int, list[int]]:
    """Region id -> the sorted binding indices of its composite calls (the last is the
    region's output)."""
    defined_at = {binding.var: index for index, binding in enumerate(bindings)}
    # Who reads each binding's variable: binding indices, and None for main's result.
    readers = {index: set() for index in range(len(bindings))}
    for index, use_indices in ((defined_at[v], u) for v, u in _uses(main).items() if v in defined_at):
        readers[index].update(None if u == len(bindings) else u for u in use_indices)
    grouped: set[int] = set()
    groups: dict[int, list[int]] = {}
    # From the back: an output is reached before the members that feed it.
    for output in sorted(backend_of_call, reverse=True):
        if output in grouped:
            continue
        backend = backend_of_call[output]
        members = {output}
        grown = backend not in single
        while grown:
            grown = False
            for member in sorted(members, reverse=True):
                for var in _vars_in(bindings[member].value):
                    producer = defined_at.get(var)
                    if (producer is None or producer in members or producer in grouped
                            or backend_of_call.get(producer) != backend):
                        continue
                    if readers[producer] <= members:  # None (main's result) is never a member
                        members.add(producer)
                        grown = True
        grouped |= members
        groups[len(groups)] = sorted(members)
    # Number regions in program order, so names and parameters come out deterministic.
    return {i: group for i, group in enumerate(sorted(groups.values()))}


def _rewrite(mod, main, bindings, groups, backend_of_call, local_functions):
    replaced_at = {}  # binding index of a group's last call -> new bindings
    removed = set()
    used_functions = set()
    for group_id, indices in groups.items():
        member_vars = [bindings[i].var for i in indices]
        backend = backend_of_call[indices[0]]
        params, substitution, outside_args = [], {}, []
        body = []
        for i in indices:
            call = bindings[i].value
            function_var = call.op
            if function_var not in substitution:
                body.append(Binding(function_var, local_functions[function_var]))
                substitution[function_var] = function_var
                used_functions.add(function_var)
            args = []
            for arg in call.args:
                if isinstance(arg, Var) and arg in substitution:
                    args.append(substitution[arg])
                    continue
                existing = next((p for a, p in outside_args if a is arg), None)
                if existing is None:
                    existing = Var(f"p{len(params)}", arg.type)
                    params.append(existing)
                    outside_args.append((arg, existing))
                args.append(existing)
            new_var = Var(bindings[i].var.name_hint, bindings[i].var.type)
            substitution[bindings[i].var] = new_var
            body.append(Binding(new_var, Call(function_var, args, type_=call.type)))
        output = member_vars[-1]
        region = Function(params, body, substitution[output], output.type, {"Compiler": backend})
        region_var = Var(f"{backend}_region", region.type)
        replaced_at[indices[-1]] = [Binding(region_var, region),
                                    Binding(output, Call(region_var, [a for a, _ in outside_args], type_=output.type))]
        removed.update(indices)
    result = []
    for index, binding in enumerate(bindings):
        if index in replaced_at:
            result.extend(replaced_at[index])
        elif index in removed or (binding.var in used_functions):
            continue
        else:
            result.append(binding)
    mod["main"] = Function(main.params, result, main.result, main.ret_type, main.attrs)
    return mod
