"""PlanDevices on IR text (before / after), the devices config section, the build on the
cpu target (pinning leaves the program unchanged), and the cuda build (GPU tests)."""
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import byoc
import byoc.config
import byoc.target
from byoc.errors import ConfigError, DeviceConflictError, ParseError
from byoc.interpreter import interpret
from byoc.ir import assert_structural_equal, parse
from byoc.ir.virtual_device import VirtualDevice
from byoc.transform.plan_devices import FunctionDevices, device_of_values, plan_devices
from gpu_probe import gpu_present

T = "Tensor[(4,), float32]"
PARAMS = f"%x: {T}, %y: {T}"
FIXTURES = Path(__file__).parent / "fixtures"


def check(before: str, after: str, default="cuda", **options):
    result = plan_devices(parse(before), default, **options)
    assert_structural_equal(result, parse(after))
    return result


# ---------------------------------------------------------------- virtual devices and ops


def test_virtual_device_text_round_trips_and_errors():
    for text in ("cpu", "cuda", "cuda:1", "cpu/host-pinned"):
        assert str(VirtualDevice.parse(text)) == text
    assert VirtualDevice.parse("cuda:0/global") == VirtualDevice("cuda")
    with pytest.raises(ValueError, match="host-pinned.*needs device type cpu"):
        VirtualDevice.parse("cuda/host-pinned")
    with pytest.raises(ValueError, match="'tpu' is not one of cpu, cuda"):
        VirtualDevice.parse("tpu")


def test_annotations_are_identity_for_the_interpreter_and_check_their_devices():
    mod = parse(f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %b = on_device(%a, device="cpu", constrain_result=true)
  %c = device_copy(%b, src="cpu", dst="cuda")
  return %c
}}""")
    x, y = np.arange(4, dtype="float32"), np.ones(4, dtype="float32")
    np.testing.assert_array_equal(interpret(mod, x, y), x + y)
    with pytest.raises(ParseError, match="on_device: attribute device: device type 'gpu' is not one of cpu, cuda"):
        parse(f'def @main(%x: {T}) -> {T} {{\n  %a = on_device(%x, device="gpu")\n  return %a\n}}')


# ---------------------------------------------------------------- the four on_device forms


def test_standard_annotation_fixes_the_body_and_a_copy_follows():
    """on_device(%a, cpu): add runs on cpu (and its inputs arrive there); the result is
    free, so multiply takes the default device and reads a copy."""
    check(f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %b = on_device(%a, device="cpu")
  %c = multiply(%b, %b)
  return %c
}}""", f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %a_cuda = device_copy(%a, src="cpu", dst="cuda")
  %c = multiply(%a_cuda, %a_cuda)
  return %c
}}""")


def test_fixed_annotation_keeps_body_and_result_together():
    """constrain_result=true: the result is cpu too, so multiply runs on cpu: no copy."""
    result = check(f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %b = on_device(%a, device="cpu", constrain_result=true)
  %c = multiply(%b, %b)
  return %c
}}""", f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %c = multiply(%a, %a)
  return %c
}}""")
    devices = device_of_values(result, "cpu")
    assert {str(d) for d in devices.values()} == {"cpu"}


def test_free_annotation_copies_only_where_the_sides_differ():
    """constrain_body=false: body and result are planned apart. The body of %b follows its
    result (cuda, fixed by %d): no copy; the body of %f is a cpu extern function's
    result: a copy."""
    check(f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %b = on_device(%a, device="cpu", constrain_body=false)
  %c = multiply(%b, %b)
  %d = on_device(%c, device="cuda", constrain_result=true)
  %e = @host(%d)
  %f = on_device(%e, device="cpu", constrain_body=false)
  %g = relu(%f)
  %h = on_device(%g, device="cuda", constrain_result=true)
  return %h
}}
def @host(%p: {T}) -> {T} [Extern=1];""", f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %c = multiply(%a, %a)
  %c_cpu = device_copy(%c, src="cuda", dst="cpu")
  %e = @host(%c_cpu)
  %e_cuda = device_copy(%e, src="cpu", dst="cuda")
  %g = relu(%e_cuda)
  return %g
}}
def @host(%p: {T}) -> {T} [Extern=1];""", function_devices={"host": "cpu"})


def test_result_annotation_with_free_body():
    """constrain_body=false, constrain_result=true: the result is on cpu; a body fixed
    elsewhere (%a on cuda) is copied, a free body (%c) simply runs on cpu."""
    check(f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %a1 = on_device(%a, device="cuda", constrain_result=true)
  %b = on_device(%a1, device="cpu", constrain_body=false, constrain_result=true)
  %c = multiply(%b, %b)
  %d = on_device(%c, device="cpu", constrain_body=false, constrain_result=true)
  return %d
}}""", f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %a_cpu = device_copy(%a, src="cuda", dst="cpu")
  %c = multiply(%a_cpu, %a_cpu)
  return %c
}}""")


def test_on_the_default_device_annotations_just_disappear():
    before = f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %b = on_device(%a, device="cpu")
  %c = multiply(%b, %b)
  %d = on_device(%c, device="cpu", constrain_body=false, constrain_result=true)
  return %d
}}"""
    check(before, f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %c = multiply(%a, %a)
  return %c
}}""", default="cpu")


# ---------------------------------------------------------------- extern functions


EXTERNS = f"""
def @gpu(%p: {T}) -> {T} [Extern=1];
def @host(%p: {T}, %q: {T}) -> {T} [Extern=1];"""


def test_constraints_flow_out_of_extern_functions_into_free_ops():
    """@host reads and writes cpu memory: relu feeding it, and exp reading its result,
    run on cpu, although the default is cuda; nothing needs a copy."""
    check(f"""
