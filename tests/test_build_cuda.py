"""The cuda target: models compile and link for sm_90 without a GPU (CI), and run
correctly on one (gpu tests, run on the lent H100)."""
import os
import shutil
import sys
import subprocess
from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc.codegen.program_table import read_program_table
from byoc.toolchain.locate import cuda_home
from gpu_probe import gpu_present

FIXTURES = Path(__file__).parent / "fixtures"

def needs_nvcc(test):
    """Compiles CUDA with nvcc (marked nvcc: minutes on 2 cores with an empty object cache;
    `-m "not nvcc"` leaves these out); skipped where nvcc is not installed."""
    return pytest.mark.nvcc(pytest.mark.skipif(cuda_home() is None, reason="nvcc not installed")(test))


def gpu_visible():
    return gpu_present()  # the driver's answer (tests/gpu_probe.py)


def fixture(name):
    data = np.load(FIXTURES / f"{name}.npz")
    return ({k[3:]: data[k] for k in data if k.startswith("in_")},
            {k[4:]: data[k] for k in data if k.startswith("out_")})


@needs_nvcc
@pytest.mark.parametrize("name", ["mlp", "bert2", "resnet_small"])
def test_models_compile_and_link_for_sm90(name, tmp_path):
    inputs, _ = fixture(name)
    library = byoc.build(FIXTURES / f"{name}.onnx", target="cuda -arch=sm_90", config="default",
                         workdir=str(tmp_path / "w"), input_shapes={k: v.shape for k, v in inputs.items()})
    assert library.metadata["arch"] == "sm_90"
    dynamic = subprocess.run(["readelf", "-d", str(library.path)], capture_output=True, text=True).stdout
    needed = [line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line]
    # `default` on sm_90: the tuned backends this machine can build (backends: auto), so
    # cuBLASLt and, for resnet_small's convs where the cudnn extra is installed, cuDNN
    allowed = ("libstdc++", "libm.", "libgcc_s", "libc.", "ld-linux", "libcublasLt", "libcublas", "libcudnn", "libdl",
               "libpthread", "librt")
    assert all(n.startswith(allowed) for n in needed), needed
    assert not any(n.startswith("libcudart") for n in needed)  # cudart is linked statically
    # no path of this machine: cuBLASLt is named by soname and found at load (the toolkit's
    # or NVIDIA's pip package's, runtime/shared_libraries.py)
    assert "RUNPATH" not in dynamic and "RPATH" not in dynamic, dynamic
    if name == "mlp":
        assert any(n.startswith("libcublasLt.so.") for n in needed), needed
        # a fresh process with no library path of its own reads the metadata: dlopen
        # resolved libcublasLt by its soname
        deployed = tmp_path / "deployed.so"
        library.export_library(deployed)
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        code = ("import sys, byoc.runtime.library_file as f; "
                "print(f.metadata_of(sys.argv[1])['arch'])")
        result = subprocess.run([sys.executable, "-c", code, str(deployed)], capture_output=True,
                                text=True, env=env, timeout=120)
        assert result.returncode == 0 and result.stdout.strip() == "sm_90", result.stdout + result.stderr
    if name == "mlp" and not gpu_visible():
        # where it cannot run, it says why in the user's terms (not "CUDA driver version is
        # insufficient for CUDA runtime version", the runtime's message for no driver at all)
        with pytest.raises(byoc.RuntimeError, match=r"this model runs on an NVIDIA GPU \(built for sm_90\), but "
                                                    r"(this machine has no NVIDIA driver|no CUDA device is visible)"):
            library.load()


def test_the_shim_sources_that_call_cublaslt_are_the_ones_listed():
    """The builtin backend links cuBLASLt only when one of these is compiled in."""
    from byoc.backends.builtin import CUBLASLT_SHIM_SOURCES, SHIM_DIR
    found = {path.name for path in (SHIM_DIR / "cuda").iterdir() if "cublasLt" in path.read_text()}
    assert found == set(CUBLASLT_SHIM_SOURCES)


