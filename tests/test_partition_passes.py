"""The BYOC passes, TVM style: IR before and after, as text."""
import re

import numpy as np
import pytest

import byoc
from byoc.backend import PatternEntry, get_backend, register_backend, registered
from byoc.ir import FunctionBuilder, assert_structural_equal, parse
from byoc.pattern import is_const, is_op, wildcard
from byoc.report import PartitionReport
from byoc.transform import (fuse_ops_by_pattern, mark_compiler_functions_as_extern, merge_composite_functions,
                            outline_compiler_functions, partition_for)

DENSE_BIAS = is_op("add")(is_op("matmul")(wildcard(), wildcard()), wildcard())


def _test_backend(patterns, **options):
    return registered(dict(name="test", flavor="csource", patterns=patterns, codegen=lambda f, t: [], **options))


TWO_DENSE = """
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32], %b: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] {
  %m = matmul(%x, %w)
  %a = add(%m, %b)
  %r = relu(%a)
  %m2 = matmul(%r, %w)
  %a2 = add(%m2, %b)
  return %a2
}
"""

COMPOSITE = """fn (%pN0: Tensor[(4, 8), float32], %pN1: Tensor[(8, 8), float32], %pN2: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] [Composite="test.dense_bias", Primitive=1] {
    %mN = matmul(%pN0, %pN1)
    %aN = add(%mN, %pN2)
    return %aN
  }"""


def test_fuse_ops_by_pattern_wraps_matches_in_composites():
    expected = parse(f"""
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32], %b: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] {{
  %f1 = {COMPOSITE.replace("N", "1")}
  %a = %f1(%x, %w, %b)
  %r = relu(%a)
  %f2 = {COMPOSITE.replace("N", "2")}
  %a2 = %f2(%r, %w, %b)
  return %a2
}}""")
    with _test_backend([PatternEntry("dense_bias", DENSE_BIAS)]):
        assert_structural_equal(fuse_ops_by_pattern(parse(TWO_DENSE), ["test"]), expected)


def test_scalar_constants_of_a_match_stay_in_the_composite():
    """A matched scalar constant is part of what the composite computes (a backend folds
    it into an epilogue): it stays in the body; a non-scalar constant is a parameter."""
    before = """
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {
  %m = matmul(%x, const([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]], float32))
  %s = divide(%m, const(8.0, float32))
  return %s
}"""
    weight = "const([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]" + ", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]" * 7 + "], float32)"
    expected = f"""
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {{
  %f = fn (%p0: Tensor[(4, 8), float32], %p1: Tensor[(8, 8), float32]) -> Tensor[(4, 8), float32] [Composite="test.dense_scaled", Primitive=1] {{
    %m = matmul(%p0, %p1)
    %s = divide(%m, const(8.0, float32))
    return %s
  }}
  %s = %f(%x, {weight})
  return %s
}}"""
    pattern = is_op("divide")(is_op("matmul")(wildcard(), is_const()), is_const())
    with _test_backend([PatternEntry("dense_scaled", pattern)]):
        assert_structural_equal(fuse_ops_by_pattern(parse(before), ["test"]), parse(expected))


def test_a_refused_match_gives_way_to_the_next_argument_order():
    """`x + f(x)` where x is itself a dense+bias (MobileNetV2's residual blocks): the
    residual pattern's first order takes x's own matmul as the core, and then its output
    reaches the other operand (a cycle); the other order fuses f(x)'s dense+bias with the
    residual x, and nothing is refused."""
    before = """
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32], %b: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] {
  %m = matmul(%x, %w)
  %a = add(%m, %b)
  %m2 = matmul(%a, %w)
  %a2 = add(%m2, %b)
  %s = add(%a, %a2)
  return %s
}"""
    expected = """
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32], %b: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] {
  %m = matmul(%x, %w)
  %a = add(%m, %b)
  %f = fn (%p0: Tensor[(4, 8), float32], %p1: Tensor[(8, 8), float32], %p2: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] [Composite="test.dense_bias_residual", Primitive=1] {
    %m2 = matmul(%p0, %p1)
    %a2 = add(%m2, %p2)
    %s = add(%p0, %a2)
    return %s
  }
  %s = %f(%a, %w, %b)
  return %s
}"""
    core = DENSE_BIAS.named("core")
    residual = wildcard().named("residual")
    pattern = is_op("add")(core, residual) | is_op("add")(residual, core)
    report = PartitionReport()
    with _test_backend([PatternEntry("dense_bias_residual", pattern)]):
        assert_structural_equal(fuse_ops_by_pattern(parse(before), ["test"], report), parse(expected))
    assert report.refused == []


def test_cycle_is_refused_with_reason():
    """Fusing matmul+add here would make a cycle: the composite's input %e is computed,
    outside it, from its own matmul. The match is refused and main stays as it was."""
    text = """
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32]) -> Tensor[(4, 8), float32] {
  %m = matmul(%x, %w)
  %e = exp(%m)
  %a = add(%m, %e)
  return %a
}"""
    report = PartitionReport()
    with _test_backend([PatternEntry("dense_bias", DENSE_BIAS)]):
        result = fuse_ops_by_pattern(parse(text), ["test"], report)
    assert_structural_equal(result, parse(text))
    assert [r["reason"] for r in report.refused] == [
        "its output reaches one of its own inputs through an outside node (a cycle)"]


