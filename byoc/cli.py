"""The `byoc` command line: one table of subcommands, one place that turns errors into
messages.

    byoc import MODEL.onnx [--input-shape NAME=1,8 ...] [-o OUT.ir]
    byoc ops
    byoc run MODEL.onnx --inputs INPUTS.npz [--input-shape ...] [--save OUT.npz]
    byoc report model.so|WORKDIR [-o report.html]
    byoc tuning show|merge|export [DB.json ...] [-o OUT.json]

A user error (any byoc.ByocError, a missing or unreadable file, a bad YAML file) prints
`byoc: error: <message>` on stderr and exits 2, with no traceback. Anything else is a bug
in byoc: it prints a one-line message and exits 1; `--debug` adds the traceback.

A new subcommand is one more row in SUBCOMMANDS: a name, a help line, a function that
adds its arguments and a function that runs it and returns the exit code.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import ByocError, ModelError

EXIT_OK = 0
EXIT_INTERNAL_ERROR = 1
EXIT_USER_ERROR = 2  # the same code argparse uses for a bad command line


class UsageError(ByocError):
    """The command line or a file it names is not what the command expects."""


# ---- shared argument helpers ---------------------------------------------------------

def _add_input_shape_option(parser: argparse.ArgumentParser):
    parser.add_argument(
        "--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
        help="static shape of a model input, e.g. input_ids=1,128 (repeat per input; "
             "'NAME=' is a scalar). Needed for inputs with dynamic dims.")
    parser.add_argument(
        "--dim", action="append", default=[], metavar="NAME=SIZE",
        help="size of a named dim in every input that declares it, e.g. batch=1 (repeat per "
             "dim; `byoc inspect MODEL.onnx` lists them); --input-shape wins for its input")


def parse_dims(specs: list[str]) -> dict[str, int]:
    """['batch=1', 'sequence=128'] -> {'batch': 1, 'sequence': 128}."""
    dims: dict[str, int] = {}
    for spec in specs:
        name, equals, size = spec.rpartition("=")
        if not equals or not name or not size.strip().isdigit():
            raise UsageError(f"--dim {spec!r}: expected NAME=SIZE with a non-negative integer size (for example batch=1)")
        if name in dims:
            raise UsageError(f"--dim gives {name!r} twice")
        dims[name] = int(size)
    return dims


def parse_input_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """['x=1,8', 'mask=1,8'] -> {'x': (1, 8), 'mask': (1, 8)}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        # the name may itself contain '=' (ONNX names are free text): split at the last one
        name, equals, dims = spec.rpartition("=")
        if not equals or not name:
            raise UsageError(f"--input-shape {spec!r}: expected NAME=D1,D2,... (for example x=1,8)")
        dims = dims.strip()
        if dims and not re.fullmatch(r"\d+(\s*,\s*\d+)*", dims):
            raise UsageError(f"--input-shape {spec!r}: the dims must be non-negative integers "
                             f"separated by commas (for example {name}=1,8)")
        if name in shapes:
            raise UsageError(f"--input-shape gives {name!r} twice")
        shapes[name] = tuple(int(d) for d in dims.split(",")) if dims else ()
    return shapes


def _check_arrays_fit(inputs_path: str, declared: dict, arrays: dict):
    """A UsageError naming the --inputs file when one of its arrays does not fit the shape
    the model declares for that input (the arrays, not an --input-shape, are wrong)."""
    import numpy as np

    from .frontend.onnx import _fits
    for name, array in arrays.items():
        dims = declared.get(name)
        shape = tuple(np.shape(array))
        if dims is not None and not _fits(dims, shape):
            raise UsageError(f"--inputs {inputs_path!r}: array {name!r} has shape {shape}; the model declares "
                             f"{tuple(dims)} for that input (a named dim fits any size)")


def _model_interface(model_path: str) -> dict | None:
    """The ONNX file's interface (frontend.onnx.describe_model), or None when it cannot be
    read; from_onnx then reports why, in its own words."""
    from .frontend.onnx import describe_model
    try:
        return describe_model(model_path)
    except ByocError:
        return None


# ---- byoc import -----------------------------------------------------------------------

