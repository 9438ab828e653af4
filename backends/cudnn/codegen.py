"""cudnn codegen: Compiler="cudnn" functions -> one C++ source of entry points
(templates/cudnn/entries.cc.j2), each a conv described as plain data, and the engine
(engine/cudnn_conv.cc) that builds its cuDNN graph and plan at create; linked with cuDNN
by soname. Where the build can measure, each conv's plan is the engine plans.py timed
fastest on this GPU model (kept in the cost store); elsewhere the heuristic's, at create."""
from __future__ import annotations

from pathlib import Path

from byoc.codegen import op_chain
from byoc.errors import BuildError

ENGINE_DIR = Path(__file__).parent / "engine"
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4, "sigmoid": 5}


def conv_description(symbol: str, func, target) -> dict:
    """The ByocCudnnConv of one partition (byoc_cudnn.h's fields; the workspace limit and
    tf32 from the cudnn `target`), with where its operands are among the partition's
    parameters."""
    chain = op_chain.read_conv_epilogue(func, "cudnn")
    attrs = chain.attrs
    if attrs["data_layout"] != "NHWC":
        raise BuildError(f"cudnn: @{symbol}: the conv is {attrs['data_layout']}; the cudnn backend runs NHWC convs")
    if chain.activation not in ACTIVATION_CODES:
        raise BuildError(f"cudnn: @{symbol}: cuDNN has no pointwise mode for {chain.activation}")
    dtype = chain.conv.type.dtype
    if dtype not in DTYPE_CODES or chain.data.type.dtype != dtype:
        raise BuildError(f"cudnn: @{symbol}: dtype {dtype}; expected one of {', '.join(DTYPE_CODES)}")
    batch, height, width, channels = chain.data.type.shape
    out_channels, kernel_h, kernel_w, _ = chain.weight.type.shape
    _, out_h, out_w, _ = chain.conv.type.shape
    indices = chain.indices
    return {
        "symbol": symbol, "dtype": DTYPE_CODES[dtype], "batch": batch, "height": height, "width": width,
        "channels": channels, "out_channels": out_channels, "kernel_h": kernel_h, "kernel_w": kernel_w,
        "groups": attrs["groups"], "out_h": out_h, "out_w": out_w, "strides": list(attrs["strides"]),
        "pads": list(attrs["pads"]), "dilations": list(attrs["dilations"]),
        "has_bias": int(chain.has_bias), "has_residual": int(chain.has_residual),
        "activation": ACTIVATION_CODES[chain.activation], "engine": -1,
        "workspace_limit": int(target.attrs["workspace_limit"]), "tf32": int(bool(target.attrs["tf32"])),
        "data": indices["data"], "weight": indices["weight"],
        "bias": f"args[{indices['bias']}]" if chain.has_bias else "nullptr",
        "residual": f"args[{indices['residual']}]" if chain.has_residual else "nullptr",
        "summary": _summary(dtype, chain),
    }


def _summary(dtype: str, chain) -> str:
    data, weight, attrs = chain.data.type.shape, chain.weight.type.shape, chain.attrs
    text = (f"conv2d {dtype} {'x'.join(map(str, data))} * {'x'.join(map(str, weight))} groups {attrs['groups']} "
            f"stride {'x'.join(map(str, attrs['strides']))} pads {','.join(map(str, attrs['pads']))}")
    if chain.has_bias:
        text += " + bias"
    if chain.has_residual:
        text += " + residual"
    return text + (f" -> {chain.activation}" if chain.activation else "")


def known_cost(functions: dict, target) -> float | None:
    """Microseconds a run of these cudnn functions costs on the visible GPU: the sum of
    their convs' fastest plans as the cost store has them (plans.py); None where one is not
    stored (its candidate is then built and timed)."""
    from .plans import stored_engines
    try:
        convs = [conv_description(symbol, func, target) for symbol, func in functions.items()]
    except BuildError:
        return None
    choices = stored_engines(convs, target)
    if not convs or any(engine < 0 for engine, _ in choices):
        return None
    return sum(us for _, us in choices)


def learn_costs(candidates: list, target) -> None:
    """Times the plans of every conv of these candidates not yet in the cost store, all in
    one process (plans.choose_engines): known_cost then reads them."""
    from .plans import choose_engines
    convs = []
    for functions in candidates:
        for symbol, func in functions.items():
            try:
                convs.append(conv_description(symbol, func, target))
            except BuildError:
                continue
    choose_engines(convs, target)


def engine_units(target) -> list:
    """The engine's compile units for `target`'s device (host C++ against cuDNN's and the
    CUDA runtime's headers): building and running convs, and timing their plans."""
    from byoc.toolchain import CompileUnit, cuda_include_dirs, cudnn_include_dirs
    includes = [f"-I{d}" for d in cudnn_include_dirs() + cuda_include_dirs()]
    flags = target.device.cxx_flags() + [f"-I{ENGINE_DIR}"] + includes
    return [CompileUnit(ENGINE_DIR / source, "cxx", flags, f"{source[:-3]}.o")
            for source in ("cudnn_conv.cc", "cudnn_plan_timing.cc")]


def codegen(functions: dict, target) -> list:
    from byoc.backend import Artifact
    from byoc.codegen.templates import render_template
    from byoc.toolchain import CompileUnit

    from .plans import choose_engines, failed_plans
    device = target.device
    if device is None or device.kind != "cuda":
        raise BuildError("the cudnn backend needs a cuda device target")
    convs = [conv_description(symbol, func, target) for symbol, func in functions.items()]
    units = engine_units(target)  # first: it names the package cuDNN comes from where it is missing
    chosen = choose_engines(convs, target)
    for conv, reason in zip(convs, failed_plans(convs, target)):
        if reason is not None:  # known here, not at the model's create on the deploy host
            raise BuildError(f"cudnn: @{conv['symbol']} ({conv['summary']}): {reason} on this GPU; leave the conv "
                             f"to another backend (list cudnn after it, or partition: measured)")
    for conv, (engine, us) in zip(convs, chosen):
        conv["engine"] = engine
        conv["plan_note"] = (f"engine {engine}, {us:.2f} us when the build timed it" if engine >= 0 else
                             "the heuristic's plan, chosen at create")
    workdir = Path(target.workdir)
    source = workdir / "cudnn_entries.cc"
    source.write_text(render_template("cudnn/entries.cc.j2", {"convs": convs}))
    units.append(CompileUnit(source, "cxx", device.cxx_flags() + [f"-I{ENGINE_DIR}"], "cudnn_entries.o"))
    return [Artifact(backend="cudnn", kind="source", symbols=list(functions), compile_units=units,
                     workspace_bytes={conv["symbol"]: conv["workspace_limit"] for conv in convs},
                     link_libraries=["cudnn"],
                     stateful_symbols=list(functions),
                     kernels={conv["symbol"]: f"cudnn {conv['summary']}" for conv in convs})]
