"""Tests of the IR text format: print -> parse round trips, the exact text for key
constructs, name sanitization, constants (inline and metadata), and parse errors."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from byoc.errors import ParseError
from byoc.ir import (Binding, Call, Constant, ExternFunc, Function, FunctionBuilder, GlobalVar,
                     IRModule, TensorType, Tuple, TupleGetItem, TupleType, Var,
                     assert_structural_equal, parse, parse_function, parse_module,
                     print_expr, print_function, print_module, structural_hash)
from byoc.ir.parser import MAX_NESTING, parse_literal
from byoc.ir.types import FuncType

F32 = "float32"


def tensor(*shape, dtype=F32) -> TensorType:
    return TensorType(shape, dtype)


def func_type(param: TensorType, ret: TensorType) -> FuncType:
    return FuncType((param,), ret)


def round_trip(mod: IRModule, show_types: bool = False) -> IRModule:
    """Print, parse, check structural equality, and check printing is a fixed point."""
    text = print_module(mod, show_types=show_types)
    parsed = parse_module(text)
    assert_structural_equal(mod, parsed)
    assert print_module(parsed, show_types=show_types) == text
    assert structural_hash(parsed) == structural_hash(mod)
    return parsed


def simple_module() -> IRModule:
    """matmul + add of an inline constant + conv2d with a metadata weight."""
    rng = np.random.default_rng(0)
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (1, 64, 8, 8))
        w = fb.param("w", (8, 8))
        m = fb.call("matmul", x, w, name="0")
        a = fb.call("add", m, Constant(np.float32(1.5)), name="1")
        weight = Constant(rng.standard_normal((16, 64, 1, 1)).astype(np.float32))
        y = fb.call("conv2d", a, weight, strides=(2, 2), pads=[0, 0, 0, 0], name="y")
        fb.ret(y)
    return fb.module()


# ---------------------------------------------------------------- exact text


def test_printed_text_of_a_simple_module():
    mod = simple_module()
    text = mod.script()
    lines = text.splitlines()
    assert lines[0] == ("def @main(%x: Tensor[(1, 64, 8, 8), float32], %w: Tensor[(8, 8), float32])"
                        " -> Tensor[(1, 16, 4, 4), float32] {")
    assert lines[1] == "  %0 = matmul(%x, %w)"
    assert lines[2] == "  %1 = add(%0, const(1.5, float32))"
    # Only the attributes that differ from the schema defaults are printed.
    assert lines[3] == "  %y = conv2d(%1, meta[0], strides=[2, 2])"
    assert lines[4] == "  return %y"
    assert lines[5] == "}"
    assert lines[6] == ""
    assert lines[7] == "metadata {"
    assert re.fullmatch(r'  meta\[0\] = Tensor\[\(16, 64, 1, 1\), float32\] "[A-Za-z0-9+/=]+"', lines[8])
    assert lines[9] == "}"
    assert str(mod) == text
    round_trip(mod)


def test_show_types_annotates_every_binding():
    mod = simple_module()
    text = mod.script(show_types=True)
    assert "  %0: Tensor[(1, 64, 8, 8), float32] = matmul(%x, %w)" in text
    round_trip(mod, show_types=True)


def test_non_default_attributes_in_schema_order():
    with FunctionBuilder() as fb:
        x = fb.param("x", (1, 4, 8, 8))
        weight = Constant(np.ones((4, 1, 3, 3), np.float32))
        c = fb.call("conv2d", x, weight, groups=4, pads=(1, 1, 1, 1), strides=(1, 1), name="c")
        s = fb.call("softmax", c, axis=-1, name="s")
        t = fb.call("softmax", s, axis=1, name="t")
        fb.ret(t)
    text = fb.module().script()
    assert "%c = conv2d(%x, meta[0], pads=[1, 1, 1, 1], groups=4)" in text
    assert "%s = softmax(%c)" in text
    assert "%t = softmax(%s, axis=1)" in text
    round_trip(fb.module())


def test_attribute_values_of_every_kind_round_trip():
    with FunctionBuilder() as fb:
        x = fb.param("x", (2, 3))
        a = fb.call("clip", x, min=-np.inf, max=6.0)           # optional floats, -inf
        b = fb.call("leaky_relu", a, alpha=0.1)                # a float that is not exact in binary
        c = fb.call("cast", b, dtype="float16")                # dtype attribute (a string)
        d = fb.call("gelu", c, approximate="tanh")             # str
        e = fb.call("argmax", d, axis=1, keepdims=True)        # int, bool
        f = fb.call("strided_slice", x, begin=[0], end=[2**63 - 1], axes=[1])  # huge int
        g = fb.call("pad", f, pads=[0, 1, 0, 1], value=float("nan"))  # nan
        fb.ret(e, g)
    text = fb.module().script()
    assert "clip(%x, min=-inf, max=6.0)" in text
    assert "leaky_relu(%v1, alpha=0.1)" in text
    assert 'cast(%v2, dtype="float16")' in text
    assert "keepdims=true" in text
    assert f"end=[{2**63 - 1}]" in text
    assert "value=nan" in text
    round_trip(fb.module())


def test_float32_attribute_values_round_trip_exactly():
    value = float(np.float32(0.1))  # 0.10000000149011612: needs all 17 digits
    with FunctionBuilder() as fb:
        x = fb.param("x", (2,))
        fb.ret(fb.call("leaky_relu", x, alpha=value))
    parsed = round_trip(fb.module())
    assert parsed["main"].bindings[0].value.attrs["alpha"] == value


# ---------------------------------------------------------------- tuples, nested functions, globals


def test_tuples_split_and_tuple_get_item():
    with FunctionBuilder() as fb:
        x = fb.param("x", (4, 6))
        parts = fb.call("split", x, axis=1, sizes=[2, 4], name="parts")
        first = fb.get_item(parts, 0, name="first")
        second = fb.get_item(parts, 1, name="second")
        pair = fb.tuple(first, second, name="pair")
        single = fb.emit(Tuple([first]), name="single")
        empty = fb.emit(Tuple([]), name="empty")
        again = fb.get_item(pair, 1, name="again")
        fb.ret(again, single, empty)
    text = fb.module().script()
    assert "%parts = split(%x, axis=1, sizes=[2, 4])" in text
    assert "%first = %parts.0" in text
    assert "%pair = (%first, %second)" in text
    assert "%single = (%first,)" in text
    assert "%empty = ()" in text
    assert "return (%again, %single, %empty)" in text
    round_trip(fb.module())


def test_nested_tuple_get_item_on_a_tuple_of_tuples():
    text = """
    def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {
      %t = ((%x, %x), %x)
      %y = %t.0.1
      return %y
    }
    """
    mod = parse(text)
    value = mod["main"].bindings[1].value
    assert isinstance(value, TupleGetItem) and value.index == 1
    assert isinstance(value.tuple_value, TupleGetItem) and value.tuple_value.index == 0
    round_trip(mod)


def nested_function_module() -> IRModule:
    p = Var("p", tensor(1, 64))
    inner_a = Var("a", tensor(1, 64))
    composite = Function([p], [Binding(inner_a, Call("relu", [p]))], inner_a,
                         attrs={"Composite": "cutlass.relu", "Primitive": 1})
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (1, 128))
        w = fb.param("w", (128, 64))
        m = fb.call("matmul", x, w, name="a")   # "a" is also the nested function's binding
        f = fb.emit(composite, name="f")
        r = fb.call(f, m, name="r")
        c = fb.call(GlobalVar("other", func_type(tensor(1, 64), tensor(1, 64))), r, name="c")
        e = fb.call(ExternFunc("byoc_shim_relu"), c, type_=tensor(1, 64), name="e")
        fb.ret(e, m)
    mod = fb.module()
    q = Var("q", tensor(1, 64))
    q2 = Var("q2", tensor(1, 64))
    mod["other"] = Function([q], [Binding(q2, Call("relu", [q]))], q2,
                            attrs={"Compiler": "cutlass", "global_symbol": "other"})
    mod["decl"] = Function([Var("a", tensor(4))], None, None, tensor(4), attrs={"Extern": 1})
    return mod


def test_nested_function_extern_call_and_global_call():
    mod = nested_function_module()
    text = mod.script()
    assert "  %f = fn (%p: Tensor[(1, 64), float32]) -> Tensor[(1, 64), float32] " \
           "[Composite=\"cutlass.relu\", Primitive=1] {" in text
    # The nested function's binding "a" is renamed: names are unique per top-level function.
    assert "    %a_1 = relu(%p)" in text
    assert "    return %a_1" in text
    assert "  %r = %f(%a)" in text
    assert "  %c = @other(%r)" in text
    assert '  %e: Tensor[(1, 64), float32] = extern("byoc_shim_relu")(%c)' in text
    assert "[Compiler=\"cutlass\", global_symbol=\"other\"] {" in text
    assert text.splitlines().count(
        "def @decl(%a: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];") == 1
    # Functions are printed in insertion order, separated by a blank line.
    assert [line for line in text.splitlines() if line.startswith("def ")][0].startswith("def @main")
    assert "}\n\ndef @other" in text
    parsed = round_trip(mod)
    assert list(parsed.functions) == ["main", "other", "decl"]
    assert parsed["decl"].is_extern


def test_a_global_may_be_called_before_it_is_defined():
    text = """
    def @main(%x: Tensor[(3,), float32]) -> Tensor[(3,), float32] {
      %y = @later(%x)
      %z = @decl(%y)
      return %z
    }
    def @later(%a: Tensor[(3,), float32]) -> Tensor[(3,), float32] {
      %b = relu(%a)
      return %b
    }
    def @decl(%a: Tensor[(3,), float32]) -> Tensor[(3,), float32] [Extern=1];
    """
    mod = parse(text)
    call = mod["main"].bindings[0].value
    assert isinstance(call.op, GlobalVar) and call.op.name == "later"
    assert call.type == tensor(3)
    round_trip(mod)


def test_nested_function_called_inline_and_nested_declaration():
    text = """
    def @main(%x: Tensor[(3,), float32]) -> Tensor[(3,), float32] {
      %y = fn (%p: Tensor[(3,), float32]) -> Tensor[(3,), float32] {
        %q = negative(%p)
        return %q
      }(%x)
      %d = fn (%p2: Tensor[(3,), float32]) -> Tensor[(3,), float32] [Extern=1];
      %z = %d(%y)
      return %z
    }
    """
    mod = parse(text)
    first = mod["main"].bindings[0].value
    assert isinstance(first, Call) and isinstance(first.op, Function)
    assert mod["main"].bindings[1].value.is_extern
    round_trip(mod)


def test_nested_function_may_use_enclosing_variables():
    text = """
    def @main(%x: Tensor[(3,), float32]) -> Tensor[(3,), float32] {
      %f = fn (%p: Tensor[(3,), float32]) -> Tensor[(3,), float32] {
        %q = add(%p, %x)
        return %q
      }
      %z = %f(%x)
      return %z
    }
    """
    round_trip(parse(text))


def test_global_names_that_are_not_identifiers_are_quoted():
    with FunctionBuilder() as fb:
        x = fb.param("x", (2,))
        fb.ret(fb.call(GlobalVar("my fn\n", func_type(tensor(2), tensor(2))), x))
    mod = fb.module()
    a = Var("a", tensor(2))
    mod["my fn\n"] = Function([a], [], a)
    text = mod.script()
    assert '@"my fn\\n"(%x)' in text
    assert 'def @"my fn\\n"(' in text
    round_trip(mod)


def test_function_attributes_sorted_with_every_value_kind():
    x = Var("x", tensor(2))
    attrs = {"zeta": "z", "Alpha": 1.25, "count": 3, "flag": True, "off": False,
             "odd key": "quoted \"key\"", "sizes": [1, 2]}
    mod = IRModule({"main": Function([x], [], x, attrs=attrs)})
    text = mod.script()
    assert ('[Alpha=1.25, count=3, flag=true, "odd key"="quoted \\"key\\"", off=false, sizes=[1, 2], '
            'zeta="z"]') in text
    parsed = round_trip(mod)
    assert parsed["main"].attrs["flag"] is True
    assert parsed["main"].attrs["count"] == 3


def test_module_attributes_round_trip():
    mod = simple_module()
    mod.attrs["executor"] = "graph"
    text = mod.script()
    assert text.startswith('module [executor="graph"]\n\ndef @main(')
    assert parse(text).attrs == {"executor": "graph"}


def test_comments_are_ignored():
    text = """
    # A comment line.
    def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {  # trailing comment
      %y = relu(%x)  # "not a string"
      return %y
    }
    """
    assert len(parse(text)["main"].bindings) == 1


# ---------------------------------------------------------------- constants


def constant_module(*constants: Constant) -> IRModule:
    """A module returning a tuple of the given constants (each through `identity`)."""
    with FunctionBuilder() as fb:
        fb.ret(*[fb.call("identity", c) for c in constants])
    return fb.module()


@pytest.mark.parametrize("value, dtype, expected", [
    (1.5, "float32", "const(1.5, float32)"),
    ([1, 2, 3], "int64", "const([1, 2, 3], int64)"),
    (True, "bool", "const(true, bool)"),
    ([[True, False]], "bool", "const([[true, false]], bool)"),
    ([-0.0, np.inf, -np.inf], "float32", "const([-0.0, inf, -inf], float32)"),
    (np.nan, "float64", "const(nan, float64)"),
    ([0.1, 65504.0], "float16", "const([0.0999755859375, 65504.0], float16)"),
    ([0.1, 3.0e38], "bfloat16", "const([0.10009765625, 3.00405527047391e+38], bfloat16)"),
    ([255, 0], "uint8", "const([255, 0], uint8)"),
    ([-128], "int8", "const([-128], int8)"),
    ([[[7]]], "int32", "const([[[7]]], int32)"),
    (np.arange(8).reshape(2, 2, 2), "int16", "const([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], int16)"),
])
def test_small_constants_print_inline_and_round_trip(value, dtype, expected):
    constant = Constant(np.asarray(value), dtype)
    mod = constant_module(constant)
    text = mod.script()
    assert f"identity({expected})" in text
    assert "metadata" not in text
    parsed = round_trip(mod)
    parsed_constant = parsed["main"].bindings[0].value.args[0]
    assert parsed_constant.data.shape == constant.data.shape
    assert parsed_constant.data.tobytes() == constant.data.tobytes()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_sixteen_bit_float_round_trips_inline_or_exactly(dtype):
    """All 65536 bit patterns: inline where the literal is exact, metadata otherwise
    (NaNs with a non-default payload); the bytes always come back unchanged."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bits.view(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)
    constants = [Constant(values[start:start + 8], dtype) for start in range(0, values.size, 8)]
    with FunctionBuilder() as fb:
        fb.ret(*[fb.call("identity", c) for c in constants])
    mod = fb.module()
    parsed = parse(mod.script())
    parsed_values = np.concatenate([b.value.args[0].data for b in parsed["main"].bindings])
    assert parsed_values.view(np.uint16).tolist() == bits.tolist()
    assert_structural_equal(mod, parsed)