@needs_nvcc
def test_a_cuda_library_without_matmuls_needs_no_cublaslt_and_names_no_build_path(tmp_path):
    """Elementwise ops and a softmax for sm_90: the library lists no libcublasLt and carries
    no RUNPATH (it pointed into the build machine's venv whether or not it was needed)."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    library = byoc.build(model, target="cuda -arch=sm_90", config="default", workdir=str(tmp_path / "w"))
    dynamic = subprocess.run(["readelf", "-d", str(library.path)], capture_output=True, text=True).stdout
    needed = [line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed and not any(n.startswith("libcublas") for n in needed), needed
    assert "RUNPATH" not in dynamic and "RPATH" not in dynamic, dynamic


@needs_nvcc
def test_cuda_graph_build_copies_every_output_out_of_planned_storage(tmp_path):
    """With graphs, no kernel writes the caller's buffers: run() copies each output after
    the replay (host code compiles and links for sm_90)."""
    inputs, _ = fixture("bert2")
    library = byoc.build(FIXTURES / "bert2.onnx", target="cuda -arch=sm_90",
                         config={"cuda_graph": True, "precision": "float16"}, workdir=str(tmp_path / "w"),
                         input_shapes={k: v.shape for k, v in inputs.items()})
    host = (tmp_path / "w" / "host.cc").read_text()
    program = read_program_table((tmp_path / "w" / "program.bin").read_bytes())
    assert library.metadata["cuda_graph"]
    # every caller tensor is copied (the runtime copies inputs in before the replay and
    # outputs out after it), from and into planned storage ...
    assert [copy[0] for copy in program["input_copies"]] == list(range(len(library.metadata["inputs"])))
    assert [copy[0] for copy in program["output_copies"]] == list(range(len(library.metadata["outputs"])))
    assert all(copy[1][0] == "kArena" for copy in program["input_copies"] + program["output_copies"])
    # ... and no call reads or writes the caller's buffers
    assert not any(space in ("kInput", "kOutput") for space, _ in program["refs"])
    assert "    true, false,\n" in host.split("kVariants[] = {")[1]  # cuda_graph, not graph_io "update"


gpu = pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name, precision, tolerance", [
    ("mlp", "float32", 1e-3), ("bert2", "float32", 1e-3), ("resnet_small", "float32", 1e-3),
    ("bert2", "float16", 1e-2), ("resnet_small", "float16", 1e-2), ("gpt2_2l", "float16", 1e-2)])
def test_models_run_on_gpu(name, precision, tolerance, tmp_path):
    """The built-in backend alone runs whole models on the visible GPU (target: auto)."""
    import cupy
    inputs, expected = fixture(name)
    library = byoc.build(FIXTURES / f"{name}.onnx", config={"target": "auto", "backends": []}, precision=precision,
                         workdir=str(tmp_path / "w"), input_shapes={k: v.shape for k, v in inputs.items()})
    # target: auto picks the target from the visible GPU: this test is about the cuda one
    assert library.metadata["target"].startswith("cuda"), library.metadata["target"]
    assert {f["backend"] for f in library.metadata["functions"]} == {"builtin"}
    deployed = library.export_library(tmp_path / "deploy" / "model.so")
    shutil.rmtree(tmp_path / "w")
    module = byoc.runtime.load(deployed)
    device_inputs = {k: cupy.asarray(v) for k, v in inputs.items()}
    results = module.run(**device_inputs)
    results = results if isinstance(results, tuple) else (results,)
    for got, want in zip(results, expected.values(), strict=True):
        got = cupy.asnumpy(got)
        assert np.max(np.abs(got - want)) <= tolerance * np.max(np.abs(want))
    # the same inputs 100 times, fresh output buffers each time: identical results
    first = [cupy.asnumpy(r) for r in results]
    for _ in range(100):
        again = module.run(**device_inputs)
        again = again if isinstance(again, tuple) else (again,)
    assert all(np.array_equal(cupy.asnumpy(a), b) for a, b in zip(again, first))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name, backend", [("mlp", "cublaslt"), ("resnet_small", "cudnn")])
def test_default_on_a_gpu_takes_the_tuned_backends_in_float32_with_tf32(name, backend, tmp_path):
    """`default` with nothing else on a GPU machine: the tuned backends (here cuBLASLt's
    TF32 matmuls, cuDNN's convs where the cudnn extra is installed) and CUDA graphs, in the
    model's float32; the outputs within TF32's tolerance of onnxruntime's."""
    import cupy
    from byoc.toolchain.locate import missing_nvidia_library
    if backend == "cudnn" and missing_nvidia_library("cudnn"):
        pytest.skip("the cudnn extra is not installed")
    inputs, expected = fixture(name)
    library = byoc.build(FIXTURES / f"{name}.onnx", workdir=str(tmp_path / "w"),
                         input_shapes={k: v.shape for k, v in inputs.items()})
    assert library.metadata["target"].startswith("cuda") and library.metadata["cuda_graph"]
    assert backend in {f["backend"] for f in library.metadata["functions"]}
    results = library.load().run(**{k: cupy.asarray(v) for k, v in inputs.items()})
    results = results if isinstance(results, tuple) else (results,)
    for got, want in zip(results, expected.values(), strict=True):
        assert np.max(np.abs(cupy.asnumpy(got) - want)) <= 1e-2 * np.max(np.abs(want))


@pytest.mark.gpu
@gpu
def test_bad_device_and_arch_errors(tmp_path):
    import cupy
    inputs, _ = fixture("mlp")
    library = byoc.build(FIXTURES / "mlp.onnx", config="default", workdir=str(tmp_path / "w"))
    module = library.load()
    with pytest.raises(byoc.RuntimeError, match=r"input 'x' \(#0\): expected a CUDA device tensor"):
        module.run(x=inputs["x"])  # a NumPy (host) array
    module.run(x=cupy.asarray(inputs["x"]))  # still works afterwards
    other = byoc.build(FIXTURES / "mlp.onnx", target="cuda -arch=sm_80", config="default",
                       workdir=str(tmp_path / "w80"))
    with pytest.raises(byoc.RuntimeError, match=r"built for sm_80, but CUDA device 0 .* is sm_90"):
        other.load()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("stream_kind", ["legacy default stream", "caller's stream"])
def test_cuda_graph_on_and_off_agree_over_100_fresh_inputs(stream_kind, tmp_path):
    import cupy
    inputs, expected = fixture("bert2")
    shapes = {k: v.shape for k, v in inputs.items()}
    variants = {False: {"cuda_graph": False}, True: {"cuda_graph": True},
                "update": {"cuda_graph": True, "cuda_graph_io": "update"}}
    modules = {name: byoc.build(FIXTURES / "bert2.onnx", config={**config, "precision": "float16"},
                                workdir=str(tmp_path / str(name)), input_shapes=shapes).load()
               for name, config in variants.items()}
    assert modules[True].metadata["cuda_graph"] and not modules[False].metadata["cuda_graph"]
    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True) if stream_kind == "caller's stream" else cupy.cuda.Stream.null
    with stream:
        for step in range(100):
            fresh = {k: cupy.asarray(rng.integers(0, 2, v.shape).astype(v.dtype) if v.dtype.kind in "iu"
                                     else rng.standard_normal(v.shape).astype(v.dtype))
                     for k, v in inputs.items()}
            if step == 0:
                fresh = {k: cupy.asarray(v) for k, v in inputs.items()}
            results = {}
            for graph, module in modules.items():
                got = module.run(**fresh)
                results[graph] = [cupy.asnumpy(r) for r in (got if isinstance(got, tuple) else (got,))]
            for variant in (True, "update"):  # graphs (copying or updating) give what direct runs give
                for on, off in zip(results[variant], results[False], strict=True):
                    np.testing.assert_array_equal(on, off)
            if step == 0:
                for got, want in zip(results[True], expected.values(), strict=True):
                    assert np.max(np.abs(got - want)) <= 1e-2 * np.max(np.abs(want))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", ["bert2", "gpt2_2l", "resnet_small"])
