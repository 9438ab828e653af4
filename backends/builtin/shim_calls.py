"""The bodies of the built-in backend's one-op functions: calls to the shim
(backends/builtin/shim/byoc_shim.h), every size computed here, at build time, and written
as a literal. OP_EMITTERS maps each op to the emitter that writes its calls; a chain of
layout ops (PartitionBuiltin's builtin.layout) is one strided copy (emit_layout_chain).
codegen.py renders what they return into the backend's source file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from ...errors import BuildError, UnsupportedOpError
from ...ir.expr import Call, Function
from ...ir.op import Op
from ...ir.types import TensorType
from .dtypes import SHIM_DTYPES, element_size, float_literal, int_literal
from .elementwise import _dense_strides, broadcast_strides, merge_dims

# Workspace regions start on this boundary (what cudaMalloc gives, enough for any vector load).
WORKSPACE_ALIGNMENT = 256
MAX_DIMS = 8  # BYOC_SHIM_MAX_DIMS
# Scratch cuBLASLt may use for a GEMM on cuda (its recommendation for Hopper); 0 on cpu.
MATMUL_WORKSPACE_BYTES = {"cpu": 0, "cuda": 32 * 1024 * 1024}


# ---------------------------------------------------------------- shim-call functions


@dataclass
class ShimCalls:
    """What one function's body does: constant int64 arrays, then steps in order."""
    symbol: str
    target_kind: str
    arrays: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    workspace_bytes: int = 0

    def array(self, values) -> str:
        """The name of a static const int64_t array holding `values` (at least one)."""
        values = list(values) or [0]  # C++ has no empty arrays; the callee reads none of it
        name = f"array{len(self.arrays)}"
        self.arrays.append({"name": name, "elements": [int_literal(v) for v in values]})
        return name

    def pointers(self, expressions) -> str:
        """The name of a local array of the data pointers `expressions` (a concat's parts)."""
        name = f"pointers{sum(step['kind'] == 'pointers' for step in self.steps)}"
        self.steps.append({"kind": "pointers", "name": name, "elements": [str(e) for e in expressions]})
        return name

    def scratch(self, nbytes: int) -> str:
        """A pointer expression to a fresh, aligned region of the workspace."""
        offset = self.workspace_bytes
        self.workspace_bytes += -(-max(nbytes, 1) // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT
        return f"(static_cast<char*>(workspace) + {offset})"

    def call(self, function: str, *arguments) -> None:
        self.steps.append({"kind": "call", "expression": f"{function}({', '.join(str(a) for a in arguments)}, stream)"})

    def require_workspace(self, expression: str, message: str) -> None:
        self.steps.append({"kind": "require_workspace", "expression": expression, "message": message})

    def as_dict(self) -> dict:
        return {"symbol": self.symbol, "arrays": self.arrays, "steps": self.steps,
                "workspace_bytes": self.workspace_bytes}


@dataclass(frozen=True)
class OpContext:
    """What an emitter gets: the call, its input pointer expressions, the output pointer."""
    call: Call
    inputs: list       # C pointer expressions, one per call argument
    output: str        # C pointer expression of the result
    target_kind: str

    def arg_type(self, index: int) -> TensorType:
        return self.call.args[index].type

    @property
    def out_type(self) -> TensorType:
        return self.call.type

    @property
    def attrs(self) -> dict:
        return self.call.attrs


def emit_layout_chain(symbol: str, func: Function, target_kind: str) -> ShimCalls:
    """A chain of layout ops (PartitionBuiltin's builtin.layout) as one strided copy."""
    from .views import View, compose
    if len(func.params) != 1:
        raise BuildError(f"builtin codegen: {symbol}: a layout chain reads one tensor, not {len(func.params)}")
    view = View.dense(func.params[0].type.shape)
    current = func.params[0]
    for binding in func.bindings:
        value = binding.value
        if not (isinstance(value, Call) and isinstance(value.op, Op) and list(value.args) == [current]):
            raise BuildError(f"builtin codegen: {symbol}: a layout chain is one op after another")
        view = compose(view, value)
        if view is None:
            raise BuildError(f"builtin codegen: {symbol}: {value.op.name} is not a view of the chain's input")
        current = binding.var
    calls = ShimCalls(symbol, target_kind)
    out = func.ret_type
    if out.size > 0:
        _copy_strided(calls, "args[0]", "results[0]", out.dtype, view.shape, view.strides, in_offset=view.offset)
    return calls


def emit_concat_views(symbol: str, func: Function, target_kind: str) -> ShimCalls:
    """A concat whose parts are layout chains of its parameters (PartitionBuiltin's
    builtin.concat_views): one strided copy of each part's view into its place."""
    from .views import View, chain_views
    *chain, last = func.bindings
    concat = last.value
    if not (isinstance(concat, Call) and isinstance(concat.op, Op) and concat.op.name == "concat") or \
            func.result is not last.var:
        raise BuildError(f"builtin codegen: {symbol}: a concat_views function ends with its concat")
    position_of = {param: index for index, param in enumerate(func.params)}
    views = chain_views(chain, lambda var: View.dense(var.type.shape) if var in position_of else None)
    if views is None:
        raise BuildError(f"builtin codegen: {symbol}: a concat part is not a strided view of a parameter")
    calls = ShimCalls(symbol, target_kind)
    out = func.ret_type
    axis = concat.attrs["axis"] % out.ndim
    out_strides = _dense_strides(out.shape)
    position = 0
    for part in concat.args:
        source, view = views.get(part, (part, View.dense(part.type.shape)))
        if source not in position_of:
            raise BuildError(f"builtin codegen: {symbol}: a concat part must be a view of a parameter")
        destination = _offset("results[0]", position * out_strides[axis] * element_size(out.dtype), const=False)
        _copy_strided(calls, f"args[{position_of[source]}]", destination, out.dtype, view.shape, view.strides,
                      in_offset=view.offset, out_strides=out_strides)
        position += part.type.shape[axis]
    return calls


def emit_shim_calls(symbol: str, func: Function, target_kind: str) -> ShimCalls:
    """The shim calls of a one-op builtin function."""
    if len(func.bindings) != 1 or not isinstance(func.bindings[0].value, Call) \
            or not isinstance(func.bindings[0].value.op, Op) or func.result is not func.bindings[0].var:
        raise BuildError(
            f"builtin codegen: {symbol} must be one op call returning its result, or a group of "
            f"elementwise ops; got {len(func.bindings)} bindings")
    call = func.bindings[0].value
    param_index = {param: index for index, param in enumerate(func.params)}
    inputs = []
    for arg in call.args:
        if arg not in param_index:
            raise BuildError(
                f"builtin codegen: {symbol}: every argument of {call.op.name} must be a parameter "
                f"(constants are passed in by the caller)")
        inputs.append(f"args[{param_index[arg]}]")
    emitter = OP_EMITTERS.get(call.op.name)
    if emitter is None:
        raise UnsupportedOpError(f"builtin codegen: {symbol}: op {call.op.name!r} has no shim emitter")
    calls = ShimCalls(symbol, target_kind)
    if call.type.size > 0:  # an empty output needs no work
        emitter(calls, OpContext(call, inputs, "results[0]", target_kind))
    return calls


# ---------------------------------------------------------------- shape helpers


def _product(values) -> int:
    return math.prod(values)


def _outer_n_inner(shape, axis: int) -> tuple[int, int, int]:
    """`shape` viewed as (outer, n, inner) around `axis`."""
    return _product(shape[:axis]), shape[axis], _product(shape[axis + 1:])


def _offset(pointer: str, nbytes: int, const: bool) -> str:
    if nbytes == 0:
        return pointer
    char = "const char" if const else "char"
    return f"(static_cast<{char}*>({pointer}) + {nbytes})"


def _copy_strided(calls: ShimCalls, source: str, destination: str, dtype: str, shape,
                  in_strides, in_offset: int = 0, out_strides=None) -> None:
    """One byoc_shim_copy_strided, after merging the dims both sides walk contiguously."""
    if _product(shape) == 0:
        return
    out_strides = list(out_strides) if out_strides is not None else _dense_strides(shape)
    merged_shape, (merged_in, merged_out) = merge_dims(shape, [list(in_strides), out_strides])
    if not merged_shape:  # one element
        merged_shape, merged_in, merged_out = [1], [1], [1]
    if len(merged_shape) > MAX_DIMS:
        raise UnsupportedOpError(
            f"builtin codegen: {calls.symbol}: a copy over {len(merged_shape)} dims that cannot be "
            f"merged; the shim takes at most {MAX_DIMS}")
    dense_out = merged_out == _dense_strides(merged_shape)
    calls.call("byoc_shim_copy_strided", source, destination, element_size(dtype), len(merged_shape),
               calls.array(merged_shape), int_literal(in_offset), calls.array(merged_in),
               "nullptr" if dense_out else calls.array(merged_out))


def _copy_contiguous(calls: ShimCalls, source: str, destination: str, type_: TensorType) -> None:
    _copy_strided(calls, source, destination, type_.dtype, [type_.size], [1])


def _broadcast_into_scratch(calls: ShimCalls, source: str, type_: TensorType, shape) -> str:
    """A workspace copy of `source` broadcast to `shape`; returns its pointer expression."""
    scratch = calls.scratch(_product(shape) * element_size(type_.dtype))
    _copy_strided(calls, source, scratch, type_.dtype, shape, broadcast_strides(type_.shape, shape))
    return scratch


# ---------------------------------------------------------------- emitters: layout


def _emit_reshape(calls: ShimCalls, ctx: OpContext) -> None:
    _copy_contiguous(calls, ctx.inputs[0], ctx.output, ctx.out_type)


def _emit_layout_view(calls: ShimCalls, ctx: OpContext) -> None:
    """transpose, strided_slice: one strided copy of the view the op takes of its input
    (views.compose: the same rules as a layout chain)."""
    from .views import View, compose
    view = compose(View.dense(ctx.arg_type(0).shape), ctx.call)
    _copy_strided(calls, ctx.inputs[0], ctx.output, ctx.out_type.dtype, view.shape, view.strides,
                  in_offset=view.offset)


def _emit_broadcast_to(calls: ShimCalls, ctx: OpContext) -> None:
    x = ctx.arg_type(0)
    shape = ctx.out_type.shape
    _copy_strided(calls, ctx.inputs[0], ctx.output, x.dtype, shape, broadcast_strides(x.shape, shape))


def _emit_concat(calls: ShimCalls, ctx: OpContext) -> None:
    """One byoc_shim_concat call for all the parts: each is rows of its extent along the
    axis times the dims after it, the rows being the dims before the axis."""
    out = ctx.out_type
    axis = ctx.attrs["axis"] % out.ndim
    rows = math.prod(out.shape[:axis])
    row_bytes = [math.prod(ctx.arg_type(index).shape[axis:]) * element_size(out.dtype)
                 for index in range(len(ctx.inputs))]
    calls.call("byoc_shim_concat", calls.pointers(ctx.inputs), len(ctx.inputs), calls.array(row_bytes), rows,
               ctx.output)


def _emit_tile(calls: ShimCalls, ctx: OpContext) -> None:
    x = ctx.arg_type(0)
    if x.ndim == 0:
        _copy_contiguous(calls, ctx.inputs[0], ctx.output, x)
        return
    calls.call("byoc_shim_tile", ctx.inputs[0], ctx.output, element_size(x.dtype), x.ndim,
               calls.array(x.shape), calls.array(ctx.attrs["repeats"]))


def _emit_gather(calls: ShimCalls, ctx: OpContext) -> None:
    data, indices = ctx.arg_type(0), ctx.arg_type(1)
    axis = ctx.attrs["axis"] % data.ndim
    outer, axis_len, inner = _outer_n_inner(data.shape, axis)
    calls.call("byoc_shim_gather", ctx.inputs[0], ctx.inputs[1], ctx.output, element_size(data.dtype),
               SHIM_DTYPES[indices.dtype], outer, axis_len, inner, indices.size)


def _emit_gather_elements(calls: ShimCalls, ctx: OpContext) -> None:
    data, indices = ctx.arg_type(0), ctx.arg_type(1)
    axis = ctx.attrs["axis"] % data.ndim
    calls.call("byoc_shim_gather_elements", ctx.inputs[0], ctx.inputs[1], ctx.output, element_size(data.dtype),
               SHIM_DTYPES[indices.dtype], data.ndim, calls.array(data.shape), calls.array(indices.shape), axis)


PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2}


