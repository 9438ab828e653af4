"""convert_to_float16: IR text before and after, and numerical agreement with float32."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc.interpreter import interpret
from byoc.ir import Call, FunctionBuilder, assert_structural_equal, parse
from byoc.transform import convert_to_float16, dead_code_elimination, fold_constant
from byoc.transform.convert_to_float16 import DEFAULT_KEEP_FLOAT32_OPS

FIXTURES = Path(__file__).parent / "fixtures"


def check(before: str, after: str, **options):
    mod = parse(before)
    text_before = mod.script()
    result = convert_to_float16(mod, **options)
    assert_structural_equal(result, parse(after))
    assert mod.script() == text_before, "the pass changed its input module"
    return result


# ================================================================= IR text


MLP = """
def @main(%x: Tensor[(2, 4), float32]) -> Tensor[(2, 2), float32] {
  %h = matmul(%x, const([[0.5, -1.0], [0.25, 2.0], [-0.75, 1.5], [1.0, 0.125]], float32))
  %hb = add(%h, const([0.5, -0.5], float32))
  %g = gelu(%hb)
  %o = matmul(%g, const([[1.0, -2.0], [0.5, 0.25]], float32))
  %y = add(%o, const([0.0625, 3.0], float32))
  return %y
}
"""


def test_mlp_runs_in_float16_with_float32_interface():
    # One cast at entry, one at exit; the weights become float16 constants.
    after = """
def @main(%x: Tensor[(2, 4), float32]) -> Tensor[(2, 2), float32] {
  %x16 = cast(%x, dtype="float16")
  %h = matmul(%x16, const([[0.5, -1.0], [0.25, 2.0], [-0.75, 1.5], [1.0, 0.125]], float16))
  %hb = add(%h, const([0.5, -0.5], float16))
  %g = gelu(%hb)
  %o = matmul(%g, const([[1.0, -2.0], [0.5, 0.25]], float16))
  %y = add(%o, const([0.0625, 3.0], float16))
  %y32 = cast(%y, dtype="float32")
  return %y32
}
"""
    check(MLP, after)


def test_mlp_in_bfloat16():
    after = """
def @main(%x: Tensor[(2, 4), float32]) -> Tensor[(2, 2), float32] {
  %x16 = cast(%x, dtype="bfloat16")
  %h = matmul(%x16, const([[0.5, -1.0], [0.25, 2.0], [-0.75, 1.5], [1.0, 0.125]], bfloat16))
  %hb = add(%h, const([0.5, -0.5], bfloat16))
  %g = gelu(%hb)
  %o = matmul(%g, const([[1.0, -2.0], [0.5, 0.25]], bfloat16))
  %y = add(%o, const([0.0625, 3.0], bfloat16))
  %y32 = cast(%y, dtype="float32")
  return %y32
}
"""
    check(MLP, after, dtype="bfloat16")


def test_layer_norm_and_softmax_block():
    before = """
def @main(%x: Tensor[(2, 2), float32], %gamma: Tensor[(4,), float32], %beta: Tensor[(4,), float32]) -> Tuple[Tensor[(2, 2), float32], Tensor[(2, 4), float32]] {
  %h = matmul(%x, const([[0.5, -1.0, 0.25, 2.0], [-0.75, 1.5, 1.0, 0.125]], float32))
  %n = layer_norm(%h, %gamma, %beta)
  %p = softmax(%n)
  %q = multiply(%p, const(2.0, float32))
  %s = softmax(%h, axis=0)
  %r = add(%q, %s)
  %o = matmul(%r, const([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], float32))
  %y = add(%o, %x)
  %z = add(%h, %beta)
  return (%y, %z)
}
"""
    # layer_norm and both softmaxes share one cast of %h up; layer_norm reads the float32
    # parameters as they are; the multiply and add between the float32 ops follow them in
    # float32, and one cast takes %r down for the matmul. Parameters read in float16 are
    # cast at the entry; each float16 result is cast back at the exit.
    after = """
