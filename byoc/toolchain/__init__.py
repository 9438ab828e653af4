"""The toolchain: compilers and libraries found (locate.py), build.ninja written (one edge
per compile unit, one link edge) and run by ninja, a content-addressed object cache, and the
final link (compiler.py)."""
from .compiler import CompileUnit, compile_units, link_shared
from .locate import (cuda_include_dirs, cuda_link_flags, cudnn_include_dirs, cutlass_example_dir, cutlass_include_dirs,
                     find_cxx, find_nvcc)
from .ninja import find_ninja

__all__ = ["CompileUnit", "compile_units", "link_shared", "find_nvcc", "find_cxx", "find_ninja",
           "cuda_include_dirs", "cuda_link_flags", "cudnn_include_dirs", "cutlass_example_dir", "cutlass_include_dirs"]
