"""The cutlass target's runtime_epilogue: sm90 GEMM and conv kernels that take their bias and
activation (a conv its residual too) at run time, so that one compiled unit per tile, dtype
and layout serves every epilogue, and the kernel library holds every sm90 kernel a build
links."""
from __future__ import annotations

import re

import numpy as np
import pytest
from gpu_probe import gpu_present

import byoc
from byoc.backends.cutlass import tuning
from byoc.backends.cutlass.kernels import (ACTIVATION_CODES, SM80_CANDIDATES, SM90_CANDIDATES, SM90_CONV_CANDIDATES,
                                           ConvProblem, GemmProblem, kernel_unit, partition_call, runtime_problem,
                                           usable_candidates)
from byoc.backends.cutlass.library import library_units
from byoc.ir.builder import FunctionBuilder
from byoc.toolchain.locate import cuda_home

FLAGS = ["-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17"]
GEMM = SM90_CANDIDATES[8]  # 64x64x64 pingpong
CONV = SM90_CONV_CANDIDATES[3]  # 128x64x64 ws


def gemm(activation=None, bias=True, residual=False, transposed=True, m=1024):
    return GemmProblem(m, 768, 768, 1, "float16", transposed, activation, bias, residual,
                       residual_in_activation=bool(residual and activation))


def conv(activation=None, bias=True, residual=False):
    return ConvProblem(32, 56, 56, 64, 64, 3, 3, 56, 56, (1, 1), (1, 1, 1, 1), (1, 1), "float16", activation, bias,
                       residual)


def test_one_runtime_unit_serves_every_epilogue_of_a_dtype_and_layout():
    """GEMMs: one unit without a residual, one with; convs: one; the sm80 kernels keep their
    compiled epilogues. The unit's name is the kernel's as it runs the problem, its text
    takes the call's bias, activation and (convs) residual."""
    plain = {kernel_unit(GEMM, gemm(activation, bias), FLAGS, True).entry
             for activation in ACTIVATION_CODES for bias in (False, True)}
    assert len(plain) == 1
    with_residual = {kernel_unit(GEMM, gemm(activation, True, True), FLAGS, True).entry for activation in (None, "relu")}
    assert len(with_residual) == 1 and with_residual != plain
    assert kernel_unit(GEMM, gemm(transposed=False), FLAGS, True).entry not in plain
    convs = {kernel_unit(CONV, conv(activation, bias, residual), FLAGS, True).entry
             for activation in (None, "relu", "silu", "hard_swish") for bias in (False, True)
             for residual in (False, True)}
    assert len(convs) == 1
    # without it, each epilogue its own unit, as before
    assert len({kernel_unit(GEMM, gemm(activation), FLAGS).entry for activation in ("relu", "gelu")}) == 2
    unit = kernel_unit(GEMM, gemm("gelu"), FLAGS, True)
    assert unit.name == GEMM.name(gemm("gelu")) and unit.name.endswith("_bias_gelu")
    assert '#include "byoc_runtime_activation.h"' in unit.device_source
    assert "byoc_cutlass::RuntimeActivation" in unit.device_source
    assert "call->bias >= 0 ?" in unit.source and "activation.kind = call->activation" in unit.source
    conv_unit = kernel_unit(CONV, conv("relu"), FLAGS, True)
    assert "call->residual >= 0 ? 1.0f : 0.0f" in conv_unit.source
    assert runtime_problem(SM80_CANDIDATES[0], gemm("relu")) is None  # a 2.x template: its own epilogue
    sm80 = kernel_unit(SM80_CANDIDATES[0], gemm("relu"), FLAGS, True)
    assert sm80.entry == kernel_unit(SM80_CANDIDATES[0], gemm("relu"), FLAGS).entry


def test_the_call_carries_the_activation_code():
    unit = kernel_unit(GEMM, gemm("silu"), FLAGS, True)
    call = partition_call("part_0", unit, GEMM, gemm("silu"), {"a": 0, "b": 1, "bias": 2})
    assert call["activation"] == ACTIVATION_CODES["silu"] == 4 and call["bias"] == 2 and call["residual"] == -1
    from byoc.backends.cutlass.kernels import INCLUDE_DIR
    header = (INCLUDE_DIR / "byoc_runtime_activation.h").read_text()
    codes = dict((name, int(code)) for name, code in re.findall(r"kByoc(\w+) = (\d+)", header))
    assert codes == {"Identity": 0, "Relu": 1, "Gelu": 2, "GeluTanh": 3, "Silu": 4, "Sigmoid": 5, "HardSwish": 6}
    assert sorted(ACTIVATION_CODES.values()) == sorted(codes.values())


