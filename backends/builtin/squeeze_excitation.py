"""ClaimSqueezeExcitation: squeeze-and-excitation blocks become one builtin function each,
before any backend's patterns look; and their shim call.

An SE block (SENet; MobileNetV3's, EfficientNet's, RegNetY's) computes a per-channel gate
from the mean of each channel:

    %pooled = global_avg_pool2d(%x, layout="NHWC")                 (N, 1, 1, C)
    %h = conv2d(%pooled, W1)                                        W1 (S, 1, 1, C), OHWI
    %h = add(%h, b1)                    (optional; b1 of S elements)
    %h = relu | silu | hard_swish(%h)   (optional)
    %g = conv2d(%h, W2)                                             W2 (C, 1, 1, S)
    %g = add(%g, b2)                    (optional)
    %g = sigmoid | hard_sigmoid(%g)     (optional)
    %y = multiply(%g, %x)               (optional: the block's output)

Left to the partitioner, that is three kernels (four with the scale): the pool and two GEMMs of M = N, each too
small to do anything but wait on its launch (EfficientNet-B0 runs 16 such blocks a run).
The built-in backend runs the whole chain as one kernel (byoc_shim_squeeze_excitation), and
no other backend offers it, so it is claimed first: a pattern of a higher-priority backend
would otherwise take the two convs one by one.

Rewrites, in `main`: each such chain (NHWC, float32/float16/bfloat16, constant weights and
biases, every intermediate read only by the next op, C a multiple of 8 up to
BYOC_SE_MAX_CHANNELS, S up to BYOC_SE_MAX_SQUEEZE, N*C*S up to MAX_BATCH_MULTIPLY_ADDS)
into a function with
Compiler="builtin" and Composite="builtin.squeeze_excitation", bound and called where the
chain's last op was; the multiply of x by the gate joins it where it is the gate's only
reader (the kernel reads x a second time and writes the block's output: one launch fewer).
A pool followed by a 1x1 conv that fails a check is
refused with the reason in the partition report. Leaves alone: everything else.
"""
from __future__ import annotations

from ...errors import BuildError
from ...ir.expr import Binding, Call, Constant, Function, is_op_call
from ...ir.module import IRModule
from .dtypes import SHIM_DTYPES, float_literal
from .partition import COMPILER, _outline, _readers
from .shim_calls import ShimCalls

SE_COMPOSITE = f"{COMPILER}.squeeze_excitation"
PATTERN = "squeeze_excitation"
# byoc_shim.h's limits (BYOC_SE_MAX_CHANNELS, BYOC_SE_MAX_SQUEEZE) and vector width
MAX_CHANNELS = 4096
MAX_SQUEEZE = 1024
# Each sample's cluster reads both weight matrices: beyond this many multiply-adds of the
# two products over the batch (N * C * S), the unfused GEMMs, which read the weights once,
# win (bench/bench_squeeze_excitation.py, H200, batch 32: fused 10.1 against 13.6 us at C*S =
# 480*120, even at 672*168, 20.2 against 14.3 at 960*240).
MAX_BATCH_MULTIPLY_ADDS = 1 << 22
CHANNEL_MULTIPLE = 8
DTYPES = ("float32", "float16", "bfloat16")
# op -> byoc_activation enumerator
SQUEEZE_ACTIVATIONS = {"relu": "BYOC_ACTIVATION_RELU", "silu": "BYOC_ACTIVATION_SILU",
                       "hard_swish": "BYOC_ACTIVATION_HARD_SWISH"}
GATES = {"sigmoid": "BYOC_ACTIVATION_SIGMOID", "hard_sigmoid": "BYOC_ACTIVATION_HARD_SIGMOID"}


