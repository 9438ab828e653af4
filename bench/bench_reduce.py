"""Global average pooling in NHWC through the CUDA shim: byoc_shim_reduce (one block per
image and column group) against byoc_shim_reduce_chunked (the rows split into the chunks
codegen picks, shim_calls._reduce_chunks), on the squeeze-and-excitation pools of
EfficientNet-B0 and MobileNetV3-large at batch 32. CUDA-event medians, us per call.

    python bench/bench_reduce.py --out DIR
Writes DIR/reduce.json and prints a table.
"""
import argparse
import ctypes
import json
import sys
import tempfile
from pathlib import Path

import cupy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from shim_abi import SIGNATURES  # noqa: E402
from test_shim_cuda import compile_all  # noqa: E402

from byoc.backends.builtin.shim_calls import _reduce_chunks  # noqa: E402
from byoc.toolchain.compiler import cuda_link_flags, find_cxx  # noqa: E402

# (height, width, channels) of each pooled activation
SHAPES = [(112, 112, 32), (56, 56, 96), (56, 56, 144), (28, 28, 144), (28, 28, 240), (56, 56, 72), (28, 28, 120),
          (28, 28, 72), (14, 14, 480), (7, 7, 1280)]


def load_shim(directory):
    import subprocess
    objects = compile_all(Path(directory), arches=("sm_90",))
    library = Path(directory) / "libbyoc_shim_cuda.so"
    subprocess.run([find_cxx(), "-shared", "-o", str(library), *map(str, objects),
                    *cuda_link_flags(["-lcublasLt"])], check=True)
    lib = ctypes.CDLL(str(library))
    for name in ("byoc_shim_reduce", "byoc_shim_reduce_chunked"):
        getattr(lib, name).argtypes = SIGNATURES[name]
    return lib


def timed(fn, repeats=200):
    for _ in range(10):
        fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(5):
        start.record()
        for _ in range(repeats):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1000 / repeats)
    return sorted(times)[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        lib = load_shim(directory)
        rows = []
        for h, w, c in SHAPES:
            outer, n, inner = args.batch, h * w, c
            x = cupy.random.standard_normal((outer, n, inner)).astype(cupy.float16)
            want = x.astype(cupy.float32).mean(axis=1)
            chunks = max(_reduce_chunks("cuda", outer, n, inner), 2)
            workspace = cupy.empty(outer * chunks * inner, cupy.float64)
            row = {"shape": [outer, h, w, c], "chunks": chunks}
            for name, call in [
                ("reduce", lambda out: lib.byoc_shim_reduce(x.data.ptr, out.data.ptr, 1, 1, outer, n, inner, None)),
                ("chunked", lambda out: lib.byoc_shim_reduce_chunked(x.data.ptr, out.data.ptr, 1, 1, outer, n, inner,
                                                                     chunks, workspace.data.ptr, None)),
            ]:
                out = cupy.empty((outer, inner), cupy.float16)
                assert call(out) == 0
                cupy.cuda.Device().synchronize()
                row[f"{name}_error"] = float(abs(out.astype(cupy.float32) - want).max())
                row[f"{name}_us"] = timed(lambda: call(out))
            rows.append(row)
            print(f"{outer}x{h}x{w}x{c:<5} chunks {chunks:3}: reduce {row['reduce_us']:6.1f} us  "
                  f"chunked {row['chunked_us']:6.1f} us  (errors {row['reduce_error']:.1e} {row['chunked_error']:.1e})",
                  flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reduce.json").write_text(json.dumps({"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                                                 "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
