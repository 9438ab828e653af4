"""Family 3: corrupted libraries, sidecars and foreign files that look like libraries.

A copy of a built library is damaged in the child's folder (`corrupt.so`), loaded with
byoc.load and run on the fixture input: the outcome must be a byoc error that names the
file, or the right answer (a flip in bytes nothing reads) -- never a crash. Damage is
placed with the file's layout (libraries._layout): truncation; byte flips in the ELF
header, the program headers, the section headers, the dynamic section and the symbol
names; edits of the embedded metadata JSON that keep its length (a renamed key, invalid
JSON or UTF-8, another shape or dtype); flips in the embedded weights. Flips in machine
code are left out: no loader can tell a flipped instruction from a meant one without a
checksum of the whole file.

Each family has positive controls (an undamaged copy, and one resealed) that must load and
answer right. Metadata edits and weight flips also run resealed (the library's SHA-256
seal recomputed, so the checks behind it are reached), and the program table is forged
with its checksum and the seal recomputed: operands past the end of their memory, in a
memory the model lacks, a caller tensor of another size, a host call in a cpu model; the
decoder must refuse each from the model's own tables. A JSON-runtime partition's graph is
forged the same way (another valid graph of other tensor sizes, invalid ones): the engine
checks it against the interface the wrapper was compiled with.

Sidecar weights (`corrupt.safetensors`): truncation, header length and JSON edits, flips
in the data, and files that are no file (a FIFO, a directory).
Fakes (libraries.build_fakes): libraries that export byoc's symbols but lie.
"""
from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np

from . import libraries
from .runner import Case, Outcome, case_dir

FUNCTION = "robustness.cases_library:run_corrupted"
TIMEOUT = 20.0
NAMES = ("corrupt.so", "corrupt.safetensors", "fake.so")


# ---- damage, applied in the child --------------------------------------------------------

def _flip(data: bytearray, offset: int, mask: int = 0xFF):
    if 0 <= offset < len(data):
        data[offset] ^= mask


def damage(data: bytearray, kind: str, args: dict) -> bytes:
    if kind == "truncate":
        return bytes(data[:args["size"]])
    if kind == "append":
        return bytes(data) + bytes(args["bytes"])
    if kind == "flip":
        for offset in args["offsets"]:
            _flip(data, offset, args.get("mask", 0xFF))
        return bytes(data)
    if kind == "write":
        offset, value = args["offset"], args["value"]
        data[offset:offset + len(value)] = value
        return bytes(data)
    raise AssertionError(kind)


def _resealed(data: bytes) -> bytes:
    """`data` with byoc's seal recomputed (the old one, if it is still at the end, dropped),
    as byoc.runtime.seal_library writes it."""
    import tempfile

    from byoc.runtime.library_file import SEAL_BYTES, SEAL_MAGIC, seal_library
    if len(data) >= SEAL_BYTES and data[-SEAL_BYTES:-SEAL_BYTES + len(SEAL_MAGIC)] == SEAL_MAGIC:
        data = data[:-SEAL_BYTES]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "resealed.so"
        path.write_bytes(bytes(data))
        seal_library(path)
        return path.read_bytes()


def _forged(data: bytearray, args: dict) -> bytes:
    """The program table (or the JSON graph: args["blob"]) edited at (offset in it, bytes),
    its checksum in the host code recomputed: a forgery the checksum cannot tell from the
    build's own."""
    from byoc.codegen.host import blob_checksum
    start, length = args["program"] if "program" in args else args["blob"]
    for offset, value in args["table_edits"]:
        data[start + offset:start + offset + len(value)] = value
    at = args["checksum_at"]
    data[at:at + 8] = struct.pack("<Q", blob_checksum(bytes(data[start:start + length])))
    return bytes(data)


def _write_damaged(source: str, name: str, kind: str, args: dict) -> str:
    data = bytearray(open(source, "rb").read())
    path = case_dir() / name
    if kind == "forge":
        path.write_bytes(_resealed(_forged(data, args)))
        path.chmod(0o755)
        return str(path)
    if kind == "replace":
        what = args["what"]
        if what == "fifo":
            os.mkfifo(path)
        elif what == "directory":
            path.mkdir()
        elif what == "empty":
            path.write_bytes(b"")
        elif what == "symlink loop":
            os.symlink(case_dir() / "loop", path)
            os.symlink(path, case_dir() / "loop")
        return str(path)
    damaged = damage(data, kind, args)
    path.write_bytes(_resealed(damaged) if args.get("reseal") else damaged)
    path.chmod(0o755)
    return str(path)