def _import_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("model", help="the ONNX model file")
    _add_input_shape_option(parser)
    parser.add_argument("-o", "--output", metavar="OUT.ir",
                        help="write the IR text here instead of printing it")


def _import_command(args: argparse.Namespace) -> int:
    from .frontend import from_onnx

    mod = from_onnx(args.model, input_shapes=parse_input_shapes(args.input_shape), dims=parse_dims(args.dim))
    text = mod.script()
    if args.output:
        Path(args.output).write_text(text if text.endswith("\n") else text + "\n")
        print(f"wrote {args.output}")
    else:
        print(text)
    return EXIT_OK


# ---- byoc ops --------------------------------------------------------------------------

def _ops_arguments(parser: argparse.ArgumentParser):
    pass  # no options yet


def _ops_command(args: argparse.Namespace) -> int:
    from .frontend import SUPPORTED_OPS
    from .ir import get_op, list_ops

    names = list_ops()
    width = max(map(len, names))
    print(f"IR ops ({len(names)}), with category:")
    for name in names:
        op = get_op(name)
        summary = op.doc.strip().splitlines()[0] if op.doc.strip() else ""
        print(f"  {name:<{width}}  {op.category:<9}  {summary}".rstrip())
    onnx_types = sorted(SUPPORTED_OPS)
    print(f"\nONNX op types that import ({len(onnx_types)}, default domain):")
    print(textwrap.fill(", ".join(onnx_types), width=88, initial_indent="  ", subsequent_indent="  "))
    return EXIT_OK


# ---- byoc run ---------------------------------------------------------------------------

def _run_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("model", help="the ONNX model file")
    parser.add_argument("--inputs", required=True, metavar="INPUTS.npz",
                        help="one array per model input, named after it (an 'in_' prefix, "
                             "as the test fixtures use, is accepted)")
    _add_input_shape_option(parser)
    parser.add_argument("--save", metavar="OUT.npz", help="save the outputs, named after the model's outputs")
    parser.add_argument("--repeat", type=int, default=100, metavar="N",
                        help="a built library: time N runs, each waited for, and print latency percentiles "
                             "(default 100)")


def _load_input_arrays(path: str) -> dict:
    import zipfile

    import numpy as np

    try:
        archive = np.load(path, allow_pickle=False)
        if isinstance(archive, np.ndarray):  # np.load reads a .npy file as one bare array
            raise UsageError(f"--inputs {path!r} is a single .npy array; expected an .npz archive with one "
                             f"array per model input, named after it (np.savez(path, x=...))")
        with archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, zipfile.BadZipFile) as error:  # OSError (missing file) passes through
        raise UsageError(f"--inputs {path!r} is not a readable .npz file: {error}") from None
    prefixed = {key[len("in_"):]: value for key, value in arrays.items() if key.startswith("in_")}
    return prefixed or arrays


def _load_expected_arrays(path: str) -> dict:
    """The expected outputs an .npz may carry beside the inputs ('out_<name>', as the test
    fixtures do); empty when it has none. Read after _load_input_arrays accepted the file."""
    import numpy as np
    with np.load(path, allow_pickle=False) as archive:
        return {key[len("out_"):]: archive[key] for key in archive.files if key.startswith("out_")}


def _compare_line(name: str, got, want) -> str:
    """How far one output is from the expected array, in the terms tolerances use."""
    import numpy as np
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)}, but the expected array is {tuple(want.shape)}"
    difference = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))) if got.size else 0.0
    scale = np.max(np.abs(want.astype(np.float64))) if want.size else 0.0
    relative = difference / scale if scale else difference
    return f"{name}: max |got - expected| {difference:.3g}, relative to max |expected| {relative:.3g}"