def test_builtin_kernels_with_pdl_agree_with_plain_launches(name, tmp_path):
    """The built-in kernels launched with programmatic dependent launch (the cuda target's
    pdl, on by default) start while the previous kernel drains and wait for it: in a CUDA
    graph and directly, over fresh inputs, they give bit for bit what plain launches give."""
    import cupy
    inputs, expected = fixture(name)
    shapes = {k: v.shape for k, v in inputs.items()}
    modules = {}
    for pdl, graph in ((True, True), (True, False), (False, True)):
        library = byoc.build(FIXTURES / f"{name}.onnx", target=f"cuda -arch=sm_90 -pdl={int(pdl)}",
                             config={"backends": [], "precision": "float16", "cuda_graph": graph},
                             workdir=str(tmp_path / f"pdl{pdl}_graph{graph}"), input_shapes=shapes)
        flags = (tmp_path / f"pdl{pdl}_graph{graph}" / "build.ninja").read_text()
        assert ("-DBYOC_PDL" in flags) == pdl
        modules[pdl, graph] = library.load()
    rng = np.random.default_rng(1)
    for step in range(20):
        fresh = {k: cupy.asarray(v if step == 0 else (rng.integers(0, 2, v.shape).astype(v.dtype)
                                                       if v.dtype.kind in "iu" else
                                                       rng.standard_normal(v.shape).astype(v.dtype)))
                 for k, v in inputs.items()}
        results = {}
        for key, module in modules.items():
            got = module.run(**fresh)
            results[key] = [cupy.asnumpy(r) for r in (got if isinstance(got, tuple) else (got,))]
        for key in modules:
            for got, plain in zip(results[key], results[False, True], strict=True):
                np.testing.assert_array_equal(got, plain, err_msg=f"pdl, graph = {key}, step {step}")
        if step == 0:
            for got, want in zip(results[True, True], expected.values(), strict=True):
                assert np.max(np.abs(got - want)) <= 2e-2 * np.max(np.abs(want))


