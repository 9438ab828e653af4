"""Tests of structural equality and hashing: names do not matter, structure and values do."""
from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

from byoc.ir import (Binding, Call, Constant, ExternFunc, Function, FunctionBuilder, GlobalVar,
                     IRModule, TensorType, Tuple, TupleGetItem, Var, assert_structural_equal,
                     get_op, parse, structural_equal, structural_hash)
from byoc.ir import structural
from byoc.ir.types import FuncType


def tensor(*shape, dtype="float32") -> TensorType:
    return TensorType(shape, dtype)


def assert_equal_and_same_hash(a, b, **options):
    assert structural_equal(a, b, **options)
    assert structural_equal(b, a, **options)
    assert_structural_equal(a, b, **options)
    assert structural_hash(a) == structural_hash(b)


def assert_unequal(a, b, **options):
    assert not structural_equal(a, b, **options)
    assert not structural_equal(b, a, **options)
    with pytest.raises(AssertionError):
        assert_structural_equal(a, b, **options)


def mlp(names=("x", "w", "b", "h", "y"), weight=None, bias_value=0.5, alpha=0.1,
        attrs=None) -> Function:
    """x @ w + b -> leaky_relu; `names` are the variable names, which must not matter."""
    weight = np.arange(12, dtype=np.float32).reshape(4, 3) if weight is None else weight
    with FunctionBuilder(attrs=attrs) as fb:
        x = fb.param(names[0], (2, 4))
        w = fb.param(names[1], (4, 3))
        b = fb.param(names[2], (3,))
        h = fb.call("matmul", x, w, name=names[3])
        h2 = fb.call("add", h, Constant(weight[0]), name=names[4] + "_c")
        h3 = fb.call("add", h2, b)
        h4 = fb.call("add", h3, Constant(np.float32(bias_value)))
        fb.ret(fb.call("leaky_relu", h4, alpha=alpha, name=names[4]))
    return fb.func


# ---------------------------------------------------------------- equality


def test_alpha_renamed_functions_are_equal():
    assert_equal_and_same_hash(mlp(), mlp(names=("a", "b", "c", "d", "e")))


def test_a_function_equals_itself_and_its_parsed_text():
    func = mlp(attrs={"Composite": "dense"})
    assert_equal_and_same_hash(func, func)
    mod = IRModule({"main": func})
    assert_equal_and_same_hash(mod, parse(mod.script()))


def test_different_constants_are_unequal():
    base = mlp()
    other_weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    other_weight[0, 1] = 7.0
    assert_unequal(base, mlp(weight=other_weight))
    assert_unequal(base, mlp(bias_value=0.25))


def test_constants_compare_dtype_shape_and_exact_bytes():
    def wrap(constant):
        return Function([], [], constant, constant.type)

    one = Constant(np.ones(3, np.float32))
    assert_equal_and_same_hash(wrap(one), wrap(Constant(np.ones(3, np.float32))))
    assert_unequal(wrap(one), wrap(Constant(np.ones(3, np.float16))))
    assert_unequal(wrap(one), wrap(Constant(np.ones((3, 1), np.float32))))
    assert_unequal(wrap(Constant(np.float32(0.0))), wrap(Constant(np.float32(-0.0))))
    nan = np.array([np.nan], np.float32)
    payload_nan = np.array([0x7FC00001], np.uint32).view(np.float32)
    # NaN equals an identical NaN (bytes), but not a NaN with another payload.
    assert_equal_and_same_hash(wrap(Constant(nan)), wrap(Constant(nan.copy())))
    assert_unequal(wrap(Constant(nan)), wrap(Constant(payload_nan)))
    assert structural_hash(wrap(Constant(nan))) != structural_hash(wrap(Constant(payload_nan)))


def test_different_op_attributes_are_unequal():
    assert_unequal(mlp(alpha=0.1), mlp(alpha=0.2))


def test_different_function_attributes_are_unequal():
    assert_unequal(mlp(attrs={"Composite": "a"}), mlp(attrs={"Composite": "b"}))
    assert_unequal(mlp(attrs={"Composite": "a"}), mlp())
    assert_unequal(mlp(attrs={"Primitive": 1}), mlp(attrs={"Primitive": True}))
    assert_unequal(mlp(attrs={"Primitive": 1}), mlp(attrs={"Primitive": 1.0}))
    assert_equal_and_same_hash(mlp(attrs={"sizes": (1, 2)}), mlp(attrs={"sizes": [1, 2]}))
    assert_equal_and_same_hash(mlp(attrs={"eps": float("nan")}), mlp(attrs={"eps": float("nan")}))


def test_different_ops_are_unequal():
    x = Var("x", tensor(3))
    relu = Function([x], [], Call("relu", [x]))
    y = Var("y", tensor(3))
    negative = Function([y], [], Call("negative", [y]))
    assert_unequal(relu, negative)


