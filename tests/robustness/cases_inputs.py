"""Family 6: untrusted inputs around a build -- command-line integers, shape-bucket dims,
the compiler launcher, JSON files handed to byoc, and text shown on a terminal.

  cli/integers      --dim, --input-shape, --repeat and target attributes with numbers that are
                    no ASCII integer ('²' passes str.isdigit() and fails int(), '٣' and '1_0'
                    pass int(), 5,000 digits exceed it): a usage or config error naming the option
  sizes/build       tensors no machine holds (refused at build) and a large constant the build must not fold
  config/file       config files that are no config (FIFO, /dev/zero, 2 MiB, nested aliases)
  config/dims       shape-bucket sizes of 0 (the padding analysis divides by them) and more
                    combinations than a library holds (2**40 of them were listed before the
                    count was checked): a ConfigError naming dims, before anything is built
  toolchain/launcher  $BYOC_COMPILER_LAUNCHER that fails (false), does nothing (true, echo) or
                    mangles the command (sh -c): the compile error names the variable and value
  json/<reader>     metadata.json (byoc report), a tuning database (byoc tuning show, merge) and a
                    library's embedded metadata that are a FIFO, /dev/zero, a directory, JSON
                    nested 10^5 deep, integers of 401 or 5,000 digits, NaN, 1e400 or not UTF-8:
                    an error naming the file, with no hang (the case's timeout) or raw exception
  terminal/escapes  names with terminal escape sequences, printed by byoc tuning show and
                    byoc inspect MODEL.onnx: shown escaped, never raw

Each group has positive controls: a valid input of the same kind, which must be accepted.
The command-line cases run byoc's subcommands in the child with their errors raised (the
`byoc` entry point would turn them into exit codes), stdout captured.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shlex

from .runner import Case, Outcome, case_dir

TIMEOUT = 20.0
MODULE = "robustness.cases_inputs"

# what a terminal acts on: C0 controls but the newline, DEL, C1 controls, bidi overrides
_TERMINAL_CONTROLS = {chr(c) for c in range(0x20) if c != 0x0A} | {chr(0x7F)} | {chr(c) for c in range(0x80, 0xA0)} \
    | set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


# ---- files made in the child's folder ------------------------------------------------------

def named_dim_model():
    """x float32 [batch, 8] -> relu(x @ w) [batch, 4]: an MLP with a named dim."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    weight = numpy_helper.from_array(np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


ESCAPED_NAME = "x\x1b[2J\x1b]0;owned\x07\u202e\x9b31m"  # clear screen, window title, bidi override, C1 CSI


def escaping_model():
    """The named-dim MLP with escape sequences in its input's name, its dim's name and its producer."""
    import onnx
    model = named_dim_model()
    dim = "b\x1b[31m"
    model.graph.input[0].name = ESCAPED_NAME
    model.graph.node[0].input[0] = ESCAPED_NAME
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = dim
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = dim
    model.producer_name = "tool\x1b[5m"
    onnx.checker.check_model(model)
    return model


