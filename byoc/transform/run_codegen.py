"""RunCodegen: one codegen call per backend, IRModule at a time.

Groups the module's Compiler globals by backend and calls each backend's codegen once
with all of them (`{symbol: Function}`, the symbol being the global's name) while that
backend's Target is current (`byoc.backend.current_target()`). Afterwards every Compiler
global, and every extern declaration (Extern=1) already in the module, must be
implemented by some returned Artifact (listed in its `symbols`); one that is not is a
BuildError naming it. Rewrites nothing: returns the module unchanged, with the artifacts.

Before any codegen runs, checks what a backend cannot check for itself:

- every extern function's name (Compiler globals and Extern declarations) is a safe C
  symbol: backends name source files after it and the host code declares and calls it,
  so `@"../escape"` would write outside the work directory and `@class`, `@malloc` or
  `@byoc_model_run` would not compile (or would take the place of a C library function
  inside the .so). The partitioner's names (`<backend>_<12 hex digits>`, `_2`... on a hash
  collision) always pass;
- with `targets` given, every Compiler names one of this build's backends (a codegen
  must not be called with no Target).
"""
from __future__ import annotations

import re

from ..errors import BuildError
from ..ir.module import IRModule

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# C11 and C++20 keywords and the C++ alternative tokens (`and`, `or`, ...).
C_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class co_await co_return co_yield compl concept const const_cast consteval constexpr
    constinit continue decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
    nullptr operator or or_eq private protected public register reinterpret_cast requires restrict
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
    wchar_t while xor xor_eq
""".split())

# Names the generated sources already give a meaning at global scope: namespaces they
# use, standard macros, and what the host code (templates/host/model.cc.j2) defines
# outside byoc_ names (a test keeps this list in step with the template).
RESERVED_NAMES = frozenset("""
    main std cutlass cute cub thrust nvcuda
    assert errno NULL EOF offsetof isnan isinf isfinite signbit fpclassify va_arg va_start va_end
    setjmp longjmp
    last_error fail kMetadata kWeightsBytes kArenaBytes kWorkspaceBytes TensorSpec kInputs kOutputs
    kNumInputs kNumOutputs kInputOnHost kOutputOnHost kHostArenaBytes kPinnedArenaBytes
    kHostWorkspaceBytes shape_text dtype_text checked_data cuda_failed device_unavailable device_alloc device_free
    read_sidecar run_calls capture_region kWeightsChecksum kCallLabels current_status_word current_call
    take_reported_error overlaps check_no_overlap
    kRefs kCalls kRegions kStates kFunctions kInputCopies kOutputCopies kArena kWeights kInput kOutput kHostArena kPinnedArena
    kHostWeights kVariants kPaddedDims allocate_staging free_staging padded_variant padded_dims_text caller_view
    stage_inputs unstage_outputs copy_box copy_rows zero_bytes
""".split())
# ... and the host template's tables of each variant (kInputs0, kFunctions1, ...)
_VARIANT_TABLE = re.compile(r"k(?:Inputs|Outputs|InputOnHost|OutputOnHost|Functions|States|PaddedDimValues)\d+$")

# Prefixes of the CUDA runtime, driver and library APIs and of the macros of byoc,
# CUDA and CUTLASS headers (`cudaMalloc`, `cublasLtMatmul`, `cuInit`, `CUTLASS_HOST`).
_RESERVED_PREFIX = re.compile(r"(?:cuda|cublas|cublasLt|cudnn|cu|nvtx|nvrtc)[A-Z]|(?:BYOC|CUDA|CUBLAS|CUTLASS)_")

_c_libraries = None


def _is_c_library_symbol(name: str) -> bool:
    """Whether the C library (libc, libm) has a global symbol `name` (malloc, write, expf,
    stdin, ...): a function of that name in the .so would compile, or not, depending on the
    headers, and would replace the library's inside the .so. Only libc and libm are asked
    (not the whole process, whose libpython or torch symbols say nothing about the .so)."""
    global _c_libraries
    import ctypes
    import ctypes.util
    if _c_libraries is None:
        _c_libraries = []
        for library in ("c", "m"):
            try:
                _c_libraries.append(ctypes.CDLL(ctypes.util.find_library(library) or f"lib{library}.so.6"))
            except OSError:
                pass
    for handle in _c_libraries:
        try:
            handle[name]  # dlsym: an AttributeError when there is no such symbol
            return True
        except (AttributeError, ValueError):
            pass
    return False


def symbol_name_problem(name) -> str | None:
    """Why `name` cannot be an extern function's C symbol, or None when it can."""
    if not isinstance(name, str) or not _C_IDENTIFIER.match(name):
        return "it is not a C identifier"
    if name in C_KEYWORDS:
        return "it is a C/C++ keyword"
    if name.startswith("byoc_"):
        return "names starting with 'byoc_' are reserved for the runtime ABI"
    if name.startswith("_") or "__" in name:
        return "names starting with '_' or containing '__' are reserved to the C/C++ implementation"
    if name in RESERVED_NAMES or _RESERVED_PREFIX.match(name) or _VARIANT_TABLE.match(name):
        return "the generated C++ (host code, C library, CUDA or CUTLASS headers) already defines it"
    if _is_c_library_symbol(name):
        return "it names a function or object of the C library"
    return None


