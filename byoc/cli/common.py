"""What the subcommands share: exit codes, UsageError, the --input-shape/--dim options and
their parsing, and the checks of input arrays against a model's interface."""
from __future__ import annotations

import argparse
import re

from ..errors import ByocError
from ..user_text import parse_ascii_integer


EXIT_OK = 0
EXIT_INTERNAL_ERROR = 1
EXIT_USER_ERROR = 2  # the same code argparse uses for a bad command line


class UsageError(ByocError):
    """The command line or a file it names is not what the command expects."""


# ---- shared argument helpers ---------------------------------------------------------

def add_input_shape_option(parser: argparse.ArgumentParser):
    parser.add_argument(
        "--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
        help="static shape of a model input, e.g. input_ids=1,128 (repeat per input; "
             "'NAME=' is a scalar). Needed for inputs with dynamic dims.")
    parser.add_argument(
        "--dim", action="append", default=[], metavar="NAME=SIZE",
        help="size of a named dim in every input that declares it, e.g. batch=1 (repeat per "
             "dim; `byoc inspect MODEL.onnx` lists them); --input-shape wins for its input. "
             "byoc build takes several sizes, e.g. batch=1,8,32: one program per size in one library "
             "(batch=1..32: its ends and the powers of two between)")


def _quoted(text: str, limit: int = 80) -> str:
    """repr(text) (control characters escaped), cut to `limit` characters: a message names
    the argument, not 5,000 of its digits."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def parse_dims(specs: list[str], several: bool = False) -> dict:
    """['batch=1', 'sequence=128'] -> {'batch': 1, 'sequence': 128}; with `several` (byoc
    build: shape buckets) a dim may list sizes, 'batch=1,8,32' -> {'batch': [1, 8, 32]}.
    Sizes are ASCII digits (parse_ascii_integer: str.isdigit() takes '²', which int() then
    refuses); whether a size is allowed (a listed one at least 1) is the config's check."""
    from ..config import size_range
    dims: dict = {}
    for spec in specs:
        name, equals, size = spec.rpartition("=")
        ranged = size_range(size) if several and ".." in size else None
        parts = ranged if isinstance(ranged, list) else size.split(",") if several else [size]
        sizes = [part if isinstance(part, int) else parse_ascii_integer(part) for part in parts]
        if not equals or not name or any(part is None for part in sizes):
            example = "batch=1, or batch=1,8,32 for one program per size, or batch=1..32 (its ends and the " \
                      "powers of two between)" if several else "batch=1"
            raise UsageError(f"--dim {_quoted(spec)}: expected NAME=SIZE with a non-negative integer "
                             f"size in ASCII digits, below 2**63 (for example {example})")
        if name in dims:
            raise UsageError(f"--dim gives {name!r} twice")
        dims[name] = sizes if len(sizes) > 1 else sizes[0]
    return dims


# D1,D2,... in ASCII digits ([0-9], not \d, which matches every script's digits); each is
# then read by parse_ascii_integer, which bounds it
_DIMS_LIST = re.compile(r"[0-9]+(?:[ \t]*,[ \t]*[0-9]+)*")


def parse_input_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """['x=1,8', 'mask=1,8'] -> {'x': (1, 8), 'mask': (1, 8)}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        # the name may itself contain '=' (ONNX names are free text): split at the last one
        name, equals, dims = spec.rpartition("=")
        if not equals or not name:
            raise UsageError(f"--input-shape {_quoted(spec)}: expected NAME=D1,D2,... (for example "
                             f"x=1,8)")
        dims = dims.strip(" \t")
        sizes = [parse_ascii_integer(d) for d in dims.split(",")] if _DIMS_LIST.fullmatch(dims) else [None]
        if dims and any(size is None for size in sizes):
            raise UsageError(f"--input-shape {_quoted(spec)}: the dims must be non-negative integers "
                             f"in ASCII digits, below 2**63, separated by commas (for example {name}=1,8)")
        if name in shapes:
            raise UsageError(f"--input-shape gives {name!r} twice")
        shapes[name] = tuple(sizes) if dims else ()
    return shapes


def count_argument(text: str) -> int:
    """argparse type of a count (--repeat N): ASCII digits only (int() takes '٣' and '1_0')."""
    value = parse_ascii_integer(text, signed=True)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer in ASCII digits below 2**63")
    return value


def check_arrays_fit(inputs_path: str, declared: dict, arrays: dict):
    """A UsageError naming the --inputs file when one of its arrays does not fit the shape
    the model declares for that input (the arrays, not an --input-shape, are wrong)."""
    import numpy as np

    from ..frontend.onnx_model import fits_declared
    for name, array in arrays.items():
        dims = declared.get(name)
        shape = tuple(np.shape(array))
        if dims is not None and not fits_declared(dims, shape):
            raise UsageError(f"--inputs {inputs_path!r}: array {name!r} has shape {shape}; the model declares "
                             f"{tuple(dims)} for that input (a named dim fits any size)")


def model_interface(model_path: str) -> dict | None:
    """The ONNX file's interface (frontend.onnx.describe_model), or None when it cannot be
    read; from_onnx then reports why, in its own words."""
    from ..frontend.onnx import describe_model
    try:
        return describe_model(model_path)
    except ByocError:
        return None


# ---- byoc import -----------------------------------------------------------------------
