"""Targets (parse, round-trip, flags, the current target, errors) and build configs
(validation errors name the key path, the value and what is allowed; shipped configs)."""
import threading

import pytest

import byoc
import byoc.config as config_module
import byoc.target as target_module
from byoc.config import BuildConfig, load_config, register_known_backend, shipped_config_names, validate
from byoc.target import AttrSchema, Target, auto_device_target, register_target_kind


@pytest.fixture
def toy_kind():
    """A backend-style target kind, registered for one test."""
    register_target_kind("toy", {
        "tile": AttrSchema(int, 128, (64, 128, 256), "tile size"),
        "fast": AttrSchema(bool, False),
        "flags": AttrSchema(list, []),
        "name": AttrSchema(str, "x"),
    })
    yield "toy"
    del target_module.TARGET_KINDS["toy"]


# ---- targets ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["cpu", "cuda -arch=sm_90", "cuda -arch=sm_90a -use_fast_math=1",
                                  "cpu -march=native", "cpu -march=native -opt_level=3",
                                  "cuda -arch=sm_80 -debug=1 -opt_level=2"])
def test_target_string_round_trips(text):
    target = Target(text)
    assert str(target) == text
    assert Target(str(target)) == target


def test_target_from_string_dict_kwargs_and_target_agree():
    from_string = Target("cuda -arch=sm_80 -use_fast_math=true")
    assert from_string.kind == "cuda" and from_string.arch == "sm_80" and from_string.use_fast_math is True
    assert Target({"kind": "cuda", "arch": "sm_80", "use_fast_math": True}) == from_string
    assert Target("cuda", arch="sm_80", use_fast_math=1) == from_string
    # A Target plus kwargs: the given attributes stay, the new ones are added.
    assert str(Target(Target("cuda -arch=sm_80"), use_fast_math=True)) == "cuda -arch=sm_80 -use_fast_math=1"
    # Defaults fill the rest but are not printed.
    assert Target("cuda").opt_level == 3 and str(Target("cuda")) == "cuda"


def test_targets_equal_by_attributes_and_hash_alike():
    # "cuda" means arch=sm_90 by default, so the two are the same target.
    assert Target("cuda") == Target("cuda -arch=sm_90")
    assert hash(Target("cuda")) == hash(Target("cuda -arch=sm_90"))
    assert len({Target("cpu"), Target("cpu -opt_level=2"), Target("cpu -opt_level=3")}) == 2


def test_backend_target_kind(toy_kind):
    target = Target("toy -tile=64 -fast=1 -flags=-DA,-DB")
    assert (target.tile, target.fast, target.flags, target.name) == (64, True, ["-DA", "-DB"], "x")
    assert Target(str(target)) == target
    with pytest.raises(byoc.ConfigError, match=r"target toy: attribute tile=100 is not allowed; allowed: 64, 128, 256"):
        Target("toy", tile=100)
    with pytest.raises(byoc.ConfigError, match=r"tile=True is not an integer"):
        Target("toy", tile=True)
    with pytest.raises(byoc.ConfigError, match=r"fast='maybe' is not a boolean; allowed: true, false"):
        Target("toy -fast=maybe")


def test_shipped_backend_kinds_register_on_import():
    import byoc.backends.cublaslt  # noqa: F401
    import byoc.backends.cutlass  # noqa: F401
    target = Target("cutlass -sm=90 -use_fast_math=1")
    assert target.sm == 90 and target.use_fast_math is True
    assert str(target) == "cutlass -sm=90 -use_fast_math=1"
    assert Target("cublaslt").kind == "cublaslt"


def test_target_flags_come_from_attributes():
    flags = Target("cuda -arch=sm_90").nvcc_flags()
    assert flags[:4] == ["-gencode=arch=compute_90,code=sm_90", "-O3", "-std=c++17", "--expt-relaxed-constexpr"]
    assert "--use_fast_math" not in flags
    fast = Target("cuda -arch=sm_90a -use_fast_math=1").nvcc_flags()
    assert "-gencode=arch=compute_90a,code=sm_90a" in fast and "--use_fast_math" in fast
    assert "-lineinfo" in Target("cuda -debug=1").nvcc_flags()
    cpu_flags = Target("cpu -march=native -opt_level=3").cxx_flags()
    assert cpu_flags[:3] == ["-O3", "-std=c++17", "-fPIC"] and "-march=native" in cpu_flags
    assert not any(flag.startswith("-march") for flag in Target("cpu").cxx_flags())
    with pytest.raises(byoc.ConfigError, match="nvcc flags come from a cuda target"):
        Target("cpu").nvcc_flags()


