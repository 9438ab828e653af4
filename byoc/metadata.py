"""The library's metadata: the JSON embedded in every .so (what `byoc inspect`, `byoc
report`, load() and run() read), built from the final module of each program.

    describe_functions(mod, kernels)      at codegen: each backend function's ops, composites
                                          and kernel (before MarkCompilerFunctionsAsExtern
                                          drops their bodies)
    execution_graph(mod, memory_plan, functions)  the calls of @main in order and the memory
                                          plan's lifetimes, as plain data: report.html is
                                          drawn from it (report_page.py)
    library_metadata(mod, context, build_id, weights_bytes)  the JSON of one program's final module
    with_variants(metadata, programs, dims, padding)  a shape-bucket library's: each bucket's
                                          dims, tensors and memory beside the first's
"""
from __future__ import annotations

import json

from .ir.expr import Call, Constant, Function, GlobalVar, Var
from .ir.op import Op


def _function_ops(function: Function) -> tuple[list, list]:
    """(op names in order, composite pattern names) of an outlined function's body."""
    ops, composites = [], []

    def walk(body: Function):
        for binding in body.bindings:
            value = binding.value
            if isinstance(value, Function):
                if "Composite" in value.attrs:
                    composites.append(str(value.attrs["Composite"]))
                walk(value)
            elif isinstance(value, Call) and isinstance(value.op, Function):
                walk(value.op)
            elif isinstance(value, Call) and isinstance(value.op, Op):
                ops.append(value.op.name)
    if getattr(function, "bindings", None):
        walk(function)
    return ops, composites


def describe_functions(mod, kernels: dict | None = None) -> dict:
    """symbol -> {"ops", "composites", "kernel"} for every backend function of `mod`, read
    while they still have bodies (MarkCompilerFunctionsAsExtern drops them); `kernels`:
    symbol -> kernel name, as backends report them."""
    kernels = kernels or {}
    described = {}
    for name, function in mod.items():
        if "Compiler" in function.attrs:
            ops, composites = _function_ops(function)
            described[name] = {"backend": str(function.attrs["Compiler"]), "ops": ops, "composites": composites,
                               "kernel": kernels.get(name)}
    return described


def execution_graph(mod, memory_plan=None, functions: dict | None = None, views=frozenset()) -> dict:
    """What the page draws, as plain data: "values" (the model's inputs and every computed
    tensor: name, shape, dtype, producing call), "calls" in @main's order (symbol, the
    binding's position, value indices read, weights read, the value written),
    "functions" (describe_functions() of the symbols called) and "lifetimes" (value, first
    and last binding, arena offset and bytes) where memory was planned. A call of one of
    `views` (a backend's reshape) launches nothing: its result is its argument's storage."""
    main = mod["main"]
    functions = functions or {}
    values, index_of = [], {}

    def add_value(var, producer=None):
        index_of[var] = len(values)
        values.append({"name": var.name_hint, "shape": list(getattr(var.type, "shape", [])),
                       "dtype": getattr(var.type, "dtype", "?"), "call": producer})
        return index_of[var]

    for param in main.params:
        add_value(param)
    calls, symbols = [], []
    for position, binding in enumerate(main.bindings):
        value = binding.value
        if not isinstance(value, Call):
            continue
        if isinstance(value.op, GlobalVar):
            symbol = value.op.name
        elif getattr(value.op, "name", None) == "device_copy":
            symbol = "device_copy"
        else:
            continue
        reads = [index_of[a] for a in value.args if isinstance(a, Var) and a in index_of]
        weights = sum(1 for a in value.args if isinstance(a, Constant))
        calls.append({"symbol": symbol, "position": position, "reads": reads, "weights": weights,
                      "writes": add_value(binding.var, producer=len(calls)), "view": symbol in views})
        if symbol not in symbols and symbol != "device_copy":
            symbols.append(symbol)
    lifetimes = []
    if memory_plan is not None:
        for lifetime in memory_plan.lifetimes:
            if lifetime.var in index_of and lifetime.var in memory_plan.offsets:
                lifetimes.append({"value": index_of[lifetime.var], "first": lifetime.first, "last": lifetime.last,
                                  "offset": memory_plan.offsets[lifetime.var], "bytes": lifetime.size})
    return {"values": values, "calls": calls, "lifetimes": lifetimes,
            "functions": {symbol: functions.get(symbol, {"backend": "?", "ops": [], "composites": [], "kernel": None})
                          for symbol in symbols}}


def metadata_json(plan, *, build_id: str, target: str, arch: str | None,
                  backends: list, functions: list, weights_location: str, cuda_graph: bool = False,
                  partition_report: dict | None = None, graph: dict | None = None,
                  weights_bytes: int | None = None, program_id: str = "", build: dict | None = None) -> str:
    """The metadata JSON of a host plan (codegen/host_plan.py): the caller's tensors (and
    where they live), the functions and backends, the memory, the weights, and for `byoc
    inspect` and `byoc report` the partition report and the execution graph."""
    def tensor(name, type_):
        return {"name": name, "shape": list(type_.shape), "dtype": type_.dtype}

    def placed(entries, on_host):  # where PlanDevices put data on the host: say so
        if on_host:
            for entry, host in zip(entries, on_host):
                entry["device"] = "cpu" if host else "cuda"
        return entries
    metadata = {
        "format": "byoc-model", "version": 1, "build_id": build_id, "program_id": program_id,
        "target": target, "arch": arch,
        "inputs": placed([tensor(n, t) for n, t in plan.inputs], plan.inputs_on_host),
        "outputs": placed([tensor(n, t) for n, t in plan.outputs], plan.outputs_on_host),
        "backends": backends, "functions": functions, "cuda_graph": cuda_graph,
        # with CUDA graphs: each region's calls, and whether it is captured or runs directly
        **({"cuda_graph_regions": [{"calls": r["count"], "captured": r["capture"]} for r in plan.regions]}
           if cuda_graph else {}),
        "weights": {"bytes": len(plan.weights) if weights_bytes is None else weights_bytes,
                    "location": weights_location},
        "memory": {"arena_bytes": plan.arena_bytes, "workspace_bytes": plan.workspace_bytes,
                   **({"plan": plan.memory_plan.summary()} if plan.memory_plan else {})},
    }
    if build is not None:  # what `byoc refit` builds the program again from (build_record)
        metadata["build"] = build
    if partition_report is not None:  # so that `byoc inspect` can show it without the build dir
        metadata["partition_report"] = partition_report
    if graph is not None:  # the calls and the memory plan, for `byoc report` (report_page.py)
        metadata["graph"] = graph
    return json.dumps(metadata, sort_keys=True, separators=(",", ":"))


