"""PlanMemory on IR text (before / after): liveness from uses, greedy placement per
memory space, storage written on every call, bounds on main."""
from byoc.ir import IRModule, assert_structural_equal, parse
from byoc.analysis import analyze_liveness
from byoc.transform.plan_memory import memory_plan, plan_memory, space_bytes, storage_of

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


def check(before: str, after: str, **options):
    """PlanMemory on IR text: the planned module prints as `after`."""
    result = plan_memory(before if isinstance(before, IRModule) else parse(before), **options)
    assert_structural_equal(result, parse(after))
    return result


def test_plan_reuses_dead_storage_and_reports_bounds():
    """%a, %b and %c are all live at binding 2 (%b is read there, %a later): three slots,
    the lower bound. The result %d goes straight into the caller's output 0."""
    planned = check(CHAIN, """
def @main(%x: Tensor[(256,), float32]) -> Tensor[(256,), float32] [storage_bytes=[3072], storage_lower_bound=[3072],
    storage_no_reuse=[3072], storage_spaces=["cuda"]] {
  %a = @f(%x, offset=0, size=1024, storage="cuda")
  %b = @f(%a, offset=1024, size=1024, storage="cuda")
  %c = @f(%b, offset=2048, size=1024, storage="cuda")
  %d = @g(%a, %c, output=0, storage="output")
  return %d
}
def @f(%p: Tensor[(256,), float32]) -> Tensor[(256,), float32] [Extern=1];
def @g(%p: Tensor[(256,), float32], %q: Tensor[(256,), float32]) -> Tensor[(256,), float32] [Extern=1];
""", default_device="cuda")
    plan = memory_plan(planned["main"], "cuda")
    assert plan.summary()["over_lower_bound"] == 1.0 and len(plan.lifetimes) == 3
    assert storage_of(planned["main"].bindings[3].value) == ("output", 0, 0)


def test_outputs_computed_into_the_arena_when_graphs_copy_them_out():
    """outputs_in_place=False (CUDA graphs in copy mode): %d gets an arena slot too; it
    lives to the end, and reuses %b's slot (dead since binding 2)."""
    check(CHAIN, """
def @main(%x: Tensor[(256,), float32]) -> Tensor[(256,), float32] [storage_bytes=[3072], storage_lower_bound=[3072],
    storage_no_reuse=[4096], storage_spaces=["cpu"]] {
  %a = @f(%x, offset=0, size=1024, storage="cpu")
  %b = @f(%a, offset=1024, size=1024, storage="cpu")
  %c = @f(%b, offset=2048, size=1024, storage="cpu")
  %d = @g(%a, %c, offset=1024, size=1024, storage="cpu")
  return %d
}
def @f(%p: Tensor[(256,), float32]) -> Tensor[(256,), float32] [Extern=1];
def @g(%p: Tensor[(256,), float32], %q: Tensor[(256,), float32]) -> Tensor[(256,), float32] [Extern=1];
""", outputs_in_place=False)


def test_view_calls_share_their_argument_storage_and_extend_its_life():
    """A call to a view symbol (a reshape the host runs as a view) gets no storage; the
    tensor it shows lives as long as the view is read."""
    before = """
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
"""
    main = parse(before)["main"]
    assert lifetimes_by_name(main) == {"a": (0, 1), "v": (1, 3), "b": (2, 3), "c": (3, 4)}
    viewed = {l.var.name_hint: (l.first, l.last) for l in analyze_liveness(main, views={"reshape_view"})}
    assert viewed == {"a": (0, 3), "b": (2, 3), "c": (3, 4)}  # %a is alive while %v is read
    check(before, """
def @main(%x: Tensor[(64,), float32]) -> Tensor[(8, 8), float32] [storage_bytes=[512], storage_lower_bound=[512],
    storage_no_reuse=[512], storage_spaces=["cpu"]] {
  %a = @f(%x, offset=0, size=256, storage="cpu")
  %v = @reshape_view(%a, storage="view")
  %b = @f(%x, offset=256, size=256, storage="cpu")
  %c = @g2(%v, %b, output=0, storage="output")
  return %c
}
def @f(%p: Tensor[(64,), float32]) -> Tensor[(64,), float32] [Extern=1];
def @reshape_view(%p: Tensor[(64,), float32]) -> Tensor[(8, 8), float32] [Extern=1];
def @g2(%p: Tensor[(8, 8), float32], %q: Tensor[(64,), float32]) -> Tensor[(8, 8), float32] [Extern=1];
""", views={"reshape_view"})


T4 = "Tensor[(4,), float32]"
HOST_IO = f"""
def @main(%x: {T4}) -> {T4} {{
  %x_cuda = device_copy(%x, src="cpu", dst="cuda")
  %a = @gpu(%x_cuda)
  %b = @gpu(%a)
  %b_cpu = device_copy(%b, src="cuda", dst="cpu/host-pinned")
  %s = @host(%b_cpu)
  %s_cuda = device_copy(%s, src="cpu/host-pinned", dst="cuda")
  %c = @gpu(%s_cuda)
  %d = @gpu(%c)
  %d_cpu = device_copy(%d, src="cuda", dst="cpu")
  return %d_cpu
}}
def @gpu(%p: {T4}) -> {T4} [Extern=1];
def @host(%p: {T4}) -> {T4} [Extern=1];
"""
# What PlanDevices leaves for a cuda build with host inputs and outputs and a function on
# the cpu (reading and writing pinned host memory): every space is planned in one call.
HOST_IO_PLANNED = f"""
def @main(%x: {T4}) -> {T4} [storage_bytes=[512, 512], storage_lower_bound=[512, 512],
    storage_no_reuse=[512, 1536], storage_spaces=["cpu/host-pinned", "cuda"]] {{
  %x_cuda = device_copy(%x, src="cpu", dst="cuda", storage="cuda", offset=0, size=16)
  %a = @gpu(%x_cuda, offset=256, size=16, storage="cuda")
  %b = @gpu(%a, offset=0, size=16, storage="cuda")
  %b_cpu = device_copy(%b, src="cuda", dst="cpu/host-pinned", storage="cpu/host-pinned", offset=0, size=16)
  %s = @host(%b_cpu, offset=256, size=16, storage="cpu/host-pinned")
  %s_cuda = device_copy(%s, src="cpu/host-pinned", dst="cuda", storage="cuda", offset=0, size=16)
  %c = @gpu(%s_cuda, offset=256, size=16, storage="cuda")
  %d = @gpu(%c, offset=0, size=16, storage="cuda")
  %d_cpu = device_copy(%d, src="cuda", dst="cpu", output=0, storage="output")
  return %d_cpu
}}
def @gpu(%p: {T4}) -> {T4} [Extern=1];
def @host(%p: {T4}) -> {T4} [Extern=1];
"""


def host_io_devices(mod):
    from byoc.transform.plan_devices import device_of_values
    return device_of_values(mod, "cuda", function_devices={"gpu": "cuda", "host": "cpu/host-pinned"},
                            input_devices="cpu")


def test_every_memory_space_in_one_call():
    before = parse(HOST_IO)
    planned = check(before, HOST_IO_PLANNED, devices=host_io_devices(before), default_device="cuda")
    assert space_bytes(planned["main"]) == {"cpu/host-pinned": 512, "cuda": 512}


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
