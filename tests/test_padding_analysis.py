"""analysis/padding.py: whether a named dim can be padded (a bucket's program computes, on
the rows that exist at a smaller size, what that size's program computes), read off the
simplified programs of two sizes. Each refusal names the op and why."""
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.analysis.padding import padding_problem

FIXTURES = Path(__file__).parent / "fixtures"


def simplified(model, dims):
    from byoc.pipeline import lower
    return lower(model, "cpu", until="simplify", dims=dims)


def problem(model, dim, small, large, **other):
    return padding_problem(simplified(model, {dim: small, **other}), simplified(model, {dim: large, **other}))


def batch_model(nodes, initializers=(), input_shape=("batch", 8), output_shape=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)
    graph = helper.make_graph(nodes, "g", [x], [y], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def const(name, values, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def test_bert_pads_its_batch_and_its_sequence_whose_padded_keys_its_mask_hides():
    """BERT's sequence: its attention's softmax runs over the keys, but the attention mask,
    padded with zeros, adds finfo.min to every padded key (exactly zero weight after the
    softmax), and the probabilities' product with the values then adds exact zeros."""
    model = FIXTURES / "bert2.onnx"
    assert problem(model, "batch", 2, 5, sequence=16) is None
    assert problem(model, "batch", 1, 8, sequence=16) is None  # a batch of 1 broadcasts where 8 does not
    assert problem(model, "sequence", 8, 16, batch=2) is None


def attention_model(mask: str):
    """y = softmax(x x^T / 4 + mask) x over a sequence of x [1, S, 8]: no mask, a causal one
    (minus 1e9 above the diagonal, built from the shape) or a mask input m [1, S]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", 8])
    inputs = [x]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["s0"]), helper.make_node("Mul", ["s0", "quarter"], ["s"])]
    initializers = [const("quarter", 0.25), const("big", -1e9), const("one", 1.0), const("axis1", [1], np.int64)]
    scores = "s"
    if mask == "causal":
        nodes += [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "axis1"], ["n"]),
                  helper.make_node("Concat", ["n", "n"], ["nn"], axis=0),
                  helper.make_node("ConstantOfShape", ["nn"], ["ones"],
                                   value=numpy_helper.from_array(np.ones(1, np.float32))),
                  helper.make_node("Trilu", ["ones", "above"], ["strict"], upper=1),  # above the diagonal
                  helper.make_node("Mul", ["strict", "big"], ["bias"]), helper.make_node("Add", ["s", "bias"], ["masked"])]
        initializers.append(const("above", 1, np.int64))
        scores = "masked"
    elif mask == "input":
        inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, "sequence"]))
        nodes += [helper.make_node("Sub", ["one", "m"], ["off"]), helper.make_node("Mul", ["off", "big"], ["bias"]),
                  helper.make_node("Unsqueeze", ["bias", "axis1"], ["bias3"]),
                  helper.make_node("Add", ["s", "bias3"], ["masked"])]
        scores = "masked"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1), helper.make_node("MatMul", ["p", "x"], ["y"])]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", inputs, [y], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mask, paddable", [("none", False), ("causal", True), ("input", True)])
def test_a_softmax_over_the_dim_pads_where_a_mask_hides_the_padded_keys(mask, paddable):
    """Without a mask the padded keys would take weight from the real ones; a causal mask
    hides every key after a real query (the padded ones among them), and a mask input padded
    with zeros hides the padded keys."""
    reason = problem(attention_model(mask), "sequence", 5, 9)
    if paddable:
        assert reason is None, reason
    else:
        assert "softmax: it runs along the dim (axis 2), and its padded entries are finite values, not masked out" \
            in reason, reason


@pytest.mark.parametrize("mask", ["causal", "input"])
def test_masked_attention_padded_along_its_sequence_matches_onnxruntime(mask, tmp_path):
    import onnxruntime as ort
    path = tmp_path / "attention.onnx"
    path.write_bytes(attention_model(mask).SerializeToString())
    library = byoc.build(path, config="cpu", workdir=str(tmp_path / "w"), dims={"sequence": [4, 8]})
    assert library.metadata["dims"]["sequence"]["paddable"] is True
    module, session = library.load(), ort.InferenceSession(str(path))
    rng = np.random.default_rng(3)
    for n in range(1, 9):
        feeds = {"x": rng.standard_normal((1, n, 8)).astype(np.float32)}
        if mask == "input":
            feeds["m"] = (np.arange(n) < max(1, n - 1)).astype(np.float32)[None]  # the last key masked by the caller
        np.testing.assert_allclose(module.run(**feeds), session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_rows_kept_apart_pad():
    """A dense layer, tanh, a layer norm over the features, a transpose and back, a reshape
    that keeps the batch outermost: every row computed from its own row."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["g"]),
             helper.make_node("LayerNormalization", ["g", "scale", "bias"], ["n"], axis=-1),
             helper.make_node("Reshape", ["n", "split"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Transpose", ["t"], ["u"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["u", "merge"], ["y"])]
    initializers = [const("w", np.ones((8, 8))), const("scale", np.ones(8)), const("bias", np.zeros(8)),
                    const("split", [-1, 2, 4], np.int64), const("merge", [-1, 8], np.int64)]
    assert problem(batch_model(nodes, initializers), "batch", 3, 7) is None


def test_rows_merged_with_the_axes_outside_the_dim_pad_until_a_reshape_parts_them_again(tmp_path):
    """GPT-2's Conv1D: [4, S, 2] viewed as [4*S, 2] for a dense layer (each of the 4 groups'
    padded rows lie between the next group's real ones), a bias, a tanh, then viewed as
    [4, S, 2] again: every row still computed from its own row, and the output holds the
    dim leading its axis."""
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["m"]), helper.make_node("MatMul", ["m", "w"], ["h"]),
             helper.make_node("Add", ["h", "bias"], ["b"]), helper.make_node("Tanh", ["b"], ["t"]),
             helper.make_node("Reshape", ["t", "by_four"], ["y"])]
    initializers = [const("by_four", [4, -1, 2], np.int64), const("rows", [-1, 2], np.int64),
                    const("w", np.arange(4.0).reshape(2, 2)), const("bias", [0.5, -0.5])]
    assert problem(batch_model(nodes, initializers, input_shape=(4, "sequence", 2)), "sequence", 3, 7) is None
    # the same rows left merged at the output: the runtime cuts padded rows off the end
    nodes[-1] = helper.make_node("Identity", ["t"], ["y"])
    merged = batch_model(nodes, initializers, input_shape=(4, "sequence", 2))
    assert "holds the dim inside another axis" in problem(merged, "sequence", 3, 7)
    # a library of buckets says so, naming the model's output
    library = byoc.build(merged, config="cpu", workdir=str(tmp_path / "w"), dims={"sequence": [3, 7]})
    assert "output 'y' holds the dim inside another axis" in library.metadata["dims"]["sequence"]["why_not"]


def test_rows_merged_in_two_ways_do_not_meet():
    """[4, S, 2] viewed as [4*S, 2] added to its transpose [S, 4, 2] viewed as [S*4, 2]: the
    shapes agree, but row r of one is not row r of the other, and a padded row of one meets
    a real row of the other."""
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["a"]), helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "rows"], ["b"]), helper.make_node("Add", ["a", "b"], ["c"]),
             helper.make_node("Reshape", ["c", "by_four"], ["y"])]
    initializers = [const("by_four", [4, -1, 2], np.int64), const("rows", [-1, 2], np.int64)]
    reason = problem(batch_model(nodes, initializers, input_shape=(4, "sequence", 2)), "sequence", 3, 7)
    assert "add: its operands hold the dim's rows in different places of axis 0" in reason, reason


