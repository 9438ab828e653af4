"""PartitionBuiltin: every op call still bound in main becomes a call to a builtin function.

Runs after the other backends have taken their patterns, so that every model builds:
whatever no other backend claimed is run by the built-in (extern-shim) backend.

Rewrites, in `main` only:

- `split` is lowered first (transform/lower_split.py: the build runs it before any backend
  partitions; here again for callers that did not), so that every builtin function
  returns ONE tensor.
- Connected elementwise/broadcast ops (op categories "elemwise" and "broadcast") are
  grouped, maximally, under one rule: every member except the group's output has all of
  its uses inside the group. A value read outside the group therefore ends a group there
  (it is never recomputed), and no group can form a cycle through an outside node (the
  only edges leaving a group leave from its output, which every member feeds). A group
  becomes one function with Composite="builtin.elementwise". A chain of layout ops that
  only the group reads, holding a slice or a transpose, expressible as one strided view
  of the chain's input (views.py), joins the group: the kernel reads the view in place
  (SwiGLU's gate and up slices of one GEMM, a transposed head split).
- A chain of layout ops (strided_slice, transpose, reshape, squeeze, expand_dims), each
  read only by the next, holding at least two that would each copy (slices and
  transposes) and expressible as one strided view of the chain's input (views.py),
  becomes one function with Composite="builtin.layout": one strided copy instead of one
  per op (attention's slice -> reshape -> transpose of Q, K and V).
- A concat whose inputs are layout chains (slices, transposes) that only it reads, each one
  strided view of its input, is one function with Composite="builtin.concat_views": each
  part is copied from its view in place (a roll, concat(x[s:], x[:s]): two copies, not
  four).
- Every other op call becomes a function of its own: Composite="builtin.reshape" for the
  pure reindexing ops (reshape, squeeze, expand_dims, and a transpose that moves only axes
  of size 1, rewritten as the reshape it is), else "builtin.<op name>". A slice or transpose
  of a one-input elementwise result (the image's cast before a CNN's move to NHWC) is
  applied first, so that the elementwise kernel reads it as a view.
  Matmul and convolutions are not fused with their elementwise consumers here (later
  backends do epilogue fusion), except:
- A depthwise conv2d (NHWC, float16/bfloat16, one channel per group, channels a multiple
  of 8: what shim/cuda/depthwise.cuh computes) whose every reader is in one elementwise
  group that reads it at the group's full output shape joins that group as one function
  with Composite="builtin.conv2d_epilogue": on CUDA the group's chain (bias, activation,
  residual, ...) runs on the conv's sums before anything is stored (MobileNet's and
  EfficientNet's conv -> bias -> activation: one pass over the activations instead of two).
  So does a grouped conv whose groups are whole 8-channel vectors in and out (RegNet's,
  ResNeXt's: shim/cuda/grouped_conv.cuh), and a dense conv of 1 to 4 input channels into a
  multiple of 8 output channels, depthwise.cuh's few_channels_kernel: the stem. Such a conv that reads a zero pad of the
  channels alone (PadConvChannels' 3 -> 4) reads the unpadded image instead, its filters
  cut to match: no pad kernel.

Each function is written inline in main and called right away:

    %f = fn (%p0: T0, %p1: T1) -> T [Compiler="builtin", Composite="builtin.elementwise"] {...}
    %y = %f(%x, meta[0])

so that OutlineCompilerFunctions can lift them to globals and share structurally equal
ones. For that, functions are canonical: parameters in order of first use by the body,
each outside value once; non-scalar Constants are parameters (the caller passes the
Constant); scalar constants (0-d or one element) stay inside elementwise bodies, where
codegen turns them into literals, and are parameters of any other function. The call's
result variable is the op's original variable, so the rest of main is untouched.

Leaves alone: bindings that are not op calls (tuples, tuple items, local functions and
calls to them, calls to globals and extern symbols), device annotations (on_device,
device_copy: PlanDevices and the host code deal with them), other globals, and attributes.
"""
from __future__ import annotations

import numpy as np

from ...ir.expr import Binding, Call, Constant, Expr, Function, Tuple, Var, vars_read
from ...ir.module import IRModule
from ...ir.op import Op
from ...ir.types import TensorType
from ...ops.layout import transpose_keeps_order
from ...transform.lower_split import lower_split_in

