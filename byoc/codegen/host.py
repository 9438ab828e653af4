"""Host code: the C++ that owns a model's memory and calls its extern functions in order.

`plan_host(mod)` reads the final main (after MarkCompilerFunctionsAsExtern: a flat list
of calls to extern globals) and decides where every tensor lives: inputs and outputs are
the caller's, constants go into one weights blob, everything else into one activation
arena (offsets from the memory planner, 256-byte aligned). `render_host([HostVariant(plan,
...)], ...)` turns such plans (one per program of the library: a static build has one) into
the tables (templates/host/model.cc.j2) the static model runtime (byoc/runtime/
model_runtime.cc) runs the model from.
"""
from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import BuildError
from ..ir.expr import Call, Constant, GlobalVar, Tuple, Var
from ..ir.module import IRModule
from ..ir.types import TensorType, numpy_dtype
from ..ir.virtual_device import VirtualDevice
from ..analysis.liveness import is_view_call
from ..transform.plan_memory import OUTPUT, memory_plan, space_bytes, storage_of
from .templates import render_template

ALIGNMENT = 256

# byoc dtype -> (DLPack type code, bits)
DLPACK_DTYPES = {
    "float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "float64": (2, 64),
    "int64": (0, 64), "int32": (0, 32), "int16": (0, 16), "int8": (0, 8), "uint8": (1, 8),
    "bool": (6, 8),
}


def align(offset: int, alignment: int = ALIGNMENT) -> int:
    return (offset + alignment - 1) // alignment * alignment


# The most bytes one tensor, or an arena, may take: 4 TiB, more than any one GPU or host
# holds, so that a model whose shapes no machine runs (an output of 16 TiB) is refused when
# it is built, not by the allocator of its first run; far below where 64-bit sizes and
# offsets in the generated code and the shims, or sums of a few of them, could wrap.
MAX_BYTES = 1 << 42


def check_tensor_sizes(main) -> None:
    """A BuildError naming the first tensor of `main` (parameter or binding) larger than
    MAX_BYTES: a model whose shapes no machine holds, caught before any size is written
    into C++."""
    def tensors(type_):
        if isinstance(type_, TensorType):
            yield type_
        else:
            for field_type in getattr(type_, "fields", ()):
                yield from tensors(field_type)
    values = [(param.name_hint, param.type) for param in main.params]
    values += [(binding.var.name_hint, binding.var.type) for binding in main.bindings]
    for name, type_ in values:
        for tensor in tensors(type_):
            size = nbytes(tensor)
            if size > MAX_BYTES:
                raise BuildError(f"tensor {name!r} of shape {tuple(tensor.shape)} ({tensor.dtype}) needs {size} bytes "
                                 f"({size / 2**40:.0f} TiB), more than the {MAX_BYTES} (4 TiB) one tensor may take")


_CHECKSUM_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix_finalize(x):
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _splitmix_finalize_inplace(x, scratch):
    """_splitmix_finalize on a uint64 array, in place (`scratch`: an array of its size)."""
    for shift, multiplier in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        np.right_shift(x, np.uint64(shift), out=scratch)
        np.bitwise_xor(x, scratch, out=x)
        if multiplier is not None:
            np.multiply(x, np.uint64(multiplier), out=x)


def blob_checksum(data: bytes) -> int:
    """The checksum the model runtime recomputes at create (byoc_blob_checksum in
    byoc/runtime/model_runtime.cc) for the weights, the program table and JSON graphs it
    embeds: each 8-byte little-endian word (the last zero-padded) mixed with its position,
    summed mod 2**64, and the sum mixed with the length. Order-independent sums let NumPy
    do it in chunks, in place, no copies: chunks of 2 MB, so that the dozen passes over each
    stay in the CPU's cache (twice as fast as 32 MB chunks on a BERT-base's 220 MB)."""
    total = np.uint64(0)
    chunk_words = 1 << 18
    whole = len(data) // 8 * 8
    tail = bytes(data[whole:])
    words = np.frombuffer(memoryview(data)[:whole], dtype="<u8")
    offsets = np.arange(min(chunk_words, len(words)), dtype=np.uint64)
    mixed = np.empty_like(offsets)
    scratch = np.empty_like(offsets)
    with np.errstate(over="ignore"):
        for start in range(0, len(words), chunk_words):
            count = min(chunk_words, len(words) - start)
            position, chunk = mixed[:count], words[start:start + count]
            np.add(offsets[:count], np.uint64(start), out=position)
            np.multiply(position, _CHECKSUM_GOLDEN, out=position)
            np.bitwise_xor(position, chunk, out=position)
            _splitmix_finalize_inplace(position, scratch[:count])
            total = total + position.sum(dtype=np.uint64)
        if tail:  # the last word, zero-padded, at its position
            last = np.frombuffer(tail + b"\0" * (8 - len(tail)), dtype="<u8")
            total = total + _splitmix_finalize(last ^ (np.uint64(len(words)) * _CHECKSUM_GOLDEN))[0]
        return int(_splitmix_finalize(np.uint64(total) ^ (np.uint64(len(data)) * _CHECKSUM_GOLDEN)))


