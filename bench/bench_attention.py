"""The fused attention kernels side by side: every attention_tile choice of the cutlass
target on the attention shapes of the real-model suite, each built by byoc from a torch
module exported as HF writes attention (view/transpose heads, Q K^T / sqrt(D), + mask,
softmax, @ V, merge heads), checked against byoc's float32 interpreter and timed per kernel
with torch.profiler (the boundary casts are not counted).

    python bench/bench_attention.py --out DIR [--cases bert_b1,vit_b8] [--tiles flash:32x64,32x128]
Writes DIR/attention.json and prints a table (us per kernel call).
"""
import argparse
import concurrent.futures
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from profile_kernels import profile_run  # noqa: E402

# name: (batch, sequence, heads, head dim, mask shape or None)
CASES = {
    "bert_b1": (1, 128, 12, 64, "padding"),
    "bert_b8": (8, 128, 12, 64, "padding"),
    "gpt2_b1": (1, 128, 12, 64, "causal"),
    "vit_b8": (8, 197, 12, 64, None),
    "d128_b2": (2, 256, 16, 128, "padding"),
}
# "": the size rule; the rest every tile of both kernels
TILES = ["", "32x128", "64x64", "flash:64x64", "flash:32x64", "flash:64x128", "flash:32x128"]


class Attention(torch.nn.Module):
    def __init__(self, heads, head_dim):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim

    def forward(self, qkv, mask):
        batch, sequence, _ = qkv.shape
        q, k, v = qkv.split(self.heads * self.head_dim, dim=-1)

        def split(x):
            return x.view(batch, sequence, self.heads, self.head_dim).transpose(1, 2)

        scores = split(q) @ split(k).transpose(-1, -2) / self.head_dim ** 0.5 + mask
        context = torch.softmax(scores, dim=-1) @ split(v)
        return context.transpose(1, 2).reshape(batch, sequence, self.heads * self.head_dim)


def inputs_of(case):
    batch, sequence, heads, head_dim, mask_kind = CASES[case]
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((batch, sequence, 3 * heads * head_dim)).astype(np.float32)
    if mask_kind == "padding":  # HF's extended mask: 0 where attended, finfo.min where padded
        mask = np.zeros((batch, 1, 1, sequence), np.float32)
        for row in range(batch):
            mask[row, ..., sequence - 7 * row - 3:] = np.finfo(np.float16).min
    elif mask_kind == "causal":
        mask = np.triu(np.full((sequence, sequence), np.finfo(np.float16).min, np.float32), 1)[None, None]
    else:
        mask = np.zeros((1, 1, 1, sequence), np.float32)  # a zero mask: still an add the pattern takes
    return {"qkv": qkv, "mask": mask}


def export(case, path):
    _, _, heads, head_dim, _ = CASES[case]
    module = Attention(heads, head_dim).eval()
    example = {k: torch.from_numpy(v) for k, v in inputs_of(case).items()}
    torch.onnx.export(module, (example["qkv"], example["mask"]), str(path), input_names=["qkv", "mask"],
                      output_names=["context"], opset_version=17, dynamo=False)