def test_intermediate_used_outside_is_refused_and_a_smaller_pattern_takes_over():
    """%m is also read by exp: fusing matmul+add would compute it twice (or lose it), so
    dense_bias is refused with the reason, and the next entry, dense, takes matmul alone."""
    before = """
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32], %b: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] {
  %m = matmul(%x, %w)
  %a = add(%m, %b)
  %e = exp(%m)
  %r = add(%a, %e)
  return %r
}"""
    after = """
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32], %b: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] {
  %test_dense = fn (%p0: Tensor[(4, 8), float32], %p1: Tensor[(8, 8), float32]) -> Tensor[(4, 8), float32] [Composite="test.dense", Primitive=1] {
    %0 = matmul(%p0, %p1)
    return %0
  }
  %m = %test_dense(%x, %w)
  %a = add(%m, %b)
  %e = exp(%m)
  %r = add(%a, %e)
  return %r
}"""
    report = PartitionReport()
    table = [PatternEntry("dense_bias", DENSE_BIAS), PatternEntry("dense", is_op("matmul")(wildcard(), wildcard()))]
    with _test_backend(table):
        result = fuse_ops_by_pattern(parse(before), ["test"], report)
    assert_structural_equal(result, parse(after))
    assert [(r["pattern"], r["reason"]) for r in report.refused] == [
        ("dense_bias", "intermediate %m is also used outside the match (fusing would duplicate it)")]
    assert report.to_json()["backends"]["test"]["patterns"] == {"dense": 1}


def test_backends_are_tried_in_priority_order():
    relu = is_op("relu")(wildcard())
    with _test_backend([PatternEntry("relu", relu)]), \
            registered(name="second", flavor="json", patterns=[PatternEntry("relu", relu)],
                       codegen=lambda f, t: []):
        for order, winner in ((["test", "second"], "test.relu"), (["second", "test"], "second.relu")):
            fused = fuse_ops_by_pattern(parse(TWO_DENSE), order)
            composites = [b.value.attrs["Composite"] for b in fused["main"].bindings
                          if isinstance(b.value, byoc.ir.Function)]
            assert composites == [winner]


def test_pattern_candidates_lists_every_accepted_match_overlapping_ones_included():
    """What partitioning by measurement chooses among: every backend's matches over main's
    bindings (%m 0, %a 1, %r 2, %m2 3, %a2 4), overlapping ones included (test.dense_bias
    {0, 1} and second.bias_relu {1, 2}), in priority order, without the refused (the
    check's) or those whose intermediate is read outside; main is left alone. With costs
    per candidate and each binding alone on the built-in backend, cheapest_cover picks."""
    from byoc.transform.cheapest_cover import Candidate, cheapest_cover
    from byoc.transform.pattern_candidates import dataflow_edges, pattern_candidates
    dense = is_op("matmul")(wildcard(), wildcard())
    bias_relu = is_op("relu")(is_op("add")(wildcard(), wildcard()))
    refuse_second = lambda match: "refused" if match.inputs[0].name_hint == "m2" else None
    mod = parse(TWO_DENSE)
    with _test_backend([PatternEntry("dense_bias", DENSE_BIAS), PatternEntry("dense", dense)]), \
            registered(name="second", flavor="json", codegen=lambda f, t: [],
                       patterns=[PatternEntry("bias_relu", bias_relu), PatternEntry("add", is_op("add")(
                           wildcard(), wildcard()), refuse_second)]):
        found = pattern_candidates(mod, ["test", "second"])
    assert [(c.backend, c.pattern, c.root, sorted(c.nodes)) for c in found] == [
        ("test", "dense_bias", 4, [3, 4]), ("test", "dense_bias", 1, [0, 1]),
        ("test", "dense", 3, [3]), ("test", "dense", 0, [0]),
        ("second", "bias_relu", 2, [1, 2]), ("second", "add", 1, [1])]
    assert_structural_equal(mod, parse(TWO_DENSE))
    assert dataflow_edges(mod) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    costs = {"dense_bias": 3.0, "dense": 2.0, "bias_relu": 1.5, "add": 1.0}
    candidates = [Candidate(c.backend, c.nodes, costs[c.pattern], c.pattern) for c in found] + \
        [Candidate("builtin", frozenset({i}), 2.0, "op") for i in range(5)]
    cover = cheapest_cover(5, dataflow_edges(mod), candidates)
    assert sorted((c.name, sorted(c.nodes)) for c in cover.candidates) == [
        ("bias_relu", [1, 2]), ("dense", [0]), ("dense_bias", [3, 4])]
    assert cover.cost_us == 6.5


