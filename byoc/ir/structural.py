"""Structural equality and hashing of IRModules, Functions and expressions.

Two IR trees are structurally equal when they have the same shape up to the names of
their variables: parameters are matched by position and bound variables by the order
in which they are defined. Free variables (used but not defined inside the compared
trees) are equal only when they are the same Var object, unless `map_free_vars=True`,
which matches them on first encounter (as parameters are).

Leaves compare by value: constants by dtype, shape and exact bytes (so NaN payloads
count and NaN equals an identical NaN); ops by identity; globals by name; extern
functions by symbol; attributes by value (a tuple equals a list, True is not 1).

`structural_hash` is consistent with `structural_equal` (equal trees hash the same) and
stable across processes, so it can key on-disk caches. Constant bytes are hashed with
BLAKE2b once per array and cached while that array is alive.
"""
from __future__ import annotations

import hashlib
import weakref

import numpy as np

from .expr import Call, Constant, Expr, ExternFunc, Function, GlobalVar, Tuple, TupleGetItem, Var
from .module import IRModule
from .op import Op
from .printer import canonical_attr_value, print_expr, print_function, print_module


# ---------------------------------------------------------------- public entry points


def structural_equal(a, b, map_free_vars: bool = False) -> bool:
    """Whether `a` and `b` (IRModules, Functions or Exprs) are equal up to variable names."""
    try:
        _Comparison(map_free_vars).compare_any(a, b)
    except _Mismatch:
        return False
    return True


def assert_structural_equal(a, b, map_free_vars: bool = False):
    """Raise AssertionError naming the first mismatch (its path and why) and showing the
    text of both sides, unless `a` and `b` are structurally equal."""
    try:
        _Comparison(map_free_vars).compare_any(a, b)
    except _Mismatch as mismatch:
        raise AssertionError(
            f"not structurally equal: at {mismatch.path or '<root>'}: {mismatch.reason}\n"
            f"--- first ---\n{_text_for_message(a)}\n"
            f"--- second ---\n{_text_for_message(b)}") from None


def structural_hash(x) -> int:
    """A 64-bit hash of an IRModule, Function or Expr, equal for structurally equal ones."""
    hasher = _Hasher()
    hasher.hash_any(x)
    return int.from_bytes(hasher.digest.digest(), "little")


# ---------------------------------------------------------------- equality


