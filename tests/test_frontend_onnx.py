"""ONNX frontend: fixture models import and match onnxruntime, round-trip through text,
and bad models fail with clear errors."""
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import byoc
from byoc.ir import assert_structural_equal, parse_module

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = ["mlp", "bert2", "bert2_opset14", "gpt2_2l", "resnet_small", "bert12_tiny"]

# What an imported model may contain once shape arithmetic has folded away.
COMPUTE_OPS = {"matmul", "add", "subtract", "multiply", "divide", "power", "sqrt", "mean",
               "gelu", "relu", "erf", "tanh", "softmax", "layer_norm", "batch_norm", "conv2d",
               "max_pool2d", "global_avg_pool2d", "clip", "hard_sigmoid", "reshape", "transpose",
               "gather", "split", "cast", "where", "logical_and"}


def load_fixture(name):
    data = np.load(FIXTURES / f"{name}.npz")
    inputs = {key[3:]: data[key] for key in data if key.startswith("in_")}
    outputs = [data[key] for key in data if key.startswith("out_")]
    return inputs, outputs


def import_fixture(name):
    inputs, _ = load_fixture(name)
    return byoc.from_onnx(FIXTURES / f"{name}.onnx", input_shapes={k: v.shape for k, v in inputs.items()})


@pytest.mark.parametrize("name", MODELS)
def test_fixture_matches_onnxruntime(name):
    inputs, expected = load_fixture(name)
    mod = import_fixture(name)
    results = byoc.interpret(mod, **inputs)
    results = results if isinstance(results, tuple) else (results,)
    assert len(results) == len(expected)
    for got, want in zip(results, expected, strict=True):
        assert got.shape == want.shape
        scale = np.max(np.abs(want))
        assert np.max(np.abs(got - want)) <= 1e-4 * scale, name


@pytest.mark.parametrize("name", MODELS)
def test_fixture_shape_arithmetic_folds_away(name):
    mod = import_fixture(name)
    ops = {b.value.op.name for b in mod["main"].bindings if hasattr(b.value, "op") and hasattr(b.value.op, "name")}
    assert ops <= COMPUTE_OPS, ops - COMPUTE_OPS


@pytest.mark.parametrize("name", MODELS)
def test_fixture_text_round_trip(name):
    mod = import_fixture(name)
    reparsed = parse_module(mod.script())
    assert_structural_equal(reparsed, mod)


def test_dynamic_dims_need_input_shapes_and_one_error_names_every_open_input():
    """Every input still dynamic is named at once (bert2 used to need three attempts), with
    an input_shapes that would do; a misspelled name is reported before them."""
    with pytest.raises(byoc.ModelError) as info:
        byoc.from_onnx(FIXTURES / "bert2.onnx")
    message = str(info.value)
    assert message.startswith("3 inputs with dynamic dims need a static shape: input_ids ('batch', 'sequence'); "
                              "attention_mask ('batch', 'sequence'); token_type_ids ('batch', 'sequence')")
    assert "input_shapes={'input_ids': (1, 1), 'attention_mask': (1, 1), 'token_type_ids': (1, 1)}" in message
    with pytest.raises(byoc.ModelError, match=r"2 inputs with dynamic dims .*: attention_mask .* token_type_ids"):
        byoc.from_onnx(FIXTURES / "bert2.onnx", input_shapes={"input_ids": (2, 16)})
    with pytest.raises(byoc.ModelError, match=r"input_shapes names \['input_id'\], which are not model inputs"):
        byoc.from_onnx(FIXTURES / "bert2.onnx", input_shapes={"input_id": (2, 16)})


def test_input_shapes_must_fit_and_exist():
    with pytest.raises(byoc.ModelError, match="does not fit"):
        byoc.from_onnx(FIXTURES / "mlp.onnx", input_shapes={"x": (4, 65)})
    with pytest.raises(byoc.ModelError, match="not model inputs"):
        byoc.from_onnx(FIXTURES / "mlp.onnx", input_shapes={"nope": (1,)})


