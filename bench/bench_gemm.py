"""byoc's GEMMs vs cuBLAS (torch.matmul) on BERT-base's GEMMs, same GPU, same run.

    python bench/bench_gemm.py --out DIR [--no-cutlass] [--no-cublaslt] [--no-pdl] [--compare-launch]
                               [--retune KEY...]

For each GEMM (M=1024; N x K = 2304x768, 768x768, 3072x768, 768x3072, fp16, fp32
accumulate):
- cutlass: byoc's tuner compiles its candidates and times them (CUDA events around
  calls of the extern "C" entry captured into one CUDA graph, best of 5 replays); the
  fastest is kept (problems the tuning database already has keep its kernel), and the
  chosen kernels are timed again the same way in this run: that time is the one reported
  (the tuning time is kept as cutlass_tuned_us). The kernels launch with programmatic
  dependent launch (the cutlass target's pdl; --no-pdl: without), so one call's start
  overlaps the previous one's end.
- cublaslt: a one-GEMM model is built with the JSON-runtime backend (timed algorithm
  selection at create()) and its module.run is captured 20 times into a CUDA graph, so
  the time is GPU time, not Python overhead; the engine's Init time is reported.
- torch.matmul is timed both ways (back-to-back with events, and captured into a CUDA
  graph) and the faster is kept, so the baseline is cuBLAS at its best.
Fused variants (bias+gelu, bias+residual) are compared with torch.matmul followed by the
epilogue as separate kernels. Writes DIR/gemm.json and DIR/gemm.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def time_cuda(fn, repeat=100, warmup=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        stop.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(stop) * 1000 / repeat)
    return best


def time_cuda_graph(fn, calls=20, replays=20):
    """GPU time per call (us) of `fn` captured `calls` times into one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        stop.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(stop) * 1000 / (replays * calls))
    return best


def best_time(fn):
    return min(time_cuda(fn), time_cuda_graph(fn))


def gemm_module(problem, workdir):
    """A one-GEMM byoc model (a @ W (+bias)(gelu)(+residual), fp16) built with cublaslt."""
    import numpy as np
    import byoc
    from byoc.ir import FunctionBuilder
    rng = np.random.default_rng(0)
    with FunctionBuilder("main") as fb:
        a = fb.param("a", (problem.m, problem.k), "float16")
        y = fb.call("matmul", a, (rng.standard_normal((problem.k, problem.n)) * 0.05).astype("float16"))
        if problem.has_bias:
            y = fb.call("add", y, (rng.standard_normal(problem.n) * 0.1).astype("float16"))
        if problem.activation == "gelu":
            y = fb.call("gelu", y)
        if problem.has_residual:
            y = fb.call("add", y, fb.param("r", (problem.m, problem.n), "float16"))
        fb.ret(y)
    config = {"target": "cuda -arch=sm_90", "backends": [{"cublaslt": {"timed_selection": True}}],
              "cuda_graph": False}
    library = byoc.build(fb.module(), config=config, workdir=str(workdir))
    start = time.perf_counter()
    module = library.load()
    init_s = time.perf_counter() - start
    return module, init_s, library.metadata["backends"]