def test_check_refusal_reaches_the_report():
    report = PartitionReport()
    refuse = lambda match: f"K={match.inputs[0].type.shape[-1]} not a multiple of 16"
    with _test_backend([PatternEntry("dense_bias", DENSE_BIAS, refuse)]):
        result = fuse_ops_by_pattern(parse(TWO_DENSE), ["test"], report)
    assert_structural_equal(result, parse(TWO_DENSE))
    assert {r["reason"] for r in report.refused} == {"K=8 not a multiple of 16"}
    assert sorted(r["node"] for r in report.refused) == ["a", "a2"]  # each match's root, to find it in the model
    assert re.search(r"test.dense_bias x2: K=8 not a multiple of 16 \((%a, %a2|%a2, %a)\)", report.to_text())


RELU_COMPOSITE = """fn (%q: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Composite="test.relu", Primitive=1] {
      %0 = relu(%q)
      return %0
    }"""


def test_merge_composite_functions_groups_neighbours_into_one_compiler_function():
    relu = is_op("relu")(wildcard())
    with _test_backend([PatternEntry("dense_bias", DENSE_BIAS), PatternEntry("relu", relu)]):
        merged = merge_composite_functions(fuse_ops_by_pattern(parse(TWO_DENSE), ["test"]))
    expected = parse(f"""
def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(8, 8), float32], %b: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] {{
  %test_region = fn (%p0: Tensor[(4, 8), float32], %p1: Tensor[(8, 8), float32], %p2: Tensor[(8,), float32]) -> Tensor[(4, 8), float32] [Compiler="test"] {{
    %f1 = {COMPOSITE.replace("N", "1")}
    %a = %f1(%p0, %p1, %p2)
    %f2 = {RELU_COMPOSITE}
    %r = %f2(%a)
    %f3 = {COMPOSITE.replace("N", "3")}
    %a2 = %f3(%r, %p1, %p2)
    return %a2
  }}
  %a2 = %test_region(%x, %w, %b)
  return %a2
}}""")
    assert_structural_equal(merged, expected)
    np.testing.assert_allclose(*_run_both(parse(TWO_DENSE), merged), rtol=1e-6)


def _relu_chain(middle: str) -> str:
    return f"""
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {{
  %a = relu(%x)
{middle}
  return %d
}}"""


def test_merge_takes_a_diamond_as_one_region():
    """relu %a feeds %b and %c, which both feed %d: one region, one output."""
    text = _relu_chain("  %b = relu(%a)\n  %c = relu(%a)\n  %d = add(%b, %c)")
    table = [PatternEntry("relu", is_op("relu")(wildcard())), PatternEntry("add", is_op("add")(wildcard(), wildcard()))]
    with _test_backend(table):
        merged = merge_composite_functions(fuse_ops_by_pattern(parse(text), ["test"]))
    (region_binding, call_binding) = merged["main"].bindings
    assert region_binding.value.attrs == {"Compiler": "test"}
    assert [b.value.attrs["Composite"] for b in region_binding.value.bindings
            if isinstance(b.value, byoc.ir.Function)] == ["test.relu", "test.relu", "test.relu", "test.add"]
    assert list(call_binding.value.args) == [merged["main"].params[0]]


def test_merge_never_makes_a_cycle_through_an_outside_node():
    """The cycle case of MergeCompositeFunctions: %a and %d are composites of one backend,
    and %a also reaches %d through exp, which the backend did not take. One region of %a
    and %d would both feed exp and need its result. They stay apart, and main stays in
    dependency order."""
    text = _relu_chain("  %e = exp(%a)\n  %d = add(%a, %e)")
    table = [PatternEntry("relu", is_op("relu")(wildcard())), PatternEntry("add", is_op("add")(wildcard(), wildcard()))]
    with _test_backend(table):
        merged = merge_composite_functions(fuse_ops_by_pattern(parse(text), ["test"]))
    relu_region = f"""fn (%p0: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test"] {{
    %f = {RELU_COMPOSITE}
    %a = %f(%p0)
    return %a
  }}"""
    add_composite = """fn (%l: Tensor[(4, 8), float32], %r: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Composite="test.add", Primitive=1] {
      %0 = add(%l, %r)
      return %0
    }"""
    expected = parse(f"""
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {{
  %region_a = {relu_region}
  %a = %region_a(%x)
  %e = exp(%a)
  %region_d = fn (%p0: Tensor[(4, 8), float32], %p1: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test"] {{
    %g = {add_composite}
    %d = %g(%p0, %p1)
    return %d
  }}
  %d = %region_d(%a, %e)
  return %d
}}""")
    assert_structural_equal(merged, expected)


def test_merge_stops_at_a_composite_of_another_backend():
    relu = is_op("relu")(wildcard())
    text = _relu_chain("  %b = relu(%a)\n  %d = relu(%b)")
    with _test_backend([PatternEntry("relu", relu)]), \
            registered(name="other", flavor="shim", patterns=[PatternEntry("relu", relu)], codegen=lambda f, t: []):
        fused = fuse_ops_by_pattern(parse(text), ["test"])
        # hand %b to the other backend: rename its composite
        bindings = []
        for binding in fused["main"].bindings:
            value = binding.value
            if isinstance(value, byoc.ir.Function) and len(bindings) == 2:
                value = value.with_attrs(Composite="other.relu")
            bindings.append(byoc.ir.Binding(binding.var, value))
        main = fused["main"]
        fused["main"] = byoc.ir.Function(main.params, bindings, main.result, main.ret_type, main.attrs)
        merged = merge_composite_functions(fused)
    regions = [b.value.attrs["Compiler"] for b in merged["main"].bindings if isinstance(b.value, byoc.ir.Function)]
    assert regions == ["test", "other", "test"]


