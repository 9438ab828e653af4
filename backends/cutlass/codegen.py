"""cutlass codegen: Compiler="cutlass" functions -> one CUDA source per function, each a
CUTLASS kernel instantiation with its epilogue fused, compiled by nvcc with flags from the
cutlass Target only.

A function's body (composites inlined) is read as one of the chains the patterns admit:

    matmul(a, b | transpose(b)) [+ bias] [-> activation] [+ residual]   -> GemmProblem
    conv2d(x, w) (NHWC) [+ bias] [+ residual] [-> activation]          -> ConvProblem
    softmax(Q K^T [* c] [+ mask]) V with the head split/merge around it -> Attention

On sm_90 a pointwise conv (1x1, stride 1, no padding) runs as the GEMM it is where the GEMM
kernels can run it (kernels.kernel_problem, ConvProblem.as_gemm): CUTLASS's sm90 convs are
non-persistent with one consumer warp group, its GEMMs persistent with two (cooperative,
ping-pong). ResNet-50 has 33 such convs of 53.

the GEMM and conv kernel comes from the tuning database, a measurement (when a GPU is visible and
profiling is on), or the heuristic (kernels.heuristic_kernel / heuristic_conv_kernel); the
attention kernel from the problem's shape (attention.AttentionKernel.for_problem).
"""
from __future__ import annotations

import math

import numpy as np
from pathlib import Path

from byoc.codegen import op_chain
from byoc.errors import BuildError
from byoc.ir.expr import Constant, Function

from .kernels import (INCLUDE_DIR, PDL_FLAG, SM_COUNT, CandidateFilter, ConvKernel, ConvProblem, GemmProblem,
                      kernel_problem, kernel_unit, kernel_workspace_bytes, partition_call)

# the partitions' entry points (cutlass_entries.cc): plain C++, no CUTLASS
ENTRIES_FLAGS = ["-O2", "-fPIC", "-fvisibility=hidden", f"-I{INCLUDE_DIR}"]


def flatten(func: Function) -> tuple[list, dict]:
    """op_chain.flatten for this backend's errors."""
    return op_chain.flatten(func, "cutlass")


def gemm_problem(func: Function) -> tuple[GemmProblem, dict]:
    """The GemmProblem a partition computes and where its operands are among the params."""
    steps, substitution = flatten(func)
    params = list(func.params)
    index_of = {p: i for i, p in enumerate(params)}

    def param_index(value, role):
        if value not in index_of:
            raise BuildError(f"cutlass: the {role} operand must be a parameter of the partition")
        return index_of[value]

    produced = {var: (op, args, attrs) for var, op, args, attrs in steps}
    # find the matmul; its B may come from a transpose of a parameter
    matmuls = [s for s in steps if s[1] == "matmul"]
    if len(matmuls) != 1:
        raise BuildError(f"cutlass: a partition holds exactly one matmul, found {len(matmuls)}")
    matmul_var, _, (a, b), _ = matmuls[0]
    b_transposed = False
    if b in produced and produced[b][0] == "transpose":
        b = produced[b][1][0]
        b_transposed = True
    a_type, b_type, out_type = a.type, b.type, matmul_var.type
    k = a_type.shape[-1]
    m = a_type.shape[-2]
    n = out_type.shape[-1]
    a_batch = math.prod(a_type.shape[:-2])
    b_batch = math.prod(b_type.shape[:-2])
    if b_batch == 1 and len(b_type.shape) == 2:
        m, batch = m * a_batch, 1  # shared weights: fold the batch into the rows
    elif a_type.shape[:-2] == b_type.shape[:-2]:
        batch = a_batch
    else:
        raise BuildError("cutlass: batched operands must have equal batch dims")
    indices = {"a": param_index(a, "A"), "b": param_index(b, "B")}
    activation, has_bias, has_residual, alpha = None, False, False, 1.0
    current = matmul_var
    for var, op, args, attrs in steps:
        if var is matmul_var or op == "transpose":
            continue
        if current not in args:
            raise BuildError(f"cutlass: {op} does not continue the GEMM chain")
        other = [x for x in args if x is not current]
        if op in ("divide", "multiply") and current is matmul_var and len(other) == 1 and \
                isinstance(other[0], Constant) and other[0].type.size == 1 and \
                (op == "multiply" or args[0] is current):
            value = float(np.asarray(other[0].data, np.float64).reshape(-1)[0])
            alpha = 1.0 / value if op == "divide" else value
        elif op == "add" and not has_bias and activation is None and not has_residual and \
                other and len(other[0].type.shape) == 1:
            has_bias, indices["bias"] = True, param_index(other[0], "bias")
        elif op == "add" and other and other[0].type.shape == var.type.shape:
            has_residual, indices["residual"] = True, param_index(other[0], "residual")
        elif op_chain.activation_name(op, attrs) is not None:
            activation = op_chain.activation_name(op, attrs)
        else:
            raise BuildError(f"cutlass: {op} is not a fusable epilogue")
        current = var
    problem = GemmProblem(m=m, n=n, k=k, batch=batch, dtype=out_type.dtype, b_transposed=b_transposed,
                          activation=activation, has_bias=has_bias, has_residual=has_residual, alpha=alpha)
    return problem, indices


