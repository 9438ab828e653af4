"""The `byoc` command line: subcommands work, and user errors never show a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc.cli import main, parse_input_shapes, UsageError
from byoc.ir import assert_structural_equal, parse_module

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
MLP = str(FIXTURES / "mlp.onnx")

# (arguments, a piece of the message the user must see); each exits 2 with no traceback
USER_ERRORS = {
    "missing file": (["import", str(FIXTURES / "no_such_model.onnx")], "does not exist"),
    "truncated model": (["import", str(FIXTURES / "bad_truncated.onnx")], "not a valid ONNX model"),
    "unsupported ops": (["import", str(FIXTURES / "bad_unsupported.onnx")], "DFT (first node 'dft_0')"),
    "bad --input-shape": (["import", MLP, "--input-shape", "x:4,64"], "expected NAME=D1,D2"),
}


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- --input-shape syntax --------------------------------------------------------------

def test_parse_input_shapes():
    assert parse_input_shapes(["x=1,8", "mask=2, 3", "scalar="]) == {
        "x": (1, 8), "mask": (2, 3), "scalar": ()}
    assert parse_input_shapes(["a=b=4"]) == {"a=b": (4,)}  # ONNX names may contain '='


@pytest.mark.parametrize("spec", ["x", "=1,2", "x=1,,2", "x=1.5", "x=-1", "x=a"])
def test_parse_input_shapes_rejects(spec):
    with pytest.raises(UsageError, match="--input-shape"):
        parse_input_shapes([spec])


# ---- subcommands --------------------------------------------------------------------------

def test_import_prints_ir_text_that_parses_back(capsys):
    code, out, err = run_cli(capsys, "import", MLP)
    assert code == 0, err
    assert out.count("def @main") == 1
    assert_structural_equal(parse_module(out), byoc.from_onnx(MLP))


def test_import_writes_file(capsys, tmp_path):
    target = tmp_path / "mlp.ir"
    code, out, err = run_cli(capsys, "import", MLP, "-o", str(target))
    assert code == 0, err
    assert str(target) in out
    assert_structural_equal(parse_module(target.read_text()), byoc.from_onnx(MLP))


def test_import_with_input_shapes_fixes_dynamic_dims(capsys):
    shape_options = []
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        shape_options += ["--input-shape", f"{name}=1,8"]
    code, out, err = run_cli(capsys, "import", str(FIXTURES / "bert2.onnx"), *shape_options)
    assert code == 0, err
    assert "Tensor[(1, 8), int64]" in out


def test_ops_lists_ir_ops_with_category_and_onnx_types(capsys):
    code, out, err = run_cli(capsys, "ops")
    assert code == 0, err
    lines = out.splitlines()
    matmul_line = next(line for line in lines if line.split()[:1] == ["matmul"])
    assert byoc.ir.get_op("matmul").category in matmul_line
    assert "ONNX op types" in out and "Gemm" in out and "LayerNormalization" in out


def test_run_matches_expected_outputs_and_saves(capsys, tmp_path):
    saved = tmp_path / "out.npz"
    code, out, err = run_cli(capsys, "run", MLP, "--inputs", str(FIXTURES / "mlp.npz"), "--save", str(saved))
    assert code == 0, err
    assert "y: float32 (4, 32)" in out
    expected = np.load(FIXTURES / "mlp.npz")["out_y"]
    np.testing.assert_allclose(np.load(saved)["y"], expected, rtol=1e-4, atol=1e-5)


def test_run_takes_dynamic_dims_from_the_inputs(capsys, tmp_path):
    fixture = np.load(FIXTURES / "bert2.npz")
    inputs = tmp_path / "inputs.npz"
    # plain names (no in_ prefix) and a shorter sequence than the fixture's
    np.savez(inputs, **{key[len("in_"):]: value[:, :8] for key, value in fixture.items() if key.startswith("in_")})
    code, out, err = run_cli(capsys, "run", str(FIXTURES / "bert2.onnx"), "--inputs", str(inputs))
    assert code == 0, err
    assert "last_hidden_state: float32 (2, 8, 128)" in out
    assert "pooler_output: float32 (2, 128)" in out


# ---- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(USER_ERRORS))
def test_user_error_is_one_line_without_traceback(capsys, case):
    argv, message = USER_ERRORS[case]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.startswith("byoc: error: ") and message in err
    assert "Traceback" not in err + out


def test_unsupported_ops_error_lists_every_op_type(capsys):
    code, _, err = run_cli(capsys, "import", str(FIXTURES / "bad_unsupported.onnx"))
    assert code == 2
    for op_type in ("DFT", "Det", "Einsum"):
        assert op_type in err


@pytest.mark.parametrize("argv, message", [
    (["import", str(FIXTURES / "bert2.onnx")], "--input-shape NAME="),  # dynamic dims, no shape
    (["run", MLP, "--inputs", str(FIXTURES / "no_such_inputs.npz")], "no_such_inputs.npz"),
    (["run", MLP, "--inputs", str(FIXTURES / "bert2.npz")], "one array per model input"),
    (["run", MLP, "--inputs", MLP], "not a readable .npz"),
])
def test_more_user_errors(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.startswith("byoc: error: ") and message in err
    assert "Traceback" not in err


def test_bad_command_line_exits_2(capsys):
    assert run_cli(capsys, "frobnicate")[0] == 2
    assert run_cli(capsys, "run", MLP)[0] == 2  # --inputs is required
    assert run_cli(capsys)[0] == 2


def test_help_exits_0(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for command in ("import", "ops", "run"):
        assert command in out


def test_internal_error_hides_traceback_unless_debug(capsys, monkeypatch):
    def broken_list_ops():
        raise ZeroDivisionError("simulated bug")

    monkeypatch.setattr(byoc.ir, "list_ops", broken_list_ops)
    code, _, err = run_cli(capsys, "ops")
    assert code == 1
    assert "internal error: ZeroDivisionError: simulated bug" in err and "--debug" in err
    assert "Traceback" not in err

    for argv in (["--debug", "ops"], ["ops", "--debug"]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 1
        assert "Traceback" in err and "simulated bug" in err


# ---- the real process -------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(USER_ERRORS))
def test_python_dash_m_byoc_user_errors(case):
    argv, message = USER_ERRORS[case]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    completed = subprocess.run([sys.executable, "-m", "byoc", *argv], cwd=REPO, env=environment,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2, completed.stderr
    assert message in completed.stderr
    assert "Traceback" not in completed.stderr + completed.stdout


def test_build_writes_where_the_config_says_unless_told(capsys, tmp_path):
    """The config's `output` is where `byoc build` writes the library; -o wins over it."""
    import yaml
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"target": "cpu", "output": str(tmp_path / "from_config.so")}))
    code, out, err = run_cli(capsys, "build", MLP, "-c", str(config), "-q", "--workdir", str(tmp_path / "w"))
    assert code == 0, err
    assert (tmp_path / "from_config.so").is_file() and "from_config.so" in out
    code, out, err = run_cli(capsys, "build", MLP, "-c", str(config), "-q", "-o", str(tmp_path / "given.so"),
                             "--workdir", str(tmp_path / "w"))
    assert code == 0 and (tmp_path / "given.so").is_file(), err