def write_results(out: Path, rows: list, no_pdl: bool) -> None:
    """gemm.json and gemm.md in `out`, and the table on stdout."""
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "torch": torch.__version__, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm.json").write_text(json.dumps(result, indent=2))
    launch = "without" if no_pdl else "with"
    other = "with" if no_pdl else "without"
    lines = [f"# byoc GEMMs vs cuBLAS, BERT-base shapes ({result['device']}, {result['date']}, torch {result['torch']})",
             "", "Times in us (GPU time). 'vs' = baseline time / byoc time (>1 means byoc is faster); the "
             "baseline is torch.matmul for plain GEMMs and torch.matmul plus separate epilogue kernels for fused ones. "
             f"CUTLASS kernels launched {launch} programmatic dependent launch (PDL); the 'other launch' columns: "
             f"the same kernel {other} it (--compare-launch).",
             "", "| problem | torch.matmul | unfused baseline | cutlass kernel | cutlass | cutlass vs matmul | "
             "cutlass vs unfused | cutlass, other launch | other launch vs matmul | cublaslt engine | "
             "cublaslt vs matmul | cublaslt vs unfused | cublaslt init (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def cell(key, suffix=""):
            return f"{r[key]}{suffix}" if r.get(key) is not None else "-"
        lines.append(f"| {r['problem']} | {r['cublas_matmul_us']} | {cell('unfused_baseline_us')} | "
                     f"{cell('cutlass_kernel')} | {cell('cutlass_us')} | {cell('cutlass_vs_cublas_matmul', 'x')} | "
                     f"{cell('cutlass_vs_unfused', 'x')} | {cell('cutlass_other_launch_us')} | "
                     f"{cell('cutlass_other_launch_vs_cublas_matmul', 'x')} | {cell('cublaslt_us')} | "
                     f"{cell('cublaslt_vs_cublas_matmul', 'x')} | {cell('cublaslt_vs_unfused', 'x')} | "
                     f"{cell('cublaslt_init_s')} |")
    (out / "gemm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--workdir", default="/tmp/byoc-gemm")
    parser.add_argument("--tuning-db", help="where the CUTLASS tuning database is kept (default: in --workdir)")
    parser.add_argument("--no-cutlass", action="store_true")
    parser.add_argument("--no-cublaslt", action="store_true")
    parser.add_argument("--no-pdl", action="store_true",
                        help="time the CUTLASS kernels launched without programmatic dependent launch")
    parser.add_argument("--compare-launch", action="store_true",
                        help="also time each chosen CUTLASS kernel launched the other way (with / without PDL)")
    parser.add_argument("--retune", nargs="*", default=[], metavar="KEY",
                        help="problems (tuning keys, or parts of them) to tune again although the "
                             "database has them: the rest keep their measured kernel and time")
    return parser.parse_args()


def main():
    args = parse_args()
    from byoc.backends.cutlass.codegen import cutlass_flags
    from byoc.backends.cutlass.kernels import GemmProblem
    from byoc.backends.cutlass.tuning import TuningDatabase, choose_kernels, time_kernels
    from byoc.target import Target
    m = 1024
    shapes = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]
    problems = []
    for n, k in shapes:
        problems.append(GemmProblem(m, n, k, 1, "float16", False))
        if n == 3072:
            problems.append(GemmProblem(m, n, k, 1, "float16", False, "gelu", True, False))
        if n == 768:
            problems.append(GemmProblem(m, n, k, 1, "float16", False, None, True, True))
    database = TuningDatabase(args.tuning_db or Path(args.workdir) / "tuning.json")
    for key in list(database.entries.get("sm90", {})):
        if any(part in key for part in args.retune):
            del database.entries["sm90"][key]
    other_launch_us = {}
    if not args.no_cutlass:
        flags = cutlass_flags(Target({"kind": "cutlass", "sm": 90, "pdl": not args.no_pdl}), 90)
        chosen = choose_kernels(problems, 90, database, profile=True, workdir=Path(args.workdir), compile_flags=flags)
        # the chosen kernels timed again in this run (a database entry may come from an earlier one)
        cutlass_us = time_kernels(chosen, 90, Path(args.workdir) / "this_run", flags)
        if args.compare_launch:
            other_flags = cutlass_flags(Target({"kind": "cutlass", "sm": 90, "pdl": args.no_pdl}), 90)
            other_launch_us = time_kernels(chosen, 90, Path(args.workdir) / "other_launch", other_flags)
    rows = []
    for index, problem in enumerate(problems):
        a = torch.randn(m, problem.k, device="cuda", dtype=torch.half)
        b = torch.randn(problem.k, problem.n, device="cuda", dtype=torch.half)
        bias = torch.randn(problem.n, device="cuda", dtype=torch.half)
        residual = torch.randn(m, problem.n, device="cuda", dtype=torch.half)
        matmul_us = best_time(lambda: torch.matmul(a, b))
        if problem.activation == "gelu":
            baseline = lambda: torch.nn.functional.gelu(torch.matmul(a, b) + bias)
            baseline_name = "matmul, then bias+gelu"
        elif problem.has_residual:
            baseline = lambda: torch.matmul(a, b).add_(bias).add_(residual)
            baseline_name = "matmul, then +bias +residual"
        else:
            baseline, baseline_name = None, None
        baseline_us = best_time(baseline) if baseline else None
        reference_us = baseline_us or matmul_us
        flops = 2 * m * problem.n * problem.k
        row = {"problem": problem.key, "cublas_matmul_us": round(matmul_us, 2), "unfused_baseline": baseline_name,
               "unfused_baseline_us": round(baseline_us, 2) if baseline_us else None}
        if not args.no_cutlass:
            entry = database.entries["sm90"][problem.key]
            us = cutlass_us[problem]
            if us is None:
                raise SystemExit(f"{entry['name']} failed when timed again for {problem.key}")
            row.update({"cutlass_kernel": entry["name"], "cutlass_us": us, "cutlass_tuned_us": entry["us"],
                        "cutlass_vs_cublas_matmul": round(matmul_us / us, 3),
                        "cutlass_vs_unfused": round(reference_us / us, 3) if baseline_us else None,
                        "cutlass_tflops": round(flops / us / 1e6, 1), "cutlass_candidates_us": entry["measured"]})
            if problem in other_launch_us:
                other = other_launch_us[problem]
                row.update({"cutlass_launch": "without PDL" if args.no_pdl else "PDL",
                            "cutlass_other_launch_us": other,
                            "cutlass_other_launch_vs_cublas_matmul": round(matmul_us / other, 3) if other else None})
        if not args.no_cublaslt:
            module, init_s, backends = gemm_module(problem, Path(args.workdir) / f"cublaslt_{index}")
            y = torch.empty(m, problem.n, device="cuda", dtype=torch.half)
            inputs = {"a": a, **({"r": residual} if problem.has_residual else {})}
            engine_us = best_time(lambda: module.run(**inputs, out=[y]))
            row.update({"cublaslt_us": round(engine_us, 2), "cublaslt_init_s": round(init_s, 3), "cublaslt_build_backends": backends,
                        "cublaslt_vs_cublas_matmul": round(matmul_us / engine_us, 3),
                        "cublaslt_vs_unfused": round(reference_us / engine_us, 3) if baseline_us else None})
            del module
        rows.append(row)
        print(row, flush=True)
    write_results(Path(args.out), rows, no_pdl=args.no_pdl)


if __name__ == "__main__":
    main()