def test_target_errors_name_kind_attribute_and_allowed_values():
    with pytest.raises(byoc.ConfigError, match=r"target cuda: unknown attribute 'sm'; "
                                               r"allowed: arch, debug, opt_level, pdl, ptx, use_fast_math"):
        Target("cuda -sm=90")
    with pytest.raises(byoc.ConfigError, match=r"unknown attribute 'archh'.*did you mean 'arch'"):
        Target("cuda", archh="sm_90")
    with pytest.raises(byoc.ConfigError, match=r"arch='sm_42' is not allowed; allowed: sm_80, sm_86"):
        Target("cuda -arch=sm_42")
    with pytest.raises(byoc.ConfigError, match=r"unknown target kind 'cdua'; known kinds: .*did you mean 'cuda'"):
        Target("cdua")
    with pytest.raises(byoc.ConfigError, match="is not of the form -name=value"):
        Target("cuda sm_90")
    with pytest.raises(byoc.ConfigError, match="has no 'kind'"):
        Target({"arch": "sm_90"})
    with pytest.raises(byoc.ConfigError, match="empty target string"):
        Target("  ")


def test_current_target_nests_and_is_per_thread():
    assert Target.current() is None
    cpu, cuda = Target("cpu"), Target("cuda")
    with cpu:
        assert Target.current() is cpu
        with cuda:
            assert Target.current() is cuda
            with cpu:  # the same target entered twice
                assert Target.current() is cpu
            assert Target.current() is cuda
        seen_by_thread = []
        thread = threading.Thread(target=lambda: seen_by_thread.append(Target.current()))
        thread.start()
        thread.join()
        assert seen_by_thread == [None]
        assert Target.current() is cpu
    assert Target.current() is None


def test_auto_device_target(monkeypatch):
    monkeypatch.setattr(target_module, "visible_gpu_arch", lambda: None)
    assert auto_device_target() == Target("cpu")
    monkeypatch.setattr(target_module, "visible_gpu_arch", lambda: "sm_90")
    assert auto_device_target() == Target("cuda -arch=sm_90")
    monkeypatch.setattr(target_module, "visible_gpu_arch", lambda: "sm_75")
    with pytest.raises(byoc.ConfigError, match="visible GPU is sm_75.*use target: cpu"):
        auto_device_target()


def test_visible_gpu_arch_reads_nvidia_smi(monkeypatch, tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 9.0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}")
    assert target_module._arch_from_nvidia_smi() == "sm_90"
    # the GPU's name (tuning provenance) comes from the same query; garbage is no GPU
    fake.write_text('#!/bin/sh\ncase "$1" in *name*) echo "NVIDIA H100 80GB HBM3";; *) echo "9.x";; esac\n')
    assert target_module._nvidia_smi_first_gpu("name") == "NVIDIA H100 80GB HBM3"
    assert target_module._arch_from_nvidia_smi() is None
    fake.write_text("#!/bin/sh\nexit 9\n")
    assert target_module._nvidia_smi_first_gpu("name") is None


# ---- configs ------------------------------------------------------------------------------

def test_shipped_configs_load():
    assert {"default", "cpu", "cuda_sm90"} <= set(shipped_config_names())
    default = load_config("default")
    assert default.target == "auto" and default.backends_auto and default.params == "embedded"
    assert default.tf32 and default.cuda_graph and default.precision == "float32"
    cpu = load_config("cpu")
    assert cpu.target == Target("cpu") and cpu.backend_order == ["builtin"] and cpu.precision == "float32"
    cuda = load_config("cuda_sm90")
    assert cuda.target == Target("cuda -arch=sm_90")
    assert cuda.backend_order == ["cutlass", "cublaslt", "builtin"]
    assert cuda.backends[0] == ("cutlass", {"sm": 90})
    assert cuda.precision == "float16" and cuda.cuda_graph is True


