"""The CUTLASS kernels the backend renders, one interface for both families (GEMMs in
gemm_kernels.py, 2-D convolutions in conv_kernels.py): the candidates of a problem, the
heuristic's default, kernels from the tuning database, compile flags, and the kernels' compile
units (one per kernel type, shared by every problem it runs) with the partitions' calls of them."""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .conv_kernels import (FIXED_CHANNEL_CONV_CANDIDATES, FIXED_CHANNELS, SM80_CONV_CANDIDATES,  # noqa: F401
                           SM90_CONV_CANDIDATES, ConvKernel, ConvProblem, conv_candidates, heuristic_conv_kernel,
                           sm80_conv_flaw, sm90_conv_flaw)
from .gemm_kernels import (ACTIVATION_CODES, ACTIVATIONS, ELEMENTS, NARROW_TILES, NO_FILTER, ONE_WAVE_TILES,  # noqa: F401
                           RUNTIME_ACTIVATION,
                           SM80_CANDIDATES, SM90_CANDIDATES, SM90_SCHEDULES, SM90_SPLIT_K, SM90_STREAM_K, SM_COUNT,
                           TUNING_ONLY, CandidateFilter, GemmKernel, GemmProblem, candidates, estimated_cycles,
                           gemm_operand_flaw, heuristic_kernel, parse_shape, sm80_gemm_flaw, sm90_gemm_flaw)

__all__ = [  # the families' names, so that one import serves the backend and the tests
    "FIXED_CHANNEL_CONV_CANDIDATES", "FIXED_CHANNELS", "SM80_CONV_CANDIDATES", "SM90_CONV_CANDIDATES", "ConvKernel",
    "ConvProblem", "conv_candidates", "heuristic_conv_kernel", "ACTIVATIONS", "ELEMENTS", "NARROW_TILES", "NO_FILTER",
    "ONE_WAVE_TILES", "SM80_CANDIDATES", "SM90_CANDIDATES", "SM90_SCHEDULES", "SM90_SPLIT_K", "SM90_STREAM_K",
    "SM_COUNT", "TUNING_ONLY", "CandidateFilter", "GemmKernel", "GemmProblem", "candidates", "estimated_cycles", "heuristic_kernel",
    "parse_shape", "sm80_conv_flaw", "sm90_conv_flaw", "gemm_operand_flaw", "sm80_gemm_flaw", "sm90_gemm_flaw",
    "KERNEL_ARCHS", "kernel_problem", "unsupported_reason", "usable_candidates", "default_kernel",
    "kernel_workspace_bytes", "kernel_from_json", "PDL_FLAG",
    "kernel_flags", "INCLUDE_DIR", "SPLIT_TEMPLATES", "KernelUnit", "kernel_unit", "partition_call", "kernel_template",
    "operand_sizes", "runtime_problem", "RUNTIME_ACTIVATION", "ACTIVATION_CODES"]


# The archs of the two kernel families: sm_90 (CUTLASS 3.x) and sm_80 (CUTLASS 2.x, which
# sm_86 and sm_89 builds take as well).
KERNEL_ARCHS = (90, 80)


def kernel_problem(sm: int, problem):
    """The problem `sm`'s kernels run for a partition's `problem`: on sm_90 a pointwise conv
    runs as the GEMM it is, where the GEMM kernels can run that GEMM (ConvProblem.as_gemm:
    CUTLASS's sm90 convs are non-persistent with one consumer warp group, its GEMMs
    persistent with two)."""
    if sm >= 90 and isinstance(problem, ConvProblem):
        return problem.as_gemm() or problem
    return problem


def unsupported_reason(problem, sms=KERNEL_ARCHS, allowed: CandidateFilter = NO_FILTER) -> str | None:
    """None when a candidate kernel of one of `sms` runs `problem` (as kernel_problem hands it
    to that arch), else every distinct reason the candidates gave: what a pattern check
    answers, so that no match is taken that no kernel could run."""
    reasons = {}
    for sm in sms:
        runs = kernel_problem(sm, problem)
        for kernel in conv_candidates(sm, allowed) if isinstance(runs, ConvProblem) else candidates(sm, allowed):
            reason = kernel.supports(runs)
            if reason is None:
                return None
            reasons[reason] = None
    archs = " or ".join(f"sm{sm}" for sm in sms)
    return f"no {archs} kernel runs it: {'; '.join(reasons) or 'no candidates'}"


