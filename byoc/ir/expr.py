"""Expressions of the IR, in A-normal form.

A `Function` is a flat list of `Binding(var, value)` whose values are a `Call`, `Tuple`,
`TupleGetItem` or a nested `Function`; arguments of calls are atoms (`Var`, `Constant`,
or a `Tuple` of atoms). A Function without bindings and result is an extern
declaration: only its signature is known. Nodes are immutable by convention;
`Var`s are identified by object identity, never by name.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import TypeInferenceError
from .op import Op, get_op
from .types import FuncType, TensorType, TupleType, Type, dtype_of_numpy


class Expr:
    __slots__ = ()

    @property
    def type(self) -> Type:
        return self._type


class Var(Expr):
    __slots__ = ("name_hint", "_type")

    def __init__(self, name_hint: str, type_: Type):
        if not isinstance(type_, Type):
            raise TypeError(f"Var {name_hint!r} needs a Type, got {type_!r}")
        self.name_hint = name_hint
        self._type = type_

    def __repr__(self):
        return f"Var({self.name_hint}: {self._type})"


class Constant(Expr):
    __slots__ = ("data", "_type")

    def __init__(self, data, dtype: str | None = None):
        array = np.asarray(data) if dtype is None else np.asarray(data, dtype=_np_dtype(dtype))
        if dtype is None:
            dtype = dtype_of_numpy(array.dtype)
        # ascontiguousarray alone would turn a 0-d array into shape (1,).
        array = np.ascontiguousarray(array).reshape(array.shape)
        array.setflags(write=False)
        self.data = array
        self._type = TensorType(array.shape, dtype)

    def __repr__(self):
        return f"Constant({self._type})"


def _np_dtype(name):
    from .types import numpy_dtype
    return numpy_dtype(name)


class GlobalVar(Expr):
    """A reference to a global function of an IRModule, by name."""
    __slots__ = ("name", "_type")

    def __init__(self, name: str, type_: FuncType | None = None):
        self.name = name
        self._type = type_

    def __eq__(self, other):
        return isinstance(other, GlobalVar) and other.name == self.name

    def __hash__(self):
        return hash(("GlobalVar", self.name))

    def __repr__(self):
        return f"@{self.name}"


class ExternFunc(Expr):
    """A symbol provided outside the IR (a shim kernel, a backend entry)."""
    __slots__ = ("symbol", "_type")

    def __init__(self, symbol: str):
        self.symbol = symbol
        self._type = None

    def __eq__(self, other):
        return isinstance(other, ExternFunc) and other.symbol == self.symbol

    def __hash__(self):
        return hash(("ExternFunc", self.symbol))

    def __repr__(self):
        return f"ExternFunc({self.symbol})"


class Tuple(Expr):
    __slots__ = ("fields", "_type")

    def __init__(self, fields: Sequence[Expr]):
        self.fields = tuple(fields)
        self._type = TupleType(tuple(f.type for f in self.fields))


class TupleGetItem(Expr):
    __slots__ = ("tuple_value", "index", "_type")

    def __init__(self, tuple_value: Expr, index: int):
        tuple_type = tuple_value.type
        if not isinstance(tuple_type, TupleType):
            raise TypeInferenceError(f"TupleGetItem needs a tuple, got {tuple_type}")
        if not 0 <= index < len(tuple_type.fields):
            raise TypeInferenceError(f"TupleGetItem index {index} out of range for {tuple_type}")
        self.tuple_value = tuple_value
        self.index = int(index)
        self._type = tuple_type.fields[index]


Callee = Any  # Op | GlobalVar | ExternFunc | Var (bound to a Function) | Function


class Call(Expr):
    """`op(args, attrs)`. For ops the attributes are normalized and the type inferred;
    for other callees the result type comes from the callee's signature or `type_`."""
    __slots__ = ("op", "args", "attrs", "_type")

    def __init__(self, op: Callee, args: Sequence[Expr], attrs: dict | None = None,
                 type_: Type | None = None):
        if isinstance(op, str):
            op = get_op(op)
        self.op = op
        self.args = tuple(args)
        for arg in self.args:
            if not isinstance(arg, Expr):
                raise TypeError(f"argument {arg!r} of a call to {_callee_name(op)} is not an IR expression")
        if isinstance(op, Op):
            op.check_arity(len(self.args))
            self.attrs = op.normalize_attrs(attrs)
            if type_ is None:
                try:
                    type_ = op.infer([a.type for a in self.args], self.attrs)
                except TypeInferenceError:
                    raise
                except (ValueError, IndexError, TypeError) as error:
                    arg_types = ", ".join(str(a.type) for a in self.args)
                    raise TypeInferenceError(f"{op.name}({arg_types}): {error}") from error
        else:
            self.attrs = dict(attrs or {})
            if type_ is None:
                callee_type = op.type if not isinstance(op, ExternFunc) else None
                if isinstance(callee_type, FuncType):
                    type_ = callee_type.ret
                else:
                    raise TypeInferenceError(
                        f"call to {_callee_name(op)} needs an explicit result type")
        self._type = type_