def test_nan_with_a_payload_goes_to_metadata():
    payload_nan = np.array([0x7FC00001], dtype=np.uint32).view(np.float32)
    constant = Constant(payload_nan)
    text = constant_module(constant).script()
    assert "meta[0]" in text
    parsed = round_trip(constant_module(constant))
    assert parsed["main"].bindings[0].value.args[0].data.tobytes() == payload_nan.tobytes()


def test_large_and_empty_constants_go_to_metadata_deduplicated_by_identity():
    rng = np.random.default_rng(1)
    big = Constant(rng.standard_normal((3, 3)).astype(np.float32))
    twin = Constant(big.data.copy())                      # equal but a different object
    empty = Constant(np.zeros((2, 0), np.int64))
    nine_bools = Constant(rng.random(9) > 0.5)
    half = Constant(rng.standard_normal(20).astype(ml_dtypes.bfloat16))
    mod = constant_module(big, big, twin, empty, nine_bools, half)
    text = mod.script()
    assert "identity(meta[0])" in text
    assert text.count("identity(meta[0])") == 2
    assert "identity(meta[1])" in text            # the twin is a separate entry
    assert "meta[4] = Tensor[(20,), bfloat16]" in text
    assert "meta[2] = Tensor[(2, 0), int64] \"\"" in text
    assert "meta[5]" not in text
    parsed = round_trip(mod)
    bindings = parsed["main"].bindings
    # One metadata entry parses to one shared Constant object.
    assert bindings[0].value.args[0] is bindings[1].value.args[0]
    assert bindings[0].value.args[0] is not bindings[2].value.args[0]


