"""MergeCompositeFunctions: group neighbouring composites of one backend into Compiler
functions.

A composite call (`%y = %f(...)` where %f is a local function with
Composite="<backend>.<pattern>") joins the group of the composite call that produces one
of its arguments when both belong to the same backend, the producer's result is used by
this call alone (each region keeps one output: the host calls extern functions that
return one tensor), and joining creates no cycle (no argument of the group comes,
through a node outside it, from the group itself). Each group becomes one inline local
function with Compiler="<backend>" whose body holds the composites and their calls:

    %cutlass_region = fn (%a: T, %w: T, %b: T) -> T [Compiler="cutlass"] {
      %f = fn (...) -> T [Composite="cutlass.dense_bias", Primitive=1] {...}
      %y = %f(%a, %w, %b)
      return %y
    }
    %y = %cutlass_region(%x, meta[0], meta[1])

A backend registered with one_composite_per_function gets a Compiler function per
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
    composite_calls = []  # indices of bindings calling a composite
    backend_of_call = {}
    for index, binding in enumerate(bindings):
        value = binding.value
        if isinstance(value, Call) and isinstance(value.op, Var) and value.op in local_functions:
            backend = _backend_of(local_functions[value.op])
            if backend is not None:
                composite_calls.append(index)
                backend_of_call[binding.var] = backend
    uses = _uses(main)
    group_of = {}  # result var of a composite call -> group id
    groups: dict[int, list[int]] = {}
    for index in composite_calls:
        binding = bindings[index]
        backend = backend_of_call[binding.var]
        single = get_backend(backend).one_composite_per_function
        joined = None
        if not single:
            for arg in binding.value.args:
                if not (isinstance(arg, Var) and arg in group_of and backend_of_call.get(arg) == backend):
                    continue
                if len(uses.get(arg, [])) != 1:
                    continue  # the producer's value is needed elsewhere: keep it an output
                candidate = group_of[arg]
                if _joining_makes_cycle(groups[candidate], index, bindings, group_of, candidate):
                    continue
                joined = candidate
                break
        if joined is None:
            joined = len(groups)
            groups[joined] = []
        groups[joined].append(index)
        group_of[binding.var] = joined
    if not groups:
        return mod
    return _rewrite(mod, main, bindings, groups, backend_of_call, local_functions)


def _joining_makes_cycle(group_indices, index, bindings, group_of, group_id) -> bool:
    """Whether an argument of the new member is computed outside the group from the group."""
    members = {bindings[i].var for i in group_indices}
    tainted = set(members)
    for binding in bindings[min(group_indices):index]:
        if binding.var in members:
            continue
        if any(v in tainted for v in _vars_in(binding.value)):
            tainted.add(binding.var)
    outside_tainted = tainted - members
    return any(isinstance(a, Var) and a in outside_tainted for a in bindings[index].value.args)


def _rewrite(mod, main, bindings, groups, backend_of_call, local_functions):
    replaced_at = {}  # binding index of a group's last call -> new bindings
    removed = set()
    used_functions = set()
    for group_id, indices in groups.items():
        member_vars = [bindings[i].var for i in indices]
        backend = backend_of_call[member_vars[0]]
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