COMPILER = "builtin"
ELEMENTWISE_CATEGORIES = ("elemwise", "broadcast")
# Ops that only reindex one input without changing the element order: the host makes their
# result a view of their input (see RESHAPE_COMPOSITE).
RESHAPE_OPS = ("reshape", "squeeze", "expand_dims")
RESHAPE_COMPOSITE = f"{COMPILER}.reshape"  # the host runs these as views (no call, no copy)
LAYOUT_COMPOSITE = f"{COMPILER}.layout"  # a chain of layout ops run as one strided copy
CONV_EPILOGUE_COMPOSITE = f"{COMPILER}.conv2d_epilogue"  # a direct-kernel conv and its elementwise readers
CONCAT_VIEWS_COMPOSITE = f"{COMPILER}.concat_views"  # a concat reading slices/transposes of its inputs in place
# depthwise.cuh's limits: 8 channels per thread, every filter in 96 KiB of shared memory.
DEPTHWISE_VECTOR = 8
DEPTHWISE_MAX_FILTER_BYTES = 96 * 1024
# few_channels_kernel's: 1 to 4 input channels, float filters in 48 KiB of shared memory.
FEW_CHANNELS = 4
FEW_CHANNELS_MAX_FILTER_BYTES = 48 * 1024
# grouped_conv.cuh's: groups of whole vectors, at most 64 input channels a group, one
# output vector's filters in 48 KiB of shared memory.
GROUPED_MAX_GROUP_IN = 64
GROUPED_MAX_VECTOR_FILTER_BYTES = 48 * 1024


def partition_builtin(mod: IRModule) -> IRModule:
    """A new module whose main calls builtin functions for every op it still called."""
    main = _layout_before_unary(_unit_transposes_as_reshapes(lower_split_in(mod["main"])))
    readers = _readers(main.bindings, main.result)
    groups = _elementwise_groups(main.bindings, readers)
    composites = {tuple(group): f"{COMPILER}.elementwise" for group in groups.values()}
    epilogues = _conv_epilogues(main.bindings, readers, groups)
    # (in place: the bindings keep their positions, so the groups found stay right)
    main = _convs_read_unpadded(main, set(epilogues))
    for members in epilogues.values():
        composites[tuple(members)] = CONV_EPILOGUE_COMPOSITE
        for member in members:
            groups[member] = members
    for members in _concat_views(main.bindings, readers, taken=set(groups)).values():
        composites[tuple(members)] = CONCAT_VIEWS_COMPOSITE
        for member in members:
            groups[member] = members
    chains = _layout_chains(main.bindings, readers, taken=set(groups))
    composites.update({tuple(chain): LAYOUT_COMPOSITE for chain in chains.values()})
    groups.update(chains)

    bindings: list[Binding] = []
    for index, binding in enumerate(main.bindings):
        if not _is_op_call(binding.value):
            bindings.append(binding)
            continue
        group = groups.get(index)
        if group is None:
            members = [binding]
            composite = _composite_name(binding.value.op)
        elif index == group[-1]:  # the group's output: the last member in binding order
            members = [main.bindings[i] for i in group]
            composite = composites[tuple(group)]
        else:
            continue  # inner member of a group, emitted with the group's output
        bindings.extend(_outline(members, composite))

    new_main = Function(main.params, bindings, main.result, main.ret_type, main.attrs)
    result = mod.copy()
    result["main"] = new_main
    return result


def _unit_transposes_as_reshapes(main: Function) -> Function:
    """`main` with each transpose that moves only axes of size 1 (the others keep their
    order: the NHWC (N, 1, 1, C) of a global pool back to NCHW) as the reshape it is, which
    the host runs as a view instead of a copy."""
    bindings, changed = [], False
    for binding in main.bindings:
        value = binding.value
        if _is_op_call(value) and value.op.name == "transpose" and \
                transpose_keeps_order(value.args[0].type.shape, value.attrs.get("axes")):
            value = Call("reshape", [value.args[0]], {"shape": [int(d) for d in value.type.shape]})
            changed = True
        bindings.append(Binding(binding.var, value) if value is not binding.value else binding)
    return Function(main.params, bindings, main.result, main.ret_type, main.attrs) if changed else main


