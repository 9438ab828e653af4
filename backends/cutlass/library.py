"""The cutlass backend's share of the kernel library (byoc/kernel_library.py): the compile
units tuning times its candidates with, for every candidate of the target's arch, so that
`byoc kernels build` compiles them once per machine and a later build of any model times
its problems' candidates without compiling one.

A CUTLASS 3.x kernel's unit depends on its types (tile, cluster, schedule, dtype, B's
layout, epilogue), never on problem sizes (kernels.kernel_unit): the units of the epilogue
proxies (tuning.epilogue_proxy: `plain` and `bias`) of every candidate, dtype and layout
are all the units tuning with the proxy epilogue can ask for. `epilogues="all"` adds the
fused activations and residuals the patterns take, so that a build's winners come from the
library as well (several times the units and the size)."""
from __future__ import annotations

from .gemm_kernels import ELEMENTS
from .kernels import (FIXED_CHANNELS, NO_FILTER, CandidateFilter, ConvKernel,
                      ConvProblem, GemmProblem, candidates, conv_candidates, kernel_unit)

# The epilogues tuning times candidates with (tuning.epilogue_proxy), and those a build's
# kernels carry besides (the patterns' fused activations and residuals, bias first).
PROXY_EPILOGUES = ((None, False, False), (None, True, False))  # (activation, bias, residual)
ACTIVATIONS_FUSED = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "hard_swish")
ALL_EPILOGUES = PROXY_EPILOGUES + tuple((activation, True, False) for activation in ACTIVATIONS_FUSED) + \
    ((None, True, True), ("relu", True, True))
EPILOGUE_SETS = {"proxy": PROXY_EPILOGUES, "all": ALL_EPILOGUES}


def library_units(sm: int, flags: list, dtypes=("float16",), epilogues: str = "proxy",
                  allowed: CandidateFilter = NO_FILTER, runtime_epilogue: bool = False) -> list:
    """kernels.KernelUnit of every candidate kernel of `sm` that the target allows
    (`allowed`: GEMMs, split-K and stream-K ones where it lets tuning try them, convs) for
    `dtypes`, both layouts of B and the epilogue set `epilogues`, compiled with the cutlass
    target's `flags` (codegen.cutlass_flags): one unit per distinct entry. With
    `runtime_epilogue` (the target's), the sm90 kernels' units take their epilogue at run
    time (kernels.runtime_problem): the proxies' two (no residual, and a GEMM's with one) are
    then every epilogue's, and the library holds every sm90 kernel a build links."""
    if epilogues not in EPILOGUE_SETS:
        raise ValueError(f"epilogues {epilogues!r}: expected one of {', '.join(EPILOGUE_SETS)}")
    unknown = [dtype for dtype in dtypes if dtype not in ELEMENTS]
    if unknown:
        raise ValueError(f"dtype {', '.join(unknown)}: the cutlass kernels take {' or '.join(ELEMENTS)}")
    units = {}
    sets = EPILOGUE_SETS[epilogues] + (((None, True, True),) if runtime_epilogue else ())
    gemms = candidates(sm, allowed)  # split-K and stream-K among them where the target lets tuning try them
    for dtype in dtypes:
        for activation, bias, residual in dict.fromkeys(sets):
            for transposed in (False, True):
                # sizes every kernel runs (K long enough to split 8 ways): they do not enter the unit;
                # a residual with an activation is a pointwise conv's relu(x + bias + residual)
                problem = GemmProblem(4096, 4096, 4096, 1, dtype, transposed, activation=activation, has_bias=bias,
                                      has_residual=residual, residual_in_activation=bool(residual and activation))
                for kernel in gemms:
                    if kernel.supports(problem) is None:
                        unit = kernel_unit(kernel, problem, flags, runtime_epilogue)
                        units.setdefault(unit.entry, unit)
            if residual and runtime_epilogue:
                continue  # a runtime conv unit takes its residual from the call (a stem has none)
            for kernel in conv_candidates(sm, allowed):
                problem = _conv_problem(kernel, dtype, activation, bias, residual)
                if kernel.supports(problem) is None:
                    unit = kernel_unit(kernel, problem, flags, runtime_epilogue)
                    units.setdefault(unit.entry, unit)
    return list(units.values())


def _conv_problem(kernel: ConvKernel, dtype: str, activation, bias: bool, residual: bool) -> ConvProblem:
    """A 3x3 conv the kernel's unit is rendered for (its channels: the fixed-channel
    iterator's pixel width, else 64; the sizes do not enter the unit)."""
    channels = FIXED_CHANNELS if kernel.fixed_channels else 64
    return ConvProblem(32, 56, 56, channels, 64, 3, 3, 56, 56, (1, 1), (1, 1, 1, 1), (1, 1), dtype,
                       activation=activation, has_bias=bias, has_residual=residual)

