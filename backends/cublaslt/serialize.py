"""Serializes one byoc IR Function into the engine's JSON graph (SCHEMA.md, version 1).

The JSON runtime backend does not generate code: the build step writes the subgraph as
JSON, the model library embeds it, and the engine (engine/: engine_graph.cc) parses it, plans it
once at create() and then only executes it. This module is the build-step half.

    text = serialize_function(func, constant_offsets={id(constant): offset, ...})

The function body may hold matmul, add, gelu (approximate none | tanh), relu, reshape
and transpose calls, and calls of local Composite functions built from those ops (they
are inlined). Constants are not copied: each refers to its offset in the model's weights
blob. Anything else raises byoc.BuildError naming the binding and what was expected.
The output is deterministic: keys sorted, ids in binding order, constants numbered in
order of first use.
"""
from __future__ import annotations

import json
import math

from byoc.errors import BuildError
from byoc.ir.expr import Call, Constant, Function, Tuple, Var
from byoc.ir.op import Op
from byoc.ir.types import TensorType

FORMAT = "byoc-json-graph"
VERSION = 1

# The dtypes the engine computes in (16-bit floats accumulate in float32).
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
# The engine's limit on tensor rank (the built-in shim's too).
MAX_RANK = 8


def serialize_function(func: Function, constant_offsets: dict | None = None) -> str:
    """The JSON text of `func` (see SCHEMA.md). `constant_offsets` maps id(Constant) to
    the constant's byte offset in the weights blob; every Constant in the body needs one."""
    if not isinstance(func, Function) or func.is_extern:
        raise BuildError(f"serialize_function needs a Function with a body, got {func!r}")
    return json.dumps(_GraphWriter(constant_offsets or {}).write(func),
                      sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _tensor_fields(what: str, type_) -> dict:
    """dtype and shape of a value, checked against what the engine accepts."""
    if not isinstance(type_, TensorType):
        raise BuildError(f"{what} has type {type_}; the JSON engine expects a tensor")
    if type_.dtype not in SUPPORTED_DTYPES:
        raise BuildError(
            f"{what} has dtype {type_.dtype}; the JSON engine expects one of {', '.join(SUPPORTED_DTYPES)}")
    if type_.ndim > MAX_RANK:
        raise BuildError(f"{what} has rank {type_.ndim}; the JSON engine expects at most {MAX_RANK}")
    if 0 in type_.shape:
        raise BuildError(f"{what} has shape {type_.shape} with no elements; the JSON engine expects dims >= 1")
    return {"dtype": type_.dtype, "shape": list(type_.shape)}


def _is_bias_of(bias: TensorType, other: TensorType, result: TensorType) -> bool:
    """True when `bias` is a vector along the last dim of `other` (shape (N,) or
    (1, ..., 1, N)) and adding it leaves `other`'s shape unchanged."""
    return (bias.ndim >= 1 and other.ndim >= 1 and other.shape == result.shape
            and bias.ndim <= other.ndim and bias.shape[-1] == other.shape[-1]
            and all(d == 1 for d in bias.shape[:-1]))


def _check_matmul_batches(call: Call, what: str) -> None:
    """The engine runs a batched matmul as one strided-batched GEMM: each operand's batch
    dims must equal the result's or be absent / all 1 (numpy allows [2,1] @ [1,3] too)."""
    a, b = (arg.type for arg in call.args)
    result_batches = math.prod(call.type.shape[:-2]) if a.ndim > 1 and b.ndim > 1 else None
    for operand in (a, b):
        batches = math.prod(operand.shape[:-2])
        if result_batches is not None and batches not in (1, result_batches):
            raise BuildError(
                f"{what} (matmul) broadcasts batch dims partially ({a.shape} @ {b.shape}); the JSON engine "
                f"expects each operand's batch dims to match the result's or be absent")


class _GraphWriter:
    def __init__(self, constant_offsets: dict):
        self.constant_offsets = constant_offsets
        self.inputs: list[dict] = []
        self.constants: list[dict] = []
        self.nodes: list[dict] = []
        self.refs: dict = {}            # Var -> value ref
        self.constant_refs: dict = {}   # id(Constant) -> value ref
        self.local_functions: dict = {}  # Var bound to a Function -> that Function

    def write(self, func: Function) -> dict:
        used_names: set = set()
        for index, param in enumerate(func.params):
            name = param.name_hint or f"input{index}"
            # Var names need not be unique in the IR; in the schema they must be.
            unique, suffix = name, 1
            while unique in used_names:
                unique, suffix = f"{name}_{suffix}", suffix + 1
            used_names.add(unique)
            self.inputs.append({"name": unique, **_tensor_fields(f"parameter {name!r}", param.type)})
            self.refs[param] = f"input:{index}"
        self._write_bindings(func.bindings)
        results = func.result.fields if isinstance(func.result, Tuple) else (func.result,)
        outputs = []
        for index, result in enumerate(results):
            ref = self._ref(result, f"result {index}")
            if not ref.startswith("node:"):
                raise BuildError(
                    f"result {index} of the function is a parameter or constant ({ref}); "
                    f"the JSON engine expects every output to be computed by a node")
            outputs.append(ref)
        return {"format": FORMAT, "version": VERSION, "inputs": self.inputs,
                "constants": self.constants, "nodes": self.nodes, "outputs": outputs}

    # ------------------------------------------------------------ bindings

    def _write_bindings(self, bindings) -> None:
        for binding in bindings:
            value = binding.value
            what = f"binding %{binding.var.name_hint}"
            if isinstance(value, Function):
                self.local_functions[binding.var] = value
                continue
            if not isinstance(value, Call):
                raise BuildError(f"{what} is a {type(value).__name__}; the JSON engine expects op calls")
            callee = value.op
            if isinstance(callee, Var) and callee in self.local_functions:
                callee = self.local_functions[callee]
            if isinstance(callee, Function):
                self.refs[binding.var] = self._inline(callee, value.args, what)
            elif isinstance(callee, Op):
                self.refs[binding.var] = self._write_call(value, what)
            else:
                raise BuildError(f"{what} calls {callee!r}; the JSON engine expects op calls")

    def _inline(self, callee: Function, args, what: str) -> str:
        """Writes the body of a local (Composite) function with its params bound to `args`."""
        if callee.is_extern:
            raise BuildError(f"{what} calls an extern function; the JSON engine expects a body")
        for param, arg in zip(callee.params, args):
            self.refs[param] = self._ref(arg, what)
        self._write_bindings(callee.bindings)
        if isinstance(callee.result, Tuple):
            raise BuildError(f"{what} calls a local function returning a tuple; the JSON engine expects one tensor")
        return self._ref(callee.result, what)

    def _write_call(self, call: Call, what: str) -> str:
        name = call.op.name
        inputs = [self._ref(arg, f"{what} ({name})") for arg in call.args]
        attrs: dict = {}
        if name == "matmul":
            kind = "matmul"
            _check_matmul_batches(call, what)
        elif name == "add":
            a, b = (arg.type for arg in call.args)
            kind = "add"
            if _is_bias_of(b, a, call.type):
                kind = "bias_add"
            elif _is_bias_of(a, b, call.type):
                kind, inputs = "bias_add", inputs[::-1]  # exact: float addition commutes
        elif name == "gelu":
            kind = {"none": "gelu", "tanh": "gelu_tanh"}[call.attrs["approximate"]]
        elif name == "relu":
            kind = "relu"
        elif name == "reshape":
            kind = "reshape"  # the node's own shape is the target
        elif name == "transpose":
            kind = "transpose"
            rank = call.args[0].type.ndim
            attrs["perm"] = list(call.attrs["axes"] or reversed(range(rank)))
        else:
            raise BuildError(
                f"{what} calls {name}; the JSON engine expects matmul, add, gelu, relu, reshape or transpose")
        for index, arg in enumerate(call.args):
            _tensor_fields(f"{what} ({name}) input {index}", arg.type)
        node = {"id": len(self.nodes), "kind": kind, "inputs": inputs, "attrs": attrs,
                **_tensor_fields(f"{what} ({name})", call.type)}
        self.nodes.append(node)
        return f"node:{node['id']}"

    # ------------------------------------------------------------ value references

    def _ref(self, expr, what: str) -> str:
        if isinstance(expr, Var):
            if expr not in self.refs:
                raise BuildError(f"{what} uses %{expr.name_hint}, which is not a parameter or earlier binding")
            return self.refs[expr]
        if isinstance(expr, Constant):
            return self._constant_ref(expr, what)
        raise BuildError(f"{what} has an argument of kind {type(expr).__name__}; expected a variable or constant")

    def _constant_ref(self, constant: Constant, what: str) -> str:
        key = id(constant)
        if key in self.constant_refs:
            return self.constant_refs[key]
        if key not in self.constant_offsets:
            raise BuildError(
                f"{what} uses a constant {constant.type} with no offset in the weights blob; "
                f"pass constant_offsets={{id(constant): offset}}")
        offset = self.constant_offsets[key]
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise BuildError(f"{what}: the weights offset {offset!r} of a constant is not a non-negative integer")
        fields = _tensor_fields(f"{what}: constant", constant.type)
        index = len(self.constants)
        self.constants.append({"name": f"c{index}", "offset": offset, **fields})
        ref = f"const:{index}"
        self.constant_refs[key] = ref
        return ref


__all__ = ["serialize_function", "FORMAT", "VERSION", "SUPPORTED_DTYPES"]