def @main(%x: Tensor[(2, 2), float32], %gamma: Tensor[(4,), float32], %beta: Tensor[(4,), float32]) -> Tuple[Tensor[(2, 2), float32], Tensor[(2, 4), float32]] {
  %x16 = cast(%x, dtype="float16")
  %beta16 = cast(%beta, dtype="float16")
  %h = matmul(%x16, const([[0.5, -1.0, 0.25, 2.0], [-0.75, 1.5, 1.0, 0.125]], float16))
  %h32 = cast(%h, dtype="float32")
  %n = layer_norm(%h32, %gamma, %beta)
  %p = softmax(%n)
  %q = multiply(%p, const(2.0, float32))
  %s = softmax(%h32, axis=0)
  %r = add(%q, %s)
  %r16 = cast(%r, dtype="float16")
  %o = matmul(%r16, const([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], float16))
  %y = add(%o, %x16)
  %z = add(%h, %beta16)
  %y32 = cast(%y, dtype="float32")
  %z32 = cast(%z, dtype="float32")
  return (%y32, %z32)
}
"""
    check(before, after)


def test_keep_float32_ops_is_an_argument():
    before = """
def @main(%x: Tensor[(2, 4), float32], %gamma: Tensor[(4,), float32], %beta: Tensor[(4,), float32]) -> Tensor[(2, 4), float32] {
  %n = layer_norm(%x, %gamma, %beta)
  %p = softmax(%n)
  return %p
}
"""
    after = """
def @main(%x: Tensor[(2, 4), float32], %gamma: Tensor[(4,), float32], %beta: Tensor[(4,), float32]) -> Tensor[(2, 4), float32] {
  %x16 = cast(%x, dtype="float16")
  %gamma16 = cast(%gamma, dtype="float16")
  %beta16 = cast(%beta, dtype="float16")
  %n = layer_norm(%x16, %gamma16, %beta16)
  %n32 = cast(%n, dtype="float32")
  %p = softmax(%n32)
  return %p
}
"""
    check(before, after, keep_float32_ops=DEFAULT_KEEP_FLOAT32_OPS - {"layer_norm"})
    # With the default set, nothing runs in float16 and nothing is cast.
    check(before, before)


def test_integer_path_is_untouched():
    before = """
def @main(%ids: Tensor[(2, 3), int64], %x: Tensor[(2, 3), float32]) -> Tuple[Tensor[(2, 3), int64], Tensor[(2, 3), float32]] {
  %a = add(%ids, const(1, int64))
  %b = multiply(%a, %ids)
  %mask = greater(%b, const(2, int64))
  %bf = cast(%b, dtype="float32")
  %y = add(%x, %bf)
  %pos = greater(%y, const(0.0, float32))
  %both = logical_and(%mask, %pos)
  %c = where(%both, %b, const(0, int64))
  return (%c, %y)
}
"""
    # The integer and boolean ops stay as they are; the model's cast of %b to float32
    # becomes one cast straight to float16, where the add needs it.
    after = """
def @main(%ids: Tensor[(2, 3), int64], %x: Tensor[(2, 3), float32]) -> Tuple[Tensor[(2, 3), int64], Tensor[(2, 3), float32]] {
  %x16 = cast(%x, dtype="float16")
  %a = add(%ids, const(1, int64))
  %b = multiply(%a, %ids)
  %mask = greater(%b, const(2, int64))
  %bf16 = cast(%b, dtype="float16")
  %y = add(%x16, %bf16)
  %pos = greater(%y, const(0.0, float16))
  %both = logical_and(%mask, %pos)
  %c = where(%both, %b, const(0, int64))
  %y32 = cast(%y, dtype="float32")
  return (%c, %y32)
}
"""
    check(before, after)
    integers_only = """