def test_variables_are_matched_one_to_one():
    def add_of(first: int, second: int) -> Function:
        params = [Var("p", tensor(3)), Var("q", tensor(3))]
        result = Var("r", tensor(3))
        return Function(params, [Binding(result, Call("add", [params[first], params[second]]))], result)

    assert_equal_and_same_hash(add_of(0, 1), add_of(0, 1))
    assert_unequal(add_of(0, 1), add_of(1, 0))
    assert_unequal(add_of(0, 1), add_of(0, 0))


def test_parameter_types_must_match():
    x = Var("x", tensor(3))
    y = Var("y", tensor(3, dtype="float16"))
    assert_unequal(Function([x], [], x), Function([y], [], y))


def test_free_variables_match_only_when_mapped():
    a, b = Var("a", tensor(2)), Var("b", tensor(2))
    c, d = Var("c", tensor(2)), Var("d", tensor(2))
    assert structural_equal(Call("add", [a, b]), Call("add", [a, b]))
    assert not structural_equal(Call("add", [a, b]), Call("add", [c, d]))
    assert structural_equal(Call("add", [a, b]), Call("add", [c, d]), map_free_vars=True)
    # Mapping stays one to one: a->c then b->c is a mismatch.
    assert not structural_equal(Call("add", [a, b]), Call("add", [c, c]), map_free_vars=True)
    assert structural_hash(Call("add", [a, b])) == structural_hash(Call("add", [c, d]))
    # A free variable inside a function is used as is.
    outer = Var("outer", tensor(2))
    p, q = Var("p", tensor(2)), Var("q", tensor(2))
    assert not structural_equal(Function([p], [], Call("add", [p, outer])),
                                Function([q], [], Call("add", [q, a])))
    assert structural_equal(Function([p], [], Call("add", [p, outer])),
                            Function([q], [], Call("add", [q, outer])))


def test_globals_externs_tuples_and_nested_functions():
    def build(global_name="g", symbol="shim", index=1, composite="x") -> IRModule:
        p = Var("p", tensor(2))
        inner = Var("i", tensor(2))
        nested = Function([p], [Binding(inner, Call("relu", [p]))], inner, attrs={"Composite": composite})
        with FunctionBuilder() as fb:
            x = fb.param("x", (2,))
            f = fb.emit(nested)
            r = fb.call(f, x)
            c = fb.call(GlobalVar(global_name, FuncType((tensor(2),), tensor(2))), r)
            e = fb.call(ExternFunc(symbol), c, type_=tensor(2))
            t = fb.tuple(e, c)
            fb.ret(fb.get_item(t, index))
        mod = fb.module()
        a = Var("a", tensor(2))
        mod[global_name] = Function([a], None, None, tensor(2), attrs={"Extern": 1})
        return mod

    assert_equal_and_same_hash(build(), build())
    assert_unequal(build(), build(global_name="h"))
    assert_unequal(build(), build(symbol="other"))
    assert_unequal(build(), build(index=0))
    assert_unequal(build(), build(composite="y"))


def test_extern_call_result_types_are_compared():
    x = Var("x", tensor(2))
    first = Function([x], [], Call(ExternFunc("f"), [x], type_=tensor(2)), tensor(2))
    second = Function([x], [], Call(ExternFunc("f"), [x], type_=tensor(2, dtype="int64")),
                      tensor(2))
    assert_unequal(first, second)


def test_modules_compare_by_global_name_not_insertion_order():
    f, g = mlp(), mlp(alpha=0.3)
    assert_equal_and_same_hash(IRModule({"a": f, "b": g}), IRModule({"b": g, "a": f}))
    assert_unequal(IRModule({"a": f, "b": g}), IRModule({"a": g, "b": f}))
    assert_unequal(IRModule({"a": f}), IRModule({"a": f, "b": g}))
    assert_unequal(IRModule({"a": f}), IRModule({"c": f}))


def test_modules_functions_and_expressions_are_not_mixed():
    func = mlp()
    assert not structural_equal(IRModule({"main": func}), func)
    assert not structural_equal(func, func.result)


def test_extern_declaration_differs_from_a_definition():
    x = Var("x", tensor(2))
    assert_unequal(Function([x], None, None, tensor(2)), Function([x], [], x))


# ---------------------------------------------------------------- assertion message


def test_assertion_message_shows_the_path_and_both_texts():
    with pytest.raises(AssertionError) as info:
        assert_structural_equal(IRModule({"main": mlp(alpha=0.1)}), IRModule({"main": mlp(alpha=0.2)}))
    message = str(info.value)
    assert message.startswith("not structurally equal: at @main.bindings[4].value.attrs.alpha: "
                              "attribute values 0.1 vs 0.2")
    assert "--- first ---\ndef @main(" in message
    assert "leaky_relu(%v4, alpha=0.1)" in message
    assert "--- second ---\ndef @main(" in message
    assert "leaky_relu(%v4, alpha=0.2)" in message


