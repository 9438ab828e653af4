"""CUTLASS (tuned by byoc) vs cuBLAS (torch.matmul) on BERT-base's GEMMs, same GPU, same run.

    python bench/bench_gemm.py --out DIR

For each GEMM (M=1024; N x K = 2304x768, 768x768, 3072x768, 768x3072, fp16, fp32
accumulate) byoc's cutlass tuner compiles its candidates and times them; torch.matmul is
timed with CUDA events the same way. Fused variants (bias+gelu, bias+residual) are
compared with torch.matmul followed by the epilogue as a separate kernel. Writes
DIR/gemm.json and DIR/gemm.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--workdir", default="/tmp/byoc-gemm")
    args = parser.parse_args()
    from byoc.backends.cutlass.codegen import cutlass_flags
    from byoc.backends.cutlass.kernels import GemmProblem
    from byoc.backends.cutlass.tuning import TuningDatabase, choose_kernels
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
    database = TuningDatabase(Path(args.workdir) / "tuning.json")
    flags = cutlass_flags(Target("cutlass", sm=90), 90)
    chosen = choose_kernels(problems, 90, database, profile=True, workdir=Path(args.workdir), compile_flags=flags)
    rows = []
    for problem in problems:
        entry = database.entries["sm90"][problem.key]
        a = torch.randn(m, problem.k, device="cuda", dtype=torch.half)
        b = torch.randn(problem.k, problem.n, device="cuda", dtype=torch.half)
        bias = torch.randn(problem.n, device="cuda", dtype=torch.half)
        residual = torch.randn(m, problem.n, device="cuda", dtype=torch.half)
        matmul_us = time_cuda(lambda: torch.matmul(a, b))
        if problem.activation == "gelu":
            baseline = lambda: torch.nn.functional.gelu(torch.matmul(a, b) + bias)
            baseline_name = "matmul, then bias+gelu"
        elif problem.has_residual:
            baseline = lambda: torch.matmul(a, b).add_(bias).add_(residual)
            baseline_name = "matmul, then +bias +residual"
        else:
            baseline, baseline_name = None, None
        baseline_us = time_cuda(baseline) if baseline else None
        flops = 2 * m * problem.n * problem.k
        rows.append({"problem": problem.key, "kernel": entry["name"], "cutlass_us": entry["us"],
                     "cublas_matmul_us": round(matmul_us, 2),
                     "speed_vs_cublas_matmul": round(matmul_us / entry["us"], 3),
                     "cutlass_tflops": round(flops / entry["us"] / 1e6, 1),
                     "unfused_baseline": baseline_name,
                     "unfused_baseline_us": round(baseline_us, 2) if baseline_us else None,
                     "speed_vs_unfused": round(baseline_us / entry["us"], 3) if baseline_us else None,
                     "candidates_us": entry["measured"]})
        print(rows[-1]["problem"], rows[-1]["kernel"], entry["us"], "cublas", round(matmul_us, 2), baseline_us, flush=True)
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "torch": torch.__version__, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm.json").write_text(json.dumps(result, indent=2))
    lines = [f"# CUTLASS (byoc-tuned) vs cuBLAS, BERT-base GEMMs ({result['device']}, {result['date']}, torch {result['torch']})",
             "", "| problem | kernel | cutlass (us) | torch.matmul (us) | vs matmul | unfused baseline (us) | vs unfused |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['problem']} | {r['kernel']} | {r['cutlass_us']} | {r['cublas_matmul_us']} | "
                     f"{r['speed_vs_cublas_matmul']}x | {r['unfused_baseline_us'] or '-'} | "
                     f"{str(r['speed_vs_unfused']) + 'x' if r['speed_vs_unfused'] else '-'} |")
    (out / "gemm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