def build_record(mod, context) -> dict:
    """How the library was built, for `byoc refit` to build its program again from new
    weights: the config (its target resolved; no workdir, output or tuning database path:
    nothing of the building machine) with the input shapes the build was given, and the
    model's initializers by name (dtype, shape and a checksum of each: frontend/onnx.py
    records them at import), which new weights must match."""
    config = context.config.to_dict()
    config.update(target=str(context.target), workdir=None, output=None, compile_jobs=None,
                  tuning={key: value for key, value in config["tuning"].items() if key != "tuning_db"})
    if context.input_shapes:
        config["input_shapes"] = {name: list(shape) for name, shape in context.input_shapes.items()}
    initializers = mod.attrs.get("initializers")
    return {"config": config, "initializers": initializers.complete() if initializers is not None else None}


def library_metadata(mod, context, build_id: str, weights_bytes: int | None = None, program_id: str = "") -> str:
    """The metadata JSON of a program's final module (the pipeline's last stage, plan_host)."""
    host = mod.attrs["host_setup"]
    plan = host.plan
    artifacts = mod.attrs["artifacts"]
    report = mod.attrs.get("partition_report")
    backend_of = {symbol: artifact.backend for artifact in artifacts for symbol in artifact.symbols}
    functions = [{"symbol": s, "backend": backend_of.get(s, "?"),
                  "calls": sum(1 for c in plan.calls if c["symbol"] == s)} for s in plan.extern_symbols]
    graph = execution_graph(mod, plan.memory_plan, mod.attrs.get("function_summaries"), views=host.view_symbols)
    return metadata_json(plan, build_id=build_id, target=str(context.target), weights_bytes=weights_bytes,
                         arch=context.target.attrs.get("arch") if context.cuda else None,
                         backends=sorted({f["backend"] for f in functions}), functions=functions,
                         weights_location="sidecar" if context.config.params == "sidecar" else "embedded",
                         cuda_graph=host.cuda_graph,
                         partition_report=report.to_json() if report is not None else None, graph=graph,
                         program_id=program_id, build=build_record(mod, context))


def with_variants(metadata: str, programs: list, dims: dict, padding: dict) -> str:
    """The metadata of a library with shape buckets: the first bucket's tensors at the top
    (as a static library's), and `variants`: each bucket's dims, tensors and memory.
    `dims`: the config's dims; `padding`: dim -> None where sizes between the buckets run
    padded into the next one (then run() takes any size from 1 to the largest), else why not."""
    data = json.loads(metadata)
    variants = []
    for program in programs:
        plan = program.host.plan

        def tensors(entries, top, axis_dims):  # where a tensor lives is the same in every bucket
            return [{**place, "name": name, "shape": list(type_.shape), "dtype": type_.dtype,
                     # the axes run() pads: the paddable dim each carries
                     **({"axis_dims": axes} if any(axes) else {})}
                    for (name, type_), place, axes in zip(entries, top, axis_dims, strict=True)]
        axis_dims = program.axis_dims or [[None] * len(t.shape) for _, t in plan.inputs + plan.outputs]
        arch = program.context.target.attrs.get("arch") if program.context.cuda else None
        several = len({p.context.target.attrs.get("arch") for p in programs}) > 1
        variants.append({"dims": program.dims, **({"arch": arch} if several else {}),
                         "inputs": tensors(plan.inputs, data["inputs"], axis_dims[:len(plan.inputs)]),
                         "outputs": tensors(plan.outputs, data["outputs"], axis_dims[len(plan.inputs):]),
                         "memory": {"arena_bytes": plan.arena_bytes, "workspace_bytes": plan.workspace_bytes,
                                    **({"plan": plan.memory_plan.summary()} if plan.memory_plan else {})}})
    data["variants"] = variants
    archs = list(dict.fromkeys(variant["arch"] for variant in variants if "arch" in variant))
    if archs:  # a library for several archs: the runtime runs one's variants, chosen by the device
        data["archs"] = archs
    data["dims"] = {name: {"sizes": sorted(sizes) if isinstance(sizes, list) else [sizes],
                           **({"paddable": padding[name] is None} if name in padding else {}),
                           **({"range": [1, max(sizes)]} if name in padding and padding[name] is None else {}),
                           **({"why_not": padding[name]} if padding.get(name) else {})}
                    for name, sizes in dims.items()}
    for key in ("arena_bytes", "workspace_bytes"):  # the memories are shared, as large as the largest needs
        data["memory"][key] = max(variant["memory"][key] for variant in variants)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))
