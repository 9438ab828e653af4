"""The build report page (byoc/report_page.py, `byoc report`): every build writes a
self-contained report.html that shows which backend runs each call, why refused pattern
matches were refused, and the memory plan; a built .so carries what it needs to be drawn
after its build directory is gone."""
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc.ir import FunctionBuilder
from byoc.report_page import render_page

FIXTURES = Path(__file__).parent / "fixtures"
BERT2_SHAPES = {"input_ids": (2, 16), "attention_mask": (2, 16), "token_type_ids": (2, 16)}


def _svgs(html: str) -> list:
    """Every inline SVG, parsed as XML (a malformed one raises)."""
    return [ElementTree.fromstring(svg) for svg in re.findall(r"<svg.*?</svg>", html, re.S)]


def _self_contained(html: str):
    without_namespace = html.replace("http://www.w3.org/2000/svg", "")
    assert "http:" not in without_namespace and "https:" not in without_namespace
    assert "<script" not in html and "<link" not in html and "<img" not in html


@pytest.fixture(scope="module")
def bert2_build(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("bert2") / "w"
    library = byoc.build(FIXTURES / "bert2.onnx", config="cpu", workdir=str(workdir), input_shapes=BERT2_SHAPES)
    return library, workdir


def test_every_build_writes_a_page_with_each_call_in_its_backends_lane(bert2_build):
    library, workdir = bert2_build
    html = (workdir / "report.html").read_text()
    _self_contained(html)
    graph_svg, memory_svg = _svgs(html)
    graph = library.metadata["graph"]
    calls = graph["calls"]
    launched = {f["symbol"]: f["calls"] for f in library.metadata["functions"]}
    assert sum(not c["view"] for c in calls) == sum(launched.values())
    # one box per call, labelled with its binding's position and the value it writes
    boxes = graph_svg.findall(".//{http://www.w3.org/2000/svg}rect[@class='call']")
    assert len(boxes) == len(calls)
    for call in calls:
        assert f"#{call['position']} " in html
    assert ">builtin</text>" in html  # the lane
    # the memory plan: one rectangle per planned tensor
    tensors = memory_svg.findall(".//{http://www.w3.org/2000/svg}rect[@class='tensor']")
    assert len(tensors) == len(graph["lifetimes"]) > 0
    assert "bert2.onnx" in html  # titled by the model


def test_the_graph_in_the_metadata_names_ops_values_and_planned_offsets(bert2_build):
    library, _ = bert2_build
    graph = library.metadata["graph"]
    names = [value["name"] for value in graph["values"]]
    assert names[:3] == ["input_ids", "attention_mask", "token_type_ids"]
    layer_norms = [s for s, f in graph["functions"].items() if "layer_norm" in f["ops"]]
    assert layer_norms and all(graph["functions"][s]["backend"] == "builtin" for s in layer_norms)
    for call in graph["calls"]:
        assert all(0 <= read < call["writes"] for read in call["reads"])  # values come before their readers
        assert graph["values"][call["writes"]]["call"] == graph["calls"].index(call)
    arena = library.metadata["memory"]["arena_bytes"]
    for lifetime in graph["lifetimes"]:
        assert 0 <= lifetime["offset"] and lifetime["offset"] + lifetime["bytes"] <= arena
        assert lifetime["first"] <= lifetime["last"]


def test_byoc_report_draws_a_library_after_its_build_directory_is_gone(bert2_build, tmp_path):
    library, _ = bert2_build
    deployed = library.export_library(tmp_path / "deploy" / "bert2.so")
    done = subprocess.run([sys.executable, "-m", "byoc", "report", str(deployed)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    page = tmp_path / "deploy" / "bert2.report.html"
    assert done.stdout.strip() == str(page)
    html = page.read_text()
    _self_contained(html)
    assert len(_svgs(html)) == 2
    chosen = tmp_path / "elsewhere.html"
    done = subprocess.run([sys.executable, "-m", "byoc", "report", str(deployed), "-o", str(chosen)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and chosen.read_text() == html


@pytest.mark.parametrize("case", ["no metadata", "bad json", "not a library", "unwritable output", "edited graph",
                                  "edited values"])
def test_byoc_report_names_what_it_cannot_read_or_write(case, tmp_path):
    target, extra = tmp_path / "w", []
    target.mkdir()
    if case == "bad json":
        (target / "metadata.json").write_text("{not json")
    elif case == "not a library":
        target = tmp_path / "model.so"
        target.write_bytes(b"\x7fELF" + b"\0" * 60)
    elif case == "unwritable output":
        (target / "metadata.json").write_text("{}")
        extra = ["-o", str(tmp_path / "missing" / "dir" / "page.html")]
    elif case == "edited graph":  # a call without its fields
        (target / "metadata.json").write_text(json.dumps({"graph": {"values": [], "calls": [{}], "functions": {}}}))
    elif case == "edited values":  # a call reading a value that is not there, and --onnx
        (target / "metadata.json").write_text(json.dumps({"graph": {
            "values": [{"name": "y", "shape": [1], "dtype": "float32", "call": 0}],
            "calls": [{"symbol": "f", "position": 0, "reads": [5], "weights": 0, "writes": 0}], "functions": {}}}))
        extra = ["--onnx", str(tmp_path / "p.onnx")]
    done = subprocess.run([sys.executable, "-m", "byoc", "report", str(target), *extra], capture_output=True,
                          text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("byoc: error:") and "Traceback" not in done.stderr
    expected = {"no metadata": "has no metadata.json", "bad json": "cannot read it as a build's metadata",
                "not a library": "model.so", "unwritable output": "--output",
                "edited graph": "its metadata is not what a byoc build writes",
                "edited values": "its metadata is not what a byoc build writes"}[case]
    assert expected in done.stderr


def test_refusals_show_their_reasons_and_names_from_models_are_escaped():
    """What a person looks for: why a pattern was refused, where. Model-chosen names and
    reasons reach the page escaped (no markup of theirs runs)."""
    hostile = "<script>alert(1)</script>"
    metadata = {
        "target": "cuda -arch=sm_90", "arch": "sm_90", "build_id": "0" * 16,
        "inputs": [{"name": hostile, "shape": [2, 770], "dtype": "float16"}],
        "outputs": [{"name": "y", "shape": [2, 64], "dtype": "float16"}],
        "functions": [{"symbol": "builtin_1", "backend": "builtin", "calls": 1}],
        "memory": {"arena_bytes": 4096, "workspace_bytes": 0},
        "partition_report": {"backends": {"builtin": {"partitions": 1, "unique_functions": 1, "composites": 0,
                                                      "ops_covered": {"matmul": 1}, "refused": 0},
                                          "cutlass": {"partitions": 0, "unique_functions": 0, "composites": 0,
                                                      "ops_covered": {}, "refused": 1}},
                             "refused": [{"backend": "cutlass", "pattern": "cutlass.dense", "op": "matmul",
                                          "reason": "K=770 not a multiple of 8", "node": hostile}]},
        "graph": {"values": [{"name": hostile, "shape": [2, 770], "dtype": "float16", "call": None},
                             {"name": "y", "shape": [2, 64], "dtype": "float16", "call": 0}],
                  "calls": [{"symbol": "builtin_1", "position": 0, "reads": [0], "weights": 1, "writes": 1,
                             "view": False}],
                  "functions": {"builtin_1": {"backend": "builtin", "ops": ["matmul"], "composites": [],
                                              "kernel": None}},
                  "lifetimes": []},
    }
    html = render_page(metadata, title=hostile)
    assert "<script" not in html and "&lt;script&gt;" in html
    assert "K=770 not a multiple of 8" in html and "cutlass.dense" in html
    _svgs(html)


def test_a_library_without_a_recorded_graph_still_gets_its_tables():
    """Libraries built before byoc recorded calls: the page says so and keeps the tables."""
    html = render_page({"target": "cpu", "inputs": [], "outputs": [], "functions": [],
                        "partition_report": {"backends": {"builtin": {"partitions": 3}}, "refused": []}},
                       title="old.so")
    assert "does not record its calls" in html and ">builtin<" not in html.split("<h2>What runs where")[1]
    assert "builtin" in html


def test_views_are_drawn_as_views_and_the_ir_module_build_is_titled():
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (4, 8), "float32")
        h = fb.call("softmax", x, axis=-1, name="activated")
        h = fb.call("reshape", h, shape=(8, 4), name="reshaped")
        fb.ret(fb.call("softmax", h, axis=-1, name="out"))
    library = byoc.build(fb.module(), config="cpu")
    graph = library.metadata["graph"]
    written = {graph["values"][c["writes"]]["name"]: c["view"] for c in graph["calls"]}
    assert written == {"activated": False, "reshaped": True, "out": False}
    html = render_page(library.metadata, title="IR module")
    assert html.count("view, no kernel") == 1 and 'stroke-dasharray="4 3"' in html
    np.testing.assert_allclose(library.load().run(x=np.ones((4, 8), np.float32)), np.full((8, 4), 0.25),
                               rtol=1e-6)


def _chromium():
    import shutil
    return next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium installed (Debian: apt install chromium)")
def test_the_page_renders_in_headless_chromium(bert2_build, tmp_path):
    """A real browser lays the page out and paints it: the screenshot is a PNG of the page's
    size, not blank."""
    _, workdir = bert2_build
    screenshot = tmp_path / "report.png"
    done = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000",
                           f"--screenshot={screenshot}", (workdir / "report.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a blank page compresses to a few KB


def test_the_partitioned_graph_as_onnx_for_a_model_viewer(bert2_build, tmp_path):
    """`byoc report --onnx`: one node per call, typed by its patterns or ops, in domain
    byoc.<backend>, the values between calls with their shapes; a valid ONNX model."""
    import onnx
    library, workdir = bert2_build
    target = tmp_path / "partitioned.onnx"
    done = subprocess.run([sys.executable, "-m", "byoc", "report", str(workdir), "-o", str(tmp_path / "r.html"),
                           "--onnx", str(target)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    model = onnx.load(target)
    onnx.checker.check_model(model)
    calls = library.metadata["graph"]["calls"]
    assert len(model.graph.node) == len(calls)
    assert {node.domain for node in model.graph.node} == {"byoc.builtin"}
    assert "layer_norm" in {node.op_type for node in model.graph.node}
    assert [o.name for o in model.graph.output] == [o["name"] for o in library.metadata["outputs"]]
    assert [i.name for i in model.graph.input] == list(BERT2_SHAPES)
    kernels = {a.name for node in model.graph.node for a in node.attribute}
    assert {"symbol", "binding", "ops"} <= kernels


def test_byoc_build_says_where_its_picture_is(tmp_path):
    mlp = str(FIXTURES / "mlp.onnx")
    kept = subprocess.run([sys.executable, "-m", "byoc", "build", mlp, "-c", "cpu", "-q", "--workdir",
                           str(tmp_path / "w"), "-o", str(tmp_path / "a.so")], capture_output=True, text=True)
    assert kept.returncode == 0, kept.stderr
    assert f"what runs where: {tmp_path / 'w' / 'report.html'}" in kept.stdout
    assert (tmp_path / "w" / "report.html").is_file()
    temporary = subprocess.run([sys.executable, "-m", "byoc", "build", mlp, "-c", "cpu", "-q",
                                "-o", str(tmp_path / "b.so")], capture_output=True, text=True)
    assert temporary.returncode == 0, temporary.stderr
    assert f"what runs where: byoc report {tmp_path / 'b.so'} draws it" in temporary.stdout
