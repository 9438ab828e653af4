"""CUDA graph regions around cpu functions: the mlp fixture with its GELU pinned to the cpu
(two GPU regions) and the bert2 fixture with its softmaxes pinned to the cpu (three), each
with host inputs and outputs, built with graphs on and off, timed as a user calls it
(NumPy in and out).

    python bench/bench_graph_regions.py --out DIR
Writes DIR/graph_regions.json and DIR/graph_regions.md.
"""
import argparse
import json
import statistics
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


# (fixture, devices section, what it is): each built with graphs on and off
CASES = [("mlp", {"pin": [{"op": "gelu", "device": "cpu"}], "inputs": "host", "outputs": "host"},
          "the mlp fixture (batch 4) with its GELU on the cpu: two GPU regions around it"),
         ("bert2", PINNING, "the bert2 fixture (batch 2, seq 16) with its softmaxes on the cpu: three GPU regions")]


def time_case(name: str, devices: dict, workdir: Path) -> list:
    import byoc
    data = np.load(FIXTURES / f"{name}.npz")
    inputs = {key[3:]: data[key] for key in data if key.startswith("in_")}
    rows = []
    for graph in (False, True):
        library = byoc.build(FIXTURES / f"{name}.onnx", config={"target": "auto", "devices": devices,
                                                               "cuda_graph": graph},
                             workdir=str(workdir / f"{name}_graph_{graph}"),
                             input_shapes={key: value.shape for key, value in inputs.items()})
        module = library.load()
        regions = library.metadata.get("cuda_graph_regions", [])
        rows.append({"cuda_graph": graph, "ms": round(time_runs(lambda: module.run(**inputs)), 4),
                     "captured_regions": sum(r["captured"] for r in regions),
                     "direct_regions": sum(not r["captured"] for r in regions)})
        print(name, rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/byoc-graph-regions")
    parser.add_argument("--workdir", default="/tmp/byoc-graph-regions-build")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import subprocess
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    record = {"device": gpu, "date": time.strftime("%Y-%m-%d"), "cases": []}
    lines = [f"# CUDA graph regions around cpu functions ({gpu}, {record['date']})", "",
             "`bench/bench_graph_regions.py`: models with an op pinned to the cpu and their inputs and outputs in "
             "host memory (NumPy in and out), built with graphs on and off; ms per run (wall, median of 5 rounds of "
             "200). These models are host-bound: compare within one run of the script.", ""]
    for name, devices, what in CASES:
        rows = time_case(name, devices, Path(args.workdir))
        record["cases"].append({"model": name, "what": what, "devices": devices, "results": rows})
        off, on = rows
        lines += [f"**{what}**", "", "| cuda_graph | ms per run | captured regions | regions run directly |",
                  "|---|---|---|---|"]
        lines += [f"| {str(row['cuda_graph']).lower()} | {row['ms']:.4f} | {row['captured_regions']} | "
                  f"{row['direct_regions']} |" for row in rows]
        lines += ["", f"Graphs on / off: {off['ms'] / on['ms']:.2f}x faster.", ""]
    (out / "graph_regions.json").write_text(json.dumps(record, indent=1))
    (out / "graph_regions.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