@needs_nvcc
def test_cuda_graph_update_mode_reads_and_writes_the_callers_tensors(tmp_path):
    """cuda_graph_io: update captures the calls on the caller's pointers (no staging copies)
    and updates the executable graph when they change (host code compiles and links)."""
    inputs, _ = fixture("bert2")
    byoc.build(FIXTURES / "bert2.onnx", target="cuda -arch=sm_90",
               config={"cuda_graph": True, "cuda_graph_io": "update", "precision": "float16"},
               workdir=str(tmp_path / "w"), input_shapes={k: v.shape for k, v in inputs.items()})
    host = (tmp_path / "w" / "host.cc").read_text()
    spec = host.split("kVariants[] = {")[1]
    assert "    true, true,\n" in spec  # cuda_graph, graph_io "update" (the runtime updates the graph)
    program = read_program_table((tmp_path / "w" / "program.bin").read_bytes())
    assert program["input_copies"] == []  # no staging copies
    assert ("kInput", 0) in program["refs"]  # a call reads the caller's input itself


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("graph_io", ["copy", "update"])
def test_shape_buckets_on_the_gpu_each_with_its_own_graphs(graph_io, tmp_path):
    """A library of shape buckets on the GPU (CUTLASS GEMMs and attention, CUDA graphs): each
    bucket's program matches onnxruntime, its graphs captured on its own, and runs that
    alternate between buckets (one arena, shared) keep every bucket's results exact."""
    import cupy
    import onnxruntime as ort
    model = FIXTURES / "bert2.onnx"
    config = {"target": "cuda -arch=sm_90", "backends": [{"cutlass": {"sm": 90}}, "cublaslt", "builtin"],
              "precision": "float16", "cuda_graph": True, "cuda_graph_io": graph_io, "tuning": {"profile": False}}
    library = byoc.build(model, config=config, workdir=str(tmp_path / "w"), dims={"batch": [1, 3], "sequence": [16, 32]})
    assert len(library.metadata["variants"]) == 4
    assert library.metadata["dims"]["batch"]["paddable"] is True
    module = library.load()
    session = ort.InferenceSession(str(model))
    rng = np.random.default_rng(1)
    feeds, first = {}, {}
    # batch 2: padded into the batch-3 buckets (their graphs capture the staging buffers)
    for batch, sequence in ((1, 16), (3, 32), (2, 32), (3, 16), (2, 16), (1, 32)):
        feeds[batch, sequence] = {i.name: rng.integers(0, 100 if i.name == "input_ids" else 2,
                                                       (batch, sequence)).astype(np.int64)
                                  for i in session.get_inputs()}
    for key, feed in feeds.items():
        want = session.run(None, feed)
        got = [cupy.asnumpy(r) for r in module.run(**{k: cupy.asarray(v) for k, v in feed.items()})]
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and np.max(np.abs(g - w)) <= 2e-2 * np.max(np.abs(w)), key
        first[key] = got
    for _ in range(3):  # captured graphs replayed, bucket after bucket
        for key, feed in feeds.items():
            again = [cupy.asnumpy(r) for r in module.run(**{k: cupy.asarray(v) for k, v in feed.items()})]
            assert all(np.array_equal(a, b) for a, b in zip(again, first[key])), key


