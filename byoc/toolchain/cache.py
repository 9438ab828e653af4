"""A content-addressed object cache under $BYOC_CACHE_DIR (default ~/.cache/byoc/objects).

The key of an object is the sha256 of its compile command, the compiler's version, the
source, and every file the source includes with quotes (found next to it or in its -I
directories), recursively. Headers included with angle brackets belong to the compiler,
the CUDA toolkit (whose nvcc's version is in the key) or pip packages (CUTLASS from
nvidia-cutlass, cuBLASLt from nvidia-cublas ...): the versions of the pip packages whose
include directories a command names enter the key through `extra_key`
(`package_versions`), so upgrading one in place does not reuse stale objects.

A cache directory that cannot be used (read-only, a file, under /proc ...) is not an
error: builds go on without it, after one warning that names $BYOC_CACHE_DIR.

Behind the object cache, read only, lies the kernel library ($BYOC_KERNEL_LIBRARY, default
<cache root>/kernels): objects keyed the same way, compiled once per machine by `byoc kernels
build` (byoc/kernel_library.py), so that tuning a model no database knows times candidate
kernels without compiling them. Clearing the object cache leaves it alone.
"""
from __future__ import annotations

import contextvars
import functools
import hashlib
import importlib.metadata
import os
import re
import shutil
import threading
import warnings
from pathlib import Path

from ..errors import ByocWarning

# Changing how keys are made, or what may be stored, changes this: earlier entries are
# then never matched (format 1 could hold objects of failed compiles).
_KEY_FORMAT = "byoc object cache 2"
_QUOTED_INCLUDE = re.compile(rb'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
# Files whose text may #include others; anything else (the weights blob a .S file embeds,
# hundreds of MB) is hashed but not searched for includes.
_SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".inc", ".S", ".s"}


