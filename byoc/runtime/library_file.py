"""A built library as a file: its metadata (read and validated), the seal that build()
appends and load() checks before the dynamic loader maps a byte of it, the checks of the
file and of a weights sidecar, and opening a private copy of it."""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path

from ..errors import RuntimeError as ByocRuntimeError
from ..json_files import parse_json


def _read_metadata(lib, path: str) -> dict:
    """The library's metadata JSON, checked against what this runtime reads from it: a
    corrupted or foreign file is a byoc.RuntimeError naming the key at fault."""
    lib.byoc_model_metadata.restype = ctypes.c_char_p
    raw = lib.byoc_model_metadata()
    name = os.path.basename(path)
    if raw is None:
        raise ByocRuntimeError(f"{name}: byoc_model_metadata() returned NULL; expected a JSON object")
    # the guarded parser: a library handed over may carry JSON nested past the stack or
    # numbers that overflow the printers, not only invalid text
    metadata = parse_json(raw, name, "a byoc library's metadata", ByocRuntimeError,
                          advice="the file is corrupted or not a byoc library: rebuild it")
    validate_metadata(metadata, name)
    return metadata


_TENSOR_DTYPES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"}


def validate_metadata(metadata, name: str = "library") -> None:
    """A byoc.RuntimeError naming the first key of `metadata` that is missing or not of the
    form byoc writes (format byoc-model version 1)."""
    def bad(key, expected, got):
        return ByocRuntimeError(f"{name}: metadata key {key!r} is {got!r}; expected {expected} (the library is "
                                f"corrupted or was not built by this byoc: rebuild it)")

    def field(where, key, kinds, expected):
        if not isinstance(where, dict) or key not in where:
            raise ByocRuntimeError(f"{name}: metadata has no key {key!r}; expected {expected} (the library is "
                                   f"corrupted or was not built by this byoc: rebuild it)")
        value = where[key]
        if not isinstance(value, kinds) or isinstance(value, bool):  # no field of it is a bool
            raise bad(key, expected, value)
        return value

    if not isinstance(metadata, dict):
        raise bad("(top level)", "a JSON object", type(metadata).__name__)
    if field(metadata, "format", str, "'byoc-model'") != "byoc-model":
        raise bad("format", "'byoc-model'", metadata["format"])
    if field(metadata, "version", int, "1") != 1:
        raise bad("version", "1 (this byoc reads version 1)", metadata["version"])
    field(metadata, "target", str, "a target string")

    def tensors(where, prefix=""):
        for role in ("inputs", "outputs"):
            for index, tensor in enumerate(field(where, role, list, f"{prefix}{role}: a list of tensors")):
                check_tensor(f"{prefix}{role}[{index}]", tensor)

    def check_tensor(key, tensor):
        if not isinstance(tensor, dict):
            raise bad(key, "an object with name, shape and dtype", tensor)
        field(tensor, "name", str, f"{key}.name: a string")
        shape = field(tensor, "shape", list, f"{key}.shape: a list of dims")
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 63 for d in shape):
            raise bad(f"{key}.shape", "a list of non-negative int64 dims", shape)
        if field(tensor, "dtype", str, f"{key}.dtype") not in _TENSOR_DTYPES:
            raise bad(f"{key}.dtype", f"one of {sorted(_TENSOR_DTYPES)}", tensor["dtype"])
        if tensor.get("device", "cuda") not in ("cpu", "cuda"):
            raise bad(f"{key}.device", "'cpu' or 'cuda'", tensor["device"])

    tensors(metadata)
    # a library of shape buckets: each program's tensors, as many as the library's
    variants = metadata.get("variants", [])
    if not isinstance(variants, list):
        raise bad("variants", "a list of programs", variants)
    for index, variant in enumerate(variants):
        if not isinstance(variant, dict):
            raise bad(f"variants[{index}]", "an object with inputs and outputs", variant)
        tensors(variant, f"variants[{index}].")
        dims = variant.get("dims", {})
        if not isinstance(dims, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                 for v in dims.values()):
            raise bad(f"variants[{index}].dims", "an object of positive sizes by dim name", dims)
        for role in ("inputs", "outputs"):
            if len(variant[role]) != len(metadata[role]):
                raise bad(f"variants[{index}].{role}", f"{len(metadata[role])} tensors", len(variant[role]))
            for number, tensor in enumerate(variant[role]):  # the axes run() pads: each a multiple of its dim
                axes = tensor.get("axis_dims")
                if axes is not None and (not isinstance(axes, list) or len(axes) != len(tensor["shape"]) or not all(
                        dim is None or (isinstance(dim, str) and dim in dims and extent % dims[dim] == 0)
                        for dim, extent in zip(axes, tensor["shape"]))):
                    raise bad(f"variants[{index}].{role}[{number}].axis_dims",
                              "per axis, null or a dim of the variant's dims that divides the axis", axes)
    weights = field(metadata, "weights", dict, "an object with bytes and location")
    if field(weights, "location", str, "weights.location") not in ("embedded", "sidecar"):
        raise bad("weights.location", "'embedded' or 'sidecar'", weights["location"])
    if field(weights, "bytes", int, "weights.bytes: an integer") < 0:
        raise bad("weights.bytes", "a non-negative integer", weights["bytes"])