@pytest.mark.parametrize("case, nodes, initializers, says", [
    ("a mean over the batch", [helper.make_node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=1)], [],
     "reduce over the dim|reduces over the dim"),
    ("a sum of every row's products with every other ((x + 1)^T (x + 1): padded rows of ones, not zeros)",
     [helper.make_node("Add", ["x", "one"], ["u"]), helper.make_node("Transpose", ["u"], ["t"], perm=[1, 0]),
      helper.make_node("MatMul", ["t", "u"], ["y"])], [const("one", 1.0)],
     "matmul: it sums over the dim"),
    ("dividing by the batch size, read off the shape",
     [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
      helper.make_node("Cast", ["b"], ["f"], to=1), helper.make_node("Div", ["x", "f"], ["y"])],
     [const("zero", 0, np.int64)], "depends on the dim's size"),
    ("the batch moved inside the features",
     [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Reshape", ["t", "flat"], ["y"])],
     [const("flat", [-1], np.int64)], "output 'y' holds the dim inside another axis"),
    ("the last row", [helper.make_node("Gather", ["x", "last"], ["y"], axis=0)], [const("last", -1, np.int64)],
     "depends on the dim's size|indexes along the dim"),
    ("the rows twice, one after the other", [helper.make_node("Concat", ["x", "x"], ["y"], axis=0)], [],
     "concat: it runs along the dim"),
    ("a mean over every element (no axes: all of them)",
     [helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0)], [], "reduces over the dim"),
    ("a bound read off the batch size (clip's max: folded into its attribute)",
     [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
      helper.make_node("Cast", ["b"], ["f"], to=1), helper.make_node("Clip", ["x", "none", "f"], ["y"])],
     [const("zero", 0, np.int64), const("none", -1.0)], "depend on the dim's size"),
])
def test_ops_that_mix_padded_rows_into_the_others_are_named(case, nodes, initializers, says):
    reason = problem(batch_model(nodes, initializers), "batch", 3, 7)
    assert reason is not None, case
    import re
    assert re.search(says, reason), (case, reason)