def @main({PARAMS}) -> {T} {{
  %a = relu(%x)
  %b = @host(%a, %y)
  %c = exp(%b)
  return %c
}}{EXTERNS}""", f"""
def @main({PARAMS}) -> {T} {{
  %a = relu(%x)
  %b = @host(%a, %y)
  %c = exp(%b)
  return %c
}}{EXTERNS}""", function_devices={"host": "cpu", "gpu": "cuda"})


def test_extern_functions_on_two_devices_get_one_copy_per_value_and_device():
    """Inputs arrive on the host, the output is delivered to the host; %a is read twice
    on cpu but copied once; a parameter declared in pinned host memory gets a staging
    copy even from cpu memory (scopes differ)."""
    result = check(f"""
def @main({PARAMS}) -> {T} {{
  %a = @gpu(%x)
  %b = @host(%a, %y)
  %c = @gpu(%b)
  %d = @host(%a, %c)
  return %d
}}{EXTERNS}""", f"""
def @main({PARAMS}) -> {T} {{
  %x_cuda = device_copy(%x, src="cpu", dst="cuda")
  %y_cpu = device_copy(%y, src="cpu", dst="cpu/host-pinned")
  %a = @gpu(%x_cuda)
  %a_cpu = device_copy(%a, src="cuda", dst="cpu")
  %b = @host(%a_cpu, %y_cpu)
  %b_cuda = device_copy(%b, src="cpu", dst="cuda")
  %c = @gpu(%b_cuda)
  %c_cpu = device_copy(%c, src="cuda", dst="cpu/host-pinned")
  %d = @host(%a_cpu, %c_cpu)
  return %d
}}{EXTERNS}""", function_devices={
        "gpu": "cuda",
        "host": FunctionDevices((VirtualDevice("cpu"), VirtualDevice.parse("cpu/host-pinned")), VirtualDevice("cpu"))},
        input_devices="cpu", output_devices="cpu")
    devices = device_of_values(result, "cuda", function_devices={"gpu": "cuda", "host": "cpu"}, input_devices="cpu")
    by_name = {var.name_hint: str(device) for var, device in devices.items()}
    assert by_name["a"] == "cuda" and by_name["c_cpu"] == "cpu/host-pinned" and by_name["d"] == "cpu"


def test_outputs_delivered_elsewhere_are_copied_once():
    check(f"""
def @main({PARAMS}) -> Tuple[{T}, {T}] {{
  %a = @gpu(%x)
  return (%a, %a)
}}{EXTERNS}""", f"""
def @main({PARAMS}) -> Tuple[{T}, {T}] {{
  %a = @gpu(%x)
  %a_cpu = device_copy(%a, src="cuda", dst="cpu")
  return (%a_cpu, %a_cpu)
}}{EXTERNS}""", function_devices={"gpu": "cuda"}, output_devices="cpu")


# ---------------------------------------------------------------- conflicts


def test_two_fixed_constraints_that_disagree_name_both_sides():
    mod = parse(f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %b = on_device(%a, device="cpu", constrain_result=true)
  %c = multiply(%b, %y)
  %d = on_device(%c, device="cuda", constrain_result=true)
  return %d
}}""")
    with pytest.raises(DeviceConflictError) as error:
        plan_devices(mod, "cuda")
    message = str(error.value)
    assert "on_device at %b requires cpu" in message and "on_device at %d requires cuda" in message
    assert message.startswith("device conflict at %d = on_device(%c")


def test_conflict_between_an_op_and_an_extern_result():
    mod = parse(f"""
def @main({PARAMS}) -> {T} {{
  %a = @gpu(%x)
  %b = on_device(%y, device="cpu", constrain_result=true)
  %c = add(%a, %b)
  return %c
}}{EXTERNS}""")
    with pytest.raises(DeviceConflictError, match=r"the result of @gpu requires cuda, but on_device at %b "
                                                  r"requires cpu"):
        plan_devices(mod, "cuda", function_devices={"gpu": "cuda"})


# ---------------------------------------------------------------- PinDevices