def test_metadata_block_may_come_first():
    text = """
    metadata {
      meta[0] = Tensor[(2,), float32] "AACAPwAAAEA="
    }
    def @main() -> Tensor[(2,), float32] {
      %y = identity(meta[0])
      return %y
    }
    """
    constant = parse(text)["main"].bindings[0].value.args[0]
    assert constant.data.tolist() == [1.0, 2.0]


# ---------------------------------------------------------------- names


def test_names_are_sanitized_and_made_unique():
    hints = ['a"b', "line\nbreak", "*/", "#comment", "ünïcødé", "dup", "dup", "dup_1", "",
             "1abc", "42", "%x", "@g", " ", "x y"]
    with FunctionBuilder() as fb:
        params = [fb.param(hint, (2,)) for hint in hints[:5]]
        value = params[0]
        for hint in hints[5:]:
            value = fb.call("add", value, params[1], name=hint or None)
        fb.ret(value)
    # FunctionBuilder turns "" into a generated name; force an empty hint directly.
    fb.bindings[3].var.name_hint = ""
    mod = fb.module()
    text = mod.script()
    names = re.findall(r"%([^\s:,()=]+)", text)
    for name in names:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+", name), name
    assert len(text.splitlines()) == 2 + len(hints) - 5 + 1
    header = text.splitlines()[0]
    assert "%a_b: " in header and "%line_break: " in header and "%__: " in header
    assert "%_comment: " in header and "%_n_c_d_: " in header
    assert "%dup = " in text and "%dup_1 = " in text and "%dup_1_1 = " in text
    assert "%_1abc = " in text and "%42 = " in text and "%v = " in text
    assert text.isascii() and '"' not in text and "'" not in text and "*/" not in text
    round_trip(mod)