def _make(name: str, spec):
    """One file (or folder) in the child's folder: spec is ("text", str), ("bytes", bytes),
    ("fifo",), ("link", target), ("dir",), ("loop",) or ("model", "named" | "escaping")."""
    path = case_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    kind = spec[0]
    if kind == "text":
        path.write_text(spec[1], encoding="utf-8")
    elif kind == "bytes":
        path.write_bytes(spec[1])
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        os.symlink(spec[1], path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "loop":
        os.symlink(path.with_name("loop"), path)
        os.symlink(path, path.with_name("loop"))
    elif kind == "model":
        import onnx
        onnx.save(named_dim_model() if spec[1] == "named" else escaping_model(), str(path))
    elif kind == "npz":
        import numpy as np
        np.savez(path, x=np.ones((2, 8), np.float32))
    else:
        raise AssertionError(kind)
    return path


# ---- case functions (in the child) ------------------------------------------------------------

def run_cli(argv: list, files: dict | None = None, env: dict | None = None, shown: str | None = None):
    """byoc's command line with `argv` ("{dir}" is the child's folder), errors raised. The
    output must hold no terminal control character (and `shown`, when given: a positive
    control's text printed as it is)."""
    from byoc.cli import build_parser
    from byoc.cli.common import UsageError
    for name, spec in (files or {}).items():
        _make(name, spec)
    os.environ.update({"BYOC_CACHE_DIR": str(case_dir() / "cache"), **(env or {})})
    argv = [argument.replace("{dir}", str(case_dir())) for argument in argv]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exit_request:
            # argparse refuses an argument of the wrong type itself (exit 2, its message on
            # stderr): the CLI's refusal, raised as its UsageError so the message is checked
            raise UsageError(stderr.getvalue().strip() or f"argparse exit {exit_request.code}") from None
        try:
            args.run(args)
        except MemoryError:
            # nothing here is large: running out means an unbounded read (/dev/zero) or listing
            # (the runner would call it an informational memory_limit)
            return Outcome("wrong", "MemoryError: read or listed without a bound")
    printed = stdout.getvalue() + stderr.getvalue()  # the progress lines too
    raw = sorted({f"U+{ord(c):04X}" for c in printed if c in _TERMINAL_CONTROLS})
    if raw:
        return Outcome("wrong", f"printed terminal control characters unescaped ({', '.join(raw)}): {printed[:300]!r}")
    if shown is not None and shown not in printed:
        return Outcome("wrong", f"did not print {shown!r}: {printed[:300]!r}")
    return None


def run_config_dims(dims: dict):
    """The config's dims validated and its shape buckets listed (what build() does first)."""
    from byoc.config import MAX_SHAPE_BUCKETS, load_config
    try:
        buckets = load_config({"target": "cpu", "dims": dims}).shape_buckets()
    except MemoryError:  # the combinations listed before their count was checked
        return Outcome("wrong", "MemoryError: the shape buckets were listed without a bound")
    if not 1 <= len(buckets) <= MAX_SHAPE_BUCKETS:
        return Outcome("wrong", f"{len(buckets)} shape buckets accepted")
    return None


def run_launcher(launcher: str):
    """One tiny C++ unit compiled (no object cache: a fresh one in the child's folder) with
    $BYOC_COMPILER_LAUNCHER set to `launcher`."""
    from byoc.toolchain import CompileUnit, compile_units
    os.environ["BYOC_COMPILER_LAUNCHER"] = launcher
    os.environ["BYOC_CACHE_DIR"] = str(case_dir() / "cache")
    source = case_dir() / "unit.cc"
    source.write_text("int byoc_robustness_unit() { return 42; }\n")
    objects = compile_units([CompileUnit(source=source, language="cxx", flags=["-O0", "-fPIC"], output="unit.o")],
                            case_dir() / "work", jobs=1)
    if not all(path.is_file() and path.stat().st_size > 0 for path in objects):
        return Outcome("wrong", f"the launcher {launcher!r} wrote no object, and no error said so")
    return None


def run_library_metadata(raw: bytes):
    """A library's embedded metadata as byoc.load and byoc inspect read it (the JSON the
    library's byoc_model_metadata() returns; the library itself stands in)."""
    from byoc.runtime.library_file import _read_metadata

    def byoc_model_metadata():
        return raw

    class Library:
        pass
    library = Library()
    library.byoc_model_metadata = byoc_model_metadata
    _read_metadata(library, str(case_dir() / "model.so"))
    return None


# ---- generators (in the pytest process) --------------------------------------------------------

def _case(group, name, function, params, expect="refuse", why="", names=(), timeout=TIMEOUT) -> Case:
    return Case("inputs", group, name, f"{MODULE}:{function}", params, timeout=timeout, expect=expect, why=why,
                names=tuple(names))


NOT_ASCII_INTEGERS = {"superscript two": "²", "arabic-indic three": "٣", "fullwidth four": "４",
                      "underscore": "1_0", "5000 digits": "9" * 5000, "past int64": str(1 << 63),
                      "negative": "-1", "empty": "", "hex": "0x10", "float": "1e3", "range with superscript": "1..2²"}


def _integer_cases() -> list[Case]:
    cases = []
    model = {"m.onnx": ("model", "named")}
    inputs = {"x.npz": ("npz",), **model}
    for label, text in NOT_ASCII_INTEGERS.items():
        why = f"--dim batch={label}: sizes are non-negative ASCII integers"
        cases.append(_case("cli/integers", f"build --dim batch=<{label}>", "run_cli",
                           {"argv": ["build", "{dir}/m.onnx", "-c", "cpu", "-q", "-o", "{dir}/m.so", "--dim",
                                     f"batch={text}"], "files": model}, why=why, names=("--dim",)))
        if label != "range with superscript":  # ranges are byoc build's
            cases.append(_case("cli/integers", f"run --dim batch=<{label}>", "run_cli",
                               {"argv": ["run", "{dir}/m.onnx", "--inputs", "{dir}/x.npz", "--dim", f"batch={text}"],
                                "files": inputs}, why=why, names=("--dim",)))
        if text:  # an empty --input-shape dims list is a scalar
            cases.append(_case("cli/integers", f"run --input-shape x=<{label}>,8", "run_cli",
                               {"argv": ["run", "{dir}/m.onnx", "--inputs", "{dir}/x.npz", "--input-shape",
                                         f"x={text},8"], "files": inputs},
                               why="--input-shape dims are non-negative ASCII integers", names=("--input-shape",)))
        if label != "negative":  # -1 is an integer: run's own check refuses it (needs a library)
            cases.append(_case("cli/integers", f"run --repeat <{label}>", "run_cli",
                               {"argv": ["run", "{dir}/m.so", "--inputs", "{dir}/x.npz", "--repeat", text]},
                               why="--repeat is an ASCII integer", names=("--repeat",)))
        cases.append(_case("cli/integers", f"build --target 'cpu -opt_level=<{label}>'", "run_cli",
                           {"argv": ["build", "{dir}/m.onnx", "-c", "cpu", "-q", "-o", "{dir}/m.so", "--target",
                                     f"cpu -opt_level={text}"], "files": model},
                           why="target attributes are ASCII integers", names=("opt_level",)))
    # positive controls: the reference interpreter runs the model with ASCII sizes (spaces allowed)
    for argv in (["--dim", "batch=2"], ["--dim", "batch= 2"], ["--input-shape", "x=2,8"], ["--input-shape", "x=2, 8"]):
        cases.append(_case("cli/integers", f"run {' '.join(argv)} (valid)", "run_cli",
                           {"argv": ["run", "{dir}/m.onnx", "--inputs", "{dir}/x.npz", *argv], "files": inputs},
                           expect="any"))
    return cases


def _dims_cases() -> list[Case]:
    refused = {"bucket 0": {"batch": [0, 4]}, "bucket 0 last": {"batch": [4, 0]}, "range from 0": {"batch": "0..4"},
               "40 dims of 2 sizes": {f"d{i}": [1, 2] for i in range(40)},
               "2000 dims of 2 sizes": {f"d{i}": [1, 2] for i in range(2000)},
               "5 x 4 sizes": {"a": [1, 2, 3, 4, 5], "b": [1, 2, 3, 4]}, "size past int64": {"batch": 1 << 63},
               "bucket past int64": {"batch": [1, 1 << 64]}, "range past int64": {"batch": "1..1" + "0" * 30},
               "no sizes": {"batch": []}, "bool size": {"batch": [1, True]}}
    cases = [_case("config/dims", name, "run_config_dims", {"dims": dims}, why="bucket sizes >= 1, at most 16 buckets",
                   names=("dims",)) for name, dims in refused.items()]
    accepted = {"buckets 1 and 4": {"batch": [1, 4]}, "one size 0": {"batch": 0}, "range 1..32": {"batch": "1..32"},
                "16 buckets over 4 dims": {f"d{i}": [1, 2] for i in range(4)},
                "40 dims of one size": {f"d{i}": 3 for i in range(40)}}
    cases += [_case("config/dims", f"{name} (valid)", "run_config_dims", {"dims": dims}, expect="any")
              for name, dims in accepted.items()]
    # the command line: refused before anything is built (a build would take seconds, not ms)
    for sizes in ("0,4", "0..4", "4,0"):
        cases.append(_case("config/dims", f"byoc build --dim batch={sizes}", "run_cli",
                           {"argv": ["build", "{dir}/m.onnx", "-c", "cpu", "-q", "-o", "{dir}/m.so", "--dim",
                                     f"batch={sizes}"], "files": {"m.onnx": ("model", "named")}},
                           why="bucket sizes >= 1", names=("dims.batch",)))
    return cases


def _launcher_cases() -> list[Case]:
    cases = []
    for launcher in ("false", "true", "echo", "sh -c"):
        cases.append(_case("toolchain/launcher", launcher, "run_launcher", {"launcher": launcher},
                           why="a launcher that does not run the compiler",
                           names=(f"BYOC_COMPILER_LAUNCHER={shlex.quote(launcher)}",), timeout=60.0))
    # positive control: env runs the command it is given, as sccache and ccache do
    cases.append(_case("toolchain/launcher", "env (valid)", "run_launcher", {"launcher": "env"}, expect="any",
                       timeout=60.0))
    return cases


def _damaged_json(valid: dict, number_path: tuple) -> dict:
    """name -> file spec of a damaged JSON file: `valid` with the number at `number_path` replaced, and worse."""
    def with_number(literal: str) -> str:
        text = json.dumps(valid)
        marker = "987654.25"  # a value no real file holds, swapped for the literal after dumping
        edited = json.loads(text)
        where = edited
        for key in number_path[:-1]:
            where = where[key]
        where[number_path[-1]] = float(marker)
        return json.dumps(edited).replace(marker, literal)
    return {"fifo": ("fifo",), "link to /dev/zero": ("link", "/dev/zero"), "directory": ("dir",),
            "symlink loop": ("loop",), "nested 100000 deep": ("text", "[" * 100000 + "]" * 100000),
            "object nested 100000 deep": ("text", '{"a":' * 100000 + "1" + "}" * 100000),
            "integer of 401 digits": ("text", with_number("1" + "0" * 400)),
            "integer of 5000 digits": ("text", with_number("9" * 5000)),
            "NaN": ("text", with_number("NaN")), "Infinity": ("text", with_number("-Infinity")),
            "1e400": ("text", with_number("1e400")), "not UTF-8": ("bytes", b'{"format": "\xff\xfe"}'),
            "truncated": ("text", json.dumps(valid)[:-3])}


def _json_cases(metadata: dict) -> list[Case]:
    cases = []
    metadata_with_arena = json.loads(json.dumps(metadata))
    metadata_with_arena.setdefault("memory", {})["arena_bytes"] = 4096
    database = {"format": "byoc-cutlass-tuning", "version": 1,
                "entries": {"sm90": {"gemm:plain": {"name": "kernel_a", "us": 12.5, "device": "GPU"}}}}
    readers = {
        "report": ("metadata.json", metadata_with_arena, ("memory", "arena_bytes"),
                   ["report", "{dir}/w", "-o", "{dir}/page.html"], "w/"),
        "tuning show": ("db.json", database, ("entries", "sm90", "gemm:plain", "us"),
                        ["tuning", "show", "{dir}/db.json"], ""),
        "tuning merge": ("db.json", database, ("entries", "sm90", "gemm:plain", "us"),
                         ["tuning", "merge", "{dir}/db.json", "-o", "{dir}/out.json"], ""),
    }
    for reader, (name, valid, number_path, argv, folder) in readers.items():
        for label, spec in _damaged_json(valid, number_path).items():
            cases.append(_case(f"json/{reader}", label, "run_cli",
                               {"argv": argv, "files": {f"{folder}{name}": spec}},
                               why=f"{name} must be a regular file of bounded, finite JSON", names=(name,)))
        cases.append(_case(f"json/{reader}", "valid", "run_cli",
                           {"argv": argv, "files": {f"{folder}{name}": ("text", json.dumps(valid))}}, expect="any"))
    # a library's embedded metadata (byoc.load, byoc inspect LIB.so): the same reader, from bytes
    for label, spec in _damaged_json(metadata_with_arena, ("memory", "arena_bytes")).items():
        if spec[0] in ("text", "bytes"):
            raw = spec[1].encode() if spec[0] == "text" else spec[1]
            cases.append(_case("json/library metadata", label, "run_library_metadata", {"raw": raw},
                               why="bounded, finite JSON", names=("model.so",)))
    cases.append(_case("json/library metadata", "valid", "run_library_metadata",
                       {"raw": json.dumps(metadata).encode()}, expect="any"))
    return cases


def _terminal_cases() -> list[Case]:
    hostile = {"format": "byoc-cutlass-tuning", "version": 1, "entries": {"sm90": {
        "gemm\x1b]0;owned\x07": {"name": "\x1b[2J\x1b[31mkernel\u202e", "us": 1.5, "device": "\x9b31mGPU\r"}}}}
    plain = {"format": "byoc-cutlass-tuning", "version": 1, "entries": {"sm90": {
        "gemm:plain": {"name": "kernel_a", "us": 1.5, "device": "NVIDIA H100"}}}}
    return [
        _case("terminal/escapes", "tuning show", "run_cli",
              {"argv": ["tuning", "show", "{dir}/db.json"], "files": {"db.json": ("text", json.dumps(hostile))}},
              expect="any"),
        _case("terminal/escapes", "tuning show (plain, valid)", "run_cli",
              {"argv": ["tuning", "show", "{dir}/db.json"], "files": {"db.json": ("text", json.dumps(plain))},
               "shown": "sm90  gemm:plain  kernel_a  1.50 us  (NVIDIA H100)"}, expect="any"),
        _case("terminal/escapes", "inspect MODEL.onnx", "run_cli",
              {"argv": ["inspect", "{dir}/evil.onnx"], "files": {"evil.onnx": ("model", "escaping")}}, expect="any"),
        _case("terminal/escapes", "build progress of a model file named with escapes", "run_cli",
              {"argv": ["build", "{dir}/evil\x1b[2J\x1b]0;owned\x07.onnx", "-c", "cpu", "-o", "{dir}/m.so",
                        "--dim", "batch=2"],
               "files": {"evil\x1b[2J\x1b]0;owned\x07.onnx": ("model", "named")}}, expect="any", timeout=120.0),
        _case("terminal/escapes", "inspect MODEL.onnx (plain, valid)", "run_cli",
              {"argv": ["inspect", "{dir}/m.onnx"], "files": {"m.onnx": ("model", "named")},
               "shown": "input  x: float32 [batch, 8]"}, expect="any"),
    ]


def run_build_expand(elements: int):
    """Build (not run) a model whose output is one constant expanded to `elements` float32
    values: the build must neither allocate it (the child's address space is 4 GiB) nor
    accept a tensor no machine holds."""
    import byoc

    from .libraries import expand_model
    model = expand_model(elements)
    os.environ["BYOC_CACHE_DIR"] = str(case_dir() / "cache")
    try:
        byoc.build(model, "cpu", workdir=str(case_dir() / "build"))
    except MemoryError:
        return Outcome("wrong", f"the build allocated the expanded constant ({elements} values)")
    return None


def _size_cases() -> list[Case]:
    """Sizes no machine holds, refused at build time naming the tensor; a constant of 8 GiB
    left for the run to compute (the build folds nothing that large) as positive control."""
    return [_case("sizes/build", "Expand to 2**42 float32 (16 TiB)", "run_build_expand", {"elements": 2**42},
                  why="no tensor past 4 TiB", names=("'big'",), timeout=120.0),
            _case("sizes/build", "Expand to 2**50 float32", "run_build_expand", {"elements": 2**50},
                  why="no tensor past 4 TiB", names=("'big'",), timeout=120.0),
            _case("sizes/build", "Expand to 2**31 float32 (8 GiB; valid, not folded)", "run_build_expand",
                  {"elements": 2**31}, expect="accept", timeout=120.0)]


def _alias_bomb(levels: int = 12) -> str:
    """A YAML config whose nested aliases expand to 9**levels values (a few hundred bytes)."""
    lines = ["target: cpu", "input_shapes:", '  a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]']
    lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines + [f"dims: {{batch: *a{levels - 1}}}", ""])