def test_pin_devices_outlines_pinned_ops_into_builtin_functions_on_their_device():
    from byoc.transform.pin_devices import pin_devices
    before = f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %s = softmax(%a)
  %e = exp(%s)
  %n = on_device(%e, device="cpu")
  %r = relu(%n)
  return %r
}}"""
    after = f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %f = fn (%p0: {T}) -> {T} [Compiler="builtin", Composite="builtin.softmax", Device="cpu"] {{
    %s = softmax(%p0)
    return %s
  }}
  %s = %f(%a)
  %g = fn (%p0: {T}) -> {T} [Compiler="builtin", Composite="builtin.elementwise", Device="cpu"] {{
    %e = exp(%p0)
    return %e
  }}
  %e = %g(%s)
  %n = on_device(%e, device="cpu")
  %r = relu(%n)
  return %r
}}"""
    result = pin_devices(parse(before), [{"op": "softmax", "device": "cpu"}], "cuda")
    assert_structural_equal(result, parse(after))
    # on the default device nothing is pinned
    assert pin_devices(parse(before), [{"op": "softmax", "device": "cpu"}], "cpu").script() == parse(before).script()
    with pytest.raises(ConfigError, match="no node named 'nope'"):
        pin_devices(parse(before), [{"node": "nope", "device": "cpu"}], "cuda")


SPLIT = """
def @main(%x: Tensor[(4, 6), float32]) -> Tensor[(4, 2), float32] {
  %t = split(%x, axis=-1, sizes=[2, 2, 2])
  %q = %t.0
  %k = %t.1
  %s = add(%q, %k)
  return %s
}"""


def _pinned_ops(mod) -> list:
    """(result name, op, device) of each pinned function bound in main."""
    functions = {b.var: b.value for b in mod["main"].bindings if isinstance(b.value, byoc.ir.Function)}
    return [(b.var.name_hint, functions[b.value.op].bindings[0].value.op.name, functions[b.value.op].attrs["Device"])
            for b in mod["main"].bindings if getattr(b.value, "op", None) in functions]


@pytest.mark.parametrize("pin, pinned", [
    ({"op": "split"}, [("t_0", "strided_slice", "cpu"), ("t_1", "strided_slice", "cpu"),
                       ("t_2", "strided_slice", "cpu")]),
    ({"node": "t"}, [("t_0", "strided_slice", "cpu"), ("t_1", "strided_slice", "cpu"),
                     ("t_2", "strided_slice", "cpu")]),
    ({"node": "q"}, [("t_0", "strided_slice", "cpu")]),  # a tuple item of a split: its piece
    ({"node": "t_1"}, [("t_1", "strided_slice", "cpu")]),  # a piece, as partitioned.ir prints it
    ({"op": "strided_slice"}, []),  # the pieces of a split answer to op split only
])
def test_pin_devices_pins_splits_through_their_pieces(pin, pinned):
    from byoc.transform.pin_devices import pin_devices
    result = pin_devices(parse(SPLIT), [{**pin, "device": "cpu"}], "cuda")
    assert _pinned_ops(result) == pinned
    if pinned:
        assert "split(" not in result.script()
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(interpret(result, x), interpret(parse(SPLIT), x))


def test_a_pinned_split_builds_for_cuda(tmp_path):
    """Pinning ran before LowerSplit: the cpu split reached the builtin codegen whole
    ("op 'split' has no shim emitter")."""
    from byoc.pipeline import lower
    config = byoc.config.load_config("cpu", overrides={"target": "cuda -arch=sm_90", "workdir": str(tmp_path),
                                                        "devices": {"pin": [{"op": "split", "device": "cpu"}]}})
    mod = lower(parse(SPLIT), config, workdir=tmp_path)
    assert sorted(str(d.result) for d in mod.attrs["declared_devices"].values()) == ["cpu", "cpu", "cuda"]
    assert mod.script().count("device_copy(") == 3  # x to the host, both pieces back


@pytest.mark.parametrize("pins, pattern", [
    ([{"op": "softmax", "device": "cpu"}, {"op": "exp", "device": "cpu"}, {"op": "softmax", "device": "cuda"}],
     r"devices\.pin\[0\] \(op 'softmax', device cpu\) and devices\.pin\[2\] \(op 'softmax', device cuda\) pin "
     r"the same op to different devices"),
    ([{"node": "s", "device": "cpu"}, {"node": "s", "device": "cuda"}],
     r"devices\.pin\[0\] \(node 's', device cpu\) and devices\.pin\[1\] \(node 's', device cuda\) pin the same "
     r"node to different devices"),
    ([{"node": "q", "device": "cpu"}, {"node": "t", "device": "cuda"}],
     r"devices\.pin\[0\] \(node 'q', device cpu\) and devices\.pin\[1\] \(node 't', device cuda\) both pin "
     r"%t_0 \(a piece of a split\) to different devices"),
])
def test_conflicting_pins_name_both(pins, pattern):
    from byoc.transform.pin_devices import pin_devices
    text = SPLIT.replace("%s = add(%q, %k)", "%a = add(%q, %k)\n  %s = softmax(%a)")
    with pytest.raises(ConfigError, match=pattern):
        pin_devices(parse(text), pins, "cuda")
    same = [{"op": "softmax", "device": "cpu"}, {"op": "softmax", "device": "cpu"}]
    assert _pinned_ops(pin_devices(parse(text), same, "cuda")) == [("s", "softmax", "cpu")]