SEAL_MAGIC = b"BYOCSEAL"
SEAL_BYTES = len(SEAL_MAGIC) + 32  # the magic, then the SHA-256 of the bytes before it (less the weights)

# Embedded weights follow the ELF image, not inside it: linked in (.incbin), a model's
# weights passed through the assembler, the object cache and the linker on every build (a
# warm build of 1 GB of weights spent most of its time there), and past 2 GiB the code's
# 32-bit references across them cannot be linked at all. The file is
#   [ELF image][zeros to a WEIGHTS_ALIGNMENT boundary][weights][WEIGHTS_TRAILER][seal]
# where the trailer is the magic, then the weights' offset and size (uint64, little-endian).
# model_runtime.cc maps them from the file when the library is loaded (ELF loaders ignore
# bytes after the ELF data). Aligned for mmap on any page size up to 64 KiB.
#
# The seal covers every byte but the weights': what the dynamic loader reads and the
# trailer that says where the weights are. The weights are the runtime's to check (their
# checksum, compiled into the library, at create: a changed weight is refused there with
# its own message), so a build and every load spare a hash over them (a second of a 1 GB
# model's warm build).
WEIGHTS_MAGIC = b"BYOCWTS1"
WEIGHTS_TRAILER_BYTES = len(WEIGHTS_MAGIC) + 16
WEIGHTS_ALIGNMENT = 1 << 16


def _weights_region(file, end: int):
    """(offset, length) of the weights whose trailer ends at `end` in `file`, or None where
    no trailer ends there (a library without appended weights, or one cut short) or where
    it would have them begin inside the ELF image (what the dynamic loader reads is never
    left out of the seal)."""
    import struct
    if end < WEIGHTS_TRAILER_BYTES:
        return None
    file.seek(end - WEIGHTS_TRAILER_BYTES)
    trailer = file.read(WEIGHTS_TRAILER_BYTES)
    if len(trailer) != WEIGHTS_TRAILER_BYTES or trailer[:len(WEIGHTS_MAGIC)] != WEIGHTS_MAGIC:
        return None
    offset, length = struct.unpack("<QQ", trailer[len(WEIGHTS_MAGIC):])
    if offset % WEIGHTS_ALIGNMENT or offset + length != end - WEIGHTS_TRAILER_BYTES or offset < _image_end(file):
        return None
    return offset, length


