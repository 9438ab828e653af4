"""The built-in shim's squeeze-and-excitation kernel (backends/builtin/shim/cuda/
squeeze_excitation.cu: pool, squeeze, activation, excitation, gate and the scale of the
input by it, as one kernel) side by side with the same block as torch runs it unfused (a
mean, two linears with their activations and the multiply, fp16, channels-last), on the SE blocks of MobileNetV3-large and
EfficientNet-B0 at batch 32 (squeeze widths as PadConvChannels widens them). Both sides are
captured in a CUDA graph of 20 blocks, so launch overhead counts as it does in a model.
Each output is checked against torch's; times are CUDA-event medians.

    python bench/bench_squeeze_excitation.py --out DIR [--source OTHER.cu]
Writes DIR/squeeze_excitation.json and prints a table (us per block). --source times
another version of the kernel's file (e.g. `git show main:<path> > /tmp/se_main.cu`) in
place of the tree's.
"""
import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHIM = Path(__file__).resolve().parent.parent / "backends" / "builtin" / "shim"
# (network, size, channels, squeeze, activation, gate); activation/gate as byoc_activation
CASES = [
    ("mobilenet_v3", 28, 72, 24, "relu", "hard_sigmoid"), ("mobilenet_v3", 28, 120, 32, "relu", "hard_sigmoid"),
    ("mobilenet_v3", 14, 480, 120, "relu", "hard_sigmoid"), ("mobilenet_v3", 14, 672, 168, "relu", "hard_sigmoid"),
    ("mobilenet_v3", 7, 672, 168, "relu", "hard_sigmoid"), ("mobilenet_v3", 7, 960, 240, "relu", "hard_sigmoid"),
    ("efficientnet_b0", 112, 32, 8, "silu", "sigmoid"), ("efficientnet_b0", 56, 96, 8, "silu", "sigmoid"),
    ("efficientnet_b0", 56, 144, 8, "silu", "sigmoid"), ("efficientnet_b0", 28, 144, 8, "silu", "sigmoid"),
    ("efficientnet_b0", 28, 240, 16, "silu", "sigmoid"), ("efficientnet_b0", 14, 240, 16, "silu", "sigmoid"),
    ("efficientnet_b0", 14, 480, 24, "silu", "sigmoid"), ("efficientnet_b0", 14, 672, 32, "silu", "sigmoid"),
    ("efficientnet_b0", 7, 672, 32, "silu", "sigmoid"), ("efficientnet_b0", 7, 1152, 48, "silu", "sigmoid"),
]
CODES = {"relu": 1, "silu": 2, "sigmoid": 4, "hard_sigmoid": 5}
TORCH = {"relu": F.relu, "silu": F.silu, "sigmoid": torch.sigmoid, "hard_sigmoid": F.hardsigmoid}
REPEATS = 20


def build(workdir, source=None):
    library = Path(workdir) / "bench_se.so"
    started = time.time()
    subprocess.run(["nvcc", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_90", "--shared",
                    "-Xcompiler", "-fPIC", f"-I{SHIM / 'cuda'}", f"-I{SHIM}",
                    str(source or SHIM / "cuda" / "squeeze_excitation.cu"), str(SHIM / "cuda" / "common.cu"),
                    "-o", str(library)], check=True)
    print(f"compiled in {time.time() - started:.1f} s", flush=True)
    lib = ctypes.CDLL(str(library))
    lib.byoc_shim_squeeze_excitation.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] + [ctypes.c_int64] * 4 + [
        ctypes.c_int, ctypes.c_float, ctypes.c_float, ctypes.c_int, ctypes.c_float, ctypes.c_float, ctypes.c_int,
        ctypes.c_void_p]
    lib.byoc_shim_last_error.restype = ctypes.c_char_p
    return lib


def graph_time(fn):
    """us per call of fn, captured REPEATS times in one CUDA graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(REPEATS):
            fn()
    for _ in range(3):
        graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(7):
        start.record()
        for _ in range(10):
            graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000 / (10 * REPEATS))
    return sorted(times)[3]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--source", help="the kernel's .cu file to time (default: the tree's)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        lib = build(workdir, args.source)
        for network, size, channels, squeeze, activation, gate in CASES:
            n = args.batch
            x = torch.randn(n, size, size, channels, device="cuda", dtype=torch.half)
            w1 = torch.randn(squeeze, channels, device="cuda", dtype=torch.half) * (3 / channels ** 0.5)
            b1 = torch.randn(squeeze, device="cuda", dtype=torch.half)
            w2 = torch.randn(channels, squeeze, device="cuda", dtype=torch.half) * (2 / squeeze ** 0.5)
            b2 = torch.randn(channels, device="cuda", dtype=torch.half)
            out = torch.empty(n, size, size, channels, device="cuda", dtype=torch.half)

            def fused():
                status = lib.byoc_shim_squeeze_excitation(
                    x.data_ptr(), w1.data_ptr(), b1.data_ptr(), w2.data_ptr(), b2.data_ptr(), out.data_ptr(), 1, n,
                    size * size, channels, squeeze, CODES[activation], 0.0, 0.0, CODES[gate], 1 / 6, 0.5, 1,
                    torch.cuda.current_stream().cuda_stream)
                if status != 0:
                    raise RuntimeError(lib.byoc_shim_last_error().decode())

            def unfused():
                hidden = TORCH[activation](F.linear(x.mean((1, 2)), w1, b1))
                return x * TORCH[gate](F.linear(hidden, w2, b2))[:, None, None, :]
            fused()
            want = unfused()
            torch.cuda.synchronize()
            error = ((out.float() - want.float()).abs().max() / want.float().abs().max()).item()
            row = {"network": network, "input": [n, size, size, channels], "squeeze": squeeze,
                   "activation": activation, "gate": gate, "fused_us": graph_time(fused),
                   "torch_unfused_us": graph_time(unfused), "error": error}
            rows.append(row)
            print(f"{network:16} {size:3}x{size:<3}x{channels:<4} -> {squeeze:3}: fused {row['fused_us']:6.1f}  "
                  f"torch unfused {row['torch_unfused_us']:6.1f}  ({error:.0e})", flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "squeeze_excitation.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "batch": args.batch, "rows": rows}, indent=1))
    for network in sorted({r["network"] for r in rows}):
        mine = [r for r in rows if r["network"] == network]
        print(f"total {network}: fused {sum(r['fused_us'] for r in mine):.1f} us, torch unfused "
              f"{sum(r['torch_unfused_us'] for r in mine):.1f} us")


if __name__ == "__main__":
    sys.exit(main())
