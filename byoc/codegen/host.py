"""Host code: the C++ tables a model's library is run from, and the files it embeds.

`render_host([HostVariant(plan, ...)], ...)` turns host plans (codegen/host_plan.py; one
per program of the library: a static build has one) into the tables
(templates/host/model.cc.j2) the static model runtime (byoc/runtime/: model_run.cc walks
them) runs the model from; the metadata and program tables are embedded by assembler files
(render_blob_assembly), the weights appended after the link or written as a .safetensors sidecar.
blob_checksum is the checksum the runtime recomputes over each embedded blob.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..errors import BuildError
from ..ir.types import TensorType
from .host_plan import HostPlan, nbytes
from .templates import render_template

# byoc dtype -> (DLPack type code, bits)
DLPACK_DTYPES = {
    "float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "float64": (2, 64),
    "int64": (0, 64), "int32": (0, 32), "int16": (0, 16), "int8": (0, 8), "uint8": (1, 8),
    "bool": (6, 8),
}


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


def blob_checksum(data) -> int:
    """The checksum the model runtime recomputes at create (byoc_blob_checksum in
    byoc/runtime/model_runtime.cc) for the weights, the program table and JSON graphs it
    embeds: each 8-byte little-endian word (the last zero-padded) mixed with its position,
    summed mod 2**64, and the sum mixed with the length. Order-independent sums let NumPy
    do it in chunks, in place, no copies: chunks of 2 MB, so that the dozen passes over each
    stay in the CPU's cache (twice as fast as 32 MB chunks on a BERT-base's 220 MB), and
    large blobs in shares on several threads (NumPy lets go of the GIL).

    `data` is bytes-like, or a blob in pieces (codegen/host_plan.py WeightsBlob: `pieces`,
    (offset, bytes) at 8-byte aligned offsets, and `size`, zeros elsewhere), summed piece by
    piece as if it were one buffer."""
    if hasattr(data, "pieces"):
        pieces, size = data.pieces, len(data)
    else:
        pieces, size = [(0, memoryview(data).cast("B"))], len(data)
    # the shares: (words, first, last, the blob's word index of words[0])
    shares, covered, tails = [], [], []
    for offset, piece in pieces:
        if offset % 8:
            raise ValueError(f"blob_checksum: a piece at offset {offset}, not a multiple of 8")
        whole = len(piece) // 8 * 8
        words = np.frombuffer(piece[:whole], dtype="<u8")
        base = offset // 8
        parts = max(1, min(8, len(words) // (4 << 20)))  # a share: at least 32 MB
        shares += [(words, len(words) * k // parts, len(words) * (k + 1) // parts, base) for k in range(parts)]
        if whole < len(piece):  # the piece's last word, zero-padded (the zeros after it are the blob's)
            tails.append((base + len(words), bytes(piece[whole:])))
        covered.append((base, base + -(-len(piece) // 8)))
    from ..threads import map_on_threads
    sums = map_on_threads(lambda share: _mixed_sum(*share), shares)
    with np.errstate(over="ignore"):
        total = np.uint64(0)
        for part in sums:
            total = total + part
        for index, tail in tails:
            last = np.frombuffer(tail + b"\0" * (8 - len(tail)), dtype="<u8")
            total = total + _splitmix_finalize(last ^ (np.uint64(index) * _CHECKSUM_GOLDEN))[0]
        # the zero words between pieces (a few per piece: the alignment)
        end, gaps = 0, []
        for first, last in covered:
            if first > end:
                gaps.append(np.arange(end, first, dtype=np.uint64))
            end = max(end, last)
        if -(-size // 8) > end:
            gaps.append(np.arange(end, -(-size // 8), dtype=np.uint64))
        if gaps:
            total = total + _splitmix_finalize(np.concatenate(gaps) * _CHECKSUM_GOLDEN).sum(dtype=np.uint64)
        return int(_splitmix_finalize(np.uint64(total) ^ (np.uint64(size) * _CHECKSUM_GOLDEN)))


def _mixed_sum(words, first: int, last: int, base: int = 0):
    """blob_checksum's sum over words first..last-1, each mixed with its position in the blob
    (base + its index in `words`; uint64)."""
    chunk_words = 1 << 18
    total = np.uint64(0)
    offsets = np.arange(min(chunk_words, max(last - first, 0)), dtype=np.uint64)
    mixed = np.empty_like(offsets)
    scratch = np.empty_like(offsets)
    with np.errstate(over="ignore"):
        for start in range(first, last, chunk_words):
            count = min(chunk_words, last - start)
            position, chunk = mixed[:count], words[start:start + count]
            np.add(offsets[:count], np.uint64(start + base), out=position)
            np.multiply(position, _CHECKSUM_GOLDEN, out=position)
            np.bitwise_xor(position, chunk, out=position)
            _splitmix_finalize_inplace(position, scratch[:count])
            total = total + position.sum(dtype=np.uint64)
    return total


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


def _tensor_entry(name: str, type_: TensorType, padded: list = ()) -> dict:
    code, bits = DLPACK_DTYPES[type_.dtype]
    if len(type_.shape) > 8:
        raise BuildError(f"tensor {name!r} has {len(type_.shape)} dims; the runtime supports up to 8")
    return {"name_literal": c_string_literal_body(name), "ndim": len(type_.shape),
            "shape_list": ", ".join(str(d) for d in type_.shape) or "0", "code": code, "bits": bits,
            "dtype": type_.dtype, "bytes": nbytes(type_),
            "padded_list": ", ".join(str(p) for p in padded) if any(padded) else "0"}


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
    # cuda, a build for several archs: the sm this variant's kernels are for (0: the
    # model's), and whether they carry PTX a later GPU compiles
    arch_number: int = 0
    arch_ptx: bool = False


def render_host(variants: list, *, cuda: bool, build_id: str, arch_number: int | None,
                weights_embedded: bool, weights_bytes: int, weights_checksum: int = 0, padded_dims: list = (),
                program_id: str = "", metadata_symbol: str = "byoc_metadata_json") -> str:
    """The model's tables for the static runtime (byoc/runtime/model_runtime.cc): per
    HostVariant the caller's tensors, the extern functions and the program table, and the
    ModelSpec over them and the weights. The metadata JSON and the program tables are
    embedded by assembler files (render_blob_assembly) under `metadata_symbol` and each
    variant's program symbol; embedded weights follow the ELF image in the library's file
    (runtime/library_file.py: seal_library), where the runtime maps them. A stateful symbol SYMBOL has
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
            "arch_number": variant.arch_number, "arch_ptx": variant.arch_ptx,
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
        "build_id": build_id, "program_id": program_id, "metadata_symbol": metadata_symbol,
        "weights": {"embedded": weights_embedded, "bytes": weights_bytes},
        "variants": data, "arch_number": arch_number or 0, "weights_checksum": weights_checksum,
        "padded_dims": [c_string_literal_body(name) for name in padded_dims],
        # each declared once (variants share kernels and entry points)
        "functions": list(dict.fromkeys(s for v in data for s in v["functions"])),
        "stateful": list(dict.fromkeys(s for v in data for s in v["stateful"])),
    })


