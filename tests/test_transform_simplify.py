"""fold_constant and dead_code_elimination, as IR text before and after."""
from __future__ import annotations

import json

import numpy as np
import pytest

from byoc.interpreter import interpret
from byoc.ir import Constant, assert_structural_equal, parse
from byoc.transform import dead_code_elimination, fold_constant


def check(before: str, after: str, transform):
    """Run `transform` on the parsed `before`; the result must equal the parsed `after`,
    and the input module must be left as it was."""
    mod = parse(before)
    text_before = mod.script()
    result = transform(mod)
    assert_structural_equal(result, parse(after))
    assert mod.script() == text_before, "the pass changed its input module"
    return result


# ================================================================= fold_constant


def test_fold_shape_chain_into_gather_indices():
    before = """
def @main(%x: Tensor[(4, 3), float32]) -> Tensor[(2, 3), float32] {
  %dims = concat(const([3], int64), const([1], int64), axis=0)
  %indices = subtract(%dims, const(1, int64))
  %y = gather(%x, %indices)
  return %y
}
"""
    after = """
def @main(%x: Tensor[(4, 3), float32]) -> Tensor[(2, 3), float32] {
  %y = gather(%x, const([2, 0], int64))
  return %y
}
"""
    check(before, after, fold_constant)


def test_fold_weight_preprocessing_into_its_consumers():
    before = """
def @main(%x: Tensor[(3, 2), float32]) -> Tensor[(3, 2), float32] {
  %w = transpose(const([[1.0, 2.0], [3.0, 4.0]], float32), axes=[1, 0])
  %m = matmul(%x, %w)
  %b = reshape(const([0.5, -0.5], float32), shape=[1, 2])
  %scaled = multiply(%b, const(2.0, float32))
  %y = add(%m, %scaled)
  return %y
}
"""
    after = """
def @main(%x: Tensor[(3, 2), float32]) -> Tensor[(3, 2), float32] {
  %m = matmul(%x, const([[1.0, 3.0], [2.0, 4.0]], float32))
  %y = add(%m, const([[1.0, -1.0]], float32))
  return %y
}
"""
    check(before, after, fold_constant)


def test_fold_through_tuples():
    before = """
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %parts = split(const([1.0, 2.0, 3.0], float32), axis=0, sizes=[1, 2])
  %first = %parts.0
  %second = %parts.1
  %pair = (%first, %second)
  %again = %pair.1
  %y = add(%x, %again)
  %z = add(%y, %first)
  return %z
}
"""
    # The split becomes a tuple of constants, the get-items forward their fields; the
    # tuple bindings stay for dead_code_elimination.
    after = """
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %parts = (const([1.0], float32), const([2.0, 3.0], float32))
  %pair = (const([1.0], float32), const([2.0, 3.0], float32))
  %y = add(%x, const([2.0, 3.0], float32))
  %z = add(%y, const([1.0], float32))
  return %z
}
"""
    check(before, after, fold_constant)
    cleaned = """
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %y = add(%x, const([2.0, 3.0], float32))
  %z = add(%y, const([1.0], float32))
  return %z
}
"""
    check(before, cleaned, lambda mod: dead_code_elimination(fold_constant(mod)))


def test_tuple_of_variables_forwards_its_fields():
    before = """
def @main(%x: Tensor[(2,), float32], %y: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %pair = (%x, %y)
  %second = %pair.1
  %z = relu(%second)
  return %z
}
"""
    after = """
def @main(%x: Tensor[(2,), float32], %y: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %pair = (%x, %y)
  %z = relu(%y)
  return %z
}
"""
    check(before, after, fold_constant)


def test_calls_to_functions_are_not_folded_but_their_constant_arguments_are():
    before = """
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %a = add(const([1.0, 2.0], float32), const([3.0, 4.0], float32))
  %b = @double(%a)
  %c: Tensor[(2,), float32] = extern("byoc_shim_relu")(%a)
  %f = fn (%p: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
    %k = multiply(const(2.0, float32), const(3.0, float32))
    %r = multiply(%p, %k)
    return %r
  }
  %d = %f(%a)
  %e = multiply(%x, %a)
  %s = add(%b, %c)
  %t = add(%s, %d)
  %u = add(%t, %e)
  return %u
}

def @double(%p: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %q = add(%p, %p)
  return %q
}
"""
    # The calls to @double, the extern symbol and the local function keep their constant
    # arguments; the local function's own body is folded.
    after = """
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %b = @double(const([4.0, 6.0], float32))
  %c: Tensor[(2,), float32] = extern("byoc_shim_relu")(const([4.0, 6.0], float32))
  %f = fn (%p: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
    %r = multiply(%p, const(6.0, float32))
    return %r
  }
  %d = %f(const([4.0, 6.0], float32))
  %e = multiply(%x, const([4.0, 6.0], float32))
  %s = add(%b, %c)
  %t = add(%s, %d)
  %u = add(%t, %e)
  return %u
}

def @double(%p: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %q = add(%p, %p)
  return %q
}
"""
    check(before, after, fold_constant)


def test_size_limit_keeps_large_results_unfolded():
    before = """
def @main(%x: Tensor[(64, 64), float32]) -> Tensor[(64, 64), float32] {
  %one = add(const(0.5, float32), const(0.5, float32))
  %ones = broadcast_to(%one, shape=[64, 64])
  %y = add(%x, %ones)
  return %y
}
"""
    # 64 * 64 float32 = 16384 bytes: over a 1024-byte limit; the 4-byte scalar still folds.
    after = """
def @main(%x: Tensor[(64, 64), float32]) -> Tensor[(64, 64), float32] {
  %ones = broadcast_to(const(1.0, float32), shape=[64, 64])
  %y = add(%x, %ones)
  return %y
}
"""
    check(before, after, lambda mod: fold_constant(mod, size_limit_bytes=1024))
    # Exactly at the limit folds; without a limit everything folds.
    for limit in (16384, None):
        folded = fold_constant(parse(before), size_limit_bytes=limit)["main"]
        assert len(folded.bindings) == 1
        weight = folded.bindings[0].value.args[1]
        assert isinstance(weight, Constant) and weight.type.shape == (64, 64)
        np.testing.assert_array_equal(weight.data, np.ones((64, 64), np.float32))
    with pytest.raises(ValueError, match="size_limit_bytes"):
        fold_constant(parse(before), size_limit_bytes=-1)


