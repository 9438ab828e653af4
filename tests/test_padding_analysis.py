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
    from byoc.build import _Builder
    from byoc.config import load_config
    builder = _Builder(load_config("cpu"))
    builder.dims = dims
    mod, _ = builder.import_model(model, None)
    return builder.simplify(mod)


def problem(model, dim, small, large, **other):
    return padding_problem(simplified(model, {dim: small, **other}), simplified(model, {dim: large, **other}))


def batch_model(nodes, initializers=(), input_shape=("batch", 8), output_shape=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)
    graph = helper.make_graph(nodes, "g", [x], [y], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def const(name, values, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def test_bert_pads_its_batch_but_not_its_sequence_whose_softmax_runs_over_the_keys():
    model = FIXTURES / "bert2.onnx"
    assert problem(model, "batch", 2, 5, sequence=16) is None
    assert problem(model, "batch", 1, 8, sequence=16) is None  # a batch of 1 broadcasts where 8 does not
    reason = problem(model, "sequence", 8, 16, batch=2)
    assert "softmax: it runs along the dim (axis 3)" in reason and "Softmax" in reason


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


@pytest.mark.parametrize("case, nodes, initializers, says", [
    ("a mean over the batch", [helper.make_node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=1)], [],
     "reduce over the dim|reduces over the dim"),
    ("a sum of every row's products with every other (x^T x)",
     [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("MatMul", ["t", "x"], ["y"])], [],
     "matmul: it sums over the dim"),
    ("dividing by the batch size, read off the shape",
     [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
      helper.make_node("Cast", ["b"], ["f"], to=1), helper.make_node("Div", ["x", "f"], ["y"])],
     [const("zero", 0, np.int64)], "depends on the dim's size"),
    ("the batch moved inside the features",
     [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Reshape", ["t", "flat"], ["y"])],
     [const("flat", [-1], np.int64)], "moves the dim inside other axes"),
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
    assert dims["sequence"]["paddable"] is False and "softmax" in dims["sequence"]["why_not"]


def test_a_batch_of_one_that_broadcast_against_a_fixed_axis_is_not_paddable():
    """At sizes 1 and 4, x [batch, 4] + w [4, 4] is a broadcast at 1 (every output row from
    x's one row) and rowwise at 4: the output does not vary, but padded rows of x would
    reach it."""
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    model = batch_model(nodes, [const("w", np.arange(16.0).reshape(4, 4))], input_shape=("batch", 4))
    assert "broadcasts the dim against an axis of fixed size" in problem(model, "batch", 1, 4)
