"""The host plan: where every tensor of the final main lives at run time.

plan_host(mod, context) reads the final main (after MarkCompilerFunctionsAsExtern and
PlanMemory: a flat list of calls to extern globals, each with its storage) and decides
where each tensor is, as the model runtime's Refs: the caller's inputs and outputs,
constants in one weights blob, everything else in the arenas at the offsets the memory
planner chose (256-byte aligned); the calls in order, the copies between memories, the
CUDA graph regions. codegen/host.py renders plans into the runtime's tables and
codegen/program_table.py encodes their calls.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import BuildError
from ..ir.expr import Call, Constant, GlobalVar, Tuple, Var
from ..ir.module import IRModule
from ..ir.types import TensorType, numpy_dtype
from ..ir.virtual_device import VirtualDevice
from ..analysis.liveness import is_view_call
from ..transform.plan_memory import OUTPUT, memory_plan, space_bytes, storage_of

ALIGNMENT = 256


def align(offset: int, alignment: int = ALIGNMENT) -> int:
    return (offset + alignment - 1) // alignment * alignment


def nbytes(type_: TensorType) -> int:
    return math.prod(type_.shape) * numpy_dtype(type_.dtype).itemsize


def comment_safe(text: str, limit: int = 60) -> str:
    """A model-given name reduced to characters that are harmless in a // comment."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:limit]


@dataclass(frozen=True)
class Ref:
    """Where one tensor lives at run time, as the model runtime's Ref (model_runtime.h):
    one of its memories (enum Space: kArena, kWeights, kHostArena, kPinnedArena,
    kHostWeights) and the byte offset in it, or the caller's tensor (kInput, kOutput) and
    its index; and the tensor's bytes."""
    space: str
    offset: int
    bytes: int = 0  # the tensor's size: the runtime checks that it lies inside the memory named

    def __post_init__(self):
        if self.space not in SPACES:
            raise BuildError(f"internal: memory space {self.space!r} is not one the model runtime has "
                             f"({', '.join(SPACES)})")

    def __str__(self):  # how labels and dumps show it
        if self.space in ("kInput", "kOutput"):
            return f"{'in' if self.space == 'kInput' else 'out'}[{self.offset}]"
        return f"{self.space[1:]} + {self.offset}"


# enum Space of model_runtime.h, in its order (the program table stores the number)
SPACES = ("kArena", "kWeights", "kInput", "kOutput", "kHostArena", "kPinnedArena", "kHostWeights")


@dataclass
class HostPlan:
    inputs: list  # (name, TensorType)
    outputs: list  # (name, TensorType)
    calls: list  # dict(symbol, args, results, label): args and results are Refs
    output_copies: list  # dict(output, source: Ref, bytes)
    input_copies: list  # dict(input, destination: Ref, bytes): static_io only
    weights: object  # a WeightsBlob (or bytes): what len(), blob_checksum and write_blob take
    constant_offsets: dict = field(default_factory=dict)
    arena_bytes: int = 0
    arena_offsets: dict = field(default_factory=dict)
    extern_symbols: list = field(default_factory=list)
    workspace_bytes: int = 0
    memory_plan: object = None
    # Set when PlanDevices placed values on more than one device (a cuda build with data
    # on the host): the host arenas, the cpu functions' own workspace, where inputs and
    # outputs are (True: host memory), and whether run() ends by synchronizing.
    host_arena_bytes: int = 0
    pinned_arena_bytes: int = 0
    host_workspace_bytes: int = 0
    inputs_on_host: list = field(default_factory=list)
    outputs_on_host: list = field(default_factory=list)
    sync_at_end: bool = False
    # With CUDA graphs: every call in one of these, in order ({"first", "count",
    # "capture"}): a captured region or calls run directly between two.
    regions: list = field(default_factory=list)


