"""The reference interpreter: runs an IRModule with the ops' NumPy references.

It is the golden model for every correctness check and the engine of constant folding.
It keeps every value in host memory: a call whose result would exceed MAX_VALUE_BYTES is
refused before it runs, naming the value, and an op reference that fails on the values it
is given (an index out of range, memory exhausted) is reported as an InterpreterError that
names the value it was computing.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ByocError, TypeInferenceError
from .ir.expr import (Call, Constant, Expr, ExternFunc, Function, GlobalVar, Tuple,
                      TupleGetItem, Var)
from .ir.module import IRModule
from .ir.op import Op
from .ir.types import TensorType, TupleType, numpy_dtype

# The largest result of one call the interpreter computes (16 GiB). The interpreter is a
# golden model for tests and small runs, not a runtime: a value beyond this (an Expand of a
# constant to 2**40 elements imports fine and runs in a built library's planned memory) is
# refused before NumPy tries to allocate it. Raise it here for a machine with more memory.
MAX_VALUE_BYTES = 2**34

# What an op reference raises on values it cannot compute (an index out of range, a
# broadcast that does not fit): reported as InterpreterError naming the value.
_REFERENCE_ERRORS = (LookupError, ValueError, TypeError, ArithmeticError)


class InterpreterError(ByocError):
    """The interpreter was given inputs that do not fit the function, met an extern call,
    or could not compute a value (too large, or an op that failed on its inputs)."""


def interpret(mod, *args, entry: str = "main", **kwargs):
    """Run `mod[entry]` (or a Function) on NumPy-convertible inputs.

    Inputs are given positionally or by parameter name; each must have the parameter's
    shape, and is converted to its dtype only when the conversion is exact in kind
    (a float64 array for a float32 parameter is accepted, a float array for an int
    parameter is not). Returns an array, or a tuple for a tuple result.
    """
    if isinstance(mod, Function):
        func = mod
    elif isinstance(mod, IRModule):
        if not isinstance(entry, str) or entry not in mod:
            raise InterpreterError(f"entry {entry!r}: the module has no such function; it has "
                                   f"{', '.join(mod.functions) or 'none'}")
        func = mod[entry]
    else:
        what = "None" if mod is None else f"{type(mod).__name__} {mod!r:.60}"
        raise InterpreterError(f"interpret: expected an IRModule or a Function, got {what}; an ONNX model "
                               f"(a path, bytes or ModelProto) is imported first: "
                               f"byoc.interpret(byoc.from_onnx(model), ...)")
    module = mod if isinstance(mod, IRModule) else None
    values = _bind_inputs(func, args, kwargs)
    return _Interpreter(module).run_function(func, values)


def _bind_inputs(func: Function, args, kwargs) -> list:
    params = func.params
    if len(args) > len(params):
        raise InterpreterError(f"expected at most {len(params)} inputs, got {len(args)}")
    by_name = {p.name_hint: i for i, p in enumerate(params)}
    values: list = list(args) + [None] * (len(params) - len(args))
    for name, value in kwargs.items():
        if name not in by_name:
            raise InterpreterError(
                f"unknown input {name!r}; the inputs are {', '.join(by_name)}")
        if values[by_name[name]] is not None:
            raise InterpreterError(f"input {name!r} given twice")
        values[by_name[name]] = value
    bound = []
    for param, value in zip(params, values):
        if value is None:
            raise InterpreterError(f"input {param.name_hint!r} ({param.type}) is missing")
        bound.append(_check_value(param.name_hint, param.type, value))
    return bound


def _check_value(name: str, type_, value):
    if isinstance(type_, TupleType):
        if not isinstance(value, (tuple, list)) or len(value) != len(type_.fields):
            raise InterpreterError(f"input {name!r}: expected a tuple of {len(type_.fields)} values ({type_}), "
                                   f"got {type(value).__name__}")
        return tuple(_check_value(f"{name}.{i}", t, v) for i, (t, v) in enumerate(zip(type_.fields, value)))
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as error:  # a ragged nested list, an object NumPy cannot read
        raise InterpreterError(f"input {name!r}: expected an array of {type_}, got a {type(value).__name__} "
                               f"NumPy cannot convert ({error})") from None
    if tuple(array.shape) != type_.shape:
        raise InterpreterError(
            f"input {name!r}: expected shape {type_.shape}, got {tuple(array.shape)}")
    expected = numpy_dtype(type_.dtype)
    if array.dtype != expected:
        if array.dtype.kind != expected.kind and not (array.dtype.kind in "fV" and expected.kind in "fV"):
            raise InterpreterError(
                f"input {name!r}: expected dtype {type_.dtype}, got {array.dtype}")
        array = array.astype(expected)
    return array


def evaluate_call(op: Op, arg_values: list, attrs: dict, result_type):
    """Run one op's reference and check what it returned against the inferred type."""
    result = op.reference(*arg_values, **attrs)
    return _conform(op.name, result, result_type)