def cache_root() -> Path:
    """$BYOC_CACHE_DIR, else ~/.cache/byoc: where the object cache, the persistent tuning
    database and the kernel library live."""
    return Path(os.environ.get("BYOC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "byoc"))


# The directory `store` writes to instead of the object cache while `byoc kernels build`
# fills the kernel library (storing_into), in this thread's context only: builds in other
# threads of the process keep their object cache. None: the object cache.
_store_override: contextvars.ContextVar = contextvars.ContextVar("byoc_store_override", default=None)


def cache_dir() -> Path:
    override = _store_override.get()
    return override if override is not None else cache_root() / "objects"


def kernel_library_dir() -> Path:
    """The kernel library's objects: $BYOC_KERNEL_LIBRARY, else <cache root>/kernels."""
    return Path(os.environ.get("BYOC_KERNEL_LIBRARY") or cache_root() / "kernels")


class storing_into:
    """`with storing_into(directory):` objects compiled in the block (by this thread) are
    stored under `directory`, keyed as the object cache keys them, instead of the object
    cache, and looked up there alone: how the kernel library is filled."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def __enter__(self):
        self.token = _store_override.set(self.directory)
        return self.directory

    def __exit__(self, *exc):
        _store_override.reset(self.token)
        return False


class CacheWarning(ByocWarning):
    """The object cache could not be used; the build goes on without it."""


_warned_about = set()  # cache directories already warned about in this process


def _cache_unusable(error: OSError, doing: str):
    """Warn (once per cache directory and process) that the cache is skipped, and why."""
    directory = cache_dir()
    if directory in _warned_about:
        return
    _warned_about.add(directory)
    reason = error.strerror or type(error).__name__
    where = f" ({error.filename})" if error.filename else ""
    variable = (f"BYOC_CACHE_DIR={os.environ['BYOC_CACHE_DIR']}" if os.environ.get("BYOC_CACHE_DIR")
                else "the default cache directory (set BYOC_CACHE_DIR to choose another)")
    warnings.warn(f"byoc's object cache {directory} cannot be used ({doing}: {reason}{where}); "
                  f"building without it. Check {variable}: it must be a writable directory.",
                  CacheWarning, stacklevel=3)


def include_dirs(flags) -> list[Path]:
    """The include directories (-I, -isystem) named in a command."""
    dirs = []
    for index, flag in enumerate(flags):
        for option in ("-I", "-isystem"):
            if flag.startswith(option) and len(flag) > len(option):
                dirs.append(Path(flag[len(option):]))
            elif flag == option and index + 1 < len(flags):
                dirs.append(Path(flags[index + 1]))
    return dirs


# A line of a distribution's file list (RECORD, or SOURCES.txt of an editable install):
# its first directory, and its second when the file lies deeper.
_LISTED_DIRECTORIES = re.compile(r"^([^/,\n]+)/(?:([^/,\n]+)/)?", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def _installed_distributions() -> tuple:
    """(site directory, distribution, the directories its files lie in: 1- and 2-part
    prefixes) of every installed distribution, read once per process (see
    installed_packages_changed). The file lists are scanned as text: parsing them with
    importlib.metadata costs three times more."""
    found = []
    for distribution in importlib.metadata.distributions():
        try:
            root = Path(distribution.locate_file("")).resolve()
            listing = distribution.read_text("RECORD") or distribution.read_text("SOURCES.txt") or ""
        except (OSError, ValueError, TypeError, UnicodeDecodeError):  # a broken install: not keyed on
            continue
        prefixes = set()
        for first, second in _LISTED_DIRECTORIES.findall(listing.replace("\\", "/")):
            prefixes.add((first,))
            if second:
                prefixes.add((first, second))
        found.append((root, distribution, frozenset(prefixes)))
    return tuple(found)


@functools.lru_cache(maxsize=1)
def _distributions_by_site() -> tuple:
    """_installed_distributions grouped by site directory, as text: ((site, ((distribution,
    prefixes), ...)), ...). A process has a few site directories and hundreds of
    distributions (a torch environment): a directory is placed against each site once."""
    sites: dict = {}
    for root, distribution, prefixes in _installed_distributions():
        sites.setdefault(str(root), []).append((distribution, prefixes))
    return tuple((site, tuple(entries)) for site, entries in sites.items())


@functools.lru_cache(maxsize=None)
def _packages_providing(directory: Path) -> tuple:
    """'name==version' of the pip packages whose files lie in `directory` (nvidia/cu13/include
    is shared by several nvidia-* packages: all of them)."""
    try:
        directory = str(directory.resolve())
    except OSError:
        return ()
    by_first, by_two = [], []
    for site, entries in _distributions_by_site():
        inside = site.rstrip(os.sep) + os.sep
        if not directory.startswith(inside):
            continue
        parts = tuple(part for part in directory[len(inside):].split(os.sep) if part)
        for distribution, prefixes in entries:
            if parts and parts[:1] in prefixes:
                by_first.append(distribution)
                if len(parts) > 1 and parts[:2] in prefixes:
                    by_two.append(distribution)
    packages = set()
    for distribution in by_two or by_first:
        try:
            packages.add(f"{distribution.metadata['Name']}=={distribution.version}")
        except (OSError, ValueError, TypeError):
            continue
    return tuple(sorted(packages))


def installed_packages_changed():
    """Forget the installed packages looked up so far (after installing in this process)."""
    _installed_distributions.cache_clear()
    _distributions_by_site.cache_clear()
    _packages_providing.cache_clear()


def package_versions(directories) -> str:
    """The pip packages (name==version) that provide any of `directories`, one per line;
    empty when none does. Looked up once per directory and process."""
    packages = set()
    for directory in directories:
        packages.update(_packages_providing(Path(directory)))
    return "\n".join(sorted(packages))


def object_key(source: Path, command: list[str], compiler_version: str, extra_files=(), extra_key: str = "",
               search_dirs: list | None = None, memo: dict | None = None) -> str:
    """sha256 over the command, the compiler's version, `extra_key`, and the bytes of the
    source, of `extra_files` and of every local header they include (recursively). `memo`,
    a dict the caller keeps for the units of one build, holds each file it read (resolved
    path, bytes, quoted includes): the units of a build share most of their headers."""
    memo = {} if memo is None else memo
    digest = hashlib.sha256()
    digest.update(_KEY_FORMAT.encode())
    digest.update("\0".join(command).encode())
    digest.update(compiler_version.encode())
    digest.update(extra_key.encode())
    search = search_dirs if search_dirs is not None else include_dirs(command)
    seen = set()
    pending = [Path(source)] + [Path(f) for f in extra_files]
    while pending:
        path = pending.pop()
        if path not in memo:
            resolved = path.resolve()
            if resolved.is_file():
                data = resolved.read_bytes()
                names = [name.decode(errors="replace") for name in _QUOTED_INCLUDE.findall(data)] \
                    if resolved.suffix in _SOURCE_SUFFIXES else []
                memo[path] = (resolved, data, names)
            else:
                memo[path] = None
        if memo[path] is None or memo[path][0] in seen:
            continue
        resolved, data, names = memo[path]
        seen.add(resolved)
        digest.update(str(len(data)).encode() + b":" + data)
        for name in names:
            for directory in [resolved.parent] + search:
                candidate = directory / name
                found = memo.get(("is_file", candidate))
                if found is None:
                    found = memo[("is_file", candidate)] = candidate.is_file()
                if found:
                    pending.append(candidate)
                    break
    return digest.hexdigest()


def cached_object(key: str, directory: Path | None = None) -> Path:
    return (directory if directory is not None else cache_dir()) / key[:2] / f"{key}.o"


def has(key: str) -> bool:
    """Whether `fetch` would find an object for `key` (in the object cache or the kernel
    library)."""
    for directory in _lookup_dirs():
        try:
            if cached_object(key, directory).is_file():
                return True
        except OSError:  # a directory this process may not read: no object from it
            continue
    return False


def _lookup_dirs() -> list:
    """Where objects are looked up, in order: the object cache, then the kernel library."""
    first = cache_dir()
    library = kernel_library_dir()
    return [first] if library == first else [first, library]


def fetch(key: str, destination: Path) -> bool:
    """Copy the cached object for `key` (from the object cache, else the kernel library) to
    `destination`; False on a miss, or when the cache cannot be read (warned about once). A
    copy, not a hard link: tools that rewrite an object in place would otherwise change the
    cache."""
    cached = None
    for directory in _lookup_dirs():
        try:
            cached = open(cached_object(key, directory), "rb")
            break
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            continue  # a miss (or no such directory yet; `store` says if it cannot make one)
        except OSError as error:
            if directory == cache_dir():
                _cache_unusable(error, "reading an object")
            continue
    if cached is None:
        return False
    # Errors writing `destination` belong to the work directory, not the cache: they propagate.
    with cached:
        destination.parent.mkdir(parents=True, exist_ok=True)
        with open(destination, "wb") as copy:
            _copy_in_kernel(cached, copy)
    return True


def _copy_in_kernel(source, destination):
    """Copy an open file into another without passing the bytes through Python (sendfile:
    a warm build's weights object is hundreds of MB); what sendfile cannot do is copied
    the ordinary way."""
    size = os.fstat(source.fileno()).st_size
    offset = 0
    try:
        while offset < size:
            sent = os.sendfile(destination.fileno(), source.fileno(), offset, min(size - offset, 1 << 30))
            if sent == 0:
                break
            offset += sent
    except OSError:
        pass  # a file system sendfile cannot write to: the rest the ordinary way
    source.seek(offset)
    destination.seek(offset)
    shutil.copyfileobj(source, destination)


def store(key: str, built: Path):
    """Put the object `built` in the cache under `key`; when the cache cannot be written,
    warn once and go on without it."""
    target = cached_object(key)
    # per process and thread: two threads storing one key must not write one temporary file
    temporary = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, temporary)
        os.replace(temporary, target)  # atomic: concurrent builds never see half a file
    except OSError as error:
        if error.filename is not None and Path(error.filename) == Path(built):
            raise  # the object itself is unreadable: not the cache's fault
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass
        _cache_unusable(error, "storing an object")