def test_one_composite_per_function_backend():
    relu = is_op("relu")(wildcard())
    with _test_backend([PatternEntry("dense_bias", DENSE_BIAS), PatternEntry("relu", relu)],
                      one_composite_per_function=True):
        merged = merge_composite_functions(fuse_ops_by_pattern(parse(TWO_DENSE), ["test"]))
    regions = [b.value for b in merged["main"].bindings if isinstance(b.value, byoc.ir.Function)]
    assert len(regions) == 3 and all(r.attrs == {"Compiler": "test"} for r in regions)


INLINED = """
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {
  %f = fn (%p: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test"EXTRA] {
    %r = relu(%p)
    return %r
  }
  %y = %f(%x)
  %g = fn (%q: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test"] {
    %s = relu(%q)
    return %s
  }
  %z = %g(%y)
  return %z
}
"""


@pytest.mark.parametrize("extra", ["", ", Inline=1"])
def test_outline_inlined_compiler_functions_shares_one_global(extra):
    """A Compiler function inlined into main becomes a global; a structurally equal one
    (also when marked Inline=1) shares it."""
    result = outline_compiler_functions(parse(INLINED.replace("EXTRA", extra)))
    symbols = [name for name in result.functions if name != "main"]
    assert len(symbols) == 1 and re.fullmatch(r"test_[0-9a-f]{12}", symbols[0])
    symbol = symbols[0]
    expected = parse(f"""
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {{
  %y = @{symbol}(%x)
  %z = @{symbol}(%y)
  return %z
}}

def @{symbol}(%p: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test", global_symbol="{symbol}"] {{
  %r = relu(%p)
  return %r
}}""")
    assert_structural_equal(result, expected)
    # the symbol is deterministic
    assert [n for n in outline_compiler_functions(parse(INLINED.replace("EXTRA", extra))).functions if n != "main"] == symbols


def test_outline_keeps_an_unshared_backends_equal_functions_one_per_call():
    """A backend listed as unshared (its target's share_functions: false, where it keeps
    state per function) gets a global per call, the second named with _2."""
    result = outline_compiler_functions(parse(INLINED.replace("EXTRA", "")), unshared=["test"])
    symbols = [name for name in result.functions if name != "main"]
    assert len(symbols) == 2 and symbols[1] == symbols[0] + "_2"
    first, second = symbols
    expected = parse(f"""
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {{
  %y = @{first}(%x)
  %z = @{second}(%y)
  return %z
}}

def @{first}(%p: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test", global_symbol="{first}"] {{
  %r = relu(%p)
  return %r
}}

def @{second}(%q: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test", global_symbol="{second}"] {{
  %s = relu(%q)
  return %s
}}""")
    assert_structural_equal(result, expected)
    assert len(outline_compiler_functions(parse(INLINED.replace("EXTRA", "")), unshared=["other"]).functions) == 2


def test_equal_partitions_with_different_constants_share_one_global():
    text = """
def @main(%x: Tensor[(2, 4), float32]) -> Tensor[(2, 4), float32] {
  %f = fn (%p: Tensor[(2, 4), float32]) -> Tensor[(2, 4), float32] [Compiler="test"] {
    %a = add(%p, const([1.0, 2.0, 3.0, 4.0], float32))
    return %a
  }
  %y = %f(%x)
  %g = fn (%q: Tensor[(2, 4), float32]) -> Tensor[(2, 4), float32] [Compiler="test"] {
    %b = add(%q, const([5.0, 6.0, 7.0, 8.0], float32))
    return %b
  }
  %z = %g(%y)
  return %z
}"""
    result = outline_compiler_functions(parse(text))
    (symbol,) = [n for n in result.functions if n != "main"]
    expected = parse(f"""
def @main(%x: Tensor[(2, 4), float32]) -> Tensor[(2, 4), float32] {{
  %y = @{symbol}(%x, const([1.0, 2.0, 3.0, 4.0], float32))
  %z = @{symbol}(%y, const([5.0, 6.0, 7.0, 8.0], float32))
  return %z
}}

def @{symbol}(%p: Tensor[(2, 4), float32], %c0: Tensor[(4,), float32]) -> Tensor[(2, 4), float32] [Compiler="test", global_symbol="{symbol}"] {{
  %a = add(%p, %c0)
  return %a
}}""")
    assert_structural_equal(result, expected)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(*_run_both(parse(text), result, x), rtol=0)


def test_outline_reaches_compiler_functions_nested_in_local_functions():
    text = """
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {
  %outer = fn (%a: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {
    %f = fn (%p: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test"] {
      %r = relu(%p)
      return %r
    }
    %y = %f(%a)
    return %y
  }
  %z = %outer(%x)
  return %z
}"""
    result = outline_compiler_functions(parse(text))
    (symbol,) = [n for n in result.functions if n != "main"]
    expected = parse(f"""
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {{
  %outer = fn (%a: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {{
    %y = @{symbol}(%a)
    return %y
  }}
  %z = %outer(%x)
  return %z
}}

def @{symbol}(%p: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test", global_symbol="{symbol}"] {{
  %r = relu(%p)
  return %r
}}""")
    assert_structural_equal(result, expected)


