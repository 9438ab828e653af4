"""Tune again the database's GEMM problems whose keys contain any of --keys, among the
candidates --tiles allows (all when empty), and write the database back: how new candidate
kernels reach problems that an earlier tuning already settled. A whole key the database
lacks (e.g. the `bias` epilogue of a shape tuned as `plain`) is tuned and added.

    python3 bench/retune_gemms.py --tuning-db backends/cutlass/tuning_sm90.json --keys m128: \\
        --tiles 64x64x64 64x32x64 64x16x64 64x64x128 64x32x128
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from byoc.backends.cutlass.codegen import cutlass_flags  # noqa: E402
from byoc.backends.cutlass.kernels import CandidateFilter, GemmProblem, parse_shape  # noqa: E402
from byoc.backends.cutlass.tuning import TuningDatabase, choose_kernels  # noqa: E402
from byoc.target import Target  # noqa: E402

EPILOGUES = {"plain": (None, False, False), "bias": (None, True, False), "bias_residual": (None, True, True),
             "residual": (None, False, True)}


def problem_from_key(key: str) -> GemmProblem | None:
    """float16:m128:n768:k3072:l1:nn:bias_residual -> its GemmProblem (None for conv keys)."""
    parts = key.split(":")
    if len(parts) != 7 or not parts[1].startswith("m"):
        return None
    dtype, m, n, k, batch, layout, epilogue = parts
    if epilogue in EPILOGUES:
        activation, bias, residual = EPILOGUES[epilogue]
    else:  # [bias_]<activation>[_residual] or [bias_]residual_<activation> (a pointwise conv's)
        words = epilogue.split("_")
        bias, residual = words[0] == "bias", "residual" in words
        activation = "_".join(w for w in words if w not in ("bias", "residual"))
        return GemmProblem(int(m[1:]), int(n[1:]), int(k[1:]), int(batch[1:]), dtype, layout == "nt",
                           activation, bias, residual, residual_in_activation=residual and words[-1] != "residual")
    return GemmProblem(int(m[1:]), int(n[1:]), int(k[1:]), int(batch[1:]), dtype, layout == "nt",
                       activation, bias, residual)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tuning-db", required=True)
    parser.add_argument("--keys", nargs="+", required=True,
                        help="parts of the problem keys to tune again, or whole keys of problems to add")
    parser.add_argument("--tiles", nargs="*", default=[], help="candidate tiles, e.g. 64x32x64 (empty: all)")
    parser.add_argument("--clusters", nargs="*", default=[], help="candidate cluster shapes, e.g. 1x1 (empty: all)")
    parser.add_argument("--split-k", action="store_true", help="also try split-K and stream-K kernels")
    parser.add_argument("--workdir", default="/tmp/byoc-retune")
    parser.add_argument("--no-pdl", action="store_true",
                        help="time the CUTLASS kernels launched without programmatic dependent launch")
    args = parser.parse_args()
    database = TuningDatabase(args.tuning_db)
    entries = database.entries.get("sm90", {})
    # a whole problem key names that problem alone (`...:bias`, not `...:bias_residual` too);
    # a part of a key names every problem whose key contains it
    whole = [part for part in args.keys if problem_from_key(part) is not None]
    parts = [part for part in args.keys if part not in whole]
    problems = [p for p in (problem_from_key(key) for key in list(entries)
                            if key in whole or any(part in key for part in parts)) if p is not None]
    # a whole problem key the database lacks is tuned too (a new epilogue of a known shape)
    problems += [problem_from_key(key) for key in whole if key not in entries]
    for problem in problems:
        entries.pop(problem.key, None)
    allowed = CandidateFilter(tiles=tuple(parse_shape(t, 3, "tiles") for t in args.tiles),
                              clusters=tuple(parse_shape(c, 2, "clusters") for c in args.clusters),
                              split_k=args.split_k)
    flags = cutlass_flags(Target({"kind": "cutlass", "sm": 90, "pdl": not args.no_pdl}), 90)
    chosen = choose_kernels(problems, 90, database, profile=True, workdir=Path(args.workdir), compile_flags=flags,
                            allowed=allowed)
    for problem in problems:
        entry = database.entries["sm90"][problem.key]
        print(f"{problem.key}: {chosen[problem].name(problem)} {entry['us']} us", flush=True)
    database.save()


if __name__ == "__main__":
    main()
