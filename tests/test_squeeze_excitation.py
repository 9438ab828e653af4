"""ClaimSqueezeExcitation (backends/builtin/squeeze_excitation.py): an SE block's pool, two
1x1 convs and their activations become one builtin function before any backend's patterns
look; its shim call runs on the cpu (here) and on the GPU (marked gpu)."""
from __future__ import annotations

import numpy as np
import pytest

import byoc
from byoc.backends.builtin.partition import partition_builtin
from byoc.backends.builtin.squeeze_excitation import claim_squeeze_excitation
from byoc.interpreter import interpret
from byoc.ir import FunctionBuilder, assert_structural_equal, parse
from byoc.ir.types import numpy_dtype
from byoc.report import PartitionReport
from byoc.transform.partition import partition_for
from gpu_probe import gpu_present


def _const(array) -> str:
    return f"const({np.asarray(array).tolist()}, {array.dtype})"


RNG = np.random.default_rng(7)
W1 = (RNG.standard_normal((2, 1, 1, 8)) * 0.5).astype(np.float16)
B1 = RNG.standard_normal(2).astype(np.float16)
W2 = (RNG.standard_normal((8, 1, 1, 2)) * 0.5).astype(np.float16)
B2 = RNG.standard_normal(8).astype(np.float16)
X = "Tensor[(2, 3, 3, 8), float16]"


def test_claim_outlines_a_block_with_its_scale():
    """The pool, both convs with their biases and activations, and the multiply of x by the
    gate: one builtin.squeeze_excitation function; what reads the block's output stays."""
    before = parse(f"""
def @main(%x: {X}) -> {X} {{
  %p = global_avg_pool2d(%x, layout="NHWC")
  %c1 = conv2d(%p, {_const(W1)}, data_layout="NHWC", kernel_layout="OHWI")
  %a1 = add(%c1, {_const(B1)})
  %h = silu(%a1)
  %c2 = conv2d(%h, {_const(W2)}, data_layout="NHWC", kernel_layout="OHWI")
  %a2 = add(%c2, {_const(B2)})
  %g = sigmoid(%a2)
  %y = multiply(%g, %x)
  %z = add(%y, %x)
  return %z
}}
""")
    expected = parse(f"""
def @main(%x: {X}) -> {X} {{
  %se = fn (%q0: {X}, %q1: Tensor[(2, 1, 1, 8), float16], %q2: Tensor[(2,), float16], %q3: Tensor[(8, 1, 1, 2), float16], %q4: Tensor[(8,), float16]) -> {X} [Compiler="builtin", Composite="builtin.squeeze_excitation"] {{
    %p = global_avg_pool2d(%q0, layout="NHWC")
    %c1 = conv2d(%p, %q1, data_layout="NHWC", kernel_layout="OHWI")
    %a1 = add(%c1, %q2)
    %h = silu(%a1)
    %c2 = conv2d(%h, %q3, data_layout="NHWC", kernel_layout="OHWI")
    %a2 = add(%c2, %q4)
    %g = sigmoid(%a2)
    %y = multiply(%g, %q0)
    return %y
  }}
  %y = %se(%x, {_const(W1)}, {_const(B1)}, {_const(W2)}, {_const(B2)})
  %z = add(%y, %x)
  return %z
}}
""")
    after = claim_squeeze_excitation(before)
    assert_structural_equal(after, expected)
    x = RNG.standard_normal((2, 3, 3, 8)).astype(np.float16)
    np.testing.assert_array_equal(interpret(after, x=x), interpret(before, x=x))


def test_a_gate_read_elsewhere_leaves_the_scale_outside():
    """The gate also returned: the block ends at the gate, the multiply stays an op."""
    mod = _block(channels=16, squeeze=8, gate_returned=True)
    after = claim_squeeze_excitation(mod)
    (se,) = [b.value for b in after["main"].bindings if isinstance(b.value, byoc.ir.Function)]
    assert se.bindings[-1].value.op.name == "hard_sigmoid"
    assert any(getattr(b.value, "op", None) is not None and getattr(b.value.op, "name", "") == "multiply"
               for b in after["main"].bindings)