def test_node_pins_on_what_no_op_call_computes_are_refused():
    from byoc.transform.pin_devices import pin_devices
    text = f"""
def @main({PARAMS}) -> {T} {{
  %a = add(%x, %y)
  %t = (%a, %x)
  %i = %t.0
  %n = on_device(%i, device="cpu")
  %r = relu(%n)
  return %r
}}"""
    for node, what in (("i", "is item 0 of a tuple"), ("t", "is a tuple"), ("n", "is an on_device annotation")):
        with pytest.raises(ConfigError, match=rf"devices\.pin\[0\] \(node '{node}', device cpu\): '{node}' {what}.*only an op call can be "
                                              rf"pinned"):
            pin_devices(parse(text), [{"node": node, "device": "cpu"}], "cuda")
    with pytest.raises(ConfigError, match=r"no node named 'x' in main.*'x' is an input of main, not a node"):
        pin_devices(parse(text), [{"node": "x", "device": "cpu"}], "cuda")
    with pytest.raises(ConfigError, match=r"no node named 'ii' in main.*; did you mean 'i'\?"):
        pin_devices(parse(text), [{"node": "ii", "device": "cpu"}], "cuda")


def test_node_pins_take_the_model_name_or_the_printed_name():
    """ONNX `probs"x` prints as %probs_x: either names the node."""
    from byoc.ir import FunctionBuilder
    from byoc.transform.pin_devices import pin_devices
    with FunctionBuilder() as builder:
        x = builder.param("x", (4,))
        probs = builder.call("softmax", x, name='probs"x')
        builder.ret(builder.call("exp", probs, name="out"))
    mod = builder.module()
    assert "%probs_x = softmax" in mod.script()
    for name in ('probs"x', "probs_x"):
        result = pin_devices(mod, [{"node": name, "device": "cpu"}], "cuda")
        assert _pinned_ops(result) == [('probs"x', "softmax", "cpu")]
    with pytest.raises(ConfigError, match=r"pin the same node to different devices"):
        pin_devices(mod, [{"node": 'probs"x', "device": "cpu"}, {"node": "probs_x", "device": "cuda"}], "cuda")


# ---------------------------------------------------------------- the devices config section


@pytest.mark.parametrize("data, pattern", [
    ({"devices": [1]}, r"devices: \[1\] is not a mapping; allowed keys: pin, inputs, outputs"),
    ({"devices": {"input": "host"}}, r"devices\.input: unknown key; allowed: pin, inputs, outputs.*'inputs'"),
    ({"devices": {"inputs": "gpu"}}, r"devices\.inputs: 'gpu' is not allowed; allowed: device, host, host-pinned"),
    ({"devices": {"outputs": True}}, r"devices\.outputs: True is not allowed; allowed: device, host, host-pinned"),
    ({"devices": {"pin": {"op": "softmax"}}}, r"devices\.pin: .* is not a list"),
    ({"devices": {"pin": [{"op": "softmx", "device": "cpu"}]}},
     r"devices\.pin\[0\]\.op: unknown op 'softmx'.*did you mean 'softmax'"),
    ({"devices": {"pin": [{"op": "softmax", "device": "tpu"}]}},
     r"devices\.pin\[0\]\.device: 'tpu' is not allowed; allowed: cpu, cuda, cpu/host-pinned"),
    ({"devices": {"pin": [{"op": "softmax"}]}}, r"devices\.pin\[0\]\.device: missing; allowed: cpu, cuda"),
    ({"devices": {"pin": [{"op": "softmax", "node": "a", "device": "cpu"}]}},
     r"devices\.pin\[0\]: .* must name exactly one of op, node"),
    ({"devices": {"pin": [{"ops": "softmax", "device": "cpu"}]}}, r"devices\.pin\[0\]\.ops: unknown key.*'op'"),
])
def test_devices_config_errors_name_key_value_and_allowed(data, pattern):
    with pytest.raises(ConfigError, match=pattern):
        byoc.config.validate(data)


def test_devices_config_round_trips():
    data = {"devices": {"pin": [{"op": "softmax", "device": "cpu"}, {"node": "probs", "device": "cpu/host-pinned"}],
                        "inputs": "host-pinned", "outputs": "host"}}
    config = byoc.config.validate(data)
    assert config.devices == data["devices"]
    assert byoc.config.validate(config.to_dict()) == config
    assert byoc.config.validate({}).devices == {"pin": [], "inputs": "device", "outputs": "device"}


# ---------------------------------------------------------------- builds


def bert_inputs():
    data = np.load(FIXTURES / "bert2.npz")
    inputs = {key[3:]: data[key] for key in data if key.startswith("in_")}
    outputs = {key[4:]: data[key] for key in data if key.startswith("out_")}
    return inputs, outputs


PINNING = {"pin": [{"op": "softmax", "device": "cpu"}], "inputs": "host", "outputs": "host"}