def usable_candidates(sm: int, problem, allowed: CandidateFilter = NO_FILTER) -> list:
    """The candidates of the problem's family (GEMM or conv) that the target allows and
    that can run it, the heuristic's choice first (the tuner's reference). With
    `allowed.per_problem`, a GEMM's are that many: the heuristic's and those
    gemm_kernels.estimated_cycles ranks first (compiling every candidate of BERT's few
    problems takes minutes; the conv families are small and all timed)."""
    family = conv_candidates(sm, allowed) if isinstance(problem, ConvProblem) else candidates(sm, allowed)
    usable = [kernel for kernel in family if kernel.supports(problem) is None]
    if usable:
        first = default_kernel(sm, problem, allowed)
        rest = [kernel for kernel in usable if kernel != first]
        if allowed.per_problem and isinstance(problem, GemmProblem):
            rest = sorted(rest, key=lambda kernel: estimated_cycles(kernel, problem))[:allowed.per_problem - 1]
        usable = [first] + rest
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


# byoc's own kernel headers: the ByocCutlassCall every kernel unit exports a function of,
# the flash attention kernel
INCLUDE_DIR = Path(__file__).parent / "include"


# Templates rendered in two halves (`part`): the device half, the kernel alone, compiled to a
# cubin with no host pass (a "cubin" compile unit), and the host half that loads and launches
# it (include/byoc_cutlass_launch.h). nvcc compiles the two side by side, each in about half
# the time of one unit of both (bench/results/nvcc_phases.md).
SPLIT_TEMPLATES = {"cutlass/gemm_sm90.cu.j2", "cutlass/conv2d_sm90.cu.j2"}


@dataclass(frozen=True)
class KernelUnit:
    """One CUTLASS kernel's compile unit: its types instantiated once, and one exported
    function, `entry`, that runs any problem the kernel supports (sizes and operands come in
    a ByocCutlassCall, include/byoc_cutlass_call.h). The source depends on the kernel's types
    and the flags only, so every partition, tuning candidate and model that uses the kernel
    compiles the same text: one object, from the object cache after the first time. A split
    template's unit has its device half in `device_source` (compiled to <entry>_device.o, its cubin at the
    symbol <entry>_device_cubin)."""
    entry: str
    name: str  # the kernel's name (kernel.name(problem))
    source: str
    flags: tuple
    device_source: str | None = None
    # what the unit's device half shares with others' (CompileUnit.unity): the kernel's name
    # less its epilogue, for kernels of one tile, schedule and layout instantiate mostly the
    # same templates (bench/results/nvcc_phases.md, "Unity builds")
    unity: str = ""

    @property
    def objects(self) -> list:
        """The object files the unit compiles to (names under the work directory's obj/)."""
        return [f"{self.entry}.o"] + ([f"{self.entry}_device.o"] if self.device_source is not None else [])


# What a kernel unit's entry stands for while its text is rendered: the entry is then named
# after that text (kernel_unit).
_ENTRY_PLACEHOLDER = "BYOC_KERNEL_ENTRY_NAME"


@functools.lru_cache(maxsize=None)
def _include_dir_digest() -> str:
    """sha256 of byoc's kernel headers (INCLUDE_DIR), which every kernel unit includes."""
    digest = hashlib.sha256()
    for header in sorted(INCLUDE_DIR.iterdir()):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    return digest.hexdigest()