def _config_file_cases() -> list[Case]:
    """Build config files that are no config: a FIFO (opening it would wait for a writer
    forever), a directory, a link to /dev/zero, a file of 2 MiB, nested YAML aliases; and a
    valid one beside them."""
    model = {"m.onnx": ("model", "named")}
    refused = {"a FIFO": ("fifo",), "a directory": ("dir",), "a link to /dev/zero": ("link", "/dev/zero"),
               "2 MiB of comments": ("text", "target: cpu\n" + "# padding\n" * 200_000),
               "nested YAML aliases": ("text", _alias_bomb()), "a symlink loop": ("loop",)}
    cases = [_case("config/file", f"byoc build -c <{label}>", "run_cli",
                   {"argv": ["build", "{dir}/m.onnx", "-c", "{dir}/c.yaml", "-q", "-o", "{dir}/m.so"],
                    "files": {"c.yaml": spec, **model}}, why="a build config is a small regular YAML file",
                   names=("c.yaml",)) for label, spec in refused.items()]
    cases.append(_case("config/file", "byoc build -c <a valid file> (valid)", "run_cli",
                       {"argv": ["build", "{dir}/m.onnx", "-c", "{dir}/c.yaml", "-q", "-o", "{dir}/m.so",
                                 "--dim", "batch=2"], "files": {"c.yaml": ("text", "target: cpu\n"), **model}},
                       expect="accept", timeout=120.0))
    return cases


def generate(library_metadata: dict) -> list[Case]:
    """Every case (few enough that the default sample is all of them). `library_metadata`: a
    built library's, the valid file the json cases damage."""
    return (_integer_cases() + _dims_cases() + _launcher_cases() + _json_cases(library_metadata) + _terminal_cases()
            + _config_file_cases() + _size_cases())
