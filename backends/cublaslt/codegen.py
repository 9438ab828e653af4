"""The cublaslt backend's codegen: each partition serialized as the engine's JSON graph
(serialize.py) and embedded in a small C++ wrapper (templates/cublaslt/wrapper.cc.j2) that
creates the engine when the model is created; the engine's sources (engine/) compiled
with the device target's flags."""
from __future__ import annotations

import math
from pathlib import Path

from byoc.backend import Artifact
from byoc.codegen.host import blob_checksum
from byoc.codegen.templates import render_template
from byoc.ir.types import numpy_dtype

from .serialize import serialize_function

ENGINE_DIR = Path(__file__).parent / "engine"
# The engine's host parts (engine/engine.cc names each one's role); engine_cuda.cu is its
# CUDA executor.
ENGINE_SOURCES = ("engine.cc", "engine_json.cc", "engine_graph.cc", "engine_plan.cc", "engine_cpu.cc")


def _workspace_estimate(function, limit: int) -> int:
    """An upper bound of what the engine asks for: every intermediate of the region in its
    own slot plus the cuBLASLt workspace."""
    total = 0
    for binding in function.bindings:
        inner = binding.value
        if hasattr(inner, "bindings") and inner.bindings:
            for b in inner.bindings:
                total += math.prod(b.var.type.shape) * numpy_dtype(b.var.type.dtype).itemsize + 256
    return total + limit + (1 << 20)


def _bytes(type_) -> int:
    return math.prod(type_.shape) * numpy_dtype(type_.dtype).itemsize


def codegen(functions: dict, target) -> list:
    from byoc.runtime import INCLUDE_DIR
    from byoc.toolchain import CompileUnit, cuda_include_dirs
    device = target.device
    cuda = device.kind == "cuda"
    workdir = Path(target.workdir)
    options = (f"workspace_limit={target.attrs['workspace_limit']};"
               f"timed_selection={int(target.attrs['timed_selection'])};candidates={target.attrs['candidates']}")
    if target.attrs["tf32"]:
        options += ";tf32=1"
    units, workspace = [], {}
    if cuda:
        host_flags = device.cxx_flags() + ["-DBYOC_JSON_ENGINE_WITH_CUDA", f"-I{ENGINE_DIR}", f"-I{INCLUDE_DIR}"] + \
            [f"-I{d}" for d in cuda_include_dirs()]
        cuda_flags = device.nvcc_flags() + ["-DBYOC_JSON_ENGINE_WITH_CUDA", f"-I{ENGINE_DIR}"] + \
            [f"-I{d}" for d in cuda_include_dirs()]
        units.append(CompileUnit(ENGINE_DIR / "engine_cuda.cu", "cuda", cuda_flags,
                                 f"json_engine_cuda_{device.attrs['arch']}.o"))
    else:
        host_flags = device.cxx_flags() + [f"-I{ENGINE_DIR}", f"-I{INCLUDE_DIR}"]
    for source in ENGINE_SOURCES:
        units.append(CompileUnit(ENGINE_DIR / source, "cxx", host_flags,
                                 f"json_{source[:-3]}_{'cuda_host' if cuda else 'cpu'}.o"))
    for symbol, function in functions.items():
        graph = serialize_function(function).encode("ascii")
        workspace[symbol] = _workspace_estimate(function, target.attrs["workspace_limit"] if cuda else 0)
        source = workdir / f"{symbol}.cc"
        source.write_text(render_template("cublaslt/wrapper.cc.j2", {
            "symbol": symbol, "device_kind": 2 if cuda else 1, "options": options,
            "workspace_bytes": workspace[symbol], "graph_checksum": blob_checksum(graph),
            "input_bytes": [_bytes(param.type) for param in function.params],
            "output_bytes": [_bytes(t) for t in getattr(function.ret_type, "fields", None) or [function.ret_type]],
            "graph_bytes": ",\n".join(", ".join(str(b) for b in graph[i:i + 24]) for i in range(0, len(graph), 24)),
        }))
        units.append(CompileUnit(source, "cxx", host_flags, f"{symbol}.o"))
    # every partition's engine is state of the model instance (see wrapper.cc.j2)
    return [Artifact(backend="cublaslt", kind="json", symbols=list(functions),
                     compile_units=units, workspace_bytes=workspace, stateful_symbols=list(functions),
                     link_libraries=["cublasLt"] if cuda else [])]