def _emit_pad(calls: ShimCalls, ctx: OpContext) -> None:
    x = ctx.arg_type(0)
    if x.ndim == 0:
        _copy_contiguous(calls, ctx.inputs[0], ctx.output, x)
        return
    pads = ctx.attrs["pads"]
    calls.call("byoc_shim_pad", ctx.inputs[0], ctx.output, SHIM_DTYPES[x.dtype], x.ndim, calls.array(x.shape),
               calls.array(pads[:x.ndim]), calls.array(pads[x.ndim:]), PAD_MODES[ctx.attrs["mode"]],
               float_literal(ctx.attrs["value"]))


def _emit_trilu(calls: ShimCalls, ctx: OpContext) -> None:
    x = ctx.arg_type(0)
    calls.call("byoc_shim_trilu", ctx.inputs[0], ctx.output, element_size(x.dtype), _product(x.shape[:-2]),
               x.shape[-2], x.shape[-1], int(ctx.attrs["upper"]), int_literal(ctx.attrs["k"]))


def _emit_cumsum(calls: ShimCalls, ctx: OpContext) -> None:
    x = ctx.arg_type(0)
    outer, n, inner = _outer_n_inner(x.shape, ctx.attrs["axis"] % x.ndim)
    calls.call("byoc_shim_cumsum", ctx.inputs[0], ctx.output, SHIM_DTYPES[x.dtype], outer, n, inner,
               int(ctx.attrs["exclusive"]), int(ctx.attrs["reverse"]))