def test_parsed_var_names_are_the_printed_names():
    with FunctionBuilder() as fb:
        x = fb.param("in put", (2,))
        fb.ret(fb.call("relu", x, name="out/put"))
    parsed = parse(fb.module().script())
    assert parsed["main"].params[0].name_hint == "in_put"
    assert parsed["main"].bindings[0].var.name_hint == "out_put"


def test_strings_with_special_characters_are_escaped():
    x = Var("x", tensor(2))
    mod = IRModule({"main": Function([x], [], x, attrs={"note": "line\nbreak \"q\" ü */ #"})})
    text = mod.script()
    assert "\nbreak" not in text
    assert "ü" not in text
    assert parse(text)["main"].attrs["note"] == "line\nbreak \"q\" ü */ #"


# ---------------------------------------------------------------- standalone functions and expressions


def test_print_and_parse_a_standalone_function():
    mod = simple_module()
    func = mod["main"]
    anonymous = print_function(func)
    assert anonymous.startswith("fn (%x: Tensor[(1, 64, 8, 8), float32]")
    assert "metadata {" in anonymous
    assert_structural_equal(func, parse_function(anonymous))
    named = print_function(func, name="main")
    assert named.startswith("def @main(")
    assert_structural_equal(func, parse_function(named))


def test_print_expr():
    x = Var("x", tensor(9))
    y = Var("y", tensor(9))
    assert print_expr(x) == "%x"
    assert print_expr(Call("add", [x, y])) == "add(%x, %y)"
    assert print_expr(Tuple([x, Constant(np.int64(3))])) == "(%x, const(3, int64))"
    assert print_expr(TupleGetItem(Tuple([x, y]), 1)) == "(%x, %y).1"
    assert print_expr(Call("add", [x, Constant(np.ones(9, np.float32))])).startswith(
        "add(%x, meta[0])\n\nmetadata {\n  meta[0] = Tensor[(9,), float32] ")


