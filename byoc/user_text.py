"""Text that comes from users or from files they hand byoc: integers read from it, and
text shown on a terminal.

Integers: str.isdigit() and int() accept more than a person types as a number --
superscripts ('²' passes isdigit() and then fails int()), other scripts' digits ('٣' is
3), underscores ('1_0' is 10) and thousands of digits (int() refuses more than 4300) --
so sizes and counts are read from ASCII digits only, at most an int64's worth.

Terminal text: a model's names, a tuning database's entries or a library's metadata may
hold escape sequences that move the cursor, retitle the window or hide what follows, or
bidirectional overrides that reorder it; `printable` shows each such character as an
escape instead.
"""
from __future__ import annotations

import re
import unicodedata

# An int64 holds every size and count byoc keeps (tensor dims, run counts).
INT64_LIMIT = 1 << 63

# optional ASCII spaces around, an optional minus, then ASCII digits only ([0-9], not \d,
# which matches every script's decimal digits); the length keeps int() far below its limit
_ASCII_INTEGER = re.compile(r"[ \t]*(-?[0-9]{1,20})[ \t]*")


def parse_ascii_integer(text: str, *, signed: bool = False) -> int | None:
    """`text` as an integer when it is one written in ASCII digits (with a leading '-' if
    `signed`) that fits an int64; None otherwise (the caller names what was expected)."""
    if not isinstance(text, str):
        return None
    match = _ASCII_INTEGER.fullmatch(text)
    if match is None or (match.group(1).startswith("-") and not signed):
        return None
    value = int(match.group(1))
    return value if -INT64_LIMIT <= value < INT64_LIMIT else None


# Unicode's bidirectional embeddings, overrides and isolates: they reorder the text around
# them on screen (a name that reads differently than it is).
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _needs_escape(character: str) -> bool:
    # Cc: C0 and C1 controls and DEL (ESC starts a terminal sequence, 0x9b is a one-byte CSI
    # on some terminals); Zl/Zp: line and paragraph separators, which break a line unseen
    return unicodedata.category(character) in ("Cc", "Zl", "Zp") or character in _BIDI_CONTROLS


def _escape(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text) -> str:
    """`text` (any value, as str() shows it) with every control character shown as an
    escape (\\x1b, \\n, \\u202e): safe to print on a terminal as one line."""
    text = str(text)
    if text.isprintable():  # the common case: nothing to escape (isprintable is stricter)
        return text
    return "".join(_escape(character) if _needs_escape(character) else character for character in text)


def printable_tree(value):
    """A copy of JSON-like `value` (dicts, lists, strings, numbers) with every string in it,
    keys included, made `printable`: for printers that format many fields of untrusted data."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(key): printable_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(printable_tree(item) for item in value)
    return value
