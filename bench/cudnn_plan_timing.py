"""How long the cudnn backend's plan timing takes for a real model's convs, its plans built
in threads (the default) against one at a time, and whether both choose alike:

    python bench/cudnn_plan_timing.py efficientnet_b0 --batch 32 --convs 24

The model is a torchvision one (random weights, eval mode, exported with dynamo=False),
lowered for `cuda -arch=sm_90` in float16 with cudnn alone; its distinct convs are timed
by backends/cudnn/plans.py's child process, once per thread count, each in a process of
its own (cuDNN keeps what it compiled within a process)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def log(*parts):
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def model_convs(name: str, batch: int, workdir: Path) -> tuple:
    import byoc
    from byoc.backends.cudnn import plans
    from byoc.backends.cudnn.codegen import conv_description
    from byoc.ir.expr import Function
    from byoc.pipeline import lower
    path = Path(name)
    if path.suffix != ".onnx":
        import torch
        import torchvision
        model = getattr(torchvision.models, name)().eval()
        path = workdir / f"{name}.onnx"
        torch.onnx.export(model, (torch.randn(batch, 3, 224, 224),), str(path), opset_version=17, dynamo=False,
                          input_names=["x"])
    config = {"target": "cuda -arch=sm_90", "backends": ["cudnn"], "precision": "float16"}
    partitioned = lower(str(path), config, until="partition", workdir=str(workdir / "lowered"))
    target = byoc.target.Target("cudnn")
    target.device = byoc.target.Target("cuda -arch=sm_90")
    target.workdir = str(workdir)
    convs = {}
    for symbol, func in partitioned.functions.items():
        if isinstance(func, Function) and func.attrs.get("Compiler") == "cudnn":
            conv = conv_description(symbol, func, target)
            convs.setdefault(plans.plan_key(conv, "any"), conv)
    return list(convs.values()), target


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a torchvision.models name, e.g. efficientnet_b0, or an .onnx file")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--convs", type=int, help="time only the first N distinct convs")
    parser.add_argument("--threads", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--out", help="a JSON file for the results")
    args = parser.parse_args()
    from byoc.backends.cudnn import plans
    with tempfile.TemporaryDirectory(prefix="byoc-plan-timing-") as scratch:
        workdir = Path(scratch)
        convs, target = model_convs(args.model, args.batch, workdir)
        log(f"{args.model} b{args.batch}: {len(convs)} distinct cudnn convs")
        convs = convs[:args.convs] if args.convs else convs
        started = time.perf_counter()
        library = plans.probe_library(target)
        log(f"engine library ready in {time.perf_counter() - started:.1f} s")
        request = workdir / "convs.json"
        request.write_text(json.dumps([{name: conv[name] for name in plans._SHAPE_FIELDS} for conv in convs]))
        results = {}
        for threads in args.threads:
            answer = workdir / f"timings_{threads}.jsonl"
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "byoc.backends.cudnn.plans", str(library), str(request),
                                   str(answer)], capture_output=True, text=True,
                                  env={**os.environ, "BYOC_CUDNN_PLAN_THREADS": str(threads),
                                       "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
            seconds = time.perf_counter() - started
            lines = [json.loads(line) for line in answer.read_text().splitlines()] if answer.is_file() else []
            best = {index: min(timed, key=lambda t: t[1]) if timed else None for index, timed, *_ in lines}
            results[threads] = {"seconds": round(seconds, 2), "best": best, "returncode": done.returncode}
            log(f"{threads} threads: {len(convs)} convs in {seconds:.1f} s (exit {done.returncode}) "
                f"{done.stderr.strip()[-300:]}")
        if len(results) == 2:
            (a, first), (b, second) = results.items()
            same = sum(1 for i in first["best"] if first["best"][i] and second["best"].get(i) and
                       first["best"][i][0] == second["best"][i][0])
            ratios = [first["best"][i][1] / second["best"][i][1] for i in first["best"]
                      if first["best"][i] and second["best"].get(i)]
            log(f"same engine chosen for {same} of {len(convs)} convs; best time {a} threads / {b} threads: "
                f"median {sorted(ratios)[len(ratios) // 2]:.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}"
                if ratios else "nothing to compare")
        if args.out:
            Path(args.out).write_text(json.dumps({"model": args.model, "batch": args.batch, "convs": len(convs),
                                                  "results": {str(k): v for k, v in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