def test_tensor_and_tuple_types_print_as_str():
    assert str(tensor(2, 3)) == "Tensor[(2, 3), float32]"
    assert str(tensor()) == "Tensor[(), float32]"
    assert str(tensor(5, dtype="int64")) == "Tensor[(5,), int64]"
    assert str(TupleType((tensor(1), tensor()))) == "Tuple[Tensor[(1,), float32], Tensor[(), float32]]"


def test_scalar_parameters_and_tuple_parameters_round_trip():
    x = Var("x", tensor())
    t = Var("t", TupleType((tensor(2), tensor(3, dtype="int64"))))
    item = Var("item", tensor(3, dtype="int64"))
    mod = IRModule({"main": Function([x, t], [Binding(item, TupleGetItem(t, 1))], Tuple([x, item]))})
    assert "%t: Tuple[Tensor[(2,), float32], Tensor[(3,), int64]]" in mod.script()
    round_trip(mod)


# ---------------------------------------------------------------- errors


def parse_error(text: str) -> str:
    with pytest.raises(ParseError) as info:
        parse(text)
    return str(info.value)


MAIN_HEAD = "def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {\n"


def test_error_names_line_column_and_what_was_expected():
    text = MAIN_HEAD + "  %y = relu(%x)\n  %z = add(%y, %x = )\n  return %z\n}\n"
    assert parse_error(text) == "line 3, col 19: expected ',' or ')' but found '='"
    text = MAIN_HEAD + "  %y = relu(%x\n  return %y\n}\n"
    assert parse_error(text) == "line 3, col 3: expected ',' or ')' but found 'return'"


