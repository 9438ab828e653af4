"""Targets (parse, round-trip, flags, errors) and build configs (validation errors name
the key path, the value and what is allowed)."""
import pytest

import byoc
from byoc.config import load_config, shipped_config_names, validate
from byoc.target import Target


def test_target_parse_and_round_trip():
    target = Target("cuda -arch=sm_90 -use_fast_math=1")
    assert target.kind == "cuda" and target.arch == "sm_90" and target.use_fast_math is True
    assert Target(str(target)) == target
    assert Target({"kind": "cuda", "arch": "sm_80"}) == Target("cuda", arch="sm_80")
    assert str(Target("cpu")) == "cpu"


def test_target_flags_come_from_attributes():
    flags = Target("cuda -arch=sm_90a -use_fast_math=1").nvcc_flags()
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags and "--use_fast_math" in flags
    assert "-march=native" in Target("cpu -march=native").cxx_flags()


def test_target_errors_name_the_attribute_and_allowed_values():
    with pytest.raises(byoc.ConfigError, match=r"unknown attribute 'sm'.*allowed: arch"):
        Target("cuda -sm=90")
    with pytest.raises(byoc.ConfigError, match=r"arch='sm_42'.*allowed: sm_80"):
        Target("cuda -arch=sm_42")
    with pytest.raises(byoc.ConfigError, match="unknown target kind 'tpu'"):
        Target("tpu")


def test_current_target_context():
    assert Target.current() is None
    with Target("cpu") as target:
        assert Target.current() is target
    assert Target.current() is None


@pytest.mark.parametrize("name", ["default", "cpu", "cuda_sm90", "cuda_sm90_builtin"])
def test_shipped_configs_load(name):
    assert name in shipped_config_names()
    config = load_config(name)
    assert config.precision in ("float32", "float16")


@pytest.mark.parametrize("data, pattern", [
    ({"precison": "float16"}, r"unknown key\(s\) \['precison'\]; allowed keys: target, backends"),
    ({"precision": "fp8"}, r"precision: 'fp8' is not allowed; allowed: float32, float16, bfloat16"),
    ({"backends": ["tensorrt"]}, r"backends\[0\]: unknown backend 'tensorrt'; allowed: cutlass"),
    ({"backends": [{"builtin": {"matmul_algo": "x"}}]}, r"backends\[0\]\.builtin: .*matmul_algo='x'"),
    ({"target": "cuda -arch=sm_1"}, r"target: .*allowed: sm_80"),
    ({"cuda_graph": "yes"}, r"cuda_graph: 'yes' is not allowed; allowed: true, false"),
    ({"params": "outside"}, r"params: 'outside' is not allowed; allowed: embedded, sidecar"),
    ({"tuning": {"profil": True}}, r"tuning\.profil: unknown key; allowed: profile, tuning_db"),
    ({"input_shapes": {"x": [1, -2]}}, r"input_shapes\.x: \[1, -2\] is not a list of non-negative integers"),
])
def test_config_errors_name_key_value_and_allowed(data, pattern):
    with pytest.raises(byoc.ConfigError, match=pattern):
        validate(data)


def test_unknown_config_name_lists_shipped_ones(tmp_path):
    with pytest.raises(byoc.ConfigError, match="no build config named 'nope'; shipped configs: cpu"):
        load_config("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: [unclosed\n")
    with pytest.raises(byoc.ConfigError, match="not valid YAML"):
        load_config(str(bad))
