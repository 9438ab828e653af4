"""The cutlass backend (CSource flavor): GEMMs with fused epilogues and batched attention
matmuls, rendered from templates/cutlass into CUDA C++ with real CUTLASS (sm_90: 3.x
warp-specialized TMA kernels; sm_80: 2.x multistage), compiled by nvcc with options from
the cutlass Target alone, and picked by measurement (tuning.py) when a GPU is visible."""
from __future__ import annotations

from byoc.backend import register_backend
from byoc.target import AttrSchema, at_least, each, register_target_kind

from .attention import EXAMPLE_TILES, FLASH_TILES
from .codegen import codegen, kernel_library_units, known_cost
from .kernels import parse_shape
from .patterns import pattern_table


def _shape_check(rank: int, attr: str):
    """Items like 128x128x64 (rank 3) or 1x2 (rank 2): checked when the target is made, not
    only once a GEMM reaches the tuner."""
    def check(item):
        try:
            parse_shape(item, rank, attr)
        except ValueError:
            return f"expected a shape like {'128x128x64' if rank == 3 else '1x2'}"
        return None
    return check


# nvcc and host-compiler options that make the build run a program the flag names (another
# compiler, a wrapper, a plugin, a spec file): a build config is code, like a Makefile.
_PROGRAM_RUNNING_FLAGS = ("-ccbin", "--compiler-bindir", "-B", "-wrapper", "-fplugin", "-specs", "--run",
                          "--dependency-drive-prefix", "-Wl,-plugin", "-fuse-ld", "--use-local-env")


def _warn_program_running_flags(flags):
    """An AttrSchema check that refuses nothing but warns when the flags name a program to
    run: whoever can edit a build config can run code on the build machine through them."""
    named = [flag for flag in map(str, flags)
             if any(part.startswith(_PROGRAM_RUNNING_FLAGS) for part in flag.replace(",", " ").split())]
    if named:
        import warnings
        from byoc.errors import ByocWarning
        warnings.warn(f"cutlass.extra_nvcc_flags {named} make the build run another program (compiler, wrapper "
                      f"or plugin) named by the config; a build config is code: build only with configs you "
                      f"trust", ByocWarning, stacklevel=2)
    return None


def _stage_check(item):
    return None if str(item).isdigit() and int(item) >= 2 else "expected a stage count of at least 2"

