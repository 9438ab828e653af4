"""The stages of the build pipeline (pipeline.py lists them in order): each one is
`stage(module, context) -> module` and calls one pass, analysis or codegen entry point.
What a stage decides that is not IR is written as a module attribute (pipeline.py lists
them); what a person reads (reports, IR dumps) goes into the work directory."""
from __future__ import annotations

import json

import numpy as np

from .errors import BuildError, ModelError
from .ir.module import IRModule


def import_model(mod, context):
    """ONNX model -> IRModule (frontend/onnx.py); an IRModule given is checked and taken as is."""
    model = context.model if mod is None else mod
    if isinstance(model, IRModule):
        check_module(model)
        mod = model
    else:
        from .frontend.onnx import from_onnx
        dims = context.config.dims if context.dims is None else context.dims
        mod = from_onnx(model, context.input_shapes or context.config.input_shapes or None, dims or None)
    context.progress.stage(f"imported: {len(mod['main'].bindings)} ops")
    return mod


def simplify(mod, context):
    """FoldConstant, FoldBatchNorm, RecognizeGelu, SinkReshapes, HoistScalarFactors and the rest; float16 if asked.

    In order: FoldConstant, FoldBatchNorm, BatchNormAsScaleShift, RecognizeGelu, RecognizeSiLU, RecognizeRMSNorm, SimplifyIdentityGather,
    UnbindStackedHeads, RotateHalfAsView, SinkReshapes,
    HoistScalarFactors, UnflattenBatchTranspose, FoldScaleIntoMatmul, CombineLogitAddends,
    ConvertToFloat16 (precision float16 or bfloat16), CombineParallelMatmul."""
    from .frontend.onnx import MAX_FOLDED_BYTES
    from .transform import convert_to_float16, dead_code_elimination, fold_constant, simplify_identity_gather
    from .transform.combine_logit_addends import combine_logit_addends
    from .transform.combine_parallel_matmul import combine_parallel_matmul
    from .transform.batch_norm_as_scale_shift import batch_norm_as_scale_shift
    from .transform.fold_batch_norm import fold_batch_norm
    from .transform.fold_scale_into_matmul import fold_scale_into_matmul
    from .transform.hoist_scalar_factors import hoist_scalar_factors
    from .transform.unflatten_batch_transpose import unflatten_batch_transpose
    from .transform.recognize_gelu import recognize_gelu
    from .transform.recognize_rms_norm import recognize_rms_norm
    from .transform.recognize_silu import recognize_silu
    from .transform.sink_reshapes import sink_reshapes
    from .transform.rotate_half_as_view import rotate_half_as_view
    from .transform.unbind_stacked_heads import unbind_stacked_heads

    # the importer's folding limit: a constant larger than that (an Expand to 2**40
    # elements) stays an op rather than being allocated here, and the size checks decide
    def fold(mod):
        return fold_constant(mod, size_limit_bytes=MAX_FOLDED_BYTES)
    mod = dead_code_elimination(recognize_rms_norm(recognize_silu(recognize_gelu(
        batch_norm_as_scale_shift(dead_code_elimination(fold_batch_norm(fold(mod))))))))
    # after FoldConstant (the indices are constants then), before SinkReshapes (which
    # merges the reshape it leaves with its neighbours); after RecognizeGelu: a GEMM's
    # activation reads its reshape only once recognized
    mod = dead_code_elimination(fold(sink_reshapes(rotate_half_as_view(unbind_stacked_heads(
        simplify_identity_gather(mod))))))
    # after SinkReshapes (which moves a scale next to the matmul it feeds): attention as
    # torch's exporter writes scaled_dot_product_attention reads as the attention patterns do
    mod = dead_code_elimination(unflatten_batch_transpose(dead_code_elimination(hoist_scalar_factors(mod))))
    # after FoldConstant: weights and biases are constants only once their preprocessing folds
    # a layer scale folded into float16 weights must not flush them to zero
    smallest_normal = float(np.finfo(np.float16).tiny) if context.config.precision == "float16" else None
    mod = dead_code_elimination(combine_logit_addends(fold_scale_into_matmul(mod, underflow_below=smallest_normal)))
    if context.config.precision in ("float16", "bfloat16"):
        mod = dead_code_elimination(fold(convert_to_float16(
            mod, dtype=context.config.precision, keep_float32_ops=keep_float32_ops(context.config))))
    # after ConvertToFloat16: the weights go side by side in the dtype they keep, half the
    # bytes of float32 (a 1.4 GB float32 decoder's combine took 1.6 s of a 4.9 s warm build on
    # two cores before, 0.4 s after); the members still read one input, its one cast
    return dead_code_elimination(combine_parallel_matmul(mod))


