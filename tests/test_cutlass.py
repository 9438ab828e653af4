"""The cutlass backend: kernels render and compile for sm_90 and sm_80 (CI, no GPU), and
every pattern matches a float32 reference on a GPU."""
from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc.ir import FunctionBuilder
from byoc.toolchain.compiler import cuda_home

needs_nvcc = pytest.mark.skipif(cuda_home() is None, reason="nvcc not installed")


def _has_cutlass():
    try:
        import cutlass_library  # noqa: F401
        return True
    except ImportError:
        return False


needs_cutlass = pytest.mark.skipif(not _has_cutlass(), reason="nvidia-cutlass not installed")


def gpu_visible():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@needs_nvcc
@needs_cutlass
@pytest.mark.parametrize("sm", [90, 80])
def test_kernel_families_compile(sm, tmp_path):
    """One kernel of each family (dense with a fused epilogue, batched NT attention matmul)
    renders and compiles with nvcc."""
    from byoc.backends.cutlass.codegen import cutlass_flags
    from byoc.backends.cutlass.kernels import GemmProblem, heuristic_kernel
    from byoc.codegen.templates import render_template
    from byoc.target import Target
    from byoc.toolchain import CompileUnit, compile_units
    target = Target("cutlass", sm=sm)
    problems = [GemmProblem(1024, 3072, 768, 1, "float16", False, "gelu", True, False),
                GemmProblem(128, 128, 64, 96, "bfloat16", True, None, False, False)]
    units = []
    for index, problem in enumerate(problems):
        kernel = heuristic_kernel(sm, problem)
        source = tmp_path / f"k{index}.cu"
        indices = {"a": 0, "b": 1, "bias": 2} if problem.has_bias else {"a": 0, "b": 1}
        template = "cutlass/gemm_sm90.cu.j2" if sm == 90 else "cutlass/gemm_sm80.cu.j2"
        source.write_text(render_template(template, kernel.template_data(problem, f"kernel_{index}", indices)))
        assert kernel.name(problem) in source.read_text()
        units.append(CompileUnit(source, "cuda", cutlass_flags(target, sm), f"k{index}.o"))
    objects = compile_units(units, tmp_path)
    assert all(Path(o).stat().st_size > 0 for o in objects)


def test_heuristic_and_names():
    from byoc.backends.cutlass.kernels import GemmProblem, heuristic_kernel
    problem = GemmProblem(1024, 768, 768, 1, "float16", False, None, True, True)
    kernel = heuristic_kernel(90, problem)
    assert kernel.name(problem).startswith("cutlass_sm90_f16_") and kernel.name(problem).endswith("_nn_bias_residual")
    with pytest.raises(ValueError, match="no sm80 kernel supports"):  # sm80 takes bias or residual, not both
        heuristic_kernel(80, GemmProblem(64, 64, 64, 1, "float16", False, None, True, True))


def _model(kind, m, n, k, dtype="float16", batch=()):
    rng = np.random.default_rng(0)
    with FunctionBuilder("main") as fb:
        a = fb.param("a", batch + (m, k), "float32")
        a16 = fb.call("cast", a, dtype=dtype)
        if kind.startswith("batched"):
            b = fb.param("b", batch + ((n, k) if kind == "batched_nt" else (k, n)), "float32")
            b16 = fb.call("cast", b, dtype=dtype)
            if kind == "batched_nt":
                rank = len(batch) + 2
                b16 = fb.call("transpose", b16, axes=tuple(range(rank - 2)) + (rank - 1, rank - 2))
            y = fb.call("matmul", a16, b16)
        else:
            w = (rng.standard_normal((k, n)) * 0.1).astype(dtype)
            y = fb.call("matmul", a16, w)
            if "bias" in kind:
                y = fb.call("add", y, (rng.standard_normal(n) * 0.1).astype(dtype))
            if "gelu" in kind:
                y = fb.call("gelu", y)
            if "relu" in kind:
                y = fb.call("relu", y)
            if "residual" in kind:
                r = fb.param("r", batch + (m, n), "float32")
                y = fb.call("add", y, fb.call("cast", r, dtype=dtype))
        fb.ret(fb.call("cast", y, dtype="float32"))
    return fb.module()


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
@pytest.mark.parametrize("kind, m, n, k, batch", [
    ("dense", 1000, 264, 136, ()), ("dense_bias", 77, 512, 256, (3,)), ("dense_bias_gelu", 1024, 3072, 768, ()),
    ("dense_bias_relu", 130, 200, 64, ()), ("dense_bias_residual", 333, 768, 768, ()),
    ("batched", 128, 64, 128, (2, 12)), ("batched_nt", 128, 128, 64, (2, 12))])
def test_patterns_match_float32_reference(kind, m, n, k, batch, tmp_path):
    import cupy
    mod = _model(kind, m, n, k, batch=batch)
    library = byoc.build(mod, config={"target": "auto", "backends": [{"cutlass": {"profile": "false"}}]},
                         workdir=str(tmp_path / "w"))
    assert "cutlass" in library.metadata["backends"], library.report.to_text()
    module = library.load()
    rng = np.random.default_rng(1)
    inputs = {p.name_hint: rng.standard_normal(p.type.shape).astype(np.float32) for p in mod["main"].params}
    got = cupy.asnumpy(module.run(**{k_: cupy.asarray(v) for k_, v in inputs.items()}))
    # float32 reference: the same graph with every cast to float16 removed
    reference = byoc.interpret(mod, **inputs)
    scale = np.max(np.abs(reference))
    assert np.max(np.abs(got - reference)) <= 1e-2 * scale, kind