def conv_problem(func: Function) -> tuple[ConvProblem, dict]:
    """The ConvProblem a conv partition computes and where its operands are among the params."""
    chain = op_chain.read_conv_epilogue(func, "cutlass")
    if chain.attrs["data_layout"] != "NHWC" or chain.attrs["groups"] != 1:
        raise BuildError("cutlass: convs must be NHWC with groups=1")
    batch, height, width, in_channels = chain.data.type.shape
    out_channels, kernel_h, kernel_w, _ = chain.weight.type.shape
    _, out_h, out_w, _ = chain.conv.type.shape
    indices = {{"data": "a", "weight": "b"}.get(role, role): index for role, index in chain.indices.items()}
    problem = ConvProblem(batch, height, width, in_channels, out_channels, kernel_h, kernel_w, out_h, out_w,
                          tuple(chain.attrs["strides"]), tuple(chain.attrs["pads"]), tuple(chain.attrs["dilations"]),
                          chain.conv.type.dtype, chain.activation, chain.has_bias, chain.has_residual)
    return problem, indices


def attention_problem(func: Function, flattened: tuple):
    """The Attention a fused-attention partition computes (attention.py), and its
    parameter indices by expression; `flattened` is flatten(func)."""
    from .attention import NotAttention, read_attention
    steps, substitution = flattened
    produced = {var: (op, list(args), attrs) for var, op, args, attrs in steps}
    root = substitution.get(func.result, func.result)
    try:
        problem = read_attention(root, produced.get)
    except NotAttention as reason:
        raise BuildError(f"cutlass: not a fused attention: {reason}") from None
    return problem, {param: index for index, param in enumerate(func.params)}


def partition_problem(func: Function) -> tuple:
    """(GemmProblem | ConvProblem | Attention, operand indices) of one partition."""
    flattened = flatten(func)
    steps, _ = flattened
    if any(op == "softmax" for _, op, _, _ in steps):
        return attention_problem(func, flattened)
    if any(op == "conv2d" for _, op, _, _ in steps):
        return conv_problem(func)
    return gemm_problem(func)