def runtime_problem(kernel, problem):
    """The problem a runtime-epilogue unit of `kernel` is rendered for in place of `problem`
    (the cutlass target's runtime_epilogue): its activation the call's
    (RUNTIME_ACTIVATION) and its bias the call's, so one unit serves every epilogue of its
    dtype and layout; a GEMM keeps whether it has a residual (the source C costs shared
    memory and the overlap of the stores where there is none), a conv reads its source
    anyway and takes the residual from the call too. None where the kernel has no such
    form (the sm80 templates)."""
    import dataclasses
    if kernel_template(kernel) not in SPLIT_TEMPLATES:
        return None
    if isinstance(problem, ConvProblem):
        rendered = dataclasses.replace(problem, activation=RUNTIME_ACTIVATION, has_bias=True, has_residual=True)
    else:
        rendered = dataclasses.replace(problem, activation=RUNTIME_ACTIVATION, has_bias=True,
                                       residual_in_activation=problem.has_residual)
    return rendered if kernel.supports(rendered) is None else None


def kernel_unit(kernel, problem, flags: list, runtime_epilogue: bool = False) -> KernelUnit:
    """The compile unit of `kernel` as it runs `problem`'s dtype, layouts and epilogue (with
    `runtime_epilogue`, where the kernel has that form: every epilogue of its dtype and
    layout, runtime_problem); its entry is named after the kernel and a hash of what it
    compiles: the rendered text, the flags and byoc's headers. So one entry name is one code
    wherever it is linked: a unity group's object (toolchain/unity.py) that the cache hands
    to one member carries the others' entries into builds that may have newer ones. `flags`
    are the target's: the unit takes kernel_flags of them, and byoc's include directory. The
    unit's `name` is the kernel's as it runs `problem` (what tuning reports)."""
    from byoc.codegen.templates import render_template
    template = kernel_template(kernel)
    flags = kernel_flags(kernel, flags)
    label = kernel.name(problem)
    if runtime_epilogue:
        problem = runtime_problem(kernel, problem) or problem
    data = {**kernel.type_data(problem), "entry": _ENTRY_PLACEHOLDER}
    split = template in SPLIT_TEMPLATES
    texts = ([render_template(template, {**data, "part": part}) for part in ("host", "device")] if split
             else [render_template(template, data)])
    digest = hashlib.sha256(json.dumps([template, list(flags), _include_dir_digest(), texts]).encode()).hexdigest()
    entry = f"byoc_{data['kernel_name']}_{digest[:10]}"
    texts = [text.replace(_ENTRY_PLACEHOLDER, entry) for text in texts]
    unit_flags = (*flags, f"-I{INCLUDE_DIR}")
    if split:
        mainloop = data["kernel_name"].removesuffix(f"_{problem.epilogue_name}")
        return KernelUnit(entry, label, texts[0], unit_flags, texts[1],
                          unity=f"{Path(template).name.split('.')[0]}:{mainloop}")
    return KernelUnit(entry, label, texts[0], unit_flags)


def partition_call(symbol: str, unit: KernelUnit, kernel, problem, indices: dict) -> dict:
    """What templates/cutlass/entry.j2 renders for one partition (or one tuning candidate):
    the entry point `symbol` that calls `unit`'s kernel with the problem's sizes and alpha and
    the operands' places among the partition's parameters (`indices`: a, b, bias, residual)."""
    return {"symbol": symbol, "kernel": unit.entry, "kernel_name": unit.name, "problem": problem.key,
            "sizes": kernel.call_sizes(problem),
            # repr: always a valid C++ float literal (1.0f, 1e-05f)
            "alpha": f"{float(getattr(problem, 'alpha', 1.0))!r}f",
            "a": indices["a"], "b": indices["b"], "bias": indices.get("bias", -1),
            "residual": indices.get("residual", -1),
            "activation": activation_code(problem.activation)}


def activation_code(activation) -> int:
    """ByocCutlassCall.activation for `activation` (include/byoc_runtime_activation.h); an
    activation without one is refused, not run as the identity."""
    if activation not in ACTIVATION_CODES:
        from byoc.errors import BuildError
        raise BuildError(f"cutlass: activation {activation!r} has no runtime code (expected one of "
                         f"{', '.join(str(a) for a in ACTIVATION_CODES)})")
    return ACTIVATION_CODES[activation]


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
