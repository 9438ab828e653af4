"""Packaging: the final modules of a library's programs (one, or one per shape bucket)
into one sealed model.so. The host code (codegen/host.py: the model's tables and program
table per program) and the static model runtime, the metadata and program tables embedded
with .incbin, every backend's compile units: all through build.ninja and the object cache
(toolchain/), then one link that exports only the C ABI; embedded weights are appended
after the link, before the seal (runtime/library_file.py: seal_library)."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import operator
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import BuildError
from .library import Library, file_state


@dataclass
class Program:
    """One program of the library: the context it was lowered in, the named dims of its
    shape bucket and its final module (the pipeline's output: artifacts, partition report
    and host setup are its attributes)."""
    context: object  # pipeline.BuildContext
    dims: dict
    mod: object  # IRModule
    # per caller tensor (inputs, then outputs), per axis: the paddable dim it carries or None
    axis_dims: list | None = None

    @property
    def artifacts(self) -> list:
        return self.mod.attrs["artifacts"]

    @property
    def host(self):
        return self.mod.attrs["host_setup"]


def program_symbol(number: int) -> str:
    """The symbol of program `number`'s table (a static library's one: byoc_program_table)."""
    return f"byoc_program_table{f'_{number}' if number else ''}"


def program_table(host, artifacts) -> bytes:
    """The calls, regions and caller copies as the runtime's binary program table."""
    from .codegen.program_table import program_table as encode
    return encode(host.plan, [s for a in artifacts for s in a.stateful_symbols])


@dataclass
class LibraryParts:
    """What one library is made of before anything is compiled: every backend's compile
    units (and the backend of each), the libraries they link, the program tables, the
    weights blob, the dims run() pads, and the program id: a hash of all of it but the
    weights' bytes (`program_identity`). Two builds of one model whose weights differ in
    value only have the same program id: a weights file of either fits the other's library
    (`byoc refit`)."""
    units: list
    unit_backends: list
    link_libraries: list
    tables: list
    weights: bytes
    padded_dims: list
    program_id: str


def library_parts(programs: list, context, padding: dict | None = None) -> LibraryParts:
    """The parts of the library of `programs` (see LibraryParts); writes only the sources
    the backends already wrote."""
    first = programs[0]
    # the programs' shared blob where there is one (shape buckets, archs: one program for one
    # arch other than the target's too), else the one program's own
    weights = first.context.weights if first.context.weights is not None else first.host.plan.weights
    units, unit_backends = program_units(programs)
    link_libraries = []
    for program in programs:
        for artifact in program.artifacts:
            link_libraries += [library for library in artifact.link_libraries if library not in link_libraries]
    tables = [program_table(program.host, program.artifacts) for program in programs]
    padded_dims = sorted(name for name, problem in (padding or {}).items() if problem is None)
    parts = LibraryParts(units, unit_backends, link_libraries, tables, weights, padded_dims, "")
    parts.program_id = program_identity(programs, context, parts)
    return parts


# byoc's own code: what transforms the weights (Python) and what reads them (the runtime,
# the shim's and backends' headers, the templates)
CODE_SUFFIXES = (".py", ".h", ".hpp", ".cc", ".cu", ".cuh", ".j2", ".S")


