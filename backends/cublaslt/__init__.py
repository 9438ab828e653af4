"""The cublaslt backend (JSON-runtime flavor): regions of GEMMs with their epilogues,
serialized as JSON (SCHEMA.md) and embedded in the model; the engine (engine/, part of
the runtime) parses and plans them with cuBLASLt when the model is created and only
executes them at run. The same engine runs them on the CPU for the cpu target."""
from __future__ import annotations

import math
from pathlib import Path

from byoc.backend import Artifact, PatternEntry, register_backend
from byoc.codegen.host import blob_checksum
from byoc.codegen.templates import render_template
from byoc.ir.types import numpy_dtype
from byoc.pattern import is_op, wildcard
from byoc.target import AttrSchema, at_least, register_target_kind

from .serialize import serialize_function

ENGINE_DIR = Path(__file__).parent / "engine"
# The engine's host parts (engine/engine.cc names each one's role); engine_cuda.cu is its
# CUDA executor.
ENGINE_SOURCES = ("engine.cc", "engine_json.cc", "engine_graph.cc", "engine_plan.cc", "engine_cpu.cc")
FLOAT_TYPES = ("float32", "float16", "bfloat16")

register_target_kind("cublaslt", {
    "workspace_limit": AttrSchema(int, 32 << 20, None, "cuBLASLt workspace per matmul (bytes)",
                                    check=at_least(0)),
    "timed_selection": AttrSchema(bool, False, None, "time the top algorithms at create() instead of the heuristic"),
    "candidates": AttrSchema(int, 8, None, "how many algorithms timed selection tries",
                               check=at_least(1)),
})


def _add(x, y):
    return is_op("add")(x, y) | is_op("add")(y, x)


def _check(match) -> str | None:
    a, b, out = match["a"], match["b"], match.output
    if out.type.dtype not in FLOAT_TYPES:
        return f"dtype {out.type.dtype} (the engine takes float32, float16, bfloat16)"
    batch_a, batch_b = a.type.shape[:-2], b.type.shape[:-2]
    if len(b.type.shape) > 2 and tuple(batch_a) != tuple(batch_b):
        return "batch dims broadcast partially (the engine needs equal batches or a 2-D B)"
    if len(a.type.shape) < 2 or len(b.type.shape) < 2:
        return "a vector operand"
    if "bias" in match.named and len(match["bias"].type.shape) != 1:
        return "bias is not a vector"
    if "residual" in match.named and tuple(match["residual"].type.shape) != tuple(out.type.shape):
        return "residual does not have the output's shape"
    return None


def _patterns() -> list:
    dense = is_op("matmul")(wildcard().named("a"), wildcard().named("b")).named("matmul")
    bias = _add(dense, wildcard().has_rank(1).named("bias"))
    activated = is_op("gelu")(bias) | is_op("relu")(bias)
    return [
        PatternEntry("dense_bias_residual", _add(bias, wildcard().named("residual")), _check),
        PatternEntry("dense_bias_activation", activated, _check),
        PatternEntry("dense_bias", bias, _check),
        PatternEntry("dense", dense, _check),
    ]


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


def codegen(functions: dict, target) -> list:
    from byoc.runtime import INCLUDE_DIR
    from byoc.toolchain import CompileUnit, cuda_include_dirs
    device = target.device
    cuda = device.kind == "cuda"
    workdir = Path(target.workdir)
    options = (f"workspace_limit={target.attrs['workspace_limit']};"
               f"timed_selection={int(target.attrs['timed_selection'])};candidates={target.attrs['candidates']}")
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
            "graph_bytes": ",\n".join(", ".join(str(b) for b in graph[i:i + 24]) for i in range(0, len(graph), 24)),
        }))
        units.append(CompileUnit(source, "cxx", host_flags, f"{symbol}.o"))
    # every partition's engine is state of the model instance (see wrapper.cc.j2)
    return [Artifact(backend="cublaslt", kind="json", symbols=list(functions),
                     compile_units=units, workspace_bytes=workspace, stateful_symbols=list(functions),
                     link_libraries=["cublasLt"] if cuda else [])]


register_backend("cublaslt", flavor="json", patterns=_patterns(), codegen=codegen, device="any")
