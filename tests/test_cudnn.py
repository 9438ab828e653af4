"""The cudnn backend (backends/cudnn/): NHWC convs of any window and grouping with their
bias, residual and activation epilogue, each one cuDNN operation graph. On the cpu: the
pattern table and its refusals, the entry points it generates, the error without cuDNN;
with nvcc: a model built and linked against cuDNN by soname; on the GPU (marked gpu):
every pattern against a float32 reference on shapes that are not tile multiples, the plan
the build timed kept in the cost store."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import byoc
from byoc.errors import BuildError, ConfigError
from byoc.interpreter import interpret
from byoc.ir import FunctionBuilder
from byoc.ir.types import numpy_dtype
from byoc.toolchain.locate import _pip_cuda_library_dir, cuda_home
from gpu_probe import gpu_present

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _have_cudnn() -> bool:
    home = cuda_home()
    return bool(home and (home / "include" / "cudnn_graph.h").is_file()) or \
        _pip_cuda_library_dir("cudnn_graph.h") is not None


# CI installs the cudnn extra and sets BYOC_REQUIRE_CUDNN: there a missing cuDNN fails, not skips
needs_cudnn = pytest.mark.skipif(not _have_cudnn() and not os.environ.get("BYOC_REQUIRE_CUDNN"),
                                 reason="cuDNN 9 is not installed (pip install nvidia-cudnn-cu13)")


def _conv_model(dtype="float16", batch=3, size=(13, 11), channels=24, out_channels=40, kernel=(3, 3),
                strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), groups=1, bias=True, residual=False,
                activation=None, seed=0, weights_in=None):
    """act(conv(x, w) + bias + residual) on NHWC float32 inputs cast to `dtype`, the result
    cast back: the residual is a second input of the output's shape. The weights are drawn
    in `weights_in` (default: dtype): a float32 model with float16 weights is the float16
    model's reference."""
    rng = np.random.default_rng(seed)
    rounded = numpy_dtype(weights_in or dtype)

    def np_dtype_of(values):
        return values.astype(rounded).astype(numpy_dtype(dtype))
    weight = np_dtype_of(rng.standard_normal((out_channels, *kernel, channels // groups)) /
                         np.sqrt(kernel[0] * kernel[1] * channels // groups))
    out_h = (size[0] + pads[0] + pads[2] - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    out_w = (size[1] + pads[1] + pads[3] - dilations[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    with FunctionBuilder("main") as fb:
        x = fb.call("cast", fb.param("x", (batch, *size, channels), "float32"), dtype=dtype)
        y = fb.call("conv2d", x, weight, strides=list(strides), pads=list(pads), dilations=list(dilations),
                    groups=groups, data_layout="NHWC", kernel_layout="OHWI")
        if bias:
            y = fb.call("add", y, np_dtype_of(rng.standard_normal(out_channels)))
        if residual:
            r = fb.call("cast", fb.param("r", (batch, out_h, out_w, out_channels), "float32"), dtype=dtype)
            y = fb.call("add", y, r)
        if activation is not None:
            y = fb.call("gelu", y, approximate="tanh") if activation == "gelu_tanh" else fb.call(activation, y)
        fb.ret(fb.call("cast", y, dtype="float32"))
    return fb.module(), (batch, out_h, out_w, out_channels)


CUDNN_CONFIG = {"target": "cuda -arch=sm_90", "backends": ["cudnn", "builtin"], "cuda_graph": True}


def _partition(mod):
    from byoc.backends.builtin.partition import partition_builtin
    from byoc.transform.partition import partition_for
    return partition_for(mod, ["cudnn"], finalize=partition_builtin)


# ---------------------------------------------------------------- patterns (cpu)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid"])
def test_each_conv_chain_is_one_cudnn_function(activation):
    mod, _ = _conv_model(groups=4, residual=True, activation="gelu" if activation == "gelu_tanh" else activation)
    partitioned, report = _partition(mod)
    composites = report.to_json()["backends"]["cudnn"]["patterns"]
    name = "conv2d_bias_residual" + ("_activation" if activation else "")
    assert composites == {name: 1}, composites
    text = str(partitioned)
    assert f'Composite="cudnn.{name}"' in text


def test_hard_swish_is_left_to_the_builtin_backend_with_the_conv_taken():
    """cuDNN has no hard-swish mode: the conv and its bias are cudnn's, the activation not."""
    mod, _ = _conv_model(activation="hard_swish")
    partitioned, report = _partition(mod)
    backends = report.to_json()["backends"]
    assert backends["cudnn"]["patterns"] == {"conv2d_bias": 1}
    assert backends["builtin"]["ops_covered"].get("hard_swish") == 1, backends["builtin"]


def test_a_bias_that_is_not_per_channel_is_refused_with_its_reason():
    from byoc.backends.cudnn.patterns import check_conv2d

    class FakeMatch:
        def __init__(self, bias_shape):
            from byoc.ir.types import TensorType

            class V:
                def __init__(self, shape, dtype="float16"):
                    self.type = TensorType(shape, dtype)
            self.named = {"data": V((1, 8, 8, 16)), "weight": V((32, 3, 3, 16)), "bias": V(bias_shape)}
            self.output = V((1, 8, 8, 32))

        def __getitem__(self, key):
            return self.named[key]

        def call_of(self, name):
            class C:
                attrs = {"data_layout": "NHWC"}
            return C()

    assert check_conv2d(FakeMatch((32,))) is None
    assert "not a vector of K=32" in check_conv2d(FakeMatch((16,)))


def test_a_bad_plan_option_is_a_config_error():
    with pytest.raises(ConfigError, match="plan"):
        byoc.build(_conv_model()[0], config={**CUDNN_CONFIG, "backends": [{"cudnn": {"plan": "fastest"}}, "builtin"]})


def test_a_build_without_cudnn_names_the_package(monkeypatch, tmp_path):
    import byoc.toolchain.locate as locate
    monkeypatch.setattr(locate, "_pip_cuda_library_dir", lambda header: None)
    monkeypatch.setattr(locate, "cuda_home", lambda: None)
    with pytest.raises(BuildError, match="pip install nvidia-cudnn-cu13"):
        byoc.build(_conv_model()[0], config=CUDNN_CONFIG, workdir=str(tmp_path / "w"))


def test_the_entry_points_describe_each_conv_as_data(tmp_path, monkeypatch):
    """Codegen alone (no compiler): the generated source holds each conv's shape, padding,
    groups and epilogue as a constant, with its operands' parameter positions."""
    import importlib
    cudnn_codegen = importlib.import_module("byoc.backends.cudnn.codegen")
    monkeypatch.setattr(cudnn_codegen, "engine_units", lambda target: [])
    mod, _ = _conv_model(kernel=(7, 7), pads=(3, 3, 3, 3), channels=96, out_channels=96, groups=96,
                         residual=True, activation="silu")
    partitioned, _ = _partition(mod)
    from byoc.target import Target
    functions = {name: f for name, f in partitioned.items() if f.attrs.get("Compiler") == "cudnn"}
    target = Target("cudnn")
    target.device = Target("cuda -arch=sm_90")
    target.workdir = str(tmp_path)
    (artifact,) = cudnn_codegen.codegen(functions, target)
    source = (tmp_path / "cudnn_entries.cc").read_text()
    assert artifact.link_libraries == ["cudnn"] and artifact.stateful_symbols == list(functions)
    assert "96x7x7x1 groups 96" in source and "+ bias + residual -> silu" in source
    assert "{ 3, 3, 3, 3 }" in source and "the heuristic's plan, chosen at create" in source
    assert source.count(f"{1 << 25},\n    0}};") == len(functions)  # workspace limit, then tf32 off
    exact_or_not = Target("cudnn", tf32="true")
    exact_or_not.device, exact_or_not.workdir = target.device, str(tmp_path)
    cudnn_codegen.codegen(functions, exact_or_not)
    assert (tmp_path / "cudnn_entries.cc").read_text().count(f"{1 << 25},\n    1}};") == len(functions)


def test_known_cost_is_the_stored_plans_of_the_visible_gpu(tmp_path, monkeypatch):
    """partition: measured builds no cudnn candidate whose convs' plans the cost store holds
    for this GPU: known_cost is their sum; learn_costs times only the convs it lacks."""
    import importlib

    import byoc.target as target_module
    from byoc.costs import CostStore
    from byoc.target import Target
    plans = importlib.import_module("byoc.backends.cudnn.plans")
    codegen = importlib.import_module("byoc.backends.cudnn.codegen")
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(target_module, "visible_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(target_module, "visible_gpu_arch", lambda: "sm_90")
    partitioned, _ = _partition(_conv_model(groups=4, activation="relu")[0])
    functions = {name: f for name, f in partitioned.items() if f.attrs.get("Compiler") == "cudnn"}
    target = Target("cudnn")
    target.device = Target("cuda -arch=sm_90")
    assert codegen.known_cost(functions, target) is None  # nothing stored yet
    asked = []
    monkeypatch.setattr(plans, "measure",
                        lambda convs, target: asked.append(len(convs)) or [([(7, 12.5), (3, 20.0)], [(9, 1)])])
    codegen.learn_costs([functions, functions], target)  # the same conv twice: timed once
    assert asked == [1]
    assert codegen.known_cost(functions, target) == pytest.approx(12.5)
    (entry,) = [e for device in CostStore().entries.values() for e in device.values()]
    assert entry["engine"] == 7 and entry["timed"] == {"7": 12.5, "3": 20.0}
    assert entry["refused"] == {"9": plans.REFUSALS[1]}  # the plan its check refused, and why
    codegen.learn_costs([functions], target)  # stored: nothing measured again
    assert asked == [1]
    heuristic = Target("cudnn", plan="heuristic")
    heuristic.device = target.device
    assert codegen.known_cost(functions, heuristic) is None


def test_a_conv_no_cudnn_plan_runs_on_the_visible_gpu_fails_the_build_not_the_load(tmp_path, monkeypatch):
    """Timing found no plan that runs the conv: the build says so, naming it (a load on the
    deploy host would have failed at create). A timing process that failed stores nothing:
    the build goes on with the heuristic's plan and the next build times again."""
    import importlib

    import byoc.target as target_module
    from byoc.costs import CostStore
    from byoc.target import Target
    plans = importlib.import_module("byoc.backends.cudnn.plans")
    codegen = importlib.import_module("byoc.backends.cudnn.codegen")
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(target_module, "visible_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(target_module, "visible_gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(codegen, "engine_units", lambda target: [])
    partitioned, _ = _partition(_conv_model(kernel=(5, 3), pads=(2, 1, 2, 1))[0])
    functions = {name: f for name, f in partitioned.items() if f.attrs.get("Compiler") == "cudnn"}
    target = Target("cudnn")
    target.device = Target("cuda -arch=sm_90")
    target.workdir = str(tmp_path)
    with pytest.warns(byoc.errors.ByocWarning, match="timing cuDNN's plans failed"):
        monkeypatch.setattr(plans, "probe_library", lambda target: tmp_path / "missing.so")
        codegen.codegen(functions, target)
    assert "the heuristic's plan" in (tmp_path / "cudnn_entries.cc").read_text()
    assert not CostStore().entries
    monkeypatch.setattr(plans, "measure", lambda convs, target: [([], []) for _ in convs])
    with pytest.raises(BuildError, match=r"conv2d float16 3x13x11x24 \* 40x5x3x24 .*no cuDNN plan ran on this GPU"):
        codegen.codegen(functions, target)
    # every plan ran and its check refused it: the reason is in the error
    monkeypatch.setattr(plans, "PLAN_FORMAT", plans.PLAN_FORMAT + 100)  # keys the store has not seen
    monkeypatch.setattr(plans, "measure", lambda convs, target: [([], [(4, 1)]) for _ in convs])
    with pytest.raises(BuildError, match=r"no cuDNN plan ran that passed its check .*engine 4: its output depends"):
        codegen.codegen(functions, target)


FAKE_TIMING = r"""
#include <cstdint>
#include <cstdlib>
// The timing child's library with byoc_cudnn.h's timing entry points, no cuDNN: the conv
// with 1 output channel has two plans (and one its check refused), with 2 none runs, with 3 preparing its plans fails,
// with 4 the process dies in the timing.
extern "C" {
struct Shape { int32_t dtype; int64_t batch, height, width, channels, out_channels; };
const char* byoc_cudnn_last_error(void) { return "an injected failure"; }
int byoc_cudnn_conv_prepare_plans(const Shape* shape, int, void** prepared) {
  *prepared = nullptr;
  if (shape->out_channels == 3) return 1;
  *prepared = new int64_t(shape->out_channels);
  return 0;
}
void byoc_cudnn_conv_release_plans(void* prepared) { delete static_cast<int64_t*>(prepared); }
int byoc_cudnn_conv_time_prepared(void* prepared, int, int64_t* engines, double* us, int32_t* verdicts, int* count) {
  *count = 0;
  switch (*static_cast<int64_t*>(prepared)) {
    case 1:  // two plans timed, and one (the fastest) its check refused
      engines[0] = 7; us[0] = 12.5; verdicts[0] = 0; engines[1] = 3; us[1] = 20.0; verdicts[1] = 0;
      engines[2] = 9; us[2] = 0.0; verdicts[2] = 1; *count = 3; return 0;
    case 2: return 0;
    default: std::abort();
  }
}
}
"""


def test_the_timing_child_keeps_what_it_timed_and_stores_no_failure_of_its_own(tmp_path, monkeypatch):
    """The child process reports conv by conv: a conv none of whose plans ran is stored as
    such; a timing that failed, and every conv after the child died, is stored as nothing
    (the next build times it again), with a warning; what was timed before is kept."""
    import importlib

    import byoc.target as target_module
    from byoc.costs import CostStore
    from byoc.target import Target
    from byoc.toolchain.locate import find_cxx
    plans = importlib.import_module("byoc.backends.cudnn.plans")
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(target_module, "visible_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(target_module, "visible_gpu_arch", lambda: "sm_90")
    (tmp_path / "fake.cc").write_text(FAKE_TIMING)
    subprocess.run([find_cxx(), "-shared", "-fPIC", str(tmp_path / "fake.cc"), "-o", str(tmp_path / "fake.so")],
                   check=True)
    monkeypatch.setattr(plans, "probe_library", lambda target: tmp_path / "fake.so")
    target = Target("cudnn")
    target.device = Target("cuda -arch=sm_90")
    base = dict(dtype=1, batch=1, height=8, width=8, channels=8, kernel_h=3, kernel_w=3, groups=1, out_h=8, out_w=8,
                strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], has_bias=0, has_residual=0, activation=0,
                engine=-1, workspace_limit=1 << 20, tf32=0)
    convs = [dict(base, out_channels=k) for k in (1, 2, 3, 4, 5)]
    with pytest.warns(byoc.errors.ByocWarning, match=r"failed for 3 of 5 convs"):
        chosen = plans.choose_engines(convs, target)
    assert chosen == [(7, 12.5), (-1, 0.0), (-1, 0.0), (-1, 0.0), (-1, 0.0)]
    entries = list(CostStore().entries["cuda:NVIDIA H100 80GB HBM3"].values())
    assert len(entries) == 2  # conv 1's plans and conv 2's "no plan ran"; nothing of 3, 4, 5
    assert sorted(entry.get("failed", "") for entry in entries) == ["", "no cuDNN plan ran"]
    assert [entry.get("refused") for entry in entries if "engine" in entry] == [{"9": plans.REFUSALS[1]}]
    assert plans.failed_plans(convs, target) == [None, "no cuDNN plan ran", None, None, None]


def test_share_functions_false_gives_each_conv_call_its_own_function():
    """cudnn's share_functions: false (a diagnosis option) keeps each conv call's function,
    and so its plan and handle, its own; by default equal convs share one."""
    from byoc.pipeline import lower
    config = {"target": "cuda -arch=sm_90", "backends": ["cudnn"], "precision": "float16"}

    def cudnn_calls(backends):
        mod = lower(os.path.join(FIXTURES, "resnet_small.onnx"), {**config, "backends": backends}, until="partition")
        calls = [b.value.op.name for b in mod["main"].bindings
                 if hasattr(b.value, "op") and str(getattr(b.value.op, "name", "")).startswith("cudnn_")]
        return len(calls), len(set(calls))
    calls, functions = cudnn_calls(["cudnn"])
    assert calls == 15 and functions < calls
    assert cudnn_calls([{"cudnn": {"share_functions": False}}]) == (15, 15)


def test_a_plans_key_has_tf32_only_where_it_changes_the_plans():
    """tf32 chooses among float32 convs' engines only: float16 keys leave it out (one timing
    serves both settings), float32 keys differ by it."""
    import importlib
    plans = importlib.import_module("byoc.backends.cudnn.plans")
    conv = dict(dtype=1, batch=1, height=8, width=8, channels=8, out_channels=8, kernel_h=3, kernel_w=3, groups=1,
                out_h=8, out_w=8, strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], has_bias=0, has_residual=0,
                activation=0, engine=-1, workspace_limit=1 << 20, tf32=0)
    assert plans.plan_key(conv, "9") == plans.plan_key({**conv, "tf32": 1}, "9") and "tf32" not in plans.plan_key(
        conv, "9")
    single = {**conv, "dtype": 0}
    assert plans.plan_key(single, "9") != plans.plan_key({**single, "tf32": 1}, "9")


def test_a_float32_conv_is_cudnns_only_with_its_targets_tf32():
    """In a build, the patterns see their backend's Target (partition_target): with tf32 off
    cudnn refuses a float32 conv, saying why, and the built-in backend takes it; outside a
    build (no target) the check takes what cuDNN could."""
    from byoc.backend import get_backend, partition_targets
    from byoc.target import Target
    get_backend("cudnn")  # registers the cudnn target kind
    mod, _ = _conv_model("float32", activation="relu")
    for attrs, taken in (("", False), (" -tf32=1", True)):
        with partition_targets({"cudnn": Target("cudnn" + attrs)}):
            _, report = _partition(mod)
        covered = report.to_json()["backends"]["cudnn"]["ops_covered"]
        assert (covered.get("conv2d") == 1) is taken, covered
        assert ("float32 with tf32 off" in report.to_text()) is not taken
    _, report = _partition(mod)
    assert report.to_json()["backends"]["cudnn"]["ops_covered"]["conv2d"] == 1


def test_a_float32_nchw_model_goes_nhwc_for_cudnn_with_tf32_and_computes_the_same():
    """cuDNN runs float32 convs on TF32 tensor cores: in a cuda build with cudnn and tf32 on,
    float32 NCHW conv chains go NHWC too (ConvertConvLayout), the result unchanged, so that
    cudnn's patterns take them; with tf32 off they stay NCHW, refused with the reason."""
    from byoc import pipeline
    from byoc.backend import get_backend
    from byoc.target import Target
    mod = pipeline.lower(os.path.join(FIXTURES, "resnet_small.onnx"), "cpu", until="simplify")
    cudnn = get_backend("cudnn")  # registers the cudnn target kind
    exact = Target("cudnn")
    exact.device = Target("cuda -arch=sm_90")
    kept = cudnn.pre_partition(mod, exact, "cuda")
    _, report = _partition(kept)
    assert report.to_json()["backends"]["cudnn"]["ops_covered"] == {}
    assert "float32 ones only with tf32 on" in report.to_text()
    target = Target("cudnn -tf32=1")
    target.device = Target("cuda -arch=sm_90")
    converted = get_backend("cudnn").pre_partition(mod, target, "cuda")
    convs = [b.value for b in converted["main"].bindings if getattr(b.value.op, "name", None) == "conv2d"]
    assert len(convs) == 15 and all(c.attrs["data_layout"] == "NHWC" and c.type.dtype == "float32" for c in convs)
    assert get_backend("cudnn").pre_partition(mod, target, "cpu") is mod
    x = np.load(os.path.join(FIXTURES, "resnet_small.npz"))["in_input"]
    np.testing.assert_allclose(np.asarray(interpret(converted, input=x)), np.asarray(interpret(mod, input=x)),
                               rtol=1e-5, atol=1e-6)
    _, report = _partition(converted)
    assert report.to_json()["backends"]["cudnn"]["ops_covered"]["conv2d"] == 15


# ---------------------------------------------------------------- compiled (nvcc)


@pytest.mark.nvcc
@needs_cudnn
def test_a_cuda_build_links_cudnn_by_soname(tmp_path):
    library = byoc.build(os.path.join(FIXTURES, "resnet_small.onnx"), config={**CUDNN_CONFIG, "precision": "float16"},
                         workdir=str(tmp_path / "w"))
    backends = library.report.to_json()["backends"]
    assert backends["cudnn"]["ops_covered"]["conv2d"] == 15, backends
    dynamic = subprocess.run(["readelf", "-d", str(library.path)], capture_output=True, text=True).stdout
    assert "libcudnn.so.9" in dynamic
    assert "RUNPATH" not in dynamic and "RPATH" not in dynamic
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library.path)], capture_output=True, text=True).stdout
    assert "byoc_cudnn" not in symbols  # the engine stays inside the library


# ---------------------------------------------------------------- on the GPU


GPU_CASES = [
    # dtype, conv (keyword arguments of _conv_model)
    ("float16", dict(kernel=(3, 3), activation="relu")),
    ("float16", dict(kernel=(1, 1), pads=(0, 0, 0, 0), strides=(2, 2), bias=True)),
    ("float16", dict(kernel=(3, 3), groups=4, residual=True, activation="relu")),
    ("float16", dict(channels=96, out_channels=96, groups=96, kernel=(7, 7), pads=(3, 3, 3, 3))),  # ConvNeXt
    ("float16", dict(channels=40, out_channels=40, groups=40, kernel=(5, 5), pads=(2, 2, 2, 2), strides=(2, 2),
                     activation="silu")),  # EfficientNet
    ("float16", dict(kernel=(3, 3), dilations=(2, 2), pads=(2, 2, 2, 2), activation="gelu")),
    ("float16", dict(kernel=(3, 3), residual=True, activation="sigmoid", bias=False)),
    ("float16", dict(kernel=(3, 3), pads=(0, 1, 2, 1), activation="gelu_tanh")),
    ("bfloat16", dict(kernel=(3, 3), residual=True, activation="relu")),
    ("float32", dict(channels=3, out_channels=16, kernel=(3, 3), strides=(2, 2), activation="silu")),
    # the patterns the cases above leave out: bias + residual, an activation alone, the conv alone
    ("float16", dict(kernel=(3, 3), strides=(2, 2), residual=True)),
    ("bfloat16", dict(kernel=(1, 1), pads=(0, 0, 0, 0), bias=False, activation="relu")),
    ("float16", dict(channels=24, out_channels=24, groups=24, kernel=(3, 3), bias=False)),
]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
@pytest.mark.parametrize("dtype, conv", GPU_CASES, ids=[f"{d}-{i}" for i, (d, _) in enumerate(GPU_CASES)])
def test_every_pattern_matches_a_float32_reference_on_the_gpu(dtype, conv, tmp_path, monkeypatch):
    import cupy
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    mod, out_shape = _conv_model(dtype, **conv)
    library = byoc.build(mod, config={**CUDNN_CONFIG, "tf32": dtype == "float32"}, workdir=str(tmp_path / "w"))
    cudnn = library.report.to_json()["backends"]["cudnn"]
    assert cudnn["ops_covered"]["conv2d"] == 1
    expected_pattern = "conv2d" + "_bias" * conv.get("bias", True) + "_residual" * conv.get("residual", False) + \
        "_activation" * (conv.get("activation") is not None)
    assert cudnn["patterns"] == {expected_pattern: 1}
    source = (tmp_path / "w" / "cudnn_entries.cc").read_text()
    assert "when the build timed it" in source, source  # the plan plans.py timed on this GPU
    reference, _ = _conv_model("float32", weights_in=dtype, **conv)  # the same weights, computed in float32
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((3, 13, 11, conv.get("channels", 24))).astype(np.float32)}
    if conv.get("residual"):
        inputs["r"] = rng.standard_normal(out_shape).astype(np.float32)
    rounded = {name: value.astype(numpy_dtype(dtype)).astype(np.float32) for name, value in inputs.items()}
    want = np.asarray(interpret(reference, **rounded), np.float64)
    module = library.load()
    for _ in range(2):  # the second run replays the CUDA graph
        got = cupy.asnumpy(module.run(**{k: cupy.asarray(v) for k, v in inputs.items()})).astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(want))))
    tolerance = {"float32": 2e-3, "float16": 1e-2, "bfloat16": 4e-2}[dtype]  # float32 convs may take TF32
    assert np.max(np.abs(got - want)) <= tolerance * scale, np.max(np.abs(got - want))


def _runs_match_onnxruntime(library, path, runs=5):
    """The first run executes the calls, the second captures CUDA graphs, the rest replay
    them: each on new inputs, so a replay that reads what an earlier run left is seen."""
    import cupy
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    module = library.load()
    for seed in range(runs):
        x = np.random.default_rng(seed).standard_normal((2, 3, 32, 32)).astype(np.float32)
        want = session.run(None, {"input": x})[0]
        got = cupy.asnumpy(module.run(input=cupy.asarray(x)))
        np.testing.assert_allclose(got, want, atol=5e-2, rtol=5e-2, err_msg=f"run {seed + 1}")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_runs_queued_behind_a_busy_gpu_each_answer_their_own_inputs(cuda_graph, tmp_path, monkeypatch):
    """Eight runs enqueued while the GPU is still busy (a large matmul ahead of them on the
    stream), each on its own inputs into its own output, then checked: a call that read
    host-side state a later call of the same function rewrites before the GPU reaches it
    (one plan per conv shape, several call sites) would answer another run's inputs."""
    import cupy
    import onnxruntime
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    path = os.path.join(FIXTURES, "resnet_small.onnx")
    library = byoc.build(path, config={**CUDNN_CONFIG, "precision": "float32", "tf32": True, "cuda_graph": cuda_graph},
                         workdir=str(tmp_path / "w"))
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    module = library.load()
    inputs = [np.random.default_rng(seed).standard_normal((2, 3, 32, 32)).astype(np.float32) for seed in range(8)]
    wants = [session.run(None, {"input": x})[0] for x in inputs]
    for _ in range(2):  # the direct run and the capture, one at a time
        module.run(input=cupy.asarray(inputs[0]))
    cupy.cuda.Device().synchronize()
    feeds = [cupy.asarray(x) for x in inputs]
    outs = [cupy.empty(want.shape, cupy.float32) for want in wants]
    busy = cupy.ones((8192, 8192), cupy.float32)
    busy = busy @ busy  # tens of milliseconds of GPU work ahead of every run below
    for feed, out in zip(feeds, outs):
        module.run(input=feed, out=[out])
    cupy.cuda.Device().synchronize()
    for index, (out, want) in enumerate(zip(outs, wants)):
        np.testing.assert_allclose(cupy.asnumpy(out), want, atol=5e-2, rtol=5e-2, err_msg=f"queued run {index}")


def _bottleneck_onnx(path, batch=32, channels=1024, width=512, out_channels=2048, size=14, seed=0):
    """A ResNet bottleneck that halves its input (torchvision's: the stride in the 3x3 conv
    and in the 1x1 downsample), as an NCHW float32 ONNX model; the default sizes are
    ResNet-50's first layer4 block."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    initializers, nodes = [], []

    def conv(name, source, cin, cout, kernel, stride):
        weight = (rng.standard_normal((cout, cin, kernel, kernel)) / np.sqrt(cin * kernel * kernel)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weight, f"{name}.weight"))
        initializers.append(numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32),
                                                      f"{name}.bias"))
        pad = kernel // 2
        nodes.append(helper.make_node("Conv", [source, f"{name}.weight", f"{name}.bias"], [name],
                                      kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=[pad] * 4))
        return name

    def relu(source):
        nodes.append(helper.make_node("Relu", [source], [f"{source}.relu"]))
        return f"{source}.relu"
    y = relu(conv("conv1", "x", channels, width, 1, 1))
    y = relu(conv("conv2", y, width, width, 3, 2))
    y = conv("conv3", y, width, out_channels, 1, 1)
    shortcut = conv("downsample", "x", channels, out_channels, 1, 2)
    nodes.append(helper.make_node("Add", [y, shortcut], ["sum"]))
    nodes.append(helper.make_node("Relu", ["sum"], ["y"]))
    half = (size + 1) // 2
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, size, size])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out_channels, half, half])]
    graph = helper.make_graph(nodes, "bottleneck", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime reads (the onnx package writes a newer one by default)
    onnx.save(model, str(path))
    return (batch, channels, size, size)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_a_conv_after_a_small_strided_conv_reads_its_finished_output_on_every_run(cuda_graph, tmp_path, monkeypatch):
    """ResNet-50 layer4's first block in float32 through cuDNN, run eight times on new inputs
    after its kernels are loaded: cuDNN launches the residual 1x1 conv as a programmatic
    dependent of the stride-2 conv before it, whose grid leaves SMs free, and that conv read
    its operands before they were written (13-19% off on every run but the first, which module
    loading serialized) until each conv was fenced by a memset (engine/cudnn_conv.cc fence)."""
    import cupy
    import onnxruntime
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "bottleneck.onnx"
    shape = _bottleneck_onnx(path)
    library = byoc.build(str(path), config={**CUDNN_CONFIG, "precision": "float32", "tf32": True,
                                            "cuda_graph": cuda_graph}, workdir=str(tmp_path / "w"))
    assert library.report.to_json()["backends"]["cudnn"]["ops_covered"]["conv2d"] == 4
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    module = library.load()
    for seed in range(10):  # two to load the kernels (and capture), then eight
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        got = cupy.asnumpy(module.run(x=cupy.asarray(x)))
        if seed >= 2:
            want = session.run(None, {"x": x})[0]
            error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            assert error < 1e-2, f"run {seed + 1}: {error:.1e} off onnxruntime's answer"


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
@pytest.mark.parametrize("precision", ["float16", "float32"])
def test_resnet_small_through_cudnn_matches_onnxruntime_and_keeps_its_plans(precision, tmp_path, monkeypatch):
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    path = os.path.join(FIXTURES, "resnet_small.onnx")
    config = {**CUDNN_CONFIG, "precision": precision, "tf32": True}
    library = byoc.build(path, config=config, workdir=str(tmp_path / "w"))
    assert library.report.to_json()["backends"]["cudnn"]["ops_covered"]["conv2d"] == 15
    _runs_match_onnxruntime(library, path)
    from byoc.costs import CostStore
    entries = CostStore(tmp_path / "cache" / "costs" / "costs.json").entries
    plans = [entry for device in entries.values() for key, entry in device.items() if key.startswith("cudnn.conv:")]
    assert len(plans) == 12 and all(isinstance(entry.get("engine"), int) for entry in plans), plans
    # a second build measures nothing: every plan comes from the store
    again = byoc.build(path, config=config, workdir=str(tmp_path / "w2"))
    assert "timing cuDNN plans" not in "\n".join(getattr(again, "log", []) or [])
    assert (tmp_path / "w2" / "cudnn_entries.cc").read_text().count("when the build timed it") == 12


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
def test_a_measured_partition_costs_cudnn_candidates_by_their_plans_without_building_them(tmp_path, monkeypatch):
    """partition: measured with cudnn among the backends: every cudnn candidate's cost is its
    convs' plans (timed in one process, kept in the cost store as plans), none is built as a
    library of its own; the chosen cover runs and matches onnxruntime."""
    from byoc.costs import CostStore
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    path = os.path.join(FIXTURES, "resnet_small.onnx")
    library = byoc.build(path, config={**CUDNN_CONFIG, "precision": "float16", "partition": "measured"},
                         workdir=str(tmp_path / "w"))
    entries = [(key, entry) for device in CostStore(tmp_path / "cache" / "costs" / "costs.json").entries.values()
               for key, entry in device.items()]
    assert any(key.startswith("cudnn.conv:") for key, _ in entries)
    assert not [key for key, entry in entries if entry.get("backend") == "cudnn" and not key.startswith("cudnn.conv:")]
    assert library.report.to_json()["backends"]["cudnn"]["ops_covered"].get("conv2d", 0) >= 1
    _runs_match_onnxruntime(library, path)


def test_the_shipped_measured_config_offers_cudnn_among_the_candidates():
    from byoc.config import load_config
    config = load_config("cuda_sm90_measured")
    assert config.backend_order == ["cutlass", "cudnn", "cublaslt", "builtin"]
    assert config.partition == "measured" and config.precision == "float16"


def test_two_backends_matching_the_same_ops_ask_for_one_builtin_alternative():
    """cutlass and cudnn both match the conv chain: each is a candidate, and the built-in
    backend's alternative over the same ops is asked for once (not once per match), as is an
    op alone that a match also covers."""
    from byoc.report import PartitionReport
    from byoc.transform.measured_partition import measured_partition
    mod, _ = _conv_model(activation="relu")
    asked = []

    def cost_of(module, requests):
        asked.extend(requests)
        return [10.0 if backend == "cudnn" else 20.0 for backend, _, _ in requests]

    report = PartitionReport()
    chosen = measured_partition(mod, ["cutlass", "cudnn"], cost_of, report)
    builtin = [nodes for backend, _, nodes in asked if backend == "builtin"]
    assert len(builtin) == len(set(builtin)), asked
    assert {backend for backend, _, _ in asked} == {"cutlass", "cudnn", "builtin"}
    assert 'Composite="cudnn.conv2d_bias_activation"' in str(chosen)