@pytest.mark.gpu
@gpu
def test_a_padded_inner_axis_on_the_gpu_is_copied_row_by_row(tmp_path):
    """A padded dim on an inner axis (x [2, n, 4], elementwise): the runtime's 2-D copies
    on the device put each row of the caller's input at its place in the bucket's buffer
    and cut each output row back, for every n up to the largest bucket."""
    import cupy
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "n", 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "rows.onnx"
    path.write_bytes(model.SerializeToString())
    library = byoc.build(path, config={"target": "cuda -arch=sm_90", "backends": ["builtin"], "cuda_graph": True},
                         workdir=str(tmp_path / "w"), dims={"n": [4, 8]})
    assert library.metadata["dims"]["n"]["paddable"] is True
    module = library.load()
    rng = np.random.default_rng(2)
    for n in (1, 3, 4, 5, 7, 8, 6, 2):
        x_value = rng.standard_normal((2, n, 4)).astype(np.float32)
        got = cupy.asnumpy(module.run(cupy.asarray(x_value)))
        np.testing.assert_allclose(got, np.maximum(x_value, 0) + x_value, rtol=1e-6)
    with pytest.raises(byoc.RuntimeError, match=r"padded: n from 1 to 8"):
        module.run(cupy.zeros((2, 9, 4), cupy.float32))


@pytest.mark.gpu
@gpu
@needs_nvcc
def test_cuda_sm90_runs_its_gemms_on_cutlass(tmp_path):
    """The shipped GPU config on a BERT: its GEMMs and attention run as CUTLASS kernels (the
    metadata says which backend each call ran on), not a fallback to the built-in ones, and
    the result matches the fixture's."""
    import cupy
    from byoc.config import load_config
    inputs, expected = fixture("bert2")
    config = load_config("cuda_sm90", overrides={"tuning": {"profile": False, "tuning_db": None}})
    library = byoc.build(FIXTURES / "bert2.onnx", config=config, workdir=str(tmp_path / "w"),
                         input_shapes={k: v.shape for k, v in inputs.items()})
    calls = {}
    for function in library.metadata["functions"]:
        calls[function["backend"]] = calls.get(function["backend"], 0) + function.get("calls", 1)
    assert calls.get("cutlass", 0) >= 8, calls  # 2 layers x (QKV, attention, output, 2 FFN GEMMs) at least
    results = library.load().run(**{k: cupy.asarray(v) for k, v in inputs.items()})
    for got, want in zip(results if isinstance(results, tuple) else (results,), expected.values(), strict=True):
        assert np.max(np.abs(cupy.asnumpy(got) - want)) <= 2e-2 * np.max(np.abs(want))


@pytest.mark.gpu  # compiled everywhere nvcc is (CI), run where a GPU is (the GPU sessions select -m gpu)
@needs_nvcc
@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_elementwise_kernels_reading_views_compile_and_run(precision, tmp_path):
    """Elementwise kernels that read views of their parameters (offsets, transposed and
    reversed strides: rotary embeddings and SwiGLU, tests/test_builtin_codegen.py) compile
    for sm_90, with no copy in the run; on a GPU they match the interpreter."""
    from test_builtin_codegen import views_model
    mod, inputs = views_model(precision)
    library = byoc.build(mod, target="cuda -arch=sm_90", config={"backends": ["builtin"]},
                         workdir=str(tmp_path / "w"))
    assert library.report.to_json()["copies_per_run"] == {}, library.report.to_text()
    if not gpu_visible():
        return
    import cupy
    got = library.load().run(**{name: cupy.asarray(value) for name, value in inputs.items()})
    got = [cupy.asnumpy(g) for g in (got if isinstance(got, tuple) else (got,))]
    want = byoc.interpret(mod, **inputs)
    want = want if isinstance(want, tuple) else (want,)
    # CUDA's expf and NumPy's may differ by an ulp; in float16 the build's silu (RecognizeSiLU)
    # rounds x * sigmoid(x) once where the interpreter rounds the sigmoid first
    tolerance = 2e-3 if precision == "float16" else 1e-6
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tolerance, atol=tolerance)


