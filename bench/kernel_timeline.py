"""One run of a real model, kernel by kernel in launch order: where byoc's time goes beside
torch.compile's, for the model's own shapes.

    python3 bench/kernel_timeline.py mobilenet_v3_large:32 --out DIR [--config cuda_sm90]
        [--tuning-db backends/cutlass/tuning_sm90.json] [--torch-mode default]
    python3 bench/kernel_timeline.py --retable DIR/timeline_<model>_b<batch>.txt --out NEW.txt

The model comes from bench/real_model_zoo.py (random weights, fixed seeds, model and wrapper
in eval()), exported float32 to ONNX (opset 17) and built by byoc with the config. One run of
the byoc library and one of torch fp16 (torch.compile in --torch-mode; "none" skips torch)
are each recorded with torch.profiler (CUPTI: CUDA graph replays too), after warm-up runs.

With programmatic dependent launch a kernel is scheduled while the one before it drains and
waits for it, so its own duration includes that wait and durations overlap. Each kernel's
**exposed** time is what it adds to the run: its end minus the latest end before it (0 when
it ends under an earlier one). The exposed times add up to the run's busy time (its span
less the gaps where no kernel runs), and per kernel family they say what removing or
speeding up that family could save.

Writes DIR/timeline_<model>_b<batch>.txt (both runs in launch order, then the exposed time
per kernel family) and prints the family tables.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
from real_model_zoo import Wrapper, model_spec  # noqa: E402
from real_models import export_onnx  # noqa: E402
from profile_kernels import exposed  # noqa: E402
from run_models import load_config, time_cuda  # noqa: E402

START = time.time()


def log(*parts):
    print(f"[{time.time() - START:7.1f}s]", *parts, flush=True)


def recorded_kernels(run, warmup: int = 5) -> list[tuple[float, float, str]]:
    """(start us, duration us, name) of every kernel and copy of one run(), in start order,
    the start relative to the first one's."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    if not events:
        return []
    first = events[0].time_range.start
    return [(e.time_range.start - first, e.time_range.end - e.time_range.start, e.name) for e in events]


def family(name: str) -> str:
    """A kernel's family: its name without template arguments, parameters and the hash that
    byoc's generated symbols carry, so that one kind of kernel adds up across the run."""
    name = name.replace("void ", "").replace("(anonymous namespace)::", "")
    if name.startswith("_ZN"):  # a mangled name (CUTLASS 2.x kernels): the part that says what it is
        match = re.search(r"(ImplicitGemmConvolution|GemmUniversal|Gemm)\w*", name)
        return f"cutlass {match.group(1) if match else name[:40]}"
    window = re.search(r"nhwc_kernel<[^,]+, [^,]+, [^,]+, (\d+), (\d+), (\d+)", name)
    if window:  # byoc's depthwise kernel: which window it was unrolled for (0: any)
        return f"byoc_depthwise::nhwc_kernel {window.group(1)}x{window.group(2)} stride {window.group(3)}"
    stem = re.split(r"[<(]", name, maxsplit=1)[0]
    if stem.startswith("triton_"):  # Inductor numbers its kernels: one family per fused pattern
        stem = re.sub(r"_\d+$", "", stem)
    return re.sub(r"_[0-9a-f]{10,12}(?=_|$)", "", stem)[:90]


def report(label: str, kernels) -> tuple[str, str]:
    """(the launch-order listing, the table of exposed time per family) of one run."""
    times = exposed(kernels)
    busy = sum(times)
    span = max((start + duration for start, duration, _ in kernels), default=0.0)
    listing = [f"# {label}: {len(kernels)} kernels and copies, span {span:.1f} us, busy {busy:.1f} us",
               "", "| start us | duration us | exposed us | kernel |", "|---|---|---|---|"]
    for (start, duration, name), time_ in zip(kernels, times):
        listing.append(f"| {start:.1f} | {duration:.2f} | {time_:.2f} | {name[:140]} |")
    per_family, count = Counter(), Counter()
    for (_, _, name), time_ in zip(kernels, times):
        per_family[family(name)] += time_
        count[family(name)] += 1
    table = [f"## {label}: exposed time per kernel family ({busy:.1f} us busy of a {span:.1f} us span)", "",
             "| exposed us | share | launches | family |", "|---|---|---|---|"]
    for name, time_ in per_family.most_common():
        table.append(f"| {time_:.1f} | {100 * time_ / max(busy, 1e-9):.0f}% | {count[name]} | {name} |")
    return "\n".join(listing), "\n".join(table)