class WeightsBlob:
    """The weights blob the plans place constants in: each constant once, 256-byte aligned,
    zeros between. One blob can serve the plans of several programs (a library's shape
    buckets, each imported on its own): a constant equal to one placed before, in dtype,
    shape and bytes, takes that one's offset.

    The blob is never assembled in memory: it keeps each constant's bytes where they are
    (`pieces`) and is written piece by piece (write_blob), its checksum summed piece by
    piece (codegen/host.py blob_checksum). A 1 GB decoder's weights were copied into one
    bytearray first, 0.4 s and 1 GB more memory on the way to the file."""

    def __init__(self, share_equal: bool = False):
        self.pieces: list = []  # (offset, memoryview of one constant's bytes), in offset order
        self.size = 0
        self.share_equal = share_equal
        self.offsets: dict = {}  # id(Constant) -> offset
        self._by_content: dict = {}  # (dtype, shape, digest) -> offset

    def __len__(self) -> int:
        return self.size

    def write_to(self, file) -> None:
        """The blob's bytes into `file` (at its position), pieces and the zeros between."""
        end = 0
        for offset, piece in self.pieces:
            file.write(b"\0" * (offset - end))
            file.write(piece)
            end = offset + piece.nbytes

    def __bytes__(self) -> bytes:
        import io
        buffer = io.BytesIO()
        self.write_to(buffer)
        return buffer.getvalue()

    def place(self, constant: Constant) -> int:
        key = id(constant)
        if key in self.offsets:
            return self.offsets[key]
        data = np.ascontiguousarray(constant.data)
        content = None
        if self.share_equal:
            import hashlib
            digest = hashlib.blake2b(data.reshape(-1).view(np.uint8), digest_size=20).digest()
            content = (str(data.dtype), data.shape, digest)
            if content in self._by_content:
                self.offsets[key] = self._by_content[content]
                return self.offsets[key]
        offset = align(self.size)
        piece = memoryview(data.reshape(-1).view(np.uint8))  # holds `data`: no copy
        self.pieces.append((offset, piece))
        self.size = offset + piece.nbytes
        self.offsets[key] = offset
        if content is not None:
            self._by_content[content] = offset
        return offset


@dataclass
class HostSetup:
    """What the host code is generated from: the HostPlan, and the CUDA graph and device
    decisions made with it (the pipeline's plan_host stage keeps it on the module)."""
    plan: HostPlan
    cuda_graph: bool
    graph_io: str | None
    devices: bool
    view_symbols: set

    def ir_summary(self) -> str:
        plan = self.plan
        return (f"{len(plan.calls)} calls, arena {plan.arena_bytes} bytes, workspace {plan.workspace_bytes} "
                f"bytes, cuda_graph {str(self.cuda_graph).lower()}")


def plan_host(mod: IRModule, context) -> HostSetup:
    """The host plan of the final module of the pipeline (pipeline.py), from what earlier
    stages recorded on it: the artifacts (workspaces, views), the devices each function
    declared, the CUDA graph regions; and from the build context: the build's device, the
    config's cuda_graph_io and the weights blob the programs of the library share."""
    artifacts = mod.attrs["artifacts"]
    workspace = {}
    for artifact in artifacts:
        workspace.update(artifact.workspace_bytes)
    captured = any("graph_region" in getattr(b.value, "attrs", {}) for b in mod["main"].bindings)
    devices = context.value_devices(mod)
    view_symbols = {s for artifact in artifacts for s in artifact.view_symbols}
    graph_io = context.config.cuda_graph_io if captured else None
    plan = place_tensors(mod, workspace, output_names=mod.attrs.get("output_names"), static_io=graph_io == "copy",
                         device=str(context.virtual_device("device")), view_symbols=view_symbols,
                         has_graph_regions=captured, value_devices=devices,
                         function_devices=mod.attrs["declared_devices"] if devices is not None else None,
                         weights=context.weights)
    return HostSetup(plan, captured, graph_io, devices is not None, view_symbols)


