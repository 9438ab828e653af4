"""The build as a pipeline of stages (byoc/pipeline.py): the list printed is the list run,
a stage's IR can be dumped, and what stages decide travels on the module."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc import pipeline
from byoc.cli import main as cli_main
from byoc.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures"


def test_the_printed_pipeline_is_the_list_the_driver_runs(capsys):
    assert cli_main(["build", "--print-pipeline"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in printed] == [stage.name for stage in pipeline.PIPELINE]
    assert printed[0].split()[:2] == ["0", "import"] and printed[-1].split()[1] == "plan_host"
    assert all(len(line.split()) > 2 for line in printed)  # each with what it does


def test_a_stage_added_to_the_list_is_printed_and_run(monkeypatch, capsys, tmp_path):
    seen = []

    def count_calls(mod, context):
        """Counts main's bindings (a stage a test inserts)."""
        seen.append(len(mod["main"].bindings))
        return mod.with_attrs(counted=len(seen))
    position = pipeline.stage_named("partition")
    stages = list(pipeline.PIPELINE)
    stages.insert(position, pipeline.Stage("count_calls", count_calls))
    monkeypatch.setattr(pipeline, "PIPELINE", stages)
    assert cli_main(["build", "--print-pipeline"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[position].split()[1:3] == ["count_calls", "Counts"]
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "w"),
                         dump_after=["count_calls"])
    assert len(seen) == 1 and seen[0] > 0
    dumped = (tmp_path / "w" / "ir" / f"{position:02d}_count_calls.ir").read_text()
    assert "counted=1" in dumped and "def @main" in dumped
    (shape,) = [tensor["shape"] for tensor in library.metadata["inputs"]]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert np.isfinite(library.load().run(x=x)[0]).all()


def test_dumps_after_any_stage_show_what_the_stage_recorded(tmp_path):
    byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path),
               dump_after=["simplify", "partition", "plan_host"])
    dumps = sorted(path.name for path in (tmp_path / "ir").iterdir())
    assert dumps == ["01_simplify.ir", f"{pipeline.stage_named('partition'):02d}_partition.ir",
                     f"{pipeline.stage_named('plan_host'):02d}_plan_host.ir"]
    simplified, partitioned, planned = [(tmp_path / "ir" / name).read_text() for name in dumps]
    # before partitioning, main calls ops; after, functions of the backends, and the report rides along
    assert "@builtin_" not in simplified and "matmul(" in simplified
    assert "@builtin_" in partitioned and "# partition_report: builtin:" in partitioned
    assert "# host_setup:" in planned and "# artifacts: 1: builtin (source" in planned


def test_an_unknown_stage_to_dump_names_the_stages(tmp_path):
    with pytest.raises(ConfigError, match=r"--dump-after partitoin: no such stage; expected one of import, "
                                          r"simplify, .*plan_host"):
        byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path), dump_after=["partitoin"])
    assert cli_main(["build", str(FIXTURES / "mlp.onnx"), "-c", "cpu", "--dump-after", "nope", "-q"]) != 0


def test_lower_stops_after_a_stage_and_starts_from_one(tmp_path):
    """The public door tests use instead of the builder's insides."""
    partitioned = pipeline.lower(FIXTURES / "mlp.onnx", "cpu", until="partition", workdir=tmp_path)
    assert set(partitioned.attrs) == {"output_names", "initializers", "partition_report"}
    generated = pipeline.lower(partitioned, "cpu", start="codegen", until="codegen", workdir=tmp_path)
    assert [artifact.backend for artifact in generated.attrs["artifacts"]] == ["builtin"]
    assert "artifacts" not in partitioned.attrs  # a stage returns a new module; its input is left alone
    final = pipeline.lower(FIXTURES / "mlp.onnx", "cpu", workdir=tmp_path)
    host = final.attrs["host_setup"]
    assert host.plan.calls and all(isinstance(ref, type(host.plan.calls[0]["results"][0]))
                                   for call in host.plan.calls for ref in call["args"] + call["results"])


def test_an_ir_module_given_to_build_is_not_changed(tmp_path):
    from byoc.ir import FunctionBuilder
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (2, 4), "float32")
        fb.ret(fb.call("relu", x))
    mod = fb.module()
    before = mod.script()
    byoc.build(mod, config="cpu", workdir=str(tmp_path))
    assert mod.script() == before and not mod.attrs


def test_lower_refuses_what_it_cannot_do_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"stage 'partition' comes before stage 'codegen'"):
        pipeline.lower(FIXTURES / "mlp.onnx", "cpu", start="codegen", until="partition", workdir=tmp_path)
    with pytest.raises(ConfigError, match=r"lower\(start='codegen'\): expected the IRModule .* got PosixPath"):
        pipeline.lower(FIXTURES / "mlp.onnx", "cpu", start="codegen", workdir=tmp_path)
    with pytest.raises(ConfigError, match="dims"):
        pipeline.lower(FIXTURES / "mlp.onnx", "cpu", dims={"batch": 0.5}, workdir=tmp_path)
    with pytest.raises(ConfigError, match="no pipeline stage 'partitoin'"):
        pipeline.lower(FIXTURES / "mlp.onnx", "cpu", until="partitoin", workdir=tmp_path)


@pytest.mark.parametrize("value", [5, [1], {"partition": 1}, [None]])
def test_dump_after_that_names_no_stages_is_refused_by_name(value, tmp_path):
    with pytest.raises(ConfigError, match=r"dump_after=.*: expected a stage name or a list of them"):
        byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path), dump_after=value)


def test_one_stage_name_given_as_a_string_is_one_stage(tmp_path):
    byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path), dump_after="partition")
    assert [path.name for path in (tmp_path / "ir").iterdir()] == \
        [f"{pipeline.stage_named('partition'):02d}_partition.ir"]


def test_a_stage_without_a_docstring_prints_without_one(monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "PIPELINE", list(pipeline.PIPELINE) + [pipeline.Stage("bare", lambda mod, c: mod)])
    assert cli_main(["build", "--print-pipeline"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split() == [str(len(pipeline.PIPELINE) - 1), "bare"]


def test_a_module_attribute_that_is_no_value_and_no_build_state_still_fails_to_print():
    """Only the stages' own records print as comments; anything else must be an attribute
    value, or printing names it (a parse would silently drop a comment)."""
    from byoc.ir import FunctionBuilder
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (2,), "float32")
        fb.ret(fb.call("relu", x))
    mod = fb.module().with_attrs(odd=object())
    with pytest.raises(TypeError, match="attribute 'odd'"):
        mod.script()
    from byoc.report import PartitionReport
    assert "# partition_report: ; 0 refused matches" in fb.module().with_attrs(partition_report=PartitionReport()).script()
