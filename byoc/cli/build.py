"""`byoc build`: one ONNX model into one .so, with progress lines on stderr."""
from __future__ import annotations

import argparse
import sys

from ..user_text import printable
from .common import UsageError, add_input_shape_option, parse_dims, parse_input_shapes


def describe_build_stats(stats: dict) -> str:
    """One line: build time, compile units compiled vs cached, per backend, and the
    slowest compiles (what bounds a cold build's time)."""
    per_backend = ", ".join(f"{name} {entry['compiled']}/{entry['units']}"
                            for name, entry in sorted(stats.get("backends", {}).items()))
    slowest = [unit for unit in stats.get("slowest_units", []) if unit["seconds"] >= 1.0][:3]
    return (f"built in {stats.get('seconds', 0):.1f} s: {stats.get('compile_units', 0)} compile units, "
            f"{stats.get('compiled', 0)} compiled ({stats.get('compile_seconds', 0):.1f} s), "
            f"{stats.get('cached', 0)} from the object cache; compiled/units per backend: {per_backend or '-'}"
            + ("; slowest: " + ", ".join(f"{u['source']} {u['seconds']:.0f} s" for u in slowest) if slowest else ""))


def build_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("model", nargs="?", help="the ONNX model file")
    parser.add_argument("-c", "--config", default="default",
                        help="a build config: a name from build_configs/ (default, cpu, cuda_sm90, ...) or a YAML path")
    parser.add_argument("-o", "--output", metavar="MODEL.so",
                        help="where to write the library (default: the config's output, else model.so)")
    parser.add_argument("--target", help="override the config's device target, e.g. 'cpu' or 'cuda -arch=sm_90'")
    parser.add_argument("--arch", metavar="SM,SM", help="CUDA archs one library holds kernels for, e.g. sm_80,sm_90 "
                                                        "(the config's arch; the runtime takes the GPU's)")
    parser.add_argument("--workdir", help="keep generated sources, build.ninja and the partition report here")
    add_input_shape_option(parser)
    parser.add_argument("--print-pipeline", action="store_true",
                        help="print the pipeline's stages in the order a build runs them, and exit")
    parser.add_argument("--dump-after", action="append", default=[], metavar="STAGE",
                        help="write the IR after STAGE to the workdir's ir/ (repeatable; --print-pipeline "
                             "lists the stages)")
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
            # a progress line names the model's file, nodes and workdir: their text is the
            # model's or the user's, escaped so that it cannot drive the terminal
            print(f"byoc: {printable(record.getMessage())}", file=sys.stderr, flush=True)
    return Handler()


def build_command(args: argparse.Namespace) -> int:
    from ..build import build
    if args.print_pipeline:
        from ..pipeline import describe_pipeline
        print(describe_pipeline())
        return 0
    if args.model is None:
        raise UsageError("byoc build: the ONNX model file is missing; expected `byoc build MODEL.onnx`")
    if args.dump_after:
        from ..pipeline import stage_named
        for name in args.dump_after:
            stage_named(name)  # an unknown stage before the build starts, naming the stages
    with _ProgressLines(args.quiet):
        arch = [a.strip() for a in args.arch.split(",") if a.strip()] if args.arch is not None else None
        library = build(args.model, target=args.target, config=args.config, workdir=args.workdir, arch=arch,
                        input_shapes=parse_input_shapes(args.input_shape) or None,
                        dims=parse_dims(args.dim, several=True) or None, dump_after=args.dump_after)
    from ..config import load_config
    output = args.output or load_config(args.config).output or "model.so"
    written = library.export_library(output)
    sources = f"sources in {library.workdir}" if library.workdir_kept else "sources not kept: --workdir DIR keeps them"
    print(f"wrote {written} ({written.stat().st_size} bytes; build {library.metadata['build_id']}, "
          f"target {library.metadata['target']}; {sources})")
    print(describe_build_stats(library.build_stats))
    if library.report is not None:
        # the report names the model's nodes: their text is the model's, escaped line by line
        print("\n".join(printable(line) for line in library.report.to_text().splitlines()))
    # the picture of the build: kept in the workdir, else drawn from the library on request
    print(f"what runs where: {library.workdir / 'report.html'}" if library.workdir_kept else
          f"what runs where: byoc report {written} draws it")
    return 0