def _layout_before_unary(main: Function) -> Function:
    """`main` with each slice or transpose of a one-input elementwise result read by nothing
    else applied first: transpose(cast(x)) -> cast(transpose(x)). The elementwise kernel
    then reads x through the view in place (one kernel where there were a kernel and a copy:
    the image's cast to float16 and move to NHWC before a CNN's stem)."""
    from .views import COPYING_OPS
    readers = _readers(main.bindings, main.result)
    defined_at = {b.var: i for i, b in enumerate(main.bindings)}
    swapped, bindings = set(), []
    for index, binding in enumerate(main.bindings):
        value = binding.value
        is_copy = _is_op_call(value) and value.op.name in COPYING_OPS and len(value.args) == 1
        producer = defined_at.get(value.args[0]) if is_copy else None
        if producer is not None and readers[producer] == {index} and \
                _is_unary_elementwise(main.bindings[producer].value, main.bindings, defined_at):
            unary = main.bindings[producer].value
            moved = Call(value.op, [unary.args[0]], dict(value.attrs))
            view = Var(f"{binding.var.name_hint}_{unary.op.name}_input", moved.type)
            bindings += [Binding(view, moved), Binding(binding.var, Call(unary.op, [view], dict(unary.attrs)))]
            swapped.add(producer)
        else:
            bindings.append(binding)
    if not swapped:
        return main
    bindings = [b for b in bindings if defined_at.get(b.var) not in swapped]
    return Function(main.params, bindings, main.result, main.ret_type, main.attrs)


def _convs_read_unpadded(main: Function, epilogue_convs: set) -> Function:
    """`main` with each conv2d of `epilogue_convs` (binding indices of the convs that run in
    a conv2d_epilogue function, where few_channels_kernel takes any 1 to 4 channels) that
    reads a zero pad of the channel axis alone (an image of 3 channels padded to 4 by
    PadConvChannels) reading the unpadded tensor instead, its constant filters cut to the
    channels it reads: the zeros added nothing to the sums, and the pad was a kernel of its
    own. A pad read by nothing else is left for dead code elimination."""
    defined_at = {b.var: i for i, b in enumerate(main.bindings)}
    bindings, changed = [], False
    for index, binding in enumerate(main.bindings):
        value = binding.value
        if index in epilogue_convs and value.attrs.get("data_layout") == "NHWC" \
                and isinstance(value.args[1], Constant) and value.args[0] in defined_at:
            pad = main.bindings[defined_at[value.args[0]]].value
            begin = _channel_pad_begin(pad)
            if begin is not None:
                channels = pad.args[0].type.shape[3]
                filters = np.asarray(value.args[1].data)[..., begin:begin + channels]
                unpadded = Call(value.op, [pad.args[0], Constant(np.ascontiguousarray(filters),
                                                                 value.args[1].type.dtype)], dict(value.attrs))
                if is_few_channel_conv(unpadded):
                    value, changed = unpadded, True
        bindings.append(Binding(binding.var, value) if value is not binding.value else binding)
    return Function(main.params, bindings, main.result, main.ret_type, main.attrs) if changed else main


def _channel_pad_begin(value) -> int | None:
    """The channels a constant zero pad adds before the last axis of a 4-D tensor, when it
    pads that axis alone; else None."""
    if not (_is_op_call(value) and value.op.name == "pad" and value.attrs.get("mode", "constant") == "constant"
            and float(value.attrs.get("value", 0.0)) == 0.0 and len(value.args[0].type.shape) == 4):
        return None
    pads = [int(p) for p in value.attrs["pads"]]
    if any(p < 0 for p in pads) or any(pads[axis] or pads[4 + axis] for axis in range(3)):
        return None
    return pads[3]


def _is_unary_elementwise(value, bindings, defined_at) -> bool:
    """A one-input elementwise call whose input no elementwise op computes (that op's group
    would take it: then the layout op copies the group's result, as before)."""
    if not (_is_elementwise(value) and len(value.args) == 1 and isinstance(value.args[0], Var)):
        return False
    producer = defined_at.get(value.args[0])
    return producer is None or not _is_elementwise(bindings[producer].value)


def _composite_name(op: Op) -> str:
    if op.name in RESHAPE_OPS:
        return RESHAPE_COMPOSITE
    if op.category in ELEMENTWISE_CATEGORIES:
        return f"{COMPILER}.elementwise"
    return f"{COMPILER}.{op.name}"


def _is_op_call(value: Expr) -> bool:
    # Device annotations (on_device, device_copy) are left for PlanDevices and the host.
    return isinstance(value, Call) and isinstance(value.op, Op) and value.op.category != "annotation"


def _is_elementwise(value: Expr) -> bool:
    return _is_op_call(value) and value.op.category in ELEMENTWISE_CATEGORIES