# A C++ program that runs a library as a deploy host would (#45): dlopen, the C ABI, host
# tensors in and out; the driver's cuCtxSynchronize (libcuda, dlopened) before reading the
# output, so that it needs nothing of CUDA's but the driver.
DEPLOY_HARNESS = r"""
#include <dlfcn.h>
#include <cstdio>
#include <vector>
#include "byoc_model.h"

template <typename F> F symbol(void* library, const char* name) { return reinterpret_cast<F>(dlsym(library, name)); }

int main(int argc, char** argv) {
  if (argc != 4) return 1;
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) { std::fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  auto create = symbol<int (*)(byoc_model**, const char*)>(library, "byoc_model_create");
  auto run = symbol<int (*)(byoc_model*, const byoc_dl_tensor*, int32_t, const byoc_dl_tensor*, int32_t, void*)>(
      library, "byoc_model_run");
  auto destroy = symbol<void (*)(byoc_model*)>(library, "byoc_model_destroy");
  auto last_error = symbol<const char* (*)()>(library, "byoc_last_error");
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto synchronize = driver ? symbol<int (*)()>(driver, "cuCtxSynchronize") : nullptr;
  std::vector<float> x(4 * 64), y(4 * 32, -1.0f);
  FILE* in = std::fopen(argv[2], "rb");
  if (in == nullptr || std::fread(x.data(), sizeof(float), x.size(), in) != x.size()) return 5;
  std::fclose(in);
  byoc_model* model = nullptr;
  if (create(&model, nullptr) != 0) { std::fprintf(stderr, "create: %s\n", last_error()); return 3; }
  int64_t x_shape[2] = {4, 64}, y_shape[2] = {4, 32};
  byoc_dl_tensor input = {x.data(), {BYOC_DL_CPU, 0}, 2, {BYOC_DL_FLOAT, 32, 1}, x_shape, nullptr, 0};
  byoc_dl_tensor output = {y.data(), {BYOC_DL_CPU, 0}, 2, {BYOC_DL_FLOAT, 32, 1}, y_shape, nullptr, 0};
  if (run(model, &input, 1, &output, 1, nullptr) != 0) { std::fprintf(stderr, "run: %s\n", last_error()); return 4; }
  if (synchronize == nullptr || synchronize() != 0) return 6;
  FILE* out = std::fopen(argv[3], "wb");
  std::fwrite(y.data(), sizeof(float), y.size(), out);
  std::fclose(out);
  destroy(model);
  return 0;
}
"""


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
def test_a_library_runs_where_only_the_driver_and_the_deploy_packages_are(tmp_path):
    """#45's deploy host: the mlp built for the GPU (its matmuls on cuBLASLt), exported, its
    build directory deleted, then run by a C++ program in an environment holding nothing
    but the system's directories and the one library directory deployment.md names for it
    (nvidia-cublas's): no venv, no toolkit, no build path on the library search path."""
    from byoc.runtime import INCLUDE_DIR
    from byoc.toolchain.locate import _pip_cuda_library_dir, find_cxx
    inputs, expected = fixture("mlp")
    library = byoc.build(FIXTURES / "mlp.onnx", config={"target": "auto", "devices": {"inputs": "host", "outputs": "host"}},
                         workdir=str(tmp_path / "w"))
    deployed = library.export_library(tmp_path / "deploy" / "mlp.so")
    shutil.rmtree(tmp_path / "w")
    dynamic = subprocess.run(["readelf", "-d", str(deployed)], capture_output=True, text=True).stdout
    needed = [line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert "RUNPATH" not in dynamic and "RPATH" not in dynamic
    source = tmp_path / "harness.cc"
    source.write_text(DEPLOY_HARNESS)
    subprocess.run([find_cxx(), "-O1", "-std=c++17", f"-I{INCLUDE_DIR}", str(source), "-ldl", "-o",
                    str(tmp_path / "harness")], check=True)
    (tmp_path / "x.bin").write_bytes(np.ascontiguousarray(inputs["x"], np.float32).tobytes())
    library_path = []
    if any(name.startswith("libcublasLt") for name in needed):
        cublas = _pip_cuda_library_dir("cublasLt.h")
        assert cublas is not None, "nvidia-cublas (the deploy package deployment.md names) is not installed"
        library_path.append(str(cublas[1]))
    environment = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ":".join(library_path), "HOME": str(tmp_path)}
    done = subprocess.run([str(tmp_path / "harness"), str(deployed), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")],
                          env=environment, cwd=tmp_path / "deploy", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
    got = np.frombuffer((tmp_path / "y.bin").read_bytes(), np.float32).reshape(4, 32)
    want = expected["y"]
    assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want))