@pytest.mark.parametrize("name", shipped_config_names())
def test_every_shipped_config_validates_and_round_trips(name):
    config = load_config(name)
    assert load_config(config) == config
    assert load_config(config.to_dict()).to_dict() == config.to_dict()


def test_config_from_yaml_path_dict_and_overrides(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("target: {kind: cuda, arch: sm_80}\nbackends: [cublaslt]\nworkdir: out\n"
                    "tuning: {profile: false, tuning_db: db.json}\ninput_shapes: {x: [1, 128]}\n")
    config = load_config(str(path), overrides={"precision": "bfloat16"})
    assert config.target == Target("cuda -arch=sm_80") and config.backend_order == ["cublaslt", "builtin"]
    assert config.workdir == "out" and config.precision == "bfloat16" and config.source == str(path)
    assert config.tuning == {"profile": False, "tuning_db": "db.json"} and config.input_shapes == {"x": (1, 128)}
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing but a comment\n")
    assert load_config(str(empty)) == BuildConfig(source=str(empty))
    assert validate({}) == BuildConfig()


@pytest.mark.parametrize("data, pattern", [
    # unknown keys say which keys exist
    ({"precison": "float16"}, r"<dict>: unknown key\(s\) \['precison'\]; allowed keys: target, arch, backends, "
                              r"partition, precision.*did you mean 'precision'"),
    ({"tuning": {"profil": True}}, r"tuning\.profil: unknown key; allowed: profile, tuning_db"),
    # bad values: the key path, the value, the allowed ones
    ({"precision": "fp8"}, r"precision: 'fp8' is not allowed; allowed: float32, float16, bfloat16"),
    ({"cuda_graph": "yes"}, r"cuda_graph: 'yes' is not allowed; allowed: true, false"),
    ({"cuda_graph": 1}, r"cuda_graph: 1 is not allowed; allowed: true, false"),
    ({"target": "cpu", "cuda_graph": True},
     r"cuda_graph: true needs the cuda target, but target is 'cpu'; allowed: cuda_graph: false with it"),
    ({"params": "outside"}, r"params: 'outside' is not allowed; allowed: embedded, sidecar"),
    ({"tuning": {"profile": "often"}}, r"tuning\.profile: 'often' is not allowed; allowed: auto, true, false"),
    ({"tuning": {"tuning_db": 3}}, r"tuning\.tuning_db: 3 is not allowed; allowed: a path, or null"),
    ({"workdir": ["a"]}, r"workdir: \['a'\] is not allowed; allowed: a path, or null"),
    ({"output": True}, r"output: True is not allowed; allowed: a path, or null"),
    ({"compile_jobs": 0}, r"compile_jobs: 0 is not allowed; allowed: a positive integer"),
    ({"input_shapes": {"x": [1, -2]}}, r"input_shapes\.x: \[1, -2\] is not a list of non-negative integers"),
    ({"input_shapes": [1, 2]}, r"input_shapes: \[1, 2\] is not a mapping"),
    ({"dims": {"batch": -1}}, r"dims\.batch: -1 is not allowed; allowed: a non-negative integer"),
    ({"dims": {"batch": True}}, r"dims\.batch: True is not allowed"),
    ({"dims": ["batch"]}, r"dims: \['batch'\] is not a mapping of named dim to size"),
    ({"dims": {"batch": []}}, r"dims\.batch: \[\] is not allowed \(it lists no size\); allowed: a non-negative integer, a list"),
    ({"dims": {"batch": "32..1"}}, r"dims\.batch: '32\.\.1' is not allowed; .* or a range 'LOW\.\.HIGH'"),
    ({"dims": {"batch": [1, 8, 1]}}, r"dims\.batch: \[1, 8, 1\] is not allowed \(it lists a size twice\); allowed: .* "
                                     r"a list of distinct positive ones"),
    ({"dims": {"batch": [1, -8]}}, r"dims\.batch: \[1, -8\] is not allowed \(size -8 is not an integer from 1"),
    # a listed size is a shape bucket, padded into: 0 is none (one size of 0 is an empty tensor)
    ({"dims": {"batch": [0, 4]}}, r"dims\.batch: \[0, 4\] is not allowed \(size 0 is not an integer from 1 to 2\*\*63-1\)"),
    ({"dims": {"batch": "0..4"}}, r"dims\.batch: \[0, 1, 2, 4\] is not allowed .* a range 'LOW\.\.HIGH' with LOW >= 1"),
    ({"dims": {"batch": 1 << 63}}, r"dims\.batch: 9223372036854775808 is not allowed; .* sizes below 2\*\*63"),
    ({"dims": {"a": [1, 2, 3, 4, 5], "b": [1, 2, 3, 4]}},
     r"dims: the sizes listed per dim \(a: 5, b: 4\) make 20 shape buckets; expected at most 16"),
    ({"input_shapes": {"x": [1, 1 << 63]}}, r"input_shapes\.x: \[1, 9223372036854775808\] is not a list of non-negative "
                                            r"integers below 2\*\*63"),
    # the device target
    ({"target": "cuda -arch=sm_1"}, r"target: target cuda: attribute arch='sm_1' is not allowed; allowed: sm_80"),
    ({"target": "cuda -sm=90"}, r"target: target cuda: unknown attribute 'sm'; allowed: arch"),
    ({"target": "gpu"}, r"target: unknown target kind 'gpu'; known kinds: "),
    ({"target": "cutlass"}, r"target: 'cutlass' is not a device target; allowed: auto, cpu, cuda -arch=sm_XX"),
    # backends
    ({"backends": "cutlass"}, r"backends: 'cutlass' is not allowed; allowed: a list .*, or auto"),
    ({"tf32": "yes"}, r"tf32: 'yes' is not allowed; allowed: true, false"),
    ({"backends": ["tensorrt"]}, r"backends\[0\]: unknown backend 'tensorrt'; allowed: cutlass, cudnn, cublaslt, builtin"),
    ({"backends": ["cublaslt", "cutlas"]}, r"backends\[1\]: unknown backend 'cutlas'.*did you mean 'cutlass'"),
    ({"backends": ["cublaslt", "cublaslt"]}, r"backends\[1\]: backend 'cublaslt' is listed twice"),
    ({"backends": ["builtin", "cublaslt"]}, r"backends\[0\]: 'builtin' must be last"),
    ({"backends": [{"cutlass": {"sm": 70}, "x": 1}]}, r"backends\[0\]: .* is not a backend name or a one-key mapping"),
    ({"backends": [{"cutlass": [90]}]}, r"backends\[0\]\.cutlass: \[90\] is not a mapping"),
    ({"backends": ["cublaslt", {"cutlass": {"sm": 70}}]},
     r"backends\[1\]\.cutlass\.sm: target cutlass: attribute sm=70 is not allowed; allowed: 0, 80, 86, 89, 90"),
    ({"backends": [{"cutlass": {"smm": 90}}]},
     r"backends\[0\]\.cutlass\.smm: target cutlass: unknown attribute 'smm'; allowed: .*sm.*did you mean 'sm'"),
    ({"backends": [{"builtin": {"matmul_algo": "x"}}]},
     r"backends\[0\]\.builtin\.matmul_algo: .*matmul_algo='x' is not an integer"),
    # values checked when the config is read, not once a GEMM reaches the backend
    ({"backends": [{"cutlass": {"tiles": ["128x128x64", "12x"]}}]},
     r"backends\[0\]\.cutlass\.tiles: target cutlass: attribute tiles=.* has '12x': expected a shape like 128x128x64"),
    ({"backends": [{"cutlass": {"clusters": ["1x2x1"]}}]}, r"clusters=.* has '1x2x1': expected a shape like 1x2"),
    ({"backends": [{"cutlass": {"stages": [3, 0]}}]}, r"stages=.* has 0: expected a stage count of at least 2"),
    ({"backends": [{"cutlass": {"compile_threads": -3}}]}, r"compile_threads=-3 is below 0"),
    ({"backends": [{"cublaslt": {"workspace_limit": -5}}]}, r"workspace_limit=-5 is below 0"),
    ({"backends": [{"cublaslt": {"candidates": 0}}]}, r"candidates=0 is below 1"),
    ({"backends": [{"builtin": {"matmul_algo": -2}}]}, r"matmul_algo=-2 is below -1"),
])
def test_config_errors_name_key_value_and_allowed(data, pattern):
    with pytest.raises(byoc.ConfigError, match=pattern):
        validate(data)


def test_cuda_graph_is_allowed_where_a_gpu_may_be_built_for():
    # target auto builds for the visible GPU, else for the cpu without graphs
    assert validate({"target": "auto", "cuda_graph": True}).cuda_graph is True
    assert validate({"cuda_graph": True}).cuda_graph is True
    assert validate({"target": "cuda -arch=sm_90", "cuda_graph": True}).cuda_graph is True
    assert validate({"target": "cpu", "cuda_graph": False}).cuda_graph is False
    # a cuda config moved to the cpu by an override (`-c cuda_sm90 --target cpu`) drops its graphs
    moved = load_config("cuda_sm90", overrides={"target": "cpu"})
    assert str(moved.target) == "cpu" and moved.cuda_graph is False
    # the override is read as a target, not as text: a dict, or a cpu target with options
    for target in ({"kind": "cpu"}, "cpu -march=native"):
        assert load_config("cuda_sm90", overrides={"target": target}).cuda_graph is False


def test_backends_auto_is_the_tuned_backends_on_a_gpu_and_none_on_the_cpu(monkeypatch):
    """`backends: auto` (the default config's): builtin alone on the cpu; on a cuda device
    cutlass, cudnn and cublaslt in that order, each where this machine can build it; one it
    cannot is left out with a note naming what to install."""
    from byoc.backend import get_backend
    from byoc.config import for_device
    auto = load_config({"backends": "auto"})
    assert auto.backends_auto and auto.to_dict()["backends"] == "auto"
    assert load_config(auto).backends_auto  # round trip
    on_cpu, notes = for_device(auto, Target("cpu"))
    assert on_cpu.backend_order == ["builtin"] and not on_cpu.backends_auto and notes == []
    for name in ("cutlass", "cudnn", "cublaslt"):
        monkeypatch.setattr(get_backend(name), "unavailable", lambda: None)
    on_gpu, notes = for_device(auto, Target("cuda -arch=sm_90"))
    assert on_gpu.backend_order == ["cutlass", "cudnn", "cublaslt", "builtin"] and notes == []
    monkeypatch.setattr(get_backend("cudnn"), "unavailable", lambda: "cuDNN (pip install nvidia-cudnn-cu13)")
    on_gpu, notes = for_device(auto, Target("cuda -arch=sm_90"))
    assert on_gpu.backend_order == ["cutlass", "cublaslt", "builtin"]
    assert notes == ["backends: auto leaves out cudnn: this machine lacks cuDNN (pip install nvidia-cudnn-cu13)"]
    listed = load_config({"backends": ["cublaslt"]})
    assert for_device(listed, Target("cuda -arch=sm_90")) == (listed, [])


def test_tf32_reaches_the_backends_that_have_it():
    """The config's tf32 is the cublaslt and cudnn Targets' unless the backend's own options say."""
    import dataclasses

    from byoc.backend import get_backend
    from byoc.pipeline import BuildContext
    for name in ("builtin", "cutlass", "cublaslt", "cudnn"):
        get_backend(name)  # their target kinds registered, as a build's partition does first
    cfg = load_config({"target": "cuda -arch=sm_90", "backends": ["cutlass", "cudnn", "cublaslt"], "tf32": True})
    context = BuildContext(config=cfg, target=Target("cuda -arch=sm_90"), workdir=None)
    assert context.backend_targets["cublaslt"].attrs["tf32"] is True
    assert context.backend_targets["cudnn"].attrs["tf32"] is True
    assert "tf32" not in context.backend_targets["cutlass"].attrs
    own = dataclasses.replace(cfg, backends=[("cublaslt", {"tf32": False})])
    assert BuildContext(config=own, target=Target("cuda -arch=sm_90"), workdir=None) \
        .backend_targets["cublaslt"].attrs["tf32"] is False
    exact = load_config({"target": "cuda -arch=sm_90", "backends": ["cublaslt"]})
    assert BuildContext(config=exact, target=Target("cuda -arch=sm_90"), workdir=None) \
        .backend_targets["cublaslt"].attrs["tf32"] is False


def test_tf32_is_in_the_cublaslt_engines_options(tmp_path):
    """A float32 cuda build with tf32 gives each cuBLASLt partition's engine tf32=1 (its
    float32 matmuls on TF32 tensor cores); without, the option is absent (exact float32)."""
    from pathlib import Path

    from byoc.pipeline import lower
    mlp = str(Path(__file__).parent / "fixtures" / "mlp.onnx")
    for tf32 in (True, False):
        workdir = tmp_path / str(tf32)
        lower(mlp, {"target": "cuda -arch=sm_90", "backends": ["cublaslt"], "tf32": tf32}, until="codegen",
              workdir=str(workdir))
        wrappers = [path.read_text() for path in workdir.glob("cublaslt*.cc")]
        assert wrappers and all(("tf32=1" in text) == tf32 for text in wrappers)


def test_config_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("precision: half\n")
    with pytest.raises(byoc.ConfigError, match=rf"{path}: precision: 'half' is not allowed"):
        load_config(str(path))


def test_known_backends_are_a_parameter_and_a_registry(monkeypatch):
    with pytest.raises(byoc.ConfigError, match=r"unknown backend 'cublaslt'; allowed: mine"):
        validate({"backends": ["cublaslt"]}, known_backends=["mine"])
    assert validate({"backends": ["mine"]}, known_backends=["mine"]).backend_order == ["mine", "builtin"]
    monkeypatch.setattr(config_module, "KNOWN_BACKENDS", list(config_module.KNOWN_BACKENDS))
    register_known_backend("plugin")
    assert validate({"backends": ["plugin"]}).backend_names == ["plugin"]
    with pytest.raises(byoc.ConfigError, match=r"backends\[0\]\.plugin: backend 'plugin' takes no options"):
        validate({"backends": [{"plugin": {"x": 1}}]})


def test_registered_backends_are_known(monkeypatch):
    from byoc import backend as backend_module
    monkeypatch.setitem(backend_module.BACKENDS, "registered_here", object())
    assert validate({"backends": ["registered_here"]}).backend_names == ["registered_here"]


def test_unknown_config_name_and_bad_files(tmp_path):
    with pytest.raises(byoc.ConfigError, match="no build config named 'nope'; shipped configs: cpu"):
        load_config("nope")
    with pytest.raises(byoc.ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: [unclosed\n")
    with pytest.raises(byoc.ConfigError, match="not valid YAML"):
        load_config(str(bad))
    bad.write_text("- a list\n")
    with pytest.raises(byoc.ConfigError, match="expected a mapping of keys"):
        load_config(str(bad))


@pytest.mark.parametrize("flags, warned", [
    (["-ccbin", "/tmp/compiler.sh"], True),
    (["-Xcompiler", "-wrapper,/tmp/w.sh"], True),
    (["--compiler-bindir=/opt/gcc"], True),
    (["-lineinfo", "--ptxas-options=-v"], False),
])
def test_extra_nvcc_flags_that_run_programs_warn(flags, warned):
    """A config is code: flags that make nvcc run a program they name are allowed, but said."""
    import warnings
    import byoc.backends.cutlass  # noqa: F401  (registers the target kind)
    from byoc.target import Target
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Target("cutlass", extra_nvcc_flags=flags)
    messages = [str(w.message) for w in caught if issubclass(w.category, byoc.ByocWarning)]
    assert bool(messages) == warned and all("a build config is code" in m for m in messages)


def test_a_bad_override_is_named_as_the_callers_not_the_config_files():
    """`byoc build -c cpu --target gpu` blamed build_configs/cpu.yaml; the override is the
    caller's: the message says so, and which config it overrode."""
    with pytest.raises(byoc.ConfigError) as info:
        byoc.build("unused.onnx", config="cpu", target="gpu")
    message = str(info.value)
    assert message.startswith("target: unknown target kind 'gpu'")
    assert message.endswith("(given on the command line or to build(), overriding build_configs/cpu.yaml)")
    with pytest.raises(byoc.ConfigError, match=r"^dims\.batch: -1 is not allowed.*overriding build_configs/cpu\.yaml"):
        byoc.build("unused.onnx", config="cpu", dims={"batch": -1})
    with pytest.raises(byoc.ConfigError, match=r"^build_configs/cpu\.yaml: cuda_graph:|^<dict>"):
        byoc.build("unused.onnx", config={"target": "cpu", "cuda_graph": True})
