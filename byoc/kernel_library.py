"""The kernel library: kernels compiled once per machine, so that a build of a model no
tuning database knows times candidate kernels instead of compiling them.

Tuning a problem the databases lack used to compile every candidate kernel it timed (a cold
build of ResNet-50 spent 177 of its 192 s there). A CUTLASS 3.x kernel does not depend on
problem sizes: compiled once with its epilogue proxy (bias or none), it can be timed on
every problem of its dtype and layout, in every later build. `byoc kernels build` compiles
what each backend of a config hands it (Backend.kernel_library: the cutlass backend's every
candidate, fp16 by default) into <cache root>/kernels ($BYOC_KERNEL_LIBRARY), keyed as the
object cache keys objects, and the object cache looks there after itself
(toolchain/cache.py). Tuning then times every candidate the library holds and compiles only
the winners, with their own epilogues, as part of the build.

The library is a cache: deleting it costs time, never correctness (a missing object is
compiled as before). Its manifest.json says what filled it, where and when.
"""
from __future__ import annotations

import datetime
import tempfile
import time
from pathlib import Path

from .errors import BuildError, CompileError, ConfigError
from .toolchain import cache

MANIFEST = "manifest.json"


def library_dir() -> Path:
    return cache.kernel_library_dir()


def library_units(config="cuda_sm90", workdir: Path | None = None, dtypes=("float16",),
                  epilogues: str = "proxy") -> tuple[list, dict]:
    """([CompileUnit], {backend: unit count}) of the kernel library for `config`'s device
    target and backends, their sources written under `workdir`."""
    from .config import for_device, load_config
    from .pipeline import BuildContext
    from .backend import get_backend
    from .target import resolve_device_target
    cfg = load_config(config)
    device = resolve_device_target(cfg.target)
    if device.kind != "cuda":
        raise ConfigError(f"config {config!r}: target {cfg.target!r} is not a cuda target; a kernel library holds "
                          f"GPU kernels (expected e.g. the cuda_sm90 config)")
    cfg, _ = for_device(cfg, device)
    context = BuildContext(config=cfg, target=device, workdir=Path(workdir))
    units, counts = [], {}
    for name, target in context.backend_targets.items():
        hook = get_backend(name).kernel_library
        if hook is None:
            continue
        made = hook(target, Path(workdir), tuple(dtypes), epilogues)
        counts[name] = len(made)
        units += made
    if not units:
        raise ConfigError(f"config {config!r}: none of its backends ({', '.join(context.backend_targets)}) keeps "
                          f"kernels in a kernel library (cutlass does)")
    return units, counts


def build_library(config="cuda_sm90", dtypes=("float16",), epilogues: str = "proxy", jobs: int | None = None,
                  progress=None) -> dict:
    """Compile the kernel library for `config` into library_dir() (objects already there are
    kept) and record it in its manifest; what it did: units, compiled, failed, seconds,
    bytes, where. A unit that does not compile is reported, not fatal (tuning compiles it
    when it needs it, as before)."""
    from .toolchain.compiler import compile_units, unit_cached
    directory = library_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BuildError(f"cannot make the kernel library {directory} ({error.strerror or error}); expected a "
                         f"writable directory (set BYOC_KERNEL_LIBRARY to choose another)") from None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="byoc-kernels-") as workdir:
        units, counts = library_units(config, Path(workdir), dtypes, epilogues)
        with cache.storing_into(directory):
            present = sum(unit_cached(units, workdir))
            failure = None
            try:
                compile_units(units, workdir, jobs=jobs, progress=progress)
            except CompileError as error:
                failure = str(error)
            built = unit_cached(units, workdir)
    summary = {"config": config if isinstance(config, str) else "(dict)", "dtypes": list(dtypes),
               "epilogues": epilogues, "units": len(units), "by_backend": counts, "already_there": present,
               "compiled": sum(built) - present, "failed": len(units) - sum(built),
               "seconds": round(time.perf_counter() - started, 1), "where": str(directory)}
    summary["bytes"] = library_bytes(directory)
    _record(directory, summary, failure)
    return summary


