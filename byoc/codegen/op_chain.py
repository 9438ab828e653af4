"""How library backends read a partition: its op calls in order with local composites
inlined (`flatten`), and the conv chain act(conv2d(x, w) + bias + residual) that the
cutlass and cudnn backends both run as one kernel (`read_conv_epilogue`).

    steps, substitution = flatten(func, "cudnn")          # [(var, op name, args, attrs)]
    chain = read_conv_epilogue(func, "cudnn")             # ConvEpilogue: attrs, params, activation
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import BuildError
from ..ir.expr import Call, Function, Var
from ..ir.op import Op

# byoc op -> the activation's name in the backends' epilogues (gelu by its approximation)
ACTIVATION_OPS = {"relu": "relu", "silu": "silu", "sigmoid": "sigmoid", "hard_swish": "hard_swish"}


def activation_name(op: str, attrs) -> str | None:
    """The epilogue activation an op call is (gelu by its approximation), or None."""
    if op == "gelu":
        return "gelu" if attrs.get("approximate", "none") == "none" else "gelu_tanh"
    return ACTIVATION_OPS.get(op)


def flatten(func: Function, who: str) -> tuple[list, dict]:
    """The op calls of `func` with local composite functions inlined: a list of
    (var, op_name, args, attrs) where args are function params or earlier vars, and the
    substitution that maps each inlined result to the var computing it. `who` names the
    backend in errors."""
    steps = []
    local_functions = {}

    def walk(function: Function, substitution: dict):
        for binding in function.bindings:
            value = binding.value
            if isinstance(value, Function):
                local_functions[binding.var] = value
                continue
            if not isinstance(value, Call):
                raise BuildError(f"{who}: unexpected {type(value).__name__} in a partition")
            args = [substitution.get(a, a) if isinstance(a, Var) else a for a in value.args]
            callee = local_functions.get(value.op) if isinstance(value.op, Var) else value.op
            if isinstance(callee, Function):
                inner_substitution = dict(zip(callee.params, args))
                walk(callee, inner_substitution)
                substitution[binding.var] = inner_substitution[callee.result]
                continue
            if not isinstance(callee, Op):
                raise BuildError(f"{who}: a partition may only call ops and its own composites")
            steps.append((binding.var, callee.name, args, value.attrs))
            substitution[binding.var] = binding.var
        result = function.result
        substitution[result] = substitution.get(result, result)

    top = {p: p for p in func.params}
    walk(func, top)
    return steps, top


@dataclass(frozen=True)
class ConvEpilogue:
    """One conv2d and its epilogue act(conv + bias + residual), as a partition computes it:
    the conv's call (its var, attrs, data and weight), and where each operand is among the
    partition's parameters."""
    conv: Var  # the conv2d's result
    attrs: dict
    data: Var
    weight: Var
    indices: dict  # "data", "weight", ["bias"], ["residual"] -> parameter index
    activation: str | None  # relu, gelu, gelu_tanh, silu, sigmoid, hard_swish

    @property
    def has_bias(self) -> bool:
        return "bias" in self.indices

    @property
    def has_residual(self) -> bool:
        return "residual" in self.indices


def read_conv_epilogue(func: Function, who: str) -> ConvEpilogue:
    """The partition `func` as a conv chain; a BuildError naming `who` where it is not one
    (a pattern of that backend admitted something its codegen cannot run)."""
    steps, _ = flatten(func, who)
    index_of = {p: i for i, p in enumerate(func.params)}

    def param_index(value, role):
        if value not in index_of:
            raise BuildError(f"{who}: the {role} operand of a conv must be a parameter of the partition")
        return index_of[value]

    convs = [s for s in steps if s[1] == "conv2d"]
    if len(convs) != 1:
        raise BuildError(f"{who}: a conv partition holds exactly one conv2d, found {len(convs)}")
    conv_var, _, (data, weight), attrs = convs[0]
    indices = {"data": param_index(data, "data"), "weight": param_index(weight, "weight")}
    activation = None
    current = conv_var
    for var, op, args, op_attrs in steps:
        if var is conv_var:
            continue
        if current not in args or activation is not None:
            raise BuildError(f"{who}: {op} does not continue the conv epilogue act(conv + bias + residual)")
        other = [x for x in args if x is not current]
        if op == "add" and "bias" not in indices and "residual" not in indices and other and \
                len(other[0].type.shape) == 1:
            indices["bias"] = param_index(other[0], "bias")
        elif op == "add" and "residual" not in indices and other and other[0].type.shape == var.type.shape:
            indices["residual"] = param_index(other[0], "residual")
        elif activation_name(op, op_attrs) is not None:
            activation = activation_name(op, op_attrs)
        else:
            raise BuildError(f"{who}: {op} is not a fusable conv epilogue")
        current = var
    return ConvEpilogue(conv_var, dict(attrs), data, weight, indices, activation)


__all__ = ["ACTIVATION_OPS", "ConvEpilogue", "activation_name", "flatten", "read_conv_epilogue"]
