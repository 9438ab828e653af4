"""SinkReshapes: elementwise ops move before the reshapes that feed them.

Exporters wrap a 2-D GEMM in reshapes (GPT-2's `Conv1D` is `x.view(-1, nx)`, `addmm`,
`.view(..., nf)`), so the activation or residual add that follows reads the reshape, not
the GEMM, and no epilogue pattern can take it. Reshapes only relabel a dense buffer, so
an elementwise op commutes with them:

    %r = reshape(%y, shape=S)            %t = op(%y, reshape(%b, shape=Y))
    %v = op(%r, %b)              ->      %v = reshape(%t, shape=S)

Rewrites, in every function with a body, a binding `%v = op(..., %r, ...)` where `op` is
an elementwise or broadcasting op (category "elemwise" or "broadcast") and `%r =
reshape(%y)` is read by nothing else, when every other operand is
- a scalar (every dim 1, rank at most %y's): used as it is;
- of %r's shape: reshaped to %y's shape (a view, no copy);
- a vector of %r's last dim while the reshape keeps the last dim: used as it is (a bias).
Also rewrites `reshape(reshape(%x))`, the inner one read by nothing else, into one
reshape of %x, so that the reshapes of a chain meet and FoldConstant drops the pair that
cancels. One exception goes the other way: a one-operand elementwise op of a function
parameter or of a reshape of one (the cast of an input mask) has no producer to join, so a reshape reading it
(and nothing else reading it) moves above it, `reshape(cast(%param))` -> `cast(reshape(
%param))`, where it is a view and the cast can join its readers' kernel; such an op is
never sunk. Repeats until nothing changes. Leaves alone reshapes read elsewhere (the op
would then compute a value the reshape's other readers do not share), ops of other
categories, and operands of other shapes; unused bindings are left to
dead_code_elimination.
"""
from __future__ import annotations

from ..ir.expr import Binding, Call, Constant, Function, Var, is_op_call
from ..ir.module import IRModule
from ..ir.types import TensorType
from .fuse_ops_by_pattern import _uses

ELEMENTWISE_CATEGORIES = ("elemwise", "broadcast")


def sink_reshapes(mod: IRModule) -> IRModule:
    return mod.map_bodies(_sink)


def _sink(function: Function) -> Function:
    # the reshapes this pass put on other operands: never sunk themselves, or the op would
    # move back over them
    adapters: set = set()
    changed = True
    while changed:
        function, changed = _sink_once(function, adapters)
    return function


def _sink_once(function: Function, adapters: set) -> tuple[Function, bool]:
    bindings = list(function.bindings)
    producers = {b.var: b.value for b in bindings}
    params = set(function.params)
    uses = _uses(function)
    counter = [0]

    def fresh(hint, type_):
        counter[0] += 1
        return Var(f"{hint}_sunk{counter[0]}", type_)

    for index, binding in enumerate(bindings):
        value = binding.value
        if is_op_call(value, names=("reshape",)):
            inner = value.args[0]
            if isinstance(inner, Var) and is_op_call(producers.get(inner), names=("reshape",)) \
                    and len(uses.get(inner, [])) == 1:
                merged = Call("reshape", [producers[inner].args[0]], dict(value.attrs))
                bindings[index] = Binding(binding.var, merged)
                return _rebuilt(function, bindings), True
            if isinstance(inner, Var) and _unary_of_parameter(producers.get(inner), params, producers) \
                    and len(uses.get(inner, [])) == 1:
                unary = producers[inner]
                source = unary.args[0]
                shape = list(binding.var.type.shape)
                root = source
                while root not in params:
                    root = producers[root].args[0]
                reshaped = Var(f"{root.name_hint}_view", TensorType(shape, source.type.dtype))
                bindings[index:index + 1] = [Binding(reshaped, Call("reshape", [source], {"shape": shape})),
                                             Binding(binding.var, Call(unary.op, [reshaped], dict(unary.attrs)))]
                # the op's old binding goes now: left for dead_code_elimination, it would
                # still read the reshape chain and keep it from merging
                bindings = [b for b in bindings if b.var is not inner]
                return _rebuilt(function, bindings), True
            continue
        if not is_op_call(value, categories=ELEMENTWISE_CATEGORIES):
            continue
        if _unary_of_parameter(value, params, producers, through_reshape=True):
            continue  # the reshape goes above the op instead (above)
        rewrite = _rewrite_over_reshape(binding, producers, uses, fresh, adapters)
        if rewrite is not None:
            bindings[index:index + 1] = rewrite
            return _rebuilt(function, bindings), True
    return function, False