def test_the_runtime_library_is_every_unit_tuning_and_the_build_ask_for(tmp_path):
    """With runtime_epilogue the library's units are the ones tuning times and the build
    links: no proxy, nothing compiled after timing."""
    library = {unit.entry for unit in library_units(90, FLAGS, runtime_epilogue=True)}
    assert len(library) < len(library_units(90, FLAGS))  # a conv kernel's plain and bias are one unit now
    for problem in (gemm("gelu"), gemm(None, True, True), gemm("relu", True, True), gemm(None, False),
                    conv("relu", True, True), conv("silu")):
        for kernel in usable_candidates(90, problem):
            unit = kernel_unit(kernel, problem, FLAGS, True)
            assert unit.entry in library or runtime_problem(kernel, problem) is None, (problem.key, unit.name)


def test_tuning_with_runtime_epilogues_times_the_objects_the_build_links(monkeypatch, tmp_path):
    problem = gemm("gelu")
    allowed = tuning.CandidateFilter(per_problem=5)
    monkeypatch.setattr(tuning, "_compiled", lambda kernels, timed, flags, workdir, runtime=False, memo=None:
                        [runtime and timed == problem] * len(kernels))
    kernels, proxy, held = tuning.tuning_plan(problem, 90, allowed, FLAGS, tmp_path, "auto", runtime_epilogue=True)
    assert kernels == usable_candidates(90, problem) and proxy is False and held == len(kernels)
    kernels, proxy, _ = tuning.tuning_plan(problem, 90, allowed, FLAGS, tmp_path, "own", runtime_epilogue=True)
    assert kernels == usable_candidates(90, problem, allowed) and proxy is False


def _epilogue_model(rng, m=200, k=136, n=264):
    """A float32-in/out model of GEMMs, each with another epilogue (every activation with a
    bias, none, a residual), on sizes that are no tile's multiple; one output each."""
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (m, k), "float32")
        x16 = fb.call("cast", x, dtype="float16")
        outputs = []
        for activation in (None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "hard_swish"):
            y = fb.call("matmul", x16, (rng.standard_normal((k, n)) * 0.1).astype("float16"))
            y = fb.call("add", y, (rng.standard_normal(n) * 0.1).astype("float16"))
            if activation == "gelu_tanh":
                y = fb.call("gelu", y, approximate="tanh")
            elif activation:
                y = fb.call(activation, y)
            outputs.append(y)
        outputs.append(fb.call("matmul", x16, (rng.standard_normal((k, n)) * 0.1).astype("float16")))  # no bias
        outputs.append(fb.call("add", fb.call("add", fb.call("matmul", x16, (rng.standard_normal((k, n)) * 0.1)
                                                             .astype("float16")),
                                              (rng.standard_normal(n) * 0.1).astype("float16")), outputs[0]))
        fb.ret(*[fb.call("cast", y, dtype="float32") for y in outputs])
    return fb.module()