def _run_command(args: argparse.Namespace) -> int:
    import numpy as np

    from .frontend import from_onnx
    from .interpreter import interpret

    arrays = _load_input_arrays(args.inputs)
    if args.model.endswith(".so"):
        if args.input_shape or args.dim:  # a built library's shapes were fixed at build time
            raise UsageError(f"--input-shape and --dim are for an .onnx model; {args.model!r} is a built library "
                             f"whose input shapes were fixed when it was built")
        return _run_library(args, arrays)
    interface = _model_interface(args.model)
    input_names = [entry["name"] for entry in interface["inputs"]] if interface else None
    output_names = [entry["name"] for entry in interface["outputs"]] if interface else None
    shapes = parse_input_shapes(args.input_shape)
    if input_names is not None:
        missing = [name for name in input_names if name not in arrays]
        unknown = sorted(set(arrays) - set(input_names))
        if missing or unknown:
            raise UsageError(f"--inputs {args.inputs!r} must hold one array per model input "
                             f"({', '.join(input_names)}); missing: {missing or 'none'}, "
                             f"not inputs: {unknown or 'none'}")
        # the arrays fix dynamic dims; an explicit --input-shape wins (and is checked below)
        _check_arrays_fit(args.inputs, {entry["name"]: entry["dims"] for entry in interface["inputs"]},
                          {name: arrays[name] for name in input_names if name not in shapes})
        shapes = {**{name: arrays[name].shape for name in input_names}, **shapes}

    mod = from_onnx(args.model, input_shapes=shapes, dims=parse_dims(args.dim))
    if input_names is not None:
        results = interpret(mod, *[arrays[name] for name in input_names])  # params follow graph inputs
    else:
        results = interpret(mod, **arrays)
    results = list(results) if isinstance(results, tuple) else [results]
    output_names = output_names or [f"output_{i}" for i in range(len(results))]

    for name, value in zip(output_names, results):
        value = np.asarray(value)
        first = np.array2string(value.reshape(-1)[:6], precision=5, separator=", ")
        print(f"{name}: {value.dtype} {tuple(value.shape)}  first values {first}")
    if args.save:
        _save_outputs(args.save, {name: np.asarray(value) for name, value in zip(output_names, results)})
    return EXIT_OK


def _save_outputs(path: str, arrays: dict):
    import numpy as np

    np.savez(path, **arrays)
    # np.savez appends .npz to a name without it: report the file it wrote
    print(f"wrote {path if path.endswith('.npz') else path + '.npz'}")


def _run_library(args: argparse.Namespace, arrays: dict) -> int:
    """Run a built library (on its device: CuPy arrays for cuda) and print its outputs."""
    import numpy as np

    from .runtime import load
    module = load(args.model)
    if module.device == "cuda":
        import cupy
        arrays = {name: cupy.asarray(value) for name, value in arrays.items()}
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: expected a number of runs >= 1")
    results = module.run(**arrays)
    times = np.sort(np.asarray(module.latencies(**arrays, repeat=args.repeat, warmup=min(10, args.repeat))))
    results = list(results) if isinstance(results, tuple) else [results]
    results = [np.asarray(r.get() if hasattr(r, "get") else r) for r in results]
    p50, p90, p99 = (float(np.percentile(times, q)) for q in (50, 90, 99))
    print(f"{args.model}: {module.metadata['target']}, backends {', '.join(module.metadata['backends'])}; "
          f"latency over {len(times)} runs: p50 {p50:.3f} ms, p90 {p90:.3f} ms, p99 {p99:.3f} ms, "
          f"mean {float(times.mean()):.3f} ms")
    for name, value in zip(module.output_names, results):
        first = np.array2string(value.reshape(-1)[:6], precision=5, separator=", ")
        print(f"{name}: {value.dtype} {tuple(value.shape)}  first values {first}")
    expected = _load_expected_arrays(args.inputs)
    for name, value in zip(module.output_names, results):
        if name in expected:
            print(_compare_line(name, value, expected[name]))
    if args.save:
        _save_outputs(args.save, dict(zip(module.output_names, results)))
    return EXIT_OK


# ---- the table and the driver ------------------------------------------------------------

def describe_build_stats(stats: dict) -> str:
    """One line: build time, compile units compiled vs cached, per backend."""
    per_backend = ", ".join(f"{name} {entry['compiled']}/{entry['units']}"
                            for name, entry in sorted(stats.get("backends", {}).items()))
    return (f"built in {stats.get('seconds', 0):.1f} s: {stats.get('compile_units', 0)} compile units, "
            f"{stats.get('compiled', 0)} compiled ({stats.get('compile_seconds', 0):.1f} s), "
            f"{stats.get('cached', 0)} from the object cache; compiled/units per backend: {per_backend or '-'}")