def claim_squeeze_excitation(mod: IRModule, report=None) -> IRModule:
    """A new module whose main calls a builtin function for each SE block (module docstring)."""
    main = mod["main"]
    bindings = main.bindings
    readers = _readers(bindings, main.result)
    blocks = {}  # index of the block's last binding -> the indices of its bindings
    for index, binding in enumerate(bindings):
        if not _is_op(binding.value, "global_avg_pool2d"):
            continue
        found = _block(bindings, readers, index)
        if found is None:
            continue
        if isinstance(found, str):
            if report is not None:
                report.refuse(COMPILER, PATTERN, "global_avg_pool2d", found, node=binding.var.name_hint)
            continue
        blocks[found[-1]] = found
    if not blocks:
        return mod
    members = {member for block in blocks.values() for member in block}
    new_bindings: list[Binding] = []
    for index, binding in enumerate(bindings):
        if index in blocks:
            new_bindings.extend(_outline([bindings[i] for i in blocks[index]], SE_COMPOSITE))
        elif index not in members:
            new_bindings.append(binding)
    result = mod.copy()
    result["main"] = Function(main.params, new_bindings, main.result, main.ret_type, main.attrs)
    return result


def _is_op(value, name: str) -> bool:
    return is_op_call(value, (name,))


def _only_reader(readers, index):
    """The one binding that reads binding `index`, or None (several readers, or main's result)."""
    found = readers[index]
    return next(iter(found)) if len(found) == 1 and None not in found else None


def _is_pointwise_conv(value, data_var, in_channels: int) -> bool:
    """A 1x1 conv2d (NHWC, OHWI, no stride, padding or dilation, one group) of data_var by a
    constant of in_channels input channels."""
    if not _is_op(value, "conv2d") or value.args[0] is not data_var or not isinstance(value.args[1], Constant):
        return False
    attrs = value.attrs
    weight = value.args[1].type.shape
    return (attrs.get("data_layout") == "NHWC" and attrs.get("kernel_layout") == "OHWI"
            and attrs.get("groups") == 1 and list(attrs["strides"]) == [1, 1]
            and list(attrs["dilations"]) == [1, 1] and not any(attrs["pads"])
            and len(weight) == 4 and tuple(weight[1:]) == (1, 1, in_channels))


def _bias_of(value, data_var, size: int) -> bool:
    """add(data_var, constant) (either order) whose constant is `size` values along the last axis."""
    if not _is_op(value, "add"):
        return False
    others = [a for a in value.args if a is not data_var]
    if len(others) != 1 or len(value.args) != 2 or not isinstance(others[0], Constant):
        return False
    shape = tuple(others[0].type.shape)
    return len(shape) >= 1 and shape[-1] == size and all(d == 1 for d in shape[:-1]) and \
        value.type.shape == data_var.type.shape