def test_unsupported_ops_listed_in_one_error():
    with pytest.raises(byoc.UnsupportedOpError) as info:
        byoc.from_onnx(FIXTURES / "bad_unsupported.onnx")
    message = str(info.value)
    assert "3 unsupported ONNX op type(s)" in message
    for op_type, first in (("DFT", "dft_0"), ("Det", "det_0"), ("Einsum", "einsum_0")):
        assert f"{op_type} (first node '{first}')" in message
    assert "det_1" not in message and "Relu (" not in message


def test_truncated_and_non_onnx_files():
    with pytest.raises(byoc.ModelError, match="not a valid ONNX model"):
        byoc.from_onnx(FIXTURES / "bad_truncated.onnx")
    with pytest.raises(byoc.ModelError, match="not a valid ONNX model"):
        byoc.from_onnx(b"this is a text file, not a model\n" * 10)
    with pytest.raises(byoc.ModelError, match="does not exist"):
        byoc.from_onnx(FIXTURES / "no_such_model.onnx")


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_old_opset_is_refused_with_advice():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], opset=11)
    with pytest.raises(byoc.ModelError, match="opset 11; byoc reads opsets 13"):
        byoc.from_onnx(model)


def test_runtime_shape_input_is_a_clear_error():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_by_input")],
                   [x, shape], [y])
    with pytest.raises(byoc.UnsupportedOpError, match="Reshape node 'reshape_by_input': input 'shape' must be known"):
        byoc.from_onnx(model)


def test_shape_subgraph_folds_to_constants():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Constant", [], ["axes"], value_ints=[0]),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Constant", [], ["rest"], value_ints=[2, 3]),
        helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    mod = byoc.from_onnx(_model(nodes, [x], [y]), input_shapes={"x": (4, 6)})
    expected = parse_module("""
def @main(%x: Tensor[(4, 6), float32]) -> Tensor[(4, 2, 3), float32] {
  %r = reshape(%x, shape=[4, 2, 3])
  %y = relu(%r)
  return %y
}
""")
    assert_structural_equal(mod, expected)


def test_gemm_with_transposed_constant_weight_folds_the_transpose():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    bias = np.ones(4, dtype=np.float32)
    model = _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=2.0)], [x], [y],
                   [onnx.numpy_helper.from_array(weight, "w"), onnx.numpy_helper.from_array(bias, "b")])
    mod = byoc.from_onnx(model)
    ops = [b.value.op.name for b in mod["main"].bindings]
    assert ops == ["matmul", "multiply", "add"]
    data = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(byoc.interpret(mod, data), 2 * data @ weight.T + bias, rtol=1e-6)


@pytest.mark.parametrize("op_type, axes, keepdims, ops", [
    ("ReduceMean", [2, 3], 1, ["global_avg_pool2d"]),
    ("ReduceMean", [-1, -2], 0, ["global_avg_pool2d", "squeeze"]),  # the dynamo exporter's AdaptiveAvgPool2d(1)
    ("ReduceMax", [2, 3], 1, ["global_max_pool2d"]),
    ("ReduceMean", [1, 2], 1, ["mean"]),  # not the spatial axes of NCHW: a reduction
    ("ReduceSum", [2, 3], 1, ["sum"]),
    ("ReduceMean", [6, 7], 1, None),  # out of range (6 % 4 is 2): the importer's error, not a pool
])
def test_a_mean_over_the_spatial_axes_of_an_image_is_a_global_pool(op_type, axes, keepdims, ops):
    """ReduceMean (ReduceMax) of a 4-D float tensor over axes 2 and 3 imports as a global
    pool (squeezed without keepdims): what ConvertConvLayout keeps NHWC and ConvertToFloat16
    leaves in the input's precision. Other axes and other reductions stay reductions."""
    shape = [2, 3, 5, 4]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    if ops is None:
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 1, 1])
        model = _model([helper.make_node(op_type, ["x"], ["y"], axes=axes, keepdims=keepdims)], [x], [y])
        with pytest.raises(byoc.errors.ByocError, match="axes|axis"):
            byoc.from_onnx(model)
        return
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    reference = {"ReduceMean": np.mean, "ReduceMax": np.max, "ReduceSum": np.sum}[op_type](
        data, axis=tuple(axes), keepdims=bool(keepdims))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(reference.shape))
    axes_input = onnx.numpy_helper.from_array(np.array(axes, np.int64), "axes")
    node = (helper.make_node(op_type, ["x", "axes"], ["y"], keepdims=keepdims) if op_type == "ReduceSum" else
            helper.make_node(op_type, ["x"], ["y"], axes=axes, keepdims=keepdims))
    model = _model([node], [x], [y], [axes_input] if op_type == "ReduceSum" else [])
    mod = byoc.from_onnx(model)
    assert [b.value.op.name for b in mod["main"].bindings] == ops
    np.testing.assert_allclose(byoc.interpret(mod, data), reference, rtol=1e-5, atol=1e-6)


