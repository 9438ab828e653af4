"""The kernel library: kernels compiled once per machine, so that a build of a model no
tuning database knows times candidate kernels instead of compiling them.

Tuning a problem the databases lack used to compile every candidate kernel it timed (a cold
build of ResNet-50 spent 177 of its 192 s there). A CUTLASS 3.x kernel does not depend on
problem sizes: compiled once with its epilogue proxy (bias or none), it can be timed on
every problem of its dtype and layout, in every later build. `byoc kernels build` compiles
what each backend of a config hands it (Backend.kernel_library: the cutlass backend's every
candidate, fp16 by default; the built-in backend's CUDA shim, which does not depend on the
model either, for several dtype sets) into <cache root>/kernels ($BYOC_KERNEL_LIBRARY), keyed as the
object cache keys objects, and the object cache looks there after itself
(toolchain/cache.py). Tuning then times every candidate the library holds and compiles only
the winners, with their own epilogues, as part of the build.

The library is a cache: deleting it costs time, never correctness (a missing object is
compiled as before). Its manifest.json says what filled it, where and when. Its objects'
keys take in nvcc's and the host compiler's versions, the paths and versions of the CUDA
toolkit, CUTLASS and byoc's headers, not the machine itself: `byoc kernels export` packs it
into one archive and `byoc kernels import` unpacks one on another machine of the same image
(the same toolkit and packages at the same paths), so that a fleet pays the one-time compile
once; `byoc kernels show` says how many of the units a build here looks up it holds. An
archive holds machine code that builds link: import only archives you trust.
"""
from __future__ import annotations

import datetime
import shutil
import tempfile
import time
from pathlib import Path

import os
import re
import tarfile

from .errors import BuildError, CompileError, ConfigError
from .toolchain import cache

MANIFEST = "manifest.json"
# What an archive may hold: objects where the cache keeps them (<2 hex>/<sha256>.o), and
# the manifest; bounds that no library comes near (one object is a few MB, 144 a few tens)
_OBJECT_NAME = re.compile(r"^([0-9a-f]{2})/\1[0-9a-f]{62}\.o$")
MAX_OBJECT_BYTES = 256 << 20
MAX_ARCHIVE_BYTES = 16 << 30
MAX_ARCHIVE_MEMBERS = 200_000


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
    if jobs is not None and jobs < 1:
        raise ConfigError(f"jobs={jobs}: expected at least 1 parallel compile (or none: one per CPU)")
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
            if not all(built):
                # a unity group that failed took its good members with it: those alone, once more
                import dataclasses
                again = [dataclasses.replace(unit, unity="") for unit, done in zip(units, built) if not done]
                try:
                    compile_units(again, workdir, jobs=jobs, progress=progress)
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


def coverage(config="cuda_sm90", dtypes=("float16",), epilogues: str = "proxy") -> tuple[int, int]:
    """(how many of the units `config`'s kernel library has on this machine are there, how
    many it has): what an imported archive is worth here (the objects' keys take in the
    toolkit's and packages' versions and paths, so an archive from a machine set up
    otherwise serves none)."""
    from .toolchain.compiler import unit_cached
    with tempfile.TemporaryDirectory(prefix="byoc-kernels-") as workdir:
        units, _ = library_units(config, Path(workdir), dtypes, epilogues)
        with cache.storing_into(library_dir()):
            return sum(unit_cached(units, workdir)), len(units)


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
    try:
        held, total = coverage()
        lines.append(f"  holds {held} of the {total} units a cuda_sm90 build on this machine looks up")
    except Exception as error:  # noqa: BLE001 - no CUTLASS or nvcc here: nothing to look up
        lines.append(f"  (what a cuda_sm90 build here would find: unknown, {type(error).__name__}: {error})")
    return "\n".join(lines)


def export_library(output) -> dict:
    """Pack the library's objects and manifest into the gzip'd tar `output`; what it holds."""
    directory = library_dir()
    objects = [path for path in sorted(directory.glob("??/*.o"))
               if _OBJECT_NAME.fullmatch(f"{path.parent.name}/{path.name}")]
    if not objects:
        raise BuildError(f"the kernel library {directory} has no objects to export (`byoc kernels build` fills it)")
    output = Path(output).resolve()
    if output.is_dir():
        raise BuildError(f"{output} is a directory; expected the path of the archive to write (e.g. kernels.tar.gz)")
    temporary = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(temporary, "w:gz") as archive:
            for path in objects:
                archive.add(path, arcname=f"{path.parent.name}/{path.name}", recursive=False)
            if (directory / MANIFEST).is_file():
                archive.add(directory / MANIFEST, arcname=MANIFEST, recursive=False)
        os.replace(temporary, output)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise BuildError(f"cannot write {output} ({error.strerror or error}); expected a writable path") from None
    return {"objects": len(objects), "bytes": output.stat().st_size, "archive": str(output)}


