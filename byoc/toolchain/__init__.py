"""The toolchain: compilers found, build.ninja written (one edge per compile unit, one
link edge), a content-addressed object cache, and the final link."""
from .compiler import (CompileUnit, compile_units, cuda_include_dirs, cuda_link_flags, cutlass_include_dirs,
                       find_nvcc, link_shared)

__all__ = ["CompileUnit", "compile_units", "link_shared", "find_nvcc", "cuda_include_dirs", "cuda_link_flags",
           "cutlass_include_dirs"]
