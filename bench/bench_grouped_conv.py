"""The grouped conv kernel of the built-in shim (backends/builtin/shim/cuda/grouped_conv.cuh)
side by side with cuDNN's (torch's F.conv2d, channels-last fp16), on the grouped 3x3 convs
of RegNetY-400MF (8 channels a group), RegNetY-800MF (16) and ResNeXt-50 32x4d (8 to 32)
at batch 32. Each output is checked against cuDNN's; times are CUDA-event medians.

    python bench/bench_grouped_conv.py --out DIR
Writes DIR/grouped_conv.json and prints a table (us per conv).
"""
import argparse
import ctypes
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from shim_kernels import BIAS_STORE, compile_library, timed

# (network, height, width, channels, group width, stride): the input of each distinct grouped conv
CASES = [
    ("regnet_y_400mf", 112, 112, 48, 8, 2), ("regnet_y_400mf", 56, 56, 104, 8, 2),
    ("regnet_y_400mf", 28, 28, 104, 8, 1), ("regnet_y_400mf", 28, 28, 208, 8, 2),
    ("regnet_y_400mf", 14, 14, 208, 8, 1), ("regnet_y_400mf", 14, 14, 440, 8, 2),
    ("regnet_y_400mf", 7, 7, 440, 8, 1),
    ("regnet_y_800mf", 112, 112, 64, 16, 2), ("regnet_y_800mf", 28, 28, 144, 16, 1),
    ("regnet_y_800mf", 14, 14, 320, 16, 1), ("regnet_y_800mf", 7, 7, 784, 16, 1),
    ("resnext50_32x4d", 28, 28, 256, 8, 1), ("resnext50_32x4d", 14, 14, 512, 16, 1),
    ("resnext50_32x4d", 7, 7, 1024, 32, 1),
]


def source():
    """A .cu with one C entry point: grouped_conv.cuh's kernel storing sum + bias."""
    return "\n".join([
        '#include "grouped_conv.cuh"',
        *BIAS_STORE,
        'extern "C" int grouped(const __half* x, const __half* w, const __half* b, __half* y, int n, int h, int wd,',
        "                       int c, int group, int stride, int oh, int ow) {",
        "  const byoc_depthwise::Geometry<int> s{h, wd, c, 3, 3, oh, ow, stride, stride, 1, 1, 1, 1};",
        "  return byoc_depthwise::launch_grouped_runtime(x, w, n, s, group, group, Store{y, b, c / 8}, 0);",
        "}",
    ])


def build(workdir):
    lib = compile_library(source(), "bench_grouped_conv", workdir)
    lib.grouped.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 8
    return lib


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        lib = build(workdir)
        for network, h, w, c, group, stride in CASES:
            n = args.batch
            x = torch.randn(n, c, h, w, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
            weight = torch.randn(c, group, 3, 3, device="cuda", dtype=torch.half) / 8
            bias = torch.randn(c, device="cuda", dtype=torch.half)
            want = F.conv2d(x, weight, bias, stride=stride, padding=1, groups=c // group)
            oh, ow = want.shape[2], want.shape[3]
            x_nhwc = x.permute(0, 2, 3, 1).contiguous()
            w_ohwi = weight.permute(0, 2, 3, 1).contiguous()
            y = torch.empty(n, oh, ow, c, device="cuda", dtype=torch.half)

            def ours():
                status = lib.grouped(x_nhwc.data_ptr(), w_ohwi.data_ptr(), bias.data_ptr(), y.data_ptr(), n, h, w, c,
                                     group, stride, oh, ow)
                assert status == 0, status

            ours()
            torch.cuda.synchronize()
            reference = want.permute(0, 2, 3, 1).float()
            error = ((y.float() - reference).abs().max() / reference.abs().max()).item()
            row = {"network": network, "input": [n, h, w, c], "group": group, "stride": stride,
                   "cudnn_us": timed(lambda: F.conv2d(x, weight, bias, stride=stride, padding=1, groups=c // group)),
                   "grouped_us": timed(ours), "max_rel_error": error}
            rows.append(row)
            print(f"{network:16} {h:3}x{w:<3} x{c:<4} g{group:<2} s{stride}: grouped {row['grouped_us']:7.1f}  "
                  f"cuDNN {row['cudnn_us']:7.1f}  ({error:.0e})", flush=True)
    for network in dict.fromkeys(r["network"] for r in rows):
        mine = [r for r in rows if r["network"] == network]
        print(f"total {network}: grouped {sum(r['grouped_us'] for r in mine):.1f} us, "
              f"cuDNN {sum(r['cudnn_us'] for r in mine):.1f} us (each distinct conv once)")
    result = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "grouped_conv.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