def keep_float32_ops(config) -> frozenset:
    """The precision pass's float32 ops, less those that every backend able to take
    them computes with float32 statistics internally (the built-in backend takes any
    op; the others, the ops their patterns name)."""
    from .backend import FALLBACK, get_backend
    from .pattern import ops_named
    from .transform.convert_to_float16 import DEFAULT_KEEP_FLOAT32_OPS
    backends = [get_backend(name) for name in config.backend_order]
    keep = set(DEFAULT_KEEP_FLOAT32_OPS)
    for op_name in DEFAULT_KEEP_FLOAT32_OPS:
        takers = [b for b in backends if b.name == FALLBACK
                  or any(op_name in ops_named(entry.pattern) for entry in b.patterns)]
        if takers and all(op_name in b.float32_statistics for b in takers):
            keep.discard(op_name)
    return frozenset(keep)


def shrink_constants(mod, context):
    """ShrinkBroadcastConstants: a constant repeated along an axis is stored once and broadcast."""
    # its own stage, after simplify: the shape-bucket driver compares the programs as simplify
    # leaves them, where a constant shrunk at one bucket's size and not at another's would
    # look like the start of the other's (analysis/padding.py)
    from .transform import dead_code_elimination, shrink_broadcast_constants
    mod = dead_code_elimination(shrink_broadcast_constants(mod))
    context.progress.stage(f"simplified: {len(mod['main'].bindings)} ops")
    return mod


def check_sizes(mod, context):
    """Every tensor's size within what the runtime addresses, before any backend writes one into C++."""
    # while main still binds every tensor (partitioning hides some inside functions)
    from .analysis.tensor_sizes import check_tensor_sizes
    check_tensor_sizes(mod["main"])
    return mod


def pin_devices(mod, context):
    """PinDevices: ops the config pins to another device become functions of the built-in backend."""
    from .transform.pin_devices import pin_devices as pin
    pins = [{**p, "device": str(context.virtual_device(p["device"]))} for p in context.config.devices["pin"]]
    return pin(mod, pins, context.virtual_device("device"))