def nbytes(type_: TensorType) -> int:
    return math.prod(type_.shape) * numpy_dtype(type_.dtype).itemsize


def c_string_literal_body(text: str) -> str:
    """The inside of a C string literal for any text: everything but [A-Za-z0-9 _.-] is
    written as a 3-digit octal escape, so quotes, newlines, backslashes, '*/', '#', '??'
    trigraphs and non-ASCII bytes cannot change the generated program."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char.isascii() and (char.isalnum() or char in " _.-"):
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return "".join(out)


def comment_safe(text: str, limit: int = 60) -> str:
    """A model-given name reduced to characters that are harmless in a // comment."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:limit]


@dataclass
class TensorPlacement:
    """Where one tensor lives at run time: a C expression of type void*."""
    expression: str
    type: TensorType


@dataclass
class HostPlan:
    inputs: list  # (name, TensorType)
    outputs: list  # (name, TensorType)
    calls: list  # dict(symbol, args, results, label)
    output_copies: list  # dict(output, source, bytes)
    input_copies: list  # dict(input, destination, bytes): static_io only
    weights: bytes
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
    """The weights blob the plans place constants in: each constant once, 256-byte aligned.
    One blob can serve the plans of several programs (a library's shape buckets, each
    imported on its own): a constant equal to one placed before, in dtype, shape and bytes,
    takes that one's offset."""

    def __init__(self, share_equal: bool = False):
        self.data = bytearray()
        self.share_equal = share_equal
        self.offsets: dict = {}  # id(Constant) -> offset
        self._by_content: dict = {}  # (dtype, shape, digest) -> offset

    def place(self, constant: Constant) -> int:
        key = id(constant)
        if key in self.offsets:
            return self.offsets[key]
        data = np.ascontiguousarray(constant.data)
        content = None
        if self.share_equal:
            import hashlib
            content = (str(data.dtype), data.shape, hashlib.blake2b(memoryview(data).cast("B"), digest_size=20).digest())
            if content in self._by_content:
                self.offsets[key] = self._by_content[content]
                return self.offsets[key]
        offset = align(len(self.data))
        self.data.extend(b"\0" * (offset - len(self.data)))
        self.data.extend(data.tobytes())
        self.offsets[key] = offset
        if content is not None:
            self._by_content[content] = offset
        return offset