def test_no_op_calls_are_removed():
    before = """
def @main(%x: Tensor[(2, 3), float32], %v: Tensor[(3,), float32]) -> Tuple[Tensor[(2, 3), float32], Tensor[(3, 2), float32], Tensor[(3,), float32]] {
  %a = identity(%x)
  %b = reshape(%a, shape=[2, -1])
  %c = cast(%b, dtype="float32")
  %d = transpose(%c, axes=[0, 1])
  %e = broadcast_to(%d, shape=[2, 3])
  %f = relu(%e)
  %g = transpose(%f)
  %h = reshape(%f, shape=[3, 2])
  %i = transpose(%v)
  %j = cast(%i, dtype="float16")
  %k = cast(%j, dtype="float32")
  return (%f, %g, %k)
}
"""
    # transpose with axes=() reverses the dims: a no-op only up to rank 1. Casts that
    # change the dtype stay, even as a pair (float16 rounds).
    after = """
def @main(%x: Tensor[(2, 3), float32], %v: Tensor[(3,), float32]) -> Tuple[Tensor[(2, 3), float32], Tensor[(3, 2), float32], Tensor[(3,), float32]] {
  %f = relu(%x)
  %g = transpose(%f)
  %h = reshape(%f, shape=[3, 2])
  %j = cast(%v, dtype="float16")
  %k = cast(%j, dtype="float32")
  return (%f, %g, %k)
}
"""
    check(before, after, fold_constant)


def test_no_op_layout_calls_are_removed():
    """Swin's window attention pads by zero and slices whole windows back; a slice of
    everything backwards and a pad that crops as much as it adds keep the shape and stay."""
    before = """
def @main(%x: Tensor[(2, 4), float32]) -> Tuple[Tensor[(2, 4), float32], Tensor[(2, 4), float32], Tensor[(2, 4), float32]] {
  %a = pad(%x, pads=[0, 0, 0, 0])
  %b = strided_slice(%a, begin=[0], end=[9223372036854775807], axes=[1])
  %c = strided_slice(%b, begin=[0, 0], end=[2, 4], axes=[0, 1], strides=[1, 1])
  %d = squeeze(%c, axes=[])
  %e = concat(%d, axis=0)
  %f = relu(%e)
  %g = strided_slice(%f, begin=[-1], end=[-9223372036854775807], axes=[1], strides=[-1])
  %h = pad(%f, pads=[0, 1, 0, -1])
  return (%f, %g, %h)
}
"""
    after = """
def @main(%x: Tensor[(2, 4), float32]) -> Tuple[Tensor[(2, 4), float32], Tensor[(2, 4), float32], Tensor[(2, 4), float32]] {
  %f = relu(%x)
  %g = strided_slice(%f, begin=[-1], end=[-9223372036854775807], axes=[1], strides=[-1])
  %h = pad(%f, pads=[0, 1, 0, -1])
  return (%f, %g, %h)
}
"""
    result = check(before, after, fold_constant)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for got, want in zip(interpret(result, x), interpret(parse(before), x)):
        np.testing.assert_array_equal(got, want)


def test_result_can_become_a_constant():
    before = """
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), int64] {
  %a = add(const([1, 2], int64), const([10, 20], int64))
  return %a
}
"""
    after = """
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), int64] {
  return const([11, 22], int64)
}
"""
    check(before, after, fold_constant)


def test_folding_keeps_results():
    mod = parse("""
def @main(%x: Tensor[(2, 4), float32]) -> Tensor[(2, 4), float32] {
  %w = reshape(const([1.0, -2.0, 3.0, 0.5], float32), shape=[1, 4])
  %e = exp(%w)
  %y = multiply(%x, %e)
  %z = softmax(%y)
  return %z
}
""")
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    folded = fold_constant(mod)
    assert len(folded["main"].bindings) == 2
    np.testing.assert_array_equal(interpret(folded, x), interpret(mod, x))


def test_extern_declarations_pass_through():
    before = """
def @main(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %y = @decl(%x)
  return %y
}

def @decl(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];
"""
    check(before, before, fold_constant)


# ================================================================= dead_code_elimination


def test_unused_bindings_are_removed_in_cascade():
    before = """
def @main(%x: Tensor[(4,), float32], %unused: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = relu(%x)
  %b = exp(%a)
  %parts = split(%b, axis=0, sizes=[2, 2])
  %p0 = %parts.0
  %c = tanh(%x)
  %t = (%c, %a)
  %d = %t.0
  %g = fn (%p: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
    %dead = exp(%p)
    %r = relu(%p)
    return %r
  }
  %h = fn (%p: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
    return %p
  }
  %e = %g(%d)
  return %e
}
"""
    # Unused parameters stay (they are the signature); the dead binding inside the kept
    # local function goes, and so does the unused local function.
    after = """
def @main(%x: Tensor[(4,), float32], %unused: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = relu(%x)
  %c = tanh(%x)
  %t = (%c, %a)
  %d = %t.0
  %g = fn (%p: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
    %r = relu(%p)
    return %r
  }
  %e = %g(%d)
  return %e
}
"""
    check(before, after, dead_code_elimination)


GLOBALS = """
def @main(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = @f(%x)
  %dead = @only_from_dead_code(%x)
  return %a
}

def @f(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = @g(%x)
  %b = @shim(%a)
  return %b
}

def @g(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = relu(%x)
  return %a
}

def @only_from_dead_code(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = relu(%x)
  return %a
}

def @other_entry(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = @g(%x)
  %b = @helper(%a)
  return %b
}

def @helper(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = @unused_shim(%x)
  return %a
}

def @shim(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];

def @unused_shim(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];

def @never_called(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];
"""

MAIN_F_G_SHIM = """
def @main(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = @f(%x)
  return %a
}

def @f(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = @g(%x)
  %b = @shim(%a)
  return %b
}

def @g(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = relu(%x)
  return %a
}

def @shim(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];
"""


def test_unreachable_globals_are_removed():
    # @only_from_dead_code is called only by a dead binding of main: unreachable once it
    # goes. Extern declarations stay only while something reachable calls them.
    result = check(GLOBALS, MAIN_F_G_SHIM, dead_code_elimination)
    assert list(result.functions) == ["main", "f", "g", "shim"]  # original order kept


def test_several_entry_functions():
    after = MAIN_F_G_SHIM + """
def @other_entry(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = @g(%x)
  %b = @helper(%a)
  return %b
}

def @helper(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %a = @unused_shim(%x)
  return %a
}

def @unused_shim(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];
"""
    check(GLOBALS, after, lambda mod: dead_code_elimination(mod, entry_functions=("main", "other_entry")))