def test_pinning_to_cpu_on_the_cpu_target_leaves_the_program_unchanged(tmp_path):
    inputs, expected = bert_inputs()
    shapes = {name: value.shape for name, value in inputs.items()}
    byoc.build(FIXTURES / "bert2.onnx", config="cpu", workdir=str(tmp_path / "plain"), input_shapes=shapes)
    pinned = byoc.build(FIXTURES / "bert2.onnx", config={**byoc.config.load_config("cpu").to_dict(),
                                                          "devices": PINNING},
                        workdir=str(tmp_path / "pinned"), input_shapes=shapes)
    final = (tmp_path / "pinned" / "final.ir").read_text()
    assert final == (tmp_path / "plain" / "final.ir").read_text()
    assert "device_copy" not in final and "on_device" not in final
    results = pinned.load().run(**inputs)
    for result, name in zip(results, expected, strict=True):
        np.testing.assert_allclose(result, expected[name], rtol=1e-4, atol=1e-4)


def minimum_copies(main, function_devices, input_device, output_device) -> int:
    """The fewest copies any program with these function placements needs: for every
    value, one per device other than its producer's that reads it (copies are seen
    through: a copy's reader reads the copied value)."""
    from byoc.ir.expr import Call, GlobalVar, Var
    source_of = {}
    producer = {param: input_device for param in main.params}
    readers = {}
    for binding in main.bindings:
        value = binding.value
        if value.op.__class__.__name__ == "Op" and value.op.name == "device_copy":
            source_of[binding.var] = source_of.get(value.args[0], value.args[0])
            continue
        assert isinstance(value, Call) and isinstance(value.op, GlobalVar)
        device = function_devices[value.op.name]
        producer[binding.var] = device
        for arg in value.args:
            if isinstance(arg, Var):
                readers.setdefault(source_of.get(arg, arg), set()).add(device)
    results = main.result.fields if hasattr(main.result, "fields") else (main.result,)
    for result in results:
        readers.setdefault(source_of.get(result, result), set()).add(output_device)
    return sum(len(devices - {producer[var]}) for var, devices in readers.items())


def lower_for_cuda(tmp_path, devices, **overrides):
    """The cuda build's IR stages (no compiler runs, no GPU needed)."""
    builder, mod, _, _ = lowered_for_cuda(tmp_path, devices, **overrides)
    return builder, mod


def lowered_for_cuda(tmp_path, devices, model="bert2", until=None, **overrides):
    """lower_for_cuda, and also the output names and the backends' artifacts: the
    pipeline (byoc.pipeline.lower) up to `until` (default: all of it, the host plan too)."""
    from byoc.pipeline import lower
    data = np.load(FIXTURES / f"{model}.npz")
    config = byoc.config.load_config("cpu", overrides={"target": "cuda -arch=sm_90", "workdir": str(tmp_path),
                                                        "devices": devices, **overrides})
    mod = lower(FIXTURES / f"{model}.onnx", config, until=until, workdir=tmp_path,
                input_shapes={key[3:]: data[key].shape for key in data if key.startswith("in_")})
    return Lowered(mod), mod, mod.attrs["output_names"], mod.attrs["artifacts"]


class Lowered:
    """What the tests read of a lowered module's attributes (byoc/pipeline.py lists them)."""

    def __init__(self, mod):
        self.mod = mod

    @property
    def declared_devices(self) -> dict:
        return self.mod.attrs["declared_devices"]

    @property
    def devices(self) -> dict:  # where each function runs: where it writes its result
        return {symbol: declared.result for symbol, declared in self.declared_devices.items()}

    @property
    def host(self):
        return self.mod.attrs["host_setup"]


def test_cuda_pipeline_inserts_the_minimum_number_of_copies(tmp_path):
    builder, mod = lower_for_cuda(tmp_path, PINNING)
    main = mod["main"]
    copies = [b for b in main.bindings if getattr(b.value.op, "name", None) == "device_copy"]
    softmax_symbols = {name for name, device in builder.devices.items() if device.device_type == "cpu"}
    assert len(softmax_symbols) == 1  # both layers' softmax share one cpu function
    calls_on_cpu = [b for b in main.bindings if getattr(b.value.op, "name", None) in softmax_symbols]
    assert len(calls_on_cpu) == 2
    expected = minimum_copies(main, builder.devices, VirtualDevice("cpu"), VirtualDevice("cpu"))
    assert len(copies) == expected
    # two inputs to the device, in and out of each softmax, two outputs to the host
    assert expected == len(main.params) + 2 * len(calls_on_cpu) + 2
    assert "on_device" not in mod.script()


def test_cuda_pipeline_without_pins_has_no_copies(tmp_path):
    _, mod = lower_for_cuda(tmp_path, {"pin": [], "inputs": "device", "outputs": "device"})
    assert "device_copy" not in mod.script()