def _int64_constant(name, values, dims=None):
    tensor = helper.make_tensor(name, TensorProto.INT64, [len(values)] if dims is None else dims, values)
    return helper.make_node("Constant", [], [name], name=name, value=tensor)


def test_folded_constants_too_large_or_invalid_are_refused():
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    huge = _model([_int64_constant("s", [2**20, 2**20, 2**10]),
                   helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")], [], [y])
    with pytest.raises(byoc.ModelError, match=r"ConstantOfShape node 'fill': .*computed at import time; "
                                              r"expected at most 2\*\*31 elements"):
        byoc.from_onnx(huge)
    negative = _model([_int64_constant("s", [-2, 3]), helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")],
                      [], [y])
    with pytest.raises(byoc.ModelError, match=r"ConstantOfShape node 'fill': .*\[-2, 3\]; expected non-negative"):
        byoc.from_onnx(negative)

    def range_model(start, limit, delta):
        nodes = [_int64_constant(name, [value], dims=[]) for name, value in
                 (("start", start), ("limit", limit), ("delta", delta))]
        y_int = helper.make_tensor_value_info("y", TensorProto.INT64, None)
        return _model(nodes + [helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="steps")], [],
                      [y_int])
    with pytest.raises(byoc.ModelError, match="Range node 'steps': input 'delta' is 0; expected a non-zero step"):
        byoc.from_onnx(range_model(0, 10, 0))
    with pytest.raises(byoc.ModelError, match=r"Range node 'steps': its output of 1000000000000 elements .*"
                                              r"computed at import time"):
        byoc.from_onnx(range_model(0, 10**12, 1))
    folded = byoc.from_onnx(range_model(10, 0, -3))  # a negative step still folds
    np.testing.assert_array_equal(folded["main"].result.data, [10, 7, 4, 1])


def test_initializer_with_short_raw_data_names_it():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4], raw_data=b"\0" * 20)
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [x], [y], [weight])
    with pytest.raises(byoc.ModelError, match=r"initializer 'w' \(float32, dims \[4, 4\]\) has 20 bytes of "
                                              r"raw_data; its dims need 64"):
        byoc.from_onnx(model)