def is_scalar_constant(expr: Expr) -> bool:
    """A Constant with one element (0-d or all dims 1): elementwise bodies keep it inline."""
    return isinstance(expr, Constant) and expr.type.size == 1


# ---------------------------------------------------------------- elementwise grouping


def _readers(bindings, result) -> dict[int, set]:
    """Binding index -> the indices of the bindings that read its variable (None: main's result)."""
    defined_at = {binding.var: index for index, binding in enumerate(bindings)}
    readers: dict[int, set] = {index: set() for index in range(len(bindings))}
    for index, binding in enumerate(bindings):
        for var in vars_read(binding.value):
            if var in defined_at:
                readers[defined_at[var]].add(index)
    for var in vars_read(result):
        if var in defined_at:
            readers[defined_at[var]].add(None)
    return readers


def _layout_chains(bindings, readers, taken=frozenset()) -> dict[int, list[int]]:
    """Binding index -> the binding indices of its layout chain (see the module docstring);
    `readers` as _readers gives them; bindings in `taken` (views an elementwise group reads
    in place) belong to no chain."""
    from .views import CHAIN_OPS, COPYING_OPS, View, compose

    def is_chain_op(index):
        value = bindings[index].value
        return index not in taken and _is_op_call(value) and value.op.name in CHAIN_OPS and len(value.args) == 1

    chain_of: dict[int, list[int]] = {}
    for start in range(len(bindings)):
        if start in chain_of or not is_chain_op(start):
            continue
        view = compose(View.dense(bindings[start].value.args[0].type.shape), bindings[start].value)
        if view is None:
            continue
        chain = [start]
        while len(readers[chain[-1]]) == 1:
            (reader,) = readers[chain[-1]]
            if reader is None or not is_chain_op(reader):
                break
            following = compose(view, bindings[reader].value)
            if following is None:
                break
            chain.append(reader)
            view = following
        if sum(bindings[i].value.op.name in COPYING_OPS for i in chain) >= 2:
            for member in chain:
                chain_of[member] = chain
    return chain_of


def _elementwise_groups(bindings, readers) -> dict[int, list[int]]:
    """Binding index -> the sorted binding indices of its elementwise group; `readers` as
    _readers gives them."""
    defined_at = {binding.var: index for index, binding in enumerate(bindings)}

    group_of: dict[int, list[int]] = {}
    # From the back: a group's output is found before its members, which are all earlier.
    for output in reversed(range(len(bindings))):
        if output in group_of or not _is_elementwise(bindings[output].value):
            continue
        members = {output}
        grown = True
        while grown:
            grown = False
            for member in sorted(members, reverse=True):
                for var in vars_read(bindings[member].value):
                    producer = defined_at.get(var)
                    if (producer is None or producer in members or producer in group_of
                            or not _is_elementwise(bindings[producer].value)):
                        continue
                    if readers[producer] <= members:  # no reader outside (None is main's result)
                        members.add(producer)
                        grown = True
        # views of outside values that only the group reads: read in place by the kernel
        # (again until none joins: a value two views read joins once both have)
        grown = True
        while grown:
            grown = False
            for member in sorted(members):
                for var in vars_read(bindings[member].value):
                    producer = defined_at.get(var)
                    if producer is not None and producer not in members and producer not in group_of:
                        chain = _view_chain(bindings, readers, defined_at, producer, members, group_of)
                        # a chain that joins under views already in the group must still let
                        # every view compose over it (a reshape merging its transposed dims)
                        if chain and _views_compose(bindings, members | set(chain), defined_at):
                            members.update(chain)
                            grown = True
        group = sorted(members)
        for member in group:
            group_of[member] = group
    return group_of


def _view_chain(bindings, readers, defined_at, end: int, members, group_of) -> list[int]:
    """The bindings of the layout chain ending at `end` (read only by `members`) that one
    strided view of the chain's input computes, holding a slice or a transpose; [] else."""
    from .views import CHAIN_OPS, COPYING_OPS, View, compose

    def is_chain_op(index):
        value = bindings[index].value
        return _is_op_call(value) and value.op.name in CHAIN_OPS and len(value.args) == 1 and \
            isinstance(value.type, TensorType)

    if not is_chain_op(end) or not readers[end] or not readers[end] <= members:
        return []
    chain = [end]
    while True:  # back to the first op whose input is not a chain op read by the chain alone
        producer = defined_at.get(bindings[chain[-1]].value.args[0])
        if producer is None or producer in members or producer in group_of or not is_chain_op(producer) or \
                readers[producer] != {chain[-1]}:
            break
        chain.append(producer)
    chain.reverse()
    source = bindings[chain[0]].value.args[0]
    if not isinstance(source.type, TensorType) or is_scalar_constant(source):
        return []  # a one-element constant stays inline in the function, not a parameter to view
    view = View.dense(source.type.shape)
    for index in chain:
        view = compose(view, bindings[index].value)
        if view is None:
            return []
    if not any(bindings[i].value.op.name in COPYING_OPS for i in chain):
        return []  # reshapes alone are views already
    return chain


