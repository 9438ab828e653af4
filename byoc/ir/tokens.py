"""The text format's tokens: the tokenizer, the cursor over its tokens that the parser
(byoc.ir.parser) reads with (look-ahead, expectations that raise a ParseError naming the
line and column, the nesting limit), and literal values as arrays.

Nesting is limited to MAX_NESTING levels: brackets and parentheses in the text (tuples,
call arguments, lists, `Tuple[...]`/`Fn[...]` types, nested `fn`), and the depth of what
the parser builds. The parser, the printer and structural hashing and equality recurse
once or a few times per level, so this keeps whatever parses printable and comparable
under Python's default recursion limit of 1000 frames."""
from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from ..errors import ParseError
from .types import numpy_dtype

# The deepest nesting the parser accepts (see the module docstring). A nested `fn` costs
# the parser five frames and the printer four per level, plus two per level of the types
# it prints; 100 levels stay well inside 1000 frames even when called from a deep stack.
MAX_NESTING = 100

# ---------------------------------------------------------------- tokens

# Kinds of tokens.
LOCAL, GLOBAL, NAME, INT, FLOAT, STRING, PUNCT, END = (
    "local", "global", "name", "int", "float", "string", "punct", "end")

# A JSON string on one line; the unrolled loop keeps huge metadata strings fast to match.
_STRING = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'

_TOKEN = re.compile(rf"""
    (?P<space>[ \t\r\n]+ | \#[^\n]*)
  | (?P<local>%[A-Za-z0-9_]+)
  | (?P<global>@(?:[A-Za-z_][A-Za-z0-9_]*|{_STRING}))
  | (?P<string>{_STRING})
  | (?P<number>-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>->|[()\[\]{{}},=:;.\-])
""", re.VERBOSE)

# After a "." (tuple-get-item) only digits follow, so that `%t.0.1` is two indices and
# not `%t` "." `0.1`.
_INDEX = re.compile(r"[0-9]+")


class Token:
    __slots__ = ("kind", "value", "offset", "text")

    def __init__(self, kind: str, value: Any, offset: int, text: str):
        self.kind = kind
        self.value = value  # the name, number or decoded string; the text for punctuation
        self.offset = offset
        self.text = text

    def describe(self) -> str:
        """How an error message names this token."""
        if self.kind == END:
            return "end of input"
        text = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return repr(text) if self.kind != STRING else text

    def __repr__(self):
        return f"Token({self.kind}, {self.text!r})"


