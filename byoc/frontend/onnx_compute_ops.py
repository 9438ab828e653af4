"""Converters of ONNX's compute ops (elementwise math, reductions, normalizations, MatMul and
Gemm, Conv and the pools) into IR calls; each registers itself with `onnx.converter`."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelError
from ..ir.expr import Constant
from ..ir.types import NUMPY_DTYPES, is_float
from .onnx import SUPPORTED_OPS, check_folded_size, dtype_of_elem_type, converter


# ---------------------------------------------------------------------------------
# converters
# ---------------------------------------------------------------------------------

def _simple(op_name: str, **fixed):
    def convert(ctx, node, inputs, attrs):
        return [ctx.call(op_name, *inputs, name=node.output[0], **fixed)]
    return convert


_UNARY = {
    "Abs": "abs", "Neg": "negative", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
    "Reciprocal": "reciprocal", "Erf": "erf", "Tanh": "tanh", "Sigmoid": "sigmoid",
    "Relu": "relu", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sin": "sin",
    "Cos": "cos", "Sign": "sign", "Softplus": "softplus", "Not": "logical_not",
    "HardSwish": "hard_swish",
}
_BINARY = {
    "Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide",
    "Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
    "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or",
    "Xor": "logical_xor", "Where": "where",
}
for _onnx_name, _op_name in {**_UNARY, **_BINARY}.items():
    SUPPORTED_OPS[_onnx_name] = _simple(_op_name)


@converter("Identity", "Dropout")
def _identity(ctx, node, inputs, attrs):
    if node.op_type == "Dropout" and len(inputs) > 2 and inputs[2] is not None:
        if ctx.known_scalar(inputs[2], "training_mode"):
            ctx.unsupported("training_mode=True (byoc compiles inference graphs)")
    outputs = [inputs[0]]
    if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1]:
        shape = ctx.shape(inputs[0])
        check_folded_size(math.prod(shape), 1, f"mask of shape {list(shape)}")
        outputs.append(np.ones(shape, dtype=bool))  # the inference mask
    return outputs


@converter("IsNaN")
def _is_nan(ctx, node, inputs, attrs):
    # NaN is the one value unequal to itself (the kernels compile without fast-math)
    return [ctx.call("not_equal", inputs[0], inputs[0], name=node.output[0])]


@converter("IsInf")
def _is_inf(ctx, node, inputs, attrs):
    x = inputs[0]
    for key in ("detect_positive", "detect_negative"):
        if attrs.get(key, 1) not in (0, 1):
            raise ModelError(f"{ctx.node_label}: {key}={attrs[key]}; expected 0 or 1")
    infinity = np.asarray(np.inf, dtype=NUMPY_DTYPES[ctx.dtype(x)])
    tests = [ctx.call("equal", x, sign * infinity) for sign, key in ((1, "detect_positive"), (-1, "detect_negative"))
             if attrs.get(key, 1)]
    if not tests:
        return [np.zeros(ctx.shape(x), dtype=bool)]
    return [tests[0] if len(tests) == 1 else ctx.call("logical_or", *tests, name=node.output[0])]


@converter("LeakyRelu")
def _leaky_relu(ctx, node, inputs, attrs):
    return [ctx.call("leaky_relu", inputs[0], alpha=attrs.get("alpha", 0.01), name=node.output[0])]


@converter("Elu")
def _elu(ctx, node, inputs, attrs):
    return [ctx.call("elu", inputs[0], alpha=attrs.get("alpha", 1.0), name=node.output[0])]


@converter("HardSigmoid")
def _hard_sigmoid(ctx, node, inputs, attrs):
    return [ctx.call("hard_sigmoid", inputs[0], alpha=attrs.get("alpha", 0.2),
                     beta=attrs.get("beta", 0.5), name=node.output[0])]


@converter("Gelu")
def _gelu(ctx, node, inputs, attrs):
    approximate = attrs.get("approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate not in ("none", "tanh"):
        ctx.unsupported(f"approximate={approximate!r} (expected 'none' or 'tanh')")
    return [ctx.call("gelu", inputs[0], approximate=approximate, name=node.output[0])]


@converter("PRelu")
def _prelu(ctx, node, inputs, attrs):
    x, slope = inputs
    negative = ctx.call("less", x, np.zeros((), dtype=NUMPY_DTYPES[ctx.dtype(x)]))
    return [ctx.call("where", negative, ctx.call("multiply", x, slope), x, name=node.output[0])]


@converter("Softsign")
def _softsign(ctx, node, inputs, attrs):
    x = inputs[0]
    one = np.ones((), dtype=NUMPY_DTYPES[ctx.dtype(x)])
    return [ctx.call("divide", x, ctx.call("add", ctx.call("abs", x), one), name=node.output[0])]


@converter("Mish")
def _mish(ctx, node, inputs, attrs):
    x = inputs[0]
    return [ctx.call("multiply", x, ctx.call("tanh", ctx.call("softplus", x)), name=node.output[0])]


@converter("Pow")
def _pow(ctx, node, inputs, attrs):
    base, exponent = inputs
    if ctx.dtype(exponent) != ctx.dtype(base):
        if is_float(ctx.dtype(exponent)) and not is_float(ctx.dtype(base)):
            # an integer base with a float exponent: computed in the exponent's type and cast
            # back, as onnxruntime does (casting 0.5 to an integer exponent would give 0)
            power = ctx.call("power", ctx.call("cast", base, dtype=ctx.dtype(exponent)), exponent)
            return [ctx.call("cast", power, dtype=ctx.dtype(base), name=node.output[0])]
        exponent = ctx.call("cast", exponent, dtype=ctx.dtype(base))
    return [ctx.call("power", base, exponent, name=node.output[0])]


@converter("Mod")
def _mod(ctx, node, inputs, attrs):
    return [ctx.call("mod", *inputs, fmod=bool(attrs.get("fmod", 0)), name=node.output[0])]


@converter("Sum", "Max", "Min", "Mean")
def _variadic(ctx, node, inputs, attrs):
    op_name = {"Sum": "add", "Mean": "add", "Max": "maximum", "Min": "minimum"}[node.op_type]
    result = inputs[0]
    for other in inputs[1:]:
        result = ctx.call(op_name, result, other)
    if node.op_type == "Mean" and len(inputs) > 1:
        count = np.asarray(len(inputs), dtype=NUMPY_DTYPES[ctx.dtype(result)])
        result = ctx.call("divide", result, count)
    if len(inputs) == 1:
        result = ctx.call("identity", result)
    return [result]


@converter("Cast")
def _cast(ctx, node, inputs, attrs):
    dtype = dtype_of_elem_type(attrs["to"], f"{ctx.node_label} target type")
    if ctx.dtype(inputs[0]) == dtype:
        return [inputs[0]]
    return [ctx.call("cast", inputs[0], dtype=dtype, name=node.output[0])]


@converter("CastLike")
def _cast_like(ctx, node, inputs, attrs):
    dtype = ctx.dtype(inputs[1])
    if ctx.dtype(inputs[0]) == dtype:
        return [inputs[0]]
    return [ctx.call("cast", inputs[0], dtype=dtype, name=node.output[0])]


@converter("Clip")
def _clip(ctx, node, inputs, attrs):
    x = inputs[0]
    low = inputs[1] if len(inputs) > 1 else None
    high = inputs[2] if len(inputs) > 2 else None
    bounds = {}
    for key, bound in (("min", low), ("max", high)):
        if bound is None:
            continue
        if isinstance(bound, np.ndarray) or isinstance(bound, Constant):
            bounds[key] = float(ctx.known_scalar(bound, key))
        else:  # a bound computed at run time: clip as maximum/minimum
            x = ctx.call("maximum" if key == "min" else "minimum", x, bound)
    if not bounds:
        return [x if x is not inputs[0] else ctx.call("identity", x)]
    return [ctx.call("clip", x, name=node.output[0], **bounds)]


# ---- reductions -------------------------------------------------------------------

def _reduce_axes(ctx, node, inputs, attrs):
    """The axes of a Reduce*/ArgMax node (attribute before opset 18, input after), or
    None for 'no reduction' (noop_with_empty_axes with empty axes)."""
    if "axes" in attrs:
        axes = tuple(attrs["axes"])
    elif len(inputs) > 1 and inputs[1] is not None:
        axes = ctx.known_ints(inputs[1], "axes")
    else:
        axes = ()
    if not axes and attrs.get("noop_with_empty_axes", 0):
        return None
    return axes


_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
           "ReduceProd": "prod"}


@converter(*_REDUCE, "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")
def _reduce(ctx, node, inputs, attrs):
    x = inputs[0]
    axes = _reduce_axes(ctx, node, inputs, attrs)
    keepdims = bool(attrs.get("keepdims", 1))
    op_type = node.op_type
    if axes is None:
        if op_type in _REDUCE:
            return [ctx.call("identity", x)]
        pre = {"ReduceSumSquare": lambda v: ctx.call("multiply", v, v),
               "ReduceL1": lambda v: ctx.call("abs", v),
               "ReduceL2": lambda v: ctx.call("abs", v),
               "ReduceLogSum": lambda v: ctx.call("log", v),
               "ReduceLogSumExp": lambda v: v}[op_type]
        return [pre(x)]
    if op_type in _REDUCE:
        if 0 in ctx.shape(x) and op_type in ("ReduceMax", "ReduceMin"):
            ctx.unsupported("reducing an empty tensor with max/min")
        if ctx.dtype(x) == "bool" and op_type in ("ReduceMax", "ReduceMin"):
            # max/min of booleans are any/all: reduce as uint8 and cast back
            as_bytes = ctx.call("cast", x, dtype="uint8")
            reduced = ctx.call(_REDUCE[op_type], as_bytes, axes=axes, keepdims=keepdims)
            return [ctx.call("cast", reduced, dtype="bool", name=node.output[0])]
        if _is_global_pool(ctx, x, axes, op_type):
            # the mean (max) of an NCHW image over H and W is GlobalAveragePool (GlobalMaxPool),
            # which is how the dynamo exporter writes AdaptiveAvgPool2d(1): a pool keeps the
            # layout passes' NHWC and its input's precision (a float16 build keeps `mean` in
            # float32, a cast of the whole activation and one back for every pool)
            pooled = ctx.call("global_avg_pool2d" if op_type == "ReduceMean" else "global_max_pool2d", x,
                              name=node.output[0] if keepdims else None)
            return [pooled if keepdims else ctx.call("squeeze", pooled, axes=(2, 3), name=node.output[0])]
        return [ctx.call(_REDUCE[op_type], x, axes=axes, keepdims=keepdims, name=node.output[0])]
    if op_type == "ReduceSumSquare":
        return [ctx.call("sum", ctx.call("multiply", x, x), axes=axes, keepdims=keepdims)]
    if op_type == "ReduceL1":
        return [ctx.call("sum", ctx.call("abs", x), axes=axes, keepdims=keepdims)]
    if op_type == "ReduceL2":
        squares = ctx.call("sum", ctx.call("multiply", x, x), axes=axes, keepdims=keepdims)
        return [ctx.call("sqrt", squares)]
    if op_type == "ReduceLogSum":
        return [ctx.call("log", ctx.call("sum", x, axes=axes, keepdims=keepdims))]
    # ReduceLogSumExp, shifted by the maximum so that large inputs do not overflow
    if not ctx.dtype(x).startswith(("float", "bfloat")):
        ctx.unsupported(f"ReduceLogSumExp of {ctx.dtype(x)}")
    peak = ctx.call("max", x, axes=axes, keepdims=True)
    total = ctx.call("sum", ctx.call("exp", ctx.call("subtract", x, peak)), axes=axes, keepdims=True)
    result = ctx.call("add", ctx.call("log", total), peak)
    if not keepdims:
        result = ctx.call("squeeze", result, axes=axes or tuple(range(len(ctx.shape(x)))))
    return [result]


def _is_global_pool(ctx, x, axes, op_type) -> bool:
    """A mean or max of a floating 4-D tensor over its last two axes, none of them empty."""
    shape = ctx.shape(x)
    return (op_type in ("ReduceMean", "ReduceMax") and len(shape) == 4 and 0 not in shape
            and ctx.dtype(x).startswith(("float", "bfloat")) and all(-4 <= int(a) < 4 for a in axes)
            and sorted(int(a) % 4 for a in axes) == [2, 3])  # out-of-range axes: the reduction's error


@converter("ArgMax", "ArgMin")
def _arg_reduce(ctx, node, inputs, attrs):
    op_name = "argmax" if node.op_type == "ArgMax" else "argmin"
    return [ctx.call(op_name, inputs[0], axis=attrs.get("axis", 0), keepdims=bool(attrs.get("keepdims", 1)),
                     select_last_index=bool(attrs.get("select_last_index", 0)), name=node.output[0])]


@converter("Softmax", "LogSoftmax")
def _softmax(ctx, node, inputs, attrs):
    op_name = "softmax" if node.op_type == "Softmax" else "log_softmax"
    return [ctx.call(op_name, inputs[0], axis=attrs.get("axis", -1), name=node.output[0])]


# ---- normalization ------------------------------------------------------------------

@converter("LayerNormalization")
def _layer_norm(ctx, node, inputs, attrs):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    dtype = ctx.dtype(x)
    if bias is None:  # ONNX's bias is optional; byoc's layer_norm always adds one
        bias = np.zeros(ctx.shape(scale), dtype=NUMPY_DTYPES[ctx.dtype(scale)])
    scale, bias = (_cast_to(ctx, p, dtype) for p in (scale, bias))
    axis, epsilon = attrs.get("axis", -1), attrs.get("epsilon", 1e-5)
    result = ctx.call("layer_norm", x, scale, bias, axis=axis, epsilon=epsilon, name=node.output[0])
    if not any(node.output[1:]):
        return [result]
    # The optional Mean and InvStdDev outputs, in the stash type (float32 by default).
    stash = x if attrs.get("stash_type", 1) != 1 else _cast_to(ctx, x, "float32")
    rank = len(ctx.shape(x))
    axes = tuple(range(axis % rank, rank))
    mean = ctx.call("mean", stash, axes=axes, keepdims=True)
    centered = ctx.call("subtract", stash, mean)
    variance = ctx.call("mean", ctx.call("multiply", centered, centered), axes=axes, keepdims=True)
    eps = np.asarray(epsilon, dtype=NUMPY_DTYPES[ctx.dtype(stash)])
    inv_std_dev = ctx.call("rsqrt", ctx.call("add", variance, eps))
    return [result, mean, inv_std_dev]


@converter("RMSNormalization")
def _rms_norm(ctx, node, inputs, attrs):
    x, scale = inputs
    axis = attrs.get("axis", -1)
    return [ctx.call("rms_norm", x, _cast_to(ctx, scale, ctx.dtype(x)), axis=axis,
                     epsilon=attrs.get("epsilon", 1e-5), name=node.output[0])]


@converter("InstanceNormalization")
def _instance_norm(ctx, node, inputs, attrs):
    """Each (sample, channel)'s spatial values normalized, then the channel's scale and bias:
    a layer_norm over the flattened spatial dims of [N, C, S] (its own scale 1, bias 0)."""
    x, scale, bias = inputs
    shape = tuple(ctx.shape(x))
    if len(shape) < 3:
        raise ModelError(f"{ctx.node_label}: input of shape {list(shape)}; expected [N, C, D1, ...] (rank >= 3)")
    dtype = NUMPY_DTYPES[ctx.dtype(x)]
    batch, channels, spatial = shape[0], shape[1], math.prod(shape[2:])
    rows = ctx.call("reshape", x, shape=(batch, channels, spatial))
    normalized = ctx.call("layer_norm", rows, np.ones(spatial, dtype), np.zeros(spatial, dtype), axis=-1,
                          epsilon=attrs.get("epsilon", 1e-5))
    per_channel = [ctx.call("reshape", _cast_to(ctx, p, ctx.dtype(x)), shape=(channels, 1)) for p in (scale, bias)]
    scaled = ctx.call("add", ctx.call("multiply", normalized, per_channel[0]), per_channel[1])
    return [ctx.call("reshape", scaled, shape=shape, name=node.output[0])]


@converter("BatchNormalization")
def _batch_norm(ctx, node, inputs, attrs):
    if attrs.get("training_mode", 0):
        ctx.unsupported("training_mode=1 (byoc compiles inference graphs)")
    x = inputs[0]
    params = [_cast_to(ctx, p, ctx.dtype(x)) for p in inputs[1:5]]
    return [ctx.call("batch_norm", x, *params, epsilon=attrs.get("epsilon", 1e-5), name=node.output[0])]


def _cast_to(ctx, value, dtype):
    if ctx.dtype(value) == dtype:
        return value
    return ctx.call("cast", value, dtype=dtype)


# ---- linear algebra -----------------------------------------------------------------

@converter("MatMul")
def _matmul(ctx, node, inputs, attrs):
    return [ctx.call("matmul", *inputs, name=node.output[0])]


@converter("Gemm")
def _gemm(ctx, node, inputs, attrs):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if attrs.get("transA", 0):
        a = ctx.call("transpose", a, axes=(1, 0))
    if attrs.get("transB", 0):
        b = ctx.call("transpose", b, axes=(1, 0))
    dtype = NUMPY_DTYPES[ctx.dtype(a)]
    result = ctx.call("matmul", a, b)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        result = ctx.call("multiply", result, np.asarray(alpha, dtype=dtype))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.call("multiply", c, np.asarray(beta, dtype=dtype))
        result = ctx.call("add", result, c)
    return [result]


def _spatial_pads(ctx, attrs, in_spatial, kernel, strides, dilations):
    """Explicit (begins..., ends...) pads from `pads` or `auto_pad`."""
    rank = len(in_spatial)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("NOTSET", ""):
        pads = tuple(attrs.get("pads", (0,) * (2 * rank)))
        return pads
    if "pads" in attrs:  # the spec: "explicit padding ... cannot be used simultaneously with auto_pad"
        raise ModelError(f"{ctx.node_label}: both auto_pad={auto_pad!r} and pads are given; expected one of them")
    if auto_pad == "VALID":
        return (0,) * (2 * rank)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(in_spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            small, large = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
        return tuple(begins + ends)
    ctx.unsupported(f"auto_pad={auto_pad!r}")


def _check_window_attributes(attrs, rank: int):
    """kernel_shape, strides and dilations give one value per spatial axis, pads two."""
    for name, length in (("kernel_shape", rank), ("strides", rank), ("dilations", rank), ("pads", 2 * rank)):
        if name in attrs and len(attrs[name]) != length:
            raise ModelError(f"attribute {name!r} is {list(attrs[name])}; expected {length} values for an input "
                             f"of {rank} spatial axes")


def _to_2d_pads(pads):
    """ONNX (h_begin, w_begin, h_end, w_end) -> byoc (top, left, bottom, right): the same."""
    return tuple(pads)


@converter("Conv")
def _conv(ctx, node, inputs, attrs):
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    rank = len(ctx.shape(x)) - 2
    if rank not in (1, 2):
        ctx.unsupported(f"{rank}-D convolution (byoc has 1-D and 2-D)")
    _check_window_attributes(attrs, rank)
    kernel = tuple(attrs.get("kernel_shape", ctx.shape(weight)[2:]))
    if kernel != ctx.shape(weight)[2:]:
        raise ModelError(f"attribute 'kernel_shape' is {list(kernel)}, but input W has shape "
                         f"{list(ctx.shape(weight))}; expected its spatial dims")
    strides = tuple(attrs.get("strides", (1,) * rank))
    dilations = tuple(attrs.get("dilations", (1,) * rank))
    pads = _spatial_pads(ctx, attrs, ctx.shape(x)[2:], kernel, strides, dilations)
    if rank == 1:  # a 1-D convolution is a 2-D one over a height of 1
        x = ctx.call("expand_dims", x, axes=(2,))
        weight = ctx.call("expand_dims", weight, axes=(2,))
        strides, dilations = (1,) + strides, (1,) + dilations
        pads = (0, pads[0], 0, pads[1])
    result = ctx.call("conv2d", x, weight, strides=strides, pads=_to_2d_pads(pads), dilations=dilations,
                      groups=attrs.get("group", 1))
    if bias is not None:
        channels = ctx.shape(weight)[0]
        if ctx.shape(bias) != (channels,):
            raise ModelError(f"input B has shape {list(ctx.shape(bias))}; expected a 1-D bias of the {channels} "
                             f"output channels")
        result = ctx.call("add", result, ctx.call("reshape", bias, shape=(-1, 1, 1)))
    if rank == 1:
        result = ctx.call("squeeze", result, axes=(2,))
    return [result]


@converter("MaxPool", "AveragePool")
def _pool(ctx, node, inputs, attrs):
    x = inputs[0]
    rank = len(ctx.shape(x)) - 2
    if rank not in (1, 2):
        ctx.unsupported(f"{rank}-D pooling (byoc has 1-D and 2-D)")
    _check_window_attributes(attrs, rank)
    if attrs.get("storage_order", 0):
        ctx.unsupported("storage_order=1")
    kernel = tuple(attrs["kernel_shape"])
    strides = tuple(attrs.get("strides", (1,) * rank))
    dilations = tuple(attrs.get("dilations", (1,) * rank))
    pads = _spatial_pads(ctx, attrs, ctx.shape(x)[2:], kernel, strides, dilations)
    if rank == 1:
        x = ctx.call("expand_dims", x, axes=(2,))
        kernel, strides, dilations = (1,) + kernel, (1,) + strides, (1,) + dilations
        pads = (0, pads[0], 0, pads[1])
    common = dict(kernel=kernel, strides=strides, pads=pads, dilations=dilations,
                  ceil_mode=bool(attrs.get("ceil_mode", 0)))
    if node.op_type == "MaxPool":
        result = ctx.call("max_pool2d", x, **common)
    else:
        result = ctx.call("avg_pool2d", x, count_include_pad=bool(attrs.get("count_include_pad", 0)), **common)
    if rank == 1:
        result = ctx.call("squeeze", result, axes=(2,))
    return [result]


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx, node, inputs, attrs):
    x = inputs[0]
    if len(ctx.shape(x)) != 4:
        op_name = "mean" if node.op_type == "GlobalAveragePool" else "max"
        axes = tuple(range(2, len(ctx.shape(x))))
        return [ctx.call(op_name, x, axes=axes, keepdims=True)]
    op_name = "global_avg_pool2d" if node.op_type == "GlobalAveragePool" else "global_max_pool2d"
    return [ctx.call(op_name, x, name=node.output[0])]
