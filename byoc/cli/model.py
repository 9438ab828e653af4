"""`byoc import` (an ONNX model's IR text) and `byoc ops` (the IR ops and the ONNX op types
that import)."""
from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from .common import EXIT_OK, add_input_shape_option, parse_dims, parse_input_shapes


def import_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("model", help="the ONNX model file")
    add_input_shape_option(parser)
    parser.add_argument("-o", "--output", metavar="OUT.ir",
                        help="write the IR text here instead of printing it")


def import_command(args: argparse.Namespace) -> int:
    from ..frontend import from_onnx

    mod = from_onnx(args.model, input_shapes=parse_input_shapes(args.input_shape), dims=parse_dims(args.dim))
    text = mod.script()
    if args.output:
        Path(args.output).write_text(text if text.endswith("\n") else text + "\n")
        print(f"wrote {args.output}")
    else:
        print(text)
    return EXIT_OK


# ---- byoc ops --------------------------------------------------------------------------

def ops_arguments(parser: argparse.ArgumentParser):
    pass  # no options yet


def ops_command(args: argparse.Namespace) -> int:
    from ..frontend import SUPPORTED_OPS
    from ..ir import get_op, list_ops

    names = list_ops()
    width = max(map(len, names))
    print(f"IR ops ({len(names)}), with category:")
    for name in names:
        op = get_op(name)
        summary = op.doc.strip().splitlines()[0] if op.doc.strip() else ""
        print(f"  {name:<{width}}  {op.category:<9}  {summary}".rstrip())
    onnx_types = sorted(SUPPORTED_OPS)
    print(f"\nONNX op types that import ({len(onnx_types)}, default domain):")
    print(textwrap.fill(", ".join(onnx_types), width=88, initial_indent="  ", subsequent_indent="  "))
    return EXIT_OK


# ---- byoc run ---------------------------------------------------------------------------