class _Mismatch(Exception):
    """The first difference found: where (a path like `@main.bindings[2].value.args[0]`)
    and why."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _kind(x) -> str:
    return type(x).__name__


class _Comparison:
    def __init__(self, map_free_vars: bool):
        self.map_free_vars = map_free_vars
        # Variables of the first tree -> the matching variables of the second, and back,
        # by identity; both directions so that the matching is one to one.
        self.forward: dict[int, Var] = {}
        self.backward: dict[int, Var] = {}

    @staticmethod
    def fail(path: str, reason: str):
        raise _Mismatch(path, reason)

    def compare_any(self, a, b):
        if isinstance(a, IRModule) or isinstance(b, IRModule):
            if not (isinstance(a, IRModule) and isinstance(b, IRModule)):
                self.fail("", f"{_kind(a)} vs {_kind(b)}")
            self.compare_modules(a, b)
        elif isinstance(a, Expr) and isinstance(b, Expr):
            self.compare_expr(a, b, "")
        else:
            self.fail("", f"cannot compare {_kind(a)} with {_kind(b)}: expected IRModule, Function or Expr")

    def compare_modules(self, a: IRModule, b: IRModule):
        names_a, names_b = set(a.functions), set(b.functions)
        if names_a != names_b:
            only_a = ", ".join("@" + n for n in sorted(names_a - names_b)) or "nothing"
            only_b = ", ".join("@" + n for n in sorted(names_b - names_a)) or "nothing"
            self.fail("", f"different globals: only the first has {only_a}; only the second has {only_b}")
        for name in a.functions:
            self.compare_expr(a.functions[name], b.functions[name], "@" + name)

    # ----------------------------------------------------------- variables

    def define(self, a: Var, b: Var, path: str):
        """Match a variable defined in the first tree with one defined in the second."""
        if a.type != b.type:
            self.fail(path, f"variable types differ: {a.type} vs {b.type}")
        self.forward[id(a)] = b
        self.backward[id(b)] = a

    def compare_var_use(self, a: Var, b: Var, path: str):
        mapped = self.forward.get(id(a))
        if mapped is not None:
            if mapped is not b:
                self.fail(path, f"different variables: %{a.name_hint} vs %{b.name_hint}")
            return
        if id(b) in self.backward:
            self.fail(path, f"different variables: free %{a.name_hint} vs defined %{b.name_hint}")
        if a is not b and not self.map_free_vars:
            self.fail(path, f"different free variables %{a.name_hint} and %{b.name_hint} "
                            "(pass map_free_vars=True to match them)")
        self.define(a, b, path)

    # ----------------------------------------------------------- expressions

    def compare_expr(self, a: Expr, b: Expr, path: str):
        if type(a) is not type(b):
            self.fail(path, f"{_kind(a)} vs {_kind(b)}")
        if isinstance(a, Var):
            self.compare_var_use(a, b, path)
        elif isinstance(a, Constant):
            self.compare_constants(a, b, path)
        elif isinstance(a, GlobalVar):
            if a.name != b.name:
                self.fail(path, f"different globals @{a.name} vs @{b.name}")
        elif isinstance(a, ExternFunc):
            if a.symbol != b.symbol:
                self.fail(path, f"different extern symbols {a.symbol!r} vs {b.symbol!r}")
        elif isinstance(a, Tuple):
            if len(a.fields) != len(b.fields):
                self.fail(path, f"tuples of {len(a.fields)} vs {len(b.fields)} fields")
            for index, (field_a, field_b) in enumerate(zip(a.fields, b.fields)):
                self.compare_expr(field_a, field_b, f"{path}.fields[{index}]")
        elif isinstance(a, TupleGetItem):
            if a.index != b.index:
                self.fail(path, f"tuple indices {a.index} vs {b.index}")
            self.compare_expr(a.tuple_value, b.tuple_value, f"{path}.tuple_value")
        elif isinstance(a, Call):
            self.compare_calls(a, b, path)
        elif isinstance(a, Function):
            self.compare_functions(a, b, path)
        else:
            self.fail(path, f"unknown expression kind {_kind(a)}")

    def compare_constants(self, a: Constant, b: Constant, path: str):
        if a is b:
            return
        if a.type != b.type:
            self.fail(path, f"constants of type {a.type} vs {b.type}")
        if not _same_bytes(a.data, b.data):
            self.fail(path, f"constants of type {a.type} hold different values")

    def compare_calls(self, a: Call, b: Call, path: str):
        if isinstance(a.op, Op) or isinstance(b.op, Op):
            if a.op is not b.op:
                self.fail(path, f"calls to {_callee_text(a.op)} vs {_callee_text(b.op)}")
        else:
            self.compare_expr(a.op, b.op, f"{path}.op")
        if len(a.args) != len(b.args):
            self.fail(path, f"calls with {len(a.args)} vs {len(b.args)} arguments")
        for index, (arg_a, arg_b) in enumerate(zip(a.args, b.args)):
            self.compare_expr(arg_a, arg_b, f"{path}.args[{index}]")
        self.compare_attrs(a.attrs, b.attrs, f"{path}.attrs")
        if a.type != b.type:
            self.fail(path, f"call result types {a.type} vs {b.type}")

    def compare_functions(self, a: Function, b: Function, path: str):
        if len(a.params) != len(b.params):
            self.fail(path, f"functions of {len(a.params)} vs {len(b.params)} parameters")
        for index, (param_a, param_b) in enumerate(zip(a.params, b.params)):
            self.define(param_a, param_b, f"{path}.params[{index}]")
        if a.ret_type != b.ret_type:
            self.fail(path, f"return types {a.ret_type} vs {b.ret_type}")
        self.compare_attrs(a.attrs, b.attrs, f"{path}.attrs")
        if a.is_extern or b.is_extern:
            if a.is_extern != b.is_extern:
                self.fail(path, "an extern declaration vs a function with a body")
            return
        if len(a.bindings) != len(b.bindings):
            self.fail(path, f"functions of {len(a.bindings)} vs {len(b.bindings)} bindings")
        for index, (binding_a, binding_b) in enumerate(zip(a.bindings, b.bindings)):
            binding_path = f"{path}.bindings[{index}]"
            self.compare_expr(binding_a.value, binding_b.value, binding_path + ".value")
            self.define(binding_a.var, binding_b.var, binding_path + ".var")
        self.compare_expr(a.result, b.result, f"{path}.result")

    def compare_attrs(self, a: dict, b: dict, path: str):
        if set(a) != set(b):
            self.fail(path, f"attribute names {sorted(map(str, a))} vs {sorted(map(str, b))}")
        for key in a:
            if canonical_attr_value(a[key]) != canonical_attr_value(b[key]):
                self.fail(f"{path}.{key}", f"attribute values {a[key]!r} vs {b[key]!r}")


def _callee_text(op) -> str:
    if isinstance(op, Op):
        return op.name
    return _kind(op)


def _byte_view(array: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 array (no copy)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


# Compare big constants a slice at a time so no full-size temporary is made.
_COMPARE_CHUNK_BYTES = 1 << 24


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    bytes_a, bytes_b = _byte_view(a), _byte_view(b)
    if bytes_a.size != bytes_b.size:
        return False
    for start in range(0, bytes_a.size, _COMPARE_CHUNK_BYTES):
        stop = start + _COMPARE_CHUNK_BYTES
        if bytes_a[start:stop].tobytes() != bytes_b[start:stop].tobytes():
            return False
    return True


def _text_for_message(x, max_lines: int = 200, max_line_length: int = 160) -> str:
    """The printed text of `x`, shortened for an error message (long metadata lines cut)."""
    try:
        if isinstance(x, IRModule):
            text = print_module(x, show_types=True)
        elif isinstance(x, Function):
            text = print_function(x, show_types=True)
        elif isinstance(x, Expr):
            text = print_expr(x, show_types=True)
        else:
            text = repr(x)
    except Exception as error:  # noqa: BLE001 - the message must not fail to be made
        text = f"<cannot print {_kind(x)}: {error}>"
    lines = [line if len(line) <= max_line_length else line[:max_line_length] + "..."
             for line in text.splitlines()]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
    return "\n".join(lines)


# ---------------------------------------------------------------- hashing

# id(array) -> (weak reference to the array, digest of its bytes). The weak reference's
# callback drops the entry when the array dies, so ids are never confused and big arrays
# are never kept alive by the cache.
_CONSTANT_DIGESTS: dict[int, tuple[weakref.ref, bytes]] = {}


def constant_digest(constant: Constant) -> bytes:
    """BLAKE2b of a constant's bytes, cached per data array (constants are read-only)."""
    data = constant.data
    key = id(data)
    entry = _CONSTANT_DIGESTS.get(key)
    if entry is not None and entry[0]() is data:
        return entry[1]
    digest = hashlib.blake2b(_byte_view(data), digest_size=32).digest()
    try:
        reference = weakref.ref(data, lambda _, key=key: _CONSTANT_DIGESTS.pop(key, None))
    except TypeError:  # not weak-referenceable: do not cache
        return digest
    _CONSTANT_DIGESTS[key] = (reference, digest)
    return digest