def test_cuda_graph_regions_leave_cpu_functions_and_copies_between_them(tmp_path):
    """bert2 with its softmaxes on the cpu and host inputs and outputs, graphs on: the
    calls form captured regions (GPU functions only) with the copies and the cpu softmax
    between them, run directly; the regions cover every call once, in order, and the
    program table carries them."""
    import struct
    from byoc.codegen.program_table import program_table
    builder, mod, output_names, artifacts = lowered_for_cuda(tmp_path, PINNING, cuda_graph=True)
    host = builder.host
    calls, regions = host.plan.calls, host.plan.regions
    assert host.cuda_graph and host.devices
    assert [(r["first"], r["count"]) for r in regions] == \
        [(sum(r["count"] for r in regions[:i]), r["count"]) for i, r in enumerate(regions)]
    assert sum(r["count"] for r in regions) == len(calls)
    cpu_symbols = {symbol for symbol, device in builder.devices.items() if device.device_type == "cpu"}
    for region in regions:
        members = calls[region["first"]:region["first"] + region["count"]]
        direct = [c["kind"] == "copy" or c["symbol"] in cpu_symbols for c in members]
        assert all(direct) if not region["capture"] else not any(direct), region
    # the three inputs' copies (bound first by PlanDevices), then per layer: the scores to
    # the host, softmax, the probabilities back; the outputs' copies last
    assert [r["capture"] for r in regions] == [False, True] * 3 + [False]
    assert [r["count"] for r in regions if not r["capture"]] == [3, 3, 3, 2]
    why = (tmp_path / "cuda_graph.txt").read_text()
    assert "3 CUDA graph region(s)" in why and "runs on the cpu" in why and "a copy between memories" in why
    # the program table carries them: header, refs, calls, then the region records
    table = program_table(host.plan)
    num_calls, num_refs, num_regions = struct.unpack_from("<3I", table, 8)
    start = 40 + 24 * num_refs + 40 * num_calls
    assert num_calls == len(calls) and num_regions == len(regions)
    assert [struct.unpack_from("<3I", table, start + 16 * i) for i in range(num_regions)] == \
        [(r["first"], r["count"], int(r["capture"])) for r in regions]
    written = (tmp_path / "cuda_graph.ir").read_text()
    assert written.count("[CUDAGraph=1]") == 3


# The mlp fixture with its GELU on the cpu and its inputs and outputs in host memory: two
# GPU regions (fc1; fc2, relu, fc3) around the copies and the cpu GELU.
TWO_REGIONS = {"pin": [{"op": "gelu", "device": "cpu"}], "inputs": "host", "outputs": "host"}


def test_two_device_regions_around_a_cpu_function_in_a_whole_build(tmp_path):
    """The input's copy, then fc1 captured, then the copy to the host, the cpu GELU and the
    copy back run directly, then fc2, relu and fc3 captured, then the output's copy."""
    builder, mod, output_names, artifacts = lowered_for_cuda(tmp_path, TWO_REGIONS, model="mlp", cuda_graph=True)
    host = builder.host
    regions = host.plan.regions
    assert [(r["count"], r["capture"]) for r in regions] == \
        [(1, False), (2, True), (3, False), (4, True), (1, False)]
    gelu = next(symbol for symbol, device in builder.devices.items() if device.device_type == "cpu")
    direct = [host.plan.calls[i]["symbol"] for r in regions if not r["capture"]
              for i in range(r["first"], r["first"] + r["count"])]
    assert direct == ["device_copy", "device_copy", gelu, "device_copy", "device_copy"]
    assert "2 CUDA graph region(s): 2 calls, 4 calls" in (tmp_path / "cuda_graph.txt").read_text()


def gpu_visible() -> bool:
    return gpu_present() and byoc.target.visible_gpu_arch() is not None


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
def test_bert_with_softmax_on_cpu_and_host_inputs_runs_on_gpu(tmp_path):
    inputs, expected = bert_inputs()
    library = byoc.build(FIXTURES / "bert2.onnx", config={"target": "auto", "devices": PINNING},
                         workdir=str(tmp_path), input_shapes={n: v.shape for n, v in inputs.items()})
    final = (tmp_path / "final.ir").read_text()
    assert final.count("device_copy(") == len(inputs) + 2 * 2 + 2  # inputs in; softmax out and back; outputs
    results = library.load().run(**inputs)  # numpy inputs and outputs: host memory
    for result, name in zip(results, expected, strict=True):
        np.testing.assert_allclose(np.asarray(result), expected[name], rtol=2e-3, atol=2e-3)


def test_cpu_shim_renames_cover_every_shim_function():
    """A cuda build links the CPU shim (for pinned functions) beside the CUDA shim: every
    C function of byoc_shim.h must be renamed for the CPU copy."""
    from byoc.backends.builtin import CPU_SHIM_SYMBOLS, SHIM_DIR
    declared = set(re.findall(r"\b(byoc_shim_[a-z0-9_]+)\s*\(", (SHIM_DIR / "byoc_shim.h").read_text()))
    renamed = set(re.findall(r"#define (byoc_shim_[a-z0-9_]+) byoc_cpu_shim_", CPU_SHIM_SYMBOLS.read_text()))
    assert declared and declared == renamed


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
def test_two_graph_regions_around_a_cpu_function_match_direct_runs_over_fresh_inputs(tmp_path):
    """The two-region mlp (TWO_REGIONS): graphs on capture exactly two regions, and 100 runs
    on fresh inputs (new values and new host buffers each time) agree bit for bit with
    the same build without graphs, and with onnxruntime on the fixture's input."""
    data = np.load(FIXTURES / "mlp.npz")
    libraries = {graph: byoc.build(FIXTURES / "mlp.onnx", config={"target": "auto", "devices": TWO_REGIONS,
                                                                   "cuda_graph": graph},
                                   workdir=str(tmp_path / str(graph)))
                 for graph in (True, False)}
    regions = libraries[True].metadata["cuda_graph_regions"]
    assert [r["captured"] for r in regions] == [False, True, False, True, False]
    modules = {graph: library.load() for graph, library in libraries.items()}
    got = np.asarray(modules[True].run(x=data["in_x"]))
    assert np.max(np.abs(got - data["out_y"])) <= 1e-3 * np.max(np.abs(data["out_y"]))
    rng = np.random.default_rng(0)
    for _ in range(100):
        x = rng.standard_normal(data["in_x"].shape).astype(np.float32)
        assert np.array_equal(np.asarray(modules[True].run(x=x)), np.asarray(modules[False].run(x=x)))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