def test_missing_entry_function_is_an_error():
    with pytest.raises(ValueError, match="@start"):
        dead_code_elimination(parse(MAIN_F_G_SHIM), entry_functions=("start",))


def test_fold_then_eliminate_a_whole_constant_subgraph():
    before = """
def @main(%x: Tensor[(2, 2), float32]) -> Tensor[(2, 2), float32] {
  %shape = concat(const([2], int64), const([2], int64), axis=0)
  %size = prod(%shape)
  %scale = cast(%size, dtype="float32")
  %inverse = divide(const(1.0, float32), %scale)
  %y = multiply(%x, %inverse)
  return %y
}
"""
    after = """
def @main(%x: Tensor[(2, 2), float32]) -> Tensor[(2, 2), float32] {
  %y = multiply(%x, const(0.25, float32))
  return %y
}
"""
    check(before, after, lambda mod: dead_code_elimination(fold_constant(mod)))


def test_bindings_that_name_an_atom_are_forwarded():
    before = """
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %c = const([1.0, 2.0], float32)
  %alias = %x
  %y = add(%c, %c)
  %z = add(%alias, %y)
  return %z
}
"""
    after = """
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %z = add(%x, const([2.0, 4.0], float32))
  return %z
}
"""
    check(before, after, fold_constant)


def test_recognize_gelu_erf_form():
    from byoc.transform import recognize_gelu
    before = parse("""
def @main(%x: Tensor[(2, 8), float32]) -> Tensor[(2, 8), float32] {
  %d = divide(%x, const(1.4142135, float32))
  %e = erf(%d)
  %a = add(%e, const(1.0, float32))
  %m = multiply(%x, %a)
  %y = multiply(%m, const(0.5, float32))
  return %y
}""")
    after = parse("""
def @main(%x: Tensor[(2, 8), float32]) -> Tensor[(2, 8), float32] {
  %y = gelu(%x)
  return %y
}""")
    assert_structural_equal(recognize_gelu(before), after)
    # an intermediate used elsewhere keeps the chain as it is
    shared = parse(before.script().replace("return %y", "%z = add(%y, %e)\n  return %z")
                   .replace("-> Tensor[(2, 8), float32] {", "-> Tensor[(2, 8), float32] {", 1))
    assert_structural_equal(recognize_gelu(shared), shared)
    # x * 0.5 * (1 + erf(w / sqrt(2))) with w another tensor is not GELU (it became gelu(w))
    two = parse(before.script().replace("%x: Tensor[(2, 8), float32]", "%x: Tensor[(2, 8), float32], %w: Tensor[(2, 8), float32]")
                .replace("divide(%x,", "divide(%w,"))
    assert_structural_equal(recognize_gelu(two), two)


