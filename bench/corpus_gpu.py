"""The model corpus at full size on the GPU: each architecture of bench/corpus_models.py
exported by each torch exporter as a user calls it, built by byoc for `cuda_sm90` (tuning
measurements off: the shipped database or the heuristic picks the kernels, to keep builds
short) and run against onnxruntime (CPU) on the same file.

    python3 bench/corpus_gpu.py --out DIR [--cases NAME[:EXPORTER] ...] [--jobs 4] [--budget-s 540] [--speed]

Each case (architecture x exporter) runs in its own process, `--jobs` at a time (exports
and onnxruntime are CPU work; the builds share the object cache). A case records its
export, build and run times, byoc's max |diff| / max |ort| (pass: <= 2e-2; byoc runs
fp16), the partition summary and any error with the step it came from. Results are
rewritten as each case ends: DIR/corpus_gpu.json and DIR/corpus_gpu.md. Cases not started
when --budget-s has passed are listed as not run.

With --speed a case that runs right is also timed against torch in the same process: byoc
(CUDA events, median of rounds), torch fp16 eager and torch.compile reduce-overhead, and
byoc's kernels per run with the ones taking most of it (DIR/corpus_speed.md): how fast byoc
is on architectures nobody tuned it for. Each child gets one GPU of the host in turn
(CUDA_VISIBLE_DEVICES), and the timed part of a case holds that GPU's lock, so that two
cases never time on one GPU at once while others export and build beside them. What runs
beside a timing (another case's correctness run on the same GPU, exports and nvcc on the
CPUs) can still slow launch-bound runs: torch eager most, CUDA-graph runs (byoc,
reduce-overhead) least: torch reduce-overhead's GPT-NeoX took 0.480 ms in one such call and
0.542 in another (bench/results/corpus_speed_h200.md). Read a row's ratio, not small gaps.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 2e-2
EXPORTERS = ("torchscript", "dynamo")


def run_case(name: str, exporter: str, workdir: Path, precision: str = "float16", speed: bool = False) -> dict:
    """In a child process: export, reference, build and run one case (with `speed`: then
    timed against torch, holding this GPU's lock)."""
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT))
    import corpus_models

    import byoc
    from byoc.config import load_config

    row = {"model": name, "exporter": exporter, "family": corpus_models.ARCHITECTURES[name].family,
           "precision": precision}
    step = "export"
    try:
        started = time.perf_counter()
        wrapper, inputs = corpus_models.make(name, tiny=False)
        arch = corpus_models.ARCHITECTURES[name]
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / f"{name}.{exporter}.onnx"
        names, args = list(inputs), tuple(inputs.values())
        if exporter == "torchscript":
            axes = {n: arch.dynamic_axes[n] for n in names if n in arch.dynamic_axes}
            torch.onnx.export(wrapper, args, str(path), dynamo=False, opset_version=17, input_names=names,
                              output_names=["output"], dynamic_axes=axes)
        else:
            torch.onnx.export(wrapper, args, str(path), input_names=names, output_names=["output"])
        row["export_s"] = round(time.perf_counter() - started, 1)
        row["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
        feeds = {k: v.numpy() for k, v in inputs.items()}
        step = "onnxruntime"
        import onnxruntime
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)[0]
        step = "build"
        config = load_config("cuda_sm90", overrides={"tuning": {"profile": False, "tuning_db": None},
                                                     "precision": precision,
                                                     "workdir": str(workdir / f"{name}.{exporter}.build")})
        started = time.perf_counter()
        library = byoc.build(str(path), config=config, input_shapes={k: v.shape for k, v in feeds.items()})
        row["build_s"] = round(time.perf_counter() - started, 1)
        row["partitions"] = _partition_summary(library)
        step = "run"
        module = library.load()
        device_feeds = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}  # a cuda library takes device tensors
        got = module.run(**device_feeds)
        got = got.cpu().numpy() if hasattr(got, "cpu") else np.asarray(got.get() if hasattr(got, "get") else got)
        scale = max(float(np.max(np.abs(expected))), 1e-30)
        row["error"] = float(np.max(np.abs(got.astype(np.float64) - expected))) / scale
        row["ok"] = bool(row["error"] <= TOLERANCE and got.shape == expected.shape)
        started = time.perf_counter()
        for _ in range(10):
            module.run(**device_feeds)
        torch.cuda.synchronize()
        row["torch_fp16_error"] = _torch_fp16_error(wrapper, device_feeds, expected, scale)
        row["run_ms"] = round((time.perf_counter() - started) / 10 * 1e3, 3)  # wall clock, not a benchmark
        if speed and row["ok"]:
            try:  # a timing failure is the speed table's, not the case's: it ran right
                with _gpu_lock():
                    _time_against_torch(row, module, wrapper, device_feeds, expected, scale)
            except Exception as error:
                row["speed_error"] = f"{type(error).__name__}: {str(error).strip()[:300]}"
    except Exception as error:  # recorded in the row, the run goes on
        row["ok"] = False
        row["failed_at"] = step
        row["failure"] = f"{type(error).__name__}: {str(error).strip()[:400]}"
        row["traceback"] = traceback.format_exc()[-1500:]
    return row


