"""Time sm90 GEMM problems with byoc's staged epilogue against CUTLASS's TMA epilogue, each
on the kernel byoc chooses for it (the tuning database's, else the heuristic's) with only the
epilogue changed: the database's GEMM problems, and the GEMM problems of ONNX models given
with --models (as a cuda_sm90 build lowers them) or exported from the real-model zoo with
--export (model:batch, as bench/real_models.py exports them). Writes a table and JSON to --out.

    python3 bench/compare_epilogues.py --export resnet50:32 gpt2:1 --out /tmp/out
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.retune_gemms import problem_from_key  # noqa: E402
from byoc.backends.cutlass import tuning  # noqa: E402
from byoc.backends.cutlass.codegen import cutlass_flags  # noqa: E402
from byoc.backends.cutlass.kernels import GemmProblem, default_kernel  # noqa: E402
from byoc.target import Target  # noqa: E402


def model_problems(path: str) -> list:
    """The GEMM problems a cuda_sm90 build of the model hands the cutlass backend."""
    from byoc.build import _Builder
    from byoc.config import load_config
    seen = []
    original = tuning.choose_kernels

    def recording(problems, *args, **kwargs):
        seen.extend(problems)
        return original(problems, *args, **kwargs)
    tuning.choose_kernels = recording
    try:
        config = dataclasses.replace(load_config("cuda_sm90"), workdir=f"/tmp/byoc-epilogues/{Path(path).stem}")
        _Builder(config).lower(path, None)
    finally:
        tuning.choose_kernels = original
    return [p for p in seen if isinstance(p, GemmProblem)]


def export(case: str, workdir: Path) -> str:
    """bench/real_models.py's export of a real-model case (model:batch), float32 ONNX."""
    import torch
    from bench.real_model_zoo import Wrapper, model_spec
    from bench.real_models import export_onnx
    name, _, batch = case.partition(":")
    make, make_inputs, attribute = model_spec(name)
    torch.manual_seed(0)
    model = make("eager", False).eval()
    inputs = make_inputs(int(batch or 1), False, torch.Generator().manual_seed(1))
    path = workdir / f"{name}_{batch or 1}.onnx"
    workdir.mkdir(parents=True, exist_ok=True)
    export_onnx(Wrapper(model, inputs, attribute).eval(), inputs, path)
    return str(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=[], help="ONNX files")
    parser.add_argument("--export", nargs="*", default=[], help="real-model cases to export, e.g. resnet50:32")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    database, _ = tuning.open_database(None)
    problems = {}
    for key in database.entries.get("sm90", {}):
        problem = problem_from_key(key)
        if problem is not None:
            problems.setdefault(problem, "tuning database")
    for path in args.models + [export(case, Path("/tmp/byoc-epilogues/onnx")) for case in args.export]:
        for problem in model_problems(path):
            problems.setdefault(problem, Path(path).stem)
    kernels = {}
    for problem in problems:
        chosen = database.lookup(90, problem) or default_kernel(90, problem)
        if chosen.sm != 90:
            continue
        staged = dataclasses.replace(chosen, epilogue="staged", epilogue_tile=None)
        tma = dataclasses.replace(chosen, epilogue="tma")
        kernels[problem] = [staged, tma]
    flags = cutlass_flags(Target({"kind": "cutlass", "sm": 90}), 90)
    start = time.time()
    measured = tuning.time_candidates(kernels, 90, Path("/tmp/byoc-epilogues/timing"), flags)
    rows = []
    for problem, (staged, tma) in kernels.items():
        times = measured.get(problem, {})
        rows.append({"problem": problem.key, "source": problems[problem], "staged_kernel": staged.name(problem),
                     "staged_us": times.get(staged.name(problem)), "tma_kernel": tma.name(problem),
                     "tma_us": times.get(tma.name(problem))})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "epilogues.json").write_text(json.dumps({"seconds": round(time.time() - start, 1), "rows": rows}, indent=1))
    lines = ["| problem | from | kernel (TMA) | TMA us | staged us | staged / TMA |", "|---|---|---|---|---|---|"]
    for row in rows:
        ratio = row["staged_us"] / row["tma_us"] if row["staged_us"] and row["tma_us"] else None
        lines.append(f"| {row['problem']} | {row['source']} | {row['tma_kernel']} | {row['tma_us']} | "
                     f"{row['staged_us']} | {ratio and round(ratio, 3)} |")
    (out / "epilogues.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