def _build_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("model", help="the ONNX model file")
    parser.add_argument("-c", "--config", default="default",
                        help="a build config: a name from build_configs/ (default, cpu, cuda_sm90, ...) or a YAML path")
    parser.add_argument("-o", "--output", metavar="MODEL.so", help="where to write the library (default: model.so)")
    parser.add_argument("--target", help="override the config's device target, e.g. 'cpu' or 'cuda -arch=sm_90'")
    parser.add_argument("--workdir", help="keep generated sources, build.ninja and the partition report here")
    _add_input_shape_option(parser)
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print only the result, not the build's progress (stages, [n/m] compile units)")


class _ProgressLines:
    """The build's progress records (logger byoc.build) as plain lines on the current
    stderr, so that they read the same on a terminal and in a CI log; attached for one
    command and removed after it."""

    def __init__(self, quiet: bool):
        import logging
        self.logger = logging.getLogger("byoc.build")
        self.handler = None if quiet else _stderr_handler()
        self.level = self.logger.level

    def __enter__(self):
        import logging
        if self.handler is not None:
            self.logger.addHandler(self.handler)
            self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        if self.handler is not None:
            self.logger.removeHandler(self.handler)
            self.logger.setLevel(self.level)


def _stderr_handler():
    import logging

    class Handler(logging.Handler):
        def emit(self, record):
            print(f"byoc: {record.getMessage()}", file=sys.stderr, flush=True)
    return Handler()


def _build_command(args: argparse.Namespace) -> int:
    from .build import build
    with _ProgressLines(args.quiet):
        library = build(args.model, target=args.target, config=args.config, workdir=args.workdir,
                        input_shapes=parse_input_shapes(args.input_shape) or None, dims=parse_dims(args.dim) or None)
    output = args.output or "model.so"
    written = library.export_library(output)
    sources = f"sources in {library.workdir}" if library.workdir_kept else "sources not kept: --workdir DIR keeps them"
    print(f"wrote {written} ({written.stat().st_size} bytes; build {library.metadata['build_id']}, "
          f"target {library.metadata['target']}; {sources})")
    print(describe_build_stats(library.build_stats))
    if library.report is not None:
        print(library.report.to_text())
    # the picture of the build: kept in the workdir, else drawn from the library on request
    print(f"what runs where: {library.workdir / 'report.html'}" if library.workdir_kept else
          f"what runs where: byoc report {written} draws it")
    return 0


def _inspect_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("library", help="a model library built by byoc, or an ONNX model (its interface before building)")
    parser.add_argument("--json", action="store_true", help="print the metadata JSON as the library carries it "
                        "(for an ONNX model: its interface as JSON)")


def _is_elf(path) -> bool:
    """Whether `path` is an ELF file; True for anything but a readable regular file, whose
    problem the library loader then names (reading a FIFO would wait for a writer)."""
    import stat
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return True
        with open(path, "rb") as file:
            return file.read(4) == b"\x7fELF"
    except (OSError, ValueError):
        return True


def _inspect_command(args: argparse.Namespace) -> int:
    import json
    # an ONNX model: neither an ELF file nor named like a library (a .so whose header is
    # corrupted is reported as a library)
    if not _is_elf(args.library) and ".so" not in Path(args.library).suffixes:
        from .frontend.onnx import describe_model
        description = describe_model(args.library)
        print(json.dumps(description, indent=2, sort_keys=True) if args.json else
              describe_onnx_model(args.library, description))
        return 0
    from .runtime import metadata_of
    metadata = metadata_of(args.library)
    if args.json:
        print(json.dumps(metadata, indent=2, sort_keys=True))
    else:
        print(describe_library(args.library, metadata))
    return 0