def _block(channels=8, squeeze=2, layout="NHWC", extra_reader=False, dtype="float16", gate_returned=False):
    """An SE block on a (2, 3, 3, channels) tensor (NCHW: transposed), as an IRModule."""
    rng = np.random.default_rng(channels)
    shape = (2, 3, 3, channels) if layout == "NHWC" else (2, channels, 3, 3)
    kernel_layout = "OHWI" if layout == "NHWC" else "OIHW"

    def weight(out, inp):
        w = (rng.standard_normal((out, 1, 1, inp)) * 0.5).astype(dtype)
        return w if layout == "NHWC" else w.transpose(0, 3, 1, 2).copy()
    with FunctionBuilder("main") as fb:
        x = fb.param("x", shape, dtype)
        pooled = fb.call("global_avg_pool2d", x, layout=layout)
        hidden = fb.call("relu", fb.call("add", fb.call("conv2d", pooled, weight(squeeze, channels), data_layout=layout,
                                                        kernel_layout=kernel_layout),
                                         rng.standard_normal(squeeze if layout == "NHWC" else (squeeze, 1, 1))
                                         .astype(dtype)))
        gate = fb.call("hard_sigmoid", fb.call("conv2d", hidden, weight(channels, squeeze), data_layout=layout,
                                               kernel_layout=kernel_layout), alpha=1 / 6, beta=0.5)
        y = fb.call("multiply", gate, x)
        if gate_returned:
            fb.ret(byoc.ir.Tuple([y, gate]))
        else:
            fb.ret(fb.call("add", y, fb.call("sum", hidden)) if extra_reader else y)
    return fb.module()


@pytest.mark.parametrize("kwargs, reason", [
    (dict(channels=12), "C=12: the kernel takes a multiple of 8 up to 4096 channels"),
    (dict(layout="NCHW"), "the pool is not of an NHWC tensor"),
    (dict(extra_reader=True), "is not read by one 1x1 conv2d back to 8 channels alone"),
    (dict(dtype="float64"), "dtype float64"),
    (dict(channels=4096, squeeze=1024), "N*C*S = 2*4096*1024 multiply-adds a product (at most 4194304)"),
])
def test_refusals_name_the_reason_and_leave_the_block(kwargs, reason):
    mod = _block(**kwargs)
    report = PartitionReport()
    after = claim_squeeze_excitation(mod, report)
    assert_structural_equal(after, mod)
    assert [(r["pattern"], r["op"]) for r in report.refused] == [("squeeze_excitation", "global_avg_pool2d")]
    assert reason in report.refused[0]["reason"], report.refused


def test_a_pool_without_a_conv_is_no_candidate():
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (2, 3, 3, 8), "float16")
        fb.ret(fb.call("global_avg_pool2d", x, layout="NHWC"))
    report = PartitionReport()
    assert_structural_equal(claim_squeeze_excitation(fb.module(), report), fb.module())
    assert report.refused == []


def test_claimed_before_the_cutlass_patterns_look():
    """With cutlass first in the priority order, the block (here with its scale) is still
    one builtin function: the two convs never become cutlass GEMMs, and the report counts
    the composite."""
    mod = _block(channels=16, squeeze=8)
    without, _ = partition_for(mod, ["cutlass"], finalize=partition_builtin)
    assert any(f.attrs.get("Compiler") == "cutlass" for name, f in without.items() if name != "main")
    claimed, report = partition_for(mod, ["cutlass"], finalize=partition_builtin,
                                    claims_first=[claim_squeeze_excitation])
    functions = [f for name, f in claimed.items() if name != "main"]
    assert [f.attrs.get("Composite") for f in functions] == ["builtin.squeeze_excitation"]  # with its scale
    assert report.to_json()["backends"]["builtin"]["patterns"] == {"squeeze_excitation": 1}