def test_graph_regions_around_cpu_functions_match_direct_runs_over_fresh_inputs(tmp_path):
    """bert2 with its softmaxes on the cpu and host inputs and outputs: with graphs on, the
    three GPU regions are captured and replayed between the copies and the cpu softmaxes,
    and 100 runs on fresh inputs (new values and new host buffers each time) agree bit for
    bit with the same build without graphs."""
    inputs, _ = bert_inputs()
    shapes = {name: value.shape for name, value in inputs.items()}
    libraries = {graph: byoc.build(FIXTURES / "bert2.onnx",
                                   config={"target": "auto", "devices": PINNING, "cuda_graph": graph},
                                   workdir=str(tmp_path / str(graph)), input_shapes=shapes)
                 for graph in (True, False)}
    regions = libraries[True].metadata["cuda_graph_regions"]
    assert sum(r["captured"] for r in regions) == 3 and "cuda_graph_regions" not in libraries[False].metadata
    modules = {graph: library.load() for graph, library in libraries.items()}
    rng = np.random.default_rng(0)
    for _ in range(100):
        fresh = {"input_ids": rng.integers(0, 1000, size=shapes["input_ids"]).astype(inputs["input_ids"].dtype),
                 "token_type_ids": rng.integers(0, 2, size=shapes["token_type_ids"]).astype(
                     inputs["token_type_ids"].dtype),
                 "attention_mask": (rng.random(shapes["attention_mask"]) < 0.8).astype(inputs["attention_mask"].dtype)}
        fresh["attention_mask"][:, 0] = 1
        with_graphs, direct = (modules[graph].run(**fresh) for graph in (True, False))
        for a, b in zip(with_graphs, direct):
            assert np.array_equal(np.asarray(a), np.asarray(b))


def test_numbered_gpus_are_devices_of_their_own():
    """cuda:1 is representable: a function declared there gets its argument copied from
    cuda (cuda:0) and its result copied back, like any other device."""
    check(f"""
def @main({PARAMS}) -> {T} {{
  %a = @gpu(%x)
  %b = @gpu1(%a)
  %c = @gpu(%b)
  return %c
}}
def @gpu(%p: {T}) -> {T} [Extern=1];
def @gpu1(%p: {T}) -> {T} [Extern=1];""", f"""
def @main({PARAMS}) -> {T} {{
  %a = @gpu(%x)
  %a_cuda = device_copy(%a, src="cuda", dst="cuda:1")
  %b = @gpu1(%a_cuda)
  %b_cuda = device_copy(%b, src="cuda:1", dst="cuda")
  %c = @gpu(%b_cuda)
  return %c
}}
def @gpu(%p: {T}) -> {T} [Extern=1];
def @gpu1(%p: {T}) -> {T} [Extern=1];""", function_devices={"gpu": "cuda", "gpu1": "cuda:1"})


def test_a_pin_to_another_gpu_is_refused_by_name_where_one_gpu_runs_the_model(tmp_path):
    """The config takes cuda:1 and the IR carries it (copies to and from it); the host
    code, which drives one GPU, names the value it cannot place."""
    with pytest.raises(byoc.ConfigError, match=r"devices.pin\[0\].device: 'gpu:1' is not allowed"):
        byoc.config.load_config("cpu", overrides={"devices": {"pin": [{"op": "softmax", "device": "gpu:1"}]}})
    devices = {"pin": [{"op": "softmax", "device": "cuda:1"}], "inputs": "device", "outputs": "device"}
    _, mod, _, _ = lowered_for_cuda(tmp_path, devices, until="plan_memory")
    assert 'dst="cuda:1"' in mod.script()
    with pytest.raises(byoc.BuildError, match=r"Add_output_0_cuda is placed in memory space 'cuda:1' "
                                              r"\(devices.pin\), which this build cannot hold: its model runtime "
                                              r"drives one device \(cuda\) and the host"):
        lowered_for_cuda(tmp_path, devices)