def test_assertion_message_for_a_constant_mismatch_names_the_argument():
    with pytest.raises(AssertionError) as info:
        assert_structural_equal(mlp(bias_value=1.0), mlp(bias_value=2.0))
    assert "at .bindings[3].value.args[1]: constants of type Tensor[(), float32] hold different values" \
        in str(info.value)


# ---------------------------------------------------------------- hashing


def test_hash_differs_for_different_things():
    hashes = {structural_hash(mlp()), structural_hash(mlp(alpha=0.2)), structural_hash(mlp(bias_value=2.0)),
              structural_hash(mlp(attrs={"k": 1})), structural_hash(IRModule({"main": mlp()}))}
    assert len(hashes) == 5


def test_hash_is_stable_across_processes():
    script = ("import numpy as np\n"
              "from byoc.ir import Var, Function, Call, Constant, TensorType, structural_hash\n"
              "x = Var('x', TensorType((3,), 'float32'))\n"
              "f = Function([x], [], Call('add', [x, Constant(np.ones(3, np.float32))]), "
              "attrs={'Composite': 'c'})\n"
              "print(structural_hash(f))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=root)
        output = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                                text=True, check=True).stdout
        results.add(int(output))
    assert len(results) == 1


def test_constant_digest_is_cached_per_array_and_dropped_with_it():
    constant = Constant(np.arange(1000, dtype=np.float32))
    key = id(constant.data)
    first = structural.constant_digest(constant)
    assert key in structural._CONSTANT_DIGESTS
    assert structural.constant_digest(constant) == first
    assert structural.constant_digest(Constant(np.arange(1000, dtype=np.float32))) == first
    del constant
    gc.collect()
    assert key not in structural._CONSTANT_DIGESTS


def test_ops_compare_by_identity():
    x = Var("x", tensor(3))
    call = Call(get_op("relu"), [x])
    assert structural_equal(call, Call("relu", [x]))


def test_tuples_and_get_items_as_expressions():
    x, y = Var("x", tensor(2)), Var("y", tensor(3))
    assert structural_equal(TupleGetItem(Tuple([x, y]), 1), TupleGetItem(Tuple([x, y]), 1))
    assert not structural_equal(TupleGetItem(Tuple([x, y]), 1), TupleGetItem(Tuple([x, y]), 0))
    assert not structural_equal(Tuple([x, y]), Tuple([x]))


# ---------------------------------------------------------------- the parser's nesting limit


def _deepest_texts(names: str, innermost: str = "relu") -> dict[str, str]:
    """Modules nested as deep as the parser allows, with variables named after `names`."""
    from byoc.ir.parser import MAX_NESTING as depth
    t = "Tensor[(2,), float32]"
    head = f"def @main(%{names}: {t}) -> {t} {{\n"
    return {
        "calls": head + "  return " + "relu(" * (depth - 1) + f"{innermost}(%{names}" + ")" * depth + "\n}",
        "tuples": (f"def @main(%{names}: {t}) -> " + "Tuple[" * depth + t + "]" * depth + " {\n"
                   f"  %{names}1 = {innermost}(%{names})\n"
                   f"  return " + "(" * depth + f"%{names}1" + ",)" * depth + "\n}"),
        # depth - 1 functions, and the call's parentheses in the innermost one.
        "nested fn": (head + "".join(f"  %{names}{k} = fn (%{names}p{k}: {t}) -> {t} {{\n" for k in range(depth - 1))
                      + f"%{names}i = {innermost}(%{names}p{depth - 2})\nreturn %{names}i\n}}\n"
                      + "".join(f"return %{names}p{k}\n}}\n" for k in reversed(range(depth - 2)))
                      + f"  return %{names}\n}}"),
        "types and chains": (f"def @main(%{names}: " + "Tuple[" * depth + t + "]" * depth + f") -> {t} {{\n"
                             f"  %{names}1 = %{names}" + ".0" * depth + f"\n  %{names}2 = {innermost}(%{names}1)\n"
                             f"  return %{names}2\n}}"),
    }


def _from_deeper_stack(frames: int, function):
    if frames == 0:
        return function()
    return _from_deeper_stack(frames - 1, function)


@pytest.mark.parametrize("kind", list(_deepest_texts("a")))
def test_hash_and_equality_at_the_parser_nesting_limit(kind):
    """Whatever the parser accepts can be compared and hashed, with room to spare on the stack."""
    first = parse(_deepest_texts("a")[kind])
    renamed = parse(_deepest_texts("b")[kind])
    different = parse(_deepest_texts("c", innermost="sigmoid")[kind])

    def check():
        assert_equal_and_same_hash(first, renamed)
        assert_unequal(first, different)
        assert structural_hash(first) != structural_hash(different)
        with pytest.raises(AssertionError, match="calls to relu vs sigmoid"):
            assert_structural_equal(first, different)

    _from_deeper_stack(300, check)