class _Hasher:
    """Feeds a canonical serialization of the tree into BLAKE2b. Variables are written
    as the index of their definition (or of their first use, when free), so names and
    identities do not matter, as in `_Comparison`."""

    def __init__(self):
        self.digest = hashlib.blake2b(digest_size=8)
        self.var_indices: dict[int, int] = {}
        self.keep_alive: list[Var] = []  # ids in var_indices must stay unique

    def write(self, *parts):
        for part in parts:
            text = part if isinstance(part, str) else repr(part)
            data = text.encode("utf-8", "surrogatepass")
            # Length-prefixed, so that ("ab", "c") and ("a", "bc") differ.
            self.digest.update(len(data).to_bytes(8, "little"))
            self.digest.update(data)

    def define(self, var: Var):
        self.var_indices[id(var)] = len(self.var_indices)
        self.keep_alive.append(var)
        self.write("def", str(var.type))

    def hash_any(self, x):
        if isinstance(x, IRModule):
            self.write("module", len(x.functions))
            for name in sorted(x.functions):
                self.write("global", name)
                self.hash_expr(x.functions[name])
        elif isinstance(x, Expr):
            self.hash_expr(x)
        else:
            raise TypeError(f"cannot hash {_kind(x)}: expected IRModule, Function or Expr")

    def hash_attrs(self, attrs: dict):
        items = sorted((repr(key), canonical_attr_value(value)) for key, value in attrs.items())
        self.write("attrs", items)

    def hash_expr(self, expr: Expr):
        if isinstance(expr, Var):
            index = self.var_indices.get(id(expr))
            if index is None:
                # A free variable: number it by first use, as equality with
                # map_free_vars=True matches it (without it, equal means the same object).
                self.define(expr)
                index = self.var_indices[id(expr)]
            self.write("var", index)
        elif isinstance(expr, Constant):
            self.write("const", str(expr.type))
            self.digest.update(constant_digest(expr))
        elif isinstance(expr, GlobalVar):
            self.write("global_var", expr.name)
        elif isinstance(expr, ExternFunc):
            self.write("extern", expr.symbol)
        elif isinstance(expr, Tuple):
            self.write("tuple", len(expr.fields))
            for field in expr.fields:
                self.hash_expr(field)
        elif isinstance(expr, TupleGetItem):
            self.write("get_item", expr.index)
            self.hash_expr(expr.tuple_value)
        elif isinstance(expr, Call):
            if isinstance(expr.op, Op):
                self.write("call_op", expr.op.name)
            else:
                self.write("call")
                self.hash_expr(expr.op)
            self.write(len(expr.args))
            for arg in expr.args:
                self.hash_expr(arg)
            self.hash_attrs(expr.attrs)
            self.write(str(expr.type))
        elif isinstance(expr, Function):
            self.write("function", len(expr.params))
            for param in expr.params:
                self.define(param)
            self.write(str(expr.ret_type))
            self.hash_attrs(expr.attrs)
            if expr.is_extern:
                self.write("extern_declaration")
                return
            self.write("bindings", len(expr.bindings))
            for binding in expr.bindings:
                self.hash_expr(binding.value)
                self.define(binding.var)
            self.hash_expr(expr.result)
        else:
            raise TypeError(f"cannot hash {_kind(expr)}: not an IR expression")
