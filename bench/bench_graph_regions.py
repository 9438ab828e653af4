"""CUDA graph regions around cpu functions: the bert2 fixture with its softmaxes pinned to
the cpu and host inputs and outputs (five GPU regions between the copies and the cpu
softmaxes), built with graphs on and off, timed as a user calls it (NumPy in and out).

    python bench/bench_graph_regions.py --out DIR
Writes DIR/graph_regions.json and DIR/graph_regions.md.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).parent.parent / "tests" / "fixtures"
PINNING = {"pin": [{"op": "softmax", "device": "cpu"}], "inputs": "host", "outputs": "host"}


def time_runs(run, repeat=200, rounds=5, warm_s=0.5):
    """Median over `rounds` of the mean wall time of `repeat` calls (ms); each call returns
    host outputs, so it is complete when it returns."""
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        run()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            run()
        means.append((time.perf_counter() - start) / repeat * 1000)
    return statistics.median(means)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/byoc-graph-regions")
    parser.add_argument("--workdir", default="/tmp/byoc-graph-regions-build")
    args = parser.parse_args()
    import byoc
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = np.load(FIXTURES / "bert2.npz")
    inputs = {key[3:]: data[key] for key in data if key.startswith("in_")}
    rows = []
    for graph in (False, True):
        library = byoc.build(FIXTURES / "bert2.onnx", config={"target": "auto", "devices": PINNING, "cuda_graph": graph},
                             workdir=str(Path(args.workdir) / f"graph_{graph}"),
                             input_shapes={name: value.shape for name, value in inputs.items()})
        module = library.load()
        regions = library.metadata.get("cuda_graph_regions", [])
        rows.append({"cuda_graph": graph, "ms": round(time_runs(lambda: module.run(**inputs)), 4),
                     "captured_regions": sum(r["captured"] for r in regions),
                     "direct_regions": sum(not r["captured"] for r in regions)})
        print(rows[-1], flush=True)
    import subprocess
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    record = {"device": gpu, "date": time.strftime("%Y-%m-%d"), "model": "bert2 (tests/fixtures), batch 2, seq 16",
              "devices": PINNING, "results": rows}
    (out / "graph_regions.json").write_text(json.dumps(record, indent=1))
    off, on = rows
    lines = [f"# CUDA graph regions around cpu functions ({gpu}, {record['date']})", "",
             "`bench/bench_graph_regions.py`: the bert2 fixture with its softmaxes on the cpu and its inputs and "
             "outputs in host memory (NumPy in and out), ms per run (wall, median of 5 rounds of 200).", "",
             "| cuda_graph | ms per run | captured regions | regions run directly |", "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {str(row['cuda_graph']).lower()} | {row['ms']:.4f} | {row['captured_regions']} | "
                     f"{row['direct_regions']} |")
    lines += ["", f"Graphs on / off: {off['ms'] / on['ms']:.2f}x faster."]
    (out / "graph_regions.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