def test_constants_inside_composites_are_lifted_through_the_region():
    """Two regions whose composites hold different weights share one global: the
    composite gets a parameter, the region passes it on, main passes the constant."""
    region = """fn (%p: Tensor[(2, 4), float32]) -> Tensor[(2, 4), float32] [Compiler="test"] {
    %c = fn (%q: Tensor[(2, 4), float32]) -> Tensor[(2, 4), float32] [Composite="test.add", Primitive=1] {
      %0 = add(%q, const([WEIGHTS], float32))
      return %0
    }
    %r = %c(%p)
    return %r
  }"""
    text = f"""
def @main(%x: Tensor[(2, 4), float32]) -> Tensor[(2, 4), float32] {{
  %f = {region.replace("WEIGHTS", "1.0, 2.0, 3.0, 4.0")}
  %y = %f(%x)
  %g = {region.replace("WEIGHTS", "5.0, 6.0, 7.0, 8.0")}
  %z = %g(%y)
  return %z
}}"""
    result = outline_compiler_functions(parse(text))
    (symbol,) = [n for n in result.functions if n != "main"]
    expected = parse(f"""
def @main(%x: Tensor[(2, 4), float32]) -> Tensor[(2, 4), float32] {{
  %y = @{symbol}(%x, const([1.0, 2.0, 3.0, 4.0], float32))
  %z = @{symbol}(%y, const([5.0, 6.0, 7.0, 8.0], float32))
  return %z
}}

def @{symbol}(%p: Tensor[(2, 4), float32], %c0: Tensor[(4,), float32]) -> Tensor[(2, 4), float32] [Compiler="test", global_symbol="{symbol}"] {{
  %c = fn (%q: Tensor[(2, 4), float32], %k0: Tensor[(4,), float32]) -> Tensor[(2, 4), float32] [Composite="test.add", Primitive=1] {{
    %0 = add(%q, %k0)
    return %0
  }}
  %r = %c(%p, %c0)
  return %r
}}""")
    assert_structural_equal(result, expected)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(*_run_both(parse(text), result, x), rtol=0)


def test_an_inlined_copy_of_an_existing_compiler_global_calls_it():
    text = """
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {
  %y = @kernel(%x)
  %f = fn (%p: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test", Inline=1] {
    %r = relu(%p)
    return %r
  }
  %z = %f(%y)
  return %z
}

def @kernel(%p: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Compiler="test"] {
  %r = relu(%p)
  return %r
}"""
    result = outline_compiler_functions(parse(text))
    assert sorted(result.functions) == ["kernel", "main"]
    assert [b.value.op.name for b in result["main"].bindings] == ["kernel", "kernel"]


def test_mark_compiler_functions_as_extern_keeps_only_the_signature():
    outlined = outline_compiler_functions(parse(INLINED.replace("EXTRA", "")))
    (symbol,) = [n for n in outlined.functions if n != "main"]
    result = mark_compiler_functions_as_extern(outlined)
    expected = parse(f"""
def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {{
  %y = @{symbol}(%x)
  %z = @{symbol}(%y)
  return %z
}}

def @{symbol}(%p: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] [Extern=1];""")
    assert_structural_equal(result, expected)


def _outlined_and_marked():
    outlined = outline_compiler_functions(parse(INLINED.replace("EXTRA", "")))
    (symbol,) = [n for n in outlined.functions if n != "main"]
    return outlined, symbol


def test_run_codegen_calls_each_backend_once_with_its_target_current():
    from byoc.backend import Artifact, current_target
    from byoc.transform import run_codegen
    calls = []

    def codegen(functions, target):
        calls.append((sorted(functions), target, current_target()))
        return [Artifact("test", "source", symbols=list(functions))]

    outlined, symbol = _outlined_and_marked()
    target = object()  # any Target-like object
    with registered(name="test", flavor="csource", patterns=[], codegen=codegen):
        mod, artifacts = run_codegen(outlined, {"test": target})
        assert mod is outlined
        assert calls == [([symbol], target, target)]
        assert current_target() is None  # only current while the codegen runs
        assert [a.symbols for a in artifacts] == [[symbol]]
        run_codegen(outlined, None)  # no targets at all: the codegen gets None
        assert calls[-1] == ([symbol], None, None)


def test_run_codegen_names_a_function_no_artifact_implements():
    from byoc.backend import Artifact
    from byoc.transform import run_codegen
    outlined, symbol = _outlined_and_marked()
    forgetful = lambda functions, target: [Artifact("test", "object", symbols=[])]
    with registered(name="test", flavor="csource", patterns=[], codegen=forgetful):
        with pytest.raises(byoc.BuildError, match=f"no artifact implements extern function\\(s\\) {symbol} \\(test\\)"):
            run_codegen(outlined, None)
    declared = parse("""
def @main(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %y = @lonely(%x)
  return %y
}

def @lonely(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];""")
    with pytest.raises(byoc.BuildError, match="lonely \\(extern declaration\\)"):
        run_codegen(declared, {})


