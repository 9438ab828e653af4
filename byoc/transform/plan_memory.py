"""PlanMemory: give every tensor main computes static storage, written into the IR.

Rewrites the final main (after MarkCompilerFunctionsAsExtern and PlanDevices: a flat list
of `%v = @extern(...)` and `device_copy` bindings). Every binding that writes a tensor
gets storage attributes on its call:

    %a = @f(%x, offset=0, size=1024, storage="cuda")     a slot in the cuda arena
    %d = @g(%a, output=0, storage="output")               straight into the caller's output 0
    %v = @reshape(%a, storage="view")                     a view of %a's storage

The memory space is where PlanDevices put the value (`devices`: Var -> VirtualDevice;
without it every value is on `default_device`), written as VirtualDevice text: `cuda`,
`cpu`, `cpu/host-pinned`. Each space is planned on its own, all in one call, and main
records per space the arena size, the lower bound and the no-reuse sum:

    def @main(...) [storage_bytes=[3072], storage_lower_bound=[3072],
                    storage_no_reuse=[4096], storage_spaces=["cuda"]] { ... }

A result computed by a call goes straight into the caller's buffer the first time it is
an output (`outputs_in_place`; CUDA graphs in copy mode turn it off: the graph must write
the same memory on every run). Views (a tuple, a TupleGetItem, a call to a `views` symbol
such as a reshape) get no storage: they show the tensors behind them, which liveness
(byoc/analysis/liveness.py) keeps alive as long as the view is read. Caller inputs and
constants are not planned.

Placement is greedy over lifetimes: tensors taken in some order each take the lowest
256-byte-aligned offset that does not overlap any already placed tensor whose lifetime
intersects its own. No one order is best for every graph, so three are tried and the
smallest arena kept: by size (largest first, then by first definition), by size then
longest lifetime, and by area (size x lifetime). On the long chains of deep-learning
graphs it lands at or close to the lower bound (the largest sum of simultaneously live
bytes). `storage_of(call)` and `memory_plan(main, space)` read the result back.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.liveness import Lifetime, analyze_liveness, is_view_call
from ..ir.expr import Binding, Call, Function, Tuple, Var
from ..ir.module import IRModule
from ..ir.virtual_device import VirtualDevice

ALIGNMENT = 256
OUTPUT = "output"  # the storage of a result written straight into the caller's buffer
VIEW = "view"  # a call of a view symbol: no storage of its own, it shows its first argument's
STORAGE_ATTRS = ("storage", "offset", "size", "output")


def _align(value: int) -> int:
    return (value + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass
class MemoryPlan:
    """One memory space's plan: where each tensor is and how good the arena is."""
    offsets: dict = field(default_factory=dict)  # Var -> byte offset in the arena
    lifetimes: list = field(default_factory=list)
    planned_bytes: int = 0  # the arena size
    no_reuse_bytes: int = 0  # every tensor in its own aligned slot
    lower_bound_bytes: int = 0  # the most bytes live at any one point

    def summary(self) -> dict:
        return {"planned_bytes": self.planned_bytes, "no_reuse_bytes": self.no_reuse_bytes,
                "lower_bound_bytes": self.lower_bound_bytes, "tensors": len(self.lifetimes),
                "reuse_factor": round(self.no_reuse_bytes / self.planned_bytes, 2) if self.planned_bytes else None,
                "over_lower_bound": round(self.planned_bytes / self.lower_bound_bytes, 3)
                if self.lower_bound_bytes else None}


def plan_memory(mod: IRModule, *, devices: dict | None = None, default_device="cpu", views=frozenset(),
                outputs_in_place: bool = True) -> IRModule:
    """A new module whose main's tensor-writing calls carry their storage (see above)."""
    main = mod["main"]
    default_space = str(VirtualDevice.parse(default_device))
    in_place = _outputs_in_place(main, views) if outputs_in_place else {}
    lifetimes = analyze_liveness(main, set(in_place), views)
    by_space: dict = {}
    for lifetime in lifetimes:
        device = (devices or {}).get(lifetime.var)
        by_space.setdefault(str(device) if device is not None else default_space, []).append(lifetime)
    plans = {space: _place_all(members, len(main.bindings)) for space, members in sorted(by_space.items())}
    where = {var: (space, offset) for space, plan in plans.items() for var, offset in plan.offsets.items()}
    sizes = {lifetime.var: lifetime.size for lifetime in lifetimes}
    bindings = []
    for binding in main.bindings:
        value, var = binding.value, binding.var
        if var in in_place:
            value = _with_attrs(value, {"storage": OUTPUT, "output": in_place[var]})
        elif is_view_call(value, views):
            value = _with_attrs(value, {"storage": VIEW})
        elif var in where:
            space, offset = where[var]
            value = _with_attrs(value, {"storage": space, "offset": offset, "size": sizes[var]})
        bindings.append(Binding(var, value))
    attrs = {key: value for key, value in main.attrs.items() if not key.startswith("storage_")}
    if plans:
        attrs.update(storage_spaces=list(plans), storage_bytes=[p.planned_bytes for p in plans.values()],
                     storage_lower_bound=[p.lower_bound_bytes for p in plans.values()],
                     storage_no_reuse=[p.no_reuse_bytes for p in plans.values()])
    result = mod.copy()
    result["main"] = Function(main.params, bindings, main.result, main.ret_type, attrs)
    return result