# ---------------------------------------------------------------- emitters: reductions

REDUCE_KINDS = {"sum": 0, "mean": 1, "max": 2, "min": 3, "prod": 4}


def _reduce_groups(shape, axes) -> list[list]:
    """`shape` as alternating groups [size, reduced]: size-1 dims dropped (they change no
    layout), neighbours of the same kind merged."""
    groups: list[list] = []
    for dim, size in enumerate(shape):
        if size == 1:
            continue
        reduced = dim in axes
        if groups and groups[-1][1] == reduced:
            groups[-1][0] *= size
        else:
            groups.append([size, reduced])
    return groups


def _chaining_is_exact(kind: str, dtype: str) -> bool:
    """Whether reducing one group of axes after another gives the one-pass result: always
    for max/min; for sum/prod/mean unless intermediates would round to a 16-bit float;
    never for an integer mean (each step would truncate)."""
    if kind in ("max", "min"):
        return True
    if dtype in ("float16", "bfloat16"):
        return False
    return not (kind == "mean" and dtype not in ("float32", "float64"))


def _emit_reduce_kind(calls: ShimCalls, ctx: OpContext, kind: str, shape, axes) -> None:
    x = ctx.arg_type(0)
    dtype = x.dtype
    groups = _reduce_groups(shape, axes)
    reduced = [index for index, (_, is_reduced) in enumerate(groups) if is_reduced]
    if not reduced:  # only size-1 axes are reduced: every value is its own result
        _copy_contiguous(calls, ctx.inputs[0], ctx.output, ctx.out_type)
        return
    sizes = [size for size, _ in groups]
    if len(reduced) == 1:
        index = reduced[0]
        calls.call("byoc_shim_reduce", ctx.inputs[0], ctx.output, SHIM_DTYPES[dtype], REDUCE_KINDS[kind],
                   *_outer_n_inner(sizes, index))
        return
    if not _chaining_is_exact(kind, dtype):
        # Gather the reduced axes to the end (one copy into the workspace), then reduce once.
        kept = [i for i, (_, is_reduced) in enumerate(groups) if not is_reduced]
        order = kept + reduced
        dense = _dense_strides(sizes)
        permuted = [sizes[i] for i in order]
        scratch = calls.scratch(_product(sizes) * element_size(dtype))
        _copy_strided(calls, ctx.inputs[0], scratch, dtype, permuted, [dense[i] for i in order])
        calls.call("byoc_shim_reduce", scratch, ctx.output, SHIM_DTYPES[dtype], REDUCE_KINDS[kind],
                   _product(sizes[i] for i in kept), _product(sizes[i] for i in reduced), 1)
        return
    # Reduce one group at a time, innermost first, through two workspace buffers.
    buffers: list[str] = []
    source = ctx.inputs[0]
    while True:
        index = max(i for i, (_, is_reduced) in enumerate(groups) if is_reduced)
        sizes = [size for size, _ in groups]
        outer, n, inner = _outer_n_inner(sizes, index)
        remaining = [g for i, g in enumerate(groups) if i != index]
        last = sum(1 for _, is_reduced in remaining if is_reduced) == 0
        if last:
            destination = ctx.output
        else:
            if len(buffers) < 2:
                buffers.append(calls.scratch(outer * inner * element_size(dtype)))
            destination = buffers[0] if source != buffers[0] else buffers[1]
        calls.call("byoc_shim_reduce", source, destination, SHIM_DTYPES[dtype], REDUCE_KINDS[kind], outer, n, inner)
        if last:
            return
        groups = _reduce_groups_merged(remaining)
        source = destination