def test_a_model_file_is_parsed_without_its_weights_which_are_viewed_in_place(tmp_path):
    """A model given as a file or bytes is parsed with its initializers' raw_data left out
    and the weights viewed where they lie in the file's bytes; every kind of initializer
    (raw float32, float16, bool, bfloat16, typed int64_data) and a Constant node import
    exactly as from the ModelProto."""
    from byoc.frontend.onnx_model import load_model_and_weights, split_initializer_data
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    outputs = [helper.make_empty_tensor_value_info(name) for name in ("y", "h", "b", "i", "c", "z")]
    weight = onnx.numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    half = onnx.numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float16), "half")
    flags = onnx.numpy_helper.from_array(np.array([True, False, True, True]), "flags")
    bf16 = helper.make_tensor("bf16", TensorProto.BFLOAT16, [2], [1.5, -2.0])
    assert bf16.HasField("raw_data") is False  # typed (int32_data), as the helper writes it
    bf16_raw = TensorProto(name="bf16_raw", data_type=TensorProto.BFLOAT16, dims=[2],
                           raw_data=np.array([0x3FC0, 0xC000], np.uint16).tobytes())
    typed = helper.make_tensor("typed", TensorProto.INT64, [2], [7, -9])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Cast", ["half"], ["h"], to=1),
             helper.make_node("Not", ["flags"], ["b"]), helper.make_node("Neg", ["typed"], ["i"]),
             helper.make_node("Cast", ["bf16_raw"], ["c"], to=1),
             helper.make_node("Constant", [], ["z"], value=onnx.numpy_helper.from_array(np.arange(3.0), "v"))]
    model = _model(nodes, [x], outputs, [weight, half, flags, bf16, bf16_raw, typed])
    data = model.SerializeToString()
    stripped, places = split_initializer_data(data)
    assert len(stripped) < len(data) - 64 and sorted(places) == [0, 1, 2, 4]  # bf16 (typed) and typed: no raw_data
    proto, raw, _ = load_model_and_weights(data)
    assert not proto.graph.initializer[0].HasField("raw_data") and bytes(raw[0]) == weight.raw_data
    (tmp_path / "m.onnx").write_bytes(data)
    inputs = {"x": rng.standard_normal((3, 4)).astype(np.float32)}
    expected = byoc.interpret(byoc.from_onnx(model), **inputs)
    for given in (data, tmp_path / "m.onnx", str(tmp_path / "m.onnx")):
        for got, want in zip(byoc.interpret(byoc.from_onnx(given), **inputs), expected, strict=True):
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(expected[4], [1.5, -2.0])
    # the checks on the data hold for data that lies in the file: a short raw_data names it
    short = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4], raw_data=b"\0" * 20)
    short_model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [x], [outputs[0]], [short])
    with pytest.raises(byoc.ModelError, match=r"initializer 'w' \(float32, dims \[4, 4\]\) has 20 bytes of raw_data"):
        byoc.from_onnx(short_model.SerializeToString())
    # bytes that are not protobuf's wire format: not split, and the parse's own error
    assert split_initializer_data(b"\x0f\x01") is None
    with pytest.raises(byoc.ModelError, match="not a valid ONNX model"):
        byoc.from_onnx(data[: len(data) // 2])


def test_negative_declared_input_dim_names_the_input():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    with pytest.raises(byoc.ModelError, match=r"input 'x' declares shape \(-3, 4\) with negative dim"):
        byoc.from_onnx(model)


def test_empty_name_for_a_required_input_is_refused_but_optional_ones_are_omitted():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = _model([helper.make_node("Relu", [""], ["y"], name="act")], [x], [y])
    with pytest.raises(byoc.ModelError, match=r"Relu node 'act': required input 0 \(X\) is empty"):
        byoc.from_onnx(model)
    high = onnx.numpy_helper.from_array(np.asarray(0.5, dtype=np.float32), "high")
    clipped = _model([helper.make_node("Clip", ["x", "", "high"], ["y"])], [x], [y], [high])
    data = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(byoc.interpret(byoc.from_onnx(clipped), data), np.minimum(data, 0.5))


@pytest.mark.parametrize("shapes, match", [
    ([4, 64], r"input_shapes: \[4, 64\] is not a mapping"),
    ({"x": "4,64"}, r"input_shapes\.x: '4,64' is not a list of non-negative integers"),
    ({"x": 4}, r"input_shapes\.x: 4 is not a list"),
    ({"x": (4.5, 64)}, r"input_shapes\.x: \(4\.5, 64\) is not a list"),
    ({"x": None}, r"input_shapes\.x: None is not a list"),
])
def test_build_checks_input_shapes(tmp_path, shapes, match):
    with pytest.raises(byoc.ConfigError, match=match):
        byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path), input_shapes=shapes)


@pytest.mark.parametrize("shapes, match", [
    ([4, 64], r"input_shapes is a list \(\[4, 64\]\); expected a mapping"),
    ({"x": "4,64"}, r"input_shapes\['x'\] = '4,64' is not a shape"),
    ({"x": (4.5, 64)}, r"input_shapes\['x'\] = \(4\.5, 64\) is not a shape"),
])
def test_from_onnx_checks_input_shapes(shapes, match):
    with pytest.raises(byoc.ModelError, match=match):
        byoc.from_onnx(FIXTURES / "mlp.onnx", input_shapes=shapes)


def test_workdir_that_is_a_file_is_a_config_error(tmp_path):
    existing_file = tmp_path / "not_a_dir"
    existing_file.write_text("")
    with pytest.raises(byoc.ConfigError, match=f"workdir {existing_file} is not a directory"):
        byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(existing_file))


def test_directory_as_model_path_says_so(tmp_path):
    with pytest.raises(byoc.ModelError, match="is a directory; expected an .onnx file"):
        byoc.from_onnx(tmp_path)


