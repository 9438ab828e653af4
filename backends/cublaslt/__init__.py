"""The cublaslt backend (JSON-runtime flavor): regions of GEMMs with their epilogues,
serialized as JSON (SCHEMA.md) and embedded in the model; the engine (engine/, part of
the runtime) parses and plans them with cuBLASLt when the model is created and only
executes them at run. The same engine runs them on the CPU for the cpu target."""
from __future__ import annotations

from byoc.backend import register_backend
from byoc.target import AttrSchema, at_least, register_target_kind

from .codegen import ENGINE_DIR, ENGINE_SOURCES, codegen
from .patterns import pattern_table

register_target_kind("cublaslt", {
    "workspace_limit": AttrSchema(int, 32 << 20, None, "cuBLASLt workspace per matmul (bytes)",
                                    check=at_least(0)),
    "timed_selection": AttrSchema(bool, False, None, "time the top algorithms at create() instead of the heuristic"),
    "candidates": AttrSchema(int, 8, None, "how many algorithms timed selection tries",
                               check=at_least(1)),
    "tf32": AttrSchema(bool, False, None, "float32 matmuls on TF32 tensor cores (cuBLASLt's FAST_TF32 compute; "
                                            "the config's tf32 key sets it)"),
})

__all__ = ["ENGINE_DIR", "ENGINE_SOURCES", "codegen", "pattern_table"]

def unavailable() -> str | None:
    """What this machine lacks to build cublaslt functions for a GPU: cuBLASLt's headers and
    library (the cpu target's engine needs neither)."""
    from byoc.toolchain.locate import missing_nvidia_library
    return missing_nvidia_library("cublasLt")


register_backend("cublaslt", flavor="json", patterns=pattern_table(), codegen=codegen, device="any",
                 unavailable=unavailable)
