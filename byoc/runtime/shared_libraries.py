"""The NVIDIA libraries a byoc library needs, found the standard ways before it is loaded.

A cuda library names cuBLASLt (and cuDNN, with the cudnn backend) by its soname only (`NEEDED libcublasLt.so.13`, no RUNPATH:
a run path would point into the build machine's toolkit or virtual environment, which the
deploy host does not have, or has with someone else's files in it). The dynamic loader
finds it where the system puts libraries (LD_LIBRARY_PATH, ld.so.cache): that is all a C
program gets. Python callers also get the places pip and the toolkit install it: before
`byoc.load` maps a library, `preload_needed` loads each NVIDIA library it needs that the
loader would not find by itself from the CUDA toolkit ($CUDA_HOME, $CUDA_PATH,
/usr/local/cuda) or NVIDIA's pip packages (`nvidia/*/lib` in site-packages), with
RTLD_GLOBAL, so that the library's NEEDED entry resolves to it by soname; torch and CuPy
find them the same way.
"""
from __future__ import annotations

import ctypes
import os
import struct
import sys
import threading
from pathlib import Path

from ..errors import RuntimeError as ByocRuntimeError

# soname prefix -> the pip package that ships it (named in the error where none is found)
NVIDIA_LIBRARIES = {"libcublasLt.so": "nvidia-cublas", "libcublas.so": "nvidia-cublas",
                    "libcudnn.so": "nvidia-cudnn-cu13"}

_loaded: dict = {}  # soname -> the CDLL that keeps it loaded
_lock = threading.Lock()


def needed_libraries(path) -> list[str]:
    """The sonames in the DT_NEEDED entries of the ELF shared object at `path` (a file that
    library_file._check_library_file has checked: whole, sealed, 64-bit native). Reads the
    headers, the dynamic section and the names only: a library holds its weights too."""
    try:
        with open(path, "rb") as file:
            return _needed_in(file)
    except (OSError, MemoryError, struct.error, IndexError, ValueError):
        return []  # the dynamic loader then says what is wrong with the file


def _needed_in(file) -> list[str]:
    def read(offset, size):
        file.seek(offset)
        data = file.read(size)
        if len(data) != size:
            raise ValueError("short read")
        return data

    header = read(0, 64)
    endian = "<" if header[5] == 1 else ">"
    e_phoff, = struct.unpack_from(endian + "Q", header, 32)
    e_phnum, = struct.unpack_from(endian + "H", header, 56)
    table = read(e_phoff, e_phnum * 56)
    loads, dynamic = [], None
    for index in range(e_phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack_from(
            endian + "IIQQQQQQ", table, index * 56)
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
    if dynamic is None or dynamic[1] > _MAX_DYNAMIC_BYTES:
        return []
    entries = read(dynamic[0], dynamic[1] - dynamic[1] % 16)
    needed, strtab, strsz = [], None, None
    for offset in range(0, len(entries), 16):
        tag, value = struct.unpack_from(endian + "qQ", entries, offset)
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED: an offset into the string table
            needed.append(value)
        elif tag == 5:  # DT_STRTAB: its virtual address
            strtab = next((file_offset + value - vaddr for vaddr, file_offset, size in loads
                           if vaddr <= value < vaddr + size), None)
        elif tag == 10:  # DT_STRSZ
            strsz = value
    if strtab is None or strsz is None or strsz > _MAX_DYNAMIC_BYTES:
        return []
    strings = read(strtab, strsz)
    names = []
    for name_offset in needed:
        stop = strings.find(b"\0", name_offset)
        if 0 <= name_offset < stop:
            names.append(strings[name_offset:stop].decode("utf-8", "replace"))
    return names


# a dynamic section or string table larger than this is not one a linker wrote for byoc
_MAX_DYNAMIC_BYTES = 16 << 20


def preload_needed(path) -> None:
    """Loads the NVIDIA libraries the library at `path` needs (see the module docstring);
    a ByocRuntimeError names one that is nowhere to be found and what provides it."""
    for soname in needed_libraries(path):
        package = next((name for prefix, name in NVIDIA_LIBRARIES.items() if soname.startswith(prefix)), None)
        if package is not None:
            _preload(soname, package, path)


def _preload(soname: str, package: str, path) -> None:
    with _lock:
        if soname in _loaded:
            return
        try:  # where the system's dynamic loader looks (and what this process has loaded)
            _loaded[soname] = ctypes.CDLL(soname, mode=os.RTLD_GLOBAL | os.RTLD_NOW)
            return
        except OSError:
            pass
        tried = []
        for directory in _library_directories():
            candidate = directory / soname
            if candidate.is_file():
                try:
                    _loaded[soname] = ctypes.CDLL(str(candidate), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
                    return
                except OSError as error:
                    tried.append(f"{candidate}: {error}")
        detail = f" (found but not loadable: {'; '.join(tried)})" if tried else ""
        raise ByocRuntimeError(
            f"cannot load {path}: it needs {soname}, which is not on this machine's library path, in a CUDA "
            f"toolkit or in NVIDIA's pip packages{detail}; install {package} (pip install {package}) or the CUDA "
            f"toolkit, or add the directory that holds {soname} to LD_LIBRARY_PATH")


def _library_directories() -> list[Path]:
    """The CUDA toolkit's library directories, then the lib directory of every one of
    NVIDIA's pip packages (nvidia/cu13/lib, nvidia/cublas/lib, ...)."""
    directories = []
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            directories += [Path(root) / "lib64", Path(root) / "lib"]
    return directories + [package / "lib" for package in nvidia_package_dirs()]


def nvidia_package_dirs() -> list[Path]:
    """The folders of NVIDIA's pip packages (site-packages/nvidia/<package>: cu13, cublas,
    ...), in the interpreter's search-path order: the `nvidia` namespace package may be
    split over several site directories. The build (toolchain/locate.py: headers) and the
    load (here: libraries) look in the same places."""
    packages = []
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if root.is_dir():
            packages += [d for d in sorted(root.iterdir()) if d.is_dir() and d not in packages]
    return packages