def _conform(what: str, result, type_):
    if isinstance(type_, TupleType):
        return tuple(_conform(what, r, t) for r, t in zip(result, type_.fields))
    array = np.asarray(result)
    if tuple(array.shape) != type_.shape:
        raise TypeInferenceError(
            f"reference of {what} returned shape {tuple(array.shape)}, inferred {type_.shape}")
    return array.astype(numpy_dtype(type_.dtype), copy=False)


class _Interpreter:
    def __init__(self, module: IRModule | None):
        self.module = module

    def run_function(self, func: Function, args: list):
        if func.is_extern:
            raise InterpreterError(
                "cannot interpret an extern function: its body was compiled by a backend")
        env: dict[Var, object] = dict(zip(func.params, args))
        for binding in func.bindings:
            env[binding.var] = self.evaluate(binding.value, env, f"%{binding.var.name_hint}")
        return self.evaluate(func.result, env, "the result")

    def evaluate(self, expr: Expr, env, name: str = "a value"):
        """The value of `expr`; `name` (the variable it is bound to) is what errors name."""
        if isinstance(expr, Var):
            return env[expr]
        if isinstance(expr, Constant):
            return expr.data
        if isinstance(expr, Tuple):
            return tuple(self.evaluate(f, env) for f in expr.fields)
        if isinstance(expr, TupleGetItem):
            return self.evaluate(expr.tuple_value, env)[expr.index]
        if isinstance(expr, Function):
            return expr  # a closure over nothing: local functions only see their params
        if isinstance(expr, Call):
            args = [self.evaluate(a, env) for a in expr.args]
            callee = expr.op
            if isinstance(callee, Op):
                return self._evaluate_op(callee, args, expr, name)
            if isinstance(callee, GlobalVar):
                if self.module is None:
                    raise InterpreterError(f"call to @{callee.name} needs the IRModule")
                return self.run_function(self.module[callee.name], args)
            if isinstance(callee, Var):
                callee = env[callee]
            if isinstance(callee, Function):
                return self.run_function(callee, args)
            if isinstance(callee, ExternFunc):
                raise InterpreterError(f"cannot interpret a call to extern symbol {callee.symbol!r}")
        raise InterpreterError(f"cannot evaluate {type(expr).__name__}")

    @staticmethod
    def _evaluate_op(op: Op, args: list, call: Call, name: str):
        size = byte_count(call.type)
        if size > MAX_VALUE_BYTES:
            raise InterpreterError(
                f"{name} = {op.name}(...) of type {call.type} needs {size} bytes ({size / 2**30:.4g} GiB); "
                f"expected at most {MAX_VALUE_BYTES} bytes ({MAX_VALUE_BYTES / 2**30:.4g} GiB, "
                f"byoc.interpreter.MAX_VALUE_BYTES), the largest value the interpreter computes")
        try:
            return evaluate_call(op, args, call.attrs, call.type)
        except MemoryError as error:
            raise InterpreterError(f"{name} = {op.name}(...) of type {call.type} ({size} bytes) does not fit "
                                   f"in memory: {error or 'no size given'}") from error
        except _REFERENCE_ERRORS as error:
            raise InterpreterError(f"{name} = {op.name}(...) could not be computed on the given values: "
                                   f"{type(error).__name__}: {error}") from error


def byte_count(type_) -> int:
    """Bytes of a tensor type, or of all fields of a tuple type (Python ints: exact)."""
    if isinstance(type_, TensorType):
        return math.prod(type_.shape) * numpy_dtype(type_.dtype).itemsize
    return sum(byte_count(field) for field in getattr(type_, "fields", ()))
