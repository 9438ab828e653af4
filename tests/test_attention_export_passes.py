"""HoistScalarFactors and UnflattenBatchTranspose on IR text (before / after): the passes
that give attention as torch's exporter writes scaled_dot_product_attention the form the
attention patterns read."""
import numpy as np
import pytest

import byoc
from byoc.ir import assert_structural_equal, parse
from byoc.transform import dead_code_elimination
from byoc.transform.hoist_scalar_factors import hoist_scalar_factors
from byoc.transform.unflatten_batch_transpose import unflatten_batch_transpose

Q = "Tensor[(2, 3, 5, 4), float32]"
KT = "Tensor[(2, 3, 4, 5), float32]"
S = "Tensor[(2, 3, 5, 5), float32]"


def test_both_operands_factors_multiply_the_product_once():
    before = parse(f"""
def @main(%q: {Q}, %k: {KT}) -> {S} {{
  %qs = multiply(%q, const(0.5, float32))
  %ks = multiply(const(0.25, float32), %k)
  %s = matmul(%qs, %ks)
  return %s
}}""")
    expected = parse(f"""
def @main(%q: {Q}, %k: {KT}) -> {S} {{
  %s_unscaled = matmul(%q, %k)
  %s = multiply(%s_unscaled, const(0.125, float32))
  return %s
}}""")
    assert_structural_equal(dead_code_elimination(hoist_scalar_factors(before)), expected)


def test_a_factor_behind_layout_ops_is_hoisted_through_them():
    before = parse(f"""
def @main(%q: {Q}, %k: Tensor[(6, 5, 4), float32]) -> {S} {{
  %kt = transpose(%k, axes=[0, 2, 1])
  %ks = multiply(%kt, const(0.5, float32))
  %k4 = reshape(%ks, shape=[2, 3, 4, 5])
  %s = matmul(%q, %k4)
  return %s
}}""")
    expected = parse(f"""
def @main(%q: {Q}, %k: Tensor[(6, 5, 4), float32]) -> {S} {{
  %kt = transpose(%k, axes=[0, 2, 1])
  %k4 = reshape(%kt, shape=[2, 3, 4, 5])
  %s_unscaled = matmul(%q, %k4)
  %s = multiply(%s_unscaled, const(0.5, float32))
  return %s
}}""")
    assert_structural_equal(dead_code_elimination(hoist_scalar_factors(before)), expected)


def test_factors_read_elsewhere_non_scalar_or_of_a_weight_gemm_stay():
    shared = parse(f"""
def @main(%q: {Q}, %k: {KT}) -> Tuple[{S}, {Q}] {{
  %qs = multiply(%q, const(0.5, float32))
  %s = matmul(%qs, %k)
  return (%s, %qs)
}}""")
    assert_structural_equal(hoist_scalar_factors(shared), shared)
    vector = parse(f"""
def @main(%q: {Q}, %k: {KT}) -> {S} {{
  %qs = multiply(%q, meta[0])
  %s = matmul(%qs, %k)
  return %s
}}""".replace("meta[0]", "const([1.0, 2.0, 3.0, 4.0], float32)"))
    assert_structural_equal(hoist_scalar_factors(vector), vector)
    weight = parse("""
def @main(%x: Tensor[(2, 4), float32]) -> Tensor[(2, 3), float32] {
  %xs = multiply(%x, const(0.5, float32))
  %y = matmul(%xs, const([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], float32))
  return %y
}""")
    assert_structural_equal(hoist_scalar_factors(weight), weight)


def test_a_transpose_of_flattened_batches_is_the_transpose_of_the_last_two_axes():
    before = parse(f"""
def @main(%k: {Q}) -> {KT} {{
  %k3 = reshape(%k, shape=[-1, 5, 4])
  %kt3 = transpose(%k3, axes=[0, 2, 1])
  %kt = reshape(%kt3, shape=[2, 3, 4, 5])
  return %kt
}}""")
    expected = parse(f"""
def @main(%k: {Q}) -> {KT} {{
  %kt = transpose(%k, axes=[0, 1, 3, 2])
  return %kt
}}""")
    assert_structural_equal(dead_code_elimination(unflatten_batch_transpose(before)), expected)