def _location(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, col {column}"


def tokenize(text: str) -> list[Token]:
    """The tokens of `text`, ending with an END token; comments run from `#` to the end
    of the line."""
    tokens: list[Token] = []
    position = 0
    length = len(text)
    while position < length:
        if tokens and tokens[-1].kind == PUNCT and tokens[-1].value == ".":
            match = _INDEX.match(text, position)
            if match:
                tokens.append(Token(INT, int(match.group()), position, match.group()))
                position = match.end()
                continue
        match = _TOKEN.match(text, position)
        if match is None:
            character = text[position]
            if character == '"':
                message = "unterminated string (strings end on the line they start)"
            else:
                message = f"unexpected character {character!r}"
            raise ParseError(f"{_location(text, position)}: {message}")
        kind = match.lastgroup
        token_text = match.group()
        if kind == "space":
            pass
        elif kind == "local":
            tokens.append(Token(LOCAL, token_text[1:], position, token_text))
        elif kind == "global":
            name = token_text[1:]
            if name.startswith('"'):
                name = _decode_string(name, text, position)
            tokens.append(Token(GLOBAL, name, position, token_text))
        elif kind == "string":
            tokens.append(Token(STRING, _decode_string(token_text, text, position), position, token_text))
        elif kind == "number":
            is_float = any(c in token_text for c in ".eE")
            value = _number_value(token_text, is_float, text, position)
            tokens.append(Token(FLOAT if is_float else INT, value, position, token_text))
        elif kind == "name":
            tokens.append(Token(NAME, token_text, position, token_text))
        else:
            tokens.append(Token(PUNCT, token_text, position, token_text))
        position = match.end()
    tokens.append(Token(END, None, length, ""))
    return tokens


def _number_value(token_text: str, is_float: bool, text: str, offset: int):
    shown = token_text if len(token_text) <= 40 else token_text[:37] + "..."
    if is_float:
        value = float(token_text)
        if math.isinf(value):
            # float() gives inf for 1e999; only the word `inf` means infinity.
            raise ParseError(f"{_location(text, offset)}: the number {shown} overflows a 64-bit float "
                             "(write inf for infinity)")
        return value
    try:
        return int(token_text)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        raise ParseError(f"{_location(text, offset)}: the integer {shown} has too many digits "
                         f"({len(token_text.lstrip('-'))})") from None


def _decode_string(token_text: str, text: str, offset: int) -> str:
    try:
        return json.loads(token_text)
    except json.JSONDecodeError as error:
        raise ParseError(f"{_location(text, offset)}: bad string literal: {error.msg}") from None


class TokenCursor:
    """A position in the tokens of `text`, with the bracket nesting around it."""

    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.position = 0
        # How many brackets, parentheses and nested `fn`s enclose the current token.
        self.nesting = 0

    def peek(self, ahead: int = 0) -> Token:
        # `position` never passes the END token, which is last.
        if ahead == 0:
            return self.tokens[self.position]
        return self.tokens[min(self.position + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.position]
        if token.kind != END:
            self.position += 1
        return token

    def error(self, message: str, token: Token | None = None) -> ParseError:
        token = token or self.peek()
        return ParseError(f"{_location(self.text, token.offset)}: {message}")

    def at(self, kind: str, value=None, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == kind and (value is None or token.value == value)

    def at_punct(self, value: str, ahead: int = 0) -> bool:
        return self.at(PUNCT, value, ahead)

    def at_keyword(self, value: str, ahead: int = 0) -> bool:
        return self.at(NAME, value, ahead)

    def expect_punct(self, value: str) -> Token:
        if not self.at_punct(value):
            raise self.error(f"expected {value!r} but found {self.peek().describe()}")
        return self.advance()

    def expect_separator(self, closing: str) -> Token:
        """The "," between items of a list that ends with `closing`."""
        if not self.at_punct(","):
            raise self.error(f"expected ',' or {closing!r} but found {self.peek().describe()}")
        return self.advance()

    def expect_keyword(self, value: str) -> Token:
        if not self.at_keyword(value):
            raise self.error(f"expected {value!r} but found {self.peek().describe()}")
        return self.advance()

    def expect(self, kind: str, what: str) -> Token:
        if not self.at(kind):
            raise self.error(f"expected {what} but found {self.peek().describe()}")
        return self.advance()

    def expect_end(self):
        if not self.at(END):
            raise self.error(f"expected end of input but found {self.peek().describe()}")

    def enter_nesting(self, token: Token):
        """Called at an opening bracket, parenthesis or `fn`; `leave_nesting` at its end."""
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"nesting deeper than {MAX_NESTING} levels", token)

    def leave_nesting(self):
        self.nesting -= 1

    def skip_braces(self):
        """Skip from a "{" to just after its matching "}" (strings hold no brace tokens)."""
        opening = self.expect_punct("{")
        depth = 1
        while depth:
            token = self.advance()
            if token.kind == END:
                raise self.error("expected '}' to close the '{' at "
                                 f"{_location(self.text, opening.offset)} but found end of input", token)
            if token.kind == PUNCT:
                if token.value == "{":
                    depth += 1
                elif token.value == "}":
                    depth -= 1


def literal_to_array(value, dtype: str) -> np.ndarray:
    """The array a `const(value, dtype)` literal stands for; raises ValueError when the
    value does not fit the dtype (a float for an int dtype, an out-of-range number, a
    ragged list)."""
    np_dtype = numpy_dtype(dtype)
    if dtype == "bool":
        allowed, expected = (bool,), "true or false"
    elif np.issubdtype(np_dtype, np.integer):
        allowed, expected = (int,), "integers"
    else:
        allowed, expected = (int, float), "numbers"

    def check(item):
        if isinstance(item, list):
            for element in item:
                check(element)
        elif isinstance(item, bool) and bool not in allowed or not isinstance(item, allowed):
            raise ValueError(f"{dtype} constant holds {_short_repr(item)}; expected {expected}")

    check(value)
    try:
        array = np.array(value, dtype=np_dtype)
    except (OverflowError, ValueError, TypeError) as error:
        raise ValueError(f"{_short_repr(value)} is not a {dtype} constant: {error}") from None
    if np.issubdtype(np_dtype, np.floating) or dtype == "bfloat16":
        # A finite number too large for the dtype would silently become inf.
        exact = np.array(value, dtype=np.float64)
        if np.any(np.isinf(array.astype(np.float64)) & np.isfinite(exact)):
            raise ValueError(f"{_short_repr(value)} is out of range for {dtype}")
    return array


def _short_repr(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