def @main(%ids: Tensor[(2, 3), int64]) -> Tensor[(2, 3), float16] {
  %a = add(%ids, const(1, int64))
  %h = cast(%a, dtype="float16")
  %r = relu(%h)
  return %r
}
"""
    check(integers_only, integers_only)


def test_casts_of_the_model_are_never_doubled():
    before = """
def @main(%x: Tensor[(2, 2), float32], %m: Tensor[(2, 2), int32]) -> Tuple[Tensor[(2, 2), float32], Tensor[(2, 2), int32]] {
  %h = matmul(%x, const([[1.0, 2.0], [3.0, 4.0]], float32))
  %h16 = cast(%h, dtype="float16")
  %r = relu(%h16)
  %r32 = cast(%r, dtype="float32")
  %mf = cast(%m, dtype="float32")
  %y = multiply(%r32, %mf)
  %i = cast(%y, dtype="int32")
  %e = exp(%y)
  return (%e, %i)
}
"""
    # cast(%h, float16) of a value already in float16 disappears; cast(%r, float32) is
    # not needed by the float16 multiply; the int mask goes straight to float16.
    after = """
def @main(%x: Tensor[(2, 2), float32], %m: Tensor[(2, 2), int32]) -> Tuple[Tensor[(2, 2), float32], Tensor[(2, 2), int32]] {
  %x16 = cast(%x, dtype="float16")
  %h = matmul(%x16, const([[1.0, 2.0], [3.0, 4.0]], float16))
  %r = relu(%h)
  %mf16 = cast(%m, dtype="float16")
  %y = multiply(%r, %mf16)
  %i = cast(%y, dtype="int32")
  %y32 = cast(%y, dtype="float32")
  %e = exp(%y32)
  return (%e, %i)
}
"""
    check(before, after)


def test_out_of_range_constants_saturate():
    before = """
def @main(%scores: Tensor[(2, 3), float32], %keep: Tensor[(1, 3), bool]) -> Tensor[(2, 3), float32] {
  %bias = where(%keep, const(0.0, float32), const(-3.4028234663852886e+38, float32))
  %masked = add(%scores, %bias)
  %big = multiply(%masked, const([1e9, -inf, nan], float32))
  %p = softmax(%big)
  return %p
}
"""
    # float32's lowest value and 1e9 become float16's largest finite magnitudes; inf and
    # nan stay.
    after = """