EXTERN_NAMED = """
def @main(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %y = NAME(%x)
  return %y
}

def NAME(%p: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Compiler="test"] {
  %r = relu(%p)
  return %r
}"""


def _named(name):
    from byoc.ir.printer import format_global_name
    return parse(EXTERN_NAMED.replace("NAME", format_global_name(name)))


@pytest.mark.parametrize("name, reason", [
    ("../escape", "it is not a C identifier"),
    ('a"b*/\n#x', "it is not a C identifier"),
    ("class", r"it is a C/C\+\+ keyword"),
    ("int", r"it is a C/C\+\+ keyword"),
    ("byoc_model_run", "names starting with 'byoc_' are reserved for the runtime ABI"),
    ("malloc", "it names a function or object of the C library"),
    ("write", "it names a function or object of the C library"),
    ("_start", "reserved to the C/C\\+\\+ implementation"),
    ("kMetadata", "already defines it"),
    ("std", "already defines it"),
    ("cudaMalloc", "already defines it"),
])
def test_run_codegen_refuses_extern_names_that_cannot_be_c_symbols(tmp_path, name, reason):
    from byoc.ir.printer import format_global_name
    from byoc.transform import run_codegen
    calls = []
    with registered(name="test", flavor="csource", patterns=[], codegen=lambda f, t: calls.append(f) or []):
        with pytest.raises(byoc.BuildError, match=re.escape(f"{format_global_name(name)} (Compiler='test'): ")
                           + ".*" + reason + r".*Expected a C identifier \(\[A-Za-z_\]\[A-Za-z0-9_\]\*\)"):
            run_codegen(_named(name), {"test": None})
        assert calls == []  # refused before any backend wrote a file named after it


def test_run_codegen_checks_extern_declarations_and_passes_the_partitioners_names():
    from byoc.transform import run_codegen
    from byoc.transform.run_codegen import symbol_name_problem
    declared = parse("""
def @main(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %y = @free(%x)
  return %y
}

def @free(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];""")
    with pytest.raises(byoc.BuildError, match=r"@free \(Extern=1\): it names a function or object of the C library"):
        run_codegen(declared, {})
    # what OutlineCompilerFunctions names (<backend>_<12 hex digits>) and plain names pass
    outlined = outline_compiler_functions(parse(INLINED.replace("EXTRA", "")))
    assert all(symbol_name_problem(name) is None for name in outlined.functions if name != "main")
    for name in ("builtin_3f2a9c01b4de", "cublaslt_0123456789ab", "cutlass_abcdef012345", "kernel", "gemm_1"):
        assert symbol_name_problem(name) is None, name
    # libc and libm are asked, not the whole process: this one's Python symbols are no C library's
    assert symbol_name_problem("PyList_New") is None
    assert symbol_name_problem("sqrtf") == "it names a function or object of the C library"  # libm


def test_reserved_names_cover_what_the_host_code_defines():
    """The host template's names at namespace scope (other than byoc_ ones) are reserved:
    an extern function of that name would not compile, or would be called in their place."""
    from pathlib import Path
    from byoc.transform.run_codegen import RESERVED_NAMES, symbol_name_problem
    template = (Path(byoc.__file__).resolve().parent.parent / "templates" / "host" / "model.cc.j2").read_text()
    defined = set()
    for line in template.splitlines():
        if line[:1].isspace() or line.startswith(("extern", "BYOC_EXPORT", "namespace", "#", "}", "{", "//")):
            continue
        match = re.match(r"using \w+::(\w+);", line) or re.match(r"(?:[\w:<>]+[\s*&]+)+(\w+)\s*[\[({=;]", line)
        if match:
            defined.add(match.group(1))
    defined = {name for name in defined if not name.startswith("byoc_")}
    assert {"kInputs", "kFunctions", "kStates", "kVariants"} <= defined
    # a variant's tables are numbered (kInputs0, kFunctions1)
    numbered = {name for name in defined if name + "{{ v }}" in template}
    assert numbered == {"kInputs", "kOutputs", "kInputOnHost", "kOutputOnHost", "kFunctions", "kStates",
                        "kPaddedDimValues"}
    for name in numbered:
        assert symbol_name_problem(f"{name}3") is not None and symbol_name_problem(f"{name}s") is None
    assert defined - numbered <= RESERVED_NAMES, sorted(defined - numbered - RESERVED_NAMES)


def test_run_codegen_refuses_a_compiler_this_build_does_not_configure():
    from byoc.transform import run_codegen
    outlined, symbol = _outlined_and_marked()
    calls = []
    with registered(name="test", flavor="csource", patterns=[], codegen=lambda f, t: calls.append(f) or []):
        with pytest.raises(byoc.BuildError, match=f"function\\(s\\) @{symbol} \\(Compiler='test'\\) name a backend "
                                                  f"this build does not configure; the configured backends are "
                                                  f"builtin, cutlass"):
            run_codegen(outlined, {"builtin": None, "cutlass": None})
    assert calls == []


