"""Where the tools and libraries a build needs are: the C++ compiler, nvcc and the CUDA
toolkit, NVIDIA's pip packages (cuBLASLt's and cuDNN's headers and libraries, the flags
that link them by soname), CUTLASS's headers, and the versions a measured cost depends on
(cuda_library_versions). compiler.py compiles and links with what these find.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import BuildError


def _is_cuda_home(directory) -> bool:
    return bool(directory) and Path(directory, "bin", "nvcc").exists() and \
        Path(directory, "include", "cuda_runtime.h").is_file()


def _cuda_home_reported_by(nvcc: str) -> Path | None:
    """The toolkit an nvcc belongs to, as nvcc itself reports it (`#$ TOP=...` in a dry
    run); this sees through wrapper scripts such as /usr/local/bin/nvcc -> exec .../nvcc."""
    try:
        run = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^#\$ TOP=(.+)$", run.stdout + run.stderr, re.MULTILINE)
    return Path(match.group(1).strip()).resolve() if match else None


@functools.lru_cache(maxsize=None)
def _find_cuda_home(cuda_home_variable, cuda_path_variable, path_variable) -> Path | None:
    for candidate in (cuda_home_variable, cuda_path_variable):
        if _is_cuda_home(candidate):
            return Path(candidate)
    on_path = shutil.which("nvcc", path=path_variable)
    if on_path:
        beside = Path(on_path).resolve().parent.parent
        if _is_cuda_home(beside):
            return beside
        reported = _cuda_home_reported_by(on_path)
        if _is_cuda_home(reported):
            return reported
    if _is_cuda_home("/usr/local/cuda"):
        return Path("/usr/local/cuda")
    return None


def cuda_home() -> Path | None:
    """The CUDA toolkit: $CUDA_HOME, $CUDA_PATH, the one of the nvcc on PATH, or
    /usr/local/cuda; None when there is none. A toolkit must have bin/nvcc and
    include/cuda_runtime.h (headers and libraries are taken from it)."""
    return _find_cuda_home(os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), os.environ.get("PATH"))


def find_nvcc() -> Path:
    home = cuda_home()
    if home is None:
        raise BuildError("nvcc not found: install the CUDA toolkit and set CUDA_HOME, or put nvcc on PATH, "
                         "or install it in /usr/local/cuda (needed for the cuda target)")
    return home / "bin" / "nvcc"


def find_cxx() -> str:
    # every compile unit's command and cache key asks (a tuning build keys hundreds of units):
    # looked up once for each value of the variables that decide it
    return _find_cxx(os.environ.get("CXX"), os.environ.get("PATH"))


@functools.lru_cache(maxsize=8)
def _find_cxx(cxx: str | None, path: str | None) -> str:
    for name in (cxx, "g++", "c++"):
        found = name and shutil.which(name, path=path)
        if found:
            return found
    raise BuildError("no C++ compiler found: put g++ or c++ on PATH, or set CXX")


def _pip_cuda_library_dir(header: str) -> tuple[Path, Path] | None:
    """(include, lib) of NVIDIA's pip CUDA packages (nvidia/cu13, nvidia/cu12, nvidia/cublas,
    nvidia/cudnn) holding `header`, the newest CUDA first."""
    from ..runtime.shared_libraries import nvidia_package_dirs
    packages = nvidia_package_dirs()
    for name in ("cu13", "cu12", "cublas", "cudnn"):
        for base in packages:
            if base.name == name and (base / "include" / header).is_file():
                return base / "include", base / "lib"
    return None


def cuda_include_dirs() -> list[Path]:
    """The toolkit's include directory, and NVIDIA's pip packages' for the library headers
    it lacks (cuBLASLt for the JSON engine, cuRAND's device header, which CUTLASS's fused
    attention kernel includes)."""
    home = cuda_home()
    dirs = [home / "include"] if home else []
    for header in ("cublasLt.h", "curand_kernel.h"):
        if not (home and (home / "include" / header).is_file()):
            pip = _pip_cuda_library_dir(header)
            if pip and pip[0] not in dirs:
                dirs.append(pip[0])
    return dirs


# The NVIDIA libraries an artifact may link (Artifact.link_libraries): each one's header,
# the pip package that ships it where the toolkit does not, and its file name stem.
NVIDIA_LINKED = {"cublasLt": ("cublasLt.h", "nvidia-cublas", "libcublasLt"),
                 "cudnn": ("cudnn_graph.h", "nvidia-cudnn-cu13", "libcudnn")}  # cudnn_graph.h: cuDNN 9


def missing_nvidia_library(name: str) -> str | None:
    """What is missing to build with and link NVIDIA library `name` (a key of NVIDIA_LINKED:
    cublasLt, cudnn), as a sentence naming the package to install; None where the CUDA
    toolkit or that package has its header and library."""
    header, package, stem = NVIDIA_LINKED[name]
    home = cuda_home()
    if home is None:
        return "the CUDA toolkit (nvcc not found)"
    if (home / "include" / header).is_file() and (home / "lib64" / f"{stem}.so").exists():
        return None
    pip = _pip_cuda_library_dir(header)
    if pip and any(pip[1].glob(f"{stem}.so*")):
        return None
    return f"{stem}'s headers and library (pip install {package})"


def cudnn_include_dirs() -> list[Path]:
    """cuDNN's include directory (the toolkit's, else the nvidia-cudnn-cu13 package's); a
    BuildError naming the package where neither has cudnn.h: a config that lists the cudnn
    backend needs it to build."""
    home = cuda_home()
    if home and (home / "include" / "cudnn_graph.h").is_file():
        return [home / "include"]
    pip = _pip_cuda_library_dir("cudnn_graph.h")
    if pip is None:
        raise BuildError("the cudnn backend needs cuDNN 9's headers and library: pip install nvidia-cudnn-cu13 "
                         "(or install cuDNN into the CUDA toolkit); a config without cudnn does not need them")
    return [pip[0]]


def cuda_link_flags(extra: list | None = None) -> list[str]:
    """Static cudart, and each NVIDIA library the artifacts link (cuBLASLt, cuDNN) from the
    toolkit or NVIDIA's pip package, recorded by soname with no run path: a path on this
    machine means nothing on the deploy host (runtime/shared_libraries.py finds it at load)."""
    home = cuda_home()
    if home is None:
        raise BuildError("the CUDA toolkit is needed to link a cuda model (nvcc not found)")
    lib = home / "lib64"
    flags = [f"-L{lib}", "-lcudart_static", "-lrt", "-ldl", "-lpthread"]
    rest = []
    for library in extra or []:
        name = str(library)[2:] if str(library).startswith("-l") else str(library)  # "cudnn" or "-lcudnn"
        if name not in NVIDIA_LINKED:
            rest.append(library)
            continue
        header, package, stem = NVIDIA_LINKED[name]
        # the library from where its headers were taken (cuda_include_dirs, cudnn_include_dirs):
        # the toolkit's where it has both, else the pip package's
        if (lib / f"{stem}.so").exists() and (home / "include" / header).is_file():
            flags += [f"-l{name}"]
            continue
        pip = _pip_cuda_library_dir(header)
        names = sorted(p.name for p in pip[1].glob(f"{stem}.so*")) if pip else []
        if not names:
            raise BuildError(f"{stem}.so not found: neither the CUDA toolkit nor the {package} pip package "
                             f"provides it (pip install {package})")
        flags += [f"-L{pip[1]}", f"-l:{names[0]}"]
    return flags + rest


def _cutlass_roots() -> list[Path]:
    """Where CUTLASS's source tree may be: $CUTLASS_PATH, then the nvidia-cutlass pip
    package (cutlass_library ships the headers under source/; the `cutlass` package of
    other releases is looked at the same way). Packages are located, not imported."""
    roots = []
    if os.environ.get("CUTLASS_PATH"):
        roots.append(Path(os.environ["CUTLASS_PATH"]))
    for package_name in ("cutlass_library", "cutlass"):
        try:
            spec = importlib.util.find_spec(package_name)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            roots += [Path(location) / "source", Path(location)]
    return roots


def cutlass_include_dirs() -> list[Path]:
    """CUTLASS's include directories: the one holding cutlass/cutlass.h, and the
    tools/util one beside it."""
    roots = _cutlass_roots()
    for root in roots:
        include = root / "include"
        if (include / "cutlass" / "cutlass.h").is_file():
            return [include, root / "tools" / "util" / "include"]
    if not roots:
        raise BuildError("the cutlass backend needs CUTLASS's headers: pip install nvidia-cutlass "
                         "(or set CUTLASS_PATH to a CUTLASS checkout)")
    raise BuildError(f"CUTLASS's headers (cutlass/cutlass.h) not found under {', '.join(map(str, roots))}: "
                     "reinstall nvidia-cutlass, or set CUTLASS_PATH to a CUTLASS checkout")


def cutlass_example_dir(name: str) -> Path:
    """A directory of CUTLASS's examples (the pip package ships them beside the headers):
    the fused attention kernel lives in examples/41_fused_multi_head_attention."""
    for root in _cutlass_roots():
        if (root / "examples" / name).is_dir():
            return root / "examples" / name
    raise BuildError(f"CUTLASS's examples/{name} not found (pip install nvidia-cutlass, or set CUTLASS_PATH "
                     "to a CUTLASS checkout)")


def _header_version(header: str, prefix: str, names=("MAJOR", "MINOR", "PATCHLEVEL")) -> str | None:
    """MAJOR.MINOR.PATCH from a library's version header (cudnn_version.h, cublas_api.h) in
    the toolkit or NVIDIA's pip packages; None where there is none."""
    home = cuda_home()
    candidates = [home / "include" / header] if home else []
    pip = _pip_cuda_library_dir(header)
    if pip is not None:
        candidates.append(pip[0] / header)
    for path in candidates:
        if path.is_file():
            text = path.read_text(errors="replace")
            found = [re.search(rf"#define\s+{prefix}{name}\s+(\d+)", text) for name in names]
            if all(found):
                return ".".join(match.group(1) for match in found)
    return None


@functools.lru_cache(maxsize=None)
def cuda_library_versions() -> str:
    """What a cuda build's kernels and libraries come from, as a measured cost depends on
    them: nvcc's release and the cuBLAS and cuDNN headers the build compiles against (the
    libraries it links), e.g. "cuda 13.0.88, cublas 13.10.0, cudnn 9.28.1"; those missing are
    left out."""
    parts = []
    home = cuda_home()
    if home is not None:
        from .compiler import compiler_version
        release = re.search(r"release [\d.]+, V([\d.]+)", compiler_version(str(home / "bin" / "nvcc")))
        parts.append(f"cuda {release.group(1) if release else 'unknown'}")
    for name, header, prefix, fields in (("cublas", "cublas_api.h", "CUBLAS_VER_", ("MAJOR", "MINOR", "PATCH")),
                                         ("cudnn", "cudnn_version.h", "CUDNN_", ("MAJOR", "MINOR", "PATCHLEVEL"))):
        version = _header_version(header, prefix, fields)
        if version is not None:
            parts.append(f"{name} {version}")
    return ", ".join(parts)