def test_a_value_defined_twice_names_both_definitions():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    twice = _model([helper.make_node("Relu", ["x"], ["y"], name="first"),
                    helper.make_node("Neg", ["x"], ["y"], name="second")], [x], [y])
    with pytest.raises(byoc.ModelError, match=r"Neg node 'second' writes value 'y', which Relu node 'first' "
                                              r"already defines; expected each value to be defined once"):
        byoc.from_onnx(twice)
    over_input = _model([helper.make_node("Relu", ["x"], ["x"], name="act")], [x], [y])
    with pytest.raises(byoc.ModelError, match=r"Relu node 'act' writes value 'x', which graph input 'x' already"):
        byoc.from_onnx(over_input)


def test_duplicate_graph_inputs_or_initializers_are_refused():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    with pytest.raises(byoc.ModelError, match=r"graph input 'x' is listed twice \(graph inputs #0 and #1\)"):
        byoc.from_onnx(_model([helper.make_node("Relu", ["x"], ["y"])], [x, x], [y]))
    w = onnx.numpy_helper.from_array(np.ones((2, 3), dtype=np.float32), "w")
    with pytest.raises(byoc.ModelError, match=r"initializer 'w' is listed twice \(initializers #0 and #1\)"):
        byoc.from_onnx(_model([helper.make_node("Add", ["x", "w"], ["y"])], [x], [y], [w, w]))


def test_an_initializer_gives_a_graph_input_a_constant_default_that_must_fit_it():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = onnx.numpy_helper.from_array(weight, "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    # legal ONNX: the input named like the initializer is that input's default; byoc keeps it constant
    for declared in ([2, 3], ["rows", 3], [None, 3], None):
        w_input = helper.make_tensor_value_info("w", TensorProto.FLOAT, declared)
        mod = byoc.from_onnx(_model(nodes, [x, w_input], [y], [w]))
        assert [param.name_hint for param in mod["main"].params] == ["x"]
        data = np.ones((2, 3), dtype=np.float32)
        np.testing.assert_array_equal(byoc.interpret(mod, data), data + weight)
    w_input = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3])
    with pytest.raises(byoc.ModelError, match=r"initializer 'w' has shape \(2, 3\), but graph input 'w' declares "
                                              r"shape \(4, 3\); expected the initializer to fit"):
        byoc.from_onnx(_model(nodes, [x, w_input], [y], [w]))
    w_input = helper.make_tensor_value_info("w", TensorProto.FLOAT, ["rows"])
    with pytest.raises(byoc.ModelError, match=r"initializer 'w' has shape \(2, 3\), but graph input 'w' declares "
                                              r"shape \('rows',\)"):
        byoc.from_onnx(_model(nodes, [x, w_input], [y], [w]))
    w_input = helper.make_tensor_value_info("w", TensorProto.INT64, [2, 3])
    with pytest.raises(byoc.ModelError, match=r"initializer 'w' has element type FLOAT, but graph input 'w' "
                                              r"declares INT64"):
        byoc.from_onnx(_model(nodes, [x, w_input], [y], [w]))
    # input_shapes cannot reshape such an input: the initializer's data is what byoc uses
    w_input = helper.make_tensor_value_info("w", TensorProto.FLOAT, ["rows", 3])
    with pytest.raises(byoc.ModelError, match=r"input_shapes names \['w'\], graph input\(s\) that an initializer "
                                              r"gives a value byoc keeps constant; the inputs are \['x'\]"):
        byoc.from_onnx(_model(nodes, [x, w_input], [y], [w]), input_shapes={"w": (5, 3)})