def _run_both(before, after, x=None):
    """Interpret `before`, and `after` with its Compiler functions inlined back."""
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32) if x is None else x
    args = [x] + [np.random.default_rng(i + 1).standard_normal(p.type.shape).astype(np.float32)
                  for i, p in enumerate(before["main"].params[1:])]
    return byoc.interpret(after, *args), byoc.interpret(before, *args)


def _bert(layers: int, hidden: int = 64, seq: int = 16):
    rng = np.random.default_rng(0)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    with FunctionBuilder("main") as fb:
        x = fb.param("x", (seq, hidden))
        for _ in range(layers):
            q = fb.call("add", fb.call("matmul", x, weight(hidden, hidden)), weight(hidden))
            k = fb.call("add", fb.call("matmul", x, weight(hidden, hidden)), weight(hidden))
            v = fb.call("add", fb.call("matmul", x, weight(hidden, hidden)), weight(hidden))
            scores = fb.call("softmax", fb.call("matmul", q, fb.call("transpose", k, axes=(1, 0))))
            attention = fb.call("add", fb.call("add", fb.call("matmul", fb.call("matmul", scores, v),
                                                                  weight(hidden, hidden)), weight(hidden)), x)
            x = fb.call("layer_norm", attention, np.ones(hidden, np.float32), np.zeros(hidden, np.float32))
            up = fb.call("gelu", fb.call("add", fb.call("matmul", x, weight(hidden, 4 * hidden)), weight(4 * hidden)))
            down = fb.call("add", fb.call("add", fb.call("matmul", up, weight(4 * hidden, hidden)), weight(hidden)), x)
            x = fb.call("layer_norm", down, weight(hidden) + 1, weight(hidden))
        fb.ret(x)
    return fb.module()


@pytest.mark.parametrize("one_per_function", [True, False])
def test_twelve_layers_compile_as_many_unique_functions_as_one(one_per_function):
    """A 12-layer BERT-architecture encoder (hidden 64; attention with softmax; matmul+bias,
    matmul+bias+gelu and matmul+bias+residual; layer_norm; every layer's weights different
    constants) under a GEMM+epilogue pattern table: as many unique outlined functions as
    for one layer, so each unique kernel is compiled once."""
    from byoc.backends.builtin.partition import partition_builtin
    dense = is_op("matmul")(wildcard(), wildcard())
    bias = is_op("add")(dense, wildcard())
    table = [PatternEntry("dense_bias_residual", is_op("add")(bias, wildcard())),
             PatternEntry("dense_bias_gelu", is_op("gelu")(bias)),
             PatternEntry("dense_bias", bias), PatternEntry("dense", dense)]
    counts = {}
    with _test_backend(table, one_composite_per_function=one_per_function):
        for layers in (1, 12):
            mod, report = partition_for(_bert(layers), ["test"], finalize=partition_builtin)
            backends = report.to_json()["backends"]
            counts[layers] = {backend: entry["unique_functions"] for backend, entry in backends.items()}
            # q, k, v, q@kT, p@v, out-proj+residual, up+gelu, down+residual
            assert backends["test"]["composites"] == 8 * layers
            if one_per_function:
                assert backends["test"]["partitions"] == 8 * layers
            else:  # q@kT and p@v run through a builtin softmax/transpose: their own regions
                assert layers <= backends["test"]["partitions"] < 8 * layers
            if layers == 12:
                np.testing.assert_allclose(*_run_both(_bert(layers), mod, np.ones((16, 64), np.float32)),
                                           rtol=2e-4, atol=2e-4)
    assert counts[12] == counts[1]
    # Both counts, stated: one composite per function gives dense_bias (q, k, v), dense for
    # q@kT and p@v (two shapes), out-proj+residual, up+gelu, down+residual; merged regions
    # give q/k/v (one shape), q@kT, p@v+out-proj+residual, up+gelu+down+residual.
    assert counts[1]["test"] == counts[12]["test"] == (6 if one_per_function else 4)
    assert counts[1]["builtin"] == counts[12]["builtin"] == 3


def test_registration_errors_name_the_culprit():
    with pytest.raises(byoc.ConfigError, match="names unknown op 'matmull'"):
        register_backend("bad", "csource", [PatternEntry("x", is_op("matmull")(wildcard()))], lambda f, t: [])
    with pytest.raises(byoc.ConfigError, match="flavor 'c' is not one of csource, json, shim"):
        register_backend("bad", "c", [], lambda f, t: [])
    relu = PatternEntry("relu", is_op("relu")(wildcard()))
    with pytest.raises(byoc.ConfigError, match="pattern name\\(s\\) relu appear more than once"):
        register_backend("bad", "shim", [relu, relu], lambda f, t: [])
    with pytest.raises(byoc.BuildError, match="no backend named 'tensorrt' is registered; known backends:"):
        get_backend("tensorrt")
    assert "bad" not in byoc.backend.list_backends()


def test_registered_backends_do_not_leak_out_of_the_block():
    with _test_backend([]):
        assert get_backend("test").flavor == "csource"
        with registered(name="test", flavor="json", patterns=[], codegen=lambda f, t: []):
            assert get_backend("test").flavor == "json"
        assert get_backend("test").flavor == "csource"  # the outer one is back
    with pytest.raises(byoc.BuildError, match="'test'"):
        get_backend("test")