def _block(bindings, readers, pool_index):
    """The binding indices of the SE block that starts at the pool, a refusal reason when
    the pool feeds a 1x1 conv but a check fails, or None when it is no SE block."""
    pool = bindings[pool_index]
    x = pool.value.args[0].type
    step = _only_reader(readers, pool_index)
    if step is None or not _is_op(bindings[step].value, "conv2d"):
        return None
    if pool.value.attrs.get("layout") != "NHWC" or len(x.shape) != 4:
        return "the pool is not of an NHWC tensor (the kernel reads channels innermost)"
    channels = x.shape[3]
    if not _is_pointwise_conv(bindings[step].value, pool.var, channels):
        return "the pool's reader is not a 1x1 conv2d of constant NHWC/OHWI weights, unstrided and unpadded"
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype} (the kernel takes {', '.join(DTYPES)})"
    if channels % CHANNEL_MULTIPLE or channels > MAX_CHANNELS:
        return f"C={channels}: the kernel takes a multiple of {CHANNEL_MULTIPLE} up to {MAX_CHANNELS} channels"
    squeeze = bindings[step].value.args[1].type.shape[0]
    if squeeze > MAX_SQUEEZE:
        return f"a squeeze of {squeeze} channels (at most {MAX_SQUEEZE})"
    if x.shape[0] * channels * squeeze > MAX_BATCH_MULTIPLY_ADDS:
        return (f"N*C*S = {x.shape[0]}*{channels}*{squeeze} multiply-adds a product (at most "
                f"{MAX_BATCH_MULTIPLY_ADDS}): every sample would read all weights; the unfused GEMMs read them once")
    members = [pool_index, step]

    def follow(accept) -> bool:
        """Appends the one reader of the last member if `accept(value, var)` says so."""
        reader = _only_reader(readers, members[-1])
        if reader is None or not accept(bindings[reader].value, bindings[members[-1]].var):
            return False
        members.append(reader)
        return True

    follow(lambda value, var: _bias_of(value, var, squeeze))
    follow(lambda value, var: any(_is_op(value, op) for op in SQUEEZE_ACTIVATIONS))
    if not follow(lambda value, var: _is_pointwise_conv(value, var, squeeze)):
        return (f"%{bindings[members[-1]].var.name_hint} is not read by one 1x1 conv2d back to {channels} "
                f"channels alone")
    if bindings[members[-1]].value.args[1].type.shape[0] != channels:
        return f"the excitation conv has {bindings[members[-1]].value.args[1].type.shape[0]} channels, not {channels}"
    follow(lambda value, var: _bias_of(value, var, channels))
    follow(lambda value, var: any(_is_op(value, op) for op in GATES))
    follow(lambda value, var: _is_op(value, "multiply") and len(value.args) == 2 and var in value.args
           and pool.value.args[0] in value.args and value.type.shape == x.shape)  # the scale by the gate
    values = [bindings[m].value for m in members]
    if any(v.type.dtype != x.dtype or any(a.type.dtype != x.dtype for a in v.args) for v in values):
        return f"not every op and constant of the block is {x.dtype}"
    return members


# ---------------------------------------------------------------- codegen


def emit_squeeze_excitation(symbol: str, func: Function, target_kind: str) -> ShimCalls:
    """The one byoc_shim_squeeze_excitation call of a builtin.squeeze_excitation function."""
    position = {param: f"args[{index}]" for index, param in enumerate(func.params)}
    convs = [b for b in func.bindings if _is_op(b.value, "conv2d")]
    pools = [b for b in func.bindings if _is_op(b.value, "global_avg_pool2d")]
    if len(convs) != 2 or len(pools) != 1:
        raise BuildError(f"builtin codegen: {symbol}: a squeeze_excitation function holds a pool and two convs")
    x = pools[0].value.args[0]
    batch, height, width, channels = x.type.shape
    squeeze = convs[0].value.args[1].type.shape[0]
    biases, activations = ["nullptr", "nullptr"], [("BYOC_ACTIVATION_IDENTITY", 0.0, 0.0)] * 2
    scale = 0
    stage = 0  # 0: after the squeeze conv, 1: after the excitation conv
    for binding in func.bindings:
        value = binding.value
        if binding is convs[1]:
            stage = 1
        elif _is_op(value, "multiply"):
            scale = 1
        elif _is_op(value, "add"):
            bias = [a for a in value.args if a in position]
            biases[stage] = position[bias[0]]
        elif isinstance(value, Call) and value.op.name in {**SQUEEZE_ACTIVATIONS, **GATES}:
            kind = {**SQUEEZE_ACTIVATIONS, **GATES}[value.op.name]
            activations[stage] = (kind, float(value.attrs.get("alpha", 0.0)), float(value.attrs.get("beta", 0.0)))
    if x not in position or any(conv.value.args[1] not in position for conv in convs):
        raise BuildError(f"builtin codegen: {symbol}: the input and the weights must be parameters")
    calls = ShimCalls(symbol, target_kind)
    (activation, alpha1, beta1), (gate, alpha2, beta2) = activations
    calls.call("byoc_shim_squeeze_excitation", position[x], position[convs[0].value.args[1]], biases[0],
               position[convs[1].value.args[1]], biases[1], "results[0]", SHIM_DTYPES[x.type.dtype], batch,
               height * width, channels, squeeze, activation, float_literal(alpha1, "float"),
               float_literal(beta1, "float"), gate, float_literal(alpha2, "float"), float_literal(beta2, "float"),
               scale)
    return calls

