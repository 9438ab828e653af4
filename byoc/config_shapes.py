"""The sizes a build config gives the model's inputs (config.py's `input_shapes` and `dims`
keys): static shapes by input name, named dims of one size or several (shape buckets, a
program each, at most MAX_SHAPE_BUCKETS), and the 'LOW..HIGH' ranges that list sizes."""
from __future__ import annotations

import re

from .errors import ConfigError
from .ir.types import is_static_shape


def _fail(source, key_path, message):
    from .config import _fail as fail  # one message form for every config key
    fail(source, key_path, message)


# The most programs (shape buckets) one library holds: each is compiled and planned on its own.
MAX_SHAPE_BUCKETS = 16


def _check_bucket_count(source, dims: dict):
    """A ConfigError when `dims` make more than MAX_SHAPE_BUCKETS programs: the product of
    each dim's count of sizes, computed without listing the combinations."""
    listed = {name: len(size) for name, size in dims.items() if isinstance(size, list) and len(size) > 1}
    count, shown_limit = 1, 10 ** 18
    for number in listed.values():
        count *= number
        if count > shown_limit:  # 100,000 dims of two sizes: a number of 30,000 digits says no more
            break
    if count <= MAX_SHAPE_BUCKETS:
        return
    counted = f"{count}" if count <= shown_limit else f"more than {shown_limit:.0e}"
    per_dim = ", ".join(f"{name}: {number}" for name, number in list(listed.items())[:8])
    more = f", and {len(listed) - 8} more dims" if len(listed) > 8 else ""
    raise ConfigError(f"{source}: dims: the sizes listed per dim ({per_dim}{more}) make {counted} shape buckets; "
                      f"expected at most {MAX_SHAPE_BUCKETS} (one per combination of sizes, each a program of its "
                      f"own in the library)")


def _validate_input_shapes(source, shapes) -> dict:
    shapes = {} if shapes is None else shapes
    if not isinstance(shapes, dict):
        _fail(source, "input_shapes", f"{shapes!r} is not a mapping of input name to a list of dims")
    from .user_text import INT64_LIMIT
    for name, dims in shapes.items():
        # bounded: a dim past int64 cannot be a tensor's, and overflows the C side's sizes
        if not is_static_shape(dims) or not all(dim < INT64_LIMIT for dim in dims):
            _fail(source, f"input_shapes.{name}", f"{_shown(dims)} is not a list of non-negative integers below 2**63")
    return {name: tuple(int(dim) for dim in dims) for name, dims in shapes.items()}


def _shown(value, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: a message names the value, not 5,000 of its digits."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _validate_dims(source, dims) -> dict:
    from .user_text import INT64_LIMIT
    dims = {} if dims is None else dims
    if not isinstance(dims, dict):
        _fail(source, "dims", f"{_shown(dims)} is not a mapping of named dim to size, e.g. {{batch: 1}}")

    def is_size(size, lowest):
        return not isinstance(size, bool) and isinstance(size, int) and lowest <= size < INT64_LIMIT
    allowed = ("allowed: a non-negative integer, a list of distinct positive ones (one program per size: shape "
               "buckets), or a range 'LOW..HIGH' with LOW >= 1 (LOW, the powers of two between, HIGH); sizes below "
               "2**63")
    dims = {name: size_range(size) if isinstance(size, str) else size for name, size in dims.items()}
    for name, size in dims.items():
        if not isinstance(name, str):
            _fail(source, f"dims.{_shown(name)}", "the dim's name is not text; expected a named dim, e.g. batch")
        if not isinstance(size, list):
            # one size may be 0: an empty tensor, one program
            if not is_size(size, 0):
                _fail(source, f"dims.{name}", f"{_shown(size)} is not allowed; {allowed}")
            continue
        # a listed size is a shape bucket, into which the sizes below it are padded: no size
        # pads into 0 (the padding analysis divides by it), so each is at least 1
        wrong = next((s for s in size if not is_size(s, 1)), None) if size else None
        if not size or wrong is not None or len(set(size)) != len(size):
            why = "it lists no size" if not size else f"size {_shown(wrong)} is not an integer from 1 to 2**63-1" \
                if wrong is not None else "it lists a size twice"
            _fail(source, f"dims.{name}", f"{_shown(size)} is not allowed ({why}); {allowed}")
    dims = {name: list(size) if isinstance(size, list) else size for name, size in dims.items()}
    _check_bucket_count(source, dims)
    return dims


# LOW..HIGH in ASCII digits ([0-9]: \d matches every script's digits), each an int64 at
# most (19 digits), so that int() never meets thousands of digits
_SIZE_RANGE = re.compile(r"\s*([0-9]{1,19})\s*\.\.\s*([0-9]{1,19})\s*", re.ASCII)


def size_range(text: str):
    """'1..32' -> [1, 2, 4, 8, 16, 32]: shape buckets over a range, its ends and the powers
    of two between (sizes between buckets run padded into the next where the dim allows it);
    `text` itself where it is no range (the caller's check names it)."""
    match = _SIZE_RANGE.fullmatch(text)
    if not match or int(match.group(1)) > int(match.group(2)):
        return text
    low, high = int(match.group(1)), int(match.group(2))
    sizes, power = [low], 1
    while power < high:
        if power > low:
            sizes.append(power)
        power *= 2
    return sizes + ([high] if high != low else [])