def build(case, tile, workdir):
    import byoc
    config = {"target": "auto", "precision": "float16",
              "backends": [{"cutlass": {"profile": "false", "attention_tile": tile}}, "builtin"]}
    start = time.perf_counter()
    library = byoc.build(workdir.parent / f"{case}.onnx", config=config, workdir=str(workdir))
    library.export_library(str(workdir.parent / f"{workdir.name}.so"))
    # each generated unit's first line names its kernel
    kernels = [line[3:] for line in (s.read_text().split("\n", 1)[0] for s in sorted(workdir.glob("cutlass_*.cu")))
               if "attention" in line or "fmha" in line]
    return kernels, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/byoc-attention")
    parser.add_argument("--workdir", default="/tmp/byoc-attention-build")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--tiles", default=",".join(TILES))
    parser.add_argument("--jobs", type=int, default=4, help="builds side by side")
    args = parser.parse_args()
    import byoc
    out, root = Path(args.out), Path(args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    cases, tiles = args.cases.split(","), args.tiles.split(",")
    for case in cases:
        export(case, root / f"{case}.onnx")
    jobs = {(case, tile): root / f"{case}_{tile.replace(':', '_') or 'auto'}" for case in cases for tile in tiles}
    built = {}
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(build, *key, workdir): key for key, workdir in jobs.items()}
        for future in concurrent.futures.as_completed(futures):
            key = futures[future]
            try:
                built[key] = future.result()
                print(f"{time.strftime('%H:%M:%S')} built {key}: {built[key][0]} in {built[key][1]:.0f} s", flush=True)
            except Exception as error:  # noqa: BLE001 - a failed build is a result too
                built[key] = (None, str(error)[:500])
                print(f"{time.strftime('%H:%M:%S')} FAILED {key}: {error}", flush=True)
    results = []
    for (case, tile), workdir in jobs.items():
        kernels, seconds = built[(case, tile)]
        row = {"case": case, "tile": tile, "kernel": kernels, "build_s": seconds}
        if kernels is None:
            results.append(row)
            continue
        inputs = inputs_of(case)
        module = byoc.load(str(root / f"{workdir.name}.so"))
        feeds = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
        got = module.run(**feeds)
        reference = byoc.interpret(byoc.from_onnx(str(root / f"{case}.onnx")), **inputs)
        reference = reference[0] if isinstance(reference, (list, tuple)) else reference
        row["error"] = float(np.max(np.abs(got.float().cpu().numpy() - reference)) / np.max(np.abs(reference)))
        found = profile_run(lambda: module.run(**feeds, out=[got]), runs=50, top=10)
        row["kernel_us"] = next((k["mean_us"] for k in found["top"] if "attention" in k["name"]), None)
        results.append(row)
        print(f"{case:8} {tile or 'auto':13} {row['kernel_us']} us  error {row['error']:.1e}  {kernels}", flush=True)
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or None
    record = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "cuda": torch.version.cuda, "byoc_commit": commit, "results": results}
    (out / "attention.json").write_text(json.dumps(record, indent=1))
    (out / "attention.md").write_text(markdown(record))


def markdown(record) -> str:
    """One row per case, one column per tile: us per kernel call (the fastest in bold)."""
    tiles = list(dict.fromkeys(r["tile"] for r in record["results"]))
    lines = [f"# Fused attention kernels ({record['device']}, {record['date']})", "",
             f"torch {record['torch']} (CUDA {record['cuda']}); byoc {record['byoc_commit']}. "
             "`bench/bench_attention.py`: each case is a torch attention module exported to ONNX (float32) and "
             "built by byoc in float16 with one `cutlass.attention_tile`; us per attention kernel call "
             "(torch.profiler, 50 calls), every result checked against byoc's float32 interpreter. "
             "`32x128`, `64x64`: CUTLASS's example 41 kernel; `flash:QxK`: byoc's flash kernel.", "",
             "| case (B, S, H, D, mask) | " + " | ".join(tiles) + " | max error |",
             "|---|" + "---|" * (len(tiles) + 1)]
    for case in dict.fromkeys(r["case"] for r in record["results"]):
        rows = {r["tile"]: r for r in record["results"] if r["case"] == case}
        times = {tile: row.get("kernel_us") for tile, row in rows.items()}
        best = min((v for v in times.values() if v is not None), default=None)
        cells = []
        for tile in tiles:
            value = times.get(tile)
            cells.append("failed" if value is None else f"**{value:.2f}**" if value == best else f"{value:.2f}")
        error = max((r.get("error") or 0.0) for r in rows.values())
        shape = ", ".join(str(v) for v in CASES[case]) if case in CASES else ""
        lines.append(f"| {case} ({shape}) | " + " | ".join(cells) + f" | {error:.1e} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
