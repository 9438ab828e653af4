"""RewriteCUDAGraph: lift static regions of main into capture functions.

Runs on the final main after PlanMemory (transform/plan_memory.py): a flat list of calls
to extern functions and device copies, each carrying the storage PlanMemory gave its
result. A maximal run of consecutive capturable calls (calls of extern functions that
launch kernels only, whose results PlanMemory put in device memory or the caller's
output) becomes a global function with CUDAGraph=1:

    def @main(%x: T) -> T {
      %r = @cuda_graph_0(%x)
      %y = @host_sync_op(%r)        # declared not capturable: it ends the region
      %z = @cuda_graph_1(%y)
      return %z
    }
    def @cuda_graph_0(%p0: T) -> T [CUDAGraph=1] { %a = @k1(%p0); %b = @k2(%a); return %b }

The host (the model runtime's region table, from `graph_regions`) captures each region
into its own CUDA graph and replays it on later runs, running the calls between regions
directly; the caller's inputs and outputs are copied into and out of planned buffers
around the run ("copy"), or the graphs read the caller's tensors and are updated when
their pointers change ("update"). A region needs at least one call; a run of
tuple views or constants launches nothing and is left as it is. `capturable(symbol)`
says whether an extern function may be captured (its backend declares it; a function
that runs on the cpu may not); every region returns exactly the values used after it.
`region_breaks` says, for every call left between regions, why. `mark_graph_regions`
writes the regions on main's calls (graph_region=n) instead: the form the build keeps.
"""
from __future__ import annotations

from ..ir.expr import Binding, Call, Function, GlobalVar, Tuple, Var
from ..ir.module import IRModule
from ..ir.virtual_device import VirtualDevice
from .fuse_ops_by_pattern import _vars_in
from .plan_memory import OUTPUT, VIEW, storage_of


def rewrite_cuda_graph(mod: IRModule, capturable=lambda symbol: True, prefix: str = "cuda_graph",
                       regions: list | None = None) -> IRModule:
    """`regions`: graph_regions(mod, capturable) when the caller has it already."""
    mod = mod.copy()
    main = mod["main"]
    bindings = list(main.bindings)
    if regions is None:
        regions = graph_regions(mod, capturable)
    if not regions:
        return mod

    later_uses = _uses_after(bindings, main.result)
    replaced, removed = {}, set()
    for number, region in enumerate(regions):
        members = {bindings[i].var for i in region}
        params, outside = [], {}
        body = []
        substitution = {}
        for i in region:
            call = bindings[i].value
            args = []
            for arg in call.args:
                if isinstance(arg, Var) and arg not in members:
                    if arg not in outside:
                        outside[arg] = Var(f"p{len(params)}", arg.type)
                        params.append(arg)
                    args.append(outside[arg])
                else:
                    args.append(substitution.get(arg, arg))
            new_var = Var(bindings[i].var.name_hint, bindings[i].var.type)
            substitution[bindings[i].var] = new_var
            body.append(Binding(new_var, Call(call.op, args, call.attrs, type_=call.type)))
        last = region[-1]
        results = [bindings[i].var for i in region if later_uses.get(bindings[i].var, -1) > last]
        name = f"{prefix}_{number}"
        if len(results) == 1:
            result_expr, ret_type = substitution[results[0]], results[0].type
        else:
            result_expr = Tuple([substitution[r] for r in results])
            ret_type = result_expr.type
        mod[name] = Function([outside[p] for p in params], body, result_expr, ret_type, {"CUDAGraph": 1})
        callee = GlobalVar(name, mod[name].type)
        if len(results) == 1:
            replaced[last] = [Binding(results[0], Call(callee, params, type_=ret_type))]
        else:
            from ..ir.expr import TupleGetItem
            tuple_var = Var(f"{name}_results", ret_type)
            replaced[last] = [Binding(tuple_var, Call(callee, params, type_=ret_type))] + [
                Binding(r, TupleGetItem(tuple_var, k)) for k, r in enumerate(results)]
        removed.update(region)
    new_bindings = []
    for index, binding in enumerate(bindings):
        if index in replaced:
            new_bindings.extend(replaced[index])
        elif index not in removed:
            new_bindings.append(binding)
    mod["main"] = Function(main.params, new_bindings, main.result, main.ret_type, main.attrs)
    return mod