@pytest.mark.nvcc
@pytest.mark.skipif(cuda_home() is None, reason="nvcc not installed")
def test_a_runtime_epilogue_gemm_and_conv_compile(tmp_path, monkeypatch):
    """nvcc takes the runtime GEMM unit (both halves) and the conv's device half."""
    from byoc.backends.cutlass.codegen import kernel_compile_units
    from byoc.toolchain import compile_units
    from byoc.toolchain.locate import cutlass_include_dirs
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    flags = FLAGS + ["-Xcompiler=-fPIC", "--expt-relaxed-constexpr", "-DNDEBUG"] + \
        [f"-I{d}" for d in cutlass_include_dirs()]
    units = kernel_compile_units([kernel_unit(GEMM, gemm("gelu"), flags, True)], tmp_path, unity=False)
    conv_units = kernel_compile_units([kernel_unit(CONV, conv("relu", True, True), flags, True)], tmp_path,
                                      unity=False)
    objects = compile_units(units + [unit for unit in conv_units if unit.language == "cubin"], tmp_path, jobs=2)
    assert all(path.is_file() and path.stat().st_size > 0 for path in objects)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_runtime_epilogue_gemms_match_the_float32_reference_on_the_gpu(cuda_graph, tmp_path, monkeypatch):
    """Every activation with a bias, none, and a residual, each a GEMM of the same kernel
    type compiled once, on sizes that are no tile's multiple: each output against the
    float32 reference and against the build with compiled epilogues (the same kernel's
    arithmetic: they agree to rounding)."""
    import cupy
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(5)
    module = _epilogue_model(rng)
    x = rng.standard_normal((200, 136)).astype(np.float32)
    want = byoc.interpret(module, x=x)
    got = {}
    for runtime in (True, False):
        config = {"target": "cuda -arch=sm_90", "cuda_graph": cuda_graph,
                  "backends": [{"cutlass": {"sm": 90, "runtime_epilogue": runtime, "profile": "false"}}, "builtin"]}
        library = byoc.build(module, config=config, workdir=str(tmp_path / f"w{runtime}"))
        runtime_sources = list((tmp_path / f"w{runtime}").glob("byoc_cutlass_sm90_*_runtime_*_device.cu"))
        assert bool(runtime_sources) == runtime, library.report.to_text()
        got[runtime] = [cupy.asnumpy(out) for out in library.load().run(x=cupy.asarray(x))]
    for index, (mine, fused, reference) in enumerate(zip(got[True], got[False], want, strict=True)):
        scale = np.max(np.abs(reference))
        assert np.max(np.abs(mine - reference)) <= 2e-2 * scale, index
        assert np.max(np.abs(mine - fused)) <= 1e-3 * scale, index  # gelu and its tanh form differ by more


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
def test_runtime_epilogue_convs_match_the_float32_reference_on_the_gpu(tmp_path, monkeypatch):
    """A conv net's epilogues (bias + ReLU, bias + residual + ReLU, SiLU, none) through one
    runtime conv kernel type, channels no tile's multiple."""
    import cupy
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(6)
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (4, 24, 20, 20), "float32")
        h = fb.call("cast", x, dtype="float16")

        def conv_block(value, channels_in, activation, residual=None):
            y = fb.call("conv2d", value, (rng.standard_normal((24, channels_in, 3, 3)) * 0.1).astype("float16"),
                        strides=(1, 1), pads=(1, 1, 1, 1))
            y = fb.call("add", y, (rng.standard_normal((24, 1, 1)) * 0.1).astype("float16"))
            if residual is not None:
                y = fb.call("add", y, residual)
            return fb.call(activation, y) if activation else y
        a = conv_block(h, 24, "relu")
        b = conv_block(a, 24, "relu", residual=h)
        c = conv_block(b, 24, "silu")
        d = conv_block(c, 24, None)
        fb.ret(fb.call("cast", d, dtype="float32"))
    module = fb.module()
    config = {"target": "cuda -arch=sm_90",
              "backends": [{"cutlass": {"sm": 90, "runtime_epilogue": True, "profile": "false"}}, "builtin"]}
    library = byoc.build(module, config=config, workdir=str(tmp_path / "w"))
    assert list((tmp_path / "w").glob("byoc_cutlass_sm90_*fprop*_runtime_*_device.cu")), library.report.to_text()
    feeds = {"x": rng.standard_normal((4, 24, 20, 20)).astype(np.float32)}
    got = cupy.asnumpy(library.load().run(x=cupy.asarray(feeds["x"])))
    want = byoc.interpret(module, **feeds)
    assert np.max(np.abs(got - want)) <= 2e-2 * np.max(np.abs(want)), library.report.to_text()


def test_an_activation_without_a_runtime_code_is_refused_and_stems_keep_their_proxy(monkeypatch, tmp_path):
    from byoc.backends.cutlass.kernels import activation_code
    from byoc.errors import BuildError
    assert activation_code(None) == 0 and activation_code("hard_swish") == 6
    with pytest.raises(BuildError, match="'tanh' has no runtime code"):
        activation_code("tanh")
    # an RGB stem: its candidates are sm80 fixed-channel kernels, with no runtime form, so it is
    # tuned as without runtime_epilogue (on its proxy where the library holds those)
    stem = ConvProblem(32, 224, 224, 4, 64, 7, 7, 112, 112, (2, 2), (3, 3, 3, 3), (1, 1), "float16", "relu", True)
    assert all(runtime_problem(kernel, stem) is None for kernel in usable_candidates(90, stem))
    monkeypatch.setattr(tuning, "_compiled", lambda kernels, timed, flags, workdir, runtime=False, memo=None:
                        [timed.epilogue_name == "bias" and not runtime] * len(kernels))
    kernels, proxy, _ = tuning.tuning_plan(stem, 90, tuning.CandidateFilter(), FLAGS, tmp_path, "auto",
                                           runtime_epilogue=True)
    assert proxy is True and kernels == usable_candidates(90, stem)