@pytest.mark.parametrize("body, message", [
    ("  %y = relu(%nope)\n  return %y\n", "line 2, col 13: undefined variable %nope"),
    ("  %y = frobnicate(%x)\n  return %y\n", "line 2, col 8: unknown op 'frobnicate'"),
    ("  %y = @missing(%x)\n  return %y\n", "line 2, col 8: undefined global @missing"),
    ("  %y = relu(%x)\n  %y = relu(%y)\n  return %y\n", "line 3, col 3: %y is already defined"),
    ("  %y: Tensor[(3,), float32] = relu(%x)\n  return %y\n",
     "line 2, col 31: %y is annotated Tensor[(3,), float32] but its value has type Tensor[(2,), float32]"),
    ("  %y = extern(\"shim\")(%x)\n  return %y\n",
     "line 2, col 8: a call to extern(\"shim\") needs its result type on its binding"),
    ("  %y = relu(%x, axis=1)\n  return %y\n", "line 2, col 8: relu: unknown attribute(s) axis"),
    ("  %y = add(%x, const([1, 2, 3], float32))\n  return %y\n", "line 2, col 8: add: input shapes do not broadcast"),
    ("  %y = relu(meta[0])\n  return %y\n", "line 2, col 13: meta[0] is not defined in the metadata block"),
    ("  %y = add(%x, const(1.5, int64))\n  return %y\n", "line 2, col 22: int64 constant holds 1.5"),
    ("  %y = add(%x, const(1, float99))\n  return %y\n", "line 2, col 25: unknown dtype 'float99'"),
    ("  %y = add(%x, const(300, uint8))\n  return %y\n", "line 2, col 22: 300 is not a uint8 constant"),
    ("  %y = relu(%x)\n  return (%y, %y)\n", "line 3, col 3: the function returns Tuple["),
    ("  %y = relu(%x, \"oops)\n  return %y\n", "line 2, col 17: unterminated string"),
    ("  %y = relu(%x) $\n  return %y\n", "line 2, col 17: unexpected character '$'"),
    ("  %y = relu(%x)\n", "line 3, col 1: expected a binding '%name = ...' or 'return' but found '}'"),
])
def test_error_messages(body, message):
    assert parse_error(MAIN_HEAD + body + "}\n").startswith(message)


def test_errors_at_module_level():
    assert parse_error("fn (%x: Tensor[(2,), float32])").startswith(
        "line 1, col 1: expected 'def' or 'metadata' but found 'fn'")
    assert parse_error("def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {\n  return %x\n") \
        .startswith("line 3, col 1: expected '}' to close the '{' at line 1, col 63 but found end of input")
    assert parse_error("def @main(%x: Tensor[(2,), float32]) -> Tensor[(2,) float32];") == \
        "line 1, col 53: expected ',' but found 'float32'"
    assert parse_error("def @main(%x: Tensor[(2,), float32], %x: Tensor[(2,), float32]) "
                       "-> Tensor[(2,), float32];").startswith("line 1, col 38: parameter %x is declared twice")
    two = "def @f() -> Tensor[(), float32];\ndef @f() -> Tensor[(), float32];"
    assert parse_error(two).startswith("line 2, col 1: global @f is defined twice")
    assert parse_error('metadata {\n  meta[0] = Tensor[(2,), float32] "AACAPw=="\n}').startswith(
        "line 2, col 35: meta[0] holds 4 bytes but Tensor[(2,), float32] needs 8")


def test_wrong_argument_types_to_a_global_are_an_error():
    text = """def @main(%x: Tensor[(2,), float32]) -> Tensor[(3,), float32] {
  %y = @g(%x)
  return %y
}
def @g(%a: Tensor[(3,), float32]) -> Tensor[(3,), float32];"""
    assert parse_error(text).startswith(
        "line 2, col 8: @g takes (Tensor[(3,), float32]) but is called with (Tensor[(2,), float32])")


def test_type_error_from_op_inference_is_a_parse_error():
    text = MAIN_HEAD + "  %y = matmul(%x, const([[1.0, 2.0, 3.0]], float32))\n  return %y\n}\n"
    message = parse_error(text)
    assert message.startswith("line 2, col 8: matmul: inner dimensions differ")


# ---------------------------------------------------------------- limits of bad input

T2 = "Tensor[(2,), float32]"
N = MAX_NESTING


def nested_text(depth: int) -> dict[str, str]:
    """A module per kind of nesting, each `depth` levels deep."""
    return {
        "parentheses": MAIN_HEAD + "  return " + "(" * depth + "%x" + ")" * depth + "\n}",
        "tuples": (f"def @main(%x: {T2}) -> " + "Tuple[" * depth + T2 + "]" * depth + " {\n"
                   "  return " + "(" * depth + "%x" + ",)" * depth + "\n}"),
        "calls": MAIN_HEAD + "  return " + "relu(" * depth + "%x" + ")" * depth + "\n}",
        "attribute lists": MAIN_HEAD + "  return %x\n}\nmodule [a=" + "[" * depth + "1" + "]" * depth + "]",
        "tuple types": "def @main(%x: " + "Tuple[" * depth + T2 + "]" * depth + f") -> {T2};",
        "function types": "def @main(%x: " + "Fn[(), " * depth + T2 + "]" * depth + f") -> {T2};",
        "nested fn": (MAIN_HEAD + "".join(f"  %f{k} = fn () -> {T2} {{\n" for k in range(depth))
                      + "return %x\n}\n" * depth + "  return %x\n}"),
    }


