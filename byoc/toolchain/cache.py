"""A content-addressed object cache under $BYOC_CACHE_DIR (default ~/.cache/byoc/objects).

The key of an object is the sha256 of its compile command, the compiler's version, the
source, and every file the source includes with quotes (found next to it or in its -I
directories), recursively; headers included with angle brackets belong to installed
packages, whose versions enter through the command (include paths) and `extra_key`.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

_QUOTED_INCLUDE = re.compile(rb'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def cache_dir() -> Path:
    root = os.environ.get("BYOC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "byoc")
    return Path(root) / "objects"


def include_dirs(flags) -> list[Path]:
    """The -I directories named in a command."""
    dirs = []
    for index, flag in enumerate(flags):
        if flag.startswith("-I") and len(flag) > 2:
            dirs.append(Path(flag[2:]))
        elif flag == "-I" and index + 1 < len(flags):
            dirs.append(Path(flags[index + 1]))
    return dirs


def object_key(source: Path, command: list[str], compiler_version: str, extra_files=(), extra_key: str = "",
               search_dirs: list | None = None) -> str:
    """sha256 over the command, the compiler's version, `extra_key`, and the bytes of the
    source, of `extra_files` and of every local header they include (recursively)."""
    digest = hashlib.sha256()
    digest.update("\0".join(command).encode())
    digest.update(compiler_version.encode())
    digest.update(extra_key.encode())
    search = search_dirs if search_dirs is not None else include_dirs(command)
    seen = set()
    pending = [Path(source)] + [Path(f) for f in extra_files]
    while pending:
        path = pending.pop()
        resolved = path.resolve()
        if resolved in seen or not resolved.is_file():
            continue
        seen.add(resolved)
        data = resolved.read_bytes()
        digest.update(str(len(data)).encode() + b":" + data)
        for name in _QUOTED_INCLUDE.findall(data):
            name = name.decode(errors="replace")
            for directory in [resolved.parent] + search:
                candidate = directory / name
                if candidate.is_file():
                    pending.append(candidate)
                    break
    return digest.hexdigest()


def cached_object(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.o"


def fetch(key: str, destination: Path) -> bool:
    """Copy the cached object for `key` to `destination`; False on a miss. A copy, not a
    hard link: tools that rewrite an object in place would otherwise change the cache."""
    cached = cached_object(key)
    if not cached.is_file():
        return False
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, destination)
    return True


def store(key: str, built: Path):
    """Put the object `built` in the cache under `key`."""
    target = cached_object(key)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(f".{os.getpid()}.tmp")
    shutil.copyfile(built, temporary)
    os.replace(temporary, target)  # atomic: concurrent builds never see half a file