def @main(%scores: Tensor[(2, 3), float32], %keep: Tensor[(1, 3), bool]) -> Tensor[(2, 3), float32] {
  %scores16 = cast(%scores, dtype="float16")
  %bias = where(%keep, const(0.0, float16), const(-65504.0, float16))
  %masked = add(%scores16, %bias)
  %big = multiply(%masked, const([65504.0, -inf, nan], float16))
  %big32 = cast(%big, dtype="float32")
  %p = softmax(%big32)
  return %p
}
"""
    check(before, after)


def test_large_matmul_weights_are_converted_up_front_once_and_saturated(monkeypatch):
    """The weights that matmuls and convs read (1 MiB and up) are converted before the walk,
    on several threads, each once; a weight two matmuls share stays one Constant, and values
    beyond float16's range saturate as on the walk's own path. With matmul kept in float32
    nothing is converted up front."""
    from byoc.ir.expr import Constant
    import importlib
    module = importlib.import_module("byoc.transform.convert_to_float16")
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((512, 1024)).astype(np.float32)
    weight[0, :3] = [1e9, -np.inf, np.nan]
    other = rng.standard_normal((1024, 512)).astype(np.float32)
    builder = FunctionBuilder("main")
    x = builder.param("x", (4, 512), "float32")
    shared = Constant(weight)
    first = builder.call("matmul", x, shared)
    second = builder.call("matmul", builder.call("gelu", first), Constant(other))
    builder.ret(builder.call("matmul", builder.call("relu", second), shared))
    mod = builder.module()
    up_front, lazily = [], []
    convert_all = module._ConstantConverter.convert_all
    saturating_convert_all = module._saturating_convert_all
    state = {"walking": False}

    def counted_convert(arrays, dtype):
        (lazily if state["walking"] else up_front).extend(array.shape for array in arrays)
        return saturating_convert_all(arrays, dtype)

    def convert_all_then_walk(self, constants, dtype):
        convert_all(self, constants, dtype)
        state["walking"] = True

    monkeypatch.setattr(module, "_saturating_convert_all", counted_convert)
    monkeypatch.setattr(module._ConstantConverter, "convert_all", convert_all_then_walk)
    result = convert_to_float16(mod)
    assert state["walking"] and sorted(up_front) == [(512, 1024), (1024, 512)] and lazily == []
    matmuls = [b.value for b in result["main"].bindings if isinstance(b.value, Call) and b.value.op.name == "matmul"]
    weights = [arg for call in matmuls for arg in call.args if isinstance(arg, Constant)]
    assert [w.type.dtype for w in weights] == ["float16"] * 3
    assert weights[0] is weights[2] and weights[1] is not weights[0]
    np.testing.assert_array_equal(weights[1].data, other.astype(np.float16))
    assert weights[0].data[0, 0] == 65504 and np.isneginf(weights[0].data[0, 1]) and np.isnan(weights[0].data[0, 2])
    np.testing.assert_array_equal(weights[0].data[1:], weight[1:].astype(np.float16))
    up_front.clear()
    state["walking"] = False
    kept = convert_to_float16(mod, keep_float32_ops=DEFAULT_KEEP_FLOAT32_OPS | {"matmul"})
    assert up_front == [] and lazily == []
    assert all(arg.type.dtype == "float32" for b in kept["main"].bindings if isinstance(b.value, Call)
               and b.value.op.name == "matmul" for arg in b.value.args if isinstance(arg, Constant))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_weights_are_converted_piece_by_piece_each_piece_saturated_on_its_own(monkeypatch, dtype):
    """Weights are converted in pieces shared by the threads; whether a piece can overflow is
    read from its float32 range. Pieces with a value beyond the range, an infinity or a NaN
    (and only those) take the careful path; every value ends as converting the whole weight
    at once would make it, for a non-contiguous weight and an empty one too."""
    import importlib
    import ml_dtypes
    module = importlib.import_module("byoc.transform.convert_to_float16")
    monkeypatch.setattr(module, "CONVERT_PIECE_VALUES", 1000)
    target = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    largest = float(ml_dtypes.finfo(target).max)
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((37, 211)).astype(np.float32)  # 7807 values: 8 pieces, the last short
    weight.flat[5] = largest * 4 if dtype == "float16" else np.float32(3.4e38)  # piece 0: rounds to inf unclamped
    weight.flat[2500] = np.nan  # piece 2
    weight.flat[7806] = -np.inf  # the last piece
    weight.flat[4000] = -1e30  # piece 4
    strided = rng.standard_normal((64, 90)).astype(np.float32)[:, ::3]  # not contiguous
    empty = np.zeros((0, 16), np.float32)
    careful = []
    piece = module._saturating_convert_piece

    def counted(source, output, largest):
        if not (-largest <= source.min() and source.max() <= largest):
            careful.append(source.size)
        return piece(source, output, largest)

    monkeypatch.setattr(module, "_saturating_convert_piece", counted)
    converted = module._saturating_convert_all([weight, strided, empty], dtype)

    def reference(data):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(np.isfinite(data), np.clip(data, -largest, largest), data).astype(target)

    np.testing.assert_array_equal(converted[0].view(np.uint16), reference(weight).view(np.uint16))
    assert converted[0].flat[5] == largest and np.isnan(converted[0].flat[2500]) and np.isneginf(converted[0].flat[7806])
    np.testing.assert_array_equal(converted[1], strided.astype(target))
    assert converted[0].dtype == converted[1].dtype == target and converted[1].shape == (64, 30)
    assert converted[2].shape == (0, 16) and converted[2].dtype == target
    assert len(careful) == (4 if dtype == "float16" else 3)  # bfloat16's range holds -1e30


def test_calls_tuples_and_local_functions_keep_float32_interfaces():
    before = """