@functools.lru_cache(maxsize=None)
def byoc_code_digest() -> str:
    """sha256 of byoc's code (CODE_SUFFIXES under the package, its backends and templates;
    in a checkout those lie beside it), once a process."""
    import byoc
    folders = []
    for root in map(Path, byoc.__path__):
        for folder in (root if (root / "__init__.py").is_file() else None, root / "backends", root / "templates"):
            if folder is not None and folder.is_dir() and folder.resolve() not in folders:
                folders.append(folder.resolve())
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.suffix in CODE_SUFFIXES and "__pycache__" not in path.parts and path.is_file():
                digest.update(f"{path.relative_to(folder)}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def program_identity(programs: list, context, parts: LibraryParts) -> str:
    """The program id: a hash of byoc's code (byoc_code_digest: the passes that transform
    the weights and the headers of the kernels that read them), the target, where the
    weights live, every compile unit (its source, what it depends on, language, flags but
    paths, and object name), the libraries linked, the program tables, the host code
    rendered without the build's identity, and the weights' size and how they were placed,
    but not their bytes. A weight the build compiled into code (a scalar constant, a
    constant a pass simplified by its values) is in a unit's source, so weights that change
    it change the program id."""
    content = hashlib.sha256()
    content.update(f"{byoc_code_digest()}\0{context.target}\0{context.config.params}\0{len(parts.weights)}\0"
                   f"{' '.join(parts.link_libraries)}\0".encode())
    for unit in parts.units:
        # flags without paths (include directories differ between machines; byoc's own
        # headers are in its code digest)
        flags = " ".join(str(flag) for flag in unit.flags if "/" not in str(flag))
        content.update(f"{unit.language}\0{unit.output}\0{flags}\0".encode())
        content.update(Path(unit.source).read_bytes())
        for dependency in unit.dependencies:
            if Path(dependency).is_file():
                content.update(Path(dependency).read_bytes())
    for table in parts.tables:
        content.update(table)
    content.update(render_host_source(programs, context, "", parts.tables, len(parts.weights), 0,
                                      parts.padded_dims, "").encode())
    return content.hexdigest()[:16]


def link(programs: list, context, padding: dict | None = None) -> Library:
    """Write the host tables and the embedded files of `programs`, compile every unit and
    link the library. `padding` (shape buckets): dim -> None where run() pads sizes between
    buckets, else why not."""
    from .codegen.host import blob_checksum
    from .metadata import library_metadata, with_variants
    first = programs[0]
    parts = library_parts(programs, context, padding)
    weights, units = parts.weights, list(parts.units)
    # The runtime's checksum of the weights (one pass over them, 1 GB for a LLaMA-style
    # decoder) is what the build id takes of them: another hash would be another pass.
    weights_checksum = blob_checksum(weights)
    build_id = hashlib.sha256(f"{parts.program_id}\0{len(weights)}\0{weights_checksum}".encode()).hexdigest()[:16]
    metadata = library_metadata(first.mod, first.context, build_id, weights_bytes=len(weights),
                                program_id=parts.program_id)
    if len(programs) > 1:
        metadata = with_variants(metadata, programs, context.config.dims, padding or {})
    units += host_units(programs, context, build_id, parts.tables, weights, weights_checksum, parts.padded_dims,
                        parts.program_id)
    embedded, sidecar = embedded_units(context, weights, metadata, build_id, parts.tables,
                                       program_id=parts.program_id, weights_checksum=weights_checksum)
    units += embedded
    output, compiled = compile_and_link(context, units, parts.link_libraries, build_id,
                                        appended_weights=weights if sidecar is None else None)
    plan = first.host.plan
    library = Library(path=output, workdir=context.workdir, metadata=json.loads(metadata),
                      report=first.mod.attrs.get("partition_report"), sidecar=sidecar,
                      memory=plan.memory_plan.summary() if plan.memory_plan else {},
                      build_stats=compile_stats(compiled, parts.unit_backends),
                      file_states={str(path): file_state(path) for path in (output, sidecar) if path})
    context.write("metadata.json", json.dumps(library.metadata, indent=2, sort_keys=True))
    from .report_page import render_page
    context.write("report.html", render_page(library.metadata, title=context.model_name))
    return library


def program_units(programs: list) -> tuple:
    """Every program's compile units, each object once: a unit of a later program that
    writes the same object from the same text, flags and dependencies as one before (a
    CUTLASS kernel unit: named by a hash of its types) is that one; a source the bucket
    generated (in its own bucket<N>/, its symbols ending _b<N>) that would write an
    object of the same name is renamed b<N>_<name>. Any other such pair (a library source
    compiled two ways) would define its symbols twice: a BuildError. Returns (units, the
    backend of each)."""
    units, unit_backends, written, by_source = [], [], {}, {}
    for number, program in enumerate(programs):
        for artifact in program.artifacts:
            for unit in artifact.compile_units:
                # a source of byoc's that programs of several archs compile (the shim, an engine),
                # each into an object named for its arch: one object with the code of both
                earlier = by_source.get((unit.language, str(unit.source)))
                merged = fat_unit(earlier, unit) if earlier is not None and earlier.output != unit.output else None
                if merged is not None:
                    units[units.index(earlier)] = written[earlier.output] = by_source[(unit.language,
                                                                                       str(unit.source))] = merged
                    continue
                same = written.get(unit.output)
                if same is not None:
                    if (same.language, list(same.flags), list(map(str, same.dependencies))) == \
                            (unit.language, list(unit.flags), list(map(str, unit.dependencies))) and \
                            Path(same.source).read_bytes() == Path(unit.source).read_bytes():
                        continue
                    merged = fat_unit(same, unit)
                    if merged is not None:  # a source of byoc's compiled for two archs: one object for both
                        units[units.index(same)] = written[unit.output] = \
                            by_source[(unit.language, str(unit.source))] = merged
                        continue
                    generated = Path(unit.source).resolve().is_relative_to(program.context.workdir.resolve())
                    if not generated or unit.language == "cubin":  # a cubin's name is its symbol's
                        raise BuildError(
                            f"shape buckets {programs[0].dims} and {program.dims} need {unit.output} "
                            f"({unit.source}) compiled two ways (flags or text differ); one library cannot "
                            f"hold both: build these buckets as separate libraries")
                    unit = dataclasses.replace(unit, output=f"b{number}_{unit.output}")
                written[unit.output] = unit
                by_source.setdefault((unit.language, str(unit.source)), unit)
                units.append(unit)
                unit_backends.append(artifact.backend)
    return units, unit_backends


# The built-in shim's dtype selection (backends/builtin: BYOC_SHIM_DTYPES, a bit per dtype;
# absent: every dtype)
_SHIM_DTYPES_FLAG = "-DBYOC_SHIM_DTYPES="


def fat_unit(first, second):
    """One cuda unit of byoc's (not a program's generated source) that two programs of a
    library for several archs compile for their archs, as one object with the code of both
    (each -gencode of either), or None where they differ otherwise. Without BYOC_PDL: the
    object's host code launches for every arch, and only sm_90 and later take PDL. Shim
    families compiled for different dtypes (one program's family from the kernel library,
    the other's its own) are one object for the dtypes of both."""
    def split(unit):
        gencodes = [f for f in unit.flags if str(f).startswith("-gencode=")]
        dtypes = [f for f in unit.flags if str(f).startswith(_SHIM_DTYPES_FLAG)]
        rest = [f for f in unit.flags if not str(f).startswith(("-gencode=", _SHIM_DTYPES_FLAG)) and f != "-DBYOC_PDL"]
        return gencodes, dtypes, rest
    if first.language != "cuda" or second.language != "cuda" or first.source != second.source or \
            list(map(str, first.dependencies)) != list(map(str, second.dependencies)):
        return None
    (first_codes, first_dtypes, first_rest), (second_codes, second_dtypes, second_rest) = split(first), split(second)
    if first_rest != second_rest or not first_codes or not second_codes:
        return None
    dtypes = []
    if first_dtypes and second_dtypes:  # both for some dtypes: for those of either
        masks = [int(str(flag)[len(_SHIM_DTYPES_FLAG):], 0) for flag in first_dtypes + second_dtypes]
        dtypes = [f"{_SHIM_DTYPES_FLAG}{functools.reduce(operator.or_, masks):#x}"]
    return dataclasses.replace(first, flags=list(dict.fromkeys(first_codes + second_codes)) + first_rest + dtypes)


def render_host_source(programs: list, context, build_id: str, tables: list, weights_bytes: int,
                       weights_checksum: int, padded_dims: list, program_id: str) -> str:
    """host.cc's text: the model's tables, a variant per program (`tables`: their program
    tables)."""
    from .codegen.host import HostVariant, render_host
    archs = {program.context.target.attrs.get("arch") for program in programs} if context.cuda else set()
    several = len(archs) > 1  # a library for several archs: each variant's description says its own
    variants = [HostVariant(program.host.plan, table, program_symbol=program_symbol(number),
                            stateful=[s for a in program.artifacts for s in a.stateful_symbols],
                            cuda_graph=program.host.cuda_graph, graph_io=program.host.graph_io,
                            devices=program.host.devices,
                            description=", ".join([f"{name}={size}" for name, size in program.dims.items()] +
                                                  ([program.context.target.attrs["arch"]] if several else [])),
                            axis_dims=program.axis_dims, dims=program.dims,
                            arch_number=program.context.target.arch_number() if context.cuda else 0,
                            arch_ptx=context.cuda and bool(program.context.target.attrs.get("ptx")))
                for number, (program, table) in enumerate(zip(programs, tables, strict=True))]
    arch_number = max(program.context.target.arch_number() for program in programs) if context.cuda else None
    return render_host(variants, cuda=context.cuda, build_id=build_id, padded_dims=padded_dims,
                       arch_number=arch_number,
                       weights_embedded=context.config.params != "sidecar", weights_bytes=weights_bytes,
                       weights_checksum=weights_checksum, program_id=program_id)


def host_units(programs: list, context, build_id: str, tables: list, weights: bytes, weights_checksum: int,
               padded_dims: list, program_id: str = "") -> list:
    """host.cc (the model's tables: a variant per program, `tables` their program tables)
    and the static model runtime they drive, which is compiled once per flavor (and
    flags) into the object cache."""
    from .runtime import C_ABI_HEADER, model_runtime_sources
    from .toolchain import CompileUnit
    target = context.target
    host_source = render_host_source(programs, context, build_id, tables, len(weights), weights_checksum,
                                     padded_dims, program_id)
    host_path = context.workdir / "host.cc"
    host_path.write_text(host_source)
    host_flags = target.cxx_flags() + [f"-I{C_ABI_HEADER.parent}"]
    if context.cuda:
        from .toolchain.locate import cuda_include_dirs
        host_flags += [f"-I{d}" for d in cuda_include_dirs()]
    runtime_flags = host_flags + [f"-DBYOC_RUNTIME_CUDA={int(context.cuda)}"]
    return [CompileUnit(source=host_path, language="cxx", flags=host_flags, output="host.o")] + \
        [CompileUnit(source=source, language="cxx", flags=runtime_flags, output=f"{source.stem}.o")
         for source in model_runtime_sources(context.cuda)]


def embedded_units(context, weights: bytes, metadata: str, build_id: str, tables: list,
                   *, program_id: str = "", weights_checksum: int = 0) -> tuple:
    """The metadata JSON and the program tables, each embedded by an assembler file with
    .incbin: a C array of them would compile for seconds (BERT-base's partition report and
    execution graph). The weights are not linked in: embedded ones are appended after the
    link (compile_and_link; runtime/library_file.py says why), a sidecar is written here as
    .safetensors. Returns (the compile units, the sidecar's path or None)."""
    from .codegen.host import render_blob_assembly, write_safetensors
    from .toolchain import CompileUnit
    workdir = context.workdir
    files = [(workdir / "metadata.bin", "byoc_metadata_json", "The metadata JSON", metadata.encode("utf-8"))]
    files += [(workdir / f"program{number or ''}.bin", program_symbol(number),
               "A program table (byoc/runtime/model_program.cc)", table) for number, table in enumerate(tables)]
    sidecar = None
    if context.config.params == "sidecar":
        sidecar = workdir / "model.safetensors"
        sidecar.unlink(missing_ok=True)  # a new file, as compile_and_link's model.so
        write_safetensors(sidecar, weights, build_id, program_id, weights_checksum)
    units = []
    for path, symbol, what, data in files:
        path.write_bytes(data)
        assembly = path.with_suffix(".S")
        # .incbin finds the file through the assembler's include path, the build directory
        # the commands run in, named relatively: the source and its flags (the cache key)
        # do not depend on where the build happens, and a directory whose name has a comma
        # is not split by -Wa's commas.
        assembly.write_text(render_blob_assembly(path.name, symbol, what))
        units.append(CompileUnit(source=assembly, language="asm", flags=["-Wa,-I,."],
                                 output=f"{path.stem}.o", dependencies=[path]))
    return units, sidecar


def compile_and_link(context, units: list, link_libraries: list, build_id: str = "",
                     appended_weights=None) -> tuple:
    """Every unit through ninja and the object cache, then the sealed model.so, which
    exports only the C ABI, with `appended_weights` (embedded weights) after its ELF image.
    Returns (its path, the compile statistics). The library's ELF build-id is `build_id`
    (hex), not a hash the linker computes over the whole file."""
    from .runtime import seal_library
    from .toolchain import compile_units, link_shared
    compiled = {}
    workdir = context.workdir
    context.progress.stage(f"compiling {len(units)} units (ninja, {workdir / 'build.ninja'})")
    objects = compile_units(units, workdir, jobs=context.config.compile_jobs, stats=compiled,
                            progress=context.progress.compile_line)
    version_script = workdir / "exports.map"
    version_script.write_text("{\n  global: byoc_model_*; byoc_last_error;\n  local: *;\n};\n")
    # named from the build directory the link runs in: -Wl splits its argument at commas
    link_flags = [f"-Wl,--version-script={version_script.name}", "-Wl,--no-undefined"]
    if build_id:
        link_flags.append(f"-Wl,--build-id=0x{build_id}")
    libraries = list(link_libraries)
    if context.cuda:
        from .toolchain.locate import cuda_link_flags
        libraries = cuda_link_flags(libraries)
    output = workdir / "model.so"
    # a new file, never the last build's rewritten: an export may share that one's inode
    # (library.py _replace_with_link)
    output.unlink(missing_ok=True)
    link_shared(objects, output, link_flags, libraries, workdir=workdir)
    # load() checks the file against the seal (every byte but the weights, which create()
    # checks) before the dynamic loader maps it
    seal_library(output, weights=appended_weights)
    return output, compiled


def compile_stats(compiled: dict, unit_backends: list) -> dict:
    """Compile units per backend (a backend's units are its unique functions: equal
    partitions share one) and how many of them the compiler ran for (the rest came
    from the object cache); host code and weights count as "host"."""
    per_backend = {}
    compiled_units = set(compiled.get("compiled", ()))
    for index in range(compiled.get("units", 0)):
        backend = unit_backends[index] if index < len(unit_backends) else "host"
        entry = per_backend.setdefault(backend, {"units": 0, "compiled": 0})
        entry["units"] += 1
        entry["compiled"] += index in compiled_units
    total_compiled = len(compiled.get("compiled", ()))
    slowest = sorted(compiled.get("unit_seconds", {}).items(), key=lambda item: -item[1])[:5]
    return {"compile_units": compiled.get("units", 0), "compiled": total_compiled,
            "cached": compiled.get("units", 0) - total_compiled,
            "compile_seconds": compiled.get("compile_seconds", 0.0), "backends": per_backend,
            "slowest_units": [{"source": name, "seconds": seconds} for name, seconds in slowest]}