def _torch_fp16_error(wrapper, feeds: dict, expected, scale: float):
    """The same model in torch fp16 on the GPU against onnxruntime: how far fp16 itself
    lands from float32 on this model (byoc's error is read beside it)."""
    import numpy as np
    import torch
    try:
        model = wrapper.half().cuda()
        with torch.no_grad():
            got = model(*[v.half() if v.is_floating_point() else v for v in feeds.values()]).float().cpu().numpy()
        return float(np.max(np.abs(got.astype(np.float64) - expected))) / scale
    except Exception as error:  # torch's own failure: noted, not the case's
        return f"{type(error).__name__}: {str(error)[:120]}"


def _gpu_lock():
    """The lock of the GPU this child runs on (its CUDA_VISIBLE_DEVICES): held while it times."""
    import contextlib
    import fcntl

    @contextlib.contextmanager
    def held():
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_") or "all"
        with open(f"/tmp/byoc-corpus-gpu-{gpu}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return held()


def _time_against_torch(row: dict, module, wrapper, feeds: dict, expected, scale: float):
    """byoc's run time and kernels, then torch fp16 eager's and reduce-overhead's, in this
    process on this GPU (bench/run_models.time_cuda: medians of CUDA-event rounds)."""
    import numpy as np
    import torch
    from profile_kernels import profile_run
    from run_models import time_cuda

    got = module.run(**feeds)
    row["byoc_ms"] = round(time_cuda(lambda: module.run(**feeds, out=[got])), 4)
    try:
        found = profile_run(lambda: module.run(**feeds, out=[got]), top=4)
        row["kernels_per_run"] = found["kernels_per_run"]
        row["gpu_us_per_run"] = found["gpu_us_per_run"]
        row["top_kernels"] = [(k["name"][:90], k["per_run"], k["exposed_us"]) for k in found["top"]]
    except Exception as error:  # the profile is a help to read the row, not the row
        row["profile_error"] = f"{type(error).__name__}: {str(error)[:200]}"
    model = wrapper.half().cuda().eval()
    tensors = [v.half() if v.is_floating_point() else v for v in feeds.values()]
    row["torch"] = {}
    for mode in ("eager", "reduce-overhead"):
        entry = row["torch"].setdefault(mode, {})
        try:
            torch._dynamo.reset()
            fn = model if mode == "eager" else torch.compile(model, mode=mode)
            with torch.no_grad():
                started = time.perf_counter()
                first = fn(*tensors)
                torch.cuda.synchronize()
                entry["first_call_s"] = round(time.perf_counter() - started, 1)
                first = first.float().cpu().numpy()
                entry["error"] = float(np.max(np.abs(first.astype(np.float64) - expected))) / scale
                entry["ms"] = round(time_cuda(lambda: fn(*tensors)), 4)
        except Exception as error:  # torch's own failure: noted in its cell
            entry["failure"] = f"{type(error).__name__}: {str(error)[:200]}"
        finally:
            fn = None
            torch._dynamo.reset()
    times = [entry["ms"] for entry in row["torch"].values() if "ms" in entry]
    if times:
        row["best_torch_over_byoc"] = round(min(times) / row["byoc_ms"], 3)


def _partition_summary(library) -> dict:
    """Calls per backend, from the library's metadata."""
    counts: dict = {}
    for function in library.metadata.get("functions", []):
        counts[function["backend"]] = counts.get(function["backend"], 0) + function.get("calls", 1)
    return counts


def write(rows: list, out: Path, meta: dict):
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus_gpu.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    lines = [f"# Corpus at full size on the GPU ({meta['device']}, {meta['date']}; each row's byoc commit in "
             f"corpus_gpu.json)", "",
             f"`cuda_sm90`, tuning measurements off; pass: max |byoc - ort| / max |ort| <= {TOLERANCE}. "
             f"torch {meta['versions'].get('torch')}, transformers {meta['versions'].get('transformers')}, "
             f"torchvision {meta['versions'].get('torchvision')}, timm {meta['versions'].get('timm')}.", "",
             "| model | family | exporter | precision | inputs | export s | build s | error | torch fp16 error | ok | "
             "partitions / failure |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        what = row.get("failure") and f"{row.get('failed_at')}: {row['failure'][:160]}" or \
            ", ".join(f"{k} {v}" for k, v in sorted(row.get("partitions", {}).items()))
        error = f"{row['error']:.1e}" if "error" in row else "-"
        reference = row.get("torch_fp16_error", "-")
        reference = f"{reference:.1e}" if isinstance(reference, float) else str(reference)[:40]
        inputs = "; ".join(f"{k} {v}" for k, v in row.get("inputs", {}).items())
        lines.append(f"| {row['model']} | {row.get('family', '')} | {row['exporter']} | "
                     f"{row.get('precision', 'float16')} | {inputs} | "
                     f"{row.get('export_s', '-')} | {row.get('build_s', '-')} | {error} | {reference} | "
                     f"{'yes' if row.get('ok') else 'NO'} | {what.replace('|', '/')} |")
    (out / "corpus_gpu.md").write_text("\n".join(lines) + "\n")
    timed = [row for row in rows if "byoc_ms" in row]
    if timed:
        _write_speed(timed, out, meta)


def _write_speed(rows: list, out: Path, meta: dict):
    """corpus_speed.md: the timed rows, slowest against torch first."""
    lines = [f"# Corpus at full size: byoc against torch ({meta['device']}, {meta['date']})", "",
             f"`bench/corpus_gpu.py --speed`: `cuda_sm90` (the shipped tuning database, no tuning measurements), "
             f"fp16; torch {meta['versions'].get('torch')} fp16 eager and torch.compile reduce-overhead in the same "
             f"process on the same GPU; ms per run (CUDA-event medians). Best torch / byoc > 1: byoc is faster. "
             f"Kernels: byoc's launches and copies per run, and the three taking most of a run (exposed us).", "",
             "| model | exporter | inputs | byoc ms | torch eager | torch reduce-overhead | best torch / byoc | "
             "kernels/run | top kernels |",
             "|---|---|---|---|---|---|---|---|---|"]

    def cell(entry):
        return f"{entry['ms']:.3f}" if "ms" in entry else ("failed" if "failure" in entry else "-")

    for row in sorted(rows, key=lambda r: r.get("best_torch_over_byoc", 0.0)):
        torch_runs = row.get("torch", {})
        inputs = "; ".join(f"{k} {v}" for k, v in row.get("inputs", {}).items())
        top = "; ".join(f"{name[:60]} x{per_run:.0f} {us:.0f} us" for name, per_run, us in row.get("top_kernels", [])[:3])
        ratio = row.get("best_torch_over_byoc")
        lines.append(f"| {row['model']} | {row['exporter']} | {inputs} | {row['byoc_ms']:.3f} | "
                     f"{cell(torch_runs.get('eager', {}))} | {cell(torch_runs.get('reduce-overhead', {}))} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} | {row.get('kernels_per_run', 0):.0f} | "
                     f"{top.replace('|', '/')} |")
    (out / "corpus_speed.md").write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="*", default=None)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/byoc-corpus"))
    parser.add_argument("--merge-from", type=Path, default=None,
                        help="an earlier corpus_gpu.json whose rows of cases not run now are kept")
    parser.add_argument("--keep-files", action="store_true", help="keep each case's ONNX file and build")
    parser.add_argument("--speed", action="store_true", help="time each case against torch (corpus_speed.md)")
    parser.add_argument("--gpus", type=int, default=0,
                        help="GPUs of the host the children take in turn (0: every visible one)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(ROOT / "bench"))
        row = run_case(args.child[0], args.child[1], args.workdir, args.child[2], speed=args.speed)
        if not args.keep_files:  # a full-size model and its build take GBs: 64 GB fill up within a call
            import shutil
            for path in args.workdir.glob(f"{args.child[0]}.{args.child[1]}.*"):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        print("ROW " + json.dumps(row), flush=True)
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    import corpus_models
    cases = []
    for spec in args.cases or list(corpus_models.ARCHITECTURES):
        # NAME[:EXPORTER][@PRECISION]: float32 where fp16 overflows in torch too (a random Swin V2)
        spec, _, precision = spec.partition("@")
        name, _, exporter = spec.partition(":")
        cases += [(name, e, precision or "float16") for e in ([exporter] if exporter else EXPORTERS)]
    import torch
    versions = {"torch": torch.__version__}
    for package in ("transformers", "torchvision", "timm", "onnx", "onnxruntime"):
        try:
            versions[package] = __import__(package).__version__
        except ImportError:
            pass
    meta = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU",
            "commit": os.environ.get("BYOC_GIT_COMMIT", "unknown"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "versions": versions}
    start = time.time()
    rows: list = []
    if args.merge_from and args.merge_from.exists():
        running = {(name, exporter) for name, exporter, _ in cases}
        rows = [row for row in json.loads(args.merge_from.read_text())["rows"]
                if (row["model"], row["exporter"]) not in running]

    # the GPUs this process sees (its own CUDA_VISIBLE_DEVICES, if any), the first --gpus of them
    visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()] or \
        [str(index) for index in range(torch.cuda.device_count())]
    visible = visible[:args.gpus] if args.gpus else visible
    gpus = len(visible)
    started_cases = itertools.count()  # next() on a count is atomic: the pool's threads share it

    def one(case):
        name, exporter, precision = case
        if time.time() - start > args.budget_s:
            return {"model": name, "exporter": exporter, "ok": False, "failed_at": "not run",
                    "failure": f"not started within the {args.budget_s:.0f} s budget"}
        environment = dict(os.environ)
        if gpus > 1:  # each child one GPU, in turn
            environment["CUDA_VISIBLE_DEVICES"] = visible[next(started_cases) % gpus]
        child = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--workdir", str(args.workdir),
                                "--child", name, exporter, precision] + (["--speed"] if args.speed else []),
                               capture_output=True, text=True, env=environment,
                               timeout=max(60, args.budget_s + 120 - (time.time() - start)))
        found = [line[4:] for line in child.stdout.splitlines() if line.startswith("ROW ")]
        row = json.loads(found[-1]) if found else {
            "model": name, "exporter": exporter, "ok": False, "failed_at": "process",
            "failure": (child.stderr.strip().splitlines() or ["no output"])[-1][:400]}
        print(f"{time.strftime('%H:%M:%S')} {name}:{exporter} ok={row.get('ok')} error={row.get('error')} "
              f"build_s={row.get('build_s')} byoc_ms={row.get('byoc_ms')} "
              f"best_torch/byoc={row.get('best_torch_over_byoc')} {row.get('failure', '')[:200]}", flush=True)
        row.setdefault("commit", meta["commit"])
        row.setdefault("device", meta["device"])
        rows.append(row)
        write(sorted(rows, key=lambda r: (r["model"], r["exporter"])), args.out, meta)
        return row

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