def test_build_with_relative_output_and_workdir_then_inspect(capsys, tmp_path, monkeypatch):
    """Paths as a user types them, relative to the current directory (ninja runs elsewhere)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "build", MLP, "-c", "cpu", "-o", "mlp.so", "--workdir", "kept")
    assert code == 0, err
    assert (tmp_path / "mlp.so").is_file() and (tmp_path / "kept" / "build.ninja").is_file()
    code, out, err = run_cli(capsys, "inspect", "mlp.so")
    assert code == 0, err
    assert "memory: planned" in out and "lower bound" in out and "no reuse" in out
    assert "backend      partitions  unique" in out  # the partition report travels in the library
    code, out, err = run_cli(capsys, "inspect", "--json", "mlp.so")
    assert code == 0, err
    import json
    assert json.loads(out)["partition_report"]["backends"]["builtin"]["partitions"] > 0


def test_inspect_an_onnx_model_shows_its_interface_before_building(capsys):
    """`byoc inspect MODEL.onnx`: inputs with their named dims (all of them at once, with the
    inputs that carry each), outputs, op counts and the op types byoc does not import."""
    import json
    code, out, err = run_cli(capsys, "inspect", str(FIXTURES / "bert2.onnx"))
    assert code == 0, err
    assert "input  input_ids: int64 [batch, sequence]" in out
    assert "output last_hidden_state: float32 [batch, sequence, 128]" in out
    assert "batch (input_ids[0], attention_mask[0], token_type_ids[0])" in out
    assert "--input-shape input_ids=1,1" in out and "MatMul x16" in out and "not imported" not in out
    code, out, err = run_cli(capsys, "inspect", "--json", str(FIXTURES / "bert2.onnx"))
    described = json.loads(out)
    assert described["named_dims"]["sequence"] == ["input_ids[1]", "attention_mask[1]", "token_type_ids[1]"]
    assert described["opsets"] == {"ai.onnx": 17} and described["unsupported"] == []
    code, out, err = run_cli(capsys, "inspect", str(FIXTURES / "bad_unsupported.onnx"))
    assert code == 0 and "not imported by byoc: DFT, Det, Einsum" in out
    code, out, err = run_cli(capsys, "inspect", str(FIXTURES / "bad_truncated.onnx"))
    assert code == 2 and "is not a valid ONNX model" in err and "Traceback" not in err


def test_inspect_a_fifo_does_not_wait_for_a_writer(tmp_path):
    """A FIFO named like a model is refused at once (reading it to sniff the file's kind
    would wait for a writer forever); run in a subprocess so that a hang shows as a failure."""
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    run = subprocess.run([sys.executable, "-m", "byoc", "inspect", str(fifo)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2 and "not a regular file" in run.stderr and "Traceback" not in run.stderr


def test_build_shows_its_progress_on_stderr_unless_quiet(capsys, tmp_path):
    """Stages and ninja's [n/m] compile lines reach stderr as the build goes (plain lines,
    as a CI log keeps them); --quiet leaves only the result on stdout."""
    code, out, err = run_cli(capsys, "build", MLP, "-c", "cpu", "-o", str(tmp_path / "a.so"),
                             "--workdir", str(tmp_path / "a"))
    assert code == 0, err
    for stage in ("imported:", "simplified:", "partitioned:", "code generated:", "compiling 10 units"):
        assert f"] {stage}" in err, err
    assert err.startswith("byoc: [") and "wrote " in out
    code, out, err = run_cli(capsys, "build", MLP, "-c", "cpu", "-q", "-o", str(tmp_path / "b.so"),
                             "--workdir", str(tmp_path / "b"))
    assert code == 0 and "byoc: [" not in err and "wrote " in out


# ---- built libraries and files that are not what a command expects ----------------------------

@pytest.fixture(scope="module")
def mlp_library(tmp_path_factory):
    """mlp built for cpu once for this module's tests."""
    root = tmp_path_factory.mktemp("mlp_library")
    library = byoc.build(MLP, config="cpu", workdir=str(root / "w"))
    return str(library.export_library(root / "mlp.so"))