def describe_onnx_model(path, description: dict) -> str:
    """What `byoc inspect MODEL.onnx` prints: what a build needs to know before it starts."""
    def dims(entry):
        return "[" + ", ".join(str(d) for d in entry["dims"]) + "]" if entry["dims"] is not None else "(no shape)"
    opsets = ", ".join(f"{domain} {version}" for domain, version in sorted(description["opsets"].items()))
    lines = [f"{path}: ONNX (ir {description['ir_version']}, opset {opsets}; {description['producer'] or 'unknown producer'}),"
             f" {description['nodes']} nodes, {description['initializers']} initializers "
             f"({description['initializer_bytes'] / (1 << 20):.1f} MiB)"]
    for kind in ("inputs", "outputs"):
        for entry in description[kind]:
            lines.append(f"  {kind[:-1]:<6} {entry['name']}: {entry['dtype']} {dims(entry)}")
    if description["named_dims"]:
        named = "; ".join(f"{name} ({', '.join(where)})" for name, where in description["named_dims"].items())
        example = " ".join(f"--input-shape {entry['name']}={','.join(str(d) if isinstance(d, int) else '1' for d in entry['dims'])}"
                           for entry in description["inputs"] if entry["dims"] and any(isinstance(d, str) for d in entry["dims"]))
        lines.append(f"  dims to fix when building: {named}")
        lines.append(f"    e.g. byoc build {path} {example}")
    ops = ", ".join(f"{op} x{count}" for op, count in description["op_types"].items())
    lines.append(textwrap.fill(f"ops: {ops}", width=100, initial_indent="  ", subsequent_indent="    "))
    if description["unsupported"]:
        lines.append(f"  not imported by byoc: {', '.join(description['unsupported'])} (byoc ops lists what is)")
    return "\n".join(lines)


def describe_library(path, metadata: dict) -> str:
    """What `byoc inspect` prints: the library's interface, backends, memory plan and
    partition report, from the metadata it carries."""
    from .report import PartitionReport
    mib = 1 << 20
    lines = [f"{path}: build {metadata.get('build_id')}, target {metadata.get('target')}"
             f"{', ' + metadata['arch'] if metadata.get('arch') else ''}, "
             f"cuda graph {'on' if metadata.get('cuda_graph') else 'off'}"]
    for kind in ("inputs", "outputs"):
        for tensor in metadata.get(kind, []):
            where = f" on {tensor['device']}" if "device" in tensor else ""
            lines.append(f"  {kind[:-1]:<6} {tensor['name']}: {tensor['dtype']} {tuple(tensor['shape'])}{where}")
    weights = metadata.get("weights", {})
    lines.append(f"  weights: {weights.get('bytes', 0) / mib:.1f} MiB, {weights.get('location')}")
    calls = {}
    for function in metadata.get("functions", []):
        entry = calls.setdefault(function["backend"], [0, 0])
        entry[0] += 1
        entry[1] += function["calls"]
    for backend, (functions, count) in sorted(calls.items()):
        lines.append(f"  backend {backend}: {functions} functions, {count} calls per run")
    memory = metadata.get("memory", {})
    plan = memory.get("plan")
    if plan and not plan.get("planned_bytes"):  # every value is an input, output or weight
        lines.append(f"  memory: no planned tensors, workspace {memory.get('workspace_bytes', 0) / mib:.2f} MiB")
    elif plan:
        lines.append(f"  memory: planned {plan['planned_bytes'] / mib:.2f} MiB, lower bound "
                     f"{plan['lower_bound_bytes'] / mib:.2f} MiB ({plan.get('over_lower_bound')}x), no reuse "
                     f"{plan['no_reuse_bytes'] / mib:.2f} MiB ({plan.get('reuse_factor')}x the plan), "
                     f"workspace {memory.get('workspace_bytes', 0) / mib:.2f} MiB")
    if metadata.get("partition_report"):
        lines += ["", PartitionReport.from_json(metadata["partition_report"]).to_text()]
    return "\n".join(lines)


def _report_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("build", help="a model library built by byoc, or a build's workdir (its metadata.json)")
    parser.add_argument("-o", "--output", help="the HTML file to write (default: report.html in the workdir, "
                        "or beside the library as NAME.report.html)")
    parser.add_argument("--onnx", metavar="OUT.onnx", help="also write the partitioned graph as ONNX (one node per "
                        "call, typed by its patterns, in domain byoc.<backend>), for a model viewer such as Netron")


