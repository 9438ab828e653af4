"""PinDevices: ops that must run on another device become builtin functions of their own.

Runs on main before partitioning. An op call is pinned to a device when

- a config pin names it: `{op: softmax, device: cpu}` pins every call of the op,
  `{node: "probs", device: cpu}` the call whose result variable is named so (a node pin
  wins over an op pin), or
- an `on_device(%v, device=S)` that constrains its body (constrain_body=true) reads the
  result %v of the op call: the user annotation says the op runs on S.

A node is named by the value it computes: its name in the model (the ONNX output name),
or its name as the IR prints it (`probs"x` prints as `%probs_x`: either names it). Two
pins of one op, or of one node, to different devices are a ConfigError naming both.

Splits: a builtin function returns one tensor, so a split cannot be outlined whole.
Pinning lowers the splits of main first (LowerSplit: one strided_slice per piece), and
then a split pinned by op (`{op: split}`) or by node (the split's tuple), or a value
taken out of a split (`%q = %t.0`, what an ONNX Split output is), pins its pieces. A node
pin on any other binding that is not an op call (a tuple item of another tuple, a
tuple, a call of a global function) is a ConfigError: only op calls can be pinned.

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
them), other functions, attributes; a module where nothing is pinned off the default
device is returned as it is (its splits too).
"""
from __future__ import annotations

import difflib

from ..errors import ConfigError
from ..ir.expr import Call, Function, GlobalVar, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.virtual_device import VirtualDevice


def pin_devices(mod: IRModule, pins=(), default_device="cpu") -> IRModule:
    """`pins`: [{"op" | "node": name, "device": VirtualDevice text}] (the config's
    devices.pin, in its order: messages name a pin as devices.pin[index])."""
    from ..backend import FALLBACK, get_backend
    outline_op = get_backend(FALLBACK).outline_op
    from .lower_split import lower_split_with_pieces
    default_device = VirtualDevice.parse(default_device)
    main = mod["main"]
    by_op, by_node = _read_pins(pins)
    if not pins and not any(_is_op(b.value, "on_device") for b in main.bindings):
        return mod
    lowered, pieces, items = lower_split_with_pieces(main)
    # A value taken out of a split is its piece; a split's tuple is all its pieces.
    def targets_of(var):
        if var in items:
            return [items[var]]
        return pieces.get(var, [var])

    pinned = {}  # var of an op call in `lowered` -> (device, the node pin that pins it)
    for var, (device, where) in _resolve_nodes(main, lowered, by_node, pieces, items).items():
        for target in targets_of(var):
            if target in pinned and pinned[target][0] != device:
                raise ConfigError(f"{pinned[target][1]} and {where} both pin %{target.name_hint} (a piece of a "
                                  f"split) to different devices; expected one device per node (remove one "
                                  f"of the pins)")
            pinned[target] = (device, where)
    annotated = {}  # var read by a body-constraining on_device -> its device
    for binding in main.bindings:
        value = binding.value
        if _is_op(value, "on_device") and value.attrs["constrain_body"] and isinstance(value.args[0], Var):
            for target in targets_of(value.args[0]):
                annotated[target] = VirtualDevice.parse(value.attrs["device"])
    split_pieces = {piece for split in pieces.values() for piece in split}  # op pins see them as split

    bindings, changed = [], False
    for binding in lowered.bindings:
        value = binding.value
        if not isinstance(value, Call) or not isinstance(value.op, Op) or value.op.category == "annotation":
            bindings.append(binding)
            continue
        node_pin = pinned.get(binding.var)
        op_pin = by_op.get("split" if binding.var in split_pieces else value.op.name)
        device = node_pin[0] if node_pin else annotated.get(binding.var) or (op_pin[0] if op_pin else None)
        if device is None or device == default_device:
            bindings.append(binding)
            continue
        bindings.extend(outline_op(binding, {"Device": str(device)}))
        changed = True
    if not changed:
        return mod
    return mod.with_function("main", Function(lowered.params, bindings, lowered.result, lowered.ret_type,
                                              lowered.attrs))