@pytest.mark.parametrize("square, inverse", [
    # transformers' LLaMA through the TorchScript exporter (rsqrt as 1 / sqrt) and T5's
    ("%sq = power(%x, const(2.0, float32))", "%r = sqrt(%v)\n  %i = divide(const(1.0, float32), %r)\n  %n = multiply(%x, %i)"),
    # through torch's default exporter (rsqrt as reciprocal(sqrt))
    ("%sq = power(%x, const(2.0, float32))", "%r = sqrt(%v)\n  %i = reciprocal(%r)\n  %n = multiply(%i, %x)"),
    ("%sq = multiply(%x, %x)", "%i = rsqrt(%v)\n  %n = multiply(%x, %i)"),
    ("%sq = multiply(%x, %x)", "%r = sqrt(%v)\n  %n = divide(%x, %r)"),
])
def test_recognize_rms_norm(square, inverse):
    from byoc.transform.recognize_rms_norm import recognize_rms_norm
    text = f"""
def @main(%x: Tensor[(2, 3, 4), float32]) -> Tensor[(2, 3, 4), float32] {{
  {square}
  %m = mean(%sq, axes=[-1], keepdims=true)
  %v = add(%m, const(0.0009765625, float32))
  {inverse}
  %y = multiply(const([0.5, 1.0, 1.5, 2.0], float32), %n)
  return %y
}}"""
    before = parse(text)
    after = parse("""
def @main(%x: Tensor[(2, 3, 4), float32]) -> Tensor[(2, 3, 4), float32] {
  %y = rms_norm(%x, const([0.5, 1.0, 1.5, 2.0], float32), epsilon=0.0009765625)
  return %y
}""")
    assert_structural_equal(recognize_rms_norm(before), after)
    x = np.linspace(-4, 4, 24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_allclose(interpret(after, x=x), interpret(before, x=x), rtol=1e-6, atol=1e-6)
    # without gamma: a vector of ones
    bare = parse(text.replace("%y = multiply(const([0.5, 1.0, 1.5, 2.0], float32), %n)\n  return %y", "return %n"))
    (call,) = [b.value for b in recognize_rms_norm(bare)["main"].bindings]
    assert call.op.name == "rms_norm" and call.args[1].data.tolist() == [1.0] * 4
    # a gamma along another axis stays a multiply, of the rms_norm
    other_axis = recognize_rms_norm(parse(text.replace("const([0.5, 1.0, 1.5, 2.0], float32)",
                                                       "const([[0.5], [1.0], [1.5]], float32)")))
    assert [b.value.op.name for b in other_axis["main"].bindings] == ["rms_norm", "multiply"]
    # left alone: the mean over another axis, an intermediate read elsewhere, a non-scalar
    # epsilon, x squared being another tensor
    for changed in (text.replace("axes=[-1]", "axes=[1]"),
                    text.replace("return %y", "%z = add(%y, %v)\n  return %z"),
                    text.replace("const(0.0009765625, float32)", "const([[0.001], [0.001], [0.001]], float32)")):
        kept = parse(changed)
        assert_structural_equal(recognize_rms_norm(kept), kept)
    other = parse(text.replace("%x: Tensor[(2, 3, 4), float32]", "%x: Tensor[(2, 3, 4), float32], %w: Tensor[(2, 3, 4), float32]")
                  .replace("power(%x,", "power(%w,").replace("multiply(%x, %x)", "multiply(%x, %w)"))
    assert_structural_equal(recognize_rms_norm(other), other)


@pytest.mark.parametrize("cube", ["%c = power(%x, const(3.0, float32))",
                                  "%xx = multiply(%x, %x)\n  %c = multiply(%xx, %x)"])
def test_recognize_gelu_tanh_form(cube):
    """GPT-2's gelu_new as the TorchScript exporter writes it."""
    from byoc.transform import recognize_gelu
    text = f"""
def @main(%x: Tensor[(2, 8), float32]) -> Tensor[(2, 8), float32] {{
  %h = multiply(%x, const(0.5, float32))
  {cube}
  %k = multiply(%c, const(0.044715, float32))
  %i = add(%x, %k)
  %s = multiply(%i, const(0.7978846, float32))
  %t = tanh(%s)
  %a = add(%t, const(1.0, float32))
  %y = multiply(%h, %a)
  return %y
}}"""
    before = parse(text)
    after = parse("""
def @main(%x: Tensor[(2, 8), float32]) -> Tensor[(2, 8), float32] {
  %y = gelu(%x, approximate="tanh")
  return %y
}""")
    assert_structural_equal(recognize_gelu(before), after)
    x = np.linspace(-4, 4, 16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_allclose(interpret(after, x=x), interpret(before, x=x), rtol=1e-6, atol=1e-6)
    wrong_constant = parse(text.replace("0.044715", "0.05"))
    assert_structural_equal(recognize_gelu(wrong_constant), wrong_constant)


# ================================================================= lower_split


def test_lower_split_gives_one_slice_per_piece_and_keeps_a_returned_tuple():
    from byoc.transform.lower_split import lower_split
    before = """
def @main(%x: Tensor[(2, 12), float32]) -> Tuple[Tensor[(1, 4), float32], Tuple[Tensor[(2, 4), float32], Tensor[(2, 8), float32]]] {
  %t = split(%x, axis=-1, sizes=[4, 8])
  %a = %t.0
  %y = relu(%a)
  %u = split(%y, axis=0, sizes=[1, 1])
  %b = %u.1
  %r = (%b, %t)
  return %r
}
"""
    after = """
def @main(%x: Tensor[(2, 12), float32]) -> Tuple[Tensor[(1, 4), float32], Tuple[Tensor[(2, 4), float32], Tensor[(2, 8), float32]]] {
  %t_0 = strided_slice(%x, begin=[0], end=[4], axes=[1])
  %t_1 = strided_slice(%x, begin=[4], end=[12], axes=[1])
  %t = (%t_0, %t_1)
  %y = relu(%t_0)
  %u_0 = strided_slice(%y, begin=[0], end=[1], axes=[0])
  %u_1 = strided_slice(%y, begin=[1], end=[2], axes=[0])
  %r = (%u_1, %t)
  return %r
}
"""
    check(before, after, lower_split)


def test_sink_reshapes_moves_activation_and_residual_add_next_to_the_gemm():
    """GPT-2's Conv1D: reshape -> GEMM -> reshape, then gelu or + residual. The elementwise
    ops move before the reshape (the residual is reshaped instead, a view), and the two
    reshapes between the GEMMs cancel."""
    from byoc.transform import sink_reshapes
    before = parse("""
def @main(%x: Tensor[(1, 4, 8), float32], %w: Tensor[(8, 16), float32], %w2: Tensor[(16, 8), float32]) -> Tensor[(1, 4, 8), float32] {
  %a = reshape(%x, shape=[4, 8])
  %m = matmul(%a, %w)
  %r = reshape(%m, shape=[1, 4, 16])
  %g = gelu(%r, approximate="tanh")
  %b = reshape(%g, shape=[4, 16])
  %m2 = matmul(%b, %w2)
  %r2 = reshape(%m2, shape=[1, 4, 8])
  %y = add(%r2, %x)
  return %y
}""")
    after = parse("""
def @main(%x: Tensor[(1, 4, 8), float32], %w: Tensor[(8, 16), float32], %w2: Tensor[(16, 8), float32]) -> Tensor[(1, 4, 8), float32] {
  %a = reshape(%x, shape=[4, 8])
  %m = matmul(%a, %w)
  %g0 = gelu(%m, approximate="tanh")
  %m2 = matmul(%g0, %w2)
  %x0 = reshape(%x, shape=[4, 8])
  %y0 = add(%m2, %x0)
  %y = reshape(%y0, shape=[1, 4, 8])
  return %y
}""")
    assert_structural_equal(dead_code_elimination(fold_constant(sink_reshapes(before))), after)
    rng = np.random.default_rng(0)
    args = {"x": rng.standard_normal((1, 4, 8), np.float32), "w": rng.standard_normal((8, 16), np.float32),
            "w2": rng.standard_normal((16, 8), np.float32)}
    np.testing.assert_allclose(interpret(after, **args), interpret(before, **args), rtol=1e-5, atol=1e-5)


def test_sink_reshapes_leaves_shared_reshapes_and_broadcasts_alone():
    from byoc.transform import sink_reshapes
    shared = parse("""
def @main(%x: Tensor[(4, 8), float32], %v: Tensor[(1, 1, 4, 8), float32]) -> Tuple[Tensor[(1, 4, 8), float32], Tensor[(1, 4, 8), float32]] {
  %r = reshape(%x, shape=[1, 4, 8])
  %g = relu(%r)
  %q = reshape(%x, shape=[1, 4, 8])
  %b = add(%q, %v)
  return (%g, %r)
}""")
    # %r is read twice; %b broadcasts %q to rank 4
    assert_structural_equal(sink_reshapes(shared), shared)


def test_arithmetic_identities_with_constants_are_removed():
    """x + 0, 0 + x, x - 0, x * 1, 1 * x and x / 1 are x when the constant does not
    broadcast x (transformers' ViT adds a mask of zeros built from constants); a constant
    that widens x, a nonzero one and 0 - x stay."""
    before = """
def @main(%x: Tensor[(2, 3), float32]) -> Tuple[Tensor[(2, 3), float32], Tensor[(2, 2, 3), float32], Tensor[(2, 3), float32], Tensor[(2, 3), float32]] {
  %a = add(%x, const([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], float32))
  %b = add(const([0.0, 0.0, 0.0], float32), %a)
  %c = subtract(%b, const(0.0, float32))
  %d = multiply(const(1.0, float32), %c)
  %e = divide(%d, const([1.0, 1.0, 1.0], float32))
  %f = add(%e, const([[[0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]]], float32))
  %g = add(%e, const([0.0, 0.5, 0.0], float32))
  %h = subtract(const(0.0, float32), %e)
  return (%e, %f, %g, %h)
}
"""
    after = """
def @main(%x: Tensor[(2, 3), float32]) -> Tuple[Tensor[(2, 3), float32], Tensor[(2, 2, 3), float32], Tensor[(2, 3), float32], Tensor[(2, 3), float32]] {
  %f = add(%x, const([[[0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]]], float32))
  %g = add(%x, const([0.0, 0.5, 0.0], float32))
  %h = subtract(const(0.0, float32), %x)
  return (%x, %f, %g, %h)
}
"""
    check(before, after, fold_constant)


COMBINE_BEFORE = """
def @main(%x: Tensor[(1, 4, 8), float32]) -> Tuple[Tensor[(1, 4, 8), float32], Tensor[(1, 4, 16), float32], Tensor[(1, 4, 8), float32], Tensor[(1, 4, 8), float32]] {
  %q = matmul(%x, const(%W0, float32))
  %qb = add(%q, const(%B0, float32))
  %k = matmul(%x, const(%W1, float32))
  %kr = relu(%k)
  %v = matmul(%x, const(%W2, float32))
  %vb = add(const(%B2, float32), %v)
  %o = matmul(%qb, const(%W3, float32))
  return (%qb, %kr, %vb, %o)
}
"""


def _literal(array) -> str:
    return json.dumps(np.asarray(array, np.float32).astype(float).tolist())


def test_combine_parallel_matmul_concatenates_weights_and_biases_and_slices_the_result():
    """Q/K/V-style projections of one input become one matmul (+ one bias add: zeros for
    the member without a bias), read back as last-axis slices; the matmul of another input
    and everything after the bias stay."""
    from byoc.transform import combine_parallel_matmul
    rng = np.random.default_rng(0)
    w = [rng.standard_normal(shape).round(2).astype(np.float32) for shape in ((8, 8), (8, 16), (8, 8), (8, 8))]
    b = [rng.standard_normal(8).round(2).astype(np.float32), None, rng.standard_normal(8).round(2).astype(np.float32)]
    text = COMBINE_BEFORE
    for index, array in enumerate(w):
        text = text.replace(f"%W{index}", _literal(array))
    text = text.replace("%B0", _literal(b[0])).replace("%B2", _literal(b[2]))
    before = parse(text)
    weight = np.concatenate(w[:3], axis=1)
    bias = np.concatenate([b[0], np.zeros(16, np.float32), b[2]])
    after = parse(f"""
def @main(%x: Tensor[(1, 4, 8), float32]) -> Tuple[Tensor[(1, 4, 8), float32], Tensor[(1, 4, 16), float32], Tensor[(1, 4, 8), float32], Tensor[(1, 4, 8), float32]] {{
  %c = matmul(%x, const({_literal(weight)}, float32))
  %cb = add(%c, const({_literal(bias)}, float32))
  %qb = strided_slice(%cb, begin=[0], end=[8], axes=[2])
  %k = strided_slice(%cb, begin=[8], end=[24], axes=[2])
  %vb = strided_slice(%cb, begin=[24], end=[32], axes=[2])
  %kr = relu(%k)
  %o = matmul(%qb, const({_literal(w[3])}, float32))
  return (%qb, %kr, %vb, %o)
}}""")
    combined = dead_code_elimination(combine_parallel_matmul(before))
    assert_structural_equal(combined, after)
    x = rng.standard_normal((1, 4, 8)).astype(np.float32)
    for got, want in zip(interpret(combined, x=x), interpret(before, x=x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_combine_parallel_matmul_leaves_unaligned_widths_variable_weights_and_single_matmuls():
    from byoc.transform import combine_parallel_matmul
    unaligned = parse("""
def @main(%x: Tensor[(4, 8), float32]) -> Tuple[Tensor[(4, 6), float32], Tensor[(4, 6), float32]] {
  %a = matmul(%x, const([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], float32))
  %b = matmul(%x, const([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], float32))
  return (%a, %b)
}""")
    assert_structural_equal(combine_parallel_matmul(unaligned), unaligned)
    variable = parse("""
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32], %u: Tensor[(8, 8), float32]) -> Tuple[Tensor[(4, 8), float32], Tensor[(4, 8), float32], Tensor[(4, 8), float32]] {
  %a = matmul(%x, %w)
  %b = matmul(%x, %u)
  %c = matmul(%a, %w)
  return (%a, %b, %c)
}""")
    assert_structural_equal(combine_parallel_matmul(variable), variable)


def test_combine_logit_addends_sums_the_bias_and_the_mask_before_the_scores():
    """T5's scores + position bias + mask: the two addends are summed first, so that the
    attention pattern sees one additive term; a chain read elsewhere stays."""
    from byoc.transform import combine_logit_addends
    before = parse("""
def @main(%s: Tensor[(2, 4, 8, 8), float32], %b: Tensor[(1, 4, 8, 8), float32], %m: Tensor[(2, 1, 1, 8), float32]) -> Tensor[(2, 4, 8, 8), float32] {
  %s1 = add(%b, %s)
  %s2 = add(%s1, %m)
  %p = softmax(%s2, axis=-1)
  return %p
}""")
    after = parse("""
def @main(%s: Tensor[(2, 4, 8, 8), float32], %b: Tensor[(1, 4, 8, 8), float32], %m: Tensor[(2, 1, 1, 8), float32]) -> Tensor[(2, 4, 8, 8), float32] {
  %a = add(%b, %m)
  %s2 = add(%s, %a)
  %p = softmax(%s2, axis=-1)
  return %p
}""")
    combined = dead_code_elimination(combine_logit_addends(before))
    assert_structural_equal(combined, after)
    rng = np.random.default_rng(0)
    args = {"s": rng.standard_normal((2, 4, 8, 8), np.float32), "b": rng.standard_normal((1, 4, 8, 8), np.float32),
            "m": rng.standard_normal((2, 1, 1, 8), np.float32)}
    np.testing.assert_allclose(interpret(combined, **args), interpret(before, **args), rtol=1e-5, atol=1e-6)
    shared = parse(before.script().replace("return %p", "%q = add(%p, %s1)\n  return %q")
                   .replace("-> Tensor[(2, 4, 8, 8), float32] {", "-> Tensor[(2, 4, 8, 8), float32] {", 1))
    assert_structural_equal(combine_logit_addends(shared), shared)


def test_combine_logit_addends_sums_a_bias_and_a_per_window_mask_across_the_window_split():
    """Swin's shifted windows: scores [B*W, H, N, N] + a position bias [1, H, N, N], split to
    [B, W, H, N, N], + a per-window mask [1, W, 1, N, N], merged back: one add of a constant
    at the scores' shape, which the fused attention reads per batch and head. A mask that is
    not a constant, or reshapes that do not split the batch axis, stay."""
    from byoc.transform import combine_logit_addends
    rng = np.random.default_rng(0)
    bias = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    mask = np.where(rng.random((1, 4, 1, 3, 3)) < 0.5, 0.0, -100.0).astype(np.float32)
    program = """
def @main(%s: Tensor[(8, 2, 3, 3), float32]) -> Tensor[(8, 2, 3, 3), float32] {{
  %s1 = add(%s, {bias})
  %r1 = reshape(%s1, shape={split})
  %s2 = add(%r1, {mask})
  %r2 = reshape(%s2, shape=[-1, 2, 3, 3])
  %p = softmax(%r2, axis=-1)
  return %p
}}"""
    before = parse(program.format(bias=f"const({bias.tolist()}, float32)", split=[2, 4, 2, 3, 3],
                                  mask=f"const({mask.tolist()}, float32)"))
    combined = (np.broadcast_to(bias, (8, 2, 3, 3)).reshape(2, 4, 2, 3, 3) + mask).reshape(8, 2, 3, 3)
    after = parse(f"""
def @main(%s: Tensor[(8, 2, 3, 3), float32]) -> Tensor[(8, 2, 3, 3), float32] {{
  %r2 = add(%s, const({combined.tolist()}, float32))
  %p = softmax(%r2, axis=-1)
  return %p
}}""")
    rewritten = dead_code_elimination(combine_logit_addends(before))
    assert_structural_equal(rewritten, after)
    scores = rng.standard_normal((8, 2, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(interpret(rewritten, s=scores), interpret(before, s=scores), rtol=1e-5, atol=1e-6)
    # the heads axis split instead of the batch: not the window split
    other = parse(program.format(bias=f"const({bias.tolist()}, float32)", split=[8, 2, 1, 3, 3],
                                 mask=f"const({np.zeros((1, 1, 1, 3, 3), np.float32).tolist()}, float32)"))
    assert_structural_equal(combine_logit_addends(other), other)


def test_map_bodies_rewrites_functions_with_a_body_and_keeps_extern_declarations():
    mod = parse("""
def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %y = @shim(%x)
  return %y
}

def @shim(%p: Tensor[(2,), float32]) -> Tensor[(2,), float32] [Extern=1];
""")
    seen = []
    mapped = mod.map_bodies(lambda function: seen.append(function) or function)
    assert seen == [mod["main"]] and mapped["shim"] is mod["shim"] and mapped is not mod


def test_sink_reshapes_moves_reshapes_of_a_cast_input_above_the_cast():
    """transformers' padding mask: cast(attention_mask) read through reshapes by the mask
    arithmetic. The reshapes go above the cast (views of the input) and merge, so the cast
    can join the and/where in one kernel; sinking it back would split it off again."""
    from byoc.transform import sink_reshapes
    before = """
def @main(%mask: Tensor[(2, 8), int64], %keep: Tensor[(1, 1, 8, 1), bool]) -> Tensor[(2, 1, 8, 8), float32] {
  %c = cast(%mask, dtype="bool")
  %f = reshape(%c, shape=[16, 1])
  %r = reshape(%f, shape=[2, 1, 1, 8])
  %a = logical_and(%keep, %r)
  %w = where(%a, const(0.0, float32), const(-1e4, float32))
  return %w
}
"""
    after = """
def @main(%mask: Tensor[(2, 8), int64], %keep: Tensor[(1, 1, 8, 1), bool]) -> Tensor[(2, 1, 8, 8), float32] {
  %v = reshape(%mask, shape=[2, 1, 1, 8])
  %r = cast(%v, dtype="bool")
  %a = logical_and(%keep, %r)
  %w = where(%a, const(0.0, float32), const(-1e4, float32))
  return %w
}
"""
    result = check(before, after, lambda mod: dead_code_elimination(sink_reshapes(mod)))
    assert "mask_view" in result.script()
    args = {"mask": np.array([[1] * 5 + [0] * 3, [1] * 8]), "keep": np.ones((1, 1, 8, 1), bool)}
    np.testing.assert_array_equal(interpret(result, **args), interpret(parse(before), **args))
    # a cast of a computed value stays where it is: its producer may take it in
    computed = parse("""
def @main(%x: Tensor[(2, 8), float32]) -> Tensor[(16,), float16] {
  %e = exp(%x)
  %c = cast(%e, dtype="float16")
  %f = reshape(%c, shape=[16])
  return %f
}""")
    assert_structural_equal(sink_reshapes(computed), computed)


# ================================================================= simplify_identity_gather

def test_gather_of_every_index_in_order_is_a_reshape():
    """transformers' padding mask gathers the flattened mask at arange(batch) * seq +
    arange(seq), a constant after folding: a reshape. Any other index constant (repeated,
    permuted, negative, too few) and non-constant indices stay gathers."""
    from byoc.transform import simplify_identity_gather
    before = """
def @main(%m: Tensor[(6, 1), bool], %x: Tensor[(2, 3), float32], %i: Tensor[(3,), int64]) -> Tuple[Tensor[(2, 1, 3, 1), bool], Tensor[(2, 1, 3), float32], Tensor[(2, 3), float32], Tensor[(2, 3), float32], Tensor[(2, 2), float32], Tensor[(2, 3), float32], Tensor[(2, 3), float32]] {
  %a = gather(%m, const([[[0, 1, 2]], [[3, 4, 5]]], int64))
  %b = gather(%x, const([[0, 1, 2]], int32), axis=-1)
  %c = gather(%x, const([0, 2, 1], int64), axis=1)
  %d = gather(%x, const([0, 1, -1], int64), axis=1)
  %e = gather(%x, const([0, 1], int64), axis=1)
  %f = gather(%x, %i, axis=1)
  %g = gather(%x, const([0, 1, 1], int64), axis=1)
  return (%a, %b, %c, %d, %e, %f, %g)
}
"""
    after = """
def @main(%m: Tensor[(6, 1), bool], %x: Tensor[(2, 3), float32], %i: Tensor[(3,), int64]) -> Tuple[Tensor[(2, 1, 3, 1), bool], Tensor[(2, 1, 3), float32], Tensor[(2, 3), float32], Tensor[(2, 3), float32], Tensor[(2, 2), float32], Tensor[(2, 3), float32], Tensor[(2, 3), float32]] {
  %a = reshape(%m, shape=[2, 1, 3, 1])
  %b = reshape(%x, shape=[2, 1, 3])
  %c = gather(%x, const([0, 2, 1], int64), axis=1)
  %d = gather(%x, const([0, 1, -1], int64), axis=1)
  %e = gather(%x, const([0, 1], int64), axis=1)
  %f = gather(%x, %i, axis=1)
  %g = gather(%x, const([0, 1, 1], int64), axis=1)
  return (%a, %b, %c, %d, %e, %f, %g)
}
"""
    result = check(before, after, simplify_identity_gather)
    rng = np.random.default_rng(0)
    args = {"m": rng.random((6, 1)) > 0.5, "x": rng.standard_normal((2, 3), np.float32),
            "i": np.array([2, 0, 1])}
    for got, want in zip(interpret(result, **args), interpret(parse(before), **args), strict=True):
        np.testing.assert_array_equal(got, want)


# ================================================================= shrink_broadcast_constants

def test_a_constant_repeated_along_axes_another_operand_supplies_keeps_one_slice():
    """A folded [batch, sequence, hidden] addend that is the same in every batch row (BERT's
    token-type + position embeddings) keeps one row, and one along each other axis where it
    repeats (NaN repeats NaN); a constant of the call's extent along an axis no other
    operand has, and values that differ, stay whole. Every result equals the input module's."""
    from byoc.transform import shrink_broadcast_constants
    row = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    by_batch = np.repeat(row, 2, axis=0)  # the same along axis 0
    by_both = np.broadcast_to(np.arange(4, dtype=np.float32), (2, 3, 4))  # the same along 0 and 1
    varying = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    by_last = np.repeat(np.arange(6, dtype=np.float32).reshape(2, 3, 1), 4, axis=2)  # the same along 2
    nan_rows = np.full((2, 3, 4), np.nan, np.float32)
    signed_zeros = np.repeat(row, 2, axis=0)
    signed_zeros[1] = -signed_zeros[1]  # 0.0 in the first row, -0.0 in the second: x / c differs

    def literal(array):
        return json.dumps(array.tolist()).replace("NaN", "nan")
    types = ", ".join(["Tensor[(2, 3, 4), float32]"] * 7)
    before = f"""
def @main(%x: Tensor[(2, 3, 4), float32], %v: Tensor[(4,), float32], %c: Tensor[(2, 3, 1), bool]) -> Tuple[{types}] {{
  %a = add(%x, const({literal(by_batch)}, float32))
  %b = multiply(const({literal(by_both)}, float32), %x)
  %d = add(%v, const({literal(by_batch)}, float32))
  %e = subtract(%x, const({literal(varying)}, float32))
  %f = where(%c, %x, const({literal(by_last)}, float32))
  %g = add(%x, const({literal(nan_rows)}, float32))
  %h = divide(%x, const({literal(signed_zeros)}, float32))
  return (%a, %b, %d, %e, %f, %g, %h)
}}
"""
    after = f"""
def @main(%x: Tensor[(2, 3, 4), float32], %v: Tensor[(4,), float32], %c: Tensor[(2, 3, 1), bool]) -> Tuple[{types}] {{
  %a = add(%x, const({literal(row)}, float32))
  %b = multiply(const({literal(by_both[:1, :1])}, float32), %x)
  %d = add(%v, const({literal(by_batch)}, float32))
  %e = subtract(%x, const({literal(varying)}, float32))
  %f = where(%c, %x, const({literal(by_last[:, :, :1])}, float32))
  %g = add(%x, const({literal(nan_rows[:1, :1, :1])}, float32))
  %h = divide(%x, const({literal(signed_zeros)}, float32))
  return (%a, %b, %d, %e, %f, %g, %h)
}}
"""
    # these constants are small: the builder's pass leaves any that save less than 1 MiB
    assert_structural_equal(shrink_broadcast_constants(parse(before)), parse(before))
    result = check(before, after, lambda mod: shrink_broadcast_constants(mod, min_saved_bytes=0))
    rng = np.random.default_rng(0)
    args = {"x": rng.standard_normal((2, 3, 4), np.float32), "v": rng.standard_normal(4, np.float32),
            "c": rng.random((2, 3, 1)) > 0.5}
    for got, want in zip(interpret(result, **args), interpret(parse(before), **args), strict=True):
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))  # infinities keep their signs


def test_the_builder_shrinks_constants_after_recording_what_shape_buckets_compare(tmp_path):
    """The padding analysis compares each bucket's simplified module (analysis/padding.py):
    a constant shrunk at one bucket's size and not at another's would look like the start of
    the other's. The builder records that module first, then shrinks; the library has the
    shrunk constant (4 MiB -> 1 MiB)."""
    from byoc.config import load_config
    from byoc.pipeline import run_pipeline
    from byoc.ir import FunctionBuilder
    slice_ = np.random.default_rng(0).standard_normal((1, 512, 512)).astype(np.float32)
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (4, 512, 512), "float32")
        fb.ret(fb.call("add", x, np.repeat(slice_, 4, axis=0)))
    from byoc.pipeline import BuildContext
    from byoc.target import Target
    recorded = {}
    context = BuildContext(config=load_config({"target": "cpu"}, overrides={"workdir": str(tmp_path)}),
                           target=Target("cpu"), workdir=tmp_path, model=fb.module())
    final = run_pipeline(context, after={"simplify": lambda mod: recorded.update(simplify=mod)})

    def constant_shapes(mod):
        return [arg.data.shape for function in mod.functions.values() for binding in function.bindings or ()
                for arg in getattr(binding.value, "args", ()) if isinstance(arg, Constant)]
    assert constant_shapes(recorded["simplify"]) == [(4, 512, 512)]
    assert constant_shapes(final) == [(1, 512, 512)]


# ================================================================= fold_scale_into_matmul


def test_fold_scale_into_matmul_through_the_permute_back():
    """ConvNeXt's layer scale: gamma (C, 1, 1) times the MLP's output permuted back to
    channels-first goes into the second Linear's weight and bias; the residual add then
    reads the permute directly."""
    from byoc.transform.fold_scale_into_matmul import fold_scale_into_matmul
    before = parse("""
def @main(%x: Tensor[(1, 2, 2, 3), float32], %r: Tensor[(1, 2, 2, 2), float32]) -> Tensor[(1, 2, 2, 2), float32] {
  %y = matmul(%x, const([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], float32))
  %z = add(const([0.5, -0.5], float32), %y)
  %t = transpose(%z, axes=[0, 3, 1, 2])
  %u = multiply(const([[[2.0]], [[0.25]]], float32), %t)
  %o = add(%u, %r)
  return %o
}""")
    after = parse("""
def @main(%x: Tensor[(1, 2, 2, 3), float32], %r: Tensor[(1, 2, 2, 2), float32]) -> Tensor[(1, 2, 2, 2), float32] {
  %y = matmul(%x, const([[2.0, 0.5], [6.0, 1.0], [10.0, 1.5]], float32))
  %z = add(const([1.0, -0.125], float32), %y)
  %u = transpose(%z, axes=[0, 3, 1, 2])
  %o = add(%u, %r)
  return %o
}""")
    result = fold_scale_into_matmul(before)
    assert_structural_equal(result, after)
    rng = np.random.default_rng(0)
    x, r = rng.standard_normal((1, 2, 2, 3)).astype(np.float32), rng.standard_normal((1, 2, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(interpret(result, x=x, r=r), interpret(before, x=x, r=r), rtol=1e-6, atol=1e-6)


def test_fold_scale_into_matmul_leaves_other_scales():
    from byoc.transform.fold_scale_into_matmul import fold_scale_into_matmul
    text = """
def @main(%x: Tensor[(4, 3), float32], %w: Tensor[(3, 2), float32]) -> Tensor[(4, 2), float32] {
  %y = matmul(%x, WEIGHT)
  %u = multiply(%y, SCALE)
  return %u
}"""
    weight = "const([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], float32)"
    # along the rows (not the matmul's N), a computed weight, a scalar (HoistScalarFactors')
    for changed in (text.replace("WEIGHT", weight).replace("SCALE", "const([[1.0], [2.0], [3.0], [4.0]], float32)"),
                    text.replace("WEIGHT", "%w").replace("SCALE", "const([1.0, 2.0], float32)"),
                    text.replace("WEIGHT", weight).replace("SCALE", "const(2.0, float32)")):
        kept = parse(changed)
        assert_structural_equal(fold_scale_into_matmul(kept), kept)
    # the matmul read elsewhere too
    shared = parse(text.replace("WEIGHT", weight).replace("SCALE", "const([1.0, 2.0], float32)")
                   .replace("return %u", "%v = add(%u, %y)\n  return %v"))
    assert_structural_equal(fold_scale_into_matmul(shared), shared)


def test_fold_scale_into_matmul_keeps_float16_weights_off_zero():
    """A layer scale of 1e-6 times weights of 0.02 is below float16's smallest normal
    number: folded, the float16 weight would be zero; with underflow_below the multiply stays."""
    from byoc.transform.fold_scale_into_matmul import fold_scale_into_matmul
    mod = parse("""
def @main(%x: Tensor[(4, 3), float32]) -> Tensor[(4, 2), float32] {
  %y = matmul(%x, const([[0.02, 0.01], [0.03, 0.02], [0.01, 0.04]], float32))
  %u = multiply(%y, const([1e-06, 1.0], float32))
  return %u
}""")
    assert_structural_equal(fold_scale_into_matmul(mod, underflow_below=float(np.finfo(np.float16).tiny)), mod)
    assert "multiply" not in fold_scale_into_matmul(mod).script()  # float32 keeps them: folded


@pytest.mark.parametrize("axes", ["axes=[]", "axes=[2, 1, 0]"])
def test_passes_read_a_transpose_without_axes_as_reversing(axes):
    """transpose with axes=() reverses the dims, as transpose [2, 1, 0] does: the passes that
    read a transpose's permutation give the same result for both."""
    from byoc.transform.fold_scale_into_matmul import fold_scale_into_matmul
    from byoc.transform.unbind_stacked_heads import unbind_stacked_heads
    scaled = parse(f"""
def @main(%x: Tensor[(2, 3, 4), float32]) -> Tensor[(5, 3, 2), float32] {{
  %y = matmul(%x, const([[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0]], float32))
  %t = transpose(%y, {axes})
  %u = multiply(%t, const([[[1.0]], [[2.0]], [[3.0]], [[4.0]], [[5.0]]], float32))
  return %u
}}""")
    folded = fold_scale_into_matmul(scaled)
    assert "multiply" not in folded.script()
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(interpret(folded, x=x), interpret(scaled, x=x), rtol=1e-6)
    stacked = parse(f"""
def @main(%x: Tensor[(4, 6), float32]) -> Tensor[(3, 4), float32] {{
  %r = reshape(%x, shape=[4, 3, 2])
  %t = transpose(%r, {axes})
  %q = gather(%t, const(0, int64))
  return %q
}}""")
    assert_structural_equal(unbind_stacked_heads(stacked), stacked)  # G is not moved to the front


@pytest.mark.parametrize("product", ["multiply(%x, %s)", "multiply(%s, %x)"])
def test_recognize_silu(product):
    """RecognizeSiLU: x * sigmoid(x), either order, is one silu; a sigmoid read elsewhere
    and a gate x * sigmoid(y) stay."""
    from byoc.transform.recognize_silu import recognize_silu
    text = f"""
def @main(%x: Tensor[(2, 3, 4), float16], %g: Tensor[(2, 3, 4), float16]) -> Tensor[(2, 3, 4), float16] {{
  %s = sigmoid(%x)
  %y = {product}
  return %y
}}"""
    before = parse(text)
    after = parse("""
def @main(%x: Tensor[(2, 3, 4), float16], %g: Tensor[(2, 3, 4), float16]) -> Tensor[(2, 3, 4), float16] {
  %y = silu(%x)
  return %y
}""")
    assert_structural_equal(recognize_silu(before), after)
    x = np.linspace(-6, 6, 24, dtype=np.float16).reshape(2, 3, 4)
    np.testing.assert_allclose(interpret(after, x=x, g=x).astype(np.float32),
                               interpret(before, x=x, g=x).astype(np.float32), rtol=2e-3, atol=2e-3)
    for kept in (text.replace("return %y", "%z = add(%y, %s)\n  return %z"),  # the sigmoid is read again
                 text.replace("sigmoid(%x)", "sigmoid(%g)")):  # a gate of another value
        kept = parse(kept)
        assert_structural_equal(recognize_silu(kept), kept)
