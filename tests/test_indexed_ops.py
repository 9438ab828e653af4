"""GatherND and ScatterND as byoc imports them (onnx_indexed_ops.py): constant index tuples
linearized at import time into one gather, tuples computed at run time linearized by
elementwise ops (an out-of-range one reported by the run), ScatterND's updates applied in
ONNX's order. Each is checked against onnxruntime; the conformance cases are in
test_onnx_conformance.py."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _onnxruntime(model, feeds):
    import onnxruntime
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _gather_nd_model(data_shape, index_shape, out_shape, batch_dims, constant_indices=None):
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, data_shape)
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)
    inputs, initializers = [data], []
    if constant_indices is None:
        inputs.append(helper.make_tensor_value_info("indices", TensorProto.INT64, index_shape))
    else:
        initializers.append(numpy_helper.from_array(constant_indices, "indices"))
    node = helper.make_node("GatherND", ["data", "indices"], ["out"], batch_dims=batch_dims)
    return _model([node], inputs, [out], initializers)


CASES = [  # data shape, indices (with negative components), batch_dims, output shape
    ((2, 16), np.array([[[[0, 3], [1, -1]]]]), 0, (1, 1, 2)),
    ((3, 4, 5), np.array([[2, -4], [0, 1], [1, 3]]), 0, (3, 5)),
    ((3, 4, 5), np.array([[1], [-1], [0]]), 1, (3, 5)),
    ((2, 3, 4), np.array([[[1, 2], [0, -1]], [[2, 0], [1, 1]]]), 1, (2, 2)),
]


@pytest.mark.parametrize("data_shape, indices, batch_dims, out_shape", CASES)
def test_gather_nd_with_constant_indices_is_one_gather(data_shape, indices, batch_dims, out_shape):
    model = _gather_nd_model(data_shape, indices.shape, out_shape, batch_dims, constant_indices=indices)
    data = np.random.default_rng(0).standard_normal(data_shape).astype(np.float32)
    mod = byoc.from_onnx(model)
    assert str(mod).count("gather(") == 1 and "where(" not in str(mod)
    np.testing.assert_array_equal(byoc.interpret(mod, data=data), _onnxruntime(model, {"data": data}))


@pytest.mark.parametrize("data_shape, indices, batch_dims, out_shape", CASES)
def test_gather_nd_with_run_time_indices_matches_onnxruntime_when_built(data_shape, indices, batch_dims,
                                                                        out_shape, tmp_path):
    model = _gather_nd_model(data_shape, indices.shape, out_shape, batch_dims)
    data = np.random.default_rng(1).standard_normal(data_shape).astype(np.float32)
    feeds = {"data": data, "indices": indices.astype(np.int64)}
    expected = _onnxruntime(model, feeds)
    np.testing.assert_array_equal(byoc.interpret(byoc.from_onnx(model), **feeds), expected)
    module = byoc.build(model, "cpu", workdir=str(tmp_path / "build")).load()
    np.testing.assert_array_equal(module.run(**feeds), expected)
    # a tuple with one component out of range (its linear position would be in range) is
    # reported by the run, not read from elsewhere
    bad = feeds["indices"].copy()
    bad.reshape(-1, bad.shape[-1])[0, -1] = data_shape[batch_dims + bad.shape[-1] - 1]
    with pytest.raises(byoc.ByocError, match="out of range|index"):
        module.run(data=data, indices=bad)
    np.testing.assert_array_equal(module.run(**feeds), expected)  # the module stays usable


def test_gather_nd_constant_index_out_of_range_is_a_model_error():
    model = _gather_nd_model((2, 3), (1, 2), (1,), 0, constant_indices=np.array([[1, 3]]))
    with pytest.raises(byoc.ModelError, match=r"indices\[0, 1\] = 3 is out of range for a dim of size 3"):
        byoc.from_onnx(model)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_applies_updates_in_order_with_repeated_positions(reduction):
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [4, 3])
    updates = helper.make_tensor_value_info("updates", TensorProto.FLOAT, [4, 3])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 3])
    # row 1 written three times, row -1 (3) once; onnxruntime refuses repeats without a reduction
    indices = np.array([[1], [-1], [1], [1]] if reduction != "none" else [[1], [-1], [0], [2]], np.int64)
    node = helper.make_node("ScatterND", ["data", "indices", "updates"], ["out"], reduction=reduction)
    model = _model([node], [data, updates], [out], [numpy_helper.from_array(indices, "indices")])
    rng = np.random.default_rng(2)
    feeds = {"data": rng.standard_normal((4, 3)).astype(np.float32),
             "updates": rng.standard_normal((4, 3)).astype(np.float32)}
    expected = _onnxruntime(model, feeds)
    np.testing.assert_allclose(byoc.interpret(byoc.from_onnx(model), **feeds), expected, rtol=1e-6)


def test_scatter_nd_with_run_time_indices_is_refused_naming_the_input():
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [4])
    indices = helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 1])
    updates = helper.make_tensor_value_info("updates", TensorProto.FLOAT, [1])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [4])
    model = _model([helper.make_node("ScatterND", ["data", "indices", "updates"], ["out"], name="scatter")],
                   [data, indices, updates], [out])
    with pytest.raises(byoc.UnsupportedOpError, match="ScatterND node 'scatter': input 'indices' must be known"):
        byoc.from_onnx(model)


def test_instance_norm_and_is_nan_match_onnxruntime(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3, 5])
    nan = helper.make_tensor_value_info("nan", TensorProto.BOOL, [2, 3, 5])
    scale = numpy_helper.from_array(np.array([0.5, 1.0, 2.0], np.float32), "scale")
    bias = numpy_helper.from_array(np.array([0.1, -0.2, 0.3], np.float32), "bias")
    nodes = [helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["out"], epsilon=1e-3),
             helper.make_node("IsNaN", ["x"], ["nan"])]
    model = _model(nodes, [x], [out, nan], [scale, bias])
    value = np.random.default_rng(3).standard_normal((2, 3, 5)).astype(np.float32)
    value[0, 1, 2] = np.nan
    expected = [_onnxruntime(model, {"x": value})] + [np.isnan(value)]
    module = byoc.build(model, "cpu", workdir=str(tmp_path / "build")).load()
    got = module.run(x=value)
    assert len(got) == 2
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("op_type, indices, update_shape, attrs", [
    ("ScatterND", np.array([[1], [0]], np.int64), [2, 4], {}),
    ("ScatterElements", np.array([[0, 1, 2, 0]], np.int64), [1, 4], {"axis": 0}),
])
def test_a_scatter_into_huge_data_is_refused_at_once(op_type, indices, update_shape, attrs):
    """The robustness suite's `dims huge` mutation hung here: the maps were Python lists."""
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [2**40, 4])
    updates = helper.make_tensor_value_info("updates", TensorProto.FLOAT, update_shape)
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    node = helper.make_node(op_type, ["data", "indices", "updates"], ["out"], name="scatter", **attrs)
    model = _model([node], [data, updates], [out], [numpy_helper.from_array(indices, "indices")])
    with pytest.raises(byoc.ModelError, match=f"{op_type} node 'scatter': scatters into data of "):
        byoc.from_onnx(model)