def test_unknown_or_repeated_node_attributes_are_refused():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    bogus = _model([helper.make_node("Relu", ["x"], ["y"], name="act", bogus=3)], [x], [y])
    with pytest.raises(byoc.ModelError, match=r"Relu node 'act': unknown attribute\(s\) \['bogus'\] for Relu at "
                                              r"opset 17; allowed: none"):
        byoc.from_onnx(bogus)
    misspelt = _model([helper.make_node("Softmax", ["x"], ["y"], name="probs", axes=0)], [x], [y])
    with pytest.raises(byoc.ModelError, match=r"Softmax node 'probs': unknown attribute\(s\) \['axes'\] for "
                                              r"Softmax at opset 17; allowed: axis"):
        byoc.from_onnx(misspelt)
    repeated = helper.make_node("LeakyRelu", ["x"], ["y"], name="leaky", alpha=0.1)
    repeated.attribute.extend([helper.make_attribute("alpha", 0.2)])
    with pytest.raises(byoc.ModelError, match=r"LeakyRelu node 'leaky': attribute\(s\) \['alpha'\] given more "
                                              r"than once"):
        byoc.from_onnx(_model([repeated], [x], [y]))
    # an attribute of the schema at the model's opset is read as before
    leaky = _model([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.5)], [x], [y])
    data = np.array([[-2, -1, 0], [1, 2, 3]], dtype=np.float32)
    np.testing.assert_allclose(byoc.interpret(byoc.from_onnx(leaky), data), np.where(data < 0, 0.5 * data, data))


def test_a_constant_too_large_to_fold_is_emitted_instead():
    """Expand/Tile of a constant to 2**40 elements: computing it at import time would
    allocate 4 TiB, so it becomes an op of the graph (the build's size checks decide)."""
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    huge = [2**20, 2**10, 2**10]
    one = onnx.numpy_helper.from_array(np.ones((1, 1, 1), dtype=np.float32), "one")
    for op_type, op_name in (("Expand", "broadcast_to"), ("Tile", "tile")):
        model = _model([_int64_constant("s", huge), helper.make_node(op_type, ["one", "s"], ["y"])], [], [y], [one])
        main = byoc.from_onnx(model)["main"]
        assert [binding.value.op.name for binding in main.bindings] == [op_name]
        assert main.result.type.shape == tuple(huge)
    # a value that must be known at import time cannot come from such a constant
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    shape_source = onnx.numpy_helper.from_array(np.array([2], dtype=np.int64), "two")
    nodes = [_int64_constant("s", [2**32]), helper.make_node("Expand", ["two", "s"], ["many"], name="grow"),
             _int64_constant("first", [0, 1]), helper.make_node("Gather", ["many", "first"], ["target"]),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    with pytest.raises(byoc.ModelError, match=r"Reshape node 'reshape': input 'shape' must be known at import time, "
                                              r"but it is computed from the output of Expand node 'grow' "
                                              r"\(4294967296 elements\), too large to compute at import time; "
                                              r"expected at most 2\*\*31 elements"):
        byoc.from_onnx(_model(nodes, [x], [y], [shape_source]))


def _if_model(condition_from_shape: bool, else_op="Neg"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    then_graph = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])])
    else_graph = helper.make_graph([helper.make_node(else_op, ["x"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 3])])
    if condition_from_shape:  # what exporters write for `if x.size(1) > 4:`
        nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("ReduceSum", ["s"], ["n"], keepdims=0),
                 helper.make_node("Greater", ["n", "four"], ["c"])]
    else:  # a condition on the data
        nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
                 helper.make_node("Cast", ["total"], ["total_int"], to=TensorProto.INT64),
                 helper.make_node("Greater", ["total_int", "four"], ["c"])]
    nodes.append(helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph, name="branch"))
    return _model(nodes, [x], [y], [onnx.numpy_helper.from_array(np.array(4, np.int64), "four")])


def test_if_with_a_condition_known_at_import_becomes_its_branch():
    mod = byoc.from_onnx(_if_model(True))
    assert "relu(%x)" in str(mod) and "If" not in str(mod) and "negative" not in str(mod)
    value = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(byoc.interpret(mod, x=value), np.maximum(value, 0))


def test_if_with_a_run_time_condition_is_refused_naming_the_node():
    with pytest.raises(byoc.UnsupportedOpError, match="If node 'branch': input 'cond' must be known at import time"):
        byoc.from_onnx(_if_model(False))


def test_if_whose_taken_branch_uses_an_unsupported_op_names_it():
    model = _if_model(True)
    then_branch = next(a for a in model.graph.node[-1].attribute if a.name == "then_branch")
    then_branch.g.node[0].op_type = "Det"  # the branch taken
    with pytest.raises(byoc.UnsupportedOpError, match="If node 'branch': its then_branch uses Det node #0"):
        byoc.from_onnx(model)