def _rewrite_over_reshape(binding, producers, uses, fresh, adapters):
    value = binding.value
    out_type = binding.var.type
    if not isinstance(out_type, TensorType):
        return None
    reshaped = [arg for arg in value.args if isinstance(arg, Var) and is_op_call(producers.get(arg), names=("reshape",))
                and len(uses.get(arg, [])) == 1 and arg not in adapters]
    if len({tuple(producers[arg].args[0].type.shape) for arg in reshaped}) > 1:
        return None  # reshapes of different shapes meet: moving over one would only move the other
    for position, arg in enumerate(value.args):
        if arg not in reshaped:
            continue
        source = producers[arg].args[0]
        source_shape, shown_shape = tuple(source.type.shape), tuple(arg.type.shape)
        if shown_shape != tuple(out_type.shape):
            continue  # the op broadcasts the reshaped operand itself
        new_bindings, new_args = [], []
        for other_position, other in enumerate(value.args):
            if other_position == position:
                new_args.append(source)
                continue
            if other in reshaped:  # a reshape from the same shape: its source as it is
                new_args.append(producers[other].args[0])
                continue
            adapted = _adapted_operand(other, source_shape, shown_shape, fresh, new_bindings, adapters)
            if adapted is None:
                break
            new_args.append(adapted)
        else:
            call = Call(value.op, new_args, dict(value.attrs))
            computed = fresh(binding.var.name_hint, call.type)
            new_bindings.append(Binding(computed, call))
            new_bindings.append(Binding(binding.var, Call("reshape", [computed], {"shape": list(shown_shape)})))
            return new_bindings
    return None


def _adapted_operand(other, source_shape, shown_shape, fresh, new_bindings, adapters):
    """`other` as an operand of the op applied before the reshape, or None."""
    other_type = getattr(other, "type", None)
    if not isinstance(other_type, TensorType):
        return None
    shape = tuple(other_type.shape)
    if all(d == 1 for d in shape) and len(shape) <= len(source_shape):
        return other  # a scalar broadcasts the same either way
    if shape == shown_shape:
        if isinstance(other, Constant):
            return Constant(other.data.reshape(source_shape), other_type.dtype)
        reshaped = fresh(getattr(other, "name_hint", "operand"), TensorType(source_shape, other_type.dtype))
        new_bindings.append(Binding(reshaped, Call("reshape", [other], {"shape": list(source_shape)})))
        adapters.add(reshaped)
        return reshaped
    if len(shape) == 1 and source_shape and shown_shape and shape[0] == shown_shape[-1] == source_shape[-1]:
        return other  # a bias along the last dim, which the reshape keeps
    return None


def _unary_of_parameter(value, params: set, producers: dict, through_reshape: bool = False) -> bool:
    """Whether `value` is a one-operand elementwise op (a cast, a negation) of a function
    parameter or a reshape of one (through_reshape: of a reshape of such)."""
    if not is_op_call(value, categories=ELEMENTWISE_CATEGORIES) or len(value.args) != 1:
        return False
    operand = value.args[0]
    if through_reshape:
        producer = producers.get(operand) if isinstance(operand, Var) else None
        if not is_op_call(producer, names=("reshape",)):
            return False
        operand = producer.args[0]
    return _is_parameter_view(operand, params, producers)


def _is_parameter_view(expr, params: set, producers: dict) -> bool:
    while isinstance(expr, Var) and expr not in params and is_op_call(producers.get(expr), names=("reshape",)):
        expr = producers[expr].args[0]
    return expr in params


def _rebuilt(function: Function, bindings: list) -> Function:
    return Function(function.params, bindings, function.result, function.ret_type, function.attrs)
