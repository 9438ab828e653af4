"""The text parser: reads what `byoc.ir.printer` writes back into an IRModule.

A recursive-descent parser over the tokens of byoc.ir.tokens. Binding types are inferred by
constructing each `Call` (the op registry infers op results; calls to globals, local
functions and nested functions take the callee's return type). A binding may carry a
type annotation `%x: T = ...`: for a call to an ExternFunc it is the call's type (which
cannot be inferred), anywhere else it must equal the inferred type.

Parsing a module takes two passes over its tokens: the first reads every function
signature and the metadata block, skipping bodies, so that a function may call a global
defined after it and use `meta[i]` before the block that defines it; the second parses
the bodies.

Nesting is limited to `MAX_NESTING` levels (byoc.ir.tokens): brackets and parentheses in
the text, and also the depth of every expression and type the parser builds (a chain
`%t.0.0.0` or a tuple of a tuple variable nests without brackets).

Comments run from `#` to the end of the line. Every error is a `byoc.errors.ParseError` whose message starts with "line L, col C:".
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import sys

import numpy as np

from ..errors import ParseError, TypeInferenceError
from .expr import (Binding, Call, Constant, Expr, ExternFunc, Function, GlobalVar, Tuple,
                   TupleGetItem, Var)
from .module import IRModule
from .op import OP_REGISTRY, Op, get_op
from .tokens import (END, FLOAT, GLOBAL, INT, LOCAL, MAX_NESTING, NAME, STRING, Token, TokenCursor,  # noqa: F401
                     literal_to_array)
from .types import INT64_LIMIT, FuncType, TensorType, TupleType, Type, numpy_dtype

# ---------------------------------------------------------------- literals


def parse_literal(text: str):
    """A literal value (number, string, true/false/none, inf/nan, or a [list]) from text."""
    parser = _Parser(text)
    value = parser.parse_value()
    parser.expect_end()
    return value


# ---------------------------------------------------------------- public entry points


def parse_module(text: str) -> IRModule:
    """The IRModule written in `text` (the format of `byoc.ir.printer.print_module`)."""
    return _Parser(text).parse_module()


def parse_function(text: str) -> Function:
    """The function written in `text`: either `fn (...) ...` or one `def @name(...) ...`,
    followed by its metadata block if it has large constants."""
    return _Parser(text).parse_function()


# ---------------------------------------------------------------- the parser


class _Signature:
    """What pass one learns of a function: enough to call it, and where its body is."""

    def __init__(self, name, params, ret_type, attrs, body_position, token):
        self.name = name
        self.params = params
        self.ret_type = ret_type
        self.attrs = attrs
        self.body_position = body_position  # index of the "{" token; None for a declaration
        self.token = token

    @property
    def type(self) -> FuncType:
        return FuncType(tuple(p.type for p in self.params), self.ret_type)


class _Parser(TokenCursor):
    def __init__(self, text: str):
        super().__init__(text)
        self.globals: dict[str, _Signature] = {}
        self.metadata: dict[int, Constant] = {}
        # Local scopes, innermost last: printed name -> Var.
        self.scopes: list[dict[str, Var]] = []
        # id(expression) -> (the expression, its depth) for the expressions built so far;
        # holding the expression keeps its id from being reused.
        self.expr_depths: dict[int, tuple[Expr, int]] = {}

    def checked_depth(self, expr: Expr, token: Token) -> Expr:
        """`expr`, a node just built, unless it or its type nests deeper than MAX_NESTING."""
        if isinstance(expr, Function):
            children = [] if expr.is_extern else [b.value for b in expr.bindings] + [expr.result]
        elif isinstance(expr, Call):
            children = list(expr.args) + ([expr.op] if isinstance(expr.op, Expr) else [])
        elif isinstance(expr, Tuple):
            children = list(expr.fields)
        elif isinstance(expr, TupleGetItem):
            children = [expr.tuple_value]
        else:
            children = []
        depth = 1 + max((self.expr_depths.get(id(child), (None, 0))[1] for child in children), default=0)
        if depth > MAX_NESTING:
            raise self.error(f"expression nested deeper than {MAX_NESTING} levels", token)
        if getattr(expr.type, "nesting_depth", 0) > MAX_NESTING:
            raise self.error(f"the type of this expression is nested deeper than {MAX_NESTING} levels "
                             "(Tuple[...] or Fn[...] inside one another)", token)
        self.expr_depths[id(expr)] = (expr, depth)
        return expr

    # ----------------------------------------------------------- module level

    def parse_module(self) -> IRModule:
        module_attrs: dict = {}
        order: list[_Signature] = []
        # Pass one: signatures and metadata.
        while not self.at(END):
            token = self.peek()
            if self.at_keyword("def"):
                signature = self.parse_global_signature()
                if signature.name in self.globals:
                    raise self.error(f"global @{signature.name} is defined twice", signature.token)
                self.globals[signature.name] = signature
                order.append(signature)
            elif self.at_keyword("metadata"):
                self.parse_metadata()
            elif self.at_keyword("module"):
                self.advance()
                if module_attrs:
                    raise self.error("the module attributes are given twice", token)
                module_attrs = self.parse_attr_dict()
            else:
                raise self.error(f"expected 'def' or 'metadata' but found {token.describe()}")
        # Pass two: bodies.
        functions = {signature.name: self.build_function(signature) for signature in order}
        return IRModule(functions, module_attrs)

    def parse_function(self) -> Function:
        if self.at_keyword("def"):
            module = self.parse_module()
            if len(module.functions) != 1:
                raise ParseError(f"expected one function but the text defines {len(module.functions)}: "
                                 + ", ".join("@" + name for name in module.functions))
            return next(iter(module.functions.values()))
        start = self.expect_keyword("fn")
        signature = self.parse_signature_rest(None, start)
        while not self.at(END):
            if self.at_keyword("metadata"):
                self.parse_metadata()
            else:
                raise self.error(f"expected 'metadata' or end of input but found {self.peek().describe()}")
        return self.build_function(signature)

    def parse_global_signature(self) -> _Signature:
        start = self.expect_keyword("def")
        name_token = self.expect(GLOBAL, "a global name '@name'")
        return self.parse_signature_rest(name_token.value, start)

    def parse_signature_rest(self, name, start: Token) -> _Signature:
        """`(params) -> type [attrs]` then `;` or a body, which is skipped for pass two."""
        params = self.parse_params()
        ret_type, attrs = self.parse_return_and_attrs()
        if self.at_punct(";"):
            self.advance()
            return _Signature(name, params, ret_type, attrs, None, start)
        body_position = self.position
        if not self.at_punct("{"):
            raise self.error(f"expected '{{' or ';' but found {self.peek().describe()}")
        self.skip_braces()
        return _Signature(name, params, ret_type, attrs, body_position, start)

    def parse_params(self) -> list[Var]:
        self.expect_punct("(")
        params: list[Var] = []
        seen: dict[str, Token] = {}
        while not self.at_punct(")"):
            if params:
                self.expect_separator(")")
            token = self.expect(LOCAL, "a parameter '%name: type'")
            if token.value in seen:
                raise self.error(f"parameter %{token.value} is declared twice", token)
            seen[token.value] = token
            self.expect_punct(":")
            params.append(Var(token.value, self.parse_type()))
        self.expect_punct(")")
        return params

    def parse_return_and_attrs(self) -> tuple[Type, dict]:
        self.expect_punct("->")
        ret_type = self.parse_type()
        attrs = self.parse_attr_dict() if self.at_punct("[") else {}
        return ret_type, attrs

    def build_function(self, signature: _Signature) -> Function:
        """Pass two for one top-level function: parse its body with its params in scope."""
        if signature.body_position is None:
            return Function(signature.params, None, None, signature.ret_type, signature.attrs)
        self.position = signature.body_position
        self.scopes = []
        self.nesting = 0
        return self.parse_body(signature.params, signature.ret_type, signature.attrs)

    def parse_body(self, params: list[Var], ret_type: Type, attrs: dict) -> Function:
        """`{ bindings; return result }` of a function whose params are `params`."""
        self.scopes.append({})
        for param in params:
            self.scopes[-1][param.name_hint] = param
        self.expect_punct("{")
        bindings: list[Binding] = []
        while not self.at_keyword("return"):
            bindings.append(self.parse_binding())
        return_token = self.advance()
        result = self.parse_expr()
        self.expect_punct("}")
        self.scopes.pop()
        if result.type != ret_type:
            raise self.error(f"the function returns {result.type} but its signature says {ret_type}",
                             return_token)
        return Function(params, bindings, result, ret_type, attrs)

    def parse_binding(self) -> Binding:
        name_token = self.peek()
        if name_token.kind != LOCAL:
            raise self.error(f"expected a binding '%name = ...' or 'return' but found {name_token.describe()}")
        self.advance()
        if self.lookup_local(name_token.value) is not None:
            raise self.error(f"%{name_token.value} is already defined", name_token)
        annotation = None
        if self.at_punct(":"):
            self.advance()
            annotation = self.parse_type()
        self.expect_punct("=")
        value_token = self.peek()
        value = self.parse_expr(annotation)
        if annotation is not None and value.type != annotation:
            raise self.error(f"%{name_token.value} is annotated {annotation} but its value has type "
                             f"{value.type}", value_token)
        var = Var(name_token.value, value.type)
        self.scopes[-1][name_token.value] = var
        return Binding(var, value)

    def lookup_local(self, name: str) -> Var | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    # ----------------------------------------------------------- metadata

    def parse_metadata(self):
        """`metadata { meta[i] = Tensor[...] "base64" ... }`."""
        self.expect_keyword("metadata")
        self.expect_punct("{")
        while not self.at_punct("}"):
            entry_token = self.expect_keyword("meta")
            index = self.parse_meta_index()
            if index in self.metadata:
                raise self.error(f"meta[{index}] is defined twice", entry_token)
            self.expect_punct("=")
            type_token = self.peek()
            type_ = self.parse_type()
            if not isinstance(type_, TensorType):
                raise self.error(f"expected a tensor type for meta[{index}] but found {type_}", type_token)
            if self.at_keyword("elided"):
                raise self.error(f"meta[{index}]'s data was left out when this text was printed (a build's IR dump "
                                 f"lists large constants by type and size only); expected its base64 data", self.peek())
            data_token = self.expect(STRING, "a base64 string")
            try:
                raw = base64.b64decode(data_token.value, validate=True)
            except (binascii.Error, ValueError) as error:
                raise self.error(f"meta[{index}] is not valid base64: {error}", data_token) from None
            if len(raw) != type_.nbytes:
                raise self.error(f"meta[{index}] holds {len(raw)} bytes but {type_} needs {type_.nbytes}",
                                 data_token)
            array = np.frombuffer(raw, dtype=numpy_dtype(type_.dtype))
            if sys.byteorder == "big" and array.dtype.itemsize > 1:
                array = array.byteswap()  # the text holds little-endian bytes
            self.metadata[index] = Constant(array.reshape(type_.shape), type_.dtype)
        self.expect_punct("}")

    # ----------------------------------------------------------- types

    def parse_type(self) -> Type:
        token = self.peek()
        if self.at_keyword("Tensor"):
            self.advance()
            self.expect_punct("[")
            self.expect_punct("(")
            dims = []
            while not self.at_punct(")"):
                dim_token = self.expect(INT, "a dimension (an integer)")
                if not 0 <= dim_token.value < INT64_LIMIT:
                    problem = "is negative" if dim_token.value < 0 else "is too large"
                    raise self.error(f"dimension {dim_token.value} {problem}; expected "
                                     f"0 <= dimension < 2**63 ({INT64_LIMIT})", dim_token)
                dims.append(dim_token.value)
                if not self.at_punct(")"):
                    self.expect_separator(")")
            self.expect_punct(")")
            self.expect_punct(",")
            dtype_token = self.expect(NAME, "a dtype")
            self.expect_punct("]")
            try:
                numpy_dtype(dtype_token.value)
            except TypeError as error:
                raise self.error(str(error), dtype_token) from None
            try:
                return TensorType(tuple(dims), dtype_token.value)
            except TypeError as error:  # too many elements in all
                raise self.error(str(error), token) from None
        if self.at_keyword("Tuple"):
            self.advance()
            self.enter_nesting(self.expect_punct("["))
            fields = []
            while not self.at_punct("]"):
                if fields:
                    self.expect_separator("]")
                fields.append(self.parse_type())
            self.expect_punct("]")
            self.leave_nesting()
            return TupleType(tuple(fields))
        if self.at_keyword("Fn"):
            self.advance()
            self.enter_nesting(self.expect_punct("["))
            self.expect_punct("(")
            params = []
            while not self.at_punct(")"):
                if params:
                    self.expect_separator(")")
                params.append(self.parse_type())
            self.expect_punct(")")
            self.expect_punct(",")
            ret = self.parse_type()
            self.expect_punct("]")
            self.leave_nesting()
            return FuncType(tuple(params), ret)
        raise self.error(f"expected a type (Tensor[...], Tuple[...] or Fn[...]) but found {token.describe()}")

    # ----------------------------------------------------------- values (attributes, literals)

    def parse_value(self):
        """int, float, "string", true/false/none, inf/-inf/nan, or a [list] of values."""
        token = self.peek()
        if token.kind in (INT, FLOAT, STRING):
            self.advance()
            return token.value
        if token.kind == NAME and token.value in _WORD_VALUES:
            self.advance()
            return _WORD_VALUES[token.value]
        if self.at_punct("-") and self.at_keyword("inf", 1):
            self.advance()
            self.advance()
            return -math.inf
        if self.at_punct("["):
            self.enter_nesting(self.advance())
            items = []
            while not self.at_punct("]"):
                if items:
                    self.expect_separator("]")
                items.append(self.parse_value())
            self.expect_punct("]")
            self.leave_nesting()
            return items
        raise self.error(f"expected a value (number, string, true, false, none or [list]) but found "
                         f"{token.describe()}")

    def parse_attr_dict(self) -> dict:
        """`[key=value, ...]` (function and module attributes)."""
        self.expect_punct("[")
        attrs: dict = {}
        while not self.at_punct("]"):
            if attrs:
                self.expect_separator("]")
            key_token = self.peek()
            if key_token.kind not in (NAME, STRING):
                raise self.error(f"expected an attribute name but found {key_token.describe()}")
            self.advance()
            if key_token.value in attrs:
                raise self.error(f"attribute {key_token.value!r} is given twice", key_token)
            self.expect_punct("=")
            attrs[key_token.value] = self.parse_value()
        self.expect_punct("]")
        return attrs

    # ----------------------------------------------------------- expressions

    def parse_expr(self, type_hint: Type | None = None) -> Expr:
        """An expression: a primary followed by calls `(...)` and tuple indices `.i`.

        `type_hint` is the binding's annotation: the type of a call to an ExternFunc that
        is the whole expression."""
        start_token = self.peek()
        expr = self.parse_primary()
        while True:
            if self.at_punct("("):
                args, attrs = self.parse_call_arguments()
                whole_expression = not (self.at_punct("(") or self.at_punct("."))
                expr = self.make_call(expr, args, attrs, type_hint if whole_expression else None,
                                      start_token)
                self.checked_depth(expr, start_token)
            elif self.at_punct("."):
                dot = self.advance()
                index = self.expect(INT, "a tuple index").value
                try:
                    expr = TupleGetItem(expr, index)
                except TypeInferenceError as error:
                    raise self.error(str(error), dot) from None
                self.checked_depth(expr, dot)
            else:
                return expr

    def parse_primary(self) -> Expr:
        token = self.peek()
        if token.kind == LOCAL:
            self.advance()
            var = self.lookup_local(token.value)
            if var is None:
                raise self.error(f"undefined variable %{token.value}", token)
            return var
        if token.kind == GLOBAL:
            self.advance()
            signature = self.globals.get(token.value)
            if signature is None:
                raise self.error(f"undefined global @{token.value}", token)
            return GlobalVar(token.value, signature.type)
        if self.at_punct("("):
            return self.parse_tuple()
        if token.kind == NAME:
            if token.value == "const":
                return self.parse_const()
            if token.value == "meta":
                return self.parse_meta_reference()
            if token.value == "extern":
                self.advance()
                self.expect_punct("(")
                symbol = self.expect(STRING, "the extern symbol (a string)").value
                self.expect_punct(")")
                return ExternFunc(symbol)
            if token.value == "fn":
                return self.parse_function_expr()
            self.advance()
            if not self.at_punct("("):
                raise self.error(f"expected '(' after the op name {token.value!r} but found "
                                 f"{self.peek().describe()}")
            return self.resolve_op(token)
        raise self.error(f"expected an expression but found {token.describe()}")

    def resolve_op(self, token: Token) -> Op:
        op = OP_REGISTRY.get(token.value)
        if op is None:
            try:
                op = get_op(token.value)  # loads byoc.ops on first use
            except KeyError:
                raise self.error(f"unknown op {token.value!r}", token) from None
        return op

    def parse_tuple(self) -> Expr:
        """`()`, `(a,)`, `(a, b, ...)`; `(a)` is just `a`."""
        opening = self.expect_punct("(")
        self.enter_nesting(opening)
        fields = []
        trailing_comma = False
        while not self.at_punct(")"):
            fields.append(self.parse_expr())
            trailing_comma = False
            if not self.at_punct(")"):
                self.expect_separator(")")
                trailing_comma = True
        self.expect_punct(")")
        self.leave_nesting()
        if len(fields) == 1 and not trailing_comma:
            return fields[0]
        return self.checked_depth(Tuple(fields), opening)

    def parse_const(self) -> Constant:
        """`const(<literal>, <dtype>)`."""
        self.expect_keyword("const")
        self.expect_punct("(")
        value_token = self.peek()
        value = self.parse_value()
        self.expect_punct(",")
        dtype_token = self.expect(NAME, "a dtype")
        self.expect_punct(")")
        try:
            numpy_dtype(dtype_token.value)
        except TypeError as error:
            raise self.error(str(error), dtype_token) from None
        try:
            array = literal_to_array(value, dtype_token.value)
        except ValueError as error:
            raise self.error(str(error), value_token) from None
        return Constant(array, dtype_token.value)

    def parse_meta_index(self) -> int:
        """`[i]` after `meta`: a non-negative integer."""
        self.expect_punct("[")
        index_token = self.expect(INT, "a non-negative integer index")
        if index_token.value < 0:
            raise self.error(f"expected a non-negative integer index but found {index_token.describe()}",
                             index_token)
        self.expect_punct("]")
        return index_token.value

    def parse_meta_reference(self) -> Constant:
        token = self.expect_keyword("meta")
        index = self.parse_meta_index()
        if index not in self.metadata:
            raise self.error(f"meta[{index}] is not defined in the metadata block", token)
        return self.metadata[index]

    def parse_function_expr(self) -> Function:
        """A nested function `fn (params) -> type [attrs] { body }` or declaration `...;`."""
        start = self.expect_keyword("fn")
        self.enter_nesting(start)
        params = self.parse_params()
        ret_type, attrs = self.parse_return_and_attrs()
        if self.at_punct(";"):
            self.advance()
            function = Function(params, None, None, ret_type, attrs)
        else:
            for param in params:
                if self.lookup_local(param.name_hint) is not None:
                    raise self.error(f"parameter %{param.name_hint} of a nested function is already "
                                     "defined in the enclosing function")
            function = self.parse_body(params, ret_type, attrs)
        self.leave_nesting()
        return self.checked_depth(function, start)

    def parse_call_arguments(self) -> tuple[list[Expr], dict]:
        """`(arg, ..., name=value, ...)`: expressions first, then attributes (a name or a
        "quoted name", each given once)."""
        self.enter_nesting(self.expect_punct("("))
        args: list[Expr] = []
        attrs: dict = {}
        while not self.at_punct(")"):
            if args or attrs:
                self.expect_separator(")")
            if (self.at(NAME) or self.at(STRING)) and self.at_punct("=", 1):
                key_token = self.advance()
                self.advance()
                if key_token.value in attrs:
                    raise self.error(f"attribute {key_token.value!r} is given twice", key_token)
                attrs[key_token.value] = self.parse_value()
            else:
                if attrs:
                    raise self.error("expected an attribute 'name=value' (arguments come before "
                                     f"attributes) but found {self.peek().describe()}")
                args.append(self.parse_expr())
        self.expect_punct(")")
        self.leave_nesting()
        return args, attrs

    def make_call(self, callee: Expr | Op, args: list[Expr], attrs: dict, type_hint: Type | None,
                  token: Token) -> Call:
        if isinstance(callee, Op):
            try:
                return Call(callee, args, attrs)
            except (TypeInferenceError, TypeError, ValueError) as error:
                message = str(error)
                if not message.startswith(callee.name):
                    message = f"{callee.name}: {message}"
                raise self.error(message, token) from None
        if isinstance(callee, ExternFunc):
            if type_hint is None:
                raise self.error(f"a call to extern({json.dumps(callee.symbol)}) needs its result type "
                                 "on its binding: '%name: <type> = extern(...)(...)'", token)
            return Call(callee, args, attrs, type_=type_hint)
        callee_type = callee.type
        if not isinstance(callee_type, FuncType):
            raise self.error(f"cannot call a value of type {callee_type}", token)
        arg_types = [arg.type for arg in args]
        if tuple(arg_types) != callee_type.params:
            if isinstance(callee, GlobalVar):
                callee_text = "@" + callee.name
            elif isinstance(callee, Var):
                callee_text = "%" + callee.name_hint
            else:
                callee_text = "the function"
            raise self.error(f"{callee_text} takes ({', '.join(map(str, callee_type.params))}) but is "
                             f"called with ({', '.join(map(str, arg_types))})", token)
        return Call(callee, args, attrs)


_WORD_VALUES = {"true": True, "false": False, "none": None, "inf": math.inf, "nan": math.nan}