def _report_command(args: argparse.Namespace) -> int:
    import json
    from .errors import ConfigError
    from .report_page import render_page
    source = Path(args.build)
    if source.is_dir():
        metadata_path = source / "metadata.json"
        try:
            metadata = json.loads(metadata_path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{source} has no metadata.json; expected a build's workdir (byoc build --workdir) "
                              f"or a built library") from None
        except (OSError, ValueError) as error:
            raise ConfigError(f"{metadata_path}: cannot read it as a build's metadata ({error})") from None
        output = Path(args.output) if args.output else source / "report.html"
        title = source.name
    else:
        from .runtime import metadata_of
        metadata = metadata_of(source)
        output = Path(args.output) if args.output else source.with_name(source.name.split(".")[0] + ".report.html")
        title = source.name
    if not isinstance(metadata, dict):
        raise ConfigError(f"{args.build}: its metadata is not a JSON object; expected a byoc build's")
    try:
        page = render_page(metadata, title=title)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:  # an edited metadata.json
        raise ConfigError(f"{args.build}: its metadata is not what a byoc build writes ({type(error).__name__}: "
                          f"{error}); rebuild it, or restore metadata.json") from None
    try:
        output.write_text(page)
    except OSError as error:
        raise ConfigError(f"--output {output}: cannot write it ({error.strerror or error})") from None
    print(output)
    if args.onnx:
        import onnx
        from .report_page import partitioned_onnx
        try:
            onnx.save(partitioned_onnx(metadata, title), args.onnx)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise ConfigError(f"{args.build}: its metadata is not what a byoc build writes ({type(error).__name__}: "
                              f"{error}); rebuild it, or restore metadata.json") from None
        except OSError as error:
            raise ConfigError(f"--onnx {args.onnx}: cannot write it ({error.strerror or error})") from None
        print(args.onnx)
    return 0


def _tuning_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("action", choices=("show", "merge", "export"),
                        help="show: list databases' entries (default: the persistent one and the shipped one); "
                             "merge: combine databases into -o (default: the persistent one); "
                             "export: copy the persistent database to -o, to share it")
    parser.add_argument("databases", nargs="*", metavar="DB.json", help="tuning databases (show, merge)")
    parser.add_argument("-o", "--output", metavar="OUT.json", help="where merge and export write")


def _tuning_command(args: argparse.Namespace) -> int:
    from .backends.cutlass.tuning import (FORMAT, SHIPPED_DATABASE, TuningDatabase, default_database_path,
                                          merge_entries)
    persistent = default_database_path()
    if args.action == "show":
        paths = [Path(p) for p in args.databases] or [p for p in (persistent, SHIPPED_DATABASE) if p.exists()]
        if not paths:
            print(f"no tuning database yet (tuning writes {persistent})")
        for path in paths:
            _require_file(path)
            database = TuningDatabase(path)
            count = sum(len(entries) for entries in database.entries.values())
            print(f"{path}: {count} entries")
            for arch, entries in sorted(database.entries.items()):
                for key, entry in sorted(entries.items()):
                    if not isinstance(entry, dict):
                        continue
                    where = ", ".join(str(entry[k]) for k in ("device", "cuda", "cutlass", "date") if entry.get(k))
                    timing = f"{entry['us']:.2f} us" if isinstance(entry.get("us"), (int, float)) else "- us"
                    print(f"  {arch}  {key}  {entry.get('name', '?')}  {timing}  ({where or 'measured where: unknown'})")
        return EXIT_OK
    if args.action == "export":
        if args.databases:
            raise UsageError("byoc tuning export takes no databases: it writes the persistent one "
                             f"({persistent}) to -o")
        if not args.output:
            raise UsageError("byoc tuning export needs -o OUT.json")
        if not persistent.exists():
            raise UsageError(f"no persistent tuning database at {persistent} yet; a build that tunes writes it")
        sources = [persistent]
    else:
        if not args.databases:
            raise UsageError("byoc tuning merge needs at least one DB.json")
        sources = [Path(p) for p in args.databases]
        if not args.output and persistent.exists():
            sources = [persistent] + sources  # merged into what builds already use
    for path in sources:
        _require_file(path)
    entries, conflicts = merge_entries([TuningDatabase(path) for path in sources])
    output = TuningDatabase(None)
    output.path, output.entries = Path(args.output) if args.output else persistent, entries
    output.save()
    count = sum(len(e) for e in entries.values())
    print(f"{output.path}: {count} entries from {len(sources)} database(s) ({FORMAT}); "
          f"{conflicts} problem(s) held by more than one")
    return EXIT_OK