def mark_graph_regions(mod: IRModule, regions: list) -> IRModule:
    """The regions written on main's calls instead of lifted: each call of region n gets
    the attribute graph_region=n (as PlanMemory writes storage on calls), which is what
    the host plan reads (codegen/host_plan.py); the lifted form is for reading."""
    region_of = {index: number for number, region in enumerate(regions) for index in region}
    if not region_of:
        return mod
    main = mod["main"]
    bindings = [Binding(b.var, Call(b.value.op, b.value.args, {**b.value.attrs, "graph_region": region_of[i]},
                                    type_=b.value.type)) if i in region_of else b
                for i, b in enumerate(main.bindings)]
    return mod.with_function("main", Function(main.params, bindings, main.result, main.ret_type, main.attrs))


def graph_regions(mod: IRModule, capturable=lambda symbol: True) -> list[list[int]]:
    """The regions RewriteCUDAGraph lifts, as lists of binding indices of main (see
    scan_regions for why each other call runs between regions)."""
    return scan_regions(mod, capturable)[0]


def region_breaks(mod: IRModule, capturable=lambda symbol: True) -> list[tuple[int, str]]:
    """(binding index, why) for every call of main that no region captures."""
    return scan_regions(mod, capturable)[1]


def scan_regions(mod: IRModule, capturable=lambda symbol: True) -> tuple[list, list]:
    """(graph_regions, region_breaks) in one pass over main. Maximal runs of capturable calls: calls of extern functions that `capturable`
    accepts (it returns True, or False or a reason to refuse) whose result PlanMemory put
    in device memory or the caller's output. Any other call (a device_copy, a function
    that runs on the host, one whose result is in host memory or has no static storage)
    ends a region; tuples and tuple items neither launch kernels nor end one."""
    regions, current, breaks = [], [], []
    for index, binding in enumerate(mod["main"].bindings):
        value = binding.value
        if not isinstance(value, Call):
            continue
        reason = _refusal(mod, value, capturable)
        if reason is None:
            current.append(index)
            continue
        breaks.append((index, f"%{binding.var.name_hint}: {reason}"))
        if current:
            regions.append(current)
        current = []
    if current:
        regions.append(current)
    return regions, breaks


def _refusal(mod: IRModule, call: Call, capturable) -> str | None:
    """Why a call of main cannot be captured, or None."""
    if not isinstance(call.op, GlobalVar):
        name = getattr(call.op, "name", "?")
        if name == "device_copy":
            return f"a copy between memories ({call.attrs['src']} -> {call.attrs['dst']}) runs between graphs"
        return f"{name} is not a call of an extern function"
    if not mod[call.op.name].is_extern:
        return f"@{call.op.name} is not an extern function"
    verdict = capturable(call.op.name)
    if verdict is not True:
        return verdict or f"@{call.op.name} is declared not capturable"
    storage = storage_of(call)
    if storage is None:
        return f"@{call.op.name}'s result has no static storage (PlanMemory did not place it)"
    if storage[0] not in (OUTPUT, VIEW) and VirtualDevice.parse(storage[0]).is_host:
        return f"@{call.op.name} writes host memory ({storage[0]})"
    return None


def _uses_after(bindings, result) -> dict:
    """Var -> index of its last use (len(bindings) for the function's result)."""
    last = {}
    for index, binding in enumerate(bindings):
        for var in _vars_in(binding.value):
            last[var] = index
    for var in _vars_in(result):
        last[var] = len(bindings)
    return last