def place_tensors(mod: IRModule, workspace_bytes: dict[str, int] | None = None,
                  output_names: list[str] | None = None, static_io: bool = False, device: str = "cpu",
                  value_devices: dict | None = None, function_devices: dict | None = None,
                  view_symbols=frozenset(), has_graph_regions: bool = False,
                  weights: WeightsBlob | None = None) -> HostPlan:
    """Where every tensor of mod["main"] lives, from the storage PlanMemory wrote on each
    call (transform/plan_memory.py): memory space `device` (the build's device) is the
    arena, "cpu" and "cpu/host-pinned" in a cuda build the host arenas; "output" the
    caller's output buffer.

    `static_io` (for CUDA graphs in copy mode): every kernel must see the same pointers on
    every run, so inputs are copied into their own arena slots first (PlanMemory was told
    to write no output in place: outputs are copied out of the arena last).

    `value_devices` (Var -> VirtualDevice, from plan_devices.device_of_values) and
    `function_devices` (symbol -> FunctionDevices, or the one VirtualDevice of a
    function), for a cuda build with data on the host: device_copy bindings run as copies,
    cpu functions get a host workspace, every function gets its constants from the
    weights in the memory it reads that parameter from, and the stream is synchronized
    before a cpu function reads what the GPU (this run's or the previous run's) wrote.

    `view_symbols`: extern functions whose result only reinterprets their first argument
    (reshapes): no call is made, the result is the argument's storage.

    `has_graph_regions`: whether main's calls carry RewriteCUDAGraph's regions (graph_region=n,
    transform/rewrite_cuda_graph.py: mark_graph_regions): the plan's `regions` then cover
    every call in order, each captured into its own CUDA graph or (the calls between
    regions) run directly.

    `weights`: the blob to place constants in (a library's programs share one; the plan's
    `weights` are then empty: the blob holds them); without it, the plan's own blob's bytes."""
    main = mod["main"]
    results = list(main.result.fields) if isinstance(main.result, Tuple) else [main.result]
    names = output_names or ([f"output_{i}" for i in range(len(results))] if len(results) > 1 else ["output"])
    # not `weights or ...`: an empty blob is falsy, and the programs' shared one starts empty
    blob = weights if weights is not None else WeightsBlob()
    placer = _Placer(main, results, device, frozenset(view_symbols), blob)
    inputs = placer.place_inputs()
    calls = []
    for position, binding in enumerate(main.bindings):
        value = binding.value
        if isinstance(value, Call) and getattr(value.op, "name", None) == "device_copy" and value_devices is not None:
            calls.append(placer.device_copy(position, binding))
        elif binding.var in placer.views:
            placer.view(binding)
        else:
            calls.append(placer.call(position, binding, mod, value_devices, function_devices))
    on_host = [value_devices[p].is_host for p in main.params] if value_devices is not None else []
    input_copies = placer.stage_inputs(calls, on_host) if static_io else []
    regions = _call_regions(calls) if has_graph_regions else []
    host_symbols = placer.host_symbols
    plan = HostPlan(inputs=inputs, outputs=[(name, result.type) for name, result in zip(names, results)],
                    calls=calls, output_copies=placer.output_copies(), input_copies=input_copies,
                    # a blob the programs of a library share: its bytes once, when all are placed
                    weights=placer.weights if weights is None else b"",  # the plan owns it now
                    constant_offsets=placer.weights.offsets,
                    arena_bytes=align(placer.arena_size), arena_offsets=placer.own_offsets,
                    extern_symbols=placer.symbols,
                    workspace_bytes=max([0] + [(workspace_bytes or {}).get(s, 0) for s in placer.symbols
                                               if s not in host_symbols]),
                    memory_plan=memory_plan(main, device, view_symbols), regions=regions)
    if value_devices is not None:
        spaces = space_bytes(main)
        plan.host_arena_bytes = align(spaces.get("cpu", 0)) if device != "cpu" else 0
        plan.pinned_arena_bytes = align(spaces.get("cpu/host-pinned", 0))
        plan.host_workspace_bytes = max([0] + [(workspace_bytes or {}).get(s, 0) for s in host_symbols])
        plan.inputs_on_host = [value_devices[p].is_host for p in main.params]
        plan.outputs_on_host = [isinstance(r, Var) and value_devices.get(r, None) is not None
                                and value_devices[r].is_host for r in results]
        plan.sync_at_end = any(plan.outputs_on_host) and placer.pending_device_work
    return plan


# The memories a call cannot reach where it runs (the runtime's decoder refuses them too,
# model_program.cc: placement_problem): a GPU kernel cannot read pageable host memory, a
# cpu function cannot read device memory.
_UNREACHABLE = {True: ("kArena", "kWeights"), False: ("kHostArena", "kHostWeights")}


def _check_reachable(symbol: str, on_host: bool, refs: list):
    """A BuildError at build time, naming the function and operand, where a backend's
    declared parameter devices put an operand where its function cannot reach it (the
    library would be refused at every create, as if it had been tampered with)."""
    for number, ref in enumerate(refs):
        if ref.space in _UNREACHABLE[on_host]:
            what = f"operand {number}" if number < len(refs) - 1 else "its result"
            raise BuildError(f"@{symbol} runs on the {'cpu' if on_host else 'GPU'}, but {what} is in {ref.space[1:]} "
                             f"({'device' if on_host else 'pageable host'} memory), which it cannot reach: its "
                             f"backend declares that parameter's device so (expected "
                             f"{'cpu memory' if on_host else 'the GPU or pinned host memory (cpu/host-pinned)'})")


