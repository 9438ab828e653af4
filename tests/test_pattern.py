"""The dataflow pattern language and its matcher over A-normal-form bindings."""
import pytest

from byoc.ir import Call, Constant, parse
from byoc.pattern import is_const, is_op, match, matches, ops_named, wildcard

GEMM_CHAIN = """
def @main(%x: Tensor[(4, 8), float16], %w: Tensor[(8, 16), float16], %b: Tensor[(16,), float16]) -> Tensor[(4, 16), float16] {
  %m = matmul(%x, %w)
  %a = add(%m, %b)
  %g = gelu(%a)
  %s = softmax(%g, axis=0)
  %c = add(%g, const([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0], float16))
  return %c
}
"""


def _function_and_producers(text=GEMM_CHAIN):
    main = parse(text)["main"]
    producers = {b.var: b.value for b in main.bindings if isinstance(b.value, Call)}
    variables = {b.var.name_hint: b.var for b in main.bindings}
    return main, producers, variables


def test_op_pattern_follows_producers_and_reports_bindings_inputs_output():
    main, producers, v = _function_and_producers()
    x, w, b = main.params
    dense_bias = is_op("add")(is_op("matmul")(wildcard(), wildcard()).named("matmul"), wildcard().named("bias"))
    found = match(dense_bias, v["a"], producers)
    assert found is not None
    assert found.output is v["a"]
    assert found.matched == [v["a"], v["m"]]  # root first, then producers depth first
    assert [call.op.name for _, call in found.bindings] == ["add", "matmul"]
    assert found.inputs == [x, w, b]  # leaves in first-use order
    assert found["matmul"] is v["m"] and found["bias"] is b
    assert found.call_of("matmul").op.name == "matmul"


def test_no_match_on_a_different_op_or_on_a_parameter():
    main, producers, v = _function_and_producers()
    assert match(is_op("add")(wildcard(), wildcard()), v["m"], producers) is None
    # a parameter has no producer: an op pattern cannot match it
    assert match(is_op("matmul")(wildcard(), wildcard()), main.params[0], producers) is None
    # the argument count must agree
    assert match(is_op("add")(wildcard()), v["a"], producers) is None


def test_is_const_matches_constants_only():
    main, producers, v = _function_and_producers()
    bias_const = is_op("add")(wildcard(), is_const().named("bias"))
    found = match(bias_const, v["c"], producers)
    assert found is not None and isinstance(found["bias"], Constant)
    assert found.inputs == [v["g"], found["bias"]]
    assert match(bias_const, v["a"], producers) is None  # %b is a parameter, not a constant


def test_alternatives_take_the_first_that_matches_and_forget_the_other():
    main, producers, v = _function_and_producers()
    dense = is_op("matmul")(wildcard(), wildcard())
    activation = is_op("relu")(wildcard().named("relu_in")) | is_op("gelu")(is_op("add")(dense, wildcard()))
    found = match(activation, v["g"], producers)
    assert found is not None
    assert found.matched == [v["g"], v["a"], v["m"]]
    assert "relu_in" not in found.named  # the failed branch left nothing behind


def test_optional_part_is_taken_when_present():
    main, producers, v = _function_and_producers()
    dense = is_op("matmul")(wildcard(), wildcard())
    with_bias = dense.optional(lambda d: is_op("add")(d, wildcard()))
    with_gelu = with_bias.optional(lambda d: is_op("gelu")(d))
    assert match(with_gelu, v["g"], producers).matched == [v["g"], v["a"], v["m"]]  # all three
    assert match(with_gelu, v["a"], producers).matched == [v["a"], v["m"]]  # without gelu
    assert match(with_gelu, v["m"], producers).matched == [v["m"]]  # matmul alone


def test_dtype_shape_and_rank_predicates():
    main, producers, v = _function_and_producers()
    x, w, b = main.params
    dense = is_op("matmul")(wildcard(), wildcard())
    assert match(dense.has_dtype("float16"), v["m"], producers) is not None
    assert match(dense.has_dtype("float32"), v["m"], producers) is None
    assert match(dense.has_shape((4, 16)), v["m"], producers) is not None
    assert match(dense.has_shape((16, 4)), v["m"], producers) is None
    assert match(dense.has_shape((None, 16)), v["m"], producers) is not None  # None: any size
    assert match(dense.has_shape((None, 16, 1)), v["m"], producers) is None  # rank differs
    vector_bias = is_op("add")(dense, wildcard().has_rank(1))
    assert match(vector_bias, v["a"], producers).inputs == [x, w, b]
    assert match(is_op("add")(dense, wildcard().has_rank(2)), v["a"], producers) is None
    even_k = dense.where(lambda e: producers[e].args[0].type.shape[-1] % 8 == 0)
    assert match(even_k, v["m"], producers) is not None