def _record(directory: Path, summary: dict, failure: str | None):
    """Add this build to the manifest (one entry per config, dtypes and epilogues)."""
    from .json_files import write_json_whole
    manifest = read_manifest(directory)
    key = f"{summary['config']}:{'+'.join(summary['dtypes'])}:{summary['epilogues']}"
    entry = {**{k: v for k, v in summary.items() if k not in ("where", "bytes")},
             "date": datetime.datetime.now().isoformat(timespec="seconds"), **_provenance()}
    if failure:
        entry["first_failure"] = failure[:2000]
    manifest.setdefault("builds", {})[key] = entry
    try:
        write_json_whole(directory / MANIFEST, manifest)
    except OSError as error:
        raise BuildError(f"cannot write {directory / MANIFEST} ({error.strerror or error})") from None


def _provenance() -> dict:
    from .target import visible_gpu_name
    from .toolchain.compiler import compiler_version
    from .toolchain.locate import find_nvcc
    try:
        nvcc = compiler_version(str(find_nvcc())).strip().splitlines()[-1]
    except Exception:  # noqa: BLE001 - provenance only
        nvcc = None
    try:
        from importlib import metadata
        cutlass = metadata.version("nvidia-cutlass")
    except Exception:  # noqa: BLE001
        cutlass = None
    return {"nvcc": nvcc, "cutlass": cutlass, "gpu": visible_gpu_name()}


def read_manifest(directory: Path | None = None) -> dict:
    """The library's manifest ({"format", "builds": {...}}); an empty one where there is none
    or it cannot be read (the objects are what matters; the manifest describes them)."""
    from .json_files import read_json
    path = (directory or library_dir()) / MANIFEST
    empty = {"format": "byoc-kernel-library", "version": 1, "builds": {}}
    if not path.is_file():
        return empty
    try:
        data = read_json(path, "the kernel library's manifest", BuildError, max_bytes=16 << 20)
    except BuildError:
        return empty
    if not isinstance(data, dict) or data.get("format") != empty["format"] or not isinstance(data.get("builds"), dict):
        return empty
    return data


def library_bytes(directory: Path | None = None) -> int:
    """The objects' size on disk."""
    directory = directory or library_dir()
    return sum(path.stat().st_size for path in directory.glob("??/*.o") if path.is_file())


def library_objects(directory: Path | None = None) -> int:
    return sum(1 for _ in (directory or library_dir()).glob("??/*.o"))


def clear_library() -> int:
    """Delete the library's objects and manifest (only those: a directory the user pointed
    BYOC_KERNEL_LIBRARY at keeps anything else); how many objects were deleted."""
    directory = library_dir()
    removed = 0
    for path in directory.glob("??/*.o"):
        path.unlink(missing_ok=True)
        removed += 1
    for sub in directory.glob("??"):
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    (directory / MANIFEST).unlink(missing_ok=True)
    return removed


def describe() -> str:
    """What `byoc kernels show` prints: where the library is, its size, and each build."""
    directory = library_dir()
    manifest = read_manifest(directory)
    lines = [f"kernel library: {directory}",
             f"  {library_objects(directory)} objects, {library_bytes(directory) / 2**20:.1f} MiB"]
    for key, entry in sorted(manifest.get("builds", {}).items()):
        lines.append(f"  {key}: {entry.get('units')} units ({entry.get('compiled')} compiled, "
                     f"{entry.get('failed')} failed) in {entry.get('seconds')} s on {entry.get('date')} "
                     f"(nvcc {entry.get('nvcc')}, cutlass {entry.get('cutlass')})")
    if not manifest.get("builds"):
        lines.append("  never built here: `byoc kernels build` compiles it once for this machine")
    return "\n".join(lines)