def _views_compose(bindings, members, defined_at) -> bool:
    """Whether every layout op among `members` is one strided view of a value from outside
    the group, as the codegen composes them (views.chain_views)."""
    from .views import View, chain_views

    def outside_view(var):
        return None if defined_at.get(var) in members else View.dense(var.type.shape)
    return chain_views([bindings[i] for i in sorted(members)], outside_view) is not None


def is_depthwise_conv(value: Expr) -> bool:
    """A conv2d call that depthwise.cuh computes: NHWC, 16-bit floats, one input and one
    output channel per group, channels a multiple of 8, filters within its shared memory."""
    if not (_is_op_call(value) and value.op.name == "conv2d" and value.attrs.get("data_layout") == "NHWC"):
        return False
    data, weight = value.args[0].type, value.args[1].type
    if data.dtype not in ("float16", "bfloat16") or len(data.shape) != 4 or len(weight.shape) != 4:
        return False
    channels = data.shape[3]
    out_channels, kernel_h, kernel_w, group_in = weight.shape
    return (value.attrs.get("groups") == channels == out_channels and group_in == 1
            and channels % DEPTHWISE_VECTOR == 0 and value.type.dtype == data.dtype
            and channels * kernel_h * kernel_w * 2 <= DEPTHWISE_MAX_FILTER_BYTES)


def is_few_channel_conv(value: Expr) -> bool:
    """A conv2d call that depthwise.cuh's few_channels_kernel computes: NHWC, 16-bit
    floats, groups 1, 1 to 4 input channels, output channels a multiple of 8, its filters
    (as float) within 48 KiB of shared memory."""
    if not (_is_op_call(value) and value.op.name == "conv2d" and value.attrs.get("data_layout") == "NHWC"):
        return False
    data, weight = value.args[0].type, value.args[1].type
    if data.dtype not in ("float16", "bfloat16") or len(data.shape) != 4 or len(weight.shape) != 4:
        return False
    out_channels, kernel_h, kernel_w, channels = weight.shape
    return (value.attrs.get("groups") == 1 and 1 <= channels == data.shape[3] <= FEW_CHANNELS
            and out_channels % DEPTHWISE_VECTOR == 0 and value.type.dtype == data.dtype
            and out_channels * kernel_h * kernel_w * channels * 4 <= FEW_CHANNELS_MAX_FILTER_BYTES)


