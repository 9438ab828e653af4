"""PinDevices: ops that must run on another device become builtin functions of their own.

Runs on main before partitioning. An op call is pinned to a device when

- a config pin names it: `{op: softmax, device: cpu}` pins every call of the op,
  `{node: "probs", device: cpu}` the call whose result variable is named so (a node pin
  wins over an op pin), or
- an `on_device(%v, device=S)` that constrains its body (constrain_body=true) reads the
  result %v of the op call: the user annotation says the op runs on S.

A pinned op whose device is the default device changes nothing (on the cpu target,
pinning to cpu leaves the program as it was). Any other becomes a builtin function with
Device="<device>", bound and called in place:

    %s = softmax(%x, axis=-1)
becomes
    %builtin_softmax = fn (%p0: T) -> T [Compiler="builtin", Composite="builtin.softmax", Device="cpu"] {
      %s = softmax(%p0, axis=-1)
      return %s
    }
    %s = %builtin_softmax(%x)

so that no other backend claims it, the builtin backend compiles it for that device,
and the Device attribute keeps it apart from equal functions on the default device when
functions are outlined and shared. Once functions are extern, PlanDevices reads the
pinned functions' devices as declared constraints and inserts the copies.

Leaves alone: every other binding (on_device annotations included: PlanDevices removes
them), other functions, attributes.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..ir.expr import Call, Function, Var
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.virtual_device import VirtualDevice


def pin_devices(mod: IRModule, pins=(), default_device="cpu") -> IRModule:
    """`pins`: [{"op" | "node": name, "device": VirtualDevice text}] (the config's
    devices.pin)."""
    from byoc.backends.builtin.partition import outline_op
    default_device = VirtualDevice.parse(default_device)
    main = mod["main"]
    by_op, by_node = {}, {}
    for pin in pins:
        device = VirtualDevice.parse(pin["device"])
        if "node" in pin:
            by_node[pin["node"]] = device
        else:
            by_op[pin["op"]] = device
    annotated = {}  # var read by a body-constraining on_device -> its device
    for binding in main.bindings:
        value = binding.value
        if _is_op(value, "on_device") and value.attrs["constrain_body"] and isinstance(value.args[0], Var):
            annotated[value.args[0]] = VirtualDevice.parse(value.attrs["device"])

    known_nodes = {b.var.name_hint for b in main.bindings}
    missing = sorted(name for name in by_node if name not in known_nodes)
    if missing:
        raise ConfigError(f"devices.pin: no node named {', '.join(repr(n) for n in missing)} in main "
                          f"(a node is named by the value it computes, as the IR prints it)")

    bindings, changed = [], False
    for binding in main.bindings:
        value = binding.value
        if not isinstance(value, Call) or not isinstance(value.op, Op) or value.op.category == "annotation":
            bindings.append(binding)
            continue
        device = by_node.get(binding.var.name_hint) or annotated.get(binding.var) or by_op.get(value.op.name)
        if device is None or device == default_device:
            bindings.append(binding)
            continue
        bindings.extend(outline_op(binding, {"Device": str(device)}))
        changed = True
    if not changed:
        return mod
    result = mod.copy()
    result["main"] = Function(main.params, bindings, main.result, main.ret_type, main.attrs)
    return result


def _is_op(value, name: str) -> bool:
    return isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == name
