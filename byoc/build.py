"""build(): one model in, one deployable .so out.

    the work directory   (here) the config's `workdir`, or a fresh temporary one; locked
    the programs         (shape_buckets.py) the pipeline (pipeline.py: import, simplify,
                         partition, codegen, plan devices and memory, CUDA graphs, host
                         plan) once, or once per shape bucket
    the library          (package.py) host code, embedded weights and tables, ninja and the
                         object cache, one sealed model.so

Everything generated is kept in the work directory: sources, build.ninja, the partition
report, weights, report.html and the IR after the stages that write it (partitioned.ir,
final.ir, cuda_graph.ir; any stage's with dump_after).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .errors import BuildError, ByocWarning, CompileError, ConfigError
from .library import Library
from .pipeline import BuildContext
from .progress import BuildProgress


def build(model, target=None, config=None, *, input_shapes: dict | None = None, workdir=None,
          params: str | None = None, precision: str | None = None, dims: dict | None = None,
          arch: list | None = None, dump_after=()) -> Library:
    """Build `model` (an IRModule, an ONNX path/bytes/ModelProto) into a shared library.

    `config` is a build config (a name from build_configs/, a YAML path or a dict;
    default "default"); `target`, `workdir`, `params`, `precision`, `dims` (sizes of
    named dims, e.g. {"batch": 1}) and `arch` (CUDA archs, e.g. ["sm_80", "sm_90"]: one
    library for all of them) override its keys. `dump_after`: names of pipeline
    stages (`byoc build --print-pipeline` lists them) whose output IR is written to the
    work directory's ir/ (a shape bucket's to bucket<N>/ir/).
    """
    from .config import _validate_input_shapes, for_device, load_config
    from .target import resolve_device_target
    overrides = {key: value for key, value in (("target", target), ("workdir", workdir), ("params", params),
                                                ("precision", precision), ("dims", dims), ("arch", arch))
                 if value is not None}
    cfg = load_config(config if config is not None else "default", overrides=overrides)
    if input_shapes is not None:  # it replaces the config's input_shapes: check it the same way
        input_shapes = _validate_input_shapes("build()", input_shapes)
    device = resolve_device_target(cfg.target)
    cfg, notes = for_device(cfg, device)
    dump_after = (dump_after,) if isinstance(dump_after, str) else dump_after or ()
    if not isinstance(dump_after, (list, tuple, set, frozenset)) or not all(isinstance(n, str) for n in dump_after):
        raise ConfigError(f"dump_after={dump_after!r}: expected a stage name or a list of them "
                          f"(byoc build --print-pipeline lists the stages)")
    workdir, temporary = make_workdir(cfg.workdir)
    try:
        context = BuildContext(config=cfg, target=device, workdir=workdir, model=model, input_shapes=input_shapes,
                               progress=BuildProgress(), dump_after=frozenset(dump_after))
        for note in notes:
            context.progress.stage(note)
        return _build(context, temporary)
    except CompileError:
        raise  # a compiler or link error points into the workdir (its sources, its rerun command): keep it
    except BaseException:
        if temporary:
            shutil.rmtree(workdir, ignore_errors=True)
        raise


def _build(context: BuildContext, temporary: bool) -> Library:
    from .package import link
    from .shape_buckets import lower_programs
    started = time.perf_counter()
    what = Path(context.model).name if isinstance(context.model, (str, os.PathLike)) else "the model"
    context.progress.stage(f"building {what} for {context.target} (backends: "
                           f"{', '.join(context.config.backend_names) or 'builtin'}; workdir {context.workdir})")
    with _workdir_lock(context.workdir), context.progress.heartbeat():
        programs, padding = lower_programs(context)
        library = link(programs, context, padding)
        library.build_stats["seconds"] = round(time.perf_counter() - started, 2)
        context.write("build_stats.json", json.dumps(library.build_stats, indent=2, sort_keys=True))
    if temporary:
        library.workdir_kept = False
        # byoc's own directory goes with the Library (at the latest when the process
        # exits): a Module loaded from it keeps its mapping and weights, and
        # export_library() copies the files out first. workdir= keeps the sources.
        import weakref
        weakref.finalize(library, shutil.rmtree, str(context.workdir), True)
    return library


def make_workdir(configured) -> tuple[Path, bool]:
    """(the work directory, whether it is byoc's own temporary one), created and checked
    writable. Absolute: ninja runs in it, so relative paths in its commands would break."""
    try:
        workdir = Path(configured).resolve() if configured else Path(tempfile.mkdtemp(prefix="byoc-build-"))
    except (OSError, ValueError, RuntimeError) as error:  # a NUL byte, a symlink loop, no temporary directory
        raise ConfigError(f"workdir {str(configured or tempfile.gettempdir())!r} is not a usable directory "
                          f"path: {error}") from None
    try:
        try:
            if workdir.exists() and not workdir.is_dir():
                raise ConfigError(f"workdir {workdir} is not a directory; expected a directory "
                                  f"(it is created when missing)")
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a parent is a file, no permission, a name too long
            raise ConfigError(f"workdir {workdir} cannot be created: {error.strerror or error}") from None
        # a ConfigError now, rather than a PermissionError from the first file written
        # halfway through the build
        try:
            handle, probe = tempfile.mkstemp(prefix=".byoc-write-probe-", dir=workdir)
            os.close(handle)
            os.unlink(probe)
        except OSError as error:
            raise ConfigError(f"workdir {workdir} is not writable ({error.strerror or error}); expected a "
                              f"directory byoc can write its sources, build.ninja and the library into") from None
    except BaseException:
        if not configured:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    return workdir, not configured


@contextlib.contextmanager
def _workdir_lock(workdir: Path):
    """Held for the whole build: two builds writing one workdir would overwrite each
    other's sources, objects and model.so. Not waited for: the second build fails."""
    import fcntl
    path = workdir / ".byoc.lock"
    try:
        lock = open(path, "a")
    except OSError as error:
        raise ConfigError(f"workdir {workdir}: cannot open its lock file {path.name} "
                          f"({error.strerror or error})") from None
    with lock:  # closing the file releases the lock
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(f"workdir {workdir} is in use by another build; expected one build at a "
                             f"time per workdir: wait for it to finish, or give this build its own "
                             f"workdir") from None
        except OSError as error:  # a file system without locks: build unlocked, but say so
            import warnings
            warnings.warn(f"workdir {workdir}: cannot lock {path.name} ({error.strerror or error}); "
                          f"building without protection against a concurrent build into it", ByocWarning,
                          stacklevel=5)
        yield