class _ElfLayout:
    """What of a 64-bit ELF file says where its bytes are: its type, its program and section
    header tables (offset, count, entry size), and the file bytes (index, offset, size) of
    its loaded segments and of its sections that have any."""

    def __init__(self, file):
        import struct
        file.seek(0)
        header = file.read(64)
        endian = "<" if header[5] == 1 else ">"
        (self.type, _machine, _version, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum,
         shentsize, shnum, _shstrndx) = struct.unpack(endian + "HHIQQQIHHHHHH", header[16:64])
        self.program_headers, self.section_headers = (phoff, phnum, phentsize), (shoff, shnum, shentsize)
        self.segments, self.sections = [], []
        file_size = file.seek(0, os.SEEK_END)  # a table past the end is read as none (the checks say so)
        if phentsize == 56 and phoff + phnum * 56 <= file_size:
            file.seek(phoff)
            table = file.read(phnum * 56)
            for index in range(len(table) // 56):
                p_type, _, offset, _, _, file_bytes, _, _ = struct.unpack_from(endian + "IIQQQQQQ", table, index * 56)
                if p_type == 1:  # PT_LOAD: mapped from the file
                    self.segments.append((index, offset, file_bytes))
        if shentsize == 64 and shoff + shnum * 64 <= file_size:
            file.seek(shoff)
            table = file.read(shnum * 64)
            for index in range(len(table) // 64):
                _, sh_type, _, _, offset, file_bytes, *_ = struct.unpack_from(endian + "IIQQQQIIQQ", table, index * 64)
                if sh_type != 8:  # SHT_NOBITS takes no file bytes
                    self.sections.append((index, offset, file_bytes))

    @staticmethod
    def of(file):
        """The layout of `file`, or None where it is no 64-bit ELF file."""
        file.seek(0)
        header = file.read(64)
        return _ElfLayout(file) if len(header) == 64 and header[:4] == b"\x7fELF" and header[4] == 2 else None

    def end(self) -> int:
        """Where the ELF image ends: the furthest of its header tables, segments and sections."""
        tables = [offset + count * entry for offset, count, entry in (self.program_headers, self.section_headers)]
        return max([64, *tables, *(offset + size for _, offset, size in self.segments + self.sections)])


def _image_end(file) -> int:
    """_ElfLayout.end of `file` (2**64 where it is no 64-bit ELF file: no weights region is
    taken from one)."""
    layout = _ElfLayout.of(file)
    return layout.end() if layout is not None else 1 << 64


def _sealed_digest(file, end: int) -> bytes:
    """The SHA-256 the seal holds for the first `end` bytes of `file`: all of them, less the
    appended weights where a trailer ends at `end`."""
    import hashlib
    region = _weights_region(file, end)
    ranges = [(0, end)] if region is None else [(0, region[0]), (end - WEIGHTS_TRAILER_BYTES, end)]
    digest = hashlib.sha256()
    for first, last in ranges:
        file.seek(first)
        left = last - first
        while left:
            block = file.read(min(left, 1 << 20))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    return digest.digest()


def seal_library(path, weights=None) -> None:
    """Appends the seal that load() checks before the dynamic loader sees the file (ELF
    loaders ignore bytes after the ELF data). A damaged dynamic section or symbol table
    would crash the loader itself; with the seal, any changed byte of them is a clear error
    instead. With `weights` (a non-empty bytes-like), they are appended first, after the ELF
    image, with their trailer (WEIGHTS_MAGIC above). A file that ends in a trailer already
    (sealed again after an edit) is sealed as the build sealed it."""
    import struct
    if weights is not None and len(weights):
        with open(path, "ab") as file:
            size = file.tell()
            offset = -(-size // WEIGHTS_ALIGNMENT) * WEIGHTS_ALIGNMENT
            file.write(b"\0" * (offset - size))
            if hasattr(weights, "write_to"):  # a blob in pieces (codegen/host_plan.py WeightsBlob)
                weights.write_to(file)
            else:
                file.write(weights)
            file.write(WEIGHTS_MAGIC + struct.pack("<QQ", offset, len(weights)))
    with open(path, "rb") as file:
        end = file.seek(0, os.SEEK_END)
        digest = _sealed_digest(file, end)
    with open(path, "ab") as file:
        file.write(SEAL_MAGIC + digest)


def embedded_weights(path) -> bytes:
    """The weights blob a library carries after its ELF image (b"" where it has none: a
    sidecar library, or a model without weights), as seal_library appended it."""
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        region = _weights_region(file, size - SEAL_BYTES) if size >= SEAL_BYTES else None
        if region is None:
            return b""
        file.seek(region[0])
        return file.read(region[1])


def _check_seal(path: str, size: int) -> None:
    with open(path, "rb") as file:
        if size < SEAL_BYTES:
            raise ByocRuntimeError(f"cannot load {path}: not a byoc library (too short for its seal)")
        file.seek(size - SEAL_BYTES)
        trailer = file.read(SEAL_BYTES)
        if trailer[:len(SEAL_MAGIC)] != SEAL_MAGIC:
            raise ByocRuntimeError(f"cannot load {path}: not a byoc library, or one changed after the build "
                                   f"(strip, patchelf, a copy cut short): it does not end in byoc's seal; "
                                   f"rebuild it")
        if _sealed_digest(file, size - SEAL_BYTES) != trailer[len(SEAL_MAGIC):]:
            raise ByocRuntimeError(f"cannot load {path}: its bytes do not match the seal written at the build: the "
                                   f"file is corrupted or was changed after the build; rebuild it")


def _check_library_file(path: str) -> None:
    """Checks that `path` is a whole ELF shared object before the dynamic loader maps it: a
    FIFO or device would block or be read forever, and a truncated file maps pages past its
    end, which fault (SIGBUS) when the loader touches them."""
    import stat as stat_module
    try:
        info = os.stat(path)
    except (OSError, ValueError) as error:
        raise ByocRuntimeError(f"cannot load {path}: {error}") from None
    if not stat_module.S_ISREG(info.st_mode):
        kind = "a directory" if stat_module.S_ISDIR(info.st_mode) else "not a regular file"
        raise ByocRuntimeError(f"cannot load {path}: it is {kind}; expected a byoc .so file")
    size = info.st_size

    def corrupt(why):
        return ByocRuntimeError(f"cannot load {path}: {why}; the file is truncated or corrupted "
                                f"(expected a whole ELF shared object as byoc builds it)")
    try:
        with open(path, "rb") as file:
            header = file.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF":
                raise ByocRuntimeError(f"cannot load {path}: not an ELF shared object (no ELF header); "
                                       f"expected a .so built by byoc")
            if header[4] != 2 or header[5] != (1 if sys.byteorder == "little" else 2):
                raise corrupt("its ELF class or byte order is not this machine's (64-bit, native)")
            layout = _ElfLayout(file)
            if layout.type != 3:
                raise ByocRuntimeError(f"cannot load {path}: ELF type {layout.type} is not a shared object (3)")
            e_phoff, e_phnum, e_phentsize = layout.program_headers
            e_shoff, e_shnum, e_shentsize = layout.section_headers
            if e_phentsize != 56 or e_phnum == 0 or e_phoff + e_phnum * 56 > size:
                raise corrupt(f"its program headers ({e_phnum} at offset {e_phoff}) lie outside its {size} bytes")
            if e_shnum and (e_shentsize != 64 or e_shoff + e_shnum * 64 > size):
                raise corrupt(f"its section headers ({e_shnum} at offset {e_shoff}) lie outside its {size} bytes")
            for index, offset, length in layout.segments:
                if offset + length > size:
                    raise corrupt(f"segment {index} needs bytes {offset}..{offset + length} of the file, "
                                  f"which has {size}")
            for index, offset, length in layout.sections:
                if offset + length > size:
                    raise corrupt(f"section {index} needs bytes {offset}..{offset + length}, beyond its {size}")
        _check_seal(path, size)
    except OSError as error:
        raise ByocRuntimeError(f"cannot load {path}: {error}") from None


def _checked_weights_path(path) -> str:
    """A sidecar path the C side can open: a regular file (a FIFO would block create()),
    with no NUL byte (C would read the path only up to it, and open another file)."""
    import stat as stat_module
    if not isinstance(path, (str, os.PathLike)):
        raise ByocRuntimeError(f"weights_path: expected a path to a .safetensors file, got {type(path).__name__}")
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\0" in text:
        raise ByocRuntimeError(f"weights_path {text!r} contains a NUL byte; expected a file path")
    try:
        info = os.stat(text)
    except OSError as error:
        raise ByocRuntimeError(f"weights file {text!r} cannot be read: {error.strerror or error}") from None
    if not stat_module.S_ISREG(info.st_mode):
        raise ByocRuntimeError(f"weights file {text!r} is not a regular file; expected a .safetensors weights "
                               f"file of the library (its sidecar, or one `byoc refit` wrote)")
    return text


def _resolved(path) -> str:
    try:
        return str(Path(path).resolve(strict=True))
    except (OSError, RuntimeError, ValueError) as error:  # missing, a symlink loop, a NUL byte
        raise ByocRuntimeError(f"cannot load {path}: {error}") from None


def _check_path(path):
    if not isinstance(path, (str, os.PathLike)):
        raise ByocRuntimeError(f"expected a path to a byoc .so, got "
                               f"{'None' if path is None else type(path).__name__}")
    return path


# resolved path -> (device, inode, size, mtime) of the file when this process first
# dlopen()ed it under that name. The dynamic loader hands back the library it already has
# for a name it has seen, so a .so rebuilt at the same path (a workdir built again) would
# silently run the old code.
_first_opened: dict = {}
_first_opened_lock = threading.Lock()


def _open_library(path) -> ctypes.CDLL:
    """The library at `path`, checked to be one byoc built (it exports byoc_model_metadata).
    A file that changed since this process first loaded that path is loaded from a private
    copy (removed once loaded), so the loader cannot return the earlier one."""
    resolved = _resolved(path)
    _check_library_file(resolved)
    from .shared_libraries import preload_needed
    preload_needed(resolved)  # cuBLASLt from the toolkit or pip: the library carries no run path
    try:
        stat = os.stat(resolved)
        state = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        with _first_opened_lock:
            first = _first_opened.setdefault(resolved, state)
        if first == state:
            lib = ctypes.CDLL(resolved, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        else:
            lib = _open_private_copy(resolved)
    except (OSError, UnicodeDecodeError) as error:  # the loader's message may not be UTF-8
        raise ByocRuntimeError(f"cannot load {path}: {error}") from None
    missing = [name for name in _REQUIRED_SYMBOLS if not hasattr(lib, name)]
    if missing:
        _close_library(lib)
        raise ByocRuntimeError(f"{path}: not a byoc library: it has no {', '.join(missing)}")
    return lib


# What a byoc library exports (byoc_model.h); byoc_model_status is newer and optional.
_REQUIRED_SYMBOLS = ("byoc_model_metadata", "byoc_model_create", "byoc_model_run", "byoc_model_destroy",
                     "byoc_last_error")


def _open_private_copy(path: str) -> ctypes.CDLL:
    import shutil
    import tempfile
    try:  # beside the library: a directory it loads from (a temporary one may be noexec)
        handle, copy = tempfile.mkstemp(prefix=".byoc-load-", suffix=".so", dir=os.path.dirname(path))
    except OSError:
        handle, copy = tempfile.mkstemp(prefix="byoc-load-", suffix=".so")
    try:
        with os.fdopen(handle, "wb") as destination, open(path, "rb") as source:
            shutil.copyfileobj(source, destination)
        return ctypes.CDLL(copy, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    finally:
        os.unlink(copy)  # the loaded mapping stays valid


def metadata_of(path) -> dict:
    """A library's metadata JSON, read without creating the model (no weights loaded)."""
    lib = _open_library(_check_path(path))
    try:
        return _read_metadata(lib, str(path))
    finally:
        _close_library(lib)


def _close_library(lib: ctypes.CDLL) -> None:
    """Drops this CDLL's reference to the library (each CDLL is one dlopen; the library is
    unmapped when the last goes). Nothing may call into `lib` afterwards."""
    import _ctypes
    try:
        _ctypes.dlclose(lib._handle)
    except OSError:
        pass