def _reduce_groups_merged(groups) -> list[list]:
    merged: list[list] = []
    for size, is_reduced in groups:
        if merged and merged[-1][1] == is_reduced:
            merged[-1][0] *= size
        else:
            merged.append([size, is_reduced])
    return merged


def _emit_reduce(calls: ShimCalls, ctx: OpContext) -> None:
    from ...ops.reduction import reduced_axes
    x = ctx.arg_type(0)
    axes = reduced_axes(ctx.call.op.name, ctx.attrs["axes"], x.ndim)
    _emit_reduce_kind(calls, ctx, ctx.call.op.name, x.shape, axes)


def _emit_arg_reduce(calls: ShimCalls, ctx: OpContext) -> None:
    x = ctx.arg_type(0)
    outer, n, inner = _outer_n_inner(x.shape, ctx.attrs["axis"] % x.ndim)
    kind = 0 if ctx.call.op.name == "argmax" else 1
    calls.call("byoc_shim_arg_reduce", ctx.inputs[0], f"static_cast<int64_t*>({ctx.output})", SHIM_DTYPES[x.dtype],
               kind, outer, n, inner, int(ctx.attrs["select_last_index"]))


def _emit_global_pool(calls: ShimCalls, ctx: OpContext) -> None:
    from ...ops.nn import DATA_LAYOUTS
    x = ctx.arg_type(0)
    axes = DATA_LAYOUTS[ctx.attrs["layout"]].spatial_axes
    kind = "mean" if ctx.call.op.name == "global_avg_pool2d" else "max"
    _emit_reduce_kind(calls, ctx, kind, x.shape, axes)


