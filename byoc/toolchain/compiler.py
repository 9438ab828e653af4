"""Compile units into objects through build.ninja and the object cache, and link.

A CompileUnit is one source file, its language (cxx, cuda, asm) and its flags (which
come from Targets only). `compile_units` writes <workdir>/build.ninja with one edge per
unit (and the link edge once `link_shared` knows it), takes cached objects from the
cache, runs ninja in parallel for the rest, and stores what it built. A failing
compiler becomes a BuildError naming the generated file and its first error lines.
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BuildError
from . import cache

LANGUAGES = ("cxx", "cuda", "asm")


@dataclass
class CompileUnit:
    source: Path
    language: str
    flags: list
    output: str  # object file name, relative to <workdir>/obj
    dependencies: list = field(default_factory=list)  # files whose bytes also key the cache

    def __post_init__(self):
        if self.language not in LANGUAGES:
            raise BuildError(f"compile unit {self.source}: language {self.language!r} not in {LANGUAGES}")
        self.source = Path(self.source)


# ---- finding compilers and libraries ------------------------------------------------------

def cuda_home() -> Path | None:
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if candidate and Path(candidate, "bin", "nvcc").exists():
            return Path(candidate)
    found = shutil.which("nvcc")
    if found:
        return Path(found).resolve().parent.parent
    if Path("/usr/local/cuda/bin/nvcc").exists():
        return Path("/usr/local/cuda")
    return None


def find_nvcc() -> Path:
    home = cuda_home()
    if home is None:
        raise BuildError("nvcc not found: install the CUDA toolkit and set CUDA_HOME or put nvcc on PATH "
                         "(needed for the cuda target)")
    return home / "bin" / "nvcc"


def find_cxx() -> str:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise BuildError("no C++ compiler found (g++ or c++ on PATH, or set CXX)")


def _pip_cuda_library_dir(header: str) -> tuple[Path, Path] | None:
    """(include, lib) of NVIDIA's pip CUDA packages (nvidia/cu13, nvidia/cu12) holding `header`."""
    for root in sys.path:
        for variant in ("cu13", "cu12"):
            base = Path(root) / "nvidia" / variant
            if (base / "include" / header).is_file():
                return base / "include", base / "lib"
        base = Path(root) / "nvidia" / "cublas"
        if (base / "include" / header).is_file():
            return base / "include", base / "lib"
    return None


def cuda_include_dirs() -> list[Path]:
    home = cuda_home()
    dirs = [home / "include"] if home else []
    if not (home and (home / "include" / "cublasLt.h").is_file()):
        pip = _pip_cuda_library_dir("cublasLt.h")
        if pip:
            dirs.append(pip[0])
    return dirs


def cuda_link_flags(extra: list | None = None) -> list[str]:
    """Static cudart, and cuBLASLt from the toolkit (or NVIDIA's pip package)."""
    home = cuda_home()
    if home is None:
        raise BuildError("the CUDA toolkit is needed to link a cuda model (nvcc not found)")
    lib = home / "lib64"
    flags = [f"-L{lib}", "-lcudart_static", "-lrt", "-ldl", "-lpthread"]
    wants_cublaslt = any("cublasLt" in str(f) for f in (extra or []))
    if wants_cublaslt:
        if (lib / "libcublasLt.so").exists():
            flags += ["-lcublasLt", f"-Wl,-rpath,{lib}"]
        else:
            pip = _pip_cuda_library_dir("cublasLt.h")
            if pip is None:
                raise BuildError("cuBLASLt not found: neither the CUDA toolkit nor the nvidia-cublas pip "
                                 "package provides libcublasLt")
            names = sorted(p.name for p in pip[1].glob("libcublasLt.so*"))
            flags += [f"-L{pip[1]}", f"-l:{names[0]}" if names else "-lcublasLt", f"-Wl,-rpath,{pip[1]}"]
    return flags + [f for f in (extra or []) if "cublasLt" not in str(f)]


def cutlass_include_dirs() -> list[Path]:
    """CUTLASS's headers, from the nvidia-cutlass pip package (cutlass_library)."""
    try:
        import cutlass_library
    except ImportError:
        raise BuildError("the cutlass backend needs the nvidia-cutlass package (pip install nvidia-cutlass)") from None
    base = Path(cutlass_library.__file__).parent / "source"
    dirs = [base / "include", base / "tools" / "util" / "include"]
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        raise BuildError(f"nvidia-cutlass is installed but {dirs[0]} has no cutlass/cutlass.h")
    return dirs


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return compiler


