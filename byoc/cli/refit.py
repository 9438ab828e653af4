"""`byoc refit`: a weights file for a built library from new weights (byoc/refit.py)."""
from __future__ import annotations

import argparse

from .common import EXIT_OK


def refit_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("library", help="the built model.so")
    parser.add_argument("model", help="the ONNX model with the new weights (with --weights: the model they go into)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.safetensors",
                        help="where to write the weights file (byoc.load(LIBRARY, weights_path=OUT) runs with it)")
    parser.add_argument("--weights", metavar="W.safetensors|W.npz",
                        help="tensors by initializer name that replace the model's (e.g. a fine-tuned state dict)")
    parser.add_argument("--config", metavar="NAME|PATH.yaml",
                        help="the build config to use instead of the one the library recorded (e.g. the one "
                             "naming the tuning_db the build used)")


def refit_command(args: argparse.Namespace) -> int:
    from ..progress import BuildProgress
    from ..refit import refit
    result = refit(args.library, args.model, output=args.output, weights=args.weights, config=args.config,
                   progress=BuildProgress())
    print(f"wrote {result.path}: {len(result.changed)} of {result.initializers} initializers changed "
          f"(program {result.program_id})")
    return EXIT_OK