def test_attribute_predicate():
    main, producers, v = _function_and_producers()
    assert match(is_op("softmax")(wildcard()).has_attr({"axis": 0}), v["s"], producers) is not None
    assert match(is_op("softmax")(wildcard()).has_attr({"axis": 1}), v["s"], producers) is None


def test_a_node_reached_twice_inside_the_pattern_is_matched_once():
    text = """
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {
  %e = exp(%x)
  %m = multiply(%e, %e)
  return %m
}"""
    main, producers, v = _function_and_producers(text)
    square_of_exp = is_op("multiply")(is_op("exp")(wildcard()), is_op("exp")(wildcard()))
    found = match(square_of_exp, v["m"], producers)
    assert found.matched == [v["m"], v["e"]] and found.inputs == [main.params[0]]


def test_ops_named_lists_every_op_of_a_pattern():
    dense = is_op("matmul")(wildcard(), wildcard())
    pattern = (is_op("gelu")(is_op("add")(dense, is_const())) | is_op("relu")(dense)).named("out").has_rank(2)
    assert ops_named(pattern) == {"gelu", "add", "matmul", "relu"}


def test_not_a_pattern_is_a_type_error():
    main, producers, v = _function_and_producers()
    with pytest.raises(TypeError, match="not a pattern"):
        match(is_op("matmul")("x", wildcard()), v["m"], producers)


def test_a_name_used_twice_matches_one_expression():
    """multiply(x, x) names both operands x: it matches a square, not a product of two values."""
    from byoc.ir import parse
    from byoc.pattern import is_op, match, wildcard
    square = is_op("multiply")(wildcard().named("x"), wildcard().named("x"))
    mod = parse("""
def @main(%a: Tensor[(2,), float32], %b: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
  %s = multiply(%a, %a)
  %p = multiply(%a, %b)
  %o = add(%s, %p)
  return %o
}""")
    producers = {b.var: b.value for b in mod["main"].bindings}
    s, p = (b.var for b in mod["main"].bindings[:2])
    found = match(square, s, producers)
    assert found is not None and found["x"] is mod["main"].params[0]
    assert match(square, p, producers) is None


def test_matches_yields_each_way_a_pattern_matches_first_to_last():
    """add(x, y) in either order: both ways where both operands fit (the first is what
    match() gives); a call whose later argument fails makes the earlier argument's next
    way be tried (a greedy matcher stops at the first)."""
    text = """
def @main(%x: Tensor[(4, 8), float16], %w: Tensor[(8, 8), float16]) -> Tensor[(4, 8), float16] {
  %m = matmul(%x, %w)
  %m2 = matmul(%m, %w)
  %s = add(%m, %m2)
  return %s
}
"""
    main, producers, v = _function_and_producers(text)
    core = is_op("matmul")(wildcard(), wildcard()).named("core")
    either = is_op("add")(core, wildcard().named("other")) | is_op("add")(wildcard().named("other"), core)
    found = list(matches(either, v["s"], producers))
    assert [(f["core"], f["other"]) for f in found] == [(v["m"], v["m2"]), (v["m2"], v["m"])]
    assert match(either, v["s"], producers)["core"] is v["m"]
    # "core" named twice must be one node: arg 0 taken as core (%m) leaves arg 1 (%m2, a
    # matmul reading %m) no match; arg 0 taken as a wildcard instead fits, found by
    # backtracking into the alternation (a greedy matcher gave up)
    reads_m = is_op("matmul")(wildcard().where(lambda e: e is v["m"]), wildcard()).named("core")
    backtracking = is_op("add")(core | wildcard(), reads_m)
    (only,) = list(matches(backtracking, v["s"], producers))
    assert only["core"] is v["m2"] and only.matched == [v["s"], v["m2"]] and only.inputs[0] is v["m"]
    assert match(backtracking, v["s"], producers) is not None
    assert list(matches(either, v["s"], producers, limit=1)) == found[:1]