def @main(%x: Tensor[(2, 2), float32]) -> Tensor[(2, 2), float32] {
  %parts = split(%x, axis=1, sizes=[1, 1])
  %a = %parts.0
  %b = %parts.1
  %ab = concat(%b, %a, axis=1)
  %c = matmul(%ab, const([[1.0, 2.0], [3.0, 4.0]], float32))
  %f = fn (%p: Tensor[(2, 2), float32]) -> Tensor[(2, 2), float32] {
    %e = exp(%p)
    %t = tanh(%e)
    return %t
  }
  %d = @helper(%c, %x)
  %g = %f(%d)
  return %g
}

def @helper(%p: Tensor[(2, 2), float32], %q: Tensor[(2, 2), float32]) -> Tensor[(2, 2), float32] {
  %r = matmul(%p, %q)
  %s = sum(%r, axes=[1], keepdims=true)
  %t = add(%r, %s)
  return %t
}

def @decl(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];
"""
    # Every function is converted on its own, behind its unchanged float32 signature:
    # @helper gets %c cast back to float32, and %x as it is. Inside the local function
    # exp runs in float32 and tanh follows it there: no cast at all.
    after = """
def @main(%x: Tensor[(2, 2), float32]) -> Tensor[(2, 2), float32] {
  %x16 = cast(%x, dtype="float16")
  %parts = split(%x16, axis=1, sizes=[1, 1])
  %a = %parts.0
  %b = %parts.1
  %ab = concat(%b, %a, axis=1)
  %c = matmul(%ab, const([[1.0, 2.0], [3.0, 4.0]], float16))
  %f = fn (%p: Tensor[(2, 2), float32]) -> Tensor[(2, 2), float32] {
    %e = exp(%p)
    %t = tanh(%e)
    return %t
  }
  %c32 = cast(%c, dtype="float32")
  %d = @helper(%c32, %x)
  %g = %f(%d)
  return %g
}

def @helper(%p: Tensor[(2, 2), float32], %q: Tensor[(2, 2), float32]) -> Tensor[(2, 2), float32] {
  %p16 = cast(%p, dtype="float16")
  %q16 = cast(%q, dtype="float16")
  %r = matmul(%p16, %q16)
  %r32 = cast(%r, dtype="float32")
  %s = sum(%r32, axes=[1], keepdims=true)
  %t = add(%r32, %s)
  return %t
}

