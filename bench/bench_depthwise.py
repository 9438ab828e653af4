"""The depthwise conv kernels of the built-in shim (backends/builtin/shim/cuda/depthwise.cuh)
side by side with cuDNN's (torch's F.conv2d, channels-last fp16), on the depthwise convs of
MobileNetV3-large, EfficientNet-B0 and ConvNeXt-T at batch 32: the per-pixel-group kernel
(nhwc_kernel) and the shared-memory tiled one (tiled_kernel) with 1, 2 and 4 pixels per
thread; and the few-channel kernel on the RGB stems (4 channels after PadConvChannels).
Each variant's output is checked against cuDNN's; times are CUDA-event medians.

    python bench/bench_depthwise.py --out DIR
Writes DIR/depthwise.json and prints a table (us per conv).
"""
import argparse
import ctypes
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from shim_kernels import BIAS_STORE, compile_library, timed
WINDOWS = [(3, 1), (3, 2), (5, 1), (5, 2), (7, 1)]
VARIANTS = {"rows": 0, "tiled1": 1, "tiled2": 2, "tiled4": 4}

# (network, height, width, channels, kernel, stride): the input of each distinct depthwise conv
CASES = [
    ("mobilenet_v3", 112, 112, 16, 3, 1), ("mobilenet_v3", 112, 112, 64, 3, 2),
    ("mobilenet_v3", 56, 56, 72, 3, 1), ("mobilenet_v3", 56, 56, 72, 5, 2),
    ("mobilenet_v3", 28, 28, 120, 5, 1), ("mobilenet_v3", 28, 28, 240, 3, 2),
    ("mobilenet_v3", 14, 14, 200, 3, 1), ("mobilenet_v3", 14, 14, 480, 3, 1),
    ("mobilenet_v3", 14, 14, 672, 5, 2), ("mobilenet_v3", 7, 7, 960, 5, 1),
    ("efficientnet_b0", 112, 112, 32, 3, 1), ("efficientnet_b0", 112, 112, 96, 3, 2),
    ("efficientnet_b0", 56, 56, 144, 3, 1), ("efficientnet_b0", 56, 56, 144, 5, 2),
    ("efficientnet_b0", 28, 28, 240, 5, 1), ("efficientnet_b0", 28, 28, 240, 3, 2),
    ("efficientnet_b0", 14, 14, 480, 3, 1), ("efficientnet_b0", 14, 14, 480, 5, 1),
    ("efficientnet_b0", 14, 14, 672, 5, 1), ("efficientnet_b0", 14, 14, 672, 5, 2),
    ("efficientnet_b0", 7, 7, 1152, 5, 1), ("efficientnet_b0", 7, 7, 1152, 3, 1),
    ("convnext_tiny", 56, 56, 96, 7, 1), ("convnext_tiny", 28, 28, 192, 7, 1),
    ("convnext_tiny", 14, 14, 384, 7, 1), ("convnext_tiny", 7, 7, 768, 7, 1),
]


# (network, image size, output channels, kernel, stride, pad): stems of 4 (padded RGB)
# channels. ConvNeXt's (6,144 multiply-adds a pixel) runs on CUTLASS in a build: it is here
# to show why; ResNet's 7x7 filters (50 KB as float) do not fit the kernel's shared memory.
STEMS = [("mobilenet_v3", 224, 16, 3, 2, 1), ("efficientnet_b0", 224, 32, 3, 2, 1),
         ("convnext_tiny", 224, 96, 4, 4, 0)]


def source():
    """A .cu with one C entry point: the variant's kernel for one window, storing sum + bias."""
    dispatch = []
    for kernel, stride in WINDOWS:
        dispatch.append(f"  if (k == {kernel} && stride == {stride}) {{")
        dispatch.append(f"    if (variant == 0) return byoc_depthwise::launch_window<__half, int, {kernel}, {kernel}, {stride}>(x, w, n, s, store, 0);")
        for pixels in (1, 2, 4):
            dispatch.append(f"    if (variant == {pixels}) return byoc_depthwise::launch_tiled<__half, int, {kernel}, {stride}, {pixels}>(x, w, n, s, store, 0);")
        dispatch.append("  }")
    return "\n".join([
        '#include "depthwise.cuh"',
        *BIAS_STORE,
        'extern "C" int depthwise(int variant, const __half* x, const __half* w, const __half* b, __half* y,',
        "                         int n, int h, int wd, int c, int k, int stride, int pad, int oh, int ow) {",
        "  const byoc_depthwise::Geometry<int> s{h, wd, c, k, k, oh, ow, stride, stride, pad, pad, 1, 1};",
        "  const Store store{y, b, c / 8};",
        *dispatch,
        "  return -1;",
        "}",
        'extern "C" int stem(const __half* x, const __half* w, const __half* b, __half* y, int n, int h, int wd, int k,',
        "                    int out_channels, int stride, int pad, int oh, int ow) {",
        "  const byoc_depthwise::Geometry<int> s{h, wd, out_channels, k, k, oh, ow, stride, stride, pad, pad, 1, 1};",
        "  return byoc_depthwise::launch_few_channels<4>(x, w, n, s, Store{y, b, out_channels / 8}, 0);",
        "}",
        'extern "C" void tile_of(int n, int oh, int ow, int c, int k, int stride, int pixels, int* tile) {',
        *[f"  if (k == {kernel} && stride == {stride} && pixels == {pixels}) {{ const auto t = byoc_depthwise::choose_tile<{kernel}, {stride}, {pixels}>(n, oh, ow, c / 8); tile[0] = t.rows; tile[1] = t.groups; tile[2] = t.vectors; }}"
          for kernel, stride in WINDOWS for pixels in (1, 2, 4)],
        "}",
    ])


