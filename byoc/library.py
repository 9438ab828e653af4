"""Library: what build() returns. The .so in the work directory with its metadata, partition
report and build statistics; load() opens it, export_library() copies it out (with its
.safetensors sidecar) so that it needs nothing from the work directory."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BuildError


@dataclass
class Library:
    """A built model: the .so in the work directory, its metadata and partition report."""
    path: Path
    workdir: Path
    metadata: dict
    report: object = None
    sidecar: Path | None = None
    memory: dict = field(default_factory=dict)
    # seconds, compile units compiled vs taken from the object cache, per backend (not in
    # the metadata: it would make two builds of one model differ)
    build_stats: dict = field(default_factory=dict)
    # path -> (device, inode, size, mtime) of the .so and sidecar as this build left them
    file_states: dict = field(default_factory=dict, repr=False, compare=False)
    # False for byoc's own temporary workdir, which goes with this object (workdir= keeps one)
    workdir_kept: bool = True

    @property
    def build_id(self) -> str | None:
        return self.metadata.get("build_id")

    def check_current(self):
        """A BuildError when the work directory no longer holds this build's library: a later
        build into the same workdir replaced model.so (and the sidecar), which
        load()/export_library() would otherwise silently return. One stat a file: any change
        since this build counts (a build id names the sources and weights, not every option
        that shapes the library, so it cannot tell a rebuild of the same model apart)."""
        for path in (self.path, self.sidecar):
            if path is None or self.build_id is None or str(path) not in self.file_states:
                continue  # a Library made by hand (no recorded file states) is taken as it is
            try:
                state = file_state(path)
            except OSError:
                raise BuildError(f"workdir {self.workdir} no longer has {Path(path).name} of build {self.build_id} "
                                 f"(it was removed, or a later build into the workdir failed); export the "
                                 f"library before building again into the same workdir") from None
            if self.file_states.get(str(path)) != state:
                raise BuildError(f"workdir {self.workdir} was rebuilt since this Library was made: its "
                                 f"{Path(path).name} is no longer the one build {self.build_id} wrote; export "
                                 f"it before building again into the same workdir")

    def export_library(self, path) -> Path:
        """Copy the library (and its .safetensors sidecar, when the weights live outside)
        to `path`; the copy needs nothing from the work directory."""
        if not isinstance(path, (str, os.PathLike)):
            raise BuildError(f"export_library: expected a file path such as 'model.so', got {path!r}")
        destination = Path(path)
        try:
            is_directory = destination.is_dir()
        except (OSError, ValueError) as error:  # a name too long, a NUL byte
            raise BuildError(f"export_library: {str(destination)!r} is not a usable path: {error}") from None
        if is_directory:
            raise BuildError(f"export_library: {str(destination)!r} is a directory; expected a file path "
                             f"such as {str(destination / 'model.so')!r}")
        self.check_current()
        try:
            destination.parent.mkdir(parents=True, exist_ok=True)
            _replace_with_link(self.path, destination, mode=0o755)
            if self.sidecar is not None:
                _replace_with_link(self.sidecar, destination.with_suffix(".safetensors"))
        except OSError as error:
            raise BuildError(f"export_library: cannot write {str(destination)!r}: {error.strerror or error}") from None
        return destination

    def load(self, device=None):
        """The library loaded (byoc.load), on CUDA device `device` (None: the current one)."""
        from .runtime import load
        self.check_current()
        return load(self.path, self.sidecar, device)


def _replace_with_link(source, destination: Path, mode: int | None = None):
    """Put `source` at `destination` as a new file there (made beside it, then renamed): a
    process that has the old library loaded keeps its mapping intact, where writing into
    the mapped file in place could crash it. A hard link where both lie on one file system,
    else a copy: a library with its weights is as large as they are (a 1 GB decoder's was
    written twice, once by the build and once here). A build never rewrites its files in
    place (package.py makes model.so and the sidecar new files), so the export keeps what
    it got when the work directory is built again or removed."""
    temporary = destination.with_name(f".{destination.name}.{os.getpid()}.tmp")
    try:
        temporary.unlink(missing_ok=True)
        try:
            os.link(source, temporary)
            # a link shares the work directory file's mode: change it only where it differs,
            # and copy where that is not allowed (a file another user owns)
            if mode is not None and os.stat(temporary).st_mode & 0o7777 != mode:
                os.chmod(temporary, mode)
        except OSError:  # another file system, one without hard links, or a mode not ours to set
            temporary.unlink(missing_ok=True)
            shutil.copyfile(source, temporary)
            if mode is not None:
                os.chmod(temporary, mode)
        os.replace(temporary, destination)
    finally:
        if temporary.exists():
            temporary.unlink()


def file_state(path) -> tuple:
    """What check_current compares: (device, inode, size, mtime) of `path`."""
    stat = os.stat(path)
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
