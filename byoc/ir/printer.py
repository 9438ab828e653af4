"""The text printer: IRModule, Function and Expr to readable, re-parseable text.

The format (`byoc.ir.parser` reads it back):

    def @main(%x: Tensor[(1, 128), float32], %w: Tensor[(128, 64), float32]) -> Tensor[(1, 64), float32] {
      %0 = matmul(%x, %w)
      %1 = add(%0, const(1.5, float32))
      %y = conv2d(%1, meta[0], strides=[2, 2])
      %t = (%0, %y)
      %g = %t.0
      %f = fn (%p: Tensor[(2,), float32]) -> Tensor[(2,), float32] [Composite="cutlass.dense"] {
        %a = relu(%p)
        return %a
      }
      %r = %f(%g)
      %c = @other(%r)
      %e: Tensor[(1, 64), float32] = extern("byoc_shim_relu")(%c)
      return (%e, %y)
    }

    def @decl(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];

    metadata {
      meta[0] = Tensor[(64, 64, 1, 1), float32] "<base64 of the little-endian bytes>"
    }

A module with attributes starts with a `module [key=value, ...]` line.

Local names come from `Var.name_hint` but are sanitized and made unique per top-level
function, because names from ONNX models can hold any character. Binding types are
printed only with `show_types=True`, or where they cannot be inferred (calls to an
ExternFunc). Op attributes equal to the schema default are left out; the parser fills
them back in. Small constants print inline, large ones in the trailing metadata block.
"""
from __future__ import annotations

import base64
import json
import math
import re
import sys

import numpy as np

from .expr import (Binding, Call, Constant, Expr, ExternFunc, Function, GlobalVar, Tuple,
                   TupleGetItem, Var)
from .op import REQUIRED, Op
from .types import numpy_dtype

# Constants with at most this many elements print inline as `const(...)`.
MAX_INLINE_ELEMENTS = 8

INDENT = "  "

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LOCAL_NAME = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+)\Z")
# Op names may hold dots ("nn.conv2d"), as the parser's bare names do.
_OP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


# ---------------------------------------------------------------- public entry points


def print_module(mod, show_types: bool = False, elide_data_over: int | None = None) -> str:
    """The text of an IRModule: its functions in insertion order, then the metadata block.

    `elide_data_over` (bytes): larger constants are listed in the metadata block by type
    and size instead of their data (the dumps a build writes for reading: a model's
    weights would make them hundreds of MB); such text does not parse."""
    printer = _Printer(show_types, elide_data_over)
    chunks = []
    module_attrs = getattr(mod, "attrs", {})
    # what the build's stages recorded that is not an attribute value (pipeline.py lists
    # them): one comment line each, so that the dump still parses; any other attribute must
    # print as a value (format_attr_dict raises, naming it, where it cannot)
    recorded = {key for key, value in module_attrs.items() if not _printable(value) and key in BUILD_STATE}
    attrs = {key: value for key, value in module_attrs.items() if key not in recorded}
    if attrs:
        chunks.append("module " + printer.format_attr_dict(attrs))
    state = [f"# {key}: {_describe_build_state(module_attrs[key])}" for key in sorted(recorded)]
    if state:
        chunks.append("\n".join(state))
    for name, func in mod.items():
        chunks.append(printer.print_global_function(name, func))
    text = "\n\n".join(chunks)
    return text + printer.metadata_block()


# The module attributes the build's stages record (byoc/pipeline.py), which are objects,
# not attribute values: a dump lists them as comments.
BUILD_STATE = frozenset({"initializers", "partition_report", "artifacts", "function_summaries", "declared_devices", "host_setup"})


def _printable(value) -> bool:
    try:
        format_value(value)
    except TypeError:
        return False
    return True


def _describe_build_state(value) -> str:
    """One line for a module attribute that is build state (an Artifact list, a report)."""
    if hasattr(value, "ir_summary"):
        return value.ir_summary()
    if isinstance(value, (list, tuple)):
        return f"{len(value)}: " + ", ".join(_describe_build_state(item) for item in value)
    if isinstance(value, dict):
        return f"{len(value)} entries"
    return type(value).__name__