def test_lowered_functions_declare_where_each_parameter_is(tmp_path):
    """A backend's artifact says its functions read their parameter from pinned host
    memory and write their result on the GPU (memory scopes flowing out of lowering):
    PlanDevices copies each argument there, and nothing back."""
    from byoc.backend import Artifact, PatternEntry, registered
    from byoc.ir.virtual_device import CUDA, HOST_PINNED
    from byoc.pattern import is_op, wildcard
    from byoc.transform.plan_devices import FunctionDevices

    def codegen(functions, target):
        return [Artifact(backend="scoped", kind="shim", symbols=list(functions),
                         devices={symbol: FunctionDevices((HOST_PINNED,), CUDA) for symbol in functions})]
    from byoc import target as target_module
    target_module.register_target_kind("scoped", {})
    try:
        with registered(name="scoped", flavor="shim", patterns=[PatternEntry("softmax", is_op("softmax")(wildcard()))],
                        codegen=codegen):
            builder, mod, _, _ = lowered_for_cuda(tmp_path, {"pin": [], "inputs": "device", "outputs": "device"},
                                                  backends=["scoped", "builtin"])
    finally:
        del target_module.TARGET_KINDS["scoped"]
    main = mod["main"]
    scoped = {symbol for symbol, device in builder.declared_devices.items() if device.params == (HOST_PINNED,)}
    calls = [b for b in main.bindings if getattr(b.value.op, "name", None) in scoped]
    assert len(calls) == 2  # bert2's two softmaxes
    copies = {b.var: b.value for b in main.bindings if getattr(b.value.op, "name", None) == "device_copy"}
    for call in calls:
        argument = call.value.args[0]
        assert copies[argument].attrs["dst"] == "cpu/host-pinned" and copies[argument].attrs["src"] == "cuda"
    assert all(copy.attrs["dst"] == "cpu/host-pinned" for copy in copies.values())  # results stay on the GPU
    assert builder.devices[calls[0].value.op.name] == CUDA  # it runs where it writes its result


def test_a_gpu_function_declaring_a_parameter_in_pageable_memory_is_refused_at_build_time(tmp_path):
    """A backend that declares a GPU function's parameter on the cpu (pageable memory, which
    no kernel can read): the build names the function and the operand, instead of making a
    library whose program table every create refuses as corrupted."""
    from byoc import target as target_module
    from byoc.backend import Artifact, PatternEntry, registered
    from byoc.ir.virtual_device import CPU, CUDA
    from byoc.pattern import is_op, wildcard
    from byoc.transform.plan_devices import FunctionDevices

    def codegen(functions, target):
        return [Artifact(backend="scoped", kind="shim", symbols=list(functions),
                         devices={symbol: FunctionDevices((CPU,), CUDA) for symbol in functions})]
    target_module.register_target_kind("scoped", {})
    try:
        with registered(name="scoped", flavor="shim", patterns=[PatternEntry("softmax", is_op("softmax")(wildcard()))],
                        codegen=codegen):
            with pytest.raises(byoc.BuildError, match=r"@\w+ runs on the GPU, but operand 0 is in HostArena "
                                                      r"\(pageable host memory\), which it cannot reach"):
                lowered_for_cuda(tmp_path, {"pin": [], "inputs": "device", "outputs": "device"},
                                 backends=["scoped", "builtin"])
    finally:
        del target_module.TARGET_KINDS["scoped"]


def test_copy_mode_graphs_leave_host_inputs_where_the_caller_has_them(tmp_path):
    """With graphs copying the caller's tensors, only inputs on the device are staged into
    the arena: a host input is read by its copy to the GPU and by cpu functions, which run
    between graphs, so a cpu function that reads it gets the caller's host pointer."""
    devices = {"pin": [{"op": "matmul", "device": "cpu"}], "inputs": "host", "outputs": "host"}
    builder, mod, output_names, artifacts = lowered_for_cuda(tmp_path, devices, model="mlp", cuda_graph=True)
    host = builder.host
    assert host.graph_io == "copy" and host.plan.input_copies == []
    readers = [call for call in host.plan.calls if any((a.space, a.offset) == ("kInput", 0) for a in call["args"])]
    assert readers and all(call["on_host"] for call in readers)
    assert readers[0]["sync_before"]  # the previous run's GPU work may still use the host arenas


def test_a_lowered_function_declaring_the_wrong_number_of_parameter_devices_is_a_build_error(tmp_path):
    from byoc import target as target_module
    from byoc.backend import Artifact, PatternEntry, registered
    from byoc.ir.virtual_device import CUDA, HOST_PINNED
    from byoc.pattern import is_op, wildcard
    from byoc.transform.plan_devices import FunctionDevices

    def codegen(functions, target):  # softmax has one parameter; two devices are declared
        return [Artifact(backend="scoped", kind="shim", symbols=list(functions),
                         devices={symbol: FunctionDevices((HOST_PINNED, CUDA), CUDA) for symbol in functions})]
    target_module.register_target_kind("scoped", {})
    try:
        with registered(name="scoped", flavor="shim", patterns=[PatternEntry("softmax", is_op("softmax")(wildcard()))],
                        codegen=codegen):
            with pytest.raises(byoc.BuildError, match=r"backend 'scoped' declares the devices of @\w+ as "
                                                      r"FunctionDevices\(.*\); expected a FunctionDevices with one "
                                                      r"device for each of its 1 parameter\(s\)"):
                lowered_for_cuda(tmp_path, {"pin": [], "inputs": "device", "outputs": "device"},
                                 backends=["scoped", "builtin"])
    finally:
        del target_module.TARGET_KINDS["scoped"]