def _with_deeper_stack(frames: int, function):
    """Call `function` from `frames` more stack frames, as a caller deep in its own code would."""
    if frames == 0:
        return function()
    return _with_deeper_stack(frames - 1, function)


@pytest.mark.parametrize("kind", list(nested_text(1)))
def test_nesting_at_the_limit_parses_prints_and_hashes(kind):
    text = nested_text(N)[kind]

    def check():
        mod = parse(text)
        round_trip(mod)
        round_trip(mod, show_types=True)

    # Headroom: it works even when called from 300 frames deep.
    _with_deeper_stack(300, check)


@pytest.mark.parametrize("kind", list(nested_text(1)))
@pytest.mark.parametrize("depth", [N + 1, 400])
def test_nesting_beyond_the_limit_is_a_parse_error(kind, depth):
    message = parse_error(nested_text(depth)[kind])
    assert re.fullmatch(rf"line \d+, col \d+: nesting deeper than {N} levels", message), message
    # The position is that of the opening that goes one level too deep.
    line, column = map(int, re.match(r"line (\d+), col (\d+)", message).groups())
    opening = nested_text(N + 1)[kind].splitlines()[line - 1][column - 1:]
    assert opening[:1] in ("(", "[") or opening.startswith("fn ")


def test_parse_literal_nesting_limit():
    assert parse_literal("[" * N + "1" + "]" * N) is not None
    with pytest.raises(ParseError, match=f"line 1, col {N + 1}: nesting deeper than {N} levels"):
        parse_literal("[" * (N + 1) + "1" + "]" * (N + 1))


def test_depth_without_brackets_is_limited_too():
    deep = "Tuple[" * N + T2 + "]" * N
    # A chain of N tuple indices is N levels deep: accepted and round-trips.
    chain = f"def @main(%t: {deep}) -> {T2} {{\n  return %t" + ".0" * N + "\n}"
    round_trip(parse(chain))
    # Wrapping a variable of the deepest type in a tuple makes a type one level too deep.
    wrapped = f"def @main(%t: {deep}) -> {T2} {{\n  %u = (%t,)\n  return %t" + ".0" * N + "\n}"
    assert parse_error(wrapped) == (f"line 2, col 8: the type of this expression is nested deeper "
                                    f"than {N} levels (Tuple[...] or Fn[...] inside one another)")
    # So does one binding after another, each a tuple of the one before.
    growing = MAIN_HEAD + "".join(f"  %a{k} = (%a{k - 1},)\n" for k in range(1, N + 2))
    growing = growing.replace("(%a0,)", "(%x,)") + "  return %x\n}"
    assert parse_error(growing).startswith(f"line {N + 2}, col 11: the type of this expression is nested")
    round_trip(parse(growing.replace(f"  %a{N + 1} = (%a{N},)\n", "")))
    # A chain inside a tuple: each within the limit, N + 1 levels of expression together.
    chained = (f"def @main(%t: {deep}) -> {T2} {{\n  %u = (%t" + ".0" * N + ",)\n  return %u.0\n}")
    assert parse_error(chained) == f"line 2, col 8: expression nested deeper than {N} levels"


def test_attribute_of_the_wrong_kind_is_named():
    assert parse_error(MAIN_HEAD + "  %y = cast(%x, dtype=[1])\n  return %y\n}") == (
        "line 2, col 8: cast: attribute dtype=[1] is not a dtype name (float64, float32, float16, "
        "bfloat16, int64, int32, int16, int8, uint8, bool)")
    assert parse_error(MAIN_HEAD + "  %y = cast(%x, dtype=1)\n  return %y\n}").startswith(
        "line 2, col 8: cast: attribute dtype=1 is not a dtype name")
    huge = "1" + "0" * 400  # an integer beyond the float64 range
    assert parse_error(MAIN_HEAD + f"  %y = leaky_relu(%x, alpha={huge})\n  return %y\n}}").startswith(
        "line 2, col 8: leaky_relu: attribute alpha=1000")
    assert "is not a number within the float64 range" in parse_error(
        MAIN_HEAD + f"  %y = leaky_relu(%x, alpha={huge})\n  return %y\n}}")


@pytest.mark.parametrize("attributes", ['"axis"=1, "axis"=0', "axis=1, axis=0", 'axis=1, "axis"=0'])
def test_an_attribute_given_twice_is_an_error(attributes):
    text = MAIN_HEAD + f"  %y = softmax(%x, {attributes})\n  return %y\n}}"
    assert parse_error(text) == f"line 2, col {20 + attributes.index(',') + 2}: attribute 'axis' is given twice"