# ---- ninja ------------------------------------------------------------------------------

def _ninja() -> str:
    try:
        import ninja
        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("ninja")
    if not found:
        raise BuildError("ninja not found (pip install ninja)")
    return found


def _command(unit: CompileUnit, output: Path) -> list[str]:
    if unit.language == "cuda":
        return [str(find_nvcc()), *unit.flags, "-c", str(unit.source), "-o", str(output)]
    return [find_cxx(), *unit.flags, "-c", str(unit.source), "-o", str(output)]


def _escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def write_build_ninja(workdir: Path, commands: dict, link_command: list | None = None, link_output=None):
    """build.ninja: one edge per object (its full command), one link edge."""
    lines = ["# Generated by byoc. Rebuild by hand: ninja -C " + shlex.quote(str(workdir)), "",
             "rule run", "  command = $cmd", "  description = $desc", ""]
    for output, (source, command) in commands.items():
        lines += [f"build {_escape(str(output))}: run {_escape(str(source))}",
                  f"  cmd = {shlex.join(command)}", f"  desc = compile {Path(source).name}", ""]
    if link_command:
        inputs = " ".join(_escape(str(o)) for o in commands)
        lines += [f"build {_escape(str(link_output))}: run {inputs}", f"  cmd = {shlex.join(link_command)}",
                  f"  desc = link {Path(link_output).name}", ""]
    (workdir / "build.ninja").write_text("\n".join(lines))


def _first_errors(text: str, limit: int = 12) -> str:
    lines = text.splitlines()
    picked = [l for l in lines if re.search(r"\berror\b|FAILED:", l)]
    return "\n".join((picked or lines[-limit:])[:limit])


def compile_units(units: list, workdir, jobs: int | None = None) -> list[Path]:
    """Objects for `units` (in order), from the cache or compiled by ninja in parallel."""
    workdir = Path(workdir)
    objects_dir = workdir / "obj"
    objects_dir.mkdir(parents=True, exist_ok=True)
    commands, keys, missing = {}, {}, []
    for unit in units:
        output = objects_dir / unit.output
        command = _command(unit, output)
        if output in commands:
            raise BuildError(f"two compile units write {output}")
        commands[output] = (unit.source, command)
        # The key must not depend on where this build happens: paths inside the work
        # directory (and the source and object themselves) are replaced by placeholders.
        keyed_command = [c.replace(str(output), "<object>").replace(str(unit.source), "<source>")
                         .replace(str(workdir.resolve()), "<workdir>").replace(str(workdir), "<workdir>")
                         for c in command]
        key = cache.object_key(unit.source, keyed_command, compiler_version(command[0]), unit.dependencies,
                               search_dirs=cache.include_dirs(command))
        keys[output] = key
        if not cache.fetch(key, output):
            missing.append(output)
    write_build_ninja(workdir, commands)
    if missing:
        jobs = jobs or os.cpu_count() or 2
        run = subprocess.run([_ninja(), "-C", str(workdir), "-j", str(jobs), "-k", "0",
                              *[str(o) for o in missing]],
                             capture_output=True, text=True)
        if run.returncode != 0:
            failed = [str(commands[o][0]) for o in missing if not o.exists()]
            raise BuildError(f"compiling {', '.join(failed) or 'the generated sources'} failed "
                             f"(commands in {workdir / 'build.ninja'}):\n{_first_errors(run.stdout + run.stderr)}")
        for output in missing:
            cache.store(keys[output], output)
    return [objects_dir / unit.output for unit in units]


def link_shared(objects: list, output, flags: list, libraries: list, workdir=None) -> Path:
    """Link objects into a shared library (and record the link edge in build.ninja)."""
    output = Path(output)
    command = [find_cxx(), "-shared", "-o", str(output), *map(str, objects), *flags, *libraries]
    if workdir is not None and (Path(workdir) / "build.ninja").exists():
        with open(Path(workdir) / "build.ninja", "a") as ninja_file:
            inputs = " ".join(_escape(str(o)) for o in objects)
            ninja_file.write(f"build {_escape(str(output))}: run {inputs}\n  cmd = {shlex.join(command)}\n"
                             f"  desc = link {output.name}\n\ndefault {_escape(str(output))}\n")
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise BuildError(f"linking {output} failed:\n{_first_errors(run.stderr, 20)}")
    return output