def _call_regions(calls: list) -> list:
    """The calls as consecutive regions: {"first", "count", "capture"}; the calls of a
    region of RewriteCUDAGraph (their graph_region) are captured, those between run directly."""
    regions, previous = [], object()  # (no key equals the first call's)
    for index, call in enumerate(calls):
        key = call["graph_region"]  # None: between regions
        if key == previous:
            regions[-1]["count"] += 1
        else:
            regions.append({"first": index, "count": 1, "capture": key is not None})
        previous = key
    return regions


class _Placer:
    """plan_host's state while it walks main: where each tensor is placed so far, the
    weights blob, the arena's size, and what the calls so far queued on the GPU."""

    def __init__(self, main, results, device: str, view_symbols, weights: WeightsBlob):
        self.main, self.results, self.view_symbols = main, results, view_symbols
        # PlanMemory's memory spaces as the runtime's memories: the build device's arena,
        # and in a cuda build the host arena (malloc) and the pinned host arena
        # (cudaMallocHost); on the cpu target the cpu is the build device's arena
        self.runtime_space = {"cpu": "kHostArena", "cpu/host-pinned": "kPinnedArena", device: "kArena"}
        self.device = device
        self.placements: dict = {}
        self.weights = weights
        self.arena_size = space_bytes(main).get(device, 0)
        self.own_offsets: dict = {}
        self.symbols: list = []
        self.host_symbols: set = set()
        # GPU work queued on the stream since the last synchronization: at the start of a run,
        # the previous run's (its copies may still read or write the host arenas)
        self.pending_device_work = True
        self.views = {b.var for b in main.bindings if is_view_call(b.value, view_symbols)}
        self.direct_output = {b.var: storage_of(b.value)[1] for b in main.bindings
                              if (storage_of(b.value) or (None,))[0] == OUTPUT}

    def place_inputs(self) -> list:
        inputs = []
        for index, param in enumerate(self.main.params):
            if not isinstance(param.type, TensorType):
                raise BuildError(f"main parameter {param.name_hint!r} is not a tensor")
            self.placements[param] = Ref("kInput", index, nbytes(param.type))
            inputs.append((param.name_hint, param.type))
        return inputs

    def place_constant(self, constant: Constant, host: bool = False) -> Ref:
        offset = self.weights.place(constant)
        # kHostWeights: the weights in host memory, which cpu functions of a cuda build read
        return Ref("kHostWeights" if host else "kWeights", offset, nbytes(constant.type))

    def place_result(self, binding) -> Ref:
        """Where PlanMemory put the binding's result: the caller's output buffer, the
        arena, or a host arena."""
        var, storage = binding.var, storage_of(binding.value)
        if storage is None:
            raise BuildError(f"internal: %{var.name_hint} has no storage; PlanMemory runs before the host plan")
        space, offset, _ = storage
        if space == OUTPUT:
            placement = Ref("kOutput", offset, nbytes(var.type))
        elif space in self.runtime_space:
            placement = Ref(self.runtime_space[space], offset, nbytes(var.type))
            if placement.space == "kArena":
                self.own_offsets[var] = offset
        else:
            raise BuildError(f"%{var.name_hint} is placed in memory space {space!r} (devices.pin), which this "
                             f"build cannot hold: its model runtime drives one device ({self.device}) and the host; "
                             f"the memory spaces it has are {', '.join(sorted(self.runtime_space))}")
        self.placements[var] = placement
        return placement

    def device_copy(self, position: int, binding) -> dict:
        source, var = binding.value.args[0], binding.var
        destination = self.place_result(binding)
        if isinstance(source, Constant):
            to_host = self.device != "cpu" and VirtualDevice.parse(binding.value.attrs["dst"]).is_host
            source_ref = self.place_constant(source, to_host)
        else:
            source_ref = self.placements[source]
        self.pending_device_work = True
        attrs = binding.value.attrs
        return {"kind": "copy", "source": source_ref, "destination": destination, "position": position,
                "graph_region": binding.value.attrs.get("graph_region"),
                "bytes": nbytes(var.type), "symbol": "device_copy", "args": [], "results": [],
                "label": f"#{position} {comment_safe(var.name_hint)} = device_copy {attrs['src']} -> {attrs['dst']}"}

    def view(self, binding) -> None:
        source = binding.value.args[0]
        if source not in self.placements:
            raise BuildError(f"the view @{binding.value.op.name} reads {source!r}, which is not a computed tensor")
        self.placements[binding.var] = self.placements[source]

    def call(self, position: int, binding, mod, value_devices, function_devices) -> dict:
        value, var = binding.value, binding.var
        if not (isinstance(value, Call) and isinstance(value.op, GlobalVar)):
            raise BuildError(f"main still contains {type(value).__name__} "
                             f"{getattr(getattr(value, 'op', None), 'name', '')} after partitioning; "
                             f"every op must belong to a backend's extern function")
        if not mod[value.op.name].is_extern:
            raise BuildError(f"main calls @{value.op.name}, which is not an extern function")
        if not isinstance(var.type, TensorType):
            raise BuildError(f"@{value.op.name} returns {var.type}; extern functions return one tensor")
        declared = function_devices.get(value.op.name) if function_devices is not None else None
        # FunctionDevices (where each parameter is) or the one VirtualDevice of the function
        runs_on = getattr(declared, "result", declared)
        runs_on_host = value_devices is not None and runs_on is not None and runs_on.device_type == "cpu"
        param_devices = list(getattr(declared, "params", ()))
        args, constants = [], []
        for position_in_call, arg in enumerate(value.args):
            if isinstance(arg, Constant):
                # the weights in the memory the function reads this parameter from
                read_from = param_devices[position_in_call] if position_in_call < len(param_devices) else runs_on
                host = value_devices is not None and read_from is not None and read_from.is_host
                args.append(self.place_constant(arg, host))
                constants.append((args[-1], nbytes(arg.type)))
            elif isinstance(arg, Var) and arg in self.placements:
                args.append(self.placements[arg])
            else:
                raise BuildError(f"argument {arg!r} of @{value.op.name} is neither a constant nor a computed tensor")
        symbol = value.op.name
        if symbol not in self.symbols:
            self.symbols.append(symbol)
        result = self.place_result(binding)
        if value_devices is not None:
            _check_reachable(symbol, runs_on_host, args + [result])
        call = {"kind": "call", "symbol": symbol, "args": args, "results": [result],
                "position": position, "graph_region": value.attrs.get("graph_region"),
                "label": f"#{position} {comment_safe(var.name_hint)} = {symbol}",
                "constants": [] if runs_on_host else constants}
        if value_devices is not None:
            # A cpu function reads host memory the GPU may still be writing (a copy queued
            # on the stream): wait for the stream first.
            call["on_host"] = runs_on_host
            call["sync_before"] = runs_on_host and self.pending_device_work
            if runs_on_host:
                self.host_symbols.add(symbol)
                self.pending_device_work = False
            else:
                self.pending_device_work = True
        return call

    def stage_inputs(self, calls: list, on_host: list) -> list:
        """(static_io) staging slots for the inputs on the device, after everything
        PlanMemory placed; the calls read the slots instead of the caller's buffers. An
        input in host memory (`on_host`) is read by the copies to the device and by cpu
        functions, which run between graphs: it stays where the caller has it."""
        copies = []
        for index, param in enumerate(self.main.params):
            if index < len(on_host) and on_host[index]:
                continue
            offset = align(self.arena_size)
            self.arena_size = offset + nbytes(param.type)
            staged = Ref("kArena", offset, nbytes(param.type))
            copies.append({"input": index, "destination": staged, "bytes": nbytes(param.type)})
            for call in calls:
                call["args"] = [staged if (a.space, a.offset) == ("kInput", index) else a for a in call["args"]]
            self.placements[param] = staged
        return copies

    def output_copies(self) -> list:
        """The outputs no call wrote into the caller's buffer, copied there last."""
        copies = []
        for index, result in enumerate(self.results):
            if self.direct_output.get(result) == index:
                continue
            if isinstance(result, Constant):
                source = self.place_constant(result)
            elif result in self.placements:
                source = self.placements[result]
            else:
                raise BuildError(f"output {index} of main is not a tensor main computes")
            copies.append({"output": index, "source": source, "bytes": nbytes(result.type)})
        return copies