# ---------------------------------------------------------------- emitters: normalization


def _emit_softmax(calls: ShimCalls, ctx: OpContext) -> None:
    x = ctx.arg_type(0)
    outer, n, inner = _outer_n_inner(x.shape, ctx.attrs["axis"] % x.ndim)
    calls.call("byoc_shim_softmax", ctx.inputs[0], ctx.output, SHIM_DTYPES[x.dtype], outer, n, inner,
               int(ctx.call.op.name == "log_softmax"))


def _affine_parameter(calls: ShimCalls, ctx: OpContext, index: int, normalized_shape) -> str:
    """Pointer to parameter `index` with the normalized dims' full size (expanded into
    the workspace when it broadcasts)."""
    param = ctx.arg_type(index)
    if param.size == _product(normalized_shape):
        return ctx.inputs[index]
    return _broadcast_into_scratch(calls, ctx.inputs[index], param, normalized_shape)


def _emit_layer_norm(calls: ShimCalls, ctx: OpContext) -> None:
    x = ctx.arg_type(0)
    axis = ctx.attrs["axis"] % x.ndim
    normalized = x.shape[axis:]
    gamma = _affine_parameter(calls, ctx, 1, normalized)
    epsilon = float_literal(ctx.attrs["epsilon"], "float")
    if ctx.call.op.name == "rms_norm":
        calls.call("byoc_shim_rms_norm", ctx.inputs[0], gamma, ctx.output, SHIM_DTYPES[x.dtype],
                   _product(x.shape[:axis]), _product(normalized), epsilon)
        return
    beta = _affine_parameter(calls, ctx, 2, normalized)
    calls.call("byoc_shim_layer_norm", ctx.inputs[0], gamma, beta, ctx.output, SHIM_DTYPES[x.dtype],
               _product(x.shape[:axis]), _product(normalized), epsilon)


def _emit_batch_norm(calls: ShimCalls, ctx: OpContext) -> None:
    x = ctx.arg_type(0)
    outer, channels, inner = _outer_n_inner(x.shape, ctx.attrs["axis"] % x.ndim)
    calls.call("byoc_shim_batch_norm", *ctx.inputs, ctx.output, SHIM_DTYPES[x.dtype], outer, channels, inner,
               float_literal(ctx.attrs["epsilon"], "float"))


# ---------------------------------------------------------------- emitters: linear algebra


