"""PlanDevices: give every value of main a virtual device, insert device_copy where needed.

Works on main (any stage: op calls before partitioning, extern calls after
MarkCompilerFunctionsAsExtern). Every variable gets a device *domain*; constraints unify
domains (union-find) or fix them to a VirtualDevice; domains nothing decides are
defaulted; then the program is rewritten:

- `on_device(%x, device=S, constrain_body=B, constrain_result=R)` (the four forms):
    B=true,  R=false  the standard user annotation: %x is computed on S; the result is
                      free, so a copy goes here when its readers want another device
    B=true,  R=true   fixed: %x and the result are both on S; no copy can go here
    B=false, R=false  a place where a copy may go: body and result are planned apart
    B=false, R=true   the result is on S; %x is free (a copy when it ends up elsewhere)
  A free body takes the device of its result when nothing else decides it (no copy);
  every on_device is removed: `%r = on_device(%x, ...)` becomes `%r = device_copy(%x,
  src=.., dst=..)` where the two sides ended on different devices, else %r is replaced
  by %x everywhere.
- `device_copy(%x, src, dst)` fixes %x to src and its result to dst.
- A call to a global the `function_devices` table declares (extern functions: each
  backend declares where its functions read their parameters and write their result)
  fixes the call's result to the declared result device; each argument is planned
  apart from the parameter it feeds, takes the parameter's device when nothing else
  decides it, and is copied (`device_copy` bound just before the call, shared by every
  later call that needs the same value on the same device) where it ends elsewhere.
- Any other call (an op, a local function, an undeclared global) runs on one device:
  its arguments and result share one domain. Tuples and tuple items share the domain
  of their fields.
- Constants have no domain: the host keeps the weights where every device reads them.
- `input_devices` / `output_devices` (one device for all, or one per input/output; None
  leaves it free) say where main's inputs arrive and where its outputs must be
  delivered; they act as `on_device(%input, D)` on each input and
  `on_device(%output, D, constrain_body=false, constrain_result=true)` on each output.

Domains still free after all constraints take `default_device`. Two fixed constraints
that disagree are a DeviceConflictError naming both devices and where each came from.

Leaves alone: every function but main (extern declarations and callees), and the order
of main's bindings. Copies of main's inputs are bound first, in input order (the device
work after them is then one stretch, one CUDA graph region, instead of being cut at each
input's first reader); every other copy just before its first reader, so that its buffer
lives no longer than needed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import DeviceConflictError
from ..ir.expr import (Binding, Call, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var, substitute_vars,
                       vars_read)
from ..ir.module import IRModule
from ..ir.op import Op, get_op
from ..ir.virtual_device import VirtualDevice


@dataclass(frozen=True)
class FunctionDevices:
    """Where a function reads each parameter and writes its result."""
    params: tuple
    result: VirtualDevice

    @staticmethod
    def on(device, num_params: int) -> "FunctionDevices":
        """Every parameter and the result on `device`."""
        device = VirtualDevice.parse(device)
        return FunctionDevices((device,) * num_params, device)


def plan_devices(mod: IRModule, default_device="cpu", *, function_devices=None,
                 input_devices=None, output_devices=None) -> IRModule:
    """A new module whose main has no on_device and a device_copy at every place where a
    value crosses devices. `function_devices` maps a global's name to a FunctionDevices,
    a VirtualDevice (or its text) for all of it, or None (undeclared); a dict or a
    callable `(name, function) -> ...`."""
    default_device = VirtualDevice.parse(default_device)
    declared = _declarations(mod, function_devices)
    main = _annotate_inputs_and_outputs(mod["main"], input_devices, output_devices)
    planner = _Planner(main, declared)
    planner.collect()
    planner.default(default_device)
    result = mod.copy()
    result["main"] = planner.rewrite()
    return result


def device_of_values(mod: IRModule, default_device="cpu", *, function_devices=None,
                     input_devices=None) -> dict:
    """Var -> VirtualDevice for main's parameters and bindings after plan_devices (what
    the host code needs: which buffer lives where). Parameters are where the inputs
    arrive, a device_copy's result on its dst, a declared call's on its declared result
    device, a tuple or tuple item where its fields are, anything else on the default."""
    default_device = VirtualDevice.parse(default_device)
    declared = _declarations(mod, function_devices)
    main = mod["main"]
    devices = {}
    inputs = _per_item(input_devices, len(main.params), "input_devices")
    for param, device in zip(main.params, inputs):
        devices[param] = VirtualDevice.parse(device) if device is not None else default_device
    for binding in main.bindings:
        value = binding.value
        device = default_device
        if isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "device_copy":
            device = VirtualDevice.parse(value.attrs["dst"])
        elif isinstance(value, Call) and isinstance(value.op, GlobalVar) and value.op.name in declared:
            device = declared[value.op.name].result
        elif isinstance(value, TupleGetItem) and value.tuple_value in devices:
            device = devices[value.tuple_value]
        elif isinstance(value, Tuple):
            fields = [devices[f] for f in value.fields if isinstance(f, Var) and f in devices]
            device = fields[0] if fields else default_device
        devices[binding.var] = device
    return devices


# ---------------------------------------------------------------- declarations


def _declarations(mod: IRModule, function_devices) -> dict:
    """Global name -> FunctionDevices for every global the table declares."""
    declared = {}
    for name, function in mod.items():
        if name == "main" or function_devices is None:
            continue
        if callable(function_devices) and not isinstance(function_devices, dict):
            entry = function_devices(name, function)
        else:
            entry = function_devices.get(name)
        if entry is None:
            continue
        if not isinstance(entry, FunctionDevices):
            entry = FunctionDevices.on(entry, len(function.params))
        if len(entry.params) != len(function.params):
            raise ValueError(f"plan_devices: @{name} has {len(function.params)} parameters but its devices "
                             f"declare {len(entry.params)}")
        declared[name] = entry
    return declared


def _per_item(devices, count: int, what: str) -> list:
    if devices is None or isinstance(devices, (str, VirtualDevice)):
        return [devices] * count
    devices = list(devices)
    if len(devices) != count:
        raise ValueError(f"plan_devices: {what} has {len(devices)} entries for {count} values")
    return devices


def _annotate_inputs_and_outputs(main: Function, input_devices, output_devices) -> Function:
    """main with the input/output declarations written as on_device annotations."""
    if input_devices is None and output_devices is None:
        return main
    on_device = get_op("on_device")
    bindings, substitute = [], {}
    for param, device in zip(main.params, _per_item(input_devices, len(main.params), "input_devices")):
        if device is None:
            continue
        annotated = Var(param.name_hint, param.type)
        bindings.append(Binding(annotated, Call(on_device, [param], {"device": str(VirtualDevice.parse(device))})))
        substitute[param] = annotated
    bindings += [Binding(b.var, substitute_vars(b.value, substitute)) for b in main.bindings]
    result = substitute_vars(main.result, substitute)
    fields = list(result.fields) if isinstance(result, Tuple) else [result]
    delivered = []
    for field, device in zip(fields, _per_item(output_devices, len(fields), "output_devices")):
        if device is None or not isinstance(field, Var):
            delivered.append(field)
            continue
        annotated = Var(field.name_hint, field.type)
        bindings.append(Binding(annotated, Call(on_device, [field], {
            "device": str(VirtualDevice.parse(device)), "constrain_body": False, "constrain_result": True})))
        delivered.append(annotated)
    result = Tuple(delivered) if isinstance(result, Tuple) else delivered[0]
    return Function(main.params, bindings, result, main.ret_type, main.attrs)


# ---------------------------------------------------------------- the solver


class _Domains:
    """Union-find over device domains; a root may be fixed to a device, with the reason."""

    def __init__(self):
        self.parent: list[int] = []
        self.fixed: dict[int, tuple[VirtualDevice, str]] = {}

    def new(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, domain: int) -> int:
        root = domain
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[domain] != root:  # path compression
            self.parent[domain], domain = root, self.parent[domain]
        return root

    def device(self, domain: int) -> VirtualDevice | None:
        entry = self.fixed.get(self.find(domain))
        return entry[0] if entry else None

    def fix(self, domain: int, device: VirtualDevice, reason: str, where: str):
        root = self.find(domain)
        if root in self.fixed:
            self._check(self.fixed[root], (device, reason), where)
        else:
            self.fixed[root] = (device, reason)

    def unify(self, first: int, second: int, where: str):
        a, b = self.find(first), self.find(second)
        if a == b:
            return
        if a in self.fixed and b in self.fixed:
            self._check(self.fixed[a], self.fixed[b], where)
        self.parent[b] = a
        if a not in self.fixed and b in self.fixed:
            self.fixed[a] = self.fixed[b]
        self.fixed.pop(b, None)

    @staticmethod
    def _check(one, other, where: str):
        if one[0] != other[0]:
            raise DeviceConflictError(
                f"device conflict at {where}: {one[1]} requires {one[0]}, "
                f"but {other[1]} requires {other[0]}")


def _text(value: Expr) -> str:
    from ..ir.printer import print_expr
    return print_expr(value)


class _Where:
    """The binding a constraint comes from, printed only when it conflicts (printing every
    binding up front took a second of BERT-base's build)."""
    __slots__ = ("var", "value")

    def __init__(self, var: Var, value: Expr):
        self.var, self.value = var, value

    def __str__(self) -> str:
        return f"%{self.var.name_hint} = {_text(self.value)}"


class _Planner:
    def __init__(self, main: Function, declared: dict):
        self.main = main
        self.declared = declared
        self.domains = _Domains()
        self.domain_of: dict[Var, int] = {}
        # Copy places solved after unification: (body domain, result domain) of on_device
        # with a free body, and (argument domain, parameter device) of declared calls.
        self.body_follows: list[tuple[int, int]] = []
        self.argument_follows: list[tuple[int, VirtualDevice]] = []

    def domain(self, var: Var) -> int:
        if var not in self.domain_of:
            self.domain_of[var] = self.domains.new()
        return self.domain_of[var]

    # ---- phase 1: constraints
    def collect(self):
        for param in self.main.params:
            self.domain(param)
        for binding in self.main.bindings:
            self.collect_binding(binding.var, binding.value)

    def collect_binding(self, var: Var, value: Expr):
        domains = self.domains
        where = _Where(var, value)
        result = self.domain(var)
        if isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "on_device":
            device = VirtualDevice.parse(value.attrs["device"])
            body = value.args[0]
            reason = f"on_device at %{var.name_hint}"
            if value.attrs["constrain_result"]:
                domains.fix(result, device, reason, where)
            if isinstance(body, Var):
                if value.attrs["constrain_body"]:
                    domains.fix(self.domain(body), device, reason, where)
                else:
                    self.body_follows.append((self.domain(body), result))
        elif isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "device_copy":
            reason = f"device_copy at %{var.name_hint}"
            domains.fix(result, VirtualDevice.parse(value.attrs["dst"]), reason, where)
            for source in vars_read(value.args[0], callees=False):
                domains.fix(self.domain(source), VirtualDevice.parse(value.attrs["src"]), reason, where)
        elif isinstance(value, Call) and isinstance(value.op, GlobalVar) and value.op.name in self.declared:
            devices = self.declared[value.op.name]
            domains.fix(result, devices.result, f"the result of @{value.op.name}", where)
            for arg, device in zip(value.args, devices.params):
                for source in vars_read(arg, callees=False):
                    self.argument_follows.append((self.domain(source), device))
        elif isinstance(value, Function):
            return  # a local function is code, not data: its calls are planned
        else:
            # An op (or anything else called) runs on one device: arguments and result together.
            for source in vars_read(value, callees=False):
                domains.unify(result, self.domain(source), where)

    # ---- phase 2: defaults
    def default(self, default_device: VirtualDevice):
        domains = self.domains
        changed = True
        while changed:
            changed = False
            for body, result in self.body_follows:
                if domains.device(body) is None and domains.device(result) is not None:
                    domains.fix(body, domains.device(result), "the result it feeds", "defaulting")
                    changed = True
            for argument, device in self.argument_follows:
                if domains.device(argument) is None:
                    domains.fix(argument, device, "the parameter it feeds", "defaulting")
                    changed = True
        for domain in list(self.domain_of.values()):
            if domains.device(domain) is None:
                domains.fix(domain, default_device, "the default device", "defaulting")

    def device(self, var: Var) -> VirtualDevice:
        return self.domains.device(self.domain_of[var])

    # ---- phase 3: rewrite
    def rewrite(self) -> Function:
        replaced: dict = {}  # var -> the atom that stands for it now
        copies: dict = {}  # (var, device) -> the var holding its copy on that device
        bindings: list[Binding] = []

        def copy_of(var: Var, device: VirtualDevice) -> Var:
            if self.device(var) == device:
                return var
            key = (var, device)
            if key not in copies:
                copy = Var(f"{var.name_hint}_{device.device_type}", var.type)
                bindings.append(Binding(copy, _device_copy(var, self.device(var), device)))
                self.domain_of[copy] = self.domains.new()
                self.domains.fix(self.domain_of[copy], device, "a copy", "rewrite")
                copies[key] = copy
            return copies[key]

        # An on_device whose sides differ becomes a copy bound just before its first reader
        # (so the copy's buffer lives no longer than needed): annotated var -> (body, device).
        pending: dict = {}

        def materialize(expr):
            for var in vars_read(expr, callees=False):
                if var in pending:
                    body, device = pending.pop(var)
                    replaced[var] = copy_of(body, device)

        for binding in self.main.bindings:
            materialize(binding.value)
            var, value = binding.var, substitute_vars(binding.value, replaced)
            if isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "on_device":
                # The annotation goes; its result is its body, copied where the two
                # sides ended on different devices.
                body = value.args[0]
                if isinstance(body, Var) and self.device(body) != self.device(var):
                    pending[var] = (body, self.device(var))
                else:
                    replaced[var] = body
                continue
            if isinstance(value, Call) and isinstance(value.op, GlobalVar) and value.op.name in self.declared:
                devices = self.declared[value.op.name]
                args = [_map_vars(arg, lambda v, d=device: copy_of(v, d))
                        for arg, device in zip(value.args, devices.params)]
                value = Call(value.op, args, value.attrs, type_=value.type)
            bindings.append(Binding(var, value))
        materialize(self.main.result)
        result = substitute_vars(self.main.result, replaced)
        # Copies of main's inputs go first: the device work after them is then one stretch
        # (one CUDA graph region) instead of being cut at each input's first reader.
        params = set(self.main.params)
        inputs_first = sorted(bindings, key=lambda b: not (
            isinstance(b.value, Call) and isinstance(b.value.op, Op) and b.value.op.name == "device_copy"
            and b.value.args[0] in params))
        return Function(self.main.params, inputs_first, result, self.main.ret_type, self.main.attrs)


def _device_copy(var: Var, source: VirtualDevice, destination: VirtualDevice) -> Call:
    return Call(get_op("device_copy"), [var], {"src": str(source), "dst": str(destination)})


# ---------------------------------------------------------------- expression helpers


def _map_vars(expr: Expr, function: Callable) -> Expr:
    if isinstance(expr, Var):
        return function(expr)
    if isinstance(expr, Tuple):
        return Tuple([_map_vars(field, function) for field in expr.fields])
    return expr