def partition(mod, context):
    """Each backend's patterns in the config's order, outlined into functions; the built-in backend takes the rest."""
    from .backend import FALLBACK, get_backend
    from .transform.lower_split import lower_split
    from .transform.partition import partition_for
    names = [name for name in context.config.backend_names if name != FALLBACK]
    backends = [get_backend(name) for name in names]  # an unknown backend fails here, with the known ones
    for backend in backends:  # what each backend needs before any patterns look (cutlass: NHWC convs)
        if backend.pre_partition is not None:
            mod = backend.pre_partition(mod, context.backend_targets[backend.name], context.target.kind)
    # Blocks that one backend runs as one kernel and no other offers (the built-in
    # backend's squeeze-and-excitation), claimed before the priority order applies.
    claims = [b.claims_first for b in [*backends, get_backend(FALLBACK)] if b.claims_first is not None]
    from .backend import partition_targets
    from .costs import candidate_costs
    # a backend target's share_functions: false keeps each call's function (and state) its own
    unshared = [name for name in names if context.backend_targets[name].attrs.get("share_functions", True) is False]
    with partition_targets(context.backend_targets):  # what the patterns' checks may read
        cost_of = candidate_costs(context) if context.config.partition == "measured" else None
        # slices instead of splits before any backend looks: patterns see one op per piece
        mod, report = partition_for(lower_split(mod), names, finalize=get_backend(FALLBACK).takes_the_rest,
                                    symbol_suffix=context.symbol_suffix, claims_first=claims, cost_of=cost_of,
                                    unshared=unshared)
    from .pipeline import DUMP_DATA_BYTES
    context.write("partition_report.json", json.dumps(report.to_json(), indent=2, sort_keys=True))
    context.write("partition_report.txt", report.to_text())
    context.write("partitioned.ir", mod.script(elide_data_over=DUMP_DATA_BYTES))
    context.progress.stage(f"partitioned: {len(mod.functions) - 1} functions for "
                           f"{', '.join(context.config.backend_names)} (report in "
                           f"{context.workdir / 'partition_report.txt'})")
    return mod.with_attrs(partition_report=report)


def codegen(mod, context):
    """Each backend's code for its functions, with its Target current: one Artifact per backend."""
    from .metadata import describe_functions
    from .transform.run_codegen import run_codegen
    mod, artifacts = run_codegen(mod, context.backend_targets)
    context.progress.stage(f"code generated: {len(artifacts)} artifacts (sources in {context.workdir})")
    # the report's boxes: each function's ops, while the functions still have bodies
    summaries = describe_functions(mod, {s: k for a in artifacts for s, k in a.kernels.items()})
    return mod.with_attrs(artifacts=artifacts, function_summaries=summaries)


def mark_extern(mod, context):
    """MarkCompilerFunctionsAsExtern: compiled functions keep only their signature."""
    from .transform.mark_compiler_functions_as_extern import mark_compiler_functions_as_extern
    return mark_compiler_functions_as_extern(mod)


def plan_devices(mod, context):
    """PlanDevices: a device_copy wherever a value crosses devices; each function's devices as declared."""
    from .transform.plan_devices import plan_devices as plan
    declared = function_devices(mod, context)
    mod = plan(mod, context.virtual_device("device"), function_devices=declared,
               input_devices=context.virtual_device(context.config.devices["inputs"]),
               output_devices=context.virtual_device(context.config.devices["outputs"]))
    return mod.with_attrs(declared_devices=declared)


def function_devices(mod, context) -> dict:
    """Extern symbol -> FunctionDevices (where it reads each parameter and writes its
    result): a pinned function's own device (its Device attribute) for all of them; else
    what the lowered function declares (its artifact's `devices`, per parameter: memory
    scopes flow out of lowering); else its backend's device for all. A cpu build keeps
    everything on the cpu."""
    from .backend import get_backend
    from .ir.virtual_device import VirtualDevice
    from .transform.plan_devices import FunctionDevices
    devices = {}
    for artifact in mod.attrs["artifacts"]:
        backend_device = get_backend(artifact.backend).virtual_device(context.target.kind)
        for symbol in artifact.symbols:
            pinned = mod[symbol].attrs.get("Device") if symbol in mod else None
            num_params = len(mod[symbol].params) if symbol in mod else 0
            if pinned and context.cuda:
                devices[symbol] = FunctionDevices.on(VirtualDevice.parse(pinned), num_params)
            elif symbol in artifact.devices and context.cuda:
                devices[symbol] = _declared_by_lowering(artifact, symbol, num_params)
            else:
                devices[symbol] = FunctionDevices.on(backend_device, num_params)
    return devices


