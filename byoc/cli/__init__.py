"""The `byoc` command line: one table of subcommands, one place that turns errors into
messages.

    byoc import MODEL.onnx [--input-shape NAME=1,8 ...] [-o OUT.ir]
    byoc ops
    byoc run MODEL.onnx --inputs INPUTS.npz [--input-shape ...] [--save OUT.npz]
    byoc report model.so|WORKDIR [-o report.html]
    byoc refit model.so NEW.onnx -o NEW.safetensors [--weights W.safetensors|W.npz] [--config C]
    byoc tuning show|merge|export [DB.json ...] [-o OUT.json]
    byoc kernels build|show|clear|export|import [-c CONFIG] [ARCHIVE] [-o OUT]

A user error (any byoc.ByocError, a missing or unreadable file, a bad YAML file) prints
`byoc: error: <message>` on stderr and exits 2, with no traceback. Anything else is a bug
in byoc: it prints a one-line message and exits 1; `--debug` adds the traceback.

A new subcommand is one more row in SUBCOMMANDS: a name, a help line, a function that
adds its arguments and a function that runs it and returns the exit code. Each group of
subcommands is a module of this package (model, run, build, inspect, refit, tuning, kernels); what they
share is in common.py.
"""
from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable

from ..errors import ByocError, ModelError
from .build import build_arguments, build_command
from .common import EXIT_INTERNAL_ERROR, EXIT_OK, EXIT_USER_ERROR, UsageError, parse_input_shapes  # noqa: F401
from .inspect import inspect_arguments, inspect_command, report_arguments, report_command
from .model import import_arguments, import_command, ops_arguments, ops_command
from .refit import refit_arguments, refit_command
from .run import run_arguments, run_command
from .tuning import tuning_arguments, tuning_command
from .kernels import kernels_arguments, kernels_command

__all__ = ["main", "build_parser", "SUBCOMMANDS", "UsageError", "parse_input_shapes", "EXIT_OK", "EXIT_USER_ERROR",
           "EXIT_INTERNAL_ERROR"]


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


SUBCOMMANDS = [
    Subcommand("import", "import an ONNX model and print (or write) its IR text",
               import_arguments, import_command),
    Subcommand("ops", "list the IR ops (with category) and the ONNX op types that import",
               ops_arguments, ops_command),
    Subcommand("run", "run an ONNX model with the reference interpreter, or a built .so on its device",
               run_arguments, run_command),
    Subcommand("build", "build an ONNX model into one deployable .so",
               build_arguments, build_command),
    Subcommand("inspect", "print a built library's interface, backends, memory plan and partition report, "
               "or an ONNX model's interface",
               inspect_arguments, inspect_command),
    Subcommand("report", "draw a build as one HTML page: what runs where, refused patterns and why, the memory plan",
               report_arguments, report_command),
    Subcommand("refit", "new weights for a built library without compiling it again: writes a weights file "
               "it runs with", refit_arguments, refit_command),
    Subcommand("tuning", "the CUTLASS tuning databases: show their entries, merge them, export yours to share",
               tuning_arguments, tuning_command),
    Subcommand("kernels", "the kernel library: compile tuning's candidate kernels once per machine (build), "
               "show it, clear it, export it to an archive, import one", kernels_arguments, kernels_command),
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
    from ..errors import ByocWarning

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