def _emit_matmul(calls: ShimCalls, ctx: OpContext) -> None:
    a, b = ctx.arg_type(0), ctx.arg_type(1)
    # numpy.matmul: a 1-D a is a row, a 1-D b a column (the result drops that dim, which
    # does not change its layout).
    a_shape = (1,) + a.shape if a.ndim == 1 else a.shape
    b_shape = b.shape + (1,) if b.ndim == 1 else b.shape
    m, k = a_shape[-2:]
    n = b_shape[-1]
    from ...ops._common import broadcast_shapes
    batch_shape = broadcast_shapes(a_shape[:-2], b_shape[:-2])
    rank = len(batch_shape)
    a_batch = (1,) * (rank - len(a_shape) + 2) + tuple(a_shape[:-2])
    b_batch = (1,) * (rank - len(b_shape) + 2) + tuple(b_shape[:-2])
    batch = _product(batch_shape)
    a_pointer, b_pointer = ctx.inputs
    if _product(b_batch) == 1:
        # One b for every batch: the batch of a is just more rows of one GEMM.
        m, batch, a_stride, b_stride = m * batch, 1, 0, 0
    elif _product(a_batch) == 1:
        a_stride, b_stride = 0, k * n
    else:
        # Batch dims that broadcast unevenly: materialize the broadcast operands.
        if tuple(a_batch) != tuple(batch_shape):
            a_pointer = _broadcast_into_scratch(calls, a_pointer, TensorType(a_batch + (m, k), a.dtype),
                                                tuple(batch_shape) + (m, k))
        if tuple(b_batch) != tuple(batch_shape):
            b_pointer = _broadcast_into_scratch(calls, b_pointer, TensorType(b_batch + (k, n), b.dtype),
                                                tuple(batch_shape) + (k, n))
        a_stride, b_stride = m * k, k * n
    gemm_workspace_bytes = MATMUL_WORKSPACE_BYTES[ctx.target_kind]
    gemm_workspace = calls.scratch(gemm_workspace_bytes) if gemm_workspace_bytes else "nullptr"
    algo = -1  # the first heuristic; tuning at build time picks another index
    calls.call("byoc_shim_matmul", a_pointer, b_pointer, ctx.output, SHIM_DTYPES[a.dtype], batch, m, n, k,
               0, 0, a_stride, b_stride, m * n, algo, gemm_workspace, f"{gemm_workspace_bytes}ull")