def codegen(functions: dict, target) -> list:
    from byoc.backend import Artifact
    from byoc.codegen.templates import render_template
    from byoc.toolchain import CompileUnit

    from .tuning import choose_kernels, open_database

    device = target.device
    if device is None or device.kind != "cuda":
        raise BuildError("the cutlass backend needs a cuda device target")
    sm = int(target.attrs.get("sm") or device.arch_number())
    workdir = Path(target.workdir)
    from .attention import Attention
    problems = {symbol: partition_problem(func) for symbol, func in functions.items()}
    attention = {symbol: problem for symbol, problem in problems.items() if isinstance(problem[0], Attention)}
    problems = {symbol: problem for symbol, problem in problems.items() if symbol not in attention}
    problems = {symbol: (kernel_problem(sm, problem), indices) for symbol, (problem, indices) in problems.items()}
    flags = cutlass_flags(target, sm)
    profile = {"true": True, "false": False}.get(target.attrs.get("profile", "auto"), "auto")
    # profile: true asks for tuning on this GPU: entries measured on another GPU model are
    # measured again (auto uses them, as a cross-compiling build does)
    remeasure_on = None
    if profile is True:
        from byoc.target import visible_gpu_name
        remeasure_on = visible_gpu_name()
    if profile == "auto":
        from byoc.target import visible_gpu_arch
        profile = visible_gpu_arch() is not None
    # the user's database, else the persistent one in the byoc cache (tuning results are
    # kept), with the shipped one behind it
    database, optional_save = open_database(target.attrs.get("tuning_db"), target.attrs.get("shipped_tuning", True))
    try:
        allowed = CandidateFilter.from_target(target.attrs)
        chosen = choose_kernels(sorted({p for p, _ in problems.values()}, key=lambda p: p.key), sm, database,
                                profile=bool(profile), workdir=workdir, compile_flags=flags,
                                jobs=target.attrs.get("compile_threads") or None, allowed=allowed,
                                remeasure_on=remeasure_on, optional_save=optional_save,
                                progress=getattr(target, "progress", None),
                                tuned_epilogue=target.attrs.get("tuned_epilogue") or "auto",
                                tolerance=float(target.attrs.get("tuning_tolerance") or 0.0),
                                runtime_epilogue=bool(target.attrs.get("runtime_epilogue")),
                                gpu_limit=target.attrs.get("tuning_gpus") or 0)
    except ValueError as error:  # the target's tiles/clusters/stages leave no kernel for a problem
        raise BuildError(str(error)) from None
    units, workspace, kernels, kernel_units, calls = [], {}, {}, {}, []
    for symbol, (problem, indices) in problems.items():
        kernel = chosen[problem]
        refusal = kernel.supports(problem)
        if refusal is not None:
            # The heuristic, the tuner and the database lookup choose among supported kernels
            # only: a kernel that would refuse its operands at run time (CUTLASS's
            # can_implement) is a bug in that choice, stopped here rather than in the library.
            raise BuildError(f"cutlass: @{symbol}: the kernel chosen for {problem.key}, "
                             f"{_kernel_label(kernel, problem)}, cannot run it: {refusal} "
                             f"(a byoc bug in the kernel choice; please report it)")
        unit = kernel_unit(kernel, problem, flags, bool(target.attrs.get("runtime_epilogue")))
        kernel_units.setdefault(unit.entry, unit)
        calls.append(partition_call(symbol, unit, kernel, problem, indices))
        workspace[symbol] = kernel_workspace_bytes(kernel, problem)
        kernels[symbol] = unit.name
    # one compile unit per kernel (ResNet's convs of one tile and epilogue at several sizes,
    # BERT's GEMMs of one kernel in every layer share it), named after its entry
    units += kernel_compile_units(kernel_units.values(), workdir)
    if calls:
        source = workdir / "cutlass_entries.cc"
        source.write_text(render_template("cutlass/entries.cc.j2", {"kernels": sorted(kernel_units), "calls": calls}))
        units.append(CompileUnit(source, "cxx", ENTRIES_FLAGS, "cutlass_entries.o"))
    units += attention_units(attention, SM_COUNT.get(sm, SM_COUNT[90]), workdir, flags, kernels, workspace,
                             tile=target.attrs.get("attention_tile") or "")
    return [Artifact(backend="cutlass", kind="source", symbols=list(functions),
                     compile_units=units, workspace_bytes=workspace, kernels=kernels)]


def known_cost(functions: dict, target) -> float | None:
    """Microseconds a run of `functions` costs on the visible GPU by the tuning database:
    each function's GEMM or conv with the kernel a build would choose, as tuning timed it
    on a GPU of this name (the profiler's operands rotated through more memory than L2
    holds, as a candidate's own timing does). None where one of them is not such an entry
    (a fused attention, a problem not tuned here or timed with the epilogue proxy, a kernel
    the target's filters refuse): the candidate is then built and timed."""
    from byoc.target import visible_gpu_name

    from .attention import Attention
    from .tuning import open_database
    device = target.device
    if device is None or device.kind != "cuda" or not functions:
        return None
    gpu = visible_gpu_name()
    if gpu is None:
        return None
    sm = int(target.attrs.get("sm") or device.arch_number())
    try:
        database, _ = open_database(target.attrs.get("tuning_db"), target.attrs.get("shipped_tuning", True))
        allowed = CandidateFilter.from_target(target.attrs)
        total = 0.0
        for func in functions.values():
            problem, _ = partition_problem(func)
            if isinstance(problem, Attention):
                return None
            problem = kernel_problem(sm, problem)
            entry, kernel = database.entry(sm, problem), database.lookup(sm, problem)
            us = entry.get("us") if entry is not None else None
            # an entry timed with the epilogue proxy left the activation and residual out; one
            # timed as a runtime-epilogue unit is another object than this target builds, or the reverse
            if kernel is None or entry.get("device") != gpu or entry.get("timed_epilogue") or \
                    bool(entry.get("runtime_epilogue")) != bool(target.attrs.get("runtime_epilogue")) or \
                    not isinstance(us, (int, float)) or us <= 0 or \
                    kernel.supports(problem) is not None or not allowed.admits(kernel, measured=True):
                return None
            total += float(us)
    except (BuildError, ValueError):
        return None  # whatever the database or a problem says, the candidate is timed instead
    return total


def _kernel_label(kernel, problem) -> str:
    """The kernel's name for the problem, or its JSON where it is of the other family (its
    name would not spell)."""
    if isinstance(kernel, ConvKernel) == isinstance(problem, ConvProblem):
        return kernel.name(problem)
    return str(kernel.to_json())


# The unity key of every split kernel's host half: they all instantiate CUTLASS's host-side
# templates and parse the same headers, so a few of them compile in about the time of one
# (toolchain/unity.py).
HOST_HALVES_UNITY = "cutlass_sm90_host_halves"