def render_blob_assembly(blob_path_literal: str, symbol: str, what: str) -> str:
    """An assembler file that embeds a file (the metadata JSON, a program table) with
    .incbin (fast for any size, unlike a C array), NUL-terminated. The symbol is hidden so
    that two models loaded in one process do not see each other's."""
    return render_template("host/blob.S.j2", {"symbol": symbol, "path": blob_path_literal, "what": what})


def write_safetensors(path, blob: bytes, build_id: str, program_id: str, checksum: int):
    """A weights file (the sidecar, or new weights from `byoc refit`): one uint8 tensor
    'byoc_weights' holding the blob; in __metadata__ the program id (the library refuses
    weights of another program), the blob's checksum (the runtime checks the bytes against
    it) and the build that wrote it."""
    header = {"__metadata__": {"build_id": build_id, "checksum": str(checksum), "format": "byoc",
                               "program_id": program_id},
              "byoc_weights": {"dtype": "U8", "shape": [len(blob)], "data_offsets": [0, len(blob)]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(len(text).to_bytes(8, "little"))
        file.write(text)
        write_blob(file, blob)


def write_blob(file, blob) -> None:
    """`blob` into `file`: bytes-like, or a blob in pieces (WeightsBlob) written piece by piece."""
    if hasattr(blob, "write_to"):
        blob.write_to(file)
    else:
        file.write(blob)