def run_corrupted(library: dict, target: str, kind: str, args: dict):
    """target: "library" (damage the .so), "sidecar" (damage the .safetensors) or "fake"."""
    import byoc
    context_inputs, expected = libraries.mlp_inputs()
    context_inputs = libraries.as_model_dtypes(context_inputs, library["metadata"])
    weights_path = None
    if target == "fake":
        path = args["path"]
    elif target == "library":
        path = _write_damaged(library["path"], "corrupt.so", kind, args)
        if library["kind"] == "sidecar":
            weights_path = library["sidecar"]
    else:
        path = library["path"]
        weights_path = _write_damaged(library["sidecar"], "corrupt.safetensors", kind, args)
    module = byoc.load(path, weights_path=weights_path)
    inputs = dict(context_inputs)
    if library["device"] == "cuda":
        import cupy
        inputs = {k: cupy.asarray(v) for k, v in inputs.items()}
    outputs = module.run(**inputs)
    got = outputs if not isinstance(outputs, tuple) else outputs[0]
    if library["device"] == "cuda":
        import cupy
        got = cupy.asnumpy(got)
    got, want = np.asarray(got), expected[0]
    if got.shape != want.shape:
        return Outcome("wrong", f"the damaged library ran and returned shape {got.shape}; expected {want.shape}")
    error = float(np.max(np.abs(got.astype(np.float64) - want)))
    tolerance = library["tolerance"] * max(1.0, float(np.max(np.abs(want))))
    if not error <= tolerance:
        return Outcome("wrong", f"the damaged library ran and answered wrong (max abs error {error:.3g})")
    return Outcome("correct")


# ---- generators (in the pytest process) ------------------------------------------------------

def _case(library, target, group, name, kind, args, expect="any") -> Case:
    return Case("library", group, f"{library['kind']}: {name}", FUNCTION,
                {"library": library, "target": target, "kind": kind, "args": args}, timeout=TIMEOUT,
                names=NAMES, memory_limit=None if library["device"] == "cuda" else 4 << 30, expect=expect,
                why="a library whose program table breaks the model's own tables" if expect == "refuse" else "")


def _section_bytes(library: dict, name: str) -> bytes | None:
    """The bytes of one embedded section of the library file (its layout's (start, length)),
    or None where the library has no such section."""
    if name not in library["layout"]:
        return None
    start, length = library["layout"][name]
    with open(library["path"], "rb") as handle:
        handle.seek(start)
        return handle.read(length)


def _forged_program_cases(library: dict, everything: bool) -> list[Case]:
    """The program table forged (its checksum and the seal recomputed) so that an operand
    lies outside its memory, in a memory the model does not have, or is a caller tensor of
    another size; or a call claims to run on the host of a model with no data there."""
    section = _section_bytes(library, "program")
    if section is None:
        return []
    from byoc.codegen.program_table import read_program_table
    layout = library["layout"]
    table = read_program_table(section)
    arena = library["metadata"]["memory"]["arena_bytes"]
    weights = library["metadata"]["weights"]["bytes"]
    sizes = {"kArena": arena, "kWeights": weights}
    cases = []

    def forge(label, edits):
        cases.append(_case(library, "library", "forged_program", f"program table forged: {label}", "forge",
                           {"program": layout["program"], "checksum_at": layout["program_checksum_at"],
                            "table_edits": edits}, expect="refuse"))
    refs = list(enumerate(zip(table["refs"], table["ref_bytes"], strict=True)))
    if not everything:  # the first operand of each memory and caller tensor kind
        refs = [ref for number, ref in enumerate(refs) if ref[1][0][0] not in {r[1][0][0] for r in refs[:number]}]
    for index, ((space, offset), size) in refs:
        at = 40 + 24 * index
        if space in sizes:
            forge(f"operand {index} ({space}) one byte past the end", [(at + 8, struct.pack("<Q", sizes[space] - size + 1))])
            forge(f"operand {index} ({space}) at offset 2**40", [(at + 8, struct.pack("<Q", 1 << 40))])
            forge(f"operand {index} ({space}) of 2**62 bytes", [(at + 16, struct.pack("<Q", 1 << 62))])
            forge(f"operand {index} ({space}) in the host arena", [(at, struct.pack("<I", 4))])
            forge(f"operand {index} ({space}) in space 99", [(at, struct.pack("<I", 99))])
        else:
            forge(f"operand {index} ({space} {offset}) one byte larger", [(at + 16, struct.pack("<Q", size + 1))])
            forge(f"operand {index} ({space}) tensor 7", [(at + 8, struct.pack("<Q", 7))])
    calls_at = 40 + 24 * len(table["refs"])
    for index in range(len(table["calls"]) if everything else 1):
        forge(f"call {index} on the host", [(calls_at + 40 * index + 8, struct.pack("<I", 2))])
    return cases