def _nhwc_model(dtype, channels=40, squeeze=10, size=(7, 9), batch=3, activation="silu", gate="sigmoid"):
    """An SE block with its gate multiply and a residual add, on an NHWC float32 input cast
    to `dtype` (and the result back)."""
    rng = np.random.default_rng(3)
    with FunctionBuilder("main") as fb:
        x = fb.call("cast", fb.param("x", (batch, *size, channels), "float32"), dtype=dtype)
        pooled = fb.call("global_avg_pool2d", x, layout="NHWC")
        w1 = (rng.standard_normal((squeeze, 1, 1, channels)) * 3 / np.sqrt(channels)).astype(numpy_dtype(dtype))
        w2 = (rng.standard_normal((channels, 1, 1, squeeze)) * 2 / np.sqrt(squeeze)).astype(numpy_dtype(dtype))
        hidden = fb.call("conv2d", pooled, w1, data_layout="NHWC", kernel_layout="OHWI")
        hidden = fb.call(activation, fb.call("add", hidden, rng.standard_normal(squeeze).astype(numpy_dtype(dtype))))
        gate_in = fb.call("add", fb.call("conv2d", hidden, w2, data_layout="NHWC", kernel_layout="OHWI"),
                          rng.standard_normal(channels).astype(numpy_dtype(dtype)))
        attrs = dict(alpha=1 / 6, beta=0.5) if gate == "hard_sigmoid" else {}
        g = fb.call(gate, gate_in, **attrs)
        fb.ret(fb.call("cast", fb.call("add", fb.call("multiply", g, x), x), dtype="float32"))
    return fb.module()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_cpu_build_runs_the_block_as_one_shim_call(dtype, tmp_path):
    mod = _nhwc_model(dtype, activation="hard_swish", gate="hard_sigmoid")
    library = byoc.build(mod, config="cpu", workdir=str(tmp_path / "w"))
    source = "".join(p.read_text() for p in (tmp_path / "w").rglob("*.cc"))
    assert source.count("byoc_shim_squeeze_excitation(") == 1, source
    assert "BYOC_ACTIVATION_HARD_SWISH" in source and "BYOC_ACTIVATION_HARD_SIGMOID" in source
    x = np.random.default_rng(5).standard_normal((3, 7, 9, 40)).astype(np.float32)
    got = library.load().run(x=x)
    want = interpret(mod, x=x)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-4 if dtype == "float32" else 1e-2, atol=1e-4 if dtype == "float32" else 1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
@pytest.mark.parametrize("dtype, channels, squeeze, size, batch, activation, gate", [
    ("float16", 40, 10, (7, 9), 3, "silu", "sigmoid"),
    ("bfloat16", 1152, 48, (7, 7), 2, "relu", "hard_sigmoid"),
    ("float32", 32, 8, (56, 56), 1, "hard_swish", "sigmoid"),
])
def test_a_cuda_build_runs_the_block_as_one_kernel(dtype, channels, squeeze, size, batch, activation, gate, tmp_path):
    import cupy
    mod = _nhwc_model(dtype, channels, squeeze, size, batch, activation, gate)
    library = byoc.build(mod, config={"target": "auto", "cuda_graph": True}, workdir=str(tmp_path / "w"))
    assert library.report.to_json()["backends"]["builtin"]["patterns"].get("squeeze_excitation") == 1
    x = np.random.default_rng(5).standard_normal((batch, *size, channels)).astype(np.float32)
    module = library.load()
    for _ in range(2):  # the second run replays the CUDA graph
        got = cupy.asnumpy(module.run(x=cupy.asarray(x))).astype(np.float64)
    want = np.asarray(interpret(mod, x=x), np.float64)
    scale = np.max(np.abs(want))
    assert np.max(np.abs(got - want)) <= {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}[dtype] * scale