def plan_host(mod: IRModule, workspace_bytes: dict[str, int] | None = None,
              output_names: list[str] | None = None, static_io: bool = False, device: str = "cpu",
              value_devices: dict | None = None, function_devices: dict | None = None,
              view_symbols=frozenset(), graph_regions: list | None = None,
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

    `graph_regions` (RewriteCUDAGraph's regions, lists of binding indices of main): the
    plan's `regions` then cover every call in order, each captured into its own CUDA graph
    or (the calls between regions) run directly.

    `weights`: the blob to place constants in (a library's programs share one; the plan's
    `weights` are then empty: the blob holds them); without it, the plan's own blob's bytes."""
    main = mod["main"]
    results = list(main.result.fields) if isinstance(main.result, Tuple) else [main.result]
    names = output_names or ([f"output_{i}" for i in range(len(results))] if len(results) > 1 else ["output"])
    placer = _Placer(main, results, device, frozenset(view_symbols), weights or WeightsBlob())
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
    regions = _call_regions(calls, graph_regions) if graph_regions else []
    host_symbols = placer.host_symbols
    plan = HostPlan(inputs=inputs, outputs=[(name, result.type) for name, result in zip(names, results)],
                    calls=calls, output_copies=placer.output_copies(), input_copies=input_copies,
                    # a blob the programs of a library share: its bytes once, when all are placed
                    weights=bytes(placer.weights.data) if weights is None else b"",
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


def _call_regions(calls: list, graph_regions: list) -> list:
    """The calls as consecutive regions: {"first", "count", "capture"}; a region of
    RewriteCUDAGraph (by binding position) is captured, the calls between run directly."""
    region_of = {position: number for number, region in enumerate(graph_regions) for position in region}
    regions, previous = [], object()  # (no key equals the first call's)
    for index, call in enumerate(calls):
        key = region_of.get(call["position"])  # None: between regions
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
        # PlanMemory's memory spaces as the memories of the placement expressions: the
        # build device's arena (A), and in a cuda build the host arena (malloc, H) and the
        # pinned host arena (cudaMallocHost, P)
        self.space_prefix = {"cpu": "H", "cpu/host-pinned": "P", device: "A"}
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
            self.placements[param] = TensorPlacement(f"in[{index}]", param.type)
            inputs.append((param.name_hint, param.type))
        return inputs

    def place_constant(self, constant: Constant, host: bool = False) -> TensorPlacement:
        offset = self.weights.place(constant)
        # HW: the weights in host memory, which cpu functions of a cuda build read.
        return TensorPlacement(f"{'HW' if host else 'W'} + {offset}", constant.type)

    def place_result(self, binding) -> TensorPlacement:
        """Where PlanMemory put the binding's result: the caller's output buffer, the
        arena, or a host arena."""
        var, storage = binding.var, storage_of(binding.value)
        if storage is None:
            raise BuildError(f"internal: %{var.name_hint} has no storage; PlanMemory runs before the host plan")
        space, offset, _ = storage
        if space == OUTPUT:
            placement = TensorPlacement(f"out[{offset}]", var.type)
        elif space in self.space_prefix:
            prefix = self.space_prefix[space]
            if prefix == "A":
                self.own_offsets[var] = offset
            placement = TensorPlacement(f"{prefix} + {offset}", var.type)
        else:
            raise BuildError(f"%{var.name_hint} is placed in memory space {space!r} (devices.pin), which this "
                             f"build cannot hold: its model runtime drives one device ({self.device}) and the host; "
                             f"the memory spaces it has are {', '.join(sorted(self.space_prefix))}")
        self.placements[var] = placement
        return placement

    def device_copy(self, position: int, binding) -> dict:
        source, var = binding.value.args[0], binding.var
        destination = self.place_result(binding).expression
        if isinstance(source, Constant):
            to_host = self.device != "cpu" and VirtualDevice.parse(binding.value.attrs["dst"]).is_host
            source_expression = self.place_constant(source, to_host).expression
        else:
            source_expression = self.placements[source].expression
        self.pending_device_work = True
        attrs = binding.value.attrs
        return {"kind": "copy", "source": source_expression, "destination": destination, "position": position,
                "bytes": nbytes(var.type), "symbol": "device_copy", "args": [], "results": [],
                "label": f"#{position} {comment_safe(var.name_hint)} = device_copy {attrs['src']} -> {attrs['dst']}"}

    def view(self, binding) -> None:
        source = binding.value.args[0]
        if source not in self.placements:
            raise BuildError(f"the view @{binding.value.op.name} reads {source!r}, which is not a computed tensor")
        self.placements[binding.var] = TensorPlacement(self.placements[source].expression, binding.var.type)

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
                args.append(self.place_constant(arg, host).expression)
                constants.append((args[-1], nbytes(arg.type)))
            elif isinstance(arg, Var) and arg in self.placements:
                args.append(self.placements[arg].expression)
            else:
                raise BuildError(f"argument {arg!r} of @{value.op.name} is neither a constant nor a computed tensor")
        symbol = value.op.name
        if symbol not in self.symbols:
            self.symbols.append(symbol)
        call = {"kind": "call", "symbol": symbol, "args": args, "results": [self.place_result(binding).expression],
                "position": position,
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
            copies.append({"input": index, "destination": f"A + {offset}", "bytes": nbytes(param.type)})
            staged = f"A + {offset}"
            for call in calls:
                call["args"] = [staged if a == f"in[{index}]" else a for a in call["args"]]
            self.placements[param] = TensorPlacement(staged, param.type)
        return copies

    def output_copies(self) -> list:
        """The outputs no call wrote into the caller's buffer, copied there last."""
        copies = []
        for index, result in enumerate(self.results):
            if self.direct_output.get(result) == index:
                continue
            if isinstance(result, Constant):
                source = self.place_constant(result).expression
            elif result in self.placements:
                source = self.placements[result].expression
            else:
                raise BuildError(f"output {index} of main is not a tensor main computes")
            copies.append({"output": index, "source": source, "bytes": nbytes(result.type)})
        return copies


def _tensor_entry(name: str, type_: TensorType, padded: list = ()) -> dict:
    code, bits = DLPACK_DTYPES[type_.dtype]
    if len(type_.shape) > 8:
        raise BuildError(f"tensor {name!r} has {len(type_.shape)} dims; the runtime supports up to 8")
    return {"name_literal": c_string_literal_body(name), "ndim": len(type_.shape),
            "shape_list": ", ".join(str(d) for d in type_.shape) or "0", "code": code, "bits": bits,
            "dtype": type_.dtype, "bytes": nbytes(type_),
            "padded_list": ", ".join(str(p) for p in padded) if any(padded) else "0"}


def metadata_json(plan: HostPlan, *, build_id: str, target: str, arch: str | None,
                  backends: list, functions: list, weights_location: str, cuda_graph: bool = False,
                  partition_report: dict | None = None, graph: dict | None = None,
                  weights_bytes: int | None = None) -> str:
    def tensor(name, type_):
        return {"name": name, "shape": list(type_.shape), "dtype": type_.dtype}

    def placed(entries, on_host):  # where PlanDevices put data on the host: say so
        if on_host:
            for entry, host in zip(entries, on_host):
                entry["device"] = "cpu" if host else "cuda"
        return entries
    metadata = {
        "format": "byoc-model", "version": 1, "build_id": build_id, "target": target, "arch": arch,
        "inputs": placed([tensor(n, t) for n, t in plan.inputs], plan.inputs_on_host),
        "outputs": placed([tensor(n, t) for n, t in plan.outputs], plan.outputs_on_host),
        "backends": backends, "functions": functions, "cuda_graph": cuda_graph,
        # with CUDA graphs: each region's calls, and whether it is captured or runs directly
        **({"cuda_graph_regions": [{"calls": r["count"], "captured": r["capture"]} for r in plan.regions]}
           if cuda_graph else {}),
        "weights": {"bytes": len(plan.weights) if weights_bytes is None else weights_bytes,
                    "location": weights_location},
        "memory": {"arena_bytes": plan.arena_bytes, "workspace_bytes": plan.workspace_bytes,
                   **({"plan": plan.memory_plan.summary()} if plan.memory_plan else {})},
    }
    if partition_report is not None:  # so that `byoc inspect` can show it without the build dir
        metadata["partition_report"] = partition_report
    if graph is not None:  # the calls and the memory plan, for `byoc report` (report_page.py)
        metadata["graph"] = graph
    return json.dumps(metadata, sort_keys=True, separators=(",", ":"))


# Where plan_host's C expressions point, as the runtime's Ref spaces (model_runtime.h)
_SPACES = {"A": "kArena", "W": "kWeights", "H": "kHostArena", "P": "kPinnedArena", "HW": "kHostWeights"}
_PLACEMENT = re.compile(r"^(?:(A|W|HW|H|P) \+ (\d+)|(in|out)\[(\d+)\])$")


def runtime_ref(expression: str) -> tuple[str, int]:
    """A placement expression of plan_host ("A + 256", "in[0]") as (Space, offset)."""
    match = _PLACEMENT.match(expression)
    if match is None:
        raise BuildError(f"internal: placement {expression!r} is not one the model runtime knows")
    if match.group(1):
        return _SPACES[match.group(1)], int(match.group(2))
    return ("kInput" if match.group(3) == "in" else "kOutput"), int(match.group(4))


_SPACE_NUMBERS = {"kArena": 0, "kWeights": 1, "kInput": 2, "kOutput": 3, "kHostArena": 4, "kPinnedArena": 5,
                  "kHostWeights": 6}  # enum Space of model_runtime.h


def program_table(plan: HostPlan, stateful: list | None = None) -> bytes:
    """The calls, their operands, the regions and the caller copies of `plan` as the
    binary program table the runtime decodes (byoc/runtime/model_program.cc, which
    describes the layout). A call names its function by its number in
    plan.extern_symbols less `stateful` (render_host's function table), or its state by
    its number in `stateful`."""
    stateful = list(stateful or [])
    functions = [symbol for symbol in plan.extern_symbols if symbol not in stateful]
    refs, calls, labels = [], [], bytearray()
    max_args = 0
    for call in plan.calls:
        copy = call.get("kind") == "copy"
        operands = [call["source"]] if copy else call["args"]
        first = len(refs)
        refs.extend(runtime_ref(expression) for expression in operands)
        refs.append(runtime_ref(call["destination"] if copy else call["results"][0]))
        symbol = call.get("symbol")
        flags = copy | bool(call.get("on_host")) << 1 | bool(call.get("sync_before")) << 2
        calls.append(struct.pack("<iiIIIIQII", -1 if copy or symbol in stateful else functions.index(symbol),
                                 stateful.index(symbol) if not copy and symbol in stateful else -1, flags, first,
                                 len(operands), len(refs) - 1, call.get("bytes", 0) if copy else 0, len(labels), 0))
        labels += call["label"].encode("utf-8").replace(b"\0", b"?") + b"\0"
        max_args = max(max_args, len(operands))
    regions = [struct.pack("<IIII", r["first"], r["count"], int(r["capture"]), 0) for r in plan.regions]
    copies = [struct.pack("<iIQQ", c[key], _SPACE_NUMBERS[ref[0]], ref[1], c["bytes"])
              for copies, key, where in ((plan.input_copies, "input", "destination"),
                                         (plan.output_copies, "output", "source"))
              for c in copies for ref in [runtime_ref(c[where])]]
    header = b"BYOCPRG1" + struct.pack("<8I", len(calls), len(refs), len(regions), len(plan.input_copies),
                                       len(plan.output_copies), max_args, len(labels) or 1, 0)
    body = b"".join(struct.pack("<IIQ", _SPACE_NUMBERS[space], 0, offset) for space, offset in refs)
    return header + body + b"".join(calls) + b"".join(regions) + b"".join(copies) + (bytes(labels) or b"\0")


def read_program_table(data: bytes) -> dict:
    """program_table's bytes as plain data (tests, tools): "refs" [(space, offset)],
    "calls" [{function, state, copy, on_host, sync_before, operands, result, bytes, label}],
    "regions" [(first, count, capture)], "input_copies" / "output_copies" [(tensor, (space,
    offset), bytes)]. The runtime's own decoder (model_program.cc) is what checks it."""
    if data[:8] != b"BYOCPRG1":
        raise BuildError("not a byoc program table (it does not start with BYOCPRG1)")
    counts = struct.unpack_from("<8I", data, 8)
    num_calls, num_refs, num_regions, num_inputs, num_outputs = counts[:5]
    names = {number: name for name, number in _SPACE_NUMBERS.items()}
    at = 40
    refs = []
    for _ in range(num_refs):
        space, _, offset = struct.unpack_from("<IIQ", data, at)
        refs.append((names[space], offset))
        at += 16
    labels_start = len(data) - counts[6]
    calls = []
    for _ in range(num_calls):
        function, state, flags, first, count, result, size, label, _ = struct.unpack_from("<iiIIIIQII", data, at)
        end = data.index(b"\0", labels_start + label)
        calls.append({"function": function, "state": state, "copy": bool(flags & 1), "on_host": bool(flags & 2),
                      "sync_before": bool(flags & 4), "operands": refs[first:first + count], "result": refs[result],
                      "bytes": size, "label": data[labels_start + label:end].decode("utf-8")})
        at += 40
    regions = []
    for _ in range(num_regions):
        first, count, capture, _ = struct.unpack_from("<IIII", data, at)
        regions.append((first, count, bool(capture)))
        at += 16
    copies = []
    for _ in range(num_inputs + num_outputs):
        tensor, space, offset, size = struct.unpack_from("<iIQQ", data, at)
        copies.append((tensor, (names[space], offset), size))
        at += 24
    return {"refs": refs, "calls": calls, "regions": regions, "input_copies": copies[:num_inputs],
            "output_copies": copies[num_inputs:]}


@dataclass
class HostVariant:
    """One program of a library (model_runtime.h: VariantSpec): its host plan, its program
    table (program_table(plan, stateful)) embedded under `program_symbol`, and how it runs."""
    plan: HostPlan
    program: bytes
    program_symbol: str = "byoc_program_table"
    stateful: list = field(default_factory=list)  # extern symbols with state per model instance
    cuda_graph: bool = False
    graph_io: str | None = None  # with cuda_graph: "copy" (the plan has static_io) or "update"
    devices: bool = False  # the plan places data on the host too (plan_host was given devices)
    description: str = ""  # what the variant is for, in a comment (a shape bucket)
    # shape buckets: per caller tensor (inputs, then outputs), per axis, the paddable dim it
    # carries (None: a fixed axis), and the bucket's size of each dim
    axis_dims: list | None = None
    dims: dict = field(default_factory=dict)


def render_host(variants: list, *, cuda: bool, build_id: str, arch_number: int | None,
                weights_embedded: bool, weights_bytes: int, weights_checksum: int = 0, padded_dims: list = (),
                weights_symbol: str = "byoc_weights_blob", metadata_symbol: str = "byoc_metadata_json") -> str:
    """The model's tables for the static runtime (byoc/runtime/model_runtime.cc): per
    HostVariant the caller's tensors, the extern functions and the program table, and the
    ModelSpec over them and the weights. The metadata JSON, the weights and the program
    tables are embedded by assembler files (render_blob_assembly) under `metadata_symbol`,
    `weights_symbol` and each variant's program symbol. A stateful symbol SYMBOL has
    SYMBOL_init (makes its state at create) and SYMBOL_destroy (frees it), and every call
    passes the state first. `padded_dims` names the dims run() pads (ModelSpec::padded_dims;
    each variant's axis_dims and dims say which axes carry them and its sizes of them)."""
    padded_dims = list(padded_dims)
    if len(padded_dims) > 8:
        raise BuildError(f"{len(padded_dims)} paddable dims ({', '.join(padded_dims)}); the runtime pads up to 8")

    def variant_data(variant: HostVariant) -> dict:
        plan, stateful = variant.plan, list(variant.stateful)
        tensors = plan.inputs + plan.outputs
        axis_dims = variant.axis_dims or [[None] * len(t.shape) for _, t in tensors]
        # per axis: 0 fixed, n the padded dim n - 1 (zero-initialized entries stay fixed)
        padded = [[padded_dims.index(d) + 1 if d in padded_dims else 0 for d in axes] for axes in axis_dims]
        entries = [_tensor_entry(n, t, p) for (n, t), p in zip(tensors, padded)]
        return {
            "description": variant.description,
            "program": {"symbol": variant.program_symbol, "bytes": len(variant.program),
                        "checksum": blob_checksum(variant.program)},
            "arena_bytes": plan.arena_bytes, "workspace_bytes": plan.workspace_bytes,
            "inputs": entries[:len(plan.inputs)], "outputs": entries[len(plan.inputs):],
            "padded_dim_values": ", ".join(str(variant.dims[d]) for d in padded_dims),
            "functions": [symbol for symbol in plan.extern_symbols if symbol not in stateful],
            "stateful": stateful, "cuda_graph": variant.cuda_graph and cuda, "graph_io": variant.graph_io or "copy",
            "devices": {"inputs_on_host": [str(v).lower() for v in plan.inputs_on_host],
                        "outputs_on_host": [str(v).lower() for v in plan.outputs_on_host],
                        "host_arena_bytes": plan.host_arena_bytes, "pinned_arena_bytes": plan.pinned_arena_bytes,
                        "host_workspace_bytes": plan.host_workspace_bytes,
                        "sync_at_end": plan.sync_at_end} if variant.devices and cuda else None,
        }
    data = [variant_data(variant) for variant in variants]
    return render_template("host/model.cc.j2", {
        "build_id": build_id, "metadata_symbol": metadata_symbol,
        "weights": {"embedded": weights_embedded, "bytes": weights_bytes, "symbol": weights_symbol},
        "variants": data, "arch_number": arch_number or 0, "weights_checksum": weights_checksum,
        "padded_dims": [c_string_literal_body(name) for name in padded_dims],
        # each declared once (variants share kernels and entry points)
        "functions": list(dict.fromkeys(s for v in data for s in v["functions"])),
        "stateful": list(dict.fromkeys(s for v in data for s in v["stateful"])),
    })


def render_blob_assembly(blob_path_literal: str, symbol: str, what: str) -> str:
    """An assembler file that embeds a file (the weights blob, the metadata JSON) with
    .incbin (fast for any size, unlike a C array), NUL-terminated. The symbol is hidden so
    that two models loaded in one process do not see each other's."""
    return render_template("host/blob.S.j2", {"symbol": symbol, "path": blob_path_literal, "what": what})


def write_safetensors(path, blob: bytes, build_id: str):
    """The sidecar: one uint8 tensor 'byoc_weights' holding the blob, and the build id in
    __metadata__ (the library refuses a sidecar of another build)."""
    header = {"__metadata__": {"build_id": build_id, "format": "byoc"},
              "byoc_weights": {"dtype": "U8", "shape": [len(blob)], "data_offsets": [0, len(blob)]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(len(text).to_bytes(8, "little"))
        file.write(text)
        file.write(blob)