def test_a_library_of_buckets_says_which_dims_could_be_padded(tmp_path):
    library = byoc.build(FIXTURES / "bert2.onnx", config="cpu", workdir=str(tmp_path / "w"),
                         dims={"batch": [1, 2, 4], "sequence": [8, 16]})
    dims = library.metadata["dims"]
    assert dims["batch"] == {"sizes": [1, 2, 4], "paddable": True, "range": [1, 4]}
    assert dims["sequence"] == {"sizes": [8, 16], "paddable": True, "range": [1, 16]}


def test_a_batch_of_one_that_broadcast_against_a_fixed_axis_is_not_paddable():
    """At sizes 1 and 4, x [batch, 4] + w [4, 4] is a broadcast at 1 (every output row from
    x's one row) and rowwise at 4: the output does not vary, but padded rows of x would
    reach it."""
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    model = batch_model(nodes, [const("w", np.arange(16.0).reshape(4, 4))], input_shape=("batch", 4))
    assert "broadcasts the dim against an axis of fixed size" in problem(model, "batch", 1, 4)


def test_the_parts_of_a_split_carry_the_dim_as_its_input_does():
    """GPT-2 splits its fused query-key-value projection: the parts (tuple fields) keep the
    batch rows apart as the input does."""
    nodes = [helper.make_node("Split", ["x", "halves"], ["a", "b"], axis=1), helper.make_node("Mul", ["a", "b"], ["y"])]
    assert problem(batch_model(nodes, [const("halves", [4, 4], np.int64)]), "batch", 3, 7) is None


def seq_model(nodes, initializers=(), input_shape=(1, "sequence", 4)):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case, nodes, initializers, says", [
    ("the new elements of a pad along another axis hold its value (1), summed along the dim",
     [helper.make_node("Pad", ["x", "pads", "one"], ["p"]), helper.make_node("ReduceSum", ["p", "axis1"], ["y"])],
     [const("pads", [0, 0, 0, 0, 0, 1], np.int64), const("one", 1.0), const("axis1", [1], np.int64)],
     "reduces over the dim"),
    ("rows 0..2: more than a size of 1 has",
     [helper.make_node("Slice", ["x", "zero", "three", "axis1"], ["y"])],
     [const("zero", [0], np.int64), const("three", [3], np.int64), const("axis1", [1], np.int64)],
     "slices part of the dim"),
    ("every row but the last (a negative end)",
     [helper.make_node("Slice", ["x", "zero", "minus1", "axis1"], ["y"])],
     [const("zero", [0], np.int64), const("minus1", [-1], np.int64), const("axis1", [1], np.int64)],
     "slices part of the dim|depend on the dim's size"),
    ("row 2: a size of 1 has none",
     [helper.make_node("Gather", ["x", "two"], ["y"], axis=1)], [const("two", 2, np.int64)],
     "indexes along the dim"),
    ("zero times minus infinity (a real mask value) is not zero: summed along the dim",
     [helper.make_node("Mul", ["x", "mask"], ["m"]), helper.make_node("ReduceSum", ["m", "axis1"], ["y"])],
     [const("mask", [0.0, -np.inf, 0.0, 1.0]), const("axis1", [1], np.int64)], "reduces over the dim"),
])
def test_padded_elements_the_analysis_cannot_prove_harmless_are_refused(case, nodes, initializers, says):
    import re
    reason = problem(seq_model(nodes, initializers), "sequence", 4, 8)
    assert reason is not None and re.search(says, reason), (case, reason)


def test_the_first_row_of_the_dim_keeps_it_paddable():
    """BERT's pooler reads token 0, which every size from 1 has."""
    nodes = [helper.make_node("Gather", ["x", "zero"], ["y"], axis=1)]
    assert problem(seq_model(nodes, [const("zero", 0, np.int64)]), "sequence", 4, 8) is None


def test_an_axis_that_changes_with_two_dims_pads_neither(tmp_path):
    """y = reshape(x [batch, sequence, 4], [-1, 4]): its rows are batch x sequence; a padded
    run would interleave padded rows with real ones, whatever order the config lists the dims
    in. The library still serves each bucket's own shapes."""
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["y"])]
    model = seq_model(nodes, [const("flat", [-1, 4], np.int64)], input_shape=("batch", "sequence", 4))
    path = tmp_path / "flat.onnx"
    path.write_bytes(model.SerializeToString())
    for dims in ({"sequence": [4, 8], "batch": [1, 3]}, {"batch": [1, 3], "sequence": [4, 8]}):
        library = byoc.build(path, config="cpu", workdir=str(tmp_path / "w"), dims=dims)
        verdicts = library.metadata["dims"]
        assert verdicts["batch"]["paddable"] is False and verdicts["sequence"]["paddable"] is False, verdicts
        assert "interleave" in verdicts["batch"]["why_not"] or "inside" in verdicts["batch"]["why_not"], verdicts
    x = np.arange(3 * 8 * 4, dtype=np.float32).reshape(3, 8, 4)
    np.testing.assert_array_equal(library.load().run(x), x.reshape(-1, 4))