register_target_kind("cutlass", {
    "sm": AttrSchema(int, 0, (0, 80, 86, 89, 90), "SM version of the kernels (0: the device target's)"),
    "use_fast_math": AttrSchema(bool, False, None, "nvcc --use_fast_math for the kernels"),
    "profile": AttrSchema(str, "auto", ("auto", "true", "false"), "time candidate kernels (auto: when a GPU is visible)"),
    "tuning_db": AttrSchema(str, "", None, "JSON file remembering the fastest kernel per problem"),
    "shipped_tuning": AttrSchema(bool, True, None, "after tuning_db, use the kernels byoc ships for common sm_90 "
                                 "problems (measured on an H100) instead of tuning them"),
    "extra_nvcc_flags": AttrSchema(list, [], None, "more nvcc flags for the kernels (they can name programs "
                                   "that the build runs: a config is code)", check=_warn_program_running_flags),
    "tiles": AttrSchema(list, [], None, "candidate threadblock tiles, e.g. [128x128x64, 128x256x64] (empty: all)",
                          check=each(_shape_check(3, "tiles"))),
    "clusters": AttrSchema(list, [], None, "candidate sm90 cluster shapes, e.g. [1x1, 1x2] (empty: all)",
                             check=each(_shape_check(2, "clusters"))),
    "stages": AttrSchema(list, [], None, "candidate sm80 pipeline stage counts, e.g. [3, 4] (empty: all)",
                           check=each(_stage_check)),
    "split_k": AttrSchema(bool, False, None, "let tuning try sm90 split-K (K split 2/4/8 ways) and stream-K GEMMs "
                          "(a tuning-database entry that splits is used either way)"),
    "attention_tile": AttrSchema(str, "", None, "queries x keys per thread block of the fused attention kernel: "
                                 "flash:64x64, flash:32x64, flash:64x128 or flash:32x128 (byoc's flash kernel, head dims "
                                 "64 and 128), 64x64 or 32x128 (CUTLASS's example 41 kernel); empty: by the problem's "
                                 "size and head dim",
                                 check=lambda tile: None if tile in ("",) + EXAMPLE_TILES + FLASH_TILES else
                                 "expected one of " + ", ".join(FLASH_TILES + EXAMPLE_TILES) +
                                 " (or empty: chosen by the problem's size)"),
    # Five: on the H100 measurements in tuning_sm90.json the winner of every GEMM problem is
    # among the heuristic's kernel and the cost model's first four; all 23 candidates of
    # BERT's four GEMM problems took minutes to compile.
    "tuning_candidates": AttrSchema(int, 5, None, "candidate GEMM kernels tuning compiles and times per problem: "
                                    "the heuristic's and those a cost model ranks first (0: every candidate; where "
                                    "the kernel library holds them, tuned_epilogue auto times every one it holds)",
                                    check=at_least(0)),
    # auto by default: the proxy wherever the kernel library (`byoc kernels build`) holds the
    # candidates, so that a cold build compiles winners only; own elsewhere, because on the
    # H100 (32 cores) BERT-base b1 measured cold built in 62 s with own and 88-90 s with proxy
    # when the proxies had to be compiled too (a second wave of CUTLASS compiles after timing)
    "tuned_epilogue": AttrSchema(str, "auto", ("auto", "proxy", "own"), "what candidates are timed with: auto "
                                 "(proxy for a problem whose candidates' proxy kernels are compiled already, in the "
                                 "kernel library or the object cache: every such candidate is timed; own otherwise), "
                                 "own (each problem's epilogue: the winner is the object timed) or proxy (the "
                                 "problem's bias, no activation or residual: problems differing only there share "
                                 "their candidates' compiles, and the winner is compiled after timing)"),
    # Off until its GPU tests and speed have run (written 2026-11-28 without a GPU to run them)
    "runtime_epilogue": AttrSchema(bool, False, None, "sm90 GEMM and conv kernels take their bias, activation (and a "
                                   "conv its residual) at run time: one compiled kernel per tile, dtype and layout "
                                   "serves every epilogue, so with the kernel library a build compiles no CUTLASS "
                                   "sm90 kernel (its tuning times the objects it links)"),
    # 2%: the speed acceptance of a build against one that takes every problem's fastest is 3%
    "tuning_tolerance": AttrSchema(float, 0.02, None, "how much slower than a problem's fastest candidate (a "
                                   "fraction) the kernel tuning picks may be, for a problem whose winner is compiled "
                                   "after timing (timed on the proxy), where its mainloop serves other problems of "
                                   "the build too: fewer distinct kernels to compile (0: each fastest)",
                                   check=lambda value: None if 0.0 <= value <= 0.5 else "expected 0 to 0.5"),
    "tuning_gpus": AttrSchema(int, 0, None, "GPUs tuning times candidates on at once, each a profiler process over "
                              "a share of the problems (0: every visible GPU of the first one's model)",
                              check=at_least(0)),
    "compile_threads": AttrSchema(int, 0, None, "parallel nvcc jobs while tuning (0: one per CPU)",
                                    check=at_least(0)),
    # On by default since the GPU tests that build CUTLASS kernels (test_cutlass.py, every
    # whole-model fixture with graphs on and off) and the seven real models of
    # bench/real_models.py (checked against onnxruntime) ran with it on an H100 (2026-11-24;
    # the other GPU test files build no CUTLASS kernels); BERT with PDL GEMMs in a CUDA graph matches
    # its direct runs bit for bit (test_pdl_launched_gemms_in_a_cuda_graph_agree_with_direct_
    # runs_over_fresh_inputs). The GEMM benchmark: up to 0.9 us less a GEMM (bench/results/gemm.md).
    "pdl": AttrSchema(bool, True, None, "sm90 GEMMs launch with programmatic dependent launch: their CTAs may "
                      "start while the previous kernel finishes and wait (griddepcontrol.wait) before touching memory"),
    # On by default since the whole resnet_small fixture with CUTLASS convs matched
    # onnxruntime on an H100 with CUDA graphs off and on (tests/test_cutlass.py).
    "conv2d": AttrSchema(bool, True, None, "convert NCHW conv chains to NHWC once so that CUTLASS takes the convs"),
})

def prepare_for_partition(mod, target, build_device: str):
    """CUTLASS's convs are NHWC: conv chains go NHWC once (ConvertConvLayout), and convs
    whose pixels vector loads cannot read (RGB stems) get their channels padded
    (PadConvChannels); only in a cuda build whose cutlass target takes convs."""
    if build_device != "cuda" or not target.attrs.get("conv2d"):
        return mod
    from byoc.transform.convert_conv_layout import convert_conv_layout
    from byoc.transform.pad_conv_channels import pad_conv_channels
    return pad_conv_channels(convert_conv_layout(mod))


def unavailable() -> str | None:
    """What this machine lacks to build cutlass functions: CUTLASS's headers, or nvcc."""
    from byoc.errors import BuildError
    from byoc.toolchain.locate import cuda_home, cutlass_include_dirs
    if cuda_home() is None:
        return "the CUDA toolkit (nvcc not found)"
    try:
        cutlass_include_dirs()
    except BuildError:
        return "CUTLASS's headers (pip install nvidia-cutlass)"
    return None


# The fused attention kernel's softmax runs in float32 registers: a float16 build gives it
# float16 scores, not a cast pair around a float32 softmax (which would break the pattern).
register_backend("cutlass", flavor="csource", patterns=pattern_table(), codegen=codegen, device="cuda",
                 one_composite_per_function=True, float32_statistics=("softmax",),
                 pre_partition=prepare_for_partition, known_cost=known_cost, unavailable=unavailable,
                 kernel_library=kernel_library_units)
