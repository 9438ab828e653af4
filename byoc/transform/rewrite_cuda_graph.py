"""RewriteCUDAGraph: lift static regions of main into capture functions.

Runs on the final main (after MarkCompilerFunctionsAsExtern): a flat list of calls to
extern functions whose storage PlanMemory made static. A maximal run of consecutive calls
to capturable extern functions (every call launches kernels only, on planned storage of
constant shape) becomes a global function with CUDAGraph=1:

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
says whether an extern function may be captured (a backend declares it); every region
returns exactly the values used after it.
"""
from __future__ import annotations

from ..ir.expr import Binding, Call, Function, GlobalVar, Tuple, Var
from ..ir.module import IRModule
from .fuse_ops_by_pattern import _vars_in


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
            body.append(Binding(new_var, Call(call.op, args, type_=call.type)))
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


def graph_regions(mod: IRModule, capturable=lambda symbol: True) -> list[list[int]]:
    """The regions RewriteCUDAGraph lifts, as lists of binding indices of main: maximal
    runs of calls to capturable extern functions. Any other call (a device_copy, a
    function `capturable` refuses: one that runs on the host) ends a region; tuples and
    tuple items neither launch kernels nor end one."""
    regions, current = [], []
    for index, binding in enumerate(mod["main"].bindings):
        value = binding.value
        if (isinstance(value, Call) and isinstance(value.op, GlobalVar) and mod[value.op.name].is_extern
                and capturable(value.op.name)):
            current.append(index)
        elif isinstance(value, Call):
            if current:
                regions.append(current)
            current = []
    if current:
        regions.append(current)
    return regions


def _uses_after(bindings, result) -> dict:
    """Var -> index of its last use (len(bindings) for the function's result)."""
    last = {}
    for index, binding in enumerate(bindings):
        for var in _vars_in(binding.value):
            last[var] = index
    for var in _vars_in(result):
        last[var] = len(bindings)
    return last