def test_run_library_refuses_inputs_it_cannot_take(capsys, tmp_path, mlp_library):
    import _ctypes
    import shutil

    x = np.load(FIXTURES / "mlp.npz")["in_x"]
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "big_endian.npz", x=x.astype(x.dtype.newbyteorder("S")))
    np.savez(tmp_path / "uint16.npz", x=x.astype(np.uint16))
    not_byoc = shutil.copy(_ctypes.__file__, tmp_path / "not_byoc.so")  # a .so byoc did not build
    cases = [
        ([mlp_library, "--inputs", str(tmp_path / "x.npy")], "is a single .npy array; expected an .npz archive"),
        ([mlp_library, "--inputs", str(tmp_path / "big_endian.npz")], "input 'x': dtype >f4 is not in native byte order"),
        ([mlp_library, "--inputs", str(tmp_path / "uint16.npz")], "input 'x': dtype uint16 is not supported; expected float32"),
        ([str(not_byoc), "--inputs", str(FIXTURES / "mlp.npz")], "not_byoc.so: not a byoc library"),
        ([MLP, "--inputs", str(tmp_path / "x.npy")], "x.npy' is a single .npy array"),
        ([mlp_library, "--inputs", str(FIXTURES / "mlp.npz"), "--input-shape", "x=2,64"],
         "--input-shape and --dim are for an .onnx model"),
    ]
    for argv, message in cases:
        code, out, err = run_cli(capsys, "run", *argv)
        assert code == 2, (argv, err)
        assert err.startswith("byoc: error: ") and message in err, err
        assert "Traceback" not in err + out