def kernel_library_units(target, workdir: Path, dtypes=("float16",), epilogues: str = "proxy") -> list:
    """The compile units of the kernel library's cutlass share (library.py: every candidate
    the target allows, with its epilogue proxies), for the target's arch and flags, their
    sources under `workdir`; device halves of one tile and schedule compile together."""
    from .library import library_units
    device = target.device
    if device is None or device.kind != "cuda":
        raise BuildError("the cutlass kernel library is for a cuda device target")
    sm = int(target.attrs.get("sm") or device.arch_number())
    try:
        units = library_units(sm, cutlass_flags(target, sm), tuple(dtypes), epilogues,
                              CandidateFilter.from_target(target.attrs), bool(target.attrs.get("runtime_epilogue")))
    except ValueError as error:
        raise BuildError(f"cutlass kernel library: {error}") from None
    return kernel_compile_units(units, Path(workdir))


def kernel_compile_units(kernel_units, workdir: Path, unity: bool = True) -> list:
    """The CompileUnits of `kernel_units` (kernels.KernelUnit), their sources written to
    <workdir>/<entry>.cu (and a split unit's device half to <entry>_device.cu): the same file
    names and text wherever they are compiled (a build, the tuner), so the object cache
    serves one for the other. With `unity`, the halves that the cache lacks compile in unity
    groups: device halves with the others of their tile and schedule, host halves a few
    together."""
    from byoc.toolchain import CompileUnit
    compile_units = []
    for unit in kernel_units:
        source = workdir / f"{unit.entry}.cu"
        source.write_text(unit.source)
        split = unity and unit.device_source is not None
        compile_units.append(CompileUnit(source, "cuda", list(unit.flags), f"{unit.entry}.o",
                                         unity=HOST_HALVES_UNITY if split else ""))
        if unit.device_source is not None:
            device_source = workdir / f"{unit.entry}_device.cu"
            device_source.write_text(unit.device_source)
            compile_units.append(CompileUnit(device_source, "cubin", list(unit.flags), f"{unit.entry}_device.o",
                                             unity=unit.unity if split else ""))
    return compile_units


def attention_units(attention: dict, sm_count: int, workdir: Path, flags: list, kernels: dict,
                    workspace: dict, tile: str = "") -> list:
    """One compile unit per fused-attention partition (the kernel is chosen by its shape:
    attention.AttentionKernel.for_problem); fills in `kernels` and `workspace`."""
    from byoc.codegen.templates import render_template
    from byoc.toolchain import CompileUnit, cutlass_example_dir

    from .attention import template_data
    units = []
    for symbol, (problem, index_of) in attention.items():
        kernel = problem.kernel(sm_count, tile)
        source = workdir / f"{symbol}.cu"
        source.write_text(render_template(kernel.template, template_data(problem, kernel, symbol, index_of.__getitem__)))
        # the flash kernel's header ships with byoc; only example 41 needs CUTLASS's examples
        include = INCLUDE_DIR if kernel.flash else cutlass_example_dir("41_fused_multi_head_attention")
        units.append(CompileUnit(source, "cuda", flags + [f"-I{include}"], f"{symbol}.o"))
        workspace[symbol] = 0
        kernels[symbol] = kernel.name(problem)
    return units


def cutlass_flags(target, sm: int) -> list:
    """nvcc flags from the cutlass Target alone (sm_90a: the wgmma/TMA kernels need it)."""
    from byoc.toolchain import cuda_include_dirs, cutlass_include_dirs
    arch = f"{sm}a" if sm == 90 else str(sm)
    device = getattr(target, "device", None)
    # PTX beside the machine code where the device target asks for it (a library for several
    # archs: a later GPU compiles it); sm_90a's kernels use features no later arch has
    ptx = device is not None and device.attrs.get("ptx") and not arch.endswith("a")
    flags = [f"-gencode=arch=compute_{arch},code={f'[sm_{arch},compute_{arch}]' if ptx else f'sm_{arch}'}", "-O3", "-std=c++17", "--expt-relaxed-constexpr",
             "-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden", "-DNDEBUG"]
    if target.attrs.get("use_fast_math"):
        flags.append("--use_fast_math")
    if sm == 90 and target.attrs.get("pdl"):
        # CUTLASS's sm90 kernels then wait on the previous grid before their first global
        # access and signal the next one early; gemm_sm90.cu.j2 launches them with PDL.
        flags.append(PDL_FLAG)
    flags += [f"-I{d}" for d in cutlass_include_dirs()] + [f"-I{d}" for d in cuda_include_dirs()]
    flags += list(target.attrs.get("extra_nvcc_flags") or [])
    return flags
