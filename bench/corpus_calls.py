"""Calls a run makes, per corpus model, read off the partitioned module: no GPU, no compile.

    python3 bench/corpus_calls.py [--config cuda_sm90] [--out bench/results/corpus_calls.json]
    PYTHONPATH=<another checkout> python3 bench/corpus_calls.py --out before.json   (that byoc)
    python3 bench/corpus_calls.py --compare before.json after.json --md bench/results/corpus_calls.md

Each tiny corpus model (tests/corpus/<model>/<exporter>.onnx, at its inputs.npz shapes) is
lowered with byoc.pipeline.lower up to the partition stage for the config, and the calls of
backend functions in main are counted: every call but the built-in reshapes (views), and
among them the built-in functions that only move data (copies: transposes, slices, concats,
pads, broadcasts, strided layout chains). Counted from the module itself, not the
partition report, so that a checkout older than the report's count can be measured the
same way. The tiny models' head dims (16) keep attention unfused on cuda: the counts show
what the passes and the built-in backend do, not a full-size model's kernel count.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"
VIEW_COMPOSITES = ("builtin.reshape",)
COPY_COMPOSITES = ("builtin.layout", "builtin.transpose", "builtin.strided_slice", "builtin.concat",
                   "builtin.concat_views", "builtin.pad", "builtin.broadcast_to", "builtin.tile")


def count_calls(mod) -> dict:
    from byoc.ir.expr import Call, GlobalVar
    composite = {name: str(f.attrs.get("Composite", "")) for name, f in mod.functions.items()
                 if "Compiler" in f.attrs}
    calls = copies = 0
    for binding in mod["main"].bindings:
        value = binding.value
        if isinstance(value, Call) and isinstance(value.op, GlobalVar) and value.op.name in composite:
            kind = composite[value.op.name]
            calls += kind not in VIEW_COMPOSITES
            copies += kind in COPY_COMPOSITES
    return {"calls": calls, "copies": copies}


def measure(config_name: str) -> dict:
    import byoc
    from byoc.config import load_config
    from byoc.pipeline import lower
    config = load_config(config_name, overrides={"tuning": {"profile": False}})
    rows = {}
    for model_dir in sorted(p for p in CORPUS.iterdir() if (p / "inputs.npz").is_file()):
        with np.load(model_dir / "inputs.npz") as data:
            shapes = {k: tuple(v.shape) for k, v in data.items()}
        for path in sorted(model_dir.glob("*.onnx")):
            key = f"{model_dir.name}:{path.stem}"
            start = time.perf_counter()
            try:
                mod = lower(str(path), config, until="partition", input_shapes=shapes)
                rows[key] = count_calls(mod)
            except Exception as error:  # noqa: BLE001 - a row says why it has no count
                rows[key] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            print(f"{key}: {rows[key]} ({time.perf_counter() - start:.1f} s)", flush=True)
    return {"config": config_name, "byoc": str(Path(byoc.__file__).parent), "rows": rows}


def compare(before: dict, after: dict) -> str:
    lines = [f"# Calls a run makes, corpus models ({after['config']}, partitioned, no GPU)", "",
             "`bench/corpus_calls.py`: the tiny corpus models (`tests/corpus/`) lowered to the partition stage; calls "
             "of backend functions in main (views left out) and the copies among them. Tiny head dims keep attention "
             "unfused: this measures the passes and the built-in backend, not a full-size model's kernels.", "",
             "| model:exporter | calls before | calls after | copies before | copies after |", "|---|---|---|---|---|"]
    totals = [0, 0, 0, 0]
    for key in sorted(after["rows"]):
        old, new = before["rows"].get(key, {}), after["rows"][key]
        if "calls" not in old or "calls" not in new:
            lines.append(f"| {key} | {old.get('calls', old.get('error', '-'))} | {new.get('calls', new.get('error'))} "
                         f"| - | - |")
            continue
        values = [old["calls"], new["calls"], old["copies"], new["copies"]]
        totals = [t + v for t, v in zip(totals, values)]
        lines.append(f"| {key} | " + " | ".join(str(v) for v in values) + " |")
    lines.append(f"| **total** | **{totals[0]}** | **{totals[1]}** | **{totals[2]}** | **{totals[3]}** |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cuda_sm90")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "corpus_calls.json"))
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE_JSON", "AFTER_JSON"))
    parser.add_argument("--md", help="with --compare: the markdown table's path")
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        text = compare(before, after)
        if args.md:
            Path(args.md).write_text(text)
        print(text)
        return
    result = measure(args.config)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