def @decl(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];
"""
    check(before, after)


def test_bad_arguments_are_errors():
    mod = parse(MLP)
    with pytest.raises(ValueError, match="float8"):
        convert_to_float16(mod, dtype="float8")
    with pytest.raises(ValueError, match="layernorm"):
        convert_to_float16(mod, keep_float32_ops={"layernorm"})


# ================================================================= numerical agreement


def relative_error(result, reference) -> float:
    """||result - reference|| / ||reference||, in float64."""
    result = np.asarray(result, np.float64)
    reference = np.asarray(reference, np.float64)
    return float(np.linalg.norm(result - reference) / np.linalg.norm(reference))


# float16 keeps 11 significant bits, bfloat16 8: each rounding costs about 8x more.
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2}


def assert_agrees(mod, inputs: dict, dtype: str):
    converted = dead_code_elimination(convert_to_float16(mod, dtype))
    reference = interpret(mod, **inputs)
    result = interpret(converted, **inputs)
    if not isinstance(reference, tuple):
        reference, result = (reference,), (result,)
    for index, (got, expected) in enumerate(zip(result, reference)):
        assert got.dtype == expected.dtype  # the interface stays float32
        error = relative_error(got, expected)
        assert error < TOLERANCE[dtype], f"output {index}: relative error {error:.2e} in {dtype}"
    return converted


def random_mlp(rng) -> byoc.ir.IRModule:
    with FunctionBuilder() as fb:
        x = fb.param("x", (8, 64))
        w1 = (rng.standard_normal((64, 128)) / 8).astype(np.float32)
        w2 = (rng.standard_normal((128, 32)) / 11).astype(np.float32)
        b1 = rng.standard_normal(128).astype(np.float32)
        b2 = rng.standard_normal(32).astype(np.float32)
        hidden = fb.call("gelu", fb.call("add", fb.call("matmul", x, w1), b1))
        fb.ret(fb.call("add", fb.call("matmul", hidden, w2), b2))
    return fb.module()


def random_attention_block(rng) -> byoc.ir.IRModule:
    """Pre-norm self-attention with one head and a residual, plus a mean-pooled output."""
    def weight(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    with FunctionBuilder() as fb:
        x = fb.param("x", (2, 16, 32))
        gamma = fb.param("gamma", (32,))
        beta = fb.param("beta", (32,))
        normed = fb.call("layer_norm", x, gamma, beta)
        query = fb.call("matmul", normed, weight(32, 32))
        key = fb.call("matmul", normed, weight(32, 32))
        value = fb.call("matmul", normed, weight(32, 32))
        scores = fb.call("multiply", fb.call("matmul", query, fb.call("transpose", key, axes=[0, 2, 1])),
                         np.float32(1 / np.sqrt(32)))
        probabilities = fb.call("softmax", scores)
        attended = fb.call("matmul", probabilities, value)
        out = fb.call("add", x, fb.call("matmul", attended, weight(32, 32)))
        pooled = fb.call("mean", out, axes=[1])
        fb.ret(out, pooled)
    return fb.module()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_random_mlp_agrees_with_float32(dtype):
    rng = np.random.default_rng(1)
    mod = random_mlp(rng)
    assert_agrees(mod, {"x": rng.standard_normal((8, 64)).astype(np.float32)}, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_random_attention_block_agrees_with_float32(dtype):
    rng = np.random.default_rng(2)
    mod = random_attention_block(rng)
    inputs = {"x": rng.standard_normal((2, 16, 32)).astype(np.float32),
              "gamma": (1 + 0.1 * rng.standard_normal(32)).astype(np.float32),
              "beta": (0.1 * rng.standard_normal(32)).astype(np.float32)}
    assert_agrees(mod, inputs, dtype)


BERT_SHAPES = {"input_ids": (2, 16), "attention_mask": (2, 16), "token_type_ids": (2, 16)}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("model, shapes", [
    ("mlp", None), ("resnet_small", None), ("gpt2_2l", None),
    ("bert2", BERT_SHAPES), ("bert2_opset14", BERT_SHAPES),
])
def test_onnx_fixtures_agree_with_float32(model, shapes, dtype):
    """Whole models (attention masks of float32's lowest value, layer norms written out
    op by op in opset 14) after fold_constant, on the fixtures' seeded random inputs."""
    imported = byoc.from_onnx(FIXTURES / f"{model}.onnx", input_shapes=shapes)
    mod = dead_code_elimination(fold_constant(imported))
    data = np.load(FIXTURES / f"{model}.npz")
    inputs = {key[len("in_"):]: data[key] for key in data.files if key.startswith("in_")}
    converted = assert_agrees(mod, inputs, dtype)

    # Every inserted cast reads a computed value, never another cast.
    casts = {binding.var: binding.value for binding in converted["main"].bindings
             if isinstance(binding.value, Call) and getattr(binding.value.op, "name", None) == "cast"}
    for cast in casts.values():
        assert cast.args[0] not in casts
