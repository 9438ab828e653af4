"""FoldConstant: evaluate op calls on constants at compile time, and drop no-op calls.

Rewrites, in every function of the module that has a body (nested local functions
included):

- Constant folding: a call to an op whose arguments are all known constants is computed
  with the op's NumPy reference (the same code the interpreter runs) and its variable is
  replaced by a Constant wherever it is used. "Known constant" means a Constant, a Tuple
  of known constants, or a variable bound to one (a folded tuple, so `%t.0` of a folded
  `split` folds too). An op that returns a tuple becomes a tuple binding of Constants,
  `%t = (const, const)`, which dead_code_elimination removes once nothing reads it.
- Forwarding: `%g = %t.i`, where `%t` is bound to a tuple expression, is replaced by
  that tuple's field i; a binding that only names an atom (`%c = const(...)`, `%v = %w`)
  is replaced by the atom.
- No-op elimination (listed in NO_OP_RULES): identity(x), reshape, squeeze and
  broadcast_to to x's own shape, cast to x's own dtype, transpose by the identity
  permutation, pad by nothing, a slice of everything in order and a concat of x alone are
  replaced by x (Swin's window attention pads by zero and slices whole windows back,
  each a copy); so are x + 0, 0 + x, x - 0, x * 1, 1 * x and x / 1 when the
  constant is all zeros (ones) and the result has x's own type (it does not broadcast x).
  Exporters write such arithmetic: transformers' ViT adds an attention mask of zeros
  built from constants, which hides the attention's shape from the patterns.

Leaves alone:

- calls to anything but an op (global functions, extern symbols, local functions), even
  with constant arguments: their bodies may be compiled by a backend, or not be there;
- folds whose result would take more than `size_limit_bytes` (for example a
  broadcast_to that turns a scalar into a large tensor: cheap to compute at run time,
  expensive to store in the library);
- bindings that become unused: the replaced bindings are dropped, but nothing else is
  (that is dead_code_elimination's job);
- extern declarations, function signatures and attributes.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..interpreter import evaluate_call
from ..ir.expr import Binding, Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.types import TensorType, TupleType, Type


def fold_constant(mod: IRModule, size_limit_bytes: int | None = None) -> IRModule:
    """A new module with constant op calls evaluated and no-op calls removed.

    `size_limit_bytes`: a call whose result (all tuple fields together) would take more
    bytes than this is not folded; None folds regardless of size."""
    if size_limit_bytes is not None and size_limit_bytes < 0:
        raise ValueError(f"size_limit_bytes must be None or >= 0, got {size_limit_bytes}")
    folder = _Folder(size_limit_bytes)
    functions = {name: folder.fold_function(func) for name, func in mod.items()}
    return IRModule(functions, mod.attrs)


# ---------------------------------------------------------------- no-op elimination


def _transpose_is_identity(call: Call) -> bool:
    ndim = call.args[0].type.ndim
    # axes=() means "reverse the dims", which is the identity only up to rank 1.
    permutation = call.attrs["axes"] or tuple(reversed(range(ndim)))
    return tuple(permutation) == tuple(range(ndim))


def _same_type_as_input(call: Call) -> bool:
    return call.type == call.args[0].type


def _all_equal_to(expr: Expr, value: float) -> bool:
    if not isinstance(expr, Constant):
        return False
    data = np.asarray(expr.data)
    return data.dtype.kind in "fiub" and bool(np.all(data == value))


def _identity_operand(*positions: int, value: float) -> Callable[[Call], int | None]:
    """A rule for a binary op that returns its other operand when the operand at one of
    `positions` is a constant equal to `value` everywhere and the call does not broadcast
    that other operand (same shape and dtype as the result)."""
    def rule(call: Call) -> int | None:
        for position in positions:
            other = 1 - position
            if _all_equal_to(call.args[position], value) and call.args[other].type == call.type:
                return other
        return None
    return rule


def _pads_nothing(call: Call) -> bool:
    return not any(int(width) for width in call.attrs["pads"])


def _slices_everything(call: Call) -> bool:
    # forward steps of 1 over the whole extent: a backward step keeps the shape but reverses
    return _same_type_as_input(call) and all(int(step) == 1 for step in call.attrs["strides"])


def _first_if(predicate: Callable[[Call], bool]) -> Callable[[Call], int | None]:
    return lambda call: 0 if predicate(call) else None


# op name -> which argument a call to it returns unchanged (None: not a no-op).
NO_OP_RULES: dict[str, Callable[[Call], int | None]] = {
    "identity": lambda call: 0,
    "reshape": _first_if(_same_type_as_input),
    "cast": _first_if(_same_type_as_input),
    "broadcast_to": _first_if(_same_type_as_input),
    "transpose": _first_if(_transpose_is_identity),
    "squeeze": _first_if(_same_type_as_input),
    "pad": _first_if(_pads_nothing),
    "strided_slice": _first_if(_slices_everything),
    "concat": lambda call: 0 if len(call.args) == 1 and _same_type_as_input(call) else None,
    "add": _identity_operand(0, 1, value=0.0),
    "subtract": _identity_operand(1, value=0.0),
    "multiply": _identity_operand(0, 1, value=1.0),
    "divide": _identity_operand(1, value=1.0),
}


def _no_op_operand(call: Call) -> int | None:
    """The index of the argument `call` returns unchanged, or None."""
    rule = NO_OP_RULES.get(call.op.name)
    if rule is None or not all(isinstance(arg.type, TensorType) for arg in call.args):
        return None
    return rule(call)


# ---------------------------------------------------------------- folding


def _result_bytes(type_: Type) -> int:
    if isinstance(type_, TupleType):
        return sum(_result_bytes(field) for field in type_.fields)
    return type_.nbytes


def _constant_value(expr: Expr):
    """The NumPy value of a known-constant expression (a tuple of them for a Tuple),
    or None when some part of it is not a Constant."""
    if isinstance(expr, Constant):
        return expr.data
    if isinstance(expr, Tuple):
        fields = [_constant_value(field) for field in expr.fields]
        return None if any(field is None for field in fields) else tuple(fields)
    return None


def _as_constants(value, type_: Type) -> Expr:
    """A NumPy result as IR: a Constant, or a Tuple of them for a tuple type."""
    if isinstance(type_, TupleType):
        return Tuple([_as_constants(field, field_type) for field, field_type in zip(value, type_.fields)])
    return Constant(value, type_.dtype)


class _Folder:
    def __init__(self, size_limit_bytes: int | None):
        self.size_limit_bytes = size_limit_bytes

    def fold_function(self, func: Function) -> Function:
        if func.is_extern:
            return func
        return _FunctionFolder(self).run(func)

    def fits_limit(self, type_: Type) -> bool:
        return self.size_limit_bytes is None or _result_bytes(type_) <= self.size_limit_bytes


class _FunctionFolder:
    """Folds one function body, front to back, in a single pass (each binding only reads
    earlier ones, so one pass sees every constant it can use)."""

    def __init__(self, folder: _Folder):
        self.folder = folder
        # A variable whose binding was removed -> the atom (Var or Constant) that replaces it.
        self.replacements: dict[Var, Expr] = {}
        # A variable bound to a tuple expression -> that expression, after substitution.
        self.tuples: dict[Var, Tuple] = {}

    def run(self, func: Function) -> Function:
        bindings = []
        for binding in func.bindings:
            kept = self.visit_binding(binding)
            if kept is not None:
                bindings.append(kept)
        result = self.substitute(func.result)
        return Function(func.params, bindings, result, func.ret_type, func.attrs)

    def substitute(self, expr: Expr) -> Expr:
        """`expr` with the removed variables replaced (inside tuples and call arguments)."""
        if isinstance(expr, Var):
            return self.replacements.get(expr, expr)
        if isinstance(expr, Tuple):
            return Tuple([self.substitute(field) for field in expr.fields])
        if isinstance(expr, TupleGetItem):
            return TupleGetItem(self.substitute(expr.tuple_value), expr.index)
        if isinstance(expr, Call):
            callee = self.substitute(expr.op) if isinstance(expr.op, (Var, Function)) else expr.op
            args = [self.substitute(arg) for arg in expr.args]
            # Replacements have the type of what they replace, so the call's type stands.
            return Call(callee, args, expr.attrs, type_=expr.type)
        if isinstance(expr, Function):
            return self.folder.fold_function(expr)
        return expr  # Constant, GlobalVar, ExternFunc

    def known_tuple(self, expr: Expr) -> Tuple | None:
        if isinstance(expr, Tuple):
            return expr
        if isinstance(expr, Var):
            return self.tuples.get(expr)
        return None

    def resolved(self, expr: Expr) -> Expr:
        """`expr` with variables bound to tuple expressions replaced by them, recursively,
        so that constant-ness can be read off the expression."""
        known = self.known_tuple(expr)
        if known is None:
            return expr
        return Tuple([self.resolved(field) for field in known.fields])

    def visit_binding(self, binding: Binding) -> Binding | None:
        """The binding to keep (possibly rewritten), or None when its variable is replaced."""
        var = binding.var
        value = self.substitute(binding.value)

        if isinstance(value, (Var, Constant)):
            # A binding that only names another atom: use the atom itself.
            self.replacements[var] = value
            return None

        if isinstance(value, TupleGetItem):
            known = self.known_tuple(value.tuple_value)
            if known is not None:
                field = known.fields[value.index]
                if isinstance(field, (Var, Constant)):
                    self.replacements[var] = field
                    return None
                # A tuple-valued field stays a binding (a Tuple is not an atom everywhere).
                value = field

        if isinstance(value, Call) and isinstance(value.op, Op):
            operand = _no_op_operand(value)
            if operand is not None:
                self.replacements[var] = value.args[operand]
                return None
            folded = self.try_fold(value)
            if isinstance(folded, Constant):
                self.replacements[var] = folded
                return None
            if folded is not None:
                value = folded

        if isinstance(value, Tuple):
            self.tuples[var] = value
        return Binding(var, value)

    def try_fold(self, call: Call) -> Expr | None:
        """The Constant (or Tuple of Constants) that `call` evaluates to, or None when some
        argument is not a known constant or the result is over the size limit."""
        arg_values = [_constant_value(self.resolved(arg)) for arg in call.args]
        if any(value is None for value in arg_values):
            return None
        if not self.folder.fits_limit(call.type):
            return None
        result = evaluate_call(call.op, arg_values, call.attrs, call.type)
        return _as_constants(result, call.type)
