"""Compile units into objects through build.ninja and the object cache, and link.

A CompileUnit is one source file, its language (cxx, cuda, cubin, asm) and its flags
(which come from Targets only). A cubin unit is CUDA device code only: nvcc compiles it to
a cubin (no host pass), and the assembler embeds that in an object (embed_cubin.S) under
the symbol named after the object (x.o: x_cubin), for a host unit to load at run time
(cudaLibraryLoadData). `compile_units` writes <workdir>/build.ninja with one edge per
unit, takes objects from the cache where it can, runs ninja in parallel for the rest,
and stores what it built. `link_shared` adds the link edge and links. A failing
compiler or linker becomes a BuildError naming the file and its first error lines.

The tools and libraries (the C++ compiler, nvcc, the CUDA toolkit, NVIDIA's pip packages,
CUTLASS) are found by locate.py.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import BuildError, CompileError
from . import cache
from .locate import find_cxx, find_nvcc
from .ninja import NinjaEdge, add_link_edge, edge_seconds, ninja_path, run_ninja, write_build_ninja
from .unity import unity_groups, unity_name, unity_source_text

LANGUAGES = ("cubin", "cuda", "cxx", "asm")
# longest kind of compile first: build.ninja lists the edges in this order (compile_units)
_EDGE_ORDER = ("cubin_compile", "cuda_compile", "cxx_compile", "asm_compile", "embed_cubin")
_RULE_OF_LANGUAGE = {"cxx": "cxx_compile", "cuda": "cuda_compile", "cubin": "cubin_compile", "asm": "asm_compile"}
# the assembler file that embeds a cubin unit's cubin (symbol and file from the command line)
EMBED_CUBIN = Path(__file__).with_name("embed_cubin.S")


@dataclass
class CompileUnit:
    source: Path
    language: str  # cxx | cuda | cubin | asm
    flags: list
    output: str  # object file name, relative to <workdir>/obj
    dependencies: list = field(default_factory=list)  # files whose bytes also key the cache
    # units with the same non-empty key, language and flags may compile as one translation
    # unit when the cache has none of them (unity.py): for sources written to be concatenated
    # and, for cuda and cxx, to be linked from another's group object (weak definitions)
    unity: str = ""

    def __post_init__(self):
        if self.language not in LANGUAGES:
            raise BuildError(f"compile unit {self.source}: language {self.language!r} not in {LANGUAGES}")
        self.source = Path(self.source)


# ---- the tools: locate.py finds them; compile_units keys the object cache on their versions

@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> str:
    """`<compiler> --version`, asked once per process (it keys the object cache)."""
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return compiler


# ---- compiling ------------------------------------------------------------------------------

def compiler_launcher() -> list[str]:
    """$BYOC_COMPILER_LAUNCHER (e.g. `sccache` or `ccache`, with arguments) split into words,
    put in front of every compile command: a team shares compiled objects through
    sccache's remote storage, or spreads nvcc jobs with its distributed compilation, while
    byoc's own object cache stays in front. Empty when unset; a BuildError when the program
    it names is not on PATH."""
    import shlex
    import shutil
    text = os.environ.get("BYOC_COMPILER_LAUNCHER", "")
    try:
        words = shlex.split(text)
    except ValueError as error:  # an unclosed quote
        raise BuildError(f"BYOC_COMPILER_LAUNCHER {text!r} does not split into words ({error}); expected a "
                         f"command such as 'sccache' or 'ccache', shell-quoted") from None
    if words and shutil.which(words[0]) is None:
        raise BuildError(f"BYOC_COMPILER_LAUNCHER names {words[0]!r}, which is not an executable on PATH "
                         "(expected a compiler launcher such as sccache or ccache, or unset)")
    return words


def _launcher_note(launcher: list[str]) -> str:
    """What a compile error adds when $BYOC_COMPILER_LAUNCHER ran the commands: a launcher
    that fails (false), does nothing (true, echo) or mangles them (sh -c) reads like a
    compiler error, and the variable is set far from the build that fails."""
    if not launcher:
        return ""
    return (f" (every compile command ran through BYOC_COMPILER_LAUNCHER={shlex.quote(shlex.join(launcher))}; "
            f"expected a launcher such as sccache or ccache that runs the compiler command it is given: check it, "
            f"or unset it to compile without)")


def _command(unit: CompileUnit, source: str, output: str) -> list[str]:
    if unit.language == "cubin":
        return [str(find_nvcc()), *map(str, unit.flags), "-cubin", source, "-o", _cubin_path(output)]
    compiler = str(find_nvcc()) if unit.language == "cuda" else find_cxx()
    return [compiler, *map(str, unit.flags), "-c", source, "-o", output]


def _cubin_path(output: str) -> str:
    return str(Path(output).with_suffix(".cubin"))


def _embed_command(output: str, cubin: str | None = None) -> list[str]:
    """The second step of a cubin unit: its cubin (or a unity group's, `cubin`) into the
    object `output`, at the symbol named after the object (obj/x.o: x_cubin). The paths are
    relative to the work directory, where ninja runs, so the command does not depend on
    where the build is."""
    return [find_cxx(), "-c", "-x", "assembler-with-cpp", str(EMBED_CUBIN),
            f"-DBYOC_EMBED_SYMBOL={Path(output).stem}_cubin", f'-DBYOC_EMBED_FILE="{cubin or _cubin_path(output)}"',
            "-o", output]


def _cache_key(unit: CompileUnit, command: list, workdir: Path, memo: dict | None = None,
               relative_source: str | None = None) -> str:
    # The key must not depend on where this build happens. The source's path, absolute or as
    # the command names it relative to the work directory (a shape bucket's sources lie in
    # bucket<N>/), is keyed as the token "<source>", and paths inside the work directory as
    # "<workdir>".
    # The object's own name is relative already.
    source = str(unit.source.resolve())
    keyed_command = ["<source>" if argument == relative_source else
                     argument.replace(source, "<source>").replace(str(workdir), "<workdir>")
                     .replace(str(EMBED_CUBIN), "<embed_cubin.S>") for argument in command]
    version = compiler_version(command[0])
    if unit.language in ("cuda", "cubin"):
        version += compiler_version(find_cxx())  # nvcc's host side, the cubin's assembler
    search_dirs = cache.include_dirs(command)
    # Headers included with <...> from pip packages (CUTLASS, cuBLASLt) are not hashed:
    # the packages' versions stand for them.
    extra_key = cache.package_versions(search_dirs)
    # a cubin unit's second step assembles embed_cubin.S: its bytes key the object as a header's do
    embedding = (EMBED_CUBIN,) if unit.language == "cubin" else ()
    return cache.object_key(unit.source, keyed_command, version, [*unit.dependencies, *embedding],
                            extra_key=extra_key, search_dirs=search_dirs, memo=memo)


_ERROR_LINE = re.compile(r"\berror\b|undefined reference|cannot find|multiple definition|FAILED:|"
                         r"No such file|fatal", re.IGNORECASE)


def first_error_lines(output: str, commands=(), limit: int = 10) -> str:
    """The first `limit` lines of compiler/linker output that report errors (ninja
    echoes each failing command line, one of `commands`, which says nothing new, so those
    are left out)."""
    echoed = set(commands)
    lines = [line for line in output.splitlines() if line.strip() and line not in echoed]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    return "\n".join((errors or lines[-limit:])[:limit])


# ninja announces each failed edge as "FAILED: obj/a.o" (1.13 and later: "FAILED: [code=1] obj/a.o").
_FAILED_LINE = re.compile(r"^FAILED: (?:\[code=-?\d+\] )?(.*?) *$")


def failed_outputs(ninja_output: str, outputs: list) -> set:
    """The `outputs` whose ninja edges failed, as ninja's FAILED: lines name them."""
    wanted = set(outputs)
    failed = set()
    for line in ninja_output.splitlines():
        match = _FAILED_LINE.match(line)
        if match and match.group(1) in wanted:
            failed.add(match.group(1))
    return failed


def unit_cached(units: list, workdir) -> list[bool]:
    """Whether each of `units` (its source written) would come from the object cache or the
    kernel library, keyed as compile_units keys it: what tuning asks before choosing
    candidates it need not compile."""
    workdir = Path(workdir).resolve()
    files_read, found = {}, []
    for unit in units:
        output = ninja_path(workdir, workdir / "obj" / unit.output)
        source = ninja_path(workdir, unit.source)
        command = _command(unit, source, output) + (_embed_command(output) if unit.language == "cubin" else [])
        found.append(cache.has(_cache_key(unit, command, workdir, files_read, relative_source=source)))
    return found


def compile_units(units: list, workdir, jobs: int | None = None,
                  progress: Callable[[str], None] | None = None, stats: dict | None = None) -> list[Path]:
    """The objects to link for `units` (under <workdir>/obj, in the units' order), taken from
    the cache or compiled by ninja with `jobs` parallel commands (default: one per CPU).
    Units missing from the cache that opted in (CompileUnit.unity) compile in unity groups
    (unity.py): a group of cuda or cxx units is one object, listed once in place of its
    members' (as is one the cache hands to several of them). `progress` receives ninja's
    "[done/total] ..." lines. `stats`, when given, receives which units were compiled (their
    indices in `units`) and the seconds the compiler ran."""
    started = time.perf_counter()
    workdir = Path(workdir).resolve()
    objects_dir = workdir / "obj"
    objects_dir.mkdir(parents=True, exist_ok=True)
    keys, sources, to_build, missing = {}, {}, [], []
    edges_of = {}  # output -> the unit's own ninja edge
    output_of = {}  # id(unit) -> its output as build.ninja names it
    files_read = {}  # the sources and headers the cache keys read, once for all the units
    launcher = compiler_launcher()
    for unit in units:
        output = ninja_path(workdir, objects_dir / unit.output)
        if output in keys:
            raise BuildError(f"two compile units write {objects_dir / unit.output}")
        source = ninja_path(workdir, unit.source)
        command = _command(unit, source, output)
        then = _embed_command(output) if unit.language == "cubin" else []
        # the launcher (ccache, sccache) runs the same command: not part of the object's key.
        # Not for assembler units: their .incbin files are what differs between models, and a
        # launcher's cache does not key them (sccache), so it could hand one model another's.
        launched = [] if unit.language == "asm" else launcher
        edges_of[output] = NinjaEdge(_RULE_OF_LANGUAGE[unit.language], output, [source], launched + command, then)
        output_of[id(unit)] = output
        keys[output] = _cache_key(unit, command + then, workdir, files_read, relative_source=source)
        sources[output] = unit.source.resolve()
        if not cache.fetch(keys[output], workdir / output):
            # An object left by an earlier build may look up to date to ninja (it does not
            # see header changes): remove it, so what is built and cached is fresh.
            (workdir / output).unlink(missing_ok=True)
            missing.append(unit)
    # a unit another build of this process is compiling now is waited for, then fetched
    missing, claimed = _claim(missing, lambda unit: keys[output_of[id(unit)]],
                              lambda unit: cache.fetch(keys[output_of[id(unit)]], workdir / output_of[id(unit)]))
    try:
        groups = unity_groups(missing)
        grouped = {id(unit) for members in groups for unit in members}
        to_build = [output_of[id(unit)] for unit in missing if id(unit) not in grouped]
        # Members that the cache handed one group's object (the same bytes): that group again,
        # linked once, and in build.ninja as the group's edge, so that ninja rerun by hand
        # rebuilds an object with all of them.
        missed = {id(unit) for unit in missing}
        fetched_groups = _fetched_groups([unit for unit in units if id(unit) not in missed], workdir, output_of)
        group_edges, shared_object, built_by = [], {}, {}
        for members in groups + fetched_groups:
            name = unity_name(members)
            # the source beside the others the build generated (the suffix: the compiler's
            # language), the object with the others
            unity_source = workdir / "unity" / f"{name}{Path(members[0].source).suffix}"
            unity_source.parent.mkdir(parents=True, exist_ok=True)
            unity_source.write_text(unity_source_text(members, unity_source.parent))
            source = ninja_path(workdir, unity_source)
            output = ninja_path(workdir, objects_dir / "unity" / f"{name}.o")
            (objects_dir / "unity").mkdir(exist_ok=True)
            if output in keys or _cubin_path(output) in keys:
                raise BuildError(f"a compile unit writes {workdir / output}, where a unity group's object goes; "
                                 f"expected unit outputs outside {objects_dir / 'unity'}")
            command = _command(members[0], source, output)
            member_outputs = [output_of[id(unit)] for unit in members]
            what = f"{unity_source} (together: {', '.join(str(sources[o]) for o in member_outputs)})"
            if members[0].language == "cubin":
                # one cubin, then each member's object: that cubin under the member's symbol
                cubin = _cubin_path(output)
                (workdir / cubin).unlink(missing_ok=True)
                group_edges.append(NinjaEdge("cubin_compile", cubin, [source], launcher + command))
                sources[cubin] = what
                for member_output in member_outputs:
                    group_edges.append(NinjaEdge("embed_cubin", member_output, [cubin],
                                                 _embed_command(member_output, cubin)))
                    to_build.append(member_output)
                    built_by[member_output] = cubin
            else:
                group_edges.append(NinjaEdge(_RULE_OF_LANGUAGE[members[0].language], output, [source],
                                             launcher + command))
                sources[output] = what
                for member_output in member_outputs:
                    shared_object[member_output] = output
                if id(members[0]) in missed:
                    (workdir / output).unlink(missing_ok=True)
                    to_build.append(output)
                else:  # from the cache
                    shutil.copyfile(workdir / member_outputs[0], workdir / output)
        # ninja starts ready edges in the order build.ninja lists them (with no log of earlier
        # runs): the longest compiles first, so that the short ones fill the gaps at the end
        # instead of a long one starting last (nvcc's device code, then its other units; a unity
        # group before single units of its kind). A grouped unit's own edge is left out.
        own_edges = [edge for output, edge in edges_of.items() if output not in built_by and output not in shared_object]
        edges = sorted(group_edges + own_edges, key=lambda edge: _EDGE_ORDER.index(edge.rule))
        build_file = write_build_ninja(workdir, edges)
        if stats is not None:
            index_of = {output_of[id(unit)]: i for i, unit in enumerate(units)}
            built_members = {o for o in index_of if built_by.get(o) or shared_object.get(o) in to_build}
            compiled = {index_of[o] for o in to_build if o in index_of} | {index_of[o] for o in built_members}
            stats.update(units=len(units), compiled=sorted(compiled), compile_seconds=0.0)
        if to_build:
            returncode, output_text = run_ninja(workdir, to_build, jobs, progress)
            cubins = sorted(set(built_by.values()))
            failed = failed_outputs(output_text, to_build + cubins)
            headline = "compiling {} failed"
            if returncode != 0 and not failed:
                # ninja failed without naming an edge (interrupted, or its own error): no object
                # of this run can be trusted.
                failed = set(to_build) | set(cubins)
                headline = f"ninja failed (exit code {returncode}) while compiling {{}}"
            # a group's members fail with its cubin
            failed |= {member for member, cubin in built_by.items() if cubin in failed}
            # A failed compiler may leave half an object behind, and ninja does not always
            # delete it: remove it, so that neither the cache, the link nor a later ninja run
            # takes it for a built object.
            for output in failed:
                (workdir / output).unlink(missing_ok=True)
            built = [output for output in to_build if output not in failed and (workdir / output).is_file()]
            members_of = {}
            for member, output in shared_object.items():
                members_of.setdefault(output, []).append(member)
            for output in built:  # keep what did compile, even when another unit failed
                # a group's object under each member's key: a later build that needs one of them
                # takes it (and links it once however many of its members it needs)
                for key in [keys[member] for member in members_of.get(output, [])] or [keys[output]]:
                    cache.store(key, workdir / output)
            commands = [edge.command_line() for edge in edges]
            if failed:
                # each failure once: a group's by its cubin, not by every member
                reported = list(dict.fromkeys(built_by.get(o, o) for o in to_build if o in failed))
                rerun = f"ninja -C {shlex.quote(str(workdir))} {' '.join(map(shlex.quote, reported))}"
                what = ", ".join(str(sources[output]) for output in reported)
                raise CompileError(f"{headline.format(what)}{_launcher_note(launcher)} (commands in {build_file}; "
                                   f"rerun: {rerun}):\n{first_error_lines(output_text, commands)}")
            missing_objects = [output for output in to_build if output not in built]
            if missing_objects:
                raise CompileError(f"compiling {', '.join(str(sources[output]) for output in missing_objects)} "
                                   f"succeeded but wrote no object "
                                   f"({', '.join(str(workdir / output) for output in missing_objects)})"
                                   f"{_launcher_note(launcher)}; commands in {build_file}")
        if stats is not None:
            stats["compile_seconds"] = round(time.perf_counter() - started, 2)
            # each compiled unit's own time (the slowest bound a parallel build), a group's
            # under its unity source's name
            timed = edge_seconds(workdir, list(to_build) + sorted(set(built_by.values())))
            stats["unit_seconds"] = {Path(edge.inputs[0]).name: timed[edge.output] for edge in edges
                                     if edge.output in timed and edge.rule != "embed_cubin"}
        return list(dict.fromkeys(workdir / shared_object.get(output_of[id(unit)], output_of[id(unit)])
                                  for unit in units))
    finally:
        _release(claimed)


# The cache keys this process is compiling now, each with the event its waiters wait on:
# builds side by side in threads (a measured partition's candidates, eight at a time)
# that need one unit (a CUTLASS kernel, a shim source) compile it once; the others take
# its object from the cache when that compile ends.
_COMPILING: dict = {}
_COMPILING_LOCK = threading.Lock()


def _claim(missing: list, key_of, fetch) -> tuple:
    """(the units of `missing` this build compiles, their claimed keys): first each one that
    another thread of this process is compiling is waited for and fetched from the cache
    (compiled here only where that compile failed); then the rest are claimed, until
    _release. Waits happen holding no claim, so builds cannot wait on each other in a ring."""
    while True:
        with _COMPILING_LOCK:
            busy = [_COMPILING[key_of(unit)] for unit in missing if key_of(unit) in _COMPILING]
            if not busy:
                claimed = {key_of(unit) for unit in missing}
                for key in claimed:
                    _COMPILING[key] = threading.Event()
                return missing, claimed
        for event in busy:
            event.wait()
        missing = [unit for unit in missing if not fetch(unit)]


def _release(claimed: set) -> None:
    with _COMPILING_LOCK:
        for key in claimed:
            _COMPILING.pop(key).set()


def _fetched_groups(fetched: list, workdir: Path, output_of: dict) -> list:
    """The unity cuda and cxx units among `fetched` (taken from the cache) whose objects have
    the same bytes, two or more: members of one group, whose object the cache keeps under
    each member's key. In the order of their outputs, as unity_groups makes groups."""
    by_digest = {}
    for unit in sorted(fetched, key=lambda unit: unit.output):
        if unit.unity and unit.language in ("cuda", "cxx"):
            digest = hashlib.sha256((workdir / output_of[id(unit)]).read_bytes()).hexdigest()
            by_digest.setdefault(digest, []).append(unit)
    return [members for members in by_digest.values() if len(members) >= 2]


# compiler -> its fast-linker flags, probed once per process; () from the first time a link
# failed with them and succeeded without (link_shared)
_FAST_LINKER: dict = {}


def fast_linker_flags(cxx: str) -> tuple:
    """`-fuse-ld=lld` or `-fuse-ld=gold` where the compiler driver can use one of them, else
    nothing (the system's ld). A model's library carries its weights (hundreds of MB in
    one section): ld.bfd takes 0.7-0.9 s to link BERT-base's, gold about half of that, the
    bulk of a warm build's link step."""
    if cxx not in _FAST_LINKER:
        _FAST_LINKER[cxx] = _probe_fast_linker(cxx)
    return _FAST_LINKER[cxx]


def _probe_fast_linker(cxx: str) -> tuple:
    import tempfile
    for linker in ("lld", "gold"):
        if shutil.which(f"ld.{linker}") is None:
            continue
        with tempfile.TemporaryDirectory() as scratch:
            probe = Path(scratch) / "probe.so"
            try:  # as a library links: C++, so with the compiler's own libstdc++ and libgcc
                run = subprocess.run([cxx, f"-fuse-ld={linker}", "-shared", "-fPIC", "-x", "c++", os.devnull,
                                      "-o", str(probe)], capture_output=True, timeout=60)
            except (OSError, subprocess.SubprocessError):
                continue
            if run.returncode == 0 and probe.is_file():
                return (f"-fuse-ld={linker}",)
    return ()


def link_shared(objects: list, output, flags: list, libraries: list, workdir=None) -> Path:
    """Link `objects` into the shared library `output` (with lld or gold where there is one:
    fast_linker_flags). With `workdir`, the link command also becomes build.ninja's link
    edge (and runs from there)."""
    output = Path(output).resolve()
    base = Path(workdir).resolve() if workdir is not None else None
    name = (lambda path: ninja_path(base, path)) if base is not None else (lambda path: str(Path(path).resolve()))
    object_names = [name(path) for path in objects]
    cxx = find_cxx()
    command = [cxx, *fast_linker_flags(cxx), "-shared", "-o", name(output), *object_names, *map(str, flags),
               *map(str, libraries)]
    if base is not None:
        add_link_edge(base, NinjaEdge("link_shared", name(output), object_names, command))
    run = subprocess.run(command, capture_output=True, text=True, errors="replace", cwd=base)
    fast = fast_linker_flags(cxx)
    if run.returncode != 0 and fast:
        # A toolchain the fast linker does not fully understand (a compiler installed with
        # linker scripts it cannot read): link with the system's linker, as this command
        # would have without the flag; a genuine error fails that link too.
        command = [argument for argument in command if argument not in fast]
        if base is not None:
            add_link_edge(base, NinjaEdge("link_shared", name(output), object_names, command))
        retry = subprocess.run(command, capture_output=True, text=True, errors="replace", cwd=base)
        if retry.returncode == 0:
            _FAST_LINKER[cxx] = ()
        run = retry
    if run.returncode != 0:
        where = f" (command in {base / 'build.ninja'})" if base is not None else ""
        raise CompileError(f"linking {output} failed{where}:\n{first_error_lines(run.stdout + run.stderr, limit=20)}")
    return output
