"""PlanMemory: liveness from uses and greedy-by-size placement, on IR text."""
from byoc.ir import parse
from byoc.analysis import analyze_liveness
from byoc.transform.plan_memory import plan_memory

CHAIN = """
def @main(%x: Tensor[(256,), float32]) -> Tensor[(256,), float32] {
  %a = @f(%x)
  %b = @f(%a)
  %c = @f(%b)
  %d = @g(%a, %c)
  return %d
}
def @f(%p: Tensor[(256,), float32]) -> Tensor[(256,), float32] [Extern=1];
def @g(%p: Tensor[(256,), float32], %q: Tensor[(256,), float32]) -> Tensor[(256,), float32] [Extern=1];
"""


def lifetimes_by_name(func, exclude=()):
    return {l.var.name_hint: (l.first, l.last) for l in analyze_liveness(func, set(exclude))}


def test_liveness_from_first_definition_to_last_use():
    main = parse(CHAIN)["main"]
    # %a is read again by %d (binding 3); %d is the result, live to the end (4 bindings).
    assert lifetimes_by_name(main) == {"a": (0, 3), "b": (1, 2), "c": (2, 3), "d": (3, 4)}


def test_tuples_keep_their_fields_alive():
    main = parse("""
def @main(%x: Tensor[(64,), float32]) -> Tensor[(64,), float32] {
  %a = @f(%x)
  %b = @f(%x)
  %t = (%a, %b)
  %c = @f(%x)
  %u = %t.1
  %d = @g(%u, %c)
  return %d
}
def @f(%p: Tensor[(64,), float32]) -> Tensor[(64,), float32] [Extern=1];
def @g(%p: Tensor[(64,), float32], %q: Tensor[(64,), float32]) -> Tensor[(64,), float32] [Extern=1];
""")["main"]
    lifetimes = lifetimes_by_name(main)
    # %a is last read by the tuple; %b stays alive through %t and then %u = %t.1
    assert lifetimes["a"] == (0, 2) and lifetimes["b"] == (1, 5)
    assert "t" not in lifetimes and "u" not in lifetimes  # views are not storage


def test_plan_reuses_dead_storage_and_reports_bounds():
    main = parse(CHAIN)["main"]
    plan = plan_memory(main)
    offsets = {v.name_hint: o for v, o in plan.offsets.items()}
    # %b dies when %c is defined... but they overlap at binding 2, so %c cannot take %b's
    # slot; %d (defined at 3) can reuse %b's slot.
    assert offsets["b"] != offsets["a"] and offsets["c"] not in (offsets["a"], offsets["b"])
    assert offsets["d"] == offsets["b"]
    assert plan.no_reuse_bytes == 4 * 1024
    assert plan.lower_bound_bytes == 3 * 1024
    assert plan.planned_bytes == 3 * 1024


def test_excluded_outputs_are_not_planned():
    main = parse(CHAIN)["main"]
    d = main.bindings[3].var
    plan = plan_memory(main, exclude={d})
    assert d not in plan.offsets and plan.no_reuse_bytes == 3 * 1024


def test_view_calls_share_their_argument_storage_and_extend_its_life():
    """A call to a view symbol (a reshape the host runs as a view) gets no storage; the
    tensor it shows lives as long as the view is read."""
    main = parse("""
def @main(%x: Tensor[(64,), float32]) -> Tensor[(8, 8), float32] {
  %a = @f(%x)
  %v = @reshape_view(%a)
  %b = @f(%x)
  %c = @g2(%v, %b)
  return %c
}
def @f(%p: Tensor[(64,), float32]) -> Tensor[(64,), float32] [Extern=1];
def @reshape_view(%p: Tensor[(64,), float32]) -> Tensor[(8, 8), float32] [Extern=1];
def @g2(%p: Tensor[(8, 8), float32], %q: Tensor[(64,), float32]) -> Tensor[(8, 8), float32] [Extern=1];
""")["main"]
    assert lifetimes_by_name(main) == {"a": (0, 1), "v": (1, 3), "b": (2, 3), "c": (3, 4)}
    viewed = {l.var.name_hint: (l.first, l.last) for l in analyze_liveness(main, views={"reshape_view"})}
    assert viewed == {"a": (0, 3), "b": (2, 3), "c": (3, 4)}  # %a is alive while %v is read
    plan = plan_memory(main, views={"reshape_view"})
    offsets = {v.name_hint: o for v, o in plan.offsets.items()}
    assert "v" not in offsets and offsets["a"] != offsets["b"]


def test_a_tensor_no_machine_holds_is_a_build_error_not_a_wrapped_arena(tmp_path):
    """Expand to 2**62 + 16 floats: its byte size wraps 64 bits, and the arena it would
    get is a few bytes. The build names the tensor instead."""
    import numpy as np
    import pytest
    from onnx import TensorProto, helper, numpy_helper

    import byoc
    from byoc.errors import BuildError
    for shape in ([2**62 + 16], [2**31, 2**31]):
        nodes = [helper.make_node("Expand", ["x", "s"], ["expanded"]),
                 helper.make_node("ReduceSum", ["expanded"], ["y"], keepdims=0)]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                                  [numpy_helper.from_array(np.array(shape, np.int64), "s")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        with pytest.raises(BuildError, match=r"tensor 'expanded' of shape \(.*\) \(float32\) needs \d+ bytes"):
            byoc.build(model, config="cpu", workdir=str(tmp_path / "w"))
        sources = [p.name for p in (tmp_path / "w").rglob("*") if p.suffix in (".cc", ".cpp", ".cu", ".h")]
        assert not sources, sources  # refused before any backend wrote a size into C++
