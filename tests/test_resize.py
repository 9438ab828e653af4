"""Resize, which byoc evaluates at import time on constants (onnx_resize.py): every ONNX
backend conformance case of Resize with all its inputs given as constants, against the
case's expected output; a Resize of a run-time tensor is refused naming the node."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from onnx_node_cases import node_cases_dir


def _resize_cases():
    folder = node_cases_dir()
    if folder is None:
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith("test_resize_"))


def _frozen(case):
    """The case's model with every input an initializer holding data set 0's value."""
    model = onnx.load(str(case / "model.onnx"))
    data_set = case / "test_data_set_0"
    values = []
    for index, _ in enumerate(model.graph.input):
        tensor = onnx.TensorProto()
        tensor.ParseFromString((data_set / f"input_{index}.pb").read_bytes())
        values.append(numpy_helper.to_array(tensor))
    for info, value in zip(model.graph.input, values):
        model.graph.initializer.append(numpy_helper.from_array(value, info.name))
    del model.graph.input[:]
    expected = onnx.TensorProto()
    expected.ParseFromString((data_set / "output_0.pb").read_bytes())
    return model, numpy_helper.to_array(expected)


@pytest.mark.parametrize("case", _resize_cases(), ids=lambda p: p.name)
def test_resize_conformance_case_with_constant_inputs(case):
    model, expected = _frozen(case)
    try:
        mod = byoc.from_onnx(model)
    except byoc.UnsupportedOpError as error:  # antialias, tf_crop_and_resize: refused by name
        assert "antialias" in str(error) or "tf_crop_and_resize" in str(error), error
        pytest.skip(str(error))
    got = byoc.interpret(mod)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_resize_cases_are_found():
    assert len(_resize_cases()) >= 30


def test_resize_of_a_run_time_tensor_is_refused_naming_the_node():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="upsample", mode="nearest")
    graph = helper.make_graph([node], "g", [x], [y], [scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(byoc.UnsupportedOpError, match="Resize node 'upsample': input 'X' is computed at run time"):
        byoc.from_onnx(model)