def test_partition_for_names_a_backend_missing_from_the_registry():
    with pytest.raises(byoc.BuildError, match="no backend named 'tensorrt' is registered; known backends:"):
        partition_for(parse(TWO_DENSE), ["tensorrt"])


def test_bert2_onnx_through_the_whole_partitioning_pipeline():
    """bert2.onnx (2 layers, hidden 128): the test backend takes the GEMMs, the built-in
    backend every op left; afterwards main only calls globals (outlined Compiler
    functions), and the two layers share their functions."""
    from byoc.backends.builtin.partition import partition_builtin
    from byoc.ir.expr import Call, GlobalVar
    from byoc.transform import recognize_gelu
    inputs = ("input_ids", "attention_mask", "token_type_ids")
    mod = byoc.from_onnx("tests/fixtures/bert2.onnx", input_shapes={name: (2, 16) for name in inputs})
    mod = recognize_gelu(mod)
    dense = is_op("matmul")(wildcard(), wildcard())
    either_add = lambda x, y: is_op("add")(x, y) | is_op("add")(y, x)
    bias = either_add(dense, is_const())
    table = [PatternEntry("dense_bias_residual", either_add(bias, wildcard())),
             PatternEntry("dense_bias_gelu", is_op("gelu")(bias)),
             PatternEntry("dense_bias", bias), PatternEntry("dense", dense)]
    with _test_backend(table):
        partitioned, report = partition_for(mod, ["test"], finalize=partition_builtin)
    main = partitioned["main"]
    assert all(isinstance(b.value, Call) and isinstance(b.value.op, GlobalVar) for b in main.bindings)
    assert all("Compiler" in partitioned[b.value.op.name].attrs for b in main.bindings)
    backends = report.to_json()["backends"]
    assert set(backends) == {"test", "builtin"}
    assert backends["test"]["partitions"] > backends["test"]["unique_functions"] > 0
    assert backends["builtin"]["partitions"] > backends["builtin"]["unique_functions"] > 0
    assert "test" in report.to_text() and "builtin" in report.to_text()
    # and it computes what the model computed (the interpreter runs the globals' bodies)
    fixture = np.load("tests/fixtures/bert2.npz")
    args = [fixture[f"in_{name}"] for name in inputs]
    for got, want in zip(byoc.interpret(partitioned, *args), byoc.interpret(mod, *args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_artifact_kind_is_checked():
    from byoc.backend import Artifact
    with pytest.raises(byoc.BuildError, match="kind 'elf' is not one of source, object, json, shim"):
        Artifact("test", "elf", symbols=[])


def test_the_core_reaches_backends_only_through_the_registry():
    """No module of byoc's core imports a backend's package: the catch-all backend's
    partition step and op outlining come from its registration (takes_the_rest,
    outline_op), like every backend's patterns and codegen. (The CLI's `byoc tuning` is the
    cutlass tuning database's command, and names it.)"""
    import re
    from pathlib import Path
    import byoc
    from byoc.backend import FALLBACK, get_backend
    core = Path(byoc.__file__).parent
    named = [str(p.relative_to(core)) for p in core.rglob("*.py")
             if p.relative_to(core).parts[0] != "cli" and re.search(r"backends\.(builtin|cutlass|cublaslt)\b", p.read_text())]
    assert named == []
    fallback = get_backend(FALLBACK)
    assert callable(fallback.takes_the_rest) and callable(fallback.outline_op)
    assert all(get_backend(name).takes_the_rest is None for name in ("cutlass", "cublaslt"))


def test_the_report_counts_calls_per_run_and_the_copies_among_them():
    """Every call of a backend function but the reshapes (views) is a launch; the built-in
    backend's transposes, slices and concats only move data and are counted as such (a
    concat that copies the slices only it reads in place is one call: concat_views)."""
    from byoc.backends.builtin.partition import partition_builtin
    from byoc.transform.partition import partition_for
    mod = parse("""
def @main(%x: Tensor[(2, 3, 4), float32]) -> Tensor[(4, 3, 4), float32] {
  %t = transpose(%x, axes=[0, 2, 1])
  %r = reshape(%t, shape=[2, 3, 4])
  %e = exp(%r)
  %s = strided_slice(%e, begin=[0], end=[2], axes=[2])
  %u = strided_slice(%e, begin=[2], end=[4], axes=[2])
  %c = concat(%u, %s, axis=2)
  %o = concat(%c, %x, axis=0)
  return %o
}""")
    _, report = partition_for(mod, [], finalize=partition_builtin)
    data = report.to_json()
    assert data["calls_per_run"] == 4, report.to_text()  # transpose, exp, the concat of slices, the other concat
    assert data["copies_per_run"] == {"concat": 1, "concat_views": 1, "transpose": 1}
    assert "calls per run: 4, of which 3 only move data (concat x1, concat_views x1, transpose x1)" in report.to_text()
    again = PartitionReport.from_json(data)
    assert again.to_text() == report.to_text()
