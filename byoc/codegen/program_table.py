"""The program table: a host plan's calls, their operands (the runtime's Refs), the CUDA
graph regions and the caller copies, as the binary table the static model runtime decodes
and checks at create (byoc/runtime/model_program.cc describes the layout)."""
from __future__ import annotations

import struct

from ..errors import BuildError
from .host_plan import SPACES, HostPlan

_SPACE_NUMBERS = {space: number for number, space in enumerate(SPACES)}


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
        refs.extend(operands)
        refs.append(call["destination"] if copy else call["results"][0])
        symbol = call.get("symbol")
        flags = copy | bool(call.get("on_host")) << 1 | bool(call.get("sync_before")) << 2
        calls.append(struct.pack("<iiIIIIQII", -1 if copy or symbol in stateful else functions.index(symbol),
                                 stateful.index(symbol) if not copy and symbol in stateful else -1, flags, first,
                                 len(operands), len(refs) - 1, call.get("bytes", 0) if copy else 0, len(labels), 0))
        labels += call["label"].encode("utf-8").replace(b"\0", b"?") + b"\0"
        max_args = max(max_args, len(operands))
    regions = [struct.pack("<IIII", r["first"], r["count"], int(r["capture"]), 0) for r in plan.regions]
    copies = [struct.pack("<iIQQ", c[key], _SPACE_NUMBERS[c[where].space], c[where].offset, c["bytes"])
              for copies, key, where in ((plan.input_copies, "input", "destination"),
                                         (plan.output_copies, "output", "source"))
              for c in copies]
    header = b"BYOCPRG2" + struct.pack("<8I", len(calls), len(refs), len(regions), len(plan.input_copies),
                                       len(plan.output_copies), max_args, len(labels) or 1, 0)
    body = b"".join(struct.pack("<IIQQ", _SPACE_NUMBERS[ref.space], 0, ref.offset, ref.bytes) for ref in refs)
    return header + body + b"".join(calls) + b"".join(regions) + b"".join(copies) + (bytes(labels) or b"\0")


def read_program_table(data: bytes) -> dict:
    """program_table's bytes as plain data (tests, tools): "refs" [(space, offset)] and
    "ref_bytes" (each operand's size),
    "calls" [{function, state, copy, on_host, sync_before, operands, result, bytes, label}],
    "regions" [(first, count, capture)], "input_copies" / "output_copies" [(tensor, (space,
    offset), bytes)]. The runtime's own decoder (model_program.cc) is what checks it."""
    if data[:8] != b"BYOCPRG2":
        raise BuildError("not a byoc program table (it does not start with BYOCPRG2)")
    counts = struct.unpack_from("<8I", data, 8)
    num_calls, num_refs, num_regions, num_inputs, num_outputs = counts[:5]
    names = {number: name for name, number in _SPACE_NUMBERS.items()}
    at = 40
    refs, ref_bytes = [], []
    for _ in range(num_refs):
        space, _, offset, size = struct.unpack_from("<IIQQ", data, at)
        refs.append((names[space], offset))
        ref_bytes.append(size)
        at += 24
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
    return {"refs": refs, "ref_bytes": ref_bytes, "calls": calls, "regions": regions, "input_copies": copies[:num_inputs],
            "output_copies": copies[num_inputs:]}