def read_listings(text: str) -> list[tuple[str, list]]:
    """The (label, kernels) of each launch-order listing in a file this script wrote."""
    runs = []
    for line in text.splitlines():
        if line.startswith("# ") and ": " in line:
            runs.append((line[2:].split(": ")[0], []))
        elif runs and line.startswith("| ") and not line.startswith("| start") and line.count("|") >= 5:
            cells = [cell.strip() for cell in line.strip("|").split(" | ", 3)]
            runs[-1][1].append((float(cells[0]), float(cells[1]), cells[3]))
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", nargs="?", default="", help="model:batch (bench/real_model_zoo.py's models)")
    parser.add_argument("--out", default="/tmp/byoc-timeline")
    parser.add_argument("--workdir", default="/tmp/byoc-timeline/work")
    parser.add_argument("--config", default="cuda_sm90")
    parser.add_argument("--tuning-db", default=str(BENCH.parent / "backends" / "cutlass" / "tuning_sm90.json"))
    parser.add_argument("--torch-mode", default="default", help="torch.compile mode, 'eager' or 'none'")
    parser.add_argument("--retable", metavar="TIMELINE.txt",
                        help="only write the family tables of a file this script wrote again (to --out)")
    args = parser.parse_args()
    if args.retable and not Path(args.retable).is_file():
        parser.error(f"--retable: no file {args.retable}")
    if not args.retable and not args.case:
        parser.error("name a case (model:batch), or --retable a timeline file")
    if args.retable:
        sections = [report(label, kernels) for label, kernels in read_listings(Path(args.retable).read_text())]
        text = "\n\n".join([table for _, table in sections] + [listing for listing, _ in sections]) + "\n"
        Path(args.out).write_text(text)
        print("\n\n".join(table for _, table in sections))
        return
    name, _, batch_text = args.case.partition(":")
    batch = int(batch_text or 1)
    out, workdir = Path(args.out), Path(args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)

    make, make_inputs, attribute = model_spec(name)
    model = make("eager", False).eval()
    inputs = make_inputs(batch, False, torch.Generator().manual_seed(0))
    wrapper = Wrapper(model, list(inputs), attribute).eval()
    onnx_path = workdir / f"{name}_b{batch}.onnx"
    export_onnx(wrapper, inputs, onnx_path, ("torchscript", "dynamo"))
    log("exported", onnx_path)

    import byoc
    config = load_config(args.config, args.tuning_db, "auto")
    library = byoc.build(str(onnx_path), config=config, workdir=str(workdir / f"{name}_b{batch}"),
                         input_shapes={k: tuple(v.shape) for k, v in inputs.items()})
    log("built (sources in", workdir / f"{name}_b{batch}", ")")
    module = library.load()
    feeds = {k: v.cuda() for k, v in inputs.items()}
    result = module.run(**feeds)
    outputs = [result]
    byoc_run = lambda: module.run(**feeds, out=outputs)  # noqa: E731
    log(f"byoc {args.config}: {time_cuda(byoc_run, 50) * 1000:.1f} us per run")
    sections = [report(f"byoc {args.config}", recorded_kernels(byoc_run))]

    if args.torch_mode != "none":
        half = model.half().cuda()
        half_feeds = tuple(v.cuda().half() if v.is_floating_point() else v.cuda() for v in inputs.values())
        with torch.no_grad():
            compiled = half if args.torch_mode == "eager" else torch.compile(half, mode=args.torch_mode)
            compiled(*half_feeds)
            torch_run = lambda: compiled(*half_feeds)  # noqa: E731
            log(f"torch {args.torch_mode}: {time_cuda(torch_run, 50) * 1000:.1f} us per run")
            sections.append(report(f"torch {args.torch_mode}", recorded_kernels(torch_run)))

    text = "\n\n".join([table for _, table in sections] + [listing for listing, _ in sections]) + "\n"
    path = out / f"timeline_{name}_b{batch}.txt"
    path.write_text(text)
    print("\n\n".join(table for _, table in sections))
    log("wrote", path)


if __name__ == "__main__":
    main()