def _describe(index: int, pin: dict) -> str:
    selector = "node" if "node" in pin else "op"
    return f"devices.pin[{index}] ({selector} {pin[selector]!r}, device {pin['device']})"


def _read_pins(pins) -> tuple[dict, dict]:
    """{op name: (device, description)} and {node name: (device, description)}; the same
    op or node pinned to two devices is a ConfigError naming both pins."""
    by_op, by_node = {}, {}
    for index, pin in enumerate(pins):
        device = VirtualDevice.parse(pin["device"])
        selector = "node" if "node" in pin else "op"
        table = by_node if selector == "node" else by_op
        where = _describe(index, pin)
        earlier = table.get(pin[selector])
        if earlier is not None and earlier[0] != device:
            raise ConfigError(f"{earlier[1]} and {where} pin the same {selector} to different devices; "
                              f"expected one device per {selector} (remove one of the pins)")
        table.setdefault(pin[selector], (device, where))
    return by_op, by_node


def _resolve_nodes(main: Function, lowered: Function, by_node: dict, pieces: dict, items: dict) -> dict:
    """Var -> (device, description) for each node pin: the bindings of `main` (or split
    pieces of `lowered`) whose name is the pinned name, else the one that prints so."""
    if not by_node:
        return {}
    all_pieces = {piece for split in pieces.values() for piece in split}
    candidates = list(main.bindings) + [b for b in lowered.bindings if b.var in all_pieces]
    by_name: dict[str, list] = {}
    for binding in candidates:
        by_name.setdefault(binding.var.name_hint, []).append(binding)
    printed = None
    resolved = {}
    for name, (device, where) in by_node.items():
        found = by_name.get(name)
        if not found:
            if printed is None:
                printed = _printed_names(main)
            found = [b for b in main.bindings if printed.get(b.var) == name]
        if not found:
            inputs = [p.name_hint for p in main.params]
            hint = (f"; {name!r} is an input of main, not a node" if name in inputs else
                    "".join(f"; did you mean {match!r}?" for match in
                            difflib.get_close_matches(name, list(by_name) + list(printed.values()), n=1)))
            raise ConfigError(f"{where}: no node named {name!r} in main (a node is named by the value it "
                              f"computes: its name in the model, or as the IR prints it){hint}")
        for binding in found:
            problem = _not_pinnable(binding, pieces, items)
            if problem is not None:
                raise ConfigError(f"{where}: {name!r} {problem}; only an op call can be pinned: pin the op "
                                  f"call that computes it")
            if binding.var in resolved and resolved[binding.var][0] != device:
                raise ConfigError(f"{resolved[binding.var][1]} and {where} pin the same node to different "
                                  f"devices; expected one device per node (remove one of the pins)")
            resolved[binding.var] = (device, where)
    return resolved


def _not_pinnable(binding, pieces: dict, items: dict) -> str | None:
    """Why a node pin cannot apply to `binding`, or None when it can."""
    value = binding.value
    if binding.var in pieces or binding.var in items:
        return None  # a split, or a value taken out of one: its pieces are pinned
    if isinstance(value, TupleGetItem):
        return f"is item {value.index} of a tuple, which no single op call computes"
    if isinstance(value, Call) and isinstance(value.op, Op):
        if value.op.category == "annotation":
            return f"is an {value.op.name} annotation, not an op call"
        return None
    if isinstance(value, Tuple):
        return "is a tuple, not an op call"
    if isinstance(value, Call) and isinstance(value.op, GlobalVar):
        return f"is a call of the global function @{value.op.name}, not an op call"
    return f"is a {type(value).__name__}, not an op call"


def _printed_names(main: Function) -> dict:
    """Var -> its name as the IR printer prints main (sanitized, made unique)."""
    from ..ir.printer import _Printer
    printer = _Printer(show_types=False)
    printer.print_global_function("main", main)
    return {binding.var: printer.var_names.get(id(binding.var)) for binding in main.bindings}


def _is_op(value, name: str) -> bool:
    return isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == name
