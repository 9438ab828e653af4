"""A small builder for writing IR in Python (tests, examples, the ONNX frontend).

    with FunctionBuilder("main") as fb:
        x = fb.param("x", (2, 3), "float32")
        y = fb.call("relu", fb.call("add", x, 1.0))
        fb.ret(y)
    mod = fb.module()

`call` emits a binding and returns its Var; plain NumPy arrays and Python numbers become
Constants (numbers take the dtype of the first tensor argument).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .expr import Binding, Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from .module import IRModule
from .types import TensorType, Type


class FunctionBuilder:
    def __init__(self, name: str = "main", attrs: dict | None = None):
        self.name = name
        self.attrs = dict(attrs or {})
        self.params: list[Var] = []
        self.bindings: list[Binding] = []
        self.func: Function | None = None
        self._counter = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def param(self, name: str, shape_or_type, dtype: str = "float32") -> Var:
        type_ = shape_or_type if isinstance(shape_or_type, Type) else TensorType(tuple(shape_or_type), dtype)
        var = Var(name, type_)
        self.params.append(var)
        return var

    def _fresh(self, hint: str | None) -> str:
        self._counter += 1
        return hint or f"v{self._counter}"

    def emit(self, value: Expr, name: str | None = None) -> Var:
        """Bind `value` to a new Var (atoms are returned as they are)."""
        if isinstance(value, (Var, Constant)):
            return value
        var = Var(self._fresh(name), value.type)
        self.bindings.append(Binding(var, value))
        return var

    def _atom(self, value, like: Sequence[Expr]) -> Expr:
        if isinstance(value, Expr):
            if isinstance(value, (Var, Constant)):
                return value
            if isinstance(value, Tuple):
                return Tuple([self._atom(f, like) for f in value.fields])
            return self.emit(value)
        if isinstance(value, np.ndarray):
            return Constant(value)
        dtype = next((e.type.dtype for e in like if isinstance(e, Expr) and isinstance(e.type, TensorType)), None)
        return Constant(np.asarray(value), dtype) if dtype else Constant(np.asarray(value))

    def call(self, op, *args, name: str | None = None, type_: Type | None = None, **attrs) -> Var:
        """Emit `op(*args, **attrs)`; `op` is an op name, Op, GlobalVar, ExternFunc or Function."""
        atoms = [self._atom(a, args) for a in args]
        return self.emit(Call(op, atoms, attrs, type_=type_), name)

    def tuple(self, *fields, name: str | None = None) -> Var:
        return self.emit(Tuple([self._atom(f, fields) for f in fields]), name)

    def get_item(self, tuple_value: Expr, index: int, name: str | None = None) -> Var:
        return self.emit(TupleGetItem(tuple_value, index), name)

    def ret(self, *results) -> Function:
        if len(results) == 1:
            result = self._atom(results[0], results)
        else:
            result = Tuple([self._atom(r, results) for r in results])
        self.func = Function(self.params, self.bindings, result, attrs=self.attrs)
        return self.func

    def module(self) -> IRModule:
        if self.func is None:
            raise ValueError("call ret() before module()")
        return IRModule({self.name: self.func})
