"""The CUTLASS kernels the backend renders, one interface for both families (GEMMs in
gemm_kernels.py, 2-D convolutions in conv_kernels.py): the candidates of a problem, the
heuristic's default, kernels from the tuning database, compile flags, and the grouping of
renders that share their CUTLASS types into one compile unit."""
from __future__ import annotations

from .conv_kernels import (FIXED_CHANNEL_CONV_CANDIDATES, FIXED_CHANNELS, SM80_CONV_CANDIDATES,  # noqa: F401
                           SM90_CONV_CANDIDATES, ConvKernel, ConvProblem, conv_candidates, heuristic_conv_kernel)
from .gemm_kernels import (ACTIVATIONS, ELEMENTS, NARROW_TILES, NO_FILTER, ONE_WAVE_TILES,  # noqa: F401
                           SM80_CANDIDATES, SM90_CANDIDATES, SM90_SCHEDULES, SM90_SPLIT_K, SM90_STREAM_K, SM_COUNT,
                           TUNING_ONLY, CandidateFilter, GemmKernel, GemmProblem, candidates, heuristic_kernel,
                           parse_shape)

__all__ = [  # the families' names, so that one import serves the backend and the tests
    "FIXED_CHANNEL_CONV_CANDIDATES", "FIXED_CHANNELS", "SM80_CONV_CANDIDATES", "SM90_CONV_CANDIDATES", "ConvKernel",
    "ConvProblem", "conv_candidates", "heuristic_conv_kernel", "ACTIVATIONS", "ELEMENTS", "NARROW_TILES", "NO_FILTER",
    "ONE_WAVE_TILES", "SM80_CANDIDATES", "SM90_CANDIDATES", "SM90_SCHEDULES", "SM90_SPLIT_K", "SM90_STREAM_K",
    "SM_COUNT", "TUNING_ONLY", "CandidateFilter", "GemmKernel", "GemmProblem", "candidates", "heuristic_kernel",
    "parse_shape", "usable_candidates", "default_kernel", "kernel_workspace_bytes", "kernel_from_json", "PDL_FLAG",
    "kernel_flags", "ENTRY_POINT_FIELDS", "kernel_type_key", "compile_unit_sources", "kernel_template",
    "operand_sizes"]


def usable_candidates(sm: int, problem, allowed: CandidateFilter = NO_FILTER) -> list:
    """The candidates of the problem's family (GEMM or conv) that the target allows and
    that can run it, the heuristic's choice first (the tuner's reference)."""
    family = conv_candidates(sm, allowed) if isinstance(problem, ConvProblem) else candidates(sm, allowed)
    usable = [kernel for kernel in family if kernel.supports(problem) is None]
    if usable:
        first = default_kernel(sm, problem, allowed)
        usable = [first] + [kernel for kernel in usable if kernel != first]
    return usable


def default_kernel(sm: int, problem, allowed: CandidateFilter = NO_FILTER):
    """The heuristic choice for a GEMM or a conv problem."""
    if isinstance(problem, ConvProblem):
        return heuristic_conv_kernel(sm, problem, allowed)
    return heuristic_kernel(sm, problem, allowed)


def kernel_workspace_bytes(kernel, problem) -> int:
    """Workspace the partition's kernel needs (conv kernels: as non-split GEMMs)."""
    return kernel.workspace_bytes(problem) if isinstance(kernel, GemmKernel) else 1 << 20


def kernel_from_json(data: dict):
    """A kernel recorded in the tuning database (entries without "kind" are GEMMs); a
    ValueError that says what is wrong for an entry that is not a kernel byoc can render (a
    database is shared between machines and may be edited by hand)."""
    if not isinstance(data, dict):
        raise ValueError(f"a kernel is a JSON object, not {data!r}")
    try:
        kernel = ConvKernel.from_json(data) if data.get("kind") == "conv2d" else GemmKernel.from_json(data)
    except KeyError as missing:
        raise ValueError(f"kernel {data} has no {missing}") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"kernel {data} is malformed: {error}") from None
    flaw = _kernel_flaw(kernel)
    if flaw:
        raise ValueError(f"kernel {data}: {flaw}")
    return kernel