def import_library(source) -> dict:
    """Unpack an archive `export_library` wrote into the library (objects it has already are
    kept); every member is checked before anything is written: an archive with anything but
    library objects and a manifest is refused whole, naming the member."""
    import gzip
    import zlib
    source = Path(source)
    try:  # the whole stream first: gzip's checksum is checked at its end, which tarfile never reads
        with gzip.open(source, "rb") as stream:
            while stream.read(1 << 22):
                pass
        archive = tarfile.open(source, "r:gz")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise BuildError(f"{source} is not a kernel library archive, or is damaged (`byoc kernels export` writes "
                         f"one): {getattr(error, 'strerror', None) or error}") from None
    directory = library_dir()
    added = kept = 0
    with archive:
        try:
            members = archive.getmembers()
        except (tarfile.TarError, OSError, EOFError) as error:
            raise BuildError(f"{source} is not a readable kernel library archive: {error}") from None
        if len(members) > MAX_ARCHIVE_MEMBERS:
            raise BuildError(f"{source}: {len(members)} members, more than a kernel library holds "
                             f"({MAX_ARCHIVE_MEMBERS}); nothing was imported")
        total, manifests = 0, 0
        for member in members:
            if member.name == MANIFEST and member.isfile() and member.size <= 16 << 20 and manifests == 0:
                manifests += 1
                continue
            if not (member.isfile() and _OBJECT_NAME.fullmatch(member.name) and 0 < member.size <= MAX_OBJECT_BYTES):
                raise BuildError(f"{source}: member {member.name!r} is not a kernel library object (expected "
                                 f"files named <2 hex digits>/<sha256>.o of at most {MAX_OBJECT_BYTES >> 20} MB, and "
                                 f"{MANIFEST}); nothing was imported")
            total += member.size
        if total > MAX_ARCHIVE_BYTES:
            raise BuildError(f"{source}: {total >> 20} MB of objects, more than a kernel library holds "
                             f"({MAX_ARCHIVE_BYTES >> 30} GB); nothing was imported")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            imported_manifest = None
            for member in members:
                data = archive.extractfile(member)
                if data is None:
                    continue
                with data:
                    if member.name == MANIFEST:
                        imported_manifest = data.read()
                        continue
                    target = directory / member.name
                    if target.is_file():
                        kept += 1
                        continue
                    head = data.read(4)
                    if head != b"\x7fELF":  # not an object file: refused before anything of it is written
                        raise BuildError(f"{source}: member {member.name!r} is not an ELF object; the objects before "
                                         f"it were imported ({added})")
                    target.parent.mkdir(exist_ok=True)
                    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
                    try:
                        with open(temporary, "wb") as out:
                            out.write(head)
                            shutil.copyfileobj(data, out)
                        os.replace(temporary, target)  # a build reading the library never sees half an object
                    finally:
                        temporary.unlink(missing_ok=True)
                    added += 1
        except (tarfile.TarError, EOFError) as error:
            raise BuildError(f"{source}: the archive is damaged ({error}); the objects before the damage were "
                             f"imported ({added})") from None
        except OSError as error:
            where = Path(error.filename) if getattr(error, "filename", None) else None
            if where is not None and directory not in where.parents and where != directory:
                raise BuildError(f"cannot read {source} ({error.strerror or error}); the objects before were "
                                 f"imported ({added})") from None
            raise BuildError(f"cannot import into the kernel library {directory} ({error.strerror or error}); "
                             f"expected a writable directory (set BYOC_KERNEL_LIBRARY to choose another)") from None
    if imported_manifest is not None:
        _merge_manifest(directory, imported_manifest, source)
    return {"added": added, "already_there": kept, "where": str(directory)}


def _merge_manifest(directory: Path, text: bytes, source: Path):
    """The imported manifest's builds beside this library's, each marked with the archive it
    came from (a manifest that is not one is ignored: the objects are what matters)."""
    import json
    from .json_files import write_json_whole
    try:
        imported = json.loads(text)
    except (ValueError, RecursionError):
        return
    builds = imported.get("builds") if isinstance(imported, dict) else None
    if not isinstance(builds, dict):
        return
    manifest = read_manifest(directory)
    for key, entry in builds.items():
        if isinstance(key, str) and isinstance(entry, dict):
            manifest["builds"].setdefault(key, {**entry, "imported_from": source.name})
    try:
        write_json_whole(directory / MANIFEST, manifest)
    except OSError:
        pass  # the manifest describes the objects; they are in place
