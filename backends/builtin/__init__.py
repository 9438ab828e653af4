"""The built-in backend (extern-shim flavor): takes every op no other backend claimed.

Its partitions call the shim library (backends/builtin/shim: CPU and CUDA kernels behind
one C header) with sizes fixed at build time, or run elementwise groups rendered from
templates/builtin. The shim is compiled once per target and arch (the object cache keeps
it) and linked into every model.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from byoc.backend import Artifact, register_backend
from byoc.errors import BuildError
from byoc.target import AttrSchema, at_least, register_target_kind

from .codegen import generate
from .partition import RESHAPE_COMPOSITE, outline_op, partition_builtin
from .squeeze_excitation import claim_squeeze_excitation

SHIM_DIR = Path(__file__).parent / "shim"
# Included first by the cpu code of a cuda build: renames the CPU shim's symbols, which
# are the same as the CUDA shim's, so that both link into one library.
CPU_SHIM_SYMBOLS = SHIM_DIR / "cpu" / "cpu_shim_symbols.h"

register_target_kind("builtin", {
    "matmul_algo": AttrSchema(int, -1, None, "cuBLASLt heuristic index for every GEMM (-1: the first)",
                                check=at_least(-1)),
})


# A function defined at the start of a line (the shim's style: bodies and calls are
# indented), up to its opening brace: `int lt_matmul(...) {`, `extern "C" int byoc_shim_pad(`.
_DEFINITION = re.compile(r'^(?:extern "C" )?[A-Za-z_][\w:<>,*& ]*?\b([A-Za-z_]\w*)\(([^;{]*)\)\s*(?:const\s*)?\{',
                         re.MULTILINE)
_SHIM_CALL = re.compile(r"\b(byoc_shim_\w+)\s*\(")


def _with_entry_headers(source: Path) -> str:
    """A shim file's text with the entry-point headers it includes (conv2d_entry.h: an
    entry point written once for both shims, defined where it is included)."""
    text = source.read_text()
    for name in re.findall(r'#include "\.\./(\w+_entry\.h)"', text):
        text += (source.parent.parent / name).read_text()
    return text


@functools.lru_cache(maxsize=None)
def _shim_families(folder: Path) -> tuple:
    """The shim's source files of one device (one op family each: layout, norm, ...) as
    ({file: names it defines}, {file: files it calls into}); common.* is in every build."""
    sources = sorted(p for p in folder.iterdir() if p.suffix in (".cu", ".cpp"))
    texts = {source: _with_entry_headers(source) for source in sources}
    # (compiler attributes such as __launch_bounds__(...) look like definitions: not names)
    defined = {source: {match.group(1) for match in _DEFINITION.finditer(text) if not match.group(1).startswith("__")}
               for source, text in texts.items()}
    calls = {}
    for source, text in texts.items():
        used = set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text))
        calls[source] = {other for other, names in defined.items() if other != source and used & names}
    return defined, calls


def shim_sources(folder: Path, called: set | None) -> list:
    """The shim files a build needs: those defining the byoc_shim_* functions it calls, the
    files they call into, and common.*; every file when `called` is None or names a function
    no file defines (the link then says which)."""
    defined, calls = _shim_families(folder)
    every = sorted(defined)
    if called is None:
        return every
    needed = {source for source in every if source.stem == "common"}
    for symbol in called:
        owners = [source for source, names in defined.items() if symbol in names]
        if not owners:
            return every
        needed.update(owners)
    pending = list(needed)
    while pending:
        for other in calls[pending.pop()]:
            if other not in needed:
                needed.add(other)
                pending.append(other)
    return sorted(needed)


# The CUDA shim sources that call cuBLASLt (the library links it only when one is compiled in).
CUBLASLT_SHIM_SOURCES = ("linalg.cu",)


def shim_compile_units(device_target, called: set | None = None, dtypes: set | None = None) -> list:
    """The shim library's compile units for a device target (cached like any other): only
    the op families whose functions `called` names (byoc_shim_* symbols the generated code
    calls), so that a model of elementwise ops does not compile the convolutions; all of
    them when `called` is None. `dtypes` (byoc_dtype enumerators, shim_dtypes()): the only
    dtypes the families get kernels for (a float16 model's layer norm compiles in a quarter
    of the time); every dtype when None."""
    from byoc.toolchain import CompileUnit, cuda_include_dirs
    mask = [] if dtypes is None else shim_dtype_flags(dtypes)
    if device_target.kind == "cuda":
        flags = device_target.nvcc_flags() + [f"-I{SHIM_DIR}"] + [f"-I{d}" for d in cuda_include_dirs()] + mask
        # a family for some dtypes is another object than for others (the kernel library
        # holds several: library_shim_units), and one build's units need distinct outputs
        suffix = device_target.attrs["arch"]
        tag = "" if dtypes is None else f"_dtypes{shim_dtype_mask(dtypes):x}"
        return [CompileUnit(s, "cuda", flags, f"shim_{suffix}_{s.stem}{tag}.o")
                for s in shim_sources(SHIM_DIR / "cuda", called)]
    from byoc.runtime import INCLUDE_DIR
    flags = device_target.cxx_flags() + [f"-I{SHIM_DIR}", f"-I{INCLUDE_DIR}"] + mask
    return [CompileUnit(s, "cxx", flags, f"shim_cpu_{s.stem}.o") for s in shim_sources(SHIM_DIR / "cpu", called)]


# The dtype sets the kernel library compiles the CUDA shim for: every dtype, and the float
# dtypes whose families models most often need alone or beside float32 (a float16 CNN's
# convolutions: float16 only), whose objects are a third of every dtype's (conv.cu: 2 MB
# against 6 MB). A build links the smallest of these that has its dtypes.
LIBRARY_SHIM_DTYPES = (frozenset({"BYOC_FLOAT16"}), frozenset({"BYOC_FLOAT32"}), frozenset({"BYOC_BFLOAT16"}),
                       frozenset({"BYOC_FLOAT16", "BYOC_FLOAT32"}), frozenset({"BYOC_BFLOAT16", "BYOC_FLOAT32"}), None)


def shim_library_units(target, workdir, dtypes=None, epilogues=None) -> list:
    """The built-in backend's share of the kernel library (byoc/kernel_library.py): every
    family of the CUDA shim, for each of LIBRARY_SHIM_DTYPES. The shim does not depend on
    the model, yet a cold build compiled the families it calls, and once the CUTLASS kernels
    came from the library those were its slowest units (EfficientNet-B0's convolutions). A
    build takes these objects in place of compiling its own (library_shim_units). `dtypes`
    and `epilogues` choose CUTLASS kernels, not these."""
    device = getattr(target, "device", None)
    if device is None or device.kind != "cuda":
        return []
    return [unit for dtype_set in LIBRARY_SHIM_DTYPES for unit in shim_compile_units(device, None, dtype_set)]


def library_shim_units(units: list, used: set, device_target, workdir) -> list:
    """`units` (the shim families a model calls, compiled for the dtypes `used` it names):
    each as it is where the object cache holds it, else the family for the fewest of
    LIBRARY_SHIM_DTYPES that include `used` which the cache or the kernel library holds
    (the same functions: the dtypes the model does not name are never called; the object
    larger), else as it is (compiled)."""
    from byoc.toolchain.compiler import unit_cached
    fewest_first = sorted((dtype_set for dtype_set in LIBRARY_SHIM_DTYPES if dtype_set is None or dtype_set >= used),
                          key=lambda dtype_set: len(shim_dtype_numbers()) if dtype_set is None else len(dtype_set))
    wider = [shim_compile_units(device_target, None, dtype_set) for dtype_set in fewest_first]
    candidates = units + [unit for family in wider for unit in family]
    try:
        held = dict(zip(map(id, candidates), unit_cached(candidates, workdir)))
    except BuildError:  # no nvcc to key them with: the compile says so, after the other backends' checks
        return units
    chosen = []
    for unit in units:
        alternatives = [other for family in wider for other in family if other.source == unit.source]
        chosen.append(next((other for other in [unit] + alternatives if held[id(other)]), unit))
    return chosen


def shim_calls(source_text: str) -> set:
    """The byoc_shim_* functions a generated source calls."""
    return set(_SHIM_CALL.findall(source_text))


@functools.lru_cache(maxsize=None)
def shim_dtype_numbers() -> dict:
    """byoc_dtype enumerator -> its value, read from byoc_shim.h (the ABI's one list)."""
    text = (SHIM_DIR / "byoc_shim.h").read_text()
    enum = re.search(r"typedef enum \{(.*?)\} byoc_dtype;", text, re.S).group(1)
    return {name: int(value) for name, value in re.findall(r"\b(BYOC_\w+) = (\d+)", enum)}


def shim_dtypes(source_text: str) -> set:
    """The byoc_dtype enumerators a generated source names (the dtypes it passes the shim)."""
    return set(re.findall(r"\b(BYOC_\w+)\b", source_text)) & shim_dtype_numbers().keys()


def shim_dtype_mask(dtypes: set) -> int:
    """BYOC_SHIM_DTYPES for `dtypes`: a bit per byoc_dtype value."""
    numbers = shim_dtype_numbers()
    return sum(1 << numbers[name] for name in set(dtypes))


def shim_dtype_flags(dtypes: set) -> list:
    """The compile flag that gives the shim kernels for `dtypes` only."""
    return [f"-DBYOC_SHIM_DTYPES={shim_dtype_mask(dtypes):#x}"]


def cpu_compile_units_in_cuda_build(functions: dict, device_target, workdir) -> tuple[list, dict]:
    """Functions pinned to the cpu in a cuda build (Device="cpu..."): one generated C++
    source and the CPU shim, both with the CPU shim's symbols renamed (CPU_SHIM_SYMBOLS).
    Returns the compile units and the workspace bytes per symbol."""
    from byoc.toolchain import CompileUnit
    generated = generate(functions, "cpu")
    source = Path(workdir) / "builtin_cpu.cc"
    source.write_text(generated.source)
    from byoc.runtime import INCLUDE_DIR
    flags = device_target.cxx_flags() + [f"-I{SHIM_DIR}", f"-I{INCLUDE_DIR}", "-include", str(CPU_SHIM_SYMBOLS)]
    renames = [CPU_SHIM_SYMBOLS]  # its bytes key the object cache too
    units = [CompileUnit(source, "cxx", flags, "builtin_cpu.o", dependencies=renames)]
    mask = shim_dtype_flags(shim_dtypes(generated.source))
    units += [CompileUnit(s, "cxx", flags + mask, f"shim_cpu_in_cuda_{s.stem}.o", dependencies=renames)
              for s in shim_sources(SHIM_DIR / "cpu", shim_calls(generated.source))]
    return units, generated.workspace_bytes


def codegen(functions: dict, target) -> list:
    """All builtin partitions of the module -> one generated source, plus the shim; in a
    cuda build, the functions pinned to the cpu get a C++ source and the CPU shim too."""
    from byoc.toolchain import CompileUnit, cuda_include_dirs
    device = target.device
    kind = "cuda" if device.kind == "cuda" else "cpu"
    # Reshape-like functions only reinterpret their input: the host gives their result the
    # input's storage and calls nothing (their bodies are still generated, unused).
    views = [symbol for symbol, function in functions.items() if function.attrs.get("Composite") == RESHAPE_COMPOSITE]
    on_cpu = {symbol: function for symbol, function in functions.items()
              if kind == "cuda" and str(function.attrs.get("Device", "")).startswith("cpu")}
    artifacts = []
    if on_cpu:
        units, workspace = cpu_compile_units_in_cuda_build(on_cpu, device, target.workdir)
        artifacts.append(Artifact(backend="builtin", kind="source", symbols=list(on_cpu),
                                  compile_units=units, workspace_bytes=workspace,
                                  view_symbols=[s for s in views if s in on_cpu]))
        functions = {symbol: function for symbol, function in functions.items() if symbol not in on_cpu}
        if not functions:
            return artifacts
    generated = generate(functions, kind)
    source = Path(target.workdir) / f"builtin{generated.suffix}"
    source.write_text(generated.source)
    if kind == "cuda":
        flags = device.nvcc_flags() + [f"-I{SHIM_DIR}"] + [f"-I{d}" for d in cuda_include_dirs()]
    else:
        from byoc.runtime import INCLUDE_DIR
        flags = device.cxx_flags() + [f"-I{SHIM_DIR}", f"-I{INCLUDE_DIR}"]
    units = [CompileUnit(source, "cuda" if kind == "cuda" else "cxx", flags, "builtin.o")]
    used = shim_dtypes(generated.source)
    shim = shim_compile_units(device, shim_calls(generated.source), used)
    units += library_shim_units(shim, used, device, target.workdir) if kind == "cuda" else shim
    # cuBLASLt only where a shim family that calls it is compiled in (the CUDA matmuls): a
    # library of elementwise ops, norms and convolutions needs nothing from it
    libraries = ["cublasLt"] if any(Path(unit.source).name in CUBLASLT_SHIM_SOURCES for unit in units
                                    if kind == "cuda") else []
    return artifacts + [Artifact(backend="builtin", kind="source", symbols=list(functions),
                                 compile_units=units, workspace_bytes=generated.workspace_bytes,
                                 link_libraries=libraries, view_symbols=[s for s in views if s in functions])]


# The shim's normalizations and softmax compute in float32 for 16-bit inputs (CPU and CUDA
# alike, as the NumPy references do), so float16 builds need no casts around them.
register_backend("builtin", flavor="shim", patterns=[], codegen=codegen, device="any",
                 one_composite_per_function=True,
                 float32_statistics=("softmax", "log_softmax", "layer_norm", "rms_norm"),
                 takes_the_rest=partition_builtin, outline_op=outline_op,
                 claims_first=claim_squeeze_excitation, kernel_library=shim_library_units)
