"""End-to-end benchmark: byoc builds vs PyTorch eager and torch.compile, same GPU, same run.

    python bench/run_models.py --models bert_base resnet50 --configs cuda_sm90_builtin cuda_sm90 --out DIR

Each model is written in plain torch (bench/models.py), exported to ONNX (float32), built
by byoc with each config, checked against the float32 torch output (max error relative to
the output's max magnitude), and timed (CUDA events around 50 runs after warm-up).
Writes DIR/models.json and DIR/models.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402

SETTINGS = {"bert_base": {"batch": 8, "shape": (8, 128)}, "resnet50": {"batch": 32, "shape": (32, 3, 224, 224)}}


def example_input(name, device):
    shape = SETTINGS[name]["shape"]
    generator = torch.Generator().manual_seed(1)
    if name == "bert_base":
        return torch.randint(0, 30522, shape, generator=generator).to(device)
    return torch.randn(shape, generator=generator).to(device)


def time_cuda(fn, repeat=50, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / repeat


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["bert_base", "resnet50"])
    parser.add_argument("--configs", nargs="+", default=["cuda_sm90_builtin"])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--workdir", default="/tmp/byoc-bench")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args()
    import byoc
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    rows = []
    for name in args.models:
        model = models.make(name)
        example = example_input(name, "cpu")
        onnx_path = Path(args.workdir) / f"{name}.onnx"
        onnx_path.parent.mkdir(parents=True, exist_ok=True)
        models.export(model, example, str(onnx_path))
        model = model.to(device)
        x = example.to(device)
        with torch.no_grad():
            reference = model(x).float()
            half = models.make(name).to(device).half()
            xh = x if name == "bert_base" else x.half()
            eager_ms = time_cuda(lambda: half(xh))
            compiled_ms = None
            if not args.no_compile:
                compiled = torch.compile(half)
                compiled(xh)
                compiled_ms = time_cuda(lambda: compiled(xh))
        row = {"model": name, "batch": SETTINGS[name]["batch"], "torch_eager_fp16_ms": round(eager_ms, 3),
               "torch_compile_fp16_ms": round(compiled_ms, 3) if compiled_ms else None, "byoc": {}}
        for config in args.configs:
            start = time.perf_counter()
            library = byoc.build(onnx_path, config=config, workdir=str(Path(args.workdir) / f"{name}_{config}"),
                                 input_shapes={"input": tuple(x.shape)})
            build_s = time.perf_counter() - start
            module = library.load()
            got = module.run(input=x)
            error = float((got.float() - reference).abs().max() / reference.abs().max())
            byoc_ms = time_cuda(lambda: module.run(input=x, out=[got]))
            row["byoc"][config] = {"ms": round(byoc_ms, 3), "max_rel_error": error, "build_s": round(build_s, 1),
                                   "backends": library.metadata["backends"],
                                   "memory": library.metadata["memory"]}
            print(name, config, row["byoc"][config], flush=True)
        print(name, "torch eager", eager_ms, "compile", compiled_ms, flush=True)
        rows.append(row)
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "torch": torch.__version__, "rows": rows}
    (out / "models.json").write_text(json.dumps(result, indent=2))
    lines = [f"# End-to-end models ({result['device']}, {result['date']}, torch {result['torch']})", "",
             "| model | batch | torch eager fp16 (ms) | torch.compile fp16 (ms) | byoc config | byoc (ms) | max rel. error |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        for config, entry in row["byoc"].items():
            lines.append(f"| {row['model']} | {row['batch']} | {row['torch_eager_fp16_ms']} | "
                         f"{row['torch_compile_fp16_ms']} | {config} | {entry['ms']} | {entry['max_rel_error']:.2e} |")
    (out / "models.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