def _declared_by_lowering(artifact, symbol: str, num_params: int):
    """An artifact's FunctionDevices for `symbol`, checked: one device per parameter."""
    from .transform.plan_devices import FunctionDevices
    declared = artifact.devices[symbol]
    if not isinstance(declared, FunctionDevices) or len(declared.params) != num_params:
        raise BuildError(f"backend {artifact.backend!r} declares the devices of @{symbol} as {declared!r}; "
                         f"expected a FunctionDevices with one device for each of its {num_params} "
                         f"parameter(s)")
    return declared


def plan_memory(mod, context):
    """PlanMemory: every tensor's storage (memory space, offset, size) written on its call."""
    from .pipeline import DUMP_DATA_BYTES
    from .transform.plan_memory import plan_memory as plan
    # CUDA graphs that copy the caller's tensors (cuda_graph_io: copy) need every output
    # computed into the arena
    config = context.config
    graphs_copy_outputs = context.cuda and config.cuda_graph and config.cuda_graph_io == "copy"
    mod = plan(mod, devices=context.value_devices(mod), default_device=context.virtual_device("device"),
               views={s for artifact in mod.attrs["artifacts"] for s in artifact.view_symbols},
               outputs_in_place=not graphs_copy_outputs)
    context.write("final.ir", mod.script(elide_data_over=DUMP_DATA_BYTES))
    return mod


def cuda_graph(mod, context):
    """RewriteCUDAGraph's regions (graph_region=n on their calls): runs of GPU calls on static storage one CUDA graph captures."""
    if not (context.config.cuda_graph and context.cuda):
        return mod
    from .backend import get_backend
    from .pipeline import DUMP_DATA_BYTES
    from .transform.rewrite_cuda_graph import mark_graph_regions, rewrite_cuda_graph, scan_regions
    backend_of = {symbol: artifact.backend for artifact in mod.attrs["artifacts"] for symbol in artifact.symbols}
    devices = {symbol: declared.result for symbol, declared in mod.attrs["declared_devices"].items()}

    def capturable(symbol):
        if symbol in devices and devices[symbol].device_type != "cuda":
            return f"@{symbol} runs on the {devices[symbol].device_type}"
        backend = backend_of[symbol]
        return True if get_backend(backend).capturable else f"backend {backend!r} declares its functions not capturable"

    regions, breaks = scan_regions(mod, capturable)
    # what a person reads: the module as the regions rewrite it, and why each other call is not captured
    context.write("cuda_graph.ir", rewrite_cuda_graph(mod, regions=regions).script(elide_data_over=DUMP_DATA_BYTES))
    lines = [f"{len(regions)} CUDA graph region(s): " + ", ".join(f"{len(r)} calls" for r in regions),
             "Calls run between regions (not captured), and why:"]
    lines += [f"  binding {index}: {reason}" for index, reason in breaks]
    context.write("cuda_graph.txt", "\n".join(lines) + "\n")
    return mark_graph_regions(mod, regions)


def plan_host(mod, context):
    """Where every tensor lives for the host code (codegen/host_plan.py), from PlanMemory's storage."""
    from .codegen.host_plan import plan_host as plan
    return mod.with_attrs(host_setup=plan(mod, context))


def check_module(mod: IRModule):
    """A ModelError unless `mod` has what build() runs: a function @main with a body that
    no backend claims (the host code calls it; its calls reach the other globals)."""
    from .ir.printer import format_global_name
    if "main" not in mod:
        names = ", ".join(format_global_name(name) for name in mod.functions) or "no functions"
        raise ModelError(f"the module has no function @main (it has {names}); expected @main, the entry "
                         f"function the built library runs")
    main = mod["main"]
    if main.is_extern:
        raise ModelError("@main is an extern declaration (no body); expected @main to be a function with a "
                         "body: the entry function the built library runs")
    if main.attrs.get("Compiler") is not None:
        raise ModelError(f"@main has Compiler={str(main.attrs['Compiler'])!r}; expected the entry function "
                         f"without a Compiler attribute: give the backend's code a global function of its "
                         f"own and call it from @main")