def storage_of(value) -> tuple | None:
    """(space, offset, size) of a planned call, ("output", index, 0) for a result written
    into the caller's buffer, ("view", 0, 0) for a view, None for anything PlanMemory gave
    no storage."""
    attrs = getattr(value, "attrs", None) or {}
    space = attrs.get("storage")
    if not space:
        return None
    if space == OUTPUT:
        return OUTPUT, attrs["output"], 0
    if space == VIEW:
        return VIEW, 0, 0
    return space, attrs["offset"], attrs["size"]


def space_bytes(main: Function) -> dict:
    """Memory space -> arena bytes, from main's attributes."""
    return dict(zip(main.attrs.get("storage_spaces", ()), main.attrs.get("storage_bytes", ())))


def memory_plan(main: Function, space: str, views=frozenset()) -> MemoryPlan:
    """The plan PlanMemory wrote for one space, read back from the IR (offsets from the
    calls' attributes, lifetimes from liveness); empty where it placed nothing there."""
    spaces = list(main.attrs.get("storage_spaces", ()))
    if space not in spaces:
        return MemoryPlan()
    index = spaces.index(space)
    offsets = {}
    for binding in main.bindings:
        storage = storage_of(binding.value)
        if storage is not None and storage[0] == space:
            offsets[binding.var] = storage[1]
    lifetimes = [l for l in analyze_liveness(main, views=views) if l.var in offsets]
    return MemoryPlan(offsets=offsets, lifetimes=lifetimes, planned_bytes=main.attrs["storage_bytes"][index],
                      no_reuse_bytes=main.attrs["storage_no_reuse"][index],
                      lower_bound_bytes=main.attrs["storage_lower_bound"][index])


def _outputs_in_place(main: Function, views) -> dict:
    """Var -> output index: results computed by a call (not a view, not a parameter), at
    the first output each appears as."""
    results = list(main.result.fields) if isinstance(main.result, Tuple) else [main.result]
    computed = {b.var for b in main.bindings if isinstance(b.value, Call) and not is_view_call(b.value, views)}
    in_place = {}
    for index, result in enumerate(results):
        if isinstance(result, Var) and result in computed and result not in in_place:
            in_place[result] = index
    return in_place


def _with_attrs(call: Call, extra: dict) -> Call:
    attrs = {key: value for key, value in call.attrs.items() if key not in STORAGE_ATTRS}
    return Call(call.op, call.args, {**attrs, **extra}, type_=call.type)


def _place(order: list) -> tuple[int, dict]:
    """(arena bytes, Var -> offset) placing `order`'s tensors first-fit in that order."""
    placed: list[tuple[int, int, Lifetime]] = []  # (offset, end, lifetime)
    offsets = {}
    for item in order:
        conflicts = sorted((o, e) for o, e, other in placed
                           if not (other.last < item.first or item.last < other.first))
        offset = 0
        for start, stop in conflicts:
            if offset + item.size <= start:
                break  # fits in the gap before this conflict
            offset = max(offset, _align(stop))
        offsets[item.var] = offset
        placed.append((offset, offset + item.size, item))
    return _align(max((end for _, end, _ in placed), default=0)), offsets


def _place_all(lifetimes: list, num_bindings: int) -> MemoryPlan:
    """The best of three greedy orders for one space's tensors, with its bounds."""
    orders = (lambda l: (-l.size, l.first),
              lambda l: (-l.size, l.first - l.last, l.first),
              lambda l: (-l.size * (l.last - l.first + 1), l.first))
    planned, offsets = min((_place(sorted(lifetimes, key=order)) for order in orders), key=lambda p: p[0])
    lower_bound = 0
    for step in range(num_bindings + 1):
        live = sum(_align(l.size) for l in lifetimes if l.first <= step <= l.last)
        lower_bound = max(lower_bound, live)
    return MemoryPlan(offsets=offsets, lifetimes=lifetimes, planned_bytes=planned,
                      no_reuse_bytes=sum(_align(l.size) for l in lifetimes), lower_bound_bytes=lower_bound)