def is_grouped_conv(value: Expr) -> bool:
    """A conv2d call that grouped_conv.cuh computes: NHWC, 16-bit floats, two groups or more,
    each of whole 8-channel vectors in and out, at most 64 input channels a group, one
    output vector's filters (window x group inputs x 8) within 48 KiB."""
    if not (_is_op_call(value) and value.op.name == "conv2d" and value.attrs.get("data_layout") == "NHWC"):
        return False
    data, weight = value.args[0].type, value.args[1].type
    if data.dtype not in ("float16", "bfloat16") or len(data.shape) != 4 or len(weight.shape) != 4:
        return False
    groups = value.attrs.get("groups", 1)
    out_channels, kernel_h, kernel_w, group_in = weight.shape
    return (groups >= 2 and data.shape[3] == groups * group_in and out_channels % groups == 0
            and group_in % DEPTHWISE_VECTOR == 0 and (out_channels // groups) % DEPTHWISE_VECTOR == 0
            and group_in <= GROUPED_MAX_GROUP_IN and value.type.dtype == data.dtype
            and kernel_h * kernel_w * group_in * DEPTHWISE_VECTOR * 2 <= GROUPED_MAX_VECTOR_FILTER_BYTES)


def is_epilogue_conv(value: Expr) -> bool:
    """A conv2d call that a conv2d_epilogue function may hold (depthwise, grouped or
    few-channel)."""
    return is_depthwise_conv(value) or is_grouped_conv(value) or is_few_channel_conv(value)


def _conv_epilogues(bindings, readers, groups) -> dict[int, list[int]]:
    """Epilogue conv binding index -> the sorted indices of it and the elementwise group
    that is its epilogue (see the module docstring)."""
    fused, taken = {}, set()
    for index, binding in enumerate(bindings):
        if not is_epilogue_conv(binding.value) or not readers[index] or None in readers[index]:
            continue
        if not all(_is_elementwise(bindings[reader].value) for reader in readers[index]):
            continue  # read through a view: the epilogue reads the conv's sums at the output index
        group = groups.get(min(readers[index]))
        if group is None or not readers[index] <= set(group):
            continue
        if bindings[group[-1]].value.type.shape != binding.value.type.shape:
            continue  # the group broadcasts the conv's output: it is not the conv's epilogue
        if group[-1] in taken:
            continue  # the epilogue of an earlier conv already (add(conv(x), conv(y))): one conv a kernel
        taken.add(group[-1])
        fused[index] = sorted([index, *group])
    return fused


def _concat_views(bindings, readers, taken) -> dict[int, list[int]]:
    """Concat binding index -> the sorted indices of it and the layout chains (slices,
    transposes: one strided view each) that only it reads: the concat copies each part
    from its view in place (a roll, concat(x[s:], x[:s]), is two copies instead of four;
    Swin's window shifts and patch merging)."""
    defined_at = {binding.var: index for index, binding in enumerate(bindings)}
    found = {}
    for index, binding in enumerate(bindings):
        if index in taken or not (_is_op_call(binding.value) and binding.value.op.name == "concat"):
            continue
        members = {index}
        for var in binding.value.args:
            producer = defined_at.get(var)
            if producer is not None and producer not in taken and producer not in members:
                members.update(_view_chain(bindings, readers, defined_at, producer, members, {}))
        if len(members) > 1:
            found[index] = sorted(members)
    return found


# ---------------------------------------------------------------- outlining


def _outline(members: list[Binding], composite: str, extra_attrs: dict | None = None) -> list[Binding]:
    """`%f = fn(...) {members}` and `%output = %f(outside values)`; `extra_attrs` are added
    to the function's (PinDevices marks pinned functions with Device="<device>")."""
    keep_scalars_inline = composite == f"{COMPILER}.elementwise"
    inner: dict[Var, Var] = {}     # main variable defined by a member -> its copy in the body
    params: dict[int, Var] = {}    # id(outside value) -> parameter
    call_args: list[Expr] = []
    body: list[Binding] = []

    def atom(expr: Expr) -> Expr:
        if isinstance(expr, Var) and expr in inner:
            return inner[expr]
        if keep_scalars_inline and is_scalar_constant(expr):
            return expr
        if isinstance(expr, Tuple):
            return Tuple([atom(field) for field in expr.fields])
        key = id(expr)
        if key not in params:
            params[key] = Var(f"p{len(params)}", expr.type)
            call_args.append(expr)
        return params[key]

    for binding in members:
        call = binding.value
        value = Call(call.op, [atom(arg) for arg in call.args], call.attrs)
        var = Var(binding.var.name_hint, value.type)
        inner[binding.var] = var
        body.append(Binding(var, value))

    output = members[-1].var
    attrs = {"Compiler": COMPILER, "Composite": composite, **(extra_attrs or {})}
    func = Function(list(params.values()), body, body[-1].var, output.type, attrs)
    func_var = Var(composite.replace(".", "_"), func.type)
    return [Binding(func_var, func), Binding(output, Call(func_var, call_args, type_=output.type))]


def outline_op(binding: Binding, extra_attrs: dict | None = None) -> list[Binding]:
    """One op call of main as a builtin function of its own, bound and called in place."""
    return _outline([binding], _composite_name(binding.value.op), extra_attrs)


def builtin_functions(main: Function) -> list[tuple[Var, Function]]:
    """The (variable, function) pairs of the builtin functions bound in `main`."""
    return [(b.var, b.value) for b in main.bindings
            if isinstance(b.value, Function) and b.value.attrs.get("Compiler") == COMPILER]


__all__ = ["partition_builtin", "builtin_functions", "outline_op", "is_scalar_constant", "is_depthwise_conv", "is_grouped_conv", "is_few_channel_conv", "is_epilogue_conv",
           "CONV_EPILOGUE_COMPOSITE", "CONCAT_VIEWS_COMPOSITE", "RESHAPE_OPS",
           "ELEMENTWISE_CATEGORIES", "COMPILER"]