def check_symbol_names(mod: IRModule):
    """A BuildError naming every Compiler global and extern declaration whose name cannot
    be a C symbol, and why."""
    problems = []
    for name, function in mod.functions.items():
        if function.attrs.get("Compiler") is None and not function.attrs.get("Extern"):
            continue
        problem = symbol_name_problem(name)
        if problem is not None:
            from ..ir.printer import format_global_name
            kind = (f"Compiler={str(function.attrs['Compiler'])!r}" if function.attrs.get("Compiler") is not None
                    else "Extern=1")
            problems.append(f"{format_global_name(name)} ({kind}): {problem}")
    if problems:
        raise BuildError(f"extern function name(s) cannot be C symbols: {'; '.join(problems)}. Expected a C "
                         f"identifier ([A-Za-z_][A-Za-z0-9_]*) that is not a C/C++ keyword, does not start with "
                         f"'byoc_' or '_' and names nothing of the C library, CUDA or the generated host code "
                         f"(backends name the function's C symbol and source file after it)")


def run_codegen(mod: IRModule, targets: dict | None = None) -> tuple[IRModule, list]:
    """`targets`: backend name -> its Target, one for each backend this build configures
    (a Compiler naming any other backend is a BuildError); None: no targets at all, every
    codegen gets None (for tests of backends that need none)."""
    from ..backend import Artifact, codegen_target, get_backend
    check_symbol_names(mod)
    by_backend: dict[str, dict] = {}
    for name, function in mod.functions.items():
        backend = function.attrs.get("Compiler")
        if backend is not None:
            by_backend.setdefault(str(backend), {})[name] = function
    if targets is not None:
        _check_backends_configured(by_backend, targets)
    targets = targets or {}
    artifacts = []
    for backend_name in sorted(by_backend):
        backend = get_backend(backend_name)
        target = targets.get(backend_name)
        with codegen_target(target):
            produced = list(backend.codegen(by_backend[backend_name], target) or [])
        for artifact in produced:
            if not isinstance(artifact, Artifact):
                raise BuildError(f"the codegen of backend {backend_name!r} returned {artifact!r}; "
                                 f"expected byoc.backend.Artifact objects")
        artifacts.extend(produced)

    implemented = {symbol for artifact in artifacts for symbol in artifact.symbols}
    needed = {name: str(function.attrs["Compiler"]) for functions in by_backend.values()
              for name, function in functions.items()}
    needed.update({name: "extern declaration" for name, function in mod.functions.items()
                   if function.attrs.get("Extern") and name not in needed})
    missing = sorted(name for name in needed if name not in implemented)
    if missing:
        described = ", ".join(f"{name} ({needed[name]})" for name in missing)
        raise BuildError(f"no artifact implements extern function(s) {described}: each backend's codegen "
                         f"must list every symbol it was given in Artifact.symbols")
    return mod, artifacts


def _check_backends_configured(by_backend: dict, targets: dict):
    """A BuildError for Compiler globals whose backend this build does not configure."""
    from ..ir.printer import format_global_name
    unconfigured = {backend: functions for backend, functions in by_backend.items() if backend not in targets}
    if unconfigured:
        described = "; ".join(f"{', '.join(format_global_name(name) for name in sorted(functions))} "
                              f"(Compiler={backend!r})" for backend, functions in sorted(unconfigured.items()))
        raise BuildError(f"function(s) {described} name a backend this build does not configure; the configured "
                         f"backends are {', '.join(sorted(targets)) or '(none)'}: add the backend to the "
                         f"config's backends, or change the function's Compiler attribute")
