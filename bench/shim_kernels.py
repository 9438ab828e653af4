"""What the shim's kernel benches share (bench_depthwise.py, bench_grouped_conv.py): a .cu
that includes the shim's CUDA headers compiled into a library of C entry points, and the
CUDA-event time of one launch."""
import ctypes
import subprocess
import time
from pathlib import Path

import torch

SHIM_CUDA = Path(__file__).resolve().parent.parent / "backends" / "builtin" / "shim" / "cuda"

# The epilogue the benches' kernels store through: sum + bias into fp16 NHWC, 8 channels a call.
BIAS_STORE = [
    "struct Store {",
    "  __half* out; const __half* bias; int vectors;",
    "  __device__ void operator()(int vector, const float (&sum)[8]) const {",
    "    alignas(16) __half y[8];",
    "    const int channel = (vector % vectors) * 8;",
    "    for (int j = 0; j < 8; ++j) y[j] = __float2half(sum[j] + __half2float(bias[channel + j]));",
    "    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(vector) * 8) = *reinterpret_cast<const uint4*>(y);",
    "  }",
    "};",
]


def compile_library(source: str, name: str, workdir) -> ctypes.CDLL:
    """`source` written to WORKDIR/NAME.cu, compiled for sm_90 with the shim's CUDA headers
    on the include path, loaded (the caller sets each entry point's argtypes)."""
    cu = Path(workdir) / f"{name}.cu"
    cu.write_text(source)
    library = Path(workdir) / f"{name}.so"
    started = time.time()
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "--shared", "-Xcompiler", "-fPIC",
                    "-I", str(SHIM_CUDA), str(cu), "-o", str(library)], check=True)
    print(f"compiled in {time.time() - started:.1f} s", flush=True)
    return ctypes.CDLL(str(library))


def timed(fn, repeats=200):
    """us per call of fn: the median of 5 CUDA-event timings of `repeats` calls, after 10."""
    for _ in range(10):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(repeats):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000 / repeats)
    return sorted(times)[2]
