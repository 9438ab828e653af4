"""`byoc kernels build|show|clear|export|import`: the kernel library (byoc/kernel_library.py),
kernels compiled once per machine so that tuning a model no database knows compiles none."""
from __future__ import annotations

import argparse
import json

from .common import EXIT_OK, UsageError


def kernels_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("action", choices=("build", "show", "clear", "export", "import"),
                        help="build: compile the library for a config's GPU (once per machine and toolkit); "
                             "show: where it is, its size and what filled it; clear: delete its objects; "
                             "export: pack it into one archive (-o); import: unpack an archive into it (it holds "
                             "machine code that builds link: import only archives you trust)")
    parser.add_argument("archive", nargs="?", metavar="ARCHIVE.tar.gz", help="import: the archive to unpack")
    parser.add_argument("-o", "--output", metavar="OUT.tar.gz", help="export: the archive to write")
    parser.add_argument("-c", "--config", default="cuda_sm90",
                        help="the build config whose target and backends the kernels are for (default cuda_sm90)")
    parser.add_argument("--dtype", action="append", choices=("float16", "bfloat16"), dest="dtypes",
                        help="element types to compile kernels for (repeatable; default float16)")
    parser.add_argument("--epilogues", choices=("proxy", "all"), default="proxy",
                        help="proxy: the epilogues tuning times candidates with (bias or none; the default); "
                             "all: also the fused activations and residuals, so that builds take their winners "
                             "from the library too (several times the size)")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel compiles (default: one per CPU)")
    parser.add_argument("--json", action="store_true", help="build: print the summary as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="build: no progress lines")


# The one path each action takes besides its options: export's -o, import's ARCHIVE; the rest none.
PATH_ARGUMENTS = {"export": ("output", "writes the library to -o OUT.tar.gz (and takes no ARCHIVE)"),
                  "import": ("archive", "needs the ARCHIVE.tar.gz to unpack (and takes no -o)")}


def kernels_command(args: argparse.Namespace) -> int:
    from .. import kernel_library
    wanted, usage = PATH_ARGUMENTS.get(args.action, (None, "takes no ARCHIVE or -o"))
    if [name for name in ("archive", "output") if getattr(args, name)] != ([wanted] if wanted else []):
        raise UsageError(f"byoc kernels {args.action} {usage}")
    if args.action == "show":
        print(kernel_library.describe())
        return EXIT_OK
    if args.action == "export":
        done = kernel_library.export_library(args.output)
        print(f"{done['archive']}: {done['objects']} objects, {done['bytes'] / 2**20:.1f} MiB")
        return EXIT_OK
    if args.action == "import":
        done = kernel_library.import_library(args.archive)
        print(f"kernel library {done['where']}: {done['added']} objects added, {done['already_there']} already there")
        try:  # an archive from a machine set up otherwise (other paths or versions) serves nothing here
            held, total = kernel_library.coverage(args.config)
            print(f"  it holds {held} of the {total} units a {args.config} build on this machine looks up")
        except Exception as error:  # noqa: BLE001 - no CUTLASS or nvcc here: nothing to look up
            print(f"  (what a {args.config} build here would find: unknown, {type(error).__name__}: {error})")
        return EXIT_OK
    if args.action == "clear":
        removed = kernel_library.clear_library()
        print(f"kernel library {kernel_library.library_dir()}: {removed} objects deleted")
        return EXIT_OK
    from ..progress import BuildProgress
    from .build import _ProgressLines
    progress = BuildProgress()
    with _ProgressLines(args.quiet):
        progress.stage(f"kernel library: compiling {args.config}'s kernels into {kernel_library.library_dir()}")
        with progress.heartbeat():
            summary = kernel_library.build_library(args.config, tuple(args.dtypes or ("float16",)), args.epilogues,
                                                   jobs=args.jobs, progress=progress.compile_line)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"kernel library {summary['where']}: {summary['units']} units for {args.config} "
              f"({'+'.join(summary['dtypes'])}, {summary['epilogues']} epilogues): {summary['compiled']} compiled, "
              f"{summary['already_there']} already there, {summary['failed']} failed, in {summary['seconds']} s; "
              f"{summary['bytes'] / 2**20:.1f} MiB")
    return EXIT_OK
