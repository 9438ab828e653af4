"""FoldBatchNorm on IR text: conv (+ bias) -> batch_norm becomes conv + bias, and what
must stay stays."""
from pathlib import Path

import numpy as np

import byoc
from byoc.ir import FunctionBuilder, assert_structural_equal
from byoc.transform.fold_batch_norm import fold_batch_norm

FIXTURES = Path(__file__).parent / "fixtures"


def test_conv_then_batch_norm_becomes_conv_plus_bias():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    gamma, beta, mean = (rng.standard_normal(4).astype(np.float32) for _ in range(3))
    var = rng.random(4).astype(np.float32) + 0.5
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (1, 3, 8, 8), "float32")
        c = fb.call("conv2d", x, w, pads=(1, 1, 1, 1), name="c")
        y = fb.call("batch_norm", c, gamma, beta, mean, var, epsilon=1e-3, name="y")
        fb.ret(fb.call("relu", y, name="r"))
    mod = fb.module()
    after = fold_batch_norm(mod)
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-3)
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (1, 3, 8, 8), "float32")
        c = fb.call("conv2d", x, (w * scale[:, None, None, None]).astype(np.float32), pads=(1, 1, 1, 1), name="c")
        y = fb.call("add", c, ((0 - mean) * scale + beta).astype(np.float32).reshape(4, 1, 1), name="y")
        fb.ret(fb.call("relu", y, name="r"))
    assert_structural_equal(after, fb.module())
    xs = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(byoc.interpret(after, x=xs), byoc.interpret(mod, x=xs), rtol=1e-5, atol=1e-5)


def test_batch_norms_that_cannot_fold_stay():
    """A conv whose output is also returned, a batch norm after a relu, and one with a
    parameter computed at run time are left as they are."""
    rng = np.random.default_rng(1)
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (1, 2, 4, 4), "float32")
        s = fb.param("s", (2,), "float32")
        w = rng.standard_normal((2, 2, 1, 1)).astype(np.float32)
        ones, zeros = np.ones(2, np.float32), np.zeros(2, np.float32)
        c = fb.call("conv2d", x, w, name="c")
        y = fb.call("batch_norm", c, ones, ones, zeros, ones, name="y")
        r = fb.call("relu", x, name="r")
        z = fb.call("batch_norm", r, ones, ones, zeros, ones, name="z")
        d = fb.call("conv2d", x, w, name="d")
        v = fb.call("batch_norm", d, s, ones, zeros, ones, name="v")
        fb.ret(y, c, z, v)
    mod = fb.module()
    assert_structural_equal(fold_batch_norm(mod), mod)


def test_resnet_fixture_folds_every_batch_norm_and_keeps_its_result():
    mod = byoc.from_onnx(FIXTURES / "resnet_small.onnx")
    after = fold_batch_norm(mod)
    assert mod.script().count("batch_norm(") == 15 and "batch_norm(" not in after.script()
    data = np.load(FIXTURES / "resnet_small.npz")
    inputs = {k[3:]: v for k, v in data.items() if k.startswith("in_")}
    want = byoc.interpret(mod, **inputs)
    np.testing.assert_allclose(byoc.interpret(after, **inputs), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_a_conv_read_through_a_tuple_binding_does_not_fold():
    before = byoc.ir.parse("""
def @main(%x: Tensor[(1, 2, 1, 1), float32]) -> Tuple[Tensor[(1, 2, 1, 1), float32], Tensor[(1, 2, 1, 1), float32]] {
  %c = conv2d(%x, const([[[[1.0]], [[0.5]]], [[[0.25]], [[2.0]]]], float32))
  %y = batch_norm(%c, const([2.0, 2.0], float32), const([1.0, 1.0], float32), const([0.0, 0.0], float32), const([1.0, 1.0], float32))
  %t = (%c, %y)
  %first = %t.0
  return (%first, %y)
}
""")
    assert_structural_equal(fold_batch_norm(before), before)


def test_a_batch_norm_with_nothing_to_fold_into_becomes_a_scale_and_shift():
    """DenseNet's pre-activation: batch_norm -> relu on the concat of earlier features (no
    conv before the norm). BatchNormAsScaleShift writes it as the multiply and add it
    computes, channel vectors shaped to broadcast on its axis; a norm whose parameter is a
    run-time input stays."""
    from byoc.ir import parse
    from byoc.transform.batch_norm_as_scale_shift import batch_norm_as_scale_shift
    before = parse("""
def @main(%a: Tensor[(1, 2, 3, 3), float32], %b: Tensor[(1, 1, 3, 3), float32], %g: Tensor[(3,), float32]) -> Tuple[Tensor[(1, 3, 3, 3), float32], Tensor[(1, 3, 3, 3), float32]] {
  %cat = concat(%a, %b, axis=1)
  %norm = batch_norm(%cat, const([2.0, 1.0, 0.5], float32), const([0.0, 1.0, -1.0], float32), const([1.0, 0.0, 2.0], float32), const([3.0, 0.0, 15.0], float32), epsilon=1.0)
  %act = relu(%norm)
  %kept = batch_norm(%cat, %g, const([0.0, 1.0, -1.0], float32), const([1.0, 0.0, 2.0], float32), const([3.0, 0.0, 15.0], float32), epsilon=1.0)
  return (%act, %kept)
}""")
    expected = parse("""
def @main(%a: Tensor[(1, 2, 3, 3), float32], %b: Tensor[(1, 1, 3, 3), float32], %g: Tensor[(3,), float32]) -> Tuple[Tensor[(1, 3, 3, 3), float32], Tensor[(1, 3, 3, 3), float32]] {
  %cat = concat(%a, %b, axis=1)
  %norm_scaled = multiply(%cat, const([[[1.0]], [[1.0]], [[0.125]]], float32))
  %norm = add(%norm_scaled, const([[[-1.0]], [[1.0]], [[-1.25]]], float32))
  %act = relu(%norm)
  %kept = batch_norm(%cat, %g, const([0.0, 1.0, -1.0], float32), const([1.0, 0.0, 2.0], float32), const([3.0, 0.0, 15.0], float32), epsilon=1.0)
  return (%act, %kept)
}""")
    after = batch_norm_as_scale_shift(before)
    assert_structural_equal(after, expected)
    rng = np.random.default_rng(2)
    inputs = {"a": rng.standard_normal((1, 2, 3, 3)).astype(np.float32),
              "b": rng.standard_normal((1, 1, 3, 3)).astype(np.float32), "g": rng.random(3).astype(np.float32)}
    for got, want in zip(byoc.interpret(after, **inputs), byoc.interpret(before, **inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    last_axis = parse("""
def @main(%x: Tensor[(2, 4, 3), float32]) -> Tensor[(2, 4, 3), float32] {
  %norm = batch_norm(%x, const([2.0, 1.0, 0.5], float32), const([0.0, 1.0, -1.0], float32), const([1.0, 0.0, 2.0], float32), const([3.0, 0.0, 15.0], float32), epsilon=1.0, axis=-1)
  return %norm
}""")
    assert "const([1.0, 1.0, 0.125], float32)" in batch_norm_as_scale_shift(last_axis).script()
