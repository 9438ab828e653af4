"""Reading JSON that users hand byoc: a build's metadata.json (byoc report), tuning
databases (byoc tuning, builds), a library's embedded metadata (byoc inspect, load).

json.load on such a file trusts it in ways a damaged or hostile one defeats:
  - a FIFO blocks open() until a writer comes (forever); /dev/zero is read until memory
    runs out: only a regular file is read, opened non-blocking, up to a size limit;
  - JSON nested 10^5 deep makes json.loads recurse past Python's stack (RecursionError):
    the nesting is measured first, without recursion;
  - an integer of 5,000 digits is a ValueError inside json.loads, one of 400 digits parses
    and then overflows float() in whatever formats it: integers are limited to 20 digits
    (an int64 or uint64 holds every size byoc writes);
  - NaN, Infinity and 1e400 (which float() makes inf) are no measurement: numbers must be
    finite.
Every refusal is the caller's byoc error class, naming the file and what was expected.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat

from .errors import ByocError, ConfigError

MAX_JSON_BYTES = 256 << 20   # a tuning database of thousands of problems takes a few MB
MAX_JSON_DEPTH = 64          # byoc's own files nest less than 10 deep
MAX_INTEGER_DIGITS = 20      # 2**64 has 20 digits

# A JSON string (escapes included), and the brackets left once strings are removed: the
# nesting is counted on those, so a bracket inside a name does not count.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class _Refused(ValueError):
    """Raised from json's parse hooks; becomes the caller's error with the file's name."""


def nesting_depth(text: str, limit: int) -> int:
    """How deep the arrays and objects of JSON `text` nest, counted up to `limit` + 1
    (enough to refuse it) without recursion. For text that is not JSON the count may be
    off, but json.loads then stops at the same point the count did."""
    depth = deepest = 0
    for bracket in _BRACKET.finditer(_JSON_STRING.sub("", text)):
        if bracket.group() in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def _integer(digits: str) -> int:
    count = len(digits.lstrip("-"))
    if count > MAX_INTEGER_DIGITS:
        raise _Refused(f"an integer of {count} digits ({digits[:12]}...); expected at most {MAX_INTEGER_DIGITS} "
                       f"digits (byoc writes sizes and counts of 64 bits)")
    return int(digits)


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:24]} is not finite as a 64-bit float; expected a finite number")
    return value


def _constant(name: str):
    raise _Refused(f"{name} is no number; expected a finite number")


def parse_json(text, where: str, what: str, error: type[ByocError] = ConfigError, advice: str = "",
               max_depth: int = MAX_JSON_DEPTH):
    """The JSON document `text` (str, or UTF-8 bytes) from `where` (the file's name), which
    should be `what` ("a tuning database"); anything else is `error` naming `where`."""
    def refuse(problem: str):
        return error(f"{where}: cannot read it as {what}: {problem}{'; ' + advice if advice else ''}")

    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as decode_error:
            raise refuse(f"not valid UTF-8 JSON ({decode_error.reason} at byte {decode_error.start})") from None
    depth = nesting_depth(text, max_depth)
    if depth > max_depth:
        raise refuse(f"its JSON nests more than {max_depth} levels deep; expected at most {max_depth}")
    try:
        return json.loads(text, parse_int=_integer, parse_float=_number, parse_constant=_constant)
    except _Refused as refused:
        raise refuse(str(refused)) from None
    except ValueError as invalid:  # json.JSONDecodeError: says where
        raise refuse(f"not valid UTF-8 JSON ({invalid})") from None
    except RecursionError:  # only where the caller's stack is already deep: the depth was checked
        raise refuse("its JSON nests too deep for this process's stack") from None


def _kind_of(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "something else"


def read_json(path, what: str, error: type[ByocError] = ConfigError, advice: str = "",
              max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """The JSON document in file `path`, which should be `what`: a regular file of at most
    `max_bytes`, nested at most `max_depth` deep, with bounded integers and finite numbers;
    anything else (a FIFO, a device, a directory, a missing file) is `error` naming `path`."""
    where = str(path)

    def refuse(problem: str):
        return error(f"{where}: cannot read it as {what}: {problem}{'; ' + advice if advice else ''}")

    try:
        # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer (it is
        # then refused by its type); reading a regular file is unaffected
        descriptor = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
                             | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError) as open_error:  # ValueError: a NUL byte in the path
        raise refuse(getattr(open_error, "strerror", None) or str(open_error)) from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise refuse(f"it is {_kind_of(info.st_mode)}, not a regular file; expected a JSON file")
        if info.st_size > max_bytes:
            raise refuse(f"it has {info.st_size} bytes; expected at most {max_bytes}")
        chunks, size = [], 0
        while size <= max_bytes:  # the size stat gave may be stale (a file still growing)
            chunk = os.read(descriptor, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise refuse(f"it has more than {max_bytes} bytes; expected at most {max_bytes}")
    except OSError as read_error:
        raise refuse(read_error.strerror or str(read_error)) from None
    finally:
        os.close(descriptor)
    return parse_json(b"".join(chunks), where, what, error, advice, max_depth)


def write_json_whole(path, document) -> None:
    """Write `document` to `path` as indented JSON through a temporary file of this process
    and thread beside it, replaced into place: a reader (or another build saving the same
    file at once) sees the old file or the new one, never part of one. Raises OSError, the
    temporary file removed."""
    import contextlib
    import threading
    from pathlib import Path
    path = Path(path)
    text = json.dumps(document, indent=1, sort_keys=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text + "\n")
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):  # (a path through a file cannot be removed either)
            temporary.unlink(missing_ok=True)
        raise
