"""The programs of one library: the pipeline once for a static build; with several sizes
for a named dim (config `dims: {batch: [1, 8, 32]}`), once per shape bucket, each in its
own bucket<N>/ of the work directory (its function symbols ending in _b<N>), the
constants of all in one weights blob. Then which dims run() may pad: the programs as
simplify left them are compared (analysis/padding.py). With several CUDA archs (config
`arch: [sm_80, sm_90]`), all that once per arch, each in its own <arch>/ (symbols ending
in _sm<NN>), for a device target of that arch with PTX beside its machine code (not for
an sm_XXa), backends' `sm` options left to it; the runtime runs one arch's programs,
chosen by the device at create."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from .build import make_workdir
from .errors import ConfigError
from .ir.module import IRModule
from .package import Program
from .pipeline import run_pipeline


def lower_programs(context) -> tuple[list, dict]:
    """(the programs, dim -> None where run() pads sizes between buckets else why not)."""
    archs = context.config.arch
    if archs and context.target.kind != "cuda":
        raise ConfigError(f"arch {archs}: several CUDA archs need a cuda target, but this build's is "
                          f"{context.target} (target: auto found no GPU?); expected target: cuda -arch=... or no arch")
    buckets = context.config.shape_buckets()
    several = len(archs) > 1 or (archs and archs[0] != context.target.attrs["arch"])
    if len(buckets) == 1 and not several:
        context = dataclasses.replace(context, dims=buckets[0])
        return [Program(context, buckets[0], run_pipeline(context))], {}
    if len(buckets) > 1 and isinstance(context.model, IRModule):
        raise ConfigError(f"dims {context.config.dims}: shape buckets are for ONNX models (their named dims); "
                          f"an IRModule has static shapes already")
    from .codegen.host_plan import WeightsBlob
    weights = WeightsBlob(share_equal=True)
    if not several:
        return bucket_programs(context, buckets, weights)[:2]
    programs, padding, model = [], {}, context.model
    for number, arch in enumerate(archs):
        context.progress.stage(f"arch {number + 1}/{len(archs)}: {arch}")
        group, group_padding, model = bucket_programs(arch_context(context, arch, model), buckets, weights)
        programs += group
        padding = padding if number else group_padding  # the same ops in every arch's programs
    return programs, padding


def arch_context(context, arch: str, model):
    """The context of `arch`'s programs (see the module docstring): in <arch>/ of the work
    directory, their symbols ending in _sm<NN>."""
    from .target import Target
    target = Target("cuda", **{**context.target.attrs, "arch": arch, "ptx": not arch.endswith("a")})
    workdir, _ = make_workdir(str(context.workdir / arch))
    backends = [(name, {key: value for key, value in options.items() if key != "sm"} if options else options)
                for name, options in context.config.backends]
    return dataclasses.replace(context, config=dataclasses.replace(context.config, workdir=str(workdir),
                                                                   backends=backends),
                               target=target, workdir=workdir, model=model,
                               symbol_suffix="_" + arch.replace("_", ""))


def bucket_programs(context, buckets: list, weights) -> tuple[list, dict, object]:
    """(a program per bucket of `buckets` in `context`, the padding of their dims, the model
    as the next group of programs reads it: the file's bytes once read)."""
    pairs = padding_pairs(context.config.dims, buckets) if len(buckets) > 1 else {}
    compared = {index for pair in pairs.values() for index in pair}
    programs, simplified = [], {}
    model = context.model
    for number, dims in enumerate(buckets):
        if len(buckets) > 1:
            label = ", ".join(f"{name}={size}" for name, size in dims.items())
            context.progress.stage(f"shape bucket {number + 1}/{len(buckets)}: {label}")
            workdir, _ = make_workdir(str(context.workdir / f"bucket{number}"))
        else:
            workdir = context.workdir
        bucket = dataclasses.replace(context, config=dataclasses.replace(context.config, workdir=str(workdir),
                                                                         dims=dims),
                                     workdir=workdir, model=model, dims=dims, weights=weights,
                                     symbol_suffix=context.symbol_suffix + (f"_b{number}" if number else ""))
        def record(mod, number=number):  # the module the padding analysis compares
            simplified[number] = mod
        programs.append(Program(bucket, dims, run_pipeline(bucket, after={"simplify": record}
                                                           if number in compared else None)))
        if number == 0 and isinstance(model, (str, os.PathLike)):
            # the file once more, for all the other buckets: their weights view these bytes
            # (the first bucket's import named the file in any error, and read it whole)
            model = Path(model).read_bytes()
    if len(buckets) == 1:
        return programs, {}, model
    from .analysis.padding import padded_axes, padding_problem
    padding = {}
    for name, (small, large) in pairs.items():
        try:
            padding[name] = padding_problem(simplified[small], simplified[large],
                                            [output for output, _ in programs[large].host.plan.outputs])
        except Exception as error:  # noqa: BLE001 - an analysis the build does not need: say so, build on
            padding[name] = f"the analysis failed ({type(error).__name__}: {error})"
    simplified.clear()
    # the axes the runtime pads (a dim whose axes do not scale with it is refused here)
    axes, padding = padded_axes(
        buckets, [[(name, tuple(type_.shape)) for name, type_ in program.host.plan.inputs + program.host.plan.outputs]
                  for program in programs], padding)
    for program, program_axes in zip(programs, axes, strict=True):
        program.axis_dims = program_axes
    shapes = {}
    for program in programs:  # a dim no input declares (input_shapes fixed it): buckets run alike
        key = tuple((name, tuple(type_.shape)) for name, type_ in program.host.plan.inputs)
        if key in shapes:
            raise ConfigError(f"dims {context.config.dims}: buckets {shapes[key]} and {program.dims} take inputs of "
                              f"the same shapes ({', '.join(f'{n} {s}' for n, s in key)}); expected sizes of "
                              f"dims the inputs declare (input_shapes fixes an input's dims)")
        shapes[key] = program.dims
    return programs, padding, model


def padding_pairs(dims: dict, buckets: list) -> dict:
    """For each dim given several sizes: the two buckets (indices) that differ only in it,
    at its two largest sizes, the other dims at their largest too (where a size of 1 would
    hide a reshape that interleaves rows), whose programs analysis/padding.py compares."""
    pairs = {}
    for name, sizes in dims.items():
        if isinstance(sizes, list) and len(sizes) > 1:
            smaller, larger = sorted(sizes)[-2:]
            base = dict(buckets[-1])
            pairs[name] = (buckets.index({**base, name: smaller}), buckets.index({**base, name: larger}))
    return pairs
