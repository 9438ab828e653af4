"""The built-in backend (extern-shim flavor): takes every op no other backend claimed.

Its partitions call the shim library (backends/builtin/shim: CPU and CUDA kernels behind
one C header) with sizes fixed at build time, or run elementwise groups rendered from
templates/builtin. The shim is compiled once per target and arch (the object cache keeps
it) and linked into every model.
"""
from __future__ import annotations

from pathlib import Path

from byoc.backend import Artifact, register_backend
from byoc.target import AttrSchema, register_target_kind

from .codegen import generate
from .partition import partition_builtin

SHIM_DIR = Path(__file__).parent / "shim"

register_target_kind("builtin", {
    "matmul_algo": AttrSchema(int, -1, None, "cuBLASLt heuristic index for every GEMM (-1: the first)"),
})


def shim_compile_units(device_target) -> list:
    """The shim library's compile units for a device target (cached like any other)."""
    from byoc.toolchain import CompileUnit, cuda_include_dirs
    if device_target.kind == "cuda":
        flags = device_target.nvcc_flags() + [f"-I{SHIM_DIR}"] + [f"-I{d}" for d in cuda_include_dirs()]
        sources = sorted((SHIM_DIR / "cuda").glob("*.cu"))
        suffix = device_target.attrs["arch"]
        return [CompileUnit(s, "cuda", flags, f"shim_{suffix}_{s.stem}.o") for s in sources]
    flags = device_target.cxx_flags() + [f"-I{SHIM_DIR}"]
    return [CompileUnit(s, "cxx", flags, f"shim_cpu_{s.stem}.o") for s in sorted((SHIM_DIR / "cpu").glob("*.cpp"))]


def codegen(functions: dict, target) -> list:
    """All builtin partitions of the module -> one generated source, plus the shim."""
    from byoc.toolchain import CompileUnit, cuda_include_dirs
    device = target.device
    kind = "cuda" if device.kind == "cuda" else "cpu"
    generated = generate(functions, kind)
    source = Path(target.workdir) / f"builtin{generated.suffix}"
    source.write_text(generated.source)
    if kind == "cuda":
        flags = device.nvcc_flags() + [f"-I{SHIM_DIR}"] + [f"-I{d}" for d in cuda_include_dirs()]
        libraries = ["cublasLt"]
    else:
        flags = device.cxx_flags() + [f"-I{SHIM_DIR}"]
        libraries = []
    units = [CompileUnit(source, "cuda" if kind == "cuda" else "cxx", flags, "builtin.o")]
    units += shim_compile_units(device)
    return [Artifact(backend="builtin", kind="source", symbols=list(functions),
                     payload={"compile_units": units, "workspace_bytes": generated.workspace_bytes,
                              "link_libraries": libraries})]


register_backend("builtin", flavor="shim", patterns=[], codegen=codegen, device="any",
                 one_composite_per_function=True)