def conv2d_workspace_bytes(target_kind: str, dtype: str, layout: int, batch: int, in_channels: int,
                           in_h: int, in_w: int, out_channels: int, kernel_h: int, kernel_w: int,
                           out_h: int, out_w: int, groups: int) -> int:
    """Mirror of byoc_shim_conv2d_workspace, per target: the host must know every
    symbol's workspace at build time, before any shim code runs. The generated code also
    asks the shim itself at run time and fails with a clear message if this mirror falls
    behind (tests/test_shim_cuda.py compares the two on a GPU).

    cpu: the GEMM core packs im2col panels on the stack, so conv2d needs no workspace.
    cuda (float dtypes, one group): a 1x1 convolution that keeps the spatial size is one
    cuBLASLt GEMM and needs only its 4 MiB scratch; any other materializes im2col columns in
    chunks of at most 64 MiB (NHWC: output pixels, NCHW: whole images) plus that scratch.
    Integer and grouped convolutions run a direct kernel and need nothing."""
    if target_kind != "cuda" or groups != 1 or dtype not in ("float32", "float16", "bfloat16", "float64"):
        return 0
    if min(batch, in_channels, out_channels, out_h, out_w, kernel_h, kernel_w) <= 0:
        return 0
    gemm_bytes, columns_limit = 4 << 20, 64 << 20
    if kernel_h == kernel_w == 1 and (out_h, out_w) == (in_h, in_w):
        return gemm_bytes
    elem = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}[dtype]
    depth, pixels = in_channels * kernel_h * kernel_w, out_h * out_w
    if layout == 1:  # NHWC: chunks of output pixels
        chunk = min(max(columns_limit // (depth * elem), 1), batch * pixels)
        columns = chunk * depth * elem
    else:  # NCHW: chunks of whole images
        chunk = min(max(columns_limit // (depth * pixels * elem), 1), batch)
        columns = chunk * depth * pixels * elem
    return -(-columns // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT + gemm_bytes


def _emit_conv2d(calls: ShimCalls, ctx: OpContext) -> None:
    data, weight = ctx.arg_type(0), ctx.arg_type(1)
    out = ctx.out_type
    nhwc = ctx.attrs["data_layout"] == "NHWC"
    if nhwc:
        batch, in_h, in_w, in_channels = data.shape
        out_channels, kernel_h, kernel_w, _ = weight.shape
        _, out_h, out_w, _ = out.shape
    else:
        batch, in_channels, in_h, in_w = data.shape
        out_channels, _, kernel_h, kernel_w = weight.shape
        _, _, out_h, out_w = out.shape
    layout = int(nhwc)
    sizes = [batch, in_channels, in_h, in_w, out_channels, kernel_h, kernel_w, out_h, out_w]
    groups = ctx.attrs["groups"]
    needed = conv2d_workspace_bytes(ctx.target_kind, data.dtype, layout, *sizes, groups)
    workspace = calls.scratch(needed) if needed else "nullptr"
    size_arguments = ", ".join(str(v) for v in [SHIM_DTYPES[data.dtype], layout, *sizes, groups])
    calls.require_workspace(f"byoc_shim_conv2d_workspace({size_arguments})",
                            "byoc_shim_conv2d needs more workspace than was planned at build time")
    strides, pads, dilations = ctx.attrs["strides"], ctx.attrs["pads"], ctx.attrs["dilations"]
    calls.call("byoc_shim_conv2d", ctx.inputs[0], ctx.inputs[1], "nullptr", ctx.output, SHIM_DTYPES[data.dtype],
               layout, *sizes[:7], out_h, out_w, strides[0], strides[1], pads[0], pads[1],
               dilations[0], dilations[1], groups, workspace, f"{needed}ull")


def _emit_pool2d(calls: ShimCalls, ctx: OpContext) -> None:
    x, out = ctx.arg_type(0), ctx.out_type
    nhwc = ctx.attrs["layout"] == "NHWC"
    if nhwc:
        batch, in_h, in_w, channels = x.shape
        _, out_h, out_w, _ = out.shape
    else:
        batch, channels, in_h, in_w = x.shape
        _, _, out_h, out_w = out.shape
    is_average = ctx.call.op.name == "avg_pool2d"
    kernel, strides, pads, dilations = (ctx.attrs[k] for k in ("kernel", "strides", "pads", "dilations"))
    # The bottom/right pads let the shim count explicit padding (count_include_pad) but
    # never the overhang of a ceil_mode window, as ONNX and PyTorch do.
    calls.call("byoc_shim_pool2d", ctx.inputs[0], ctx.output, SHIM_DTYPES[x.dtype], int(is_average), int(nhwc),
               batch, channels, in_h, in_w, out_h, out_w, kernel[0], kernel[1], strides[0], strides[1],
               pads[0], pads[1], pads[2], pads[3], dilations[0], dilations[1],
               int(is_average and ctx.attrs["count_include_pad"]))


# op name -> emitter(calls, context): appends the shim calls that compute the op.
OP_EMITTERS: dict[str, Callable[[ShimCalls, OpContext], None]] = {
    "reshape": _emit_reshape,
    "squeeze": _emit_reshape,
    "expand_dims": _emit_reshape,
    "transpose": _emit_layout_view,
    "broadcast_to": _emit_broadcast_to,
    "strided_slice": _emit_layout_view,
    "concat": _emit_concat,
    "tile": _emit_tile,
    "gather": _emit_gather,
    "gather_elements": _emit_gather_elements,
    "pad": _emit_pad,
    "trilu": _emit_trilu,
    "cumsum": _emit_cumsum,
    "sum": _emit_reduce,
    "mean": _emit_reduce,
    "max": _emit_reduce,
    "min": _emit_reduce,
    "prod": _emit_reduce,
    "argmax": _emit_arg_reduce,
    "argmin": _emit_arg_reduce,
    "softmax": _emit_softmax,
    "log_softmax": _emit_softmax,
    "layer_norm": _emit_layer_norm,
    "rms_norm": _emit_layer_norm,
    "batch_norm": _emit_batch_norm,
    "matmul": _emit_matmul,
    "conv2d": _emit_conv2d,
    "max_pool2d": _emit_pool2d,
    "avg_pool2d": _emit_pool2d,
    "global_avg_pool2d": _emit_global_pool,
    "global_max_pool2d": _emit_global_pool,
}