def print_function(func: Function, name: str | None = None, show_types: bool = False) -> str:
    """The text of one function: `def @name(...)` when a name is given, else `fn (...)`."""
    printer = _Printer(show_types)
    if name is not None:
        text = printer.print_global_function(name, func)
    else:
        printer.begin_scope()
        text = printer.print_function_expr(func, indent_level=0)
    return text + printer.metadata_block()


def print_expr(expr: Expr, show_types: bool = False) -> str:
    """The text of any expression, written inline (a Function prints as `fn ...`).

    Variables not defined inside `expr` print by their (sanitized) names, so the text of
    an expression with free variables is for reading, not for parsing back."""
    if isinstance(expr, Function):
        return print_function(expr, show_types=show_types)
    printer = _Printer(show_types)
    printer.begin_scope()
    text = printer.print_expr(expr, indent_level=0)
    return text + printer.metadata_block()


# ---------------------------------------------------------------- value formatting


def format_global_name(name: str) -> str:
    """`@name`, or `@"name"` (a JSON string) when the name is not a plain identifier:
    global names are compared by name, so they cannot be sanitized."""
    return "@" + (name if _IDENTIFIER.match(name) else json.dumps(name))


def format_float(value: float) -> str:
    """A float literal that parses back to the same double: Python's shortest round-trip
    repr, with inf/-inf/nan spelled as words."""
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def format_value(value) -> str:
    """An attribute value: int, float, JSON string, true/false, none, or a [list]."""
    # bool first: it is a subclass of int, and NumPy's bool is not.
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return format_float(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    raise TypeError(f"cannot print attribute value {value!r} of type {type(value).__name__}; "
                    "expected int, float, str, bool, None or a list of them")


def _format_attr_key(key) -> str:
    key = str(key)
    return key if _IDENTIFIER.match(key) else json.dumps(key)


def attr_values_equal(a, b) -> bool:
    """Whether two attribute values are the same value (a tuple equals a list, NaN equals
    NaN, but True is not 1 and 1 is not 1.0)."""
    return canonical_attr_value(a) == canonical_attr_value(b)


def canonical_attr_value(value):
    """A hashable form of an attribute value that is equal exactly when the values are
    (used by the printer to drop defaults, and by structural equality and hashing)."""
    if isinstance(value, (bool, np.bool_)):
        return ("bool", bool(value))
    if value is None:
        return ("none",)
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, (int, np.integer)):
        return ("int", int(value))
    if isinstance(value, (float, np.floating)):
        # repr distinguishes -0.0 from 0.0 and writes every NaN the same.
        return ("float", format_float(value))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(canonical_attr_value(v) for v in value))
    if isinstance(value, dict):
        items = [(repr(k), canonical_attr_value(v)) for k, v in value.items()]
        return ("dict", tuple(sorted(items)))
    return ("object", type(value).__name__, repr(value))


def _literal_values(array: np.ndarray, dtype: str):
    """The Python values (nested lists for tensors) a `const(...)` literal writes: bools,
    ints, or floats. float(x) of a float16/bfloat16/float32 is exact, and the repr of a
    float parses back to the same double, which casts back to the same narrow value.
    Every NaN becomes Python's one NaN, as the literal `nan` reads back."""
    if array.ndim > 0:
        return [_literal_values(item, dtype) for item in array]
    value = array[()]
    if dtype == "bool":
        return bool(value)
    if np.issubdtype(numpy_dtype(dtype), np.integer):
        return int(value)
    value = float(value)
    return math.nan if math.isnan(value) else value


def inline_constant_text(constant: Constant) -> str | None:
    """`const(<value>, <dtype>)` for a small constant, or None where it must go to the
    metadata block: too many elements, a zero-size dim, or values whose literal would not
    reproduce the exact bytes (NaNs with a payload other than the default one)."""
    data = constant.data
    dtype = constant.type.dtype
    if data.size > MAX_INLINE_ELEMENTS or 0 in data.shape:
        return None
    values = _literal_values(data, dtype)
    # Check the values give back the exact bytes, as the parser will build them.
    from .tokens import literal_to_array
    try:
        reparsed = literal_to_array(values, dtype)
    except ValueError:
        return None
    if reparsed.shape != data.shape or reparsed.tobytes() != data.tobytes():
        return None
    return f"const({format_value(values)}, {dtype})"