def _callee_name(op) -> str:
    if isinstance(op, Op):
        return op.name
    if isinstance(op, GlobalVar):
        return "@" + op.name
    if isinstance(op, ExternFunc):
        return f'extern "{op.symbol}"'
    if isinstance(op, Var):
        return "%" + op.name_hint
    return "a local function"


class Binding:
    __slots__ = ("var", "value")

    def __init__(self, var: Var, value: Expr):
        self.var = var
        self.value = value

    def __repr__(self):
        return f"Binding({self.var.name_hint})"


class Function(Expr):
    """`fn(params) -> ret_type { bindings; return result }` with attributes.

    bindings/result are None for an extern declaration (signature only)."""
    __slots__ = ("params", "bindings", "result", "ret_type", "attrs", "_type")

    def __init__(self, params: Sequence[Var], bindings: Sequence[Binding] | None,
                 result: Expr | None, ret_type: Type | None = None, attrs: dict | None = None):
        self.params = tuple(params)
        self.bindings = None if bindings is None else tuple(bindings)
        self.result = result
        if ret_type is None:
            if result is None:
                raise TypeInferenceError("an extern function declaration needs a return type")
            ret_type = result.type
        self.ret_type = ret_type
        self.attrs = dict(attrs or {})
        self._type = FuncType(tuple(p.type for p in self.params), ret_type)

    @property
    def is_extern(self) -> bool:
        return self.bindings is None

    def with_attrs(self, **updates) -> "Function":
        attrs = dict(self.attrs)
        for key, value in updates.items():
            if value is None:
                attrs.pop(key, None)
            else:
                attrs[key] = value
        return Function(self.params, self.bindings, self.result, self.ret_type, attrs)

    def __repr__(self):
        return f"Function({len(self.params)} params, {len(self.bindings or ())} bindings, {self.attrs})"


def const(value, dtype: str | None = None) -> Constant:
    return Constant(value, dtype)


def is_op_call(value, names=None, categories=None) -> bool:
    """Whether `value` calls a registered op (not a function), one of `names` and of
    `categories` when they are given."""
    if not isinstance(value, Call) or not isinstance(value.op, Op):
        return False
    return (names is None or value.op.name in names) and (categories is None or value.op.category in categories)


def vars_read(expr: Expr, callees: bool = True) -> list:
    """The variables `expr` reads directly: itself, tuple fields, a tuple item's tuple, a
    call's arguments and (with `callees`) a local function it calls. Bodies of nested
    functions are not entered: they only see their own parameters."""
    if isinstance(expr, Var):
        return [expr]
    if isinstance(expr, Tuple):
        return [var for field in expr.fields for var in vars_read(field, callees)]
    if isinstance(expr, TupleGetItem):
        return vars_read(expr.tuple_value, callees)
    if isinstance(expr, Call):
        callee = [expr.op] if callees and isinstance(expr.op, Var) else []
        return callee + [var for arg in expr.args for var in vars_read(arg, callees)]
    return []


def substitute_vars(expr: Expr, replaced: dict) -> Expr:
    """`expr` with the variables in `replaced` (Var -> Expr) replaced where it reads them
    directly (as vars_read sees them); nested function bodies are left as they are."""
    if not replaced:
        return expr
    if isinstance(expr, Var):
        return replaced.get(expr, expr)
    if isinstance(expr, Tuple):
        return Tuple([substitute_vars(field, replaced) for field in expr.fields])
    if isinstance(expr, TupleGetItem):
        return TupleGetItem(substitute_vars(expr.tuple_value, replaced), expr.index)
    if isinstance(expr, Call):
        args = [substitute_vars(arg, replaced) for arg in expr.args]
        callee = replaced.get(expr.op, expr.op) if isinstance(expr.op, Var) else expr.op
        if isinstance(callee, Op):
            return Call(callee, args, expr.attrs)
        return Call(callee, args, expr.attrs, type_=expr.type)
    return expr