def _kernel_flaw(kernel) -> str | None:
    """Why `kernel` is not one this backend renders (None when it is)."""
    def shape(value, rank):
        return (isinstance(value, tuple) and len(value) == rank
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value))
    if kernel.sm not in (80, 90):
        return f"sm is {kernel.sm!r}, expected 80 or 90"
    if not shape(kernel.tile, 3):
        return f"tile is {list(kernel.tile)!r}, expected three positive integers (M, N, K)"
    if kernel.sm == 90 and not shape(kernel.cluster, 2):
        return f"cluster is {list(kernel.cluster)!r}, expected two positive integers"
    if kernel.sm == 80 and not (shape(kernel.warp, 3) and isinstance(kernel.stages, int) and kernel.stages >= 2):
        return "sm80 kernels need a warp tile of three positive integers and at least 2 stages"
    if isinstance(kernel, ConvKernel) and kernel.fixed_channels and kernel.sm != 80:
        return "the fixed-channel iterator is a CUTLASS 2.x (sm 80) kernel"
    if isinstance(kernel, GemmKernel):
        if kernel.sm == 90 and kernel.schedule not in SM90_SCHEDULES:
            return f"schedule is {kernel.schedule!r}, expected one of {sorted(SM90_SCHEDULES)}"
        if not (isinstance(kernel.splits, int) and kernel.splits >= 1):
            return f"splits is {kernel.splits!r}, expected a positive integer"
        if kernel.epilogue_tile is not None and not shape(kernel.epilogue_tile, 2):
            return f"epilogue_tile is {list(kernel.epilogue_tile)!r}, expected two positive integers"
        stages = kernel.mainloop_stages
        if not (isinstance(stages, int) and not isinstance(stages, bool) and (stages == 0 or 2 <= stages <= 16)):
            return f"mainloop_stages is {stages!r}, expected 0 (as many as fit) or 2 to 16"
    return None


# CUTLASS's programmatic-dependent-launch support (the cutlass target's pdl) in its sm90
# kernels. Its stream-K tile scheduler (split-K and stream-K kernels) does not compile with it
# (CUTLASS 4.2: sm90_tile_scheduler_stream_k.hpp's const is_last_tile calls a non-const
# member), so those kernels are built and launched without it.
PDL_FLAG = "-DCUTLASS_ENABLE_GDC_FOR_SM90"


def kernel_flags(kernel, flags: list) -> list:
    """The nvcc flags of `kernel`'s compile unit: the target's, less PDL where it cannot build."""
    if getattr(kernel, "splits", 1) > 1 or getattr(kernel, "stream_k", False):
        return [flag for flag in flags if flag != PDL_FLAG]
    return list(flags)


# Template data that only a kernel's entry point reads: its symbol and name, the problem's
# sizes, the argument slots and alpha. Renders that differ in nothing else name the same
# CUTLASS kernel types (the kernels take their sizes at run time), so one compile unit holds
# them all and instantiates the types once: the bulk of a unit's compile time (about 20 of
# 30 s for an sm90 GEMM), against well under a second per extra entry point.
ENTRY_POINT_FIELDS = frozenset({
    "kernel_name", "symbol", "m", "n", "k", "batch", "alpha",
    "a_index", "b_index", "bias_index", "residual_index",
    "height", "width", "in_channels", "out_channels", "kernel_h", "kernel_w", "out_h", "out_w",
    "strides", "pads", "dilations"})


def kernel_type_key(template: str, data: dict, flags: list) -> tuple:
    """What decides the CUTLASS types a render instantiates: the template, the unit's
    compile flags and the template data less the entry point's (ENTRY_POINT_FIELDS).
    Renders with one key go into one compile unit (compile_unit_sources); two renders whose
    types differ after all would still compile together, only not faster."""
    import json
    type_data = {key: value for key, value in data.items() if key not in ENTRY_POINT_FIELDS}
    return template, tuple(flags), json.dumps(type_data, sort_keys=True)


def compile_unit_sources(renders: list) -> dict:
    """[(kernel type key, symbol, rendered source)] -> {first symbol: one compile unit's
    source}: the renders of one key concatenated (each is self-contained: its types in the
    symbol's own namespace, its headers guarded), in the order given."""
    groups: dict = {}
    for key, symbol, text in renders:
        groups.setdefault(key, []).append((symbol, text))
    sources = {}
    for members in groups.values():
        symbols = [symbol for symbol, _ in members]
        head = "" if len(symbols) == 1 else (
            f"// One compile unit for the {len(symbols)} entry points of one kernel type (its CUTLASS "
            f"types are instantiated once): {', '.join(symbols)}\n\n")
        sources[symbols[0]] = head + "\n".join(text for _, text in members)
    return sources


def kernel_template(kernel) -> str:
    """The template that renders `kernel`."""
    if isinstance(kernel, ConvKernel):
        return kernel.template()
    return "cutlass/gemm_sm90.cu.j2" if kernel.sm >= 90 else "cutlass/gemm_sm80.cu.j2"


def operand_sizes(problem) -> list:
    """Elements of a/x, b/w, bias, residual (0 when absent) and of the output."""
    if isinstance(problem, ConvProblem):
        return problem.operand_sizes()
    m, n, k, batch = problem.m, problem.n, problem.k, problem.batch
    return [m * k * batch, n * k * batch, n if problem.has_bias else 0,
            m * n * batch if problem.has_residual else 0, m * n * batch]