def _metadata_edits(library) -> list[tuple[str, int, bytes]]:
    """(label, file offset, replacement bytes of the same length) for the metadata JSON."""
    start, length = library["layout"]["metadata"]
    with open(library["path"], "rb") as handle:
        handle.seek(start)
        text = handle.read(length).decode("utf-8", "replace")
    edits = []

    def at(needle: str, replacement: str, label: str, occurrence: int = 0):
        position = -1
        for _ in range(occurrence + 1):
            position = text.find(needle, position + 1)
        if position >= 0 and len(needle) == len(replacement) and position < length:
            edits.append((label, start + position, replacement.encode("latin-1")))

    for key in ("arch", "inputs", "outputs", "weights", "target", "format", "version", "build_id", "name",
                "shape", "dtype", "location", "bytes", "cuda_graph", "memory"):
        at(f'"{key}":', f'"{key[0].upper()}{key[1:]}":', f"key {key} renamed")
    at("{", "[", "first brace is a bracket")
    at('"', "X", "first quote is X")
    at(":", ";", "first colon is a semicolon")
    at('"inputs":[', '"inputs":{', "inputs list opened as object")
    at('"float32"', '"float64"', "dtype float32 -> float64")
    at('"float32"', '"float16"', "dtype float32 -> float16")
    at('"float32"', '"bfloat1"', "dtype float32 -> unknown")
    at('"float32"', '"float32', "dtype string unterminated")
    at('"embedded"', '"sidecar" ', "weights location sidecar")
    at('"cpu"', '"gpu"', "target gpu")
    at('"cpu"', '"cud"', "target cud")
    at('"name":"x"', '"name":"z"', "input name changed")
    at('"name":"y"', '"name":"w"', "output name changed")
    at('"shape":[4,64]', '"shape":[4,65]', "input shape changed")
    at('"shape":[4,32]', '"shape":[4,33]', "output shape changed")
    at('"shape":[4,32]', '"shape":[-4,32', "output shape negative, unterminated")
    at('"shape":[4,32]', '"shape":[9e99,2', "output shape float")
    at('"shape":[4,32]', '"shape":"4,32"', "output shape as string")
    at('"version":1', '"version":9', "version 9")
    at('"byoc-model"', '"byoc-modem"', "format changed")
    edits.append(("NUL at the first byte", start, b"\0"))
    edits.append(("NUL in the middle", start + length // 2, b"\0"))
    edits.append(("invalid UTF-8 in the middle", start + length // 2, b"\xff"))
    edits.append(("last brace removed", start + length - 1, b" "))
    return edits


def library_cases(library: dict, everything: bool) -> list[Case]:
    layout = library["layout"]
    size = layout["size"]
    rng = random.Random(f"library:{library['kind']}:{library['device']}")
    cases = []
    add = cases.append
    truncations = {"64 bytes": 64, "1 KiB": 1024, "an eighth": size // 8, "a quarter": size // 4, "half": size // 2,
                   "three quarters": 3 * size // 4, "minus 4 KiB": size - 4096, "minus 1 byte": size - 1,
                   "before the section headers": layout["shoff"]}
    metadata_start, metadata_length = layout["metadata"]
    truncations["inside the metadata"] = metadata_start + metadata_length // 2
    if layout["weights"]:
        truncations["inside the weights"] = layout["weights"][0] + layout["weights"][1] // 2
    for label, cut in truncations.items():
        add(_case(library, "library", "truncated", f"truncated to {label}", "truncate", {"size": cut}))
    add(_case(library, "library", "control", "an undamaged copy", "flip", {"offsets": []}, expect="accept"))
    add(_case(library, "library", "control", "an undamaged copy, resealed", "flip", {"offsets": [], "reseal": True},
              expect="accept"))
    add(_case(library, "library", "extended", "1 MiB of zeros appended", "append", {"bytes": bytes(1 << 20)}))
    for what in ("fifo", "directory", "empty", "symlink loop"):
        add(_case(library, "library", "not a file", f"replaced by {what}", "replace", {"what": what}))

    header_bytes = list(range(64)) if everything else sorted(rng.sample(range(64), 24))
    for offset in header_bytes:
        add(_case(library, "library", "elf_header", f"ELF header byte {offset} flipped", "flip",
                  {"offsets": [offset]}))
    fields = {"class 32-bit": (4, b"\x01"), "big-endian": (5, b"\x02"), "type EXEC": (16, b"\x02\x00"),
              "machine ARM": (18, b"\x28\x00"), "phoff huge": (0x20, struct.pack("<Q", 2**62)),
              "shoff huge": (0x28, struct.pack("<Q", 2**62)), "phnum 0": (0x38, b"\x00\x00"),
              "phnum 65535": (0x38, b"\xff\xff"), "shnum 65535": (0x3C, b"\xff\xff"),
              "shstrndx 65535": (0x3E, b"\xff\xff"), "phentsize 1": (0x36, b"\x01\x00")}
    for label, (offset, value) in fields.items():
        add(_case(library, "library", "elf_header", f"ELF header {label}", "write", {"offset": offset, "value": value}))

    def table_flips(group, start, length, count, label):
        offsets = range(start, start + length)
        picks = list(offsets) if everything and length <= 512 else sorted(rng.sample(offsets, min(count, length)))
        for offset in picks:
            add(_case(library, "library", group, f"{label} byte {offset - start} flipped", "flip", {"offsets": [offset]}))

    table_flips("program_headers", layout["phoff"], layout["phnum"] * layout["phentsize"], 16 if not everything else 64,
                "program header")
    table_flips("section_headers", layout["shoff"], layout["shnum"] * layout["shentsize"], 16 if not everything else 96,
                "section header")
    for section, count in ((".dynamic", 10), (".dynsym", 8), (".gnu.hash", 4)):
        if section in layout["sections"]:
            start, length = layout["sections"][section]
            table_flips("dynamic", start, length, count if not everything else 4 * count, section)
    if ".dynstr" in layout["sections"]:
        start, length = layout["sections"][".dynstr"]
        data = open(library["path"], "rb").read()
        for symbol in (b"byoc_model_metadata", b"byoc_model_create", b"byoc_model_run", b"byoc_last_error",
                       b"byoc_model_destroy"):
            position = data.find(symbol + b"\0", start, start + length)
            if position >= 0:
                add(_case(library, "library", "symbols", f"symbol {symbol.decode()} renamed", "flip",
                          {"offsets": [position + len(symbol) - 1], "mask": 0x01}))

    for label, offset, value in _metadata_edits(library):
        add(_case(library, "library", "metadata", f"metadata {label}", "write", {"offset": offset, "value": value}))
        add(_case(library, "library", "metadata_resealed", f"metadata {label}, resealed", "write",
                  {"offset": offset, "value": value, "reseal": True}))
    for index in range(40 if everything else 10):
        offset = metadata_start + rng.randrange(metadata_length)
        add(_case(library, "library", "metadata", f"metadata random flip {index} at {offset - metadata_start}", "flip",
                  {"offsets": [offset], "mask": 1 << rng.randrange(7)}))

    if layout["weights"]:
        start, length = layout["weights"]
        positions = {"first": start, "second": start + 1, "middle": start + length // 2, "last": start + length - 1}
        for index in range(20 if everything else 4):
            positions[f"random {index}"] = start + rng.randrange(length)
        for label, offset in positions.items():
            mask = 1 << rng.randrange(8)
            add(_case(library, "library", "weights", f"weights {label} byte flipped", "flip",
                      {"offsets": [offset], "mask": mask}))
            add(_case(library, "library", "weights_resealed", f"weights {label} byte flipped, resealed", "flip",
                      {"offsets": [offset], "mask": mask, "reseal": True}, expect="refuse"))
    cases += _forged_program_cases(library, everything)
    return cases


def sidecar_cases(library: dict, everything: bool) -> list[Case]:
    data = open(library["sidecar"], "rb").read()
    (header_length,) = struct.unpack_from("<Q", data)
    header = data[8:8 + header_length]
    rng = random.Random(f"sidecar:{library['device']}")
    cases = []

    def add(group, label, kind, args, expect="any"):
        cases.append(_case(library, "sidecar", group, f"sidecar {label}", kind, args, expect=expect))

    add("sidecar_control", "an undamaged copy", "flip", {"offsets": []}, expect="accept")

    for label, cut in {"4 bytes": 4, "8 bytes": 8, "inside the header": 8 + header_length // 2,
                       "just the header": 8 + header_length, "half": len(data) // 2, "minus 1 byte": len(data) - 1}.items():
        add("sidecar_truncated", f"truncated to {label}", "truncate", {"size": cut})
    add("sidecar_extended", "1 MiB appended", "append", {"bytes": bytes(1 << 20)})
    for label, value in {"huge": 2**63, "max": 2**64 - 1, "zero": 0, "one more": header_length + 1,
                         "one less": header_length - 1, "64 MiB": 1 << 26, "just under 64 MiB": (1 << 26) - 1}.items():
        add("sidecar_header", f"header length {label}", "write", {"offset": 0, "value": struct.pack("<Q", value)})

    def edit(needle: bytes, replacement: bytes, label: str):
        position = header.find(needle)
        if position >= 0 and len(needle) == len(replacement):
            add("sidecar_header", label, "write", {"offset": 8 + position, "value": replacement})

    edit(b"{", b"[", "header JSON opens with a bracket")
    edit(b'"byoc_weights"', b'"byoc_weightz"', "tensor renamed")
    edit(b'"U8"', b'"F4"', "dtype U8 -> F4")
    edit(b'"data_offsets":[0,', b'"data_offsets":[9,', "data offsets shifted")
    edit(b'"build_id"', b'"build_ix"', "build_id key renamed")
    edit(b'"shape":[', b'"shape":{', "shape opened as object")
    add("sidecar_header", "NUL in the header", "write", {"offset": 8 + header_length // 3, "value": b"\0"})
    add("sidecar_header", "invalid UTF-8 in the header", "write", {"offset": 8 + header_length // 3, "value": b"\xff"})
    for index in range(10 if everything else 4):
        offset = 8 + header_length + rng.randrange(len(data) - 8 - header_length)
        add("sidecar_data", f"data byte flipped (random {index})", "flip", {"offsets": [offset], "mask": 1 << rng.randrange(8)})
    for what in ("fifo", "directory", "empty", "symlink loop"):
        add("sidecar_not_a_file", f"replaced by {what}", "replace", {"what": what})
    return cases


def fake_cases(library: dict, fakes: dict) -> list[Case]:
    return [_case(library, "fake", "fake_library", f"fake library: {name}", "none", {"path": path})
            for name, path in sorted(fakes.items())]


def _forged_graph_cases(library: dict) -> list[Case]:
    """The JSON-runtime partition's graph forged (its checksum and the seal recomputed) into
    another graph: one that is still valid JSON and a valid graph but of other tensor sizes
    than the host passes (the engine would read and write past the buffers), and ones that
    are not valid. The engine must refuse each at create; a resealed undamaged copy runs."""
    graph = _section_bytes(library, "graph")
    if graph is None:
        return []
    layout = library["layout"]
    cases = [_case(library, "library", "control", "an undamaged copy, resealed", "flip",
                   {"offsets": [], "reseal": True}, expect="accept")]

    def forge(label, edits):
        cases.append(_case(library, "library", "forged_graph", f"JSON graph forged: {label}", "forge",
                           {"blob": layout["graph"], "checksum_at": layout["graph_checksum_at"], "table_edits": edits},
                           expect="refuse"))
    for old, new, label in ((b'"shape":[4,', b'"shape":[8,', "every batch of 4 made 8"),
                            (b'"shape":[4,64]', b'"shape":[4,32]', "the input narrowed"),
                            (b'"float32"', b'"float16"', "a tensor made float16")):
        at = graph.find(old)
        if at >= 0:
            edited = graph.replace(old, new) if label.startswith("every") else graph[:at] + new + graph[at + len(old):]
            forge(label, [(0, edited)])
    forge("the first brace a bracket", [(graph.index(b"{"), b"[")])
    forge("a NUL in the middle", [(len(graph) // 2, b"\0")])
    return cases


def generate(libraries_by_kind: dict, fakes: dict, everything: bool) -> list[Case]:
    cases = library_cases(libraries_by_kind["mlp"], everything)
    if "json" in libraries_by_kind:
        cases += _forged_graph_cases(libraries_by_kind["json"])
    if "sidecar" in libraries_by_kind:
        cases += sidecar_cases(libraries_by_kind["sidecar"], everything)
    cases += fake_cases(libraries_by_kind["mlp"], fakes)
    return cases