def test_run_library_prints_latency_percentiles_and_compares_with_expected_outputs(capsys, tmp_path,
                                                                                    mlp_library):
    code, out, err = run_cli(capsys, "run", mlp_library, "--inputs", str(FIXTURES / "mlp.npz"), "--repeat", "7")
    assert code == 0, err
    assert "latency over 7 runs: p50 " in out and ", p90 " in out and ", p99 " in out
    # the fixture carries its expected output (out_y): how far the library is from it
    line = next(line for line in out.splitlines() if line.startswith("y: max |got - expected|"))
    assert float(line.rsplit(" ", 1)[1]) < 1e-4
    # an archive without expected outputs: no comparison
    np.savez(tmp_path / "inputs.npz", x=np.load(FIXTURES / "mlp.npz")["in_x"])
    code, out, err = run_cli(capsys, "run", mlp_library, "--inputs", str(tmp_path / "inputs.npz"), "--repeat", "1")
    assert code == 0 and "expected" not in out, err
    code, out, err = run_cli(capsys, "run", mlp_library, "--inputs", str(FIXTURES / "mlp.npz"), "--repeat", "0")
    assert code == 2 and "--repeat 0: expected a number of runs >= 1" in err


def test_version():
    done = subprocess.run([sys.executable, "-m", "byoc", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("byoc ")


@pytest.mark.parametrize("library", [False, True])
def test_run_save_reports_the_file_numpy_wrote(capsys, tmp_path, mlp_library, library):
    model = mlp_library if library else MLP
    code, out, err = run_cli(capsys, "run", model, "--inputs", str(FIXTURES / "mlp.npz"), "--save", str(tmp_path / "out"))
    assert code == 0, err
    assert f"wrote {tmp_path / 'out.npz'}\n" in out and (tmp_path / "out.npz").is_file()


def test_build_config_that_is_a_binary_file(capsys, tmp_path):
    code, out, err = run_cli(capsys, "build", MLP, "-c", MLP, "-o", str(tmp_path / "mlp.so"))
    assert code == 2
    assert err.startswith("byoc: error: ") and f"{MLP!r} is not a YAML text file" in err
    assert "Traceback" not in err + out


def test_input_shape_hint_only_for_model_shape_errors(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("bogus: 1\n")
    code, _, err = run_cli(capsys, "build", MLP, "-c", str(config), "-o", str(tmp_path / "mlp.so"))
    assert code == 2 and "unknown key(s) ['bogus']" in err
    assert "--input-shape" not in err  # the config's key list mentions input_shapes: no hint for that
    code, _, err = run_cli(capsys, "import", str(FIXTURES / "bert2.onnx"))
    assert code == 2 and "dynamic dims" in err
    assert "(on the command line: --input-shape NAME=D1,D2,... or --dim NAME=SIZE)" in err


def test_dim_sets_a_named_dim_in_every_input(capsys, tmp_path):
    """--dim batch=2 --dim sequence=16 fixes bert2's three inputs at once (onnxruntime's
    free dimension overrides); the built library runs the fixture's arrays; a dim no input
    declares, a bad size and --dim on a built library are usage errors that say so."""
    library = str(tmp_path / "bert2.so")
    code, out, err = run_cli(capsys, "build", str(FIXTURES / "bert2.onnx"), "-c", "cpu", "-q", "--dim", "batch=2",
                             "--dim", "sequence=16", "-o", library)
    assert code == 0, err
    code, out, err = run_cli(capsys, "run", library, "--inputs", str(FIXTURES / "bert2.npz"))
    assert code == 0 and "last_hidden_state: float32 (2, 16, 128)" in out, err
    code, out, err = run_cli(capsys, "import", str(FIXTURES / "bert2.onnx"), "--dim", "batch=1", "--dim", "sequence=4",
                             "--input-shape", "input_ids=3,4")
    assert code == 0 and "%input_ids: Tensor[(3, 4), int64]" in out and "%attention_mask: Tensor[(1, 4), int64]" in out
    code, out, err = run_cli(capsys, "build", str(FIXTURES / "bert2.onnx"), "-c", "cpu", "--dim", "batchh=2")
    assert code == 2 and "dims names ['batchh'], which no model input declares" in err and "--dim NAME=SIZE" in err
    code, out, err = run_cli(capsys, "build", str(FIXTURES / "bert2.onnx"), "-c", "cpu", "--dim", "batch=-1")
    assert code == 2 and "--dim 'batch=-1': expected NAME=SIZE" in err
    code, out, err = run_cli(capsys, "run", library, "--inputs", str(FIXTURES / "bert2.npz"), "--dim", "batch=2")
    assert code == 2 and "--input-shape and --dim are for an .onnx model" in err


def test_dim_with_several_sizes_builds_shape_buckets_that_inspect_lists(capsys, tmp_path):
    """byoc build --dim batch=1,2: one library, a program per size; byoc inspect lists the
    buckets; byoc run runs the fixture's arrays (batch 2); --dim lists are for build only."""
    library = str(tmp_path / "bert2.so")
    code, out, err = run_cli(capsys, "build", str(FIXTURES / "bert2.onnx"), "-c", "cpu", "-q", "--dim", "batch=1,2",
                             "--dim", "sequence=16", "-o", library)
    assert code == 0, err
    code, out, err = run_cli(capsys, "inspect", library)
    assert code == 0 and "2 shape buckets" in out and "batch=2, sequence=16: input_ids (2, 16)" in out, err
    # the interface with its named axes: batch pads (any size up to 2), the sequence is fixed
    assert "input  input_ids: int64 (batch 1..2, 16)" in out and \
        "output last_hidden_state: float32 (batch 1..2, 16, 128)" in out, out
    code, out, err = run_cli(capsys, "run", library, "--inputs", str(FIXTURES / "bert2.npz"))
    assert code == 0 and "last_hidden_state: float32 (2, 16, 128)" in out, err
    code, out, err = run_cli(capsys, "import", str(FIXTURES / "bert2.onnx"), "--dim", "batch=1,2")
    assert code == 2 and "--dim 'batch=1,2': expected NAME=SIZE" in err
    code, out, err = run_cli(capsys, "build", str(FIXTURES / "bert2.onnx"), "-c", "cpu", "--dim", "batch=1,x")
    assert code == 2 and "batch=1,8,32 for one program per size" in err
    code, out, err = run_cli(capsys, "build", str(FIXTURES / "bert2.onnx"), "-c", "cpu", "--dim", "batch=4..1")
    assert code == 2 and "batch=1..32 (its ends and the powers of two between)" in err


def test_a_dim_range_makes_buckets_at_its_ends_and_the_powers_of_two_between():
    from byoc.cli.common import parse_dims
    from byoc.config import load_config
    assert parse_dims(["batch=1..32", "sequence=128,512"], several=True) == \
        {"batch": [1, 2, 4, 8, 16, 32], "sequence": [128, 512]}
    assert load_config({"target": "cpu", "dims": {"sequence": "3..20"}}).dims == {"sequence": [3, 4, 8, 16, 20]}
    assert load_config({"target": "cpu", "dims": {"batch": "8..8"}}).dims == {"batch": [8]}


def test_inspect_a_library_with_no_planned_tensors(capsys, tmp_path):
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    library = byoc.build(model, config="cpu", workdir=str(tmp_path / "w")).export_library(tmp_path / "relu.so")
    code, out, err = run_cli(capsys, "inspect", str(library))
    assert code == 0, err
    assert "memory: no planned tensors" in out and "None" not in out


def test_byoc_warnings_read_like_its_errors(capsys, tmp_path, monkeypatch):
    not_a_directory = tmp_path / "cache_file"
    not_a_directory.write_text("")
    monkeypatch.setenv("BYOC_CACHE_DIR", str(not_a_directory))
    code, out, err = run_cli(capsys, "build", MLP, "-c", "cpu", "-o", str(tmp_path / "mlp.so"))
    assert code == 0, err
    assert f"byoc: warning: byoc's object cache {not_a_directory}" in err and "CacheWarning" not in err
    # every ByocWarning reads so (the workdir lock's and the tuner's too); others as Python prints them
    import warnings
    from byoc.cli import _show_warning
    shown = []
    show = _show_warning(lambda message, category, *rest: shown.append(category))
    show("cannot lock", byoc.ByocWarning, "build.py", 1)
    show("something else", UserWarning, "build.py", 1)
    assert "byoc: warning: cannot lock" in capsys.readouterr().err and shown == [UserWarning]
    assert warnings.showwarning is not show  # main() put Python's back


def test_run_blames_the_inputs_file_for_an_array_that_does_not_fit(capsys, tmp_path):
    """`byoc run model.onnx --inputs f.npz` with a wrong-shaped array names the file and the
    array (it used to speak of --input-shape, which the user never gave)."""
    x = np.load(FIXTURES / "mlp.npz")["in_x"]
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=x[:, :10])
    code, out, err = run_cli(capsys, "run", MLP, "--inputs", str(bad))
    assert code == 2 and f"--inputs {str(bad)!r}: array 'x' has shape (4, 10); the model declares (4, 64)" in err
    assert "--input-shape" not in err


def test_a_terminal_build_shows_progress_at_once_and_every_few_seconds(tmp_path):
    """Under a pseudo-terminal, as a person runs it: the first progress line within 2 s of
    starting, then no silence longer than 5 s while one compile takes 7 s (a launcher that
    holds host.cc back stands in for a long nvcc compile)."""
    import pty
    import time
    launcher = tmp_path / "slow_launcher.sh"
    launcher.write_text('#!/bin/sh\ncase "$*" in *host.cc*) sleep 7;; esac\nexec "$@"\n')
    launcher.chmod(0o755)
    # one compile at a time: no other unit's line breaks the 7 s silence, however loaded the machine
    config = tmp_path / "cpu_one_job.yaml"
    config.write_text("target: cpu\nbackends: [builtin]\ncompile_jobs: 1\n")
    env = {**os.environ, "BYOC_COMPILER_LAUNCHER": str(launcher), "BYOC_CACHE_DIR": str(tmp_path / "cache")}
    primary, secondary = pty.openpty()
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "byoc", "build", MLP, "-c", str(config), "-o",
                                str(tmp_path / "mlp.so")], stdout=secondary, stderr=secondary, env=env)
    os.close(secondary)
    lines, pending = [], b""
    while True:
        try:
            data = os.read(primary, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            lines.append((time.monotonic() - started, line.decode(errors="replace").rstrip("\r")))
    os.close(primary)
    assert process.wait(timeout=120) == 0, lines
    progress = [(at, text) for at, text in lines if text.startswith("byoc: [")]
    assert progress and progress[0][0] < 2.0, progress[:2]
    assert "building mlp.onnx for cpu" in progress[0][1]
    times = [at for at, _ in progress]
    assert max(b - a for a, b in zip(times, times[1:])) <= 5.5, progress
    assert any("still working" in text for _, text in progress)  # the 7 s compile was reported while it ran


def test_inspect_names_the_sizes_of_a_dim_that_does_not_pad():
    """A dim whose sizes between buckets cannot be padded: inspect lists the buckets' own
    extents on that axis (16|32), not the first bucket's."""
    from byoc.cli.inspect import _bucketed_shape
    variants = [{"dims": {"batch": b, "sequence": s},
                 "inputs": [{"shape": [b, s], "axis_dims": ["batch", None]}]} for b in (1, 4) for s in (16, 32)]
    dims = {"batch": {"paddable": True, "range": [1, 4], "sizes": [1, 4]},
            "sequence": {"paddable": False, "sizes": [16, 32], "why_not": "..."}}
    assert _bucketed_shape("inputs", 0, variants, dims) == "(batch 1..4, 16|32)"
    assert _bucketed_shape("inputs", 0, variants[:1], dims) is None  # one program: its own shape
    # metadata byoc does not write (buckets of different ranks, a dim of no size): the plain shape
    uneven = [variants[0], {"dims": {"batch": 0}, "inputs": [{"shape": [4], "axis_dims": ["batch"]}]}]
    assert _bucketed_shape("inputs", 0, uneven, dims) is None
    zero = [{**v, "dims": {"batch": 0}} for v in variants[:2]]
    assert _bucketed_shape("inputs", 0, zero, dims) == "(1, 16|32)"


def test_inputs_that_are_a_fifo_are_refused_without_blocking(capsys, tmp_path):
    import os
    fifo = tmp_path / "inputs.npz"
    os.mkfifo(fifo)
    code, _, err = run_cli(capsys, "run", MLP, "--inputs", str(fifo))
    assert code == 2 and "is not a regular file; expected an .npz archive" in err
