"""The BYOC passes, TVM style: IR before and after, as text."""
import re

import numpy as np
import pytest

import byoc
from byoc.backend import PatternEntry, get_backend, register_backend, registered
from byoc.ir import FunctionBuilder, assert_structural_equal, parse
from byoc.pattern import is_op, wildcard
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


def test_intermediate_used_outside_is_refused_with_reason():
    """The cycle case: fusing matmul+add while %m also feeds %e would need %m outside the
    composite as well (duplicated work, and the composite's input %e would depend on the
    composite itself through %m)."""
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
    assert_structural_equal(result, parse(text))  # unchanged: no cycle, nothing duplicated
    assert report.refused and "used outside the match" in report.refused[0]["reason"]


def test_check_refusal_reaches_the_report():
    report = PartitionReport()
    refuse = lambda match: f"K={match.inputs[0].type.shape[-1]} not a multiple of 16"
    with _test_backend([PatternEntry("dense_bias", DENSE_BIAS, refuse)]):
        result = fuse_ops_by_pattern(parse(TWO_DENSE), ["test"], report)
    assert_structural_equal(result, parse(TWO_DENSE))
    assert {r["reason"] for r in report.refused} == {"K=8 not a multiple of 16"}
    assert "K=8 not a multiple of 16" in report.to_text()


def test_merge_composite_functions_groups_neighbours_into_one_compiler_function():
    relu = is_op("relu")(wildcard())
    with _test_backend([PatternEntry("dense_bias", DENSE_BIAS), PatternEntry("relu", relu)]):
        fused = fuse_ops_by_pattern(parse(TWO_DENSE), ["test"])
        merged = merge_composite_functions(fused)
    main = merged["main"]
    assert len(main.bindings) == 2  # one Compiler function and its call
    region = main.bindings[0].value
    assert region.attrs == {"Compiler": "test"}
    composites = [b.value.attrs["Composite"] for b in region.bindings if hasattr(b.value, "attrs") and
                  isinstance(b.value, byoc.ir.Function)]
    assert composites == ["test.dense_bias", "test.relu", "test.dense_bias"]
    np.testing.assert_allclose(*_run_both(parse(TWO_DENSE), merged), rtol=1e-6)


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


def test_twelve_layers_compile_as_many_unique_functions_as_one():
    from byoc.backends.builtin.partition import partition_builtin
    dense = is_op("matmul")(wildcard(), wildcard())
    bias = is_op("add")(dense, wildcard())
    table = [PatternEntry("dense_bias_residual", is_op("add")(bias, wildcard())),
             PatternEntry("dense_bias_gelu", is_op("gelu")(bias)),
             PatternEntry("dense_bias", bias), PatternEntry("dense", dense)]
    counts = {}
    with _test_backend(table, one_composite_per_function=True):
        for layers in (1, 12):
            mod, report = partition_for(_bert(layers), ["test"], finalize=partition_builtin)
            counts[layers] = {backend: entry["unique_functions"] for backend, entry in report.to_json()["backends"].items()}
            calls = report.to_json()["backends"]["test"]["partitions"]
            assert calls == 8 * layers  # q, k, v, q@kT, p@v, out-proj+residual, up+gelu, down+residual
    assert counts[12] == counts[1]
    assert counts[1]["test"] == 6 and counts[1]["builtin"] >= 3


def test_registration_errors_name_the_culprit():
    with pytest.raises(byoc.ConfigError, match="names unknown op 'matmull'"):
        register_backend("bad", "csource", [PatternEntry("x", is_op("matmull")(wildcard()))], lambda f, t: [])
    with pytest.raises(byoc.BuildError, match="no backend named 'tensorrt' is registered; known backends:"):
        get_backend("tensorrt")
