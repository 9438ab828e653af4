"""Codegen of Composite="builtin.conv2d_epilogue" functions: a depthwise or grouped conv2d,
or a dense one of 1 to 4 input channels, and the elementwise chain that reads it
(partition.py says when they are one function).

CUDA: the conv runs in shim/cuda/depthwise.cuh's kernels (nhwc/tiled for depthwise convs,
few_channels for the dense ones) or grouped_conv.cuh's, with a generated epilogue functor
(templates/builtin/conv2d_epilogue.j2) that takes each thread's 8 channel sums, rounds them
to the conv's dtype (as storing the conv's output would), evaluates the chain on them with
the other inputs read at the same output index, and stores the chain's result: the conv's
output is never written.

CPU (a cpu build of a float16 or bfloat16 NHWC model; ops pinned to the cpu in a cuda build
are outlined one by one before partitioning and never fuse): the conv as the shim call it
would be alone, into the workspace, then the chain as the elementwise loop it would be
alone, reading the conv's output from there.
"""
from __future__ import annotations

from ...errors import BuildError
from ...ir.expr import Function
from ...ir.types import TensorType
from .dtypes import storage_type
from .elementwise import INT32_INDEX_LIMIT, ROUND_HELPERS, elementwise_kernel
from .partition import DEPTHWISE_VECTOR, is_depthwise_conv, is_epilogue_conv, is_grouped_conv
from .shim_calls import WORKSPACE_ALIGNMENT, emit_shim_calls

DEPTHWISE_LANES = DEPTHWISE_VECTOR  # channels (output elements) per epilogue call


def split(symbol: str, func: Function) -> tuple:
    """(the conv's binding, the chain as an elementwise Function whose first parameter is the
    conv's output, the index in func.params of each of the chain's other parameters)."""
    convs = [b for b in func.bindings if is_epilogue_conv(b.value)]
    if len(convs) != 1 or any(arg not in func.params for arg in convs[0].value.args):
        raise BuildError(f"builtin codegen: {symbol}: a conv2d_epilogue function holds one depthwise, grouped "
                         f"or few-channel conv2d of two parameters")
    conv = convs[0]
    chain = [b for b in func.bindings if b is not conv]
    read = {arg for b in chain for arg in b.value.args}
    outside = [p for p in func.params if p in read]
    epilogue = Function([conv.var, *outside], chain, func.result, func.ret_type, {})
    return conv, epilogue, [func.params.index(p) for p in outside]


def conv_epilogue_cuda(symbol: str, func: Function) -> dict:
    """The plain dict templates/builtin/conv2d_epilogue.j2 renders."""
    conv, epilogue, arg_indices = split(symbol, func)
    kernel = elementwise_kernel(symbol, epilogue, "cuda")
    if kernel["needs_coordinates"] and kernel["dims"][-1]["size"] % DEPTHWISE_LANES:
        raise BuildError(f"builtin codegen: {symbol}: a broadcast input of the conv's epilogue varies within "
                         f"{DEPTHWISE_LANES} channels")
    data, weight, out = conv.value.args[0].type, conv.value.args[1].type, conv.value.type
    kernel["inputs"][0].update(access="accumulator", round=ROUND_HELPERS[out.dtype])
    for input in kernel["inputs"][1:]:  # the epilogue's parameter k is func's arg_indices[k - 1]
        input["arg"] = arg_indices[input["arg"] - 1]
    batch, in_h, in_w, _ = data.shape
    _, kernel_h, kernel_w, _ = weight.shape
    _, out_h, out_w, channels = out.shape  # the geometry's channels are the output's
    attrs = conv.value.attrs
    largest = max(data.size, out.size, func.ret_type.size, *(param.type.size for param in func.params))
    index_type = "int32_t" if largest <= INT32_INDEX_LIMIT else "int64_t"
    geometry = [in_h, in_w, channels, kernel_h, kernel_w, out_h, out_w, *attrs["strides"], attrs["pads"][0],
                attrs["pads"][1], *attrs["dilations"]]
    return {
        **kernel,
        "lanes": DEPTHWISE_LANES,
        "index_type": index_type,
        "conv": {"storage": storage_type(data.dtype, "cuda"), "data_arg": func.params.index(conv.value.args[0]),
                 "weight_arg": func.params.index(conv.value.args[1]), "batch": batch, "geometry": geometry,
                 "launch": _launch(conv.value, storage_type(data.dtype, "cuda"), index_type)},
    }


def common_window(attrs: dict, kernel_h: int, kernel_w: int) -> bool:
    """depthwise.cuh's common_window: the windows its kernels unroll (3x3 and 5x5 at stride
    1 or 2, 7x7 at stride 1, no dilation)."""
    strides, dilations = list(attrs["strides"]), list(attrs["dilations"])
    return (dilations == [1, 1] and strides[0] == strides[1] in (1, 2) and kernel_h == kernel_w
            and (kernel_w in (3, 5) or (kernel_w == 7 and strides[0] == 1)))


def _launch(conv, storage: str, index_type: str) -> str:
    """The depthwise.cuh or grouped_conv.cuh launcher of this conv, its window (or group
    widths) named at compile time so that the epilogue instantiates only the kernels that
    can run it."""
    if is_grouped_conv(conv):
        out_channels, _, _, group_in = conv.args[1].type.shape
        return f"launch_grouped<{group_in}, {out_channels // conv.attrs['groups']}>"
    if not is_depthwise_conv(conv):
        return f"launch_few_channels<{conv.args[0].type.shape[3]}>"
    _, kernel_h, kernel_w, _ = conv.args[1].type.shape
    if common_window(conv.attrs, kernel_h, kernel_w):
        return f"launch_common_window<{storage}, {index_type}, {kernel_w}, {conv.attrs['strides'][0]}>"
    return f"launch_window<{storage}, {index_type}, 0, 0, 0>"


def conv_epilogue_cpu(symbol: str, func: Function) -> tuple[dict, dict, dict]:
    """(the conv's shim calls, the chain's elementwise loop, the function calling both),
    as the dicts templates/builtin/source.j2 renders for each."""
    conv, epilogue, arg_indices = split(symbol, func)
    conv_func = Function(list(conv.value.args), [conv], conv.var, conv.var.type, {})
    conv_calls = emit_shim_calls(f"{symbol}_conv", conv_func, "cpu").as_dict()
    loop = elementwise_kernel(f"{symbol}_epilogue", epilogue, "cpu")
    out_type: TensorType = conv.value.type
    conv_bytes = -(-max(out_type.nbytes, 1) // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT
    wrapper = {
        "symbol": symbol,
        "conv_args": [func.params.index(arg) for arg in conv.value.args],
        "epilogue_args": arg_indices,
        "conv_bytes": conv_bytes,
        "workspace_bytes": conv_bytes + conv_calls["workspace_bytes"],
    }
    return conv_calls, loop, wrapper