def little_endian_bytes(array: np.ndarray) -> bytes:
    """The raw bytes of `array` in little-endian order, C-contiguous."""
    array = np.ascontiguousarray(array)
    big_endian = array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big")
    if big_endian and array.dtype.itemsize > 1:
        array = array.byteswap()
    return array.tobytes()


# ---------------------------------------------------------------- the printer


class _Printer:
    """Prints functions of one module (or one standalone expression), collecting the
    large constants for the metadata block as it goes."""

    def __init__(self, show_types: bool, elide_data_over: int | None = None):
        self.show_types = show_types
        self.elide_data_over = elide_data_over
        # Large constants by identity, in order of first use; the list keeps them alive so
        # that their ids are not reused while printing.
        self.meta_index: dict[int, int] = {}
        self.meta_constants: list[Constant] = []
        # Per top-level function: Var identity -> printed name, and every name in use.
        self.var_names: dict[int, str] = {}
        self.used_names: set[str] = set()
        self.scope_vars: list[Var] = []

    # ----------------------------------------------------------- names

    def begin_scope(self):
        """Start a new top-level function: its names need not differ from other functions'."""
        self.var_names = {}
        self.used_names = set()
        self.scope_vars = []  # keeps the Vars alive so their ids stay unique

    def define(self, var: Var) -> str:
        """Give `var` a printed name: its name_hint where that is a plain identifier not yet
        used in this top-level function, else a sanitized, numbered variant."""
        hint = var.name_hint if isinstance(var.name_hint, str) else ""
        if _LOCAL_NAME.match(hint):
            base = hint
        else:
            # Every character outside [A-Za-z0-9_] (quotes, newlines, unicode) becomes "_".
            base = re.sub(r"[^A-Za-z0-9_]", "_", hint) or "v"
            if base[0].isdigit() and not base.isdigit():
                base = "_" + base
        name = base
        counter = 1
        while name in self.used_names:
            name = f"{base}_{counter}"
            counter += 1
        self.used_names.add(name)
        self.var_names[id(var)] = name
        self.scope_vars.append(var)
        return name

    def name_of(self, var: Var) -> str:
        """The printed name of a variable; a free variable gets a name on first use."""
        name = self.var_names.get(id(var))
        if name is None:
            name = self.define(var)
        return name

    # ----------------------------------------------------------- functions

    def print_global_function(self, name: str, func: Function) -> str:
        self.begin_scope()
        return "def " + format_global_name(name) + self.function_rest(func, indent_level=0)

    def print_function_expr(self, func: Function, indent_level: int) -> str:
        return "fn " + self.function_rest(func, indent_level)

    def function_rest(self, func: Function, indent_level: int) -> str:
        """`(params) -> ret [attrs] { body }`, or `...;` for an extern declaration."""
        params = ", ".join(f"%{self.define(p)}: {p.type}" for p in func.params)
        head = f"({params}) -> {func.ret_type}"
        if func.attrs:
            head += " " + self.format_attr_dict(func.attrs)
        if func.is_extern:
            return head + ";"
        inner = INDENT * (indent_level + 1)
        lines = [head + " {"]
        for binding in func.bindings:
            lines.append(inner + self.print_binding(binding, indent_level + 1))
        lines.append(inner + "return " + self.print_expr(func.result, indent_level + 1))
        lines.append(INDENT * indent_level + "}")
        return "\n".join(lines)

    def format_attr_dict(self, attrs: dict) -> str:
        """`[key=value, ...]` sorted by key."""
        items = sorted(attrs.items(), key=lambda item: str(item[0]))
        parts = []
        for key, value in items:
            try:
                parts.append(f"{_format_attr_key(key)}={format_value(value)}")
            except TypeError as error:
                raise TypeError(f"attribute {key!r}: {error}") from None
        return "[" + ", ".join(parts) + "]"

    def print_binding(self, binding: Binding, indent_level: int) -> str:
        # The value first: it cannot refer to the variable it defines.
        value = self.print_expr(binding.value, indent_level)
        name = self.define(binding.var)
        value_is_extern_call = isinstance(binding.value, Call) and isinstance(binding.value.op, ExternFunc)
        if self.show_types or value_is_extern_call:
            return f"%{name}: {binding.var.type} = {value}"
        return f"%{name} = {value}"

    # ----------------------------------------------------------- expressions

    def print_expr(self, expr: Expr, indent_level: int) -> str:
        if isinstance(expr, Var):
            return "%" + self.name_of(expr)
        if isinstance(expr, Constant):
            return self.print_constant(expr)
        if isinstance(expr, GlobalVar):
            return format_global_name(expr.name)
        if isinstance(expr, ExternFunc):
            return f"extern({json.dumps(expr.symbol)})"
        if isinstance(expr, Tuple):
            fields = [self.print_expr(f, indent_level) for f in expr.fields]
            if len(fields) == 1:
                return f"({fields[0]},)"
            return "(" + ", ".join(fields) + ")"
        if isinstance(expr, TupleGetItem):
            return f"{self.print_expr(expr.tuple_value, indent_level)}.{expr.index}"
        if isinstance(expr, Call):
            return self.print_call(expr, indent_level)
        if isinstance(expr, Function):
            return self.print_function_expr(expr, indent_level)
        raise TypeError(f"cannot print {type(expr).__name__} {expr!r}: not an IR expression")

    def print_call(self, call: Call, indent_level: int) -> str:
        callee = call.op
        if isinstance(callee, Op):
            if not _OP_NAME.match(callee.name):
                raise ValueError(f"op name {callee.name!r} cannot be printed: expected an identifier")
            callee_text = callee.name
        else:
            callee_text = self.print_expr(callee, indent_level)
        parts = [self.print_expr(arg, indent_level) for arg in call.args]
        for key, value in self.printed_call_attrs(call):
            try:
                parts.append(f"{_format_attr_key(key)}={format_value(value)}")
            except TypeError as error:
                raise TypeError(f"attribute {key!r} of a call to {callee_text}: {error}") from None
        return f"{callee_text}({', '.join(parts)})"

    @staticmethod
    def printed_call_attrs(call: Call) -> list[tuple[str, object]]:
        """Op attributes that differ from the schema default, in schema order; attributes
        of calls to anything but an op all, sorted by key."""
        if not isinstance(call.op, Op):
            return sorted(call.attrs.items(), key=lambda item: str(item[0]))
        result = []
        schema = call.op.attrs
        for name, spec in schema.items():
            if name not in call.attrs:
                continue
            value = call.attrs[name]
            if spec.default is not REQUIRED and attr_values_equal(value, spec.default):
                continue
            result.append((name, value))
        # Attributes outside the schema cannot come from a normalized call; print them
        # anyway so that nothing is hidden (the parser will reject them).
        result.extend((name, value) for name, value in call.attrs.items() if name not in schema)
        return result

    def print_constant(self, constant: Constant) -> str:
        text = inline_constant_text(constant)
        if text is not None:
            return text
        index = self.meta_index.get(id(constant))
        if index is None:
            index = len(self.meta_constants)
            self.meta_index[id(constant)] = index
            self.meta_constants.append(constant)
        return f"meta[{index}]"

    def metadata_block(self) -> str:
        """The trailing `metadata { ... }` block (with its leading blank line), or ""."""
        if not self.meta_constants:
            return ""
        lines = ["", "", "metadata {"]
        for index, constant in enumerate(self.meta_constants):
            if self.elide_data_over is not None and constant.type.nbytes > self.elide_data_over:
                lines.append(f"{INDENT}meta[{index}] = {constant.type} elided({constant.type.nbytes} bytes)")
                continue
            encoded = base64.b64encode(little_endian_bytes(constant.data)).decode("ascii")
            lines.append(f'{INDENT}meta[{index}] = {constant.type} "{encoded}"')
        lines.append("}")
        return "\n".join(lines)