def test_leading_axes_grouped_otherwise_are_reshaped_first():
    """Grouped-query attention's repeated heads [B, Hkv, G, S, D] flattened to [B*H, S, D]
    and split as [B, H, D, S] after the transpose: reshape to [B, H, S, D], then transpose
    the last two axes (the repeat_kv form the attention pattern reads)."""
    before = parse("""
def @main(%k: Tensor[(1, 2, 3, 5, 4), float32]) -> Tensor[(1, 6, 4, 5), float32] {
  %k3 = reshape(%k, shape=[6, 5, 4])
  %kt3 = transpose(%k3, axes=[0, 2, 1])
  %kt = reshape(%kt3, shape=[1, 6, 4, 5])
  return %kt
}""")
    expected = parse("""
def @main(%k: Tensor[(1, 2, 3, 5, 4), float32]) -> Tensor[(1, 6, 4, 5), float32] {
  %kt_unflattened = reshape(%k, shape=[1, 6, 5, 4])
  %kt = transpose(%kt_unflattened, axes=[0, 1, 3, 2])
  return %kt
}""")
    after = dead_code_elimination(unflatten_batch_transpose(before))
    assert_structural_equal(after, expected)
    k = np.random.default_rng(0).standard_normal((1, 2, 3, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(byoc.interpret(after, k=k), byoc.interpret(before, k=k))


def test_rotary_halves_flattened_for_the_transpose_are_reshaped_first():
    """K after rotary embeddings as RotateHalfAsView leaves it, [B, H, S, 2, D/2], flattened
    to [B*H, S, D] for the 3-D transpose (torch's exporter's scaled_dot_product_attention of
    Falcon and ModernBERT): reshape to [B, H, S, D], then transpose the last two axes."""
    before = parse("""
def @main(%k: Tensor[(2, 1, 5, 2, 2), float32]) -> Tensor[(2, 1, 4, 5), float32] {
  %k3 = reshape(%k, shape=[-1, 5, 4])
  %kt3 = transpose(%k3, axes=[0, 2, 1])
  %kt = reshape(%kt3, shape=[2, 1, 4, 5])
  return %kt
}""")
    expected = parse("""
def @main(%k: Tensor[(2, 1, 5, 2, 2), float32]) -> Tensor[(2, 1, 4, 5), float32] {
  %kt_unflattened = reshape(%k, shape=[2, 1, 5, 4])
  %kt = transpose(%kt_unflattened, axes=[0, 1, 3, 2])
  return %kt
}""")
    after = dead_code_elimination(unflatten_batch_transpose(before))
    assert_structural_equal(after, expected)
    k = np.random.default_rng(1).standard_normal((2, 1, 5, 2, 2)).astype(np.float32)
    np.testing.assert_array_equal(byoc.interpret(after, k=k), byoc.interpret(before, k=k))


def test_reshapes_that_move_more_than_the_leading_axes_stay():
    moved = parse("""
def @main(%k: Tensor[(2, 3, 5, 4), float32]) -> Tensor[(3, 2, 5, 4), float32] {
  %k3 = reshape(%k, shape=[-1, 5, 4])
  %kt3 = transpose(%k3, axes=[0, 2, 1])
  %kt = reshape(%kt3, shape=[3, 2, 5, 4])
  return %kt
}""")
    assert_structural_equal(unflatten_batch_transpose(moved), moved)
    read_elsewhere = parse(f"""
def @main(%k: {Q}) -> Tuple[{KT}, Tensor[(6, 4, 5), float32]] {{
  %k3 = reshape(%k, shape=[-1, 5, 4])
  %kt3 = transpose(%k3, axes=[0, 2, 1])
  %kt = reshape(%kt3, shape=[2, 3, 4, 5])
  return (%kt, %kt3)
}}""")
    assert_structural_equal(unflatten_batch_transpose(read_elsewhere), read_elsewhere)


def test_the_rewritten_attention_computes_what_the_exported_one_does():
    """The passes on the exporter's whole chain, run on the cpu against the interpreter."""
    text = f"""
def @main(%q: {Q}, %k: {Q}, %v: {Q}) -> {Q} {{
  %qs = multiply(%q, const(0.7071, float32))
  %k3 = reshape(%k, shape=[-1, 5, 4])
  %kt3 = transpose(%k3, axes=[0, 2, 1])
  %ks = multiply(%kt3, const(0.7071, float32))
  %kt = reshape(%ks, shape=[2, 3, 4, 5])
  %s = matmul(%qs, %kt)
  %p = softmax(%s, axis=-1)
  %nan = not_equal(%p, %p)
  %g = where(%nan, const(0.0, float32), %p)
  %o = matmul(%g, %v)
  return %o
}}"""
    mod = parse(text)
    rewritten = dead_code_elimination(unflatten_batch_transpose(dead_code_elimination(hoist_scalar_factors(mod))))
    script = rewritten.script()
    assert "reshape" not in script and script.count("multiply(") == 1 and "axes=[0, 1, 3, 2]" in script
    rng = np.random.default_rng(0)
    inputs = {name: rng.standard_normal((2, 3, 5, 4)).astype(np.float32) for name in ("q", "k", "v")}
    np.testing.assert_allclose(byoc.interpret(rewritten, **inputs), byoc.interpret(mod, **inputs), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("pieces", ["split", "gather"])
def test_stacked_heads_become_head_splits_of_projection_slices(pieces):
    """timm's qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0) as the exporters
    write it (a split into squeezes, or a gather of each index): each piece is a slice of
    the projection's last axis split into heads, the form the attention pattern reads in
    place; the computed values are unchanged."""
    from byoc.transform.unbind_stacked_heads import unbind_stacked_heads
    taken = {
        "split": """%s = split(%t, sizes=[1, 1, 1])
  %s0 = %s.0
  %s1 = %s.1
  %s2 = %s.2
  %q = squeeze(%s0, axes=[0])
  %k = squeeze(%s1, axes=[0])
  %v = squeeze(%s2, axes=[0])""",
        "gather": """%q = gather(%t, const(0, int64))
  %k = gather(%t, const(1, int64))
  %v = gather(%t, const(-1, int64))"""}[pieces]
    before = parse(f"""
def @main(%x: Tensor[(2, 5, 24), float32]) -> Tuple[Tensor[(2, 2, 5, 4), float32], Tensor[(2, 2, 5, 4), float32], Tensor[(2, 2, 5, 4), float32]] {{
  %r = reshape(%x, shape=[2, 5, 3, 2, 4])
  %t = transpose(%r, axes=[2, 0, 3, 1, 4])
  {taken}
  return (%q, %k, %v)
}}""")
    after = dead_code_elimination(unbind_stacked_heads(before))
    expected = parse("""
def @main(%x: Tensor[(2, 5, 24), float32]) -> Tuple[Tensor[(2, 2, 5, 4), float32], Tensor[(2, 2, 5, 4), float32], Tensor[(2, 2, 5, 4), float32]] {
  %q_slice = strided_slice(%x, begin=[0], end=[8], axes=[2], strides=[1])
  %q_heads = reshape(%q_slice, shape=[2, 5, 2, 4])
  %q = transpose(%q_heads, axes=[0, 2, 1, 3])
  %k_slice = strided_slice(%x, begin=[8], end=[16], axes=[2], strides=[1])
  %k_heads = reshape(%k_slice, shape=[2, 5, 2, 4])
  %k = transpose(%k_heads, axes=[0, 2, 1, 3])
  %v_slice = strided_slice(%x, begin=[16], end=[24], axes=[2], strides=[1])
  %v_heads = reshape(%v_slice, shape=[2, 5, 2, 4])
  %v = transpose(%v_heads, axes=[0, 2, 1, 3])
  return (%q, %k, %v)
}""")
    assert_structural_equal(after, expected)
    x = np.random.default_rng(0).standard_normal((2, 5, 24)).astype(np.float32)
    for got, want in zip(byoc.interpret(after, x=x), byoc.interpret(before, x=x)):
        np.testing.assert_array_equal(got, want)


def test_stacked_heads_read_whole_or_regrouped_stay():
    from byoc.transform.unbind_stacked_heads import unbind_stacked_heads
    whole = parse("""
def @main(%x: Tensor[(2, 5, 24), float32]) -> Tuple[Tensor[(2, 2, 5, 4), float32], Tensor[(3, 2, 2, 5, 4), float32]] {
  %r = reshape(%x, shape=[2, 5, 3, 2, 4])
  %t = transpose(%r, axes=[2, 0, 3, 1, 4])
  %q = gather(%t, const(0, int64))
  return (%q, %t)
}""")
    assert_structural_equal(unbind_stacked_heads(whole), whole)
    regrouped = parse("""
def @main(%x: Tensor[(2, 5, 24), float32]) -> Tensor[(5, 2, 2, 4), float32] {
  %r = reshape(%x, shape=[10, 3, 2, 4])
  %t = transpose(%r, axes=[1, 0, 2, 3])
  %q = gather(%t, const(0, int64))
  %o = reshape(%q, shape=[5, 2, 2, 4])
  return %o
}""")
    assert_structural_equal(unbind_stacked_heads(regrouped), regrouped)


ROTARY = """
def @main(%x: Tensor[(1, 2, 3, 8), float32]) -> Tensor[(1, 2, 3, 8), float32] {
  %a = strided_slice(%x, begin=[0], end=[4], axes=[3], strides=[1])
  %b = strided_slice(%x, begin=[4], end=[9223372036854775807], axes=[3], strides=[1])
  %n = negative(%b)
  %c = concat(%n, %a, axis=-1)
  %s = multiply(%c, SIN)
  %k = multiply(%x, const([[[[0.5, 0.25, 0.125, 1.0, 2.0, 4.0, 8.0, 0.75]]]], float32))
  %y = add(%k, %s)
  return %y
}"""


def test_rotary_embedding_runs_in_the_halves_space_with_the_sign_in_the_sine():
    """transformers' rotary embedding, x * cos + cat(-x2, x1) * sin: x as [..., 2, D/2] and
    its reversed view (the halves swapped) times cos and the signed sin, added, reshaped
    back: one elementwise kernel reading x twice in place; bit-identical results."""
    from byoc.transform.rotate_half_as_view import rotate_half_as_view
    sin = "const([[[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]]]], float32)"
    before = parse(ROTARY.replace("SIN", sin))
    after = dead_code_elimination(rotate_half_as_view(before))
    expected = parse("""
def @main(%x: Tensor[(1, 2, 3, 8), float32]) -> Tensor[(1, 2, 3, 8), float32] {
  %y_halves = reshape(%x, shape=[1, 2, 3, 2, 4])
  %y_swapped_halves = strided_slice(%y_halves, begin=[-1], end=[-9223372036854775807], axes=[3], strides=[-1])
  %y_cos_term = multiply(%y_halves, const([[[[[0.5, 0.25, 0.125, 1.0], [2.0, 4.0, 8.0, 0.75]]]]], float32))
  %y_sin_term = multiply(%y_swapped_halves, const([[[[[-1.0, -2.0, -3.0, -4.0], [5.0, 6.0, 7.0, 8.0]]]]], float32))
  %y_halves_sum = add(%y_cos_term, %y_sin_term)
  %y = reshape(%y_halves_sum, shape=[1, 2, 3, 8])
  return %y
}""")
    assert_structural_equal(after, expected)
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 8)).astype(np.float32)
    np.testing.assert_array_equal(byoc.interpret(after, x=x), byoc.interpret(before, x=x))
    # a computed sine: reshaped and signed by ops of their own
    computed = parse(ROTARY.replace("%x: Tensor[(1, 2, 3, 8), float32]",
                                    "%x: Tensor[(1, 2, 3, 8), float32], %w: Tensor[(1, 1, 3, 8), float32]")
                     .replace("SIN", "%w"))
    rewritten = dead_code_elimination(rotate_half_as_view(computed))
    assert "concat" not in rewritten.script() and "negative" not in rewritten.script()
    w = np.random.default_rng(1).standard_normal((1, 1, 3, 8)).astype(np.float32)
    np.testing.assert_array_equal(byoc.interpret(rewritten, x=x, w=w), byoc.interpret(computed, x=x, w=w))


def test_rotate_half_alone_is_a_reversed_view_with_the_sign_in_its_factor():
    """A rotation not added to x * cos: the reversed view reshaped back, its sign in the
    constant that multiplies it."""
    from byoc.transform.rotate_half_as_view import rotate_half_as_view
    text = ROTARY.replace("SIN", "const([[[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]]]], float32)") \
        .replace("%y = add(%k, %s)", "%y = subtract(%k, %s)")
    before = parse(text)
    after = dead_code_elimination(rotate_half_as_view(before))
    script = after.script()
    assert "concat" not in script and "negative" not in script and "strides=[-1]" in script
    assert "const([[[[-1.0, -2.0, -3.0, -4.0, 5.0, 6.0, 7.0, 8.0]]]], float32)" in script
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 8)).astype(np.float32)
    np.testing.assert_array_equal(byoc.interpret(after, x=x), byoc.interpret(before, x=x))


def test_other_concats_of_halves_stay():
    from byoc.transform.rotate_half_as_view import rotate_half_as_view
    sin = "const([[[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]]]], float32)"
    text = ROTARY.replace("SIN", sin)
    for changed in (text.replace("%c = concat(%n, %a, axis=-1)", "%c = concat(%a, %n, axis=-1)"),  # not rotate_half
                    text.replace("end=[4], axes=[3]", "end=[3], axes=[3]").replace("begin=[4]", "begin=[3]"),  # uneven
                    text.replace("%y = add(%k, %s)", "%n2 = concat(%n, %n, axis=-1)\n  %y2 = add(%k, %s)\n"
                                 "  %y = add(%y2, %n2)")):  # the negation read elsewhere
        kept = parse(changed)
        assert_structural_equal(rotate_half_as_view(kept), kept)
