"""The example backend of docs/backends.md (tests/example_backend/) builds into a model on
the cpu target: it claims what its patterns take, its checks' refusals reach the partition
report, and the library it is linked into computes what NumPy does."""
import importlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc

RNG = np.random.default_rng(0)
BIAS = RNG.standard_normal(8).astype(np.float32)
WEIGHT = RNG.standard_normal((8, 4)).astype(np.float32)


@pytest.fixture(scope="module", autouse=True)
def example_backend():
    """The backend registered for this module's tests only: importing the package registers
    it, and the other tests see the shipped backends alone."""
    from byoc.backend import unregister_backend
    from byoc.target import TARGET_KINDS
    module = importlib.import_module("example_backend")  # tests/ is on sys.path under pytest
    importlib.reload(module)  # registers again should an earlier module have unregistered it
    yield module
    unregister_backend("example")
    TARGET_KINDS.pop("example", None)


def model_with_dynamic_batch() -> onnx.ModelProto:
    """y = relu(relu(x + bias) @ weight + gate) on inputs x [batch, 8] and gate [batch, 1]:
    the first add and relu are add_relu's; the second add broadcasts gate along the last
    axis, which add_relu's check refuses, so its relu goes to the relu pattern alone."""
    nodes = [helper.make_node("Add", ["x", "bias"], ["biased"]),
             helper.make_node("Relu", ["biased"], ["hidden"]),
             helper.make_node("MatMul", ["hidden", "weight"], ["projected"]),
             helper.make_node("Add", ["projected", "gate"], ["gated"]),
             helper.make_node("Relu", ["gated"], ["y"])]
    graph = helper.make_graph(nodes, "example_backend_model",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
                               helper.make_tensor_value_info("gate", TensorProto.FLOAT, ["batch", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              [numpy_helper.from_array(BIAS, "bias"), numpy_helper.from_array(WEIGHT, "weight")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def expected(x, gate):
    return np.maximum(np.maximum(x + BIAS, 0) @ WEIGHT + gate, 0)


def inputs(batch: int) -> dict:
    return {"x": RNG.standard_normal((batch, 8)).astype(np.float32),
            "gate": RNG.standard_normal((batch, 1)).astype(np.float32)}


def build(tmp_path, dims):
    config = {"target": "cpu", "backends": [{"example": {"unroll": 4}}]}
    return byoc.build(make_model_file(tmp_path), config=config, dims=dims, workdir=tmp_path / "build")


def make_model_file(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(model_with_dynamic_batch(), path)
    return path


def test_example_backend_claims_its_patterns_and_runs_on_the_cpu(tmp_path):
    library = build(tmp_path, {"batch": 3})
    report = library.report.to_text()
    example_row = next(line for line in report.splitlines() if line.startswith("example "))
    assert example_row.split()[1:5] == ["2", "2", "2", "1"]  # partitions, unique, composites, refused
    assert example_row.endswith("add x1, relu x2")
    assert "example.add_relu x1: bias of shape (3, 1) is neither the output's shape nor its last axis (4,) " \
           "(%y)" in report
    assert [f["backend"] for f in library.metadata["functions"]].count("example") == 2
    source = (tmp_path / "build" / "example.cc").read_text()
    assert "#pragma GCC unroll 4" in source and "bias[i % 8]" in source
    module = library.load()
    given = inputs(3)
    np.testing.assert_allclose(module.run(**given), expected(**given), rtol=1e-5, atol=1e-5)


def test_example_backend_in_a_library_of_shape_buckets(tmp_path):
    """One program per batch size, each with its own example partitions (symbols and
    objects of bucket 1 renamed by the build); a batch between buckets runs padded."""
    library = build(tmp_path, {"batch": [1, 4]})
    assert (tmp_path / "build" / "bucket1" / "example.cc").is_file()
    module = library.load()
    for batch in (1, 3, 4):
        given = inputs(batch)
        np.testing.assert_allclose(module.run(**given), expected(**given), rtol=1e-5, atol=1e-5)
