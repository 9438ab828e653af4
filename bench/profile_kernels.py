"""Where one run's GPU time goes: build a bench model with a shipped config and list its
kernels (count, total and mean time per run) from torch.profiler (CUPTI sees the kernels the
byoc library launches, graph replays included), beside the run's wall time.

    python bench/profile_kernels.py bert_base:1=cuda_sm90,cuda_sm90:nograph --out DIR
Writes DIR/profile_<model>_b<batch>_<config>.txt.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402
from run_models import example_input, load_config, time_cuda  # noqa: E402


def exposed(kernels) -> list[float]:
    """Each kernel's exposed time, kernels as (start, duration, ...) in launch order: its
    end minus the latest end before it (0 where it ends under an earlier one). With
    programmatic dependent launch a kernel starts while the one before it drains and waits
    for it, so durations overlap and include those waits; exposed times add up to the busy
    time of the run, and say what a kernel adds to it."""
    times, latest_end = [], None
    for start, duration, *_ in kernels:
        end = start + duration
        times.append(max(0.0, end - max(start, latest_end if latest_end is not None else start)))
        latest_end = end if latest_end is None else max(latest_end, end)
    return times


def profile_run(run, runs=20, top=25):
    """Kernels of `runs` calls of run() seen by torch.profiler (CUPTI: graph replays too):
    per kernel name its launches, GPU time (durations, overlapping under PDL) and exposed
    time (what it adds to the runs: see exposed()), the top ones by exposed time."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    spans = [(e.time_range.start, e.time_range.end - e.time_range.start, e.name) for e in events]
    kernels = {}
    for event, exposed_us in zip(events, exposed(spans)):
        entry = kernels.setdefault(event.name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        entry[2] += exposed_us
    ordered = sorted(kernels.items(), key=lambda kv: -kv[1][2])
    return {"runs": runs, "kernels_per_run": sum(v[0] for _, v in ordered) / runs,
            "distinct_kernels": len(ordered), "gpu_us_per_run": round(sum(v[1] for _, v in ordered) / runs, 2),
            "busy_us_per_run": round(sum(v[2] for _, v in ordered) / runs, 2),
            "top": [{"name": name, "per_run": count / runs, "total_us": round(total / runs, 2),
                     "exposed_us": round(exposed_total / runs, 2), "mean_us": round(total / count, 3)}
                    for name, (count, total, exposed_total) in ordered[:top]]}


def profile(library, x, runs=20):
    module = library.load()
    got = module.run(input=x)
    wall_ms = time_cuda(lambda: module.run(input=x, out=[got]), 100)
    found = profile_run(lambda: module.run(input=x, out=[got]), runs=runs, top=40)
    lines = [f"wall {wall_ms * 1000:.1f} us per run; kernels and copies {found['gpu_us_per_run']:.1f} us per run "
             f"({found['kernels_per_run']:.0f} per run), {found['busy_us_per_run']:.1f} us of it exposed", "",
             "| per run | exposed us | total us | mean us | kernel |", "|---|---|---|---|---|"]
    for kernel in found["top"]:
        lines.append(f"| {kernel['per_run']:.0f} | {kernel['exposed_us']:.1f} | {kernel['total_us']:.1f} | "
                     f"{kernel['mean_us']:.2f} | {kernel['name'][:150]} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", help="model:batch=config,config")
    parser.add_argument("--out", default="/tmp/byoc-profile")
    parser.add_argument("--workdir", default="/tmp/byoc-bench")
    parser.add_argument("--tuning-db")
    args = parser.parse_args()
    import byoc
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        case, _, configs = case.partition("=")
        name, _, batch = case.partition(":")
        batch = int(batch or 1)
        example = example_input(name, batch)
        onnx_path = Path(args.workdir) / f"{name}_b{batch}.onnx"
        if not onnx_path.exists():
            onnx_path.parent.mkdir(parents=True, exist_ok=True)
            models.export(models.make(name), example, str(onnx_path))
        x = example.cuda()
        for spec in configs.split(","):
            library = byoc.build(onnx_path, config=load_config(spec, args.tuning_db, "false" if args.tuning_db else "auto"),
                                 workdir=str(Path(args.workdir) / f"{name}_b{batch}_{spec.replace(':', '_')}"),
                                 input_shapes={"input": tuple(x.shape)})
            text = f"# {name} batch {batch} {spec}\n\n" + profile(library, x)
            (out / f"profile_{name}_b{batch}_{spec.replace(':', '_')}.txt").write_text(text + "\n")
            print(text, flush=True)


if __name__ == "__main__":
    main()
