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
})

__all__ = ["ENGINE_DIR", "ENGINE_SOURCES", "codegen", "pattern_table"]

register_backend("cublaslt", flavor="json", patterns=pattern_table(), codegen=codegen, device="any")
