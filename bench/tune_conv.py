"""Tune one conv problem (NHWC, OHWI filters) into a tuning database: every candidate of its
family that can run it is compiled and timed, and the fastest is recorded.

    python3 bench/tune_conv.py --tuning-db backends/cutlass/tuning_sm90.json \\
        --input 32,224,224,4 --filter 64,7,7 --stride 2 --pad 3 --epilogue bias_relu

How a conv the whole-model tuning would reach only with all of a model's problems (ResNet-50
has 23) gets its entry on its own: e.g. the RGB stem, padded to 4 channels by PadConvChannels.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from byoc.backends.cutlass.codegen import cutlass_flags  # noqa: E402
from byoc.backends.cutlass.kernels import ConvProblem, usable_candidates  # noqa: E402
from byoc.backends.cutlass.tuning import TuningDatabase, choose_kernels  # noqa: E402
from byoc.target import Target  # noqa: E402


def ints(text):
    return tuple(int(part) for part in text.split(","))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tuning-db", required=True)
    parser.add_argument("--input", type=ints, required=True, help="N,H,W,C")
    parser.add_argument("--filter", type=ints, required=True, help="K,R,S")
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--pad", type=int, default=0)
    parser.add_argument("--epilogue", default="bias_relu", help="[bias][_residual][_relu]")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--workdir", default="/tmp/byoc-tune-conv")
    args = parser.parse_args()
    (batch, height, width, channels), (out_channels, kernel_h, kernel_w) = args.input, args.filter
    out_h = (height + 2 * args.pad - kernel_h) // args.stride + 1
    out_w = (width + 2 * args.pad - kernel_w) // args.stride + 1
    words = args.epilogue.split("_")
    activation = next((w for w in words if w not in ("bias", "residual", "plain")), None)
    problem = ConvProblem(batch, height, width, channels, out_channels, kernel_h, kernel_w, out_h, out_w,
                          (args.stride,) * 2, (args.pad,) * 4, (1, 1), args.dtype, activation,
                          "bias" in words, "residual" in words)
    database = TuningDatabase(args.tuning_db)
    database.entries.get("sm90", {}).pop(problem.key, None)
    flags = cutlass_flags(Target({"kind": "cutlass", "sm": 90}), 90)
    print(problem.key, "candidates:", [k.name(problem) for k in usable_candidates(90, problem)], flush=True)
    chosen = choose_kernels([problem], 90, database, profile=True, workdir=Path(args.workdir), compile_flags=flags)
    entry = database.entries["sm90"].get(problem.key, {})
    for name, us in sorted(entry.get("measured", {}).items(), key=lambda item: item[1] or 1e9):
        print(f"  {name}: {us} us")
    print("chosen:", chosen[problem].name(problem))


if __name__ == "__main__":
    main()