def build(workdir):
    lib = compile_library(source(), "bench_depthwise", workdir)
    lib.depthwise.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 9
    lib.stem.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 9  # pointers as pointers, not truncated to int
    return lib


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    with tempfile.TemporaryDirectory() as workdir:
        lib = build(workdir)
        rows = []
        for network, h, w, c, k, stride in CASES:
            n, pad = args.batch, k // 2
            x = torch.randn(n, c, h, w, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
            weight = torch.randn(c, 1, k, k, device="cuda", dtype=torch.half)
            bias = torch.randn(c, device="cuda", dtype=torch.half)
            want = F.conv2d(x, weight, bias, stride=stride, padding=pad, groups=c)
            oh, ow = want.shape[2], want.shape[3]
            row = {"network": network, "input": [n, h, w, c], "kernel": k, "stride": stride,
                   "cudnn_us": timed(lambda: F.conv2d(x, weight, bias, stride=stride, padding=pad, groups=c))}
            reference = want.permute(0, 2, 3, 1).float()
            for name, variant in VARIANTS.items():
                y = torch.empty(n, oh, ow, c, device="cuda", dtype=torch.half)

                def run():
                    status = lib.depthwise(variant, x.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr(),
                                           n, h, w, c, k, stride, pad, oh, ow)
                    if status != 0:
                        raise RuntimeError(f"{name}: launch failed ({status})")
                run()
                torch.cuda.synchronize()
                error = ((y.float() - reference).abs().max() / reference.abs().max()).item()
                row[f"{name}_us"] = timed(run)
                row[f"{name}_error"] = error
            for pixels in (2, 4):
                tile = (ctypes.c_int * 3)()
                lib.tile_of(n, oh, ow, c, k, stride, pixels, tile)
                row[f"tile{pixels}"] = "x".join(str(v) for v in tile)
            rows.append(row)
            print(f"{network:16} {h:3}x{w:<3}x{c:<4} {k}x{k} s{stride}: cudnn {row['cudnn_us']:7.1f}  " +
                  "  ".join(f"{name} {row[name + '_us']:7.1f} ({row[name + '_error']:.0e})" for name in VARIANTS) +
                  f"  tiles {row['tile2']} {row['tile4']}",
                  flush=True)
        stems = []
        for network, size, out_channels, k, stride, pad in STEMS:
            n = args.batch
            x = torch.randn(n, 4, size, size, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
            weight = torch.randn(out_channels, 4, k, k, device="cuda", dtype=torch.half)
            bias = torch.randn(out_channels, device="cuda", dtype=torch.half)
            want = F.conv2d(x, weight, bias, stride=stride, padding=pad)
            oh, ow = want.shape[2], want.shape[3]
            ohwi = weight.permute(0, 2, 3, 1).contiguous()
            y = torch.empty(n, oh, ow, out_channels, device="cuda", dtype=torch.half)

            def run():
                if lib.stem(x.data_ptr(), ohwi.data_ptr(), bias.data_ptr(), y.data_ptr(), n, size, size, k,
                            out_channels, stride, pad, oh, ow) != 0:
                    raise RuntimeError("stem: launch failed")
            run()
            torch.cuda.synchronize()
            reference = want.permute(0, 2, 3, 1).float()
            row = {"network": network, "input": [n, size, size, 4], "out_channels": out_channels, "kernel": k,
                   "stride": stride, "cudnn_us": timed(lambda: F.conv2d(x, weight, bias, stride=stride, padding=pad)),
                   "few_channels_us": timed(run),
                   "error": ((y.float() - reference).abs().max() / reference.abs().max()).item()}
            stems.append(row)
            print(f"stem {network:16} {k}x{k} s{stride} -> {out_channels:3}: cudnn {row['cudnn_us']:7.1f}  "
                  f"few_channels {row['few_channels_us']:7.1f} ({row['error']:.0e})", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "depthwise.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "batch": args.batch,
                                                    "rows": rows, "stems": stems}, indent=1))
    total = {name: sum(r[f"{name}_us"] for r in rows) for name in ["cudnn"] + list(VARIANTS)}
    print("total us:", "  ".join(f"{name} {value:.1f}" for name, value in total.items()))


if __name__ == "__main__":
    sys.exit(main())
