"""End-to-end benchmark: byoc builds vs PyTorch eager and torch.compile, same GPU, same run.

    python bench/run_models.py --cases bert_base:8 resnet50:32 mlp:1=cuda_sm90,cuda_sm90:nograph \
        --configs cuda_sm90_builtin cuda_sm90 --out DIR

A case is model:batch, optionally =config,config to use other configs than --configs.
Each model is written in plain torch (bench/models.py), exported to ONNX (float32), built
by byoc with each config (`name:nograph` is that config with cuda_graph off), checked
against the float32 torch output (max error relative to the output's max magnitude), and
timed with CUDA events (median of 5 rounds after warm-up). torch runs in fp16 eager,
torch.compile default and torch.compile mode="reduce-overhead" (CUDA graphs). The byoc
module is called with the same input tensor object each time and writes into a
preallocated output, as a serving loop would. Writes DIR/models.json and DIR/models.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

SAMPLE_SHAPE = {"bert_base": lambda batch: (batch, 128), "resnet50": lambda batch: (batch, 3, 224, 224),
                "mlp": lambda batch: (batch, 1024)}


def example_input(name, batch):
    shape = SAMPLE_SHAPE[name](batch)
    generator = torch.Generator().manual_seed(1)
    if name == "bert_base":
        return torch.randint(0, 30522, shape, generator=generator)
    return torch.randn(shape, generator=generator)


def time_cuda(fn, repeat=50, warmup=10, rounds=5, warm_s=0.5):
    """Median over `rounds` of the mean time of `repeat` back-to-back calls (ms), after at
    least `warmup` calls and `warm_s` seconds of them: a GPU that idled through a build or a
    torch.compile runs its first few hundred milliseconds of work at lower clocks, which
    would otherwise be charged to whichever contestant is timed first."""
    import time
    start = time.perf_counter()
    calls = 0
    while calls < warmup or time.perf_counter() - start < warm_s:
        fn()
        calls += 1
        if calls % 10 == 0:
            torch.cuda.synchronize()  # the seconds are of GPU work, not of queueing
    torch.cuda.synchronize()
    means = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        stop.record()
        torch.cuda.synchronize()
        means.append(start.elapsed_time(stop) / repeat)
    return statistics.median(means)


def load_config(spec, tuning_db=None, profile="auto"):
    from byoc.config import load_config as load
    name, _, variant = spec.partition(":")
    overrides = {"nograph": {"cuda_graph": False}, "update": {"cuda_graph": True, "cuda_graph_io": "update"},
                 "graph": {"cuda_graph": True},
                 # cuda_sm90 with CUTLASS's split-K/stream-K kernels among the tuning candidates
                 "split": {"backends": [{"cutlass": {"sm": 90, "split_k": True}}, "cublaslt", "builtin"]},
                 # cuda_sm90 with its CUTLASS GEMMs launched with programmatic dependent launch
                 # (the default since 2026-11-24) and without it
                 "pdl": {"backends": [{"cutlass": {"sm": 90, "pdl": True}}, "cublaslt", "builtin"]},
                 "nopdl": {"target": "cuda -arch=sm_90 -pdl=0",  # the built-in kernels' PDL off too
                           "backends": [{"cutlass": {"sm": 90, "pdl": False}}, "cublaslt", "builtin"]},
                 # the fused attention with 32 queries x 128 keys a block (one pass over 128 keys)
                 # and with 64 x 64 (two passes), whatever the problem's size
                 "att32x128": {"backends": [{"cutlass": {"sm": 90, "attention_tile": "32x128"}}, "cublaslt",
                                            "builtin"]},
                 "att64x64": {"backends": [{"cutlass": {"sm": 90, "attention_tile": "64x64"}}, "cublaslt", "builtin"]},
                 # every CUTLASS kernel measured on this GPU: the shipped database not consulted
                 # (with a fresh BYOC_CACHE_DIR, the persistent one is empty too)
                 "measure": {"backends": [{"cutlass": {"sm": 90, "shipped_tuning": False}}, "cublaslt", "builtin"],
                             "tuning": {"profile": "auto", "tuning_db": None}},
                 # every candidate of every problem compiled and timed with its own epilogue: what
                 # #44 compares a build's run time with (the shipped and persistent databases not read)
                 "measure_all": {"backends": [{"cutlass": {"sm": 90, "shipped_tuning": False, "tuned_epilogue": "own",
                                                           "tuning_candidates": 0}}, "cublaslt", "builtin"],
                                 "tuning": {"profile": "auto", "tuning_db": None}},
                 # the same, each candidate timed with its problem's epilogue proxy
                 "measure_proxy": {"backends": [{"cutlass": {"sm": 90, "shipped_tuning": False,
                                                             "tuned_epilogue": "proxy"}}, "cublaslt", "builtin"],
                                   "tuning": {"profile": "auto", "tuning_db": None}},
                 # measure, timed on one GPU of the host only (tuning_gpus: 1)
                 "measure_1gpu": {"backends": [{"cutlass": {"sm": 90, "shipped_tuning": False, "tuning_gpus": 1}},
                                               "cublaslt", "builtin"],
                                  "tuning": {"profile": "auto", "tuning_db": None}},
                 # the backends chosen per subgraph by measured cost (partition: measured)
                 "measured": {"partition": "measured"},
                 # sm90 kernels with their epilogue taken at run time (one unit per tile, dtype and
                 # layout: with the kernel library of bench/cuda_sm90_runtime.yaml a build compiles none)
                 "runtime": {"backends": [{"cutlass": {"sm": 90, "runtime_epilogue": True}}, "cublaslt", "builtin"]},
                 # the same with the cudnn backend's convs among the candidates
                 "measured_cudnn": {"partition": "measured",
                                    "backends": [{"cutlass": {"sm": 90}}, "cudnn", "cublaslt", "builtin"]},
                 "": {}}[variant]
    if tuning_db:
        overrides["tuning"] = {"profile": {"false": False, "true": True}.get(profile, profile), "tuning_db": tuning_db}
    return load(name, overrides=overrides)


def write_results(out: Path, rows: list) -> None:
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "torch": torch.__version__, "rows": rows}
    (out / "models.json").write_text(json.dumps(result, indent=2))
    lines = [f"# End-to-end models ({result['device']}, {result['date']}, torch {result['torch']})", "",
             "All fp16. Times in ms per run (median of 5 rounds). Error: max |byoc - torch fp32| / max |torch fp32|.",
             "",
             "| model | batch | torch eager | torch.compile | torch.compile reduce-overhead | byoc config | byoc | "
             "byoc, buffers alternating | max rel. error | planned / lower bound / no-reuse (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    mib = 1 << 20
    for row in rows:
        t = row["torch_fp16_ms"]
        for spec, entry in row["byoc"].items():
            if entry.get("ms") is None:
                lines.append(f"| {row['model']} | {row['batch']} | {t['eager']} | {t.get('default', '-')} | "
                             f"{t.get('reduce-overhead', '-')} | {spec} | failed: {entry['error'][:80]} | - | - | - |")
                continue
            memory = entry["memory"] or {}
            plan = (f"{memory.get('planned_bytes', 0) / mib:.1f} / {memory.get('lower_bound_bytes', 0) / mib:.1f} / "
                    f"{memory.get('no_reuse_bytes', 0) / mib:.1f}") if memory else "-"
            lines.append(f"| {row['model']} | {row['batch']} | {t['eager']} | {t.get('default', '-')} | "
                         f"{t.get('reduce-overhead', '-')} | {spec} | {entry['ms']} | "
                         f"{entry.get('ms_alternating_buffers', '-')} | {entry['max_rel_error']:.2e} | "
                         f"{plan} |")
    (out / "models.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def measure_byoc(args, spec, name, batch, onnx_path, x, reference, repeat) -> dict:
    """Build the case with config `spec`, check it against `reference`, and time it: with
    the same buffers every call, and with two input/output buffers taken in turn."""
    import byoc
    config = load_config(spec, args.tuning_db, args.profile)
    start = time.perf_counter()
    library = byoc.build(onnx_path, config=config,
                         workdir=str(Path(args.workdir) / f"{name}_b{batch}_{spec.replace(':', '_')}"),
                         input_shapes={"input": tuple(x.shape)})
    build_s = time.perf_counter() - start
    module = library.load()
    got = module.run(input=x)
    error = float((got.float() - reference).abs().max() / reference.abs().max())
    got.zero_()
    byoc_ms = time_cuda(lambda: module.run(input=x, out=[got]), repeat)
    # and the output of the last timed run (with cuda_graph: a replay)
    error = max(error, float((got.float() - reference).abs().max() / reference.abs().max()))
    # Two input and output buffers taken in turn: what a graph costs when the caller's
    # pointers change on every call (copy: none; update: re-capture)
    buffers = [(x, got), (x.clone(), torch.empty_like(got))]
    turn = [0]

    def alternating():
        turn[0] ^= 1
        source, target = buffers[turn[0]]
        module.run(input=source, out=[target])
    alternating_ms = time_cuda(alternating, repeat)
    error = max(error, float((buffers[1][1].float() - reference).abs().max() / reference.abs().max()))
    return {"ms": round(byoc_ms, 4), "ms_alternating_buffers": round(alternating_ms, 4),
            "max_rel_error": error, "build_s": round(build_s, 1), "backends": library.metadata["backends"],
            "cuda_graph": library.metadata.get("cuda_graph"), "memory": library.memory}


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="+", default=["bert_base:8", "resnet50:32"], help="model:batch")
    parser.add_argument("--configs", nargs="+", default=["cuda_sm90_builtin"])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--workdir", default="/tmp/byoc-bench")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--tuning-db", help="CUTLASS tuning database to start from (problems missing are tuned)")
    parser.add_argument("--merge-from", metavar="MODELS_JSON",
                        help="keep this earlier result's rows for the model:batch cases not run now "
                             "(only when it was measured on the same GPU)")
    parser.add_argument("--profile", default="auto", choices=("auto", "false"),
                        help="false: problems missing from the database take the heuristic's kernel (no tuning)")
    return parser.parse_args()


def main():
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    rows, prepared = [], []
    kept = []
    if args.merge_from and Path(args.merge_from).exists():
        earlier = json.loads(Path(args.merge_from).read_text())
        cases_now = {(c.partition("=")[0].partition(":")[0], int(c.partition("=")[0].partition(":")[2] or 1))
                     for c in args.cases}
        if earlier.get("device") == torch.cuda.get_device_name():
            kept = [row for row in earlier["rows"] if (row["model"], row["batch"]) not in cases_now]
            for row in kept:
                row.setdefault("date", earlier.get("date"))
    rows.extend(kept)
    # Phase 1: every case's torch eager and byoc numbers; phase 2: torch.compile for every
    # case (its compiles are slow, so a run cut short still keeps the byoc numbers).
    for case in args.cases:
        case, _, case_configs = case.partition("=")  # model:batch[=config,config...]
        name, _, batch = case.partition(":")
        batch = int(batch or 1)
        configs = case_configs.split(",") if case_configs else args.configs
        model = models.make(name)
        example = example_input(name, batch)
        onnx_path = Path(args.workdir) / f"{name}_b{batch}.onnx"
        onnx_path.parent.mkdir(parents=True, exist_ok=True)
        models.export(model, example, str(onnx_path))
        model = model.to(device)
        x = example.to(device)
        repeat = 200 if batch == 1 else 50
        with torch.no_grad():
            reference = model(x).float()
            half = models.make(name).to(device).half()
            xh = x if name == "bert_base" else x.half()
            eager_ms = time_cuda(lambda: half(xh), repeat)
        del model
        row = {"model": name, "batch": batch, "date": datetime.date.today().isoformat(),
               "torch_fp16_ms": {"eager": round(eager_ms, 4)}, "byoc": {}}
        rows.append(row)
        prepared.append((row, half, xh, repeat))
        print(case, "torch", row["torch_fp16_ms"], flush=True)
        for spec in configs:
            try:
                row["byoc"][spec] = measure_byoc(args, spec, name, batch, onnx_path, x, reference, repeat)
            except Exception as exc:  # one failing config must not lose the others' numbers
                row["byoc"][spec] = {"ms": None, "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
                print(case, spec, "FAILED", row["byoc"][spec]["error"], flush=True)
                write_results(out, rows)
                continue
            print(case, spec, {k: v for k, v in row["byoc"][spec].items() if k != "memory"}, flush=True)
            write_results(out, rows)  # after every measurement, so a run cut short keeps what it measured
        del reference
    if args.no_compile:
        return
    for row, half, xh, repeat in prepared:
        with torch.no_grad():
            for mode in ("default", "reduce-overhead"):
                torch._dynamo.reset()
                compiled = torch.compile(half, mode=mode)
                for _ in range(3):
                    compiled(xh)
                row["torch_fp16_ms"][mode] = round(time_cuda(lambda: compiled(xh), repeat), 4)
                print(row["model"], row["batch"], "torch.compile", mode, row["torch_fp16_ms"][mode], flush=True)
                write_results(out, rows)


if __name__ == "__main__":
    main()