def test_negative_metadata_index_is_an_error():
    assert parse_error(MAIN_HEAD + "  %y = relu(meta[-1])\n  return %y\n}") == (
        "line 2, col 18: expected a non-negative integer index but found '-1'")
    assert parse_error('metadata {\n  meta[-1] = Tensor[(1,), float32] "AACAPw=="\n}') == (
        "line 2, col 8: expected a non-negative integer index but found '-1'")


@pytest.mark.parametrize("literal", ["1e999", "-1e999", "1.5e400"])
def test_a_float_literal_that_overflows_is_an_error(literal):
    for body in (f"  %y = add(%x, const({literal}, float32))\n", f"  %y = leaky_relu(%x, alpha={literal})\n"):
        message = parse_error(MAIN_HEAD + body + "  return %y\n}")
        assert message.startswith("line 2, col ")
        assert message.endswith(f"the number {literal} overflows a 64-bit float (write inf for infinity)")
    # The words stay allowed, and mean infinity.
    mod = parse(MAIN_HEAD + "  %y = clip(%x, min=-inf, max=inf)\n  %z = add(%y, const([inf, -inf], float32))\n"
                "  return %z\n}")
    round_trip(mod)


def test_an_integer_with_too_many_digits_is_an_error():
    digits = "9" * 5000
    assert parse_error(MAIN_HEAD + f"  %y = softmax(%x, axis={digits})\n  return %y\n}}") == (
        f"line 2, col 25: the integer {digits[:37]}... has too many digits (5000)")


@pytest.mark.parametrize("dim, problem", [(2**63, "is too large"), (2**70, "is too large"), (-1, "is negative")])
def test_dimension_outside_int64_is_an_error(dim, problem):
    text = f"def @main(%x: Tensor[(2, {dim}), float32]) -> {T2};"
    assert parse_error(text) == (f"line 1, col 26: dimension {dim} {problem}; expected "
                                 f"0 <= dimension < 2**63 (9223372036854775808)")


def test_dimension_limits_of_tensor_types():
    largest = 2**63 - 1
    mod = parse(f"def @main(%x: Tensor[({largest},), int8]) -> {T2};")
    assert mod.functions["main"].params[0].type.shape == (largest,)
    round_trip(mod)
    # Each dim fits, but the element count does not.
    text = f"def @main(%x: Tensor[({2**62}, 4), int8]) -> {T2};"
    assert parse_error(text).startswith("line 1, col 15: tensor shape (4611686018427387904, 4) has "
                                        "18446744073709551616 elements; expected fewer than 2**63")
    with pytest.raises(TypeError, match="dimension 9223372036854775808 is too large"):
        TensorType((2**63,), F32)
    with pytest.raises(TypeError, match="dimension 2.5 is not an integer"):
        TensorType((2.5,), F32)
    with pytest.raises(TypeError, match="dimension True is not an integer"):
        TensorType((True,), F32)
    with pytest.raises(TypeError, match="negative dimension -3"):
        TensorType((2, -3), F32)
    assert TensorType((np.int64(3), 0, 2**62), F32).size == 0
    assert TensorType((2**31, 2**31), "int64").nbytes == 2**65  # exact, not wrapped to int64


def test_integer_attributes_beyond_int64_are_refused():
    """They reach generated C++ as int64_t literals: a larger one would not compile, or wrap."""
    text = """def @main(%x: Tensor[(4,), float32]) -> Tensor[(2,), float32] {
  %a = strided_slice(%x, begin=[0], end=[1180591620717411303424], strides=[1])
  return %a
}"""
    with pytest.raises(ParseError, match=r"line 2, col \d+: strided_slice: attribute end=.* is not a list of 64-bit"):
        parse(text)


def test_dumps_list_large_constants_by_digest_and_do_not_parse_back():
    """A build's IR dumps (elide_data_over) keep small constants' data and list larger ones
    by type and size; parsing such text names the constant that has no data."""
    from byoc.ir.printer import print_module
    from byoc.ir.builder import FunctionBuilder
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (64,), "float32")
        fb.ret(fb.call("multiply", fb.call("add", x, np.arange(64, dtype=np.float32)), np.full(2, 3, np.float32)[:1]))
    mod = fb.module()
    text = print_module(mod, elide_data_over=128)
    assert text == '''def @main(%x: Tensor[(64,), float32]) -> Tensor[(64,), float32] {
  %v1 = add(%x, meta[0])
  %v2 = multiply(%v1, const([3.0], float32))
  return %v2
}

metadata {
  meta[0] = Tensor[(64,), float32] elided(256 bytes)
}''', text
    with pytest.raises(ParseError, match=r"meta\[0\]'s data was left out when this text was printed"):
        parse(text)
    assert_structural_equal(parse(print_module(mod)), mod)  # with its data it round-trips