def _require_file(path: Path):
    if not path.is_file():
        raise UsageError(f"{path}: no such tuning database file")


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


SUBCOMMANDS = [
    Subcommand("import", "import an ONNX model and print (or write) its IR text",
               _import_arguments, _import_command),
    Subcommand("ops", "list the IR ops (with category) and the ONNX op types that import",
               _ops_arguments, _ops_command),
    Subcommand("run", "run an ONNX model with the reference interpreter, or a built .so on its device",
               _run_arguments, _run_command),
    Subcommand("build", "build an ONNX model into one deployable .so",
               _build_arguments, _build_command),
    Subcommand("inspect", "print a built library's interface, backends, memory plan and partition report, "
               "or an ONNX model's interface",
               _inspect_arguments, _inspect_command),
    Subcommand("report", "draw a build as one HTML page: what runs where, refused patterns and why, the memory plan",
               _report_arguments, _report_command),
    Subcommand("tuning", "the CUTLASS tuning databases: show their entries, merge them, export yours to share",
               _tuning_arguments, _tuning_command),
]


def _version() -> str:
    from importlib import metadata
    try:
        return metadata.version("byoc")
    except metadata.PackageNotFoundError:  # run from a checkout without installing
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="byoc", description="byoc: split a model among code generators and build one library.")
    # --debug is accepted before or after the subcommand; SUPPRESS keeps the subparser's
    # absent flag from overwriting the main parser's value
    parser.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    parser.add_argument("--version", action="version", version=f"byoc {_version()}")
    debug_after_subcommand = argparse.ArgumentParser(add_help=False)
    debug_after_subcommand.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                        help=argparse.SUPPRESS)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for subcommand in SUBCOMMANDS:
        subparser = subparsers.add_parser(subcommand.name, help=subcommand.help,
                                          description=subcommand.help, parents=[debug_after_subcommand])
        subcommand.add_arguments(subparser)
        subparser.set_defaults(run=subcommand.run)
    return parser


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: tuple[type[BaseException], ...] = (ByocError, OSError)
    try:
        import yaml
        types += (yaml.YAMLError,)
    except ImportError:  # pyyaml is a dependency, but a broken install must still report errors
        pass
    return types


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # argparse has printed usage/help already
        return exit_request.code if isinstance(exit_request.code, int) else EXIT_USER_ERROR

    with warnings.catch_warnings():  # restores showwarning on the way out
        # byoc's own warnings (an unusable object cache, ...) read as the errors do
        warnings.showwarning = _show_warning(warnings.showwarning)
        return _run(args)


def _show_warning(default_show):
    from .errors import ByocWarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ByocWarning):
            print(f"byoc: warning: {message}", file=sys.stderr)
        else:
            default_show(message, category, filename, lineno, file, line)
    return show


def _run(args) -> int:
    try:
        return args.run(args)
    except BrokenPipeError:  # `byoc ops | head`: the reader left; nothing to report
        _silence_stdout()
        return EXIT_OK
    except _user_error_types() as error:
        print(f"byoc: error: {_describe(error)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("byoc: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug:
            traceback.print_exc()
        print(f"byoc: internal error: {type(error).__name__}: {error}"
              + ("" if args.debug else "\n(this is a bug in byoc; rerun with --debug for the traceback)"),
              file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def _silence_stdout():
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (pytest's capture): nothing to do
        pass


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename is not None:
        # "No such file or directory: 'x.onnx'" reads better than "[Errno 2] ..."
        return f"{error.strerror or error}: {error.filename!r}"
    message = str(error)
    # the frontend speaks Python about the model's input shapes; say it the command-line way
    # (a config file's input_shapes key is a ConfigError and keeps its own words)
    if isinstance(error, ModelError) and "input_shapes" in message:
        by_name = " or --dim NAME=SIZE" if "dims={" in message else ""
        message += f" (on the command line: --input-shape NAME=D1,D2,...{by_name})"
    elif isinstance(error, ModelError) and message.startswith("dims"):
        message += " (on the command line: --dim NAME=SIZE)"
    return message


if __name__ == "__main__":
    sys.exit(main())
