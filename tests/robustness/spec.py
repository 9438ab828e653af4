"""What byoc claims to support, as data the case generators read.

One-node base models: for each op type in `byoc.frontend.onnx.SUPPORTED_OPS`, the node's
inputs and attributes come from its ONNX schema (`onnx.defs.get_schema`: how many inputs,
which are optional, which attributes exist, their types, which are required); the
table `NODE_INPUTS` only says what no schema can: shapes and values that make a valid
node (a Conv weight that fits its input, Gather indices within range). An op missing
from the table gets one float32 [2, 3, 4] graph input per required schema input.

Attribute domains (`forbidden_values`): values the ONNX spec rules out for an attribute
(keepdims=2, an axis beyond the rank, a perm that is no permutation, strides of 0, a Cast
to an element type byoc does not have...). A model carrying one must be refused.
`valid_variants`: other allowed values, whose results are compared with onnxruntime.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DEFAULT_OPSET = 21
OPSET_OVERRIDES = {"RMSNormalization": 23}

# ONNX element types byoc supports (byoc/frontend/onnx.py _ONNX_DTYPES) and some it does not.
SUPPORTED_ELEM_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE,
                        TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                        TensorProto.UINT8, TensorProto.BOOL}
UNSUPPORTED_ELEM_TYPES = {"UINT16": TensorProto.UINT16, "UINT32": TensorProto.UINT32,
                          "UINT64": TensorProto.UINT64, "STRING": TensorProto.STRING,
                          "COMPLEX64": TensorProto.COMPLEX64, "FLOAT8E4M3FN": TensorProto.FLOAT8E4M3FN,
                          "INT4": TensorProto.INT4, "UNDEFINED": TensorProto.UNDEFINED, "999": 999}


@dataclass
class Input:
    """One node input: a graph input (random data at run time) or an initializer."""
    shape: tuple = (2, 3, 4)
    dtype: str = "float32"
    value: np.ndarray | None = None     # given: an initializer holding it

    @property
    def is_initializer(self) -> bool:
        return self.value is not None


def _x(*shape, dtype="float32") -> Input:
    return Input(tuple(shape) if shape else (2, 3, 4), dtype)


def _c(value, dtype=None) -> Input:
    array = np.asarray(value, dtype=dtype)
    return Input(array.shape, str(array.dtype), array)


_I64 = np.int64
_POSITIVE_VAR = np.array([0.5, 1.0, 2.0], np.float32)

# op type -> (inputs, attributes, number of outputs); see the module docstring
NODE_INPUTS: dict[str, tuple[list[Input], dict, int]] = {
    "Not": ([_x(dtype="bool")], {}, 1),
    "And": ([_x(dtype="bool"), _x(3, 4, dtype="bool")], {}, 1),
    "Or": ([_x(dtype="bool"), _x(3, 4, dtype="bool")], {}, 1),
    "Xor": ([_x(dtype="bool"), _x(3, 4, dtype="bool")], {}, 1),
    "Mod": ([_x(dtype="int32"), _c([1, 2, 3, 4], np.int32)], {}, 1),
    "Where": ([_x(dtype="bool"), _x(), _x(3, 4)], {}, 1),
    "PRelu": ([_x(), _c([0.1, 0.2, 0.3, 0.4], np.float32)], {}, 1),
    "Sum": ([_x(), _x(3, 4), _x(4)], {}, 1),
    "Max": ([_x(), _x(3, 4), _x(4)], {}, 1),
    "Min": ([_x(), _x(3, 4), _x(4)], {}, 1),
    "Mean": ([_x(), _x(3, 4), _x(4)], {}, 1),
    "Cast": ([_x()], {"to": TensorProto.INT32}, 1),
    "CastLike": ([_x(), _c([1], np.int32)], {}, 1),
    "Clip": ([_x(), _c(np.float32(-0.5)), _c(np.float32(0.5))], {}, 1),
    "ArgMax": ([_x()], {"axis": 1, "keepdims": 1}, 1),
    "ArgMin": ([_x()], {"axis": 1, "keepdims": 1}, 1),
    "Softmax": ([_x()], {"axis": 1}, 1),
    "LogSoftmax": ([_x()], {"axis": 1}, 1),
    "LayerNormalization": ([_x(), _c(np.linspace(0.5, 2, 4, dtype=np.float32)), _c(np.arange(4, dtype=np.float32))],
                           {"axis": -1, "epsilon": 1e-5}, 1),
    "RMSNormalization": ([_x(), _c(np.linspace(0.5, 2, 4, dtype=np.float32))], {"axis": -1, "epsilon": 1e-5}, 1),
    "BatchNormalization": ([_x(2, 3, 4, 4), _c(np.float32([1, 2, 3])), _c(np.float32([0, 1, -1])),
                            _c(np.float32([0.1, 0, -0.1])), _c(_POSITIVE_VAR)], {"epsilon": 1e-5}, 1),
    "MatMul": ([_x(2, 3, 4), _c(np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5))], {}, 1),
    "Gemm": ([_x(3, 4), _c(np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)),
              _c(np.float32([1, 2, 3, 4, 5]))], {"transB": 1, "alpha": 0.5, "beta": 2.0}, 1),
    "Conv": ([_x(1, 2, 6, 6), _c(np.linspace(-1, 1, 72, dtype=np.float32).reshape(4, 2, 3, 3)),
              _c(np.float32([0, 1, 2, 3]))],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 1}, 1),
    "MaxPool": ([_x(1, 2, 6, 6)], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0]}, 1),
    "AveragePool": ([_x(1, 2, 6, 6)], {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
                                       "count_include_pad": 0}, 1),
    "GlobalAveragePool": ([_x(1, 2, 3, 3)], {}, 1),
    "GlobalMaxPool": ([_x(1, 2, 3, 3)], {}, 1),
    "Constant": ([], {"value": numpy_helper.from_array(np.float32([[1, 2], [3, 4]]), "value")}, 1),
    "ConstantOfShape": ([_c([2, 3], _I64)], {"value": numpy_helper.from_array(np.float32([1.5]), "value")}, 1),
    "Range": ([_c(np.float32(0)), _c(np.float32(5)), _c(np.float32(0.5))], {}, 1),
    "Reshape": ([_x(), _c([4, 6], _I64)], {}, 1),
    "Flatten": ([_x()], {"axis": 1}, 1),
    "Transpose": ([_x()], {"perm": [2, 0, 1]}, 1),
    "Squeeze": ([_x(2, 1, 4), _c([1], _I64)], {}, 1),
    "Unsqueeze": ([_x(2, 3), _c([0], _I64)], {}, 1),
    "Expand": ([_x(3, 1), _c([2, 3, 4], _I64)], {}, 1),
    "Concat": ([_x(2, 3), _x(2, 4)], {"axis": 1}, 1),
    "Split": ([_x(6, 4), _c([2, 4], _I64)], {"axis": 0}, 2),
    "Slice": ([_x(4, 5), _c([1, 0], _I64), _c([3, 5], _I64), _c([0, 1], _I64), _c([1, 2], _I64)], {}, 1),
    "Gather": ([_x(5, 4), _c([0, 2, 4], _I64)], {"axis": 0}, 1),
    "GatherElements": ([_x(3, 4), _c([[0, 1], [2, 3], [1, 1]], _I64)], {"axis": 1}, 1),
    "GatherND": ([_x(3, 4), _c([[0, 1], [2, -1]], _I64)], {}, 1),
    "ScatterND": ([_x(3, 4), _c([[1], [0]], _I64), _x(2, 4)], {}, 1),
    "ScatterElements": ([_x(3, 4), _c([[0, 1, 2, 0]], _I64), _x(1, 4)], {"axis": 0}, 1),
    "InstanceNormalization": ([_x(), _c(np.float32([0.5, 1.0, 2.0])), _c(np.float32([0.1, 0.2, 0.3]))],
                              {"epsilon": 1e-5}, 1),
    # byoc resizes constants (at import time): the resized tensor is an initializer
    "Resize": ([_c(np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2)), _c(np.zeros(0, np.float32)),
                _c(np.float32([1, 1, 2, 1.5]))], {"mode": "linear"}, 1),
    # a condition known at import time, each branch one constant
    "If": ([_c(np.bool_(True))], {branch: helper.make_graph(
        [helper.make_node("Constant", [], [f"{branch}_value"], value=numpy_helper.from_array(
            np.float32([1, 2]) * (1 if branch == "then_branch" else -1), f"{branch}_tensor"))], branch, [],
        [helper.make_tensor_value_info(f"{branch}_value", TensorProto.FLOAT, [2])])
        for branch in ("then_branch", "else_branch")}, 1),
    "Pad": ([_x(2, 3), _c([1, 0, 1, 2], _I64), _c(np.float32(0.5))], {"mode": "constant"}, 1),
    "Tile": ([_x(2, 3), _c([2, 1], _I64)], {}, 1),
    "Trilu": ([_x(4, 4), _c(np.int64(1))], {"upper": 1}, 1),
    "CumSum": ([_x(2, 3), _c(np.int64(1))], {"exclusive": 0, "reverse": 1}, 1),
    "Gelu": ([_x()], {"approximate": "tanh"}, 1),
    "LeakyRelu": ([_x()], {"alpha": 0.1}, 1),
    "Elu": ([_x()], {"alpha": 1.0}, 1),
    "HardSigmoid": ([_x()], {"alpha": 0.2, "beta": 0.5}, 1),
    "Pow": ([_x(), _c(np.float32([1, 2, 0.5, 3]))], {}, 1),
    "Shape": ([_x()], {"start": 0}, 1),
    "ReduceSum": ([_x(), _c([1], _I64)], {"keepdims": 1}, 1),
}
for _reduce in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
                "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"):
    NODE_INPUTS[_reduce] = ([_x(), _c([1], _I64)], {"keepdims": 1}, 1)


def schema(op_type: str, opset: int | None = None):
    return onnx.defs.get_schema(op_type, opset or opset_for(op_type), "")


def opset_for(op_type: str) -> int:
    return OPSET_OVERRIDES.get(op_type, DEFAULT_OPSET)


def node_inputs(op_type: str) -> tuple[list[Input], dict, int]:
    """The table's entry, or one float32 [2, 3, 4] graph input per required input."""
    if op_type in NODE_INPUTS:
        return NODE_INPUTS[op_type]
    op_schema = schema(op_type)
    required = [p for p in op_schema.inputs if p.option != onnx.defs.OpSchema.FormalParameterOption.Optional]
    shapes = [(2, 3, 4), (3, 4), (4,)]
    return [_x(*shapes[min(i, 2)]) for i in range(len(required))], {}, max(op_schema.min_output, 1)


@dataclass
class BaseModel:
    """A valid model the mutations start from, with what they need to know of it."""
    name: str
    proto: onnx.ModelProto
    input_shapes: dict | None = None
    fixture: str | None = None                      # tests/fixtures/<name>.npz holds its inputs
    ranks: dict = field(default_factory=dict)        # value name -> rank (shape inference)


def elem_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def one_node_model(op_type: str) -> BaseModel:
    inputs, attributes, outputs = node_inputs(op_type)
    names = [f"{op_type.lower()}_in{i}" for i in range(len(inputs))]
    graph_inputs, initializers = [], []
    for name, spec in zip(names, inputs):
        if spec.is_initializer:
            initializers.append(numpy_helper.from_array(np.asarray(spec.value), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, elem_type(spec.dtype), list(spec.shape)))
    output_names = [f"{op_type.lower()}_out{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, output_names, name=f"{op_type.lower()}_node", **attributes)
    graph = helper.make_graph([node], f"one_{op_type}", graph_inputs,
                              [onnx.ValueInfoProto(name=n) for n in output_names], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset_for(op_type))])
    model.ir_version = 10
    try:  # declare the outputs' types as shape inference finds them
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output
        del model.graph.output[:]
        model.graph.output.extend(inferred)
    except Exception:  # noqa: BLE001 - untyped outputs are valid too
        pass
    ranks = {name: len(spec.shape) for name, spec in zip(names, inputs)}
    return BaseModel(f"op:{op_type}", model, ranks=ranks)


# ---- attribute domains -------------------------------------------------------------

BOOLEAN_ATTRIBUTES = {"keepdims", "noop_with_empty_axes", "select_last_index", "transA", "transB", "exclusive",
                      "reverse", "upper", "ceil_mode", "count_include_pad", "fmod", "allowzero",
                      "training_mode", "storage_order"}
# attribute -> how its valid range follows from the rank r of the node's first input
AXIS_RANGES = {"axis": lambda r: (-r, r - 1)}
AXIS_RANGES_BY_OP = {("Flatten", "axis"): lambda r: (-r, r), ("Concat", "axis"): lambda r: (-r, r - 1)}


def forbidden_values(op_type: str, attribute: str, rank: int | None, current) -> list[tuple[object, str]]:
    """(value, why the spec forbids it) pairs for one attribute of a node."""
    values: list[tuple[object, str]] = []
    if attribute in BOOLEAN_ATTRIBUTES:
        values += [(2, f"{attribute} is 0 or 1"), (-1, f"{attribute} is 0 or 1")]
    if attribute == "axis" and rank is not None and op_type not in ("CumSum",):
        low, high = AXIS_RANGES_BY_OP.get((op_type, attribute), AXIS_RANGES["axis"])(rank)
        values += [(high + 1, f"axis in [{low}, {high}] for rank {rank}"),
                   (low - 1, f"axis in [{low}, {high}] for rank {rank}"),
                   (2**40, f"axis in [{low}, {high}]")]
    if attribute == "perm" and rank:
        values += [([0] * rank, "perm is a permutation"), (list(range(rank - 1)), "perm has one entry per axis"),
                   (list(range(rank - 1)) + [rank], "perm entries are axes of the input")]
    if attribute in ("kernel_shape", "strides", "dilations") and isinstance(current, list):
        values += [([0] + current[1:], f"{attribute} entries are positive"),
                   ([-1] + current[1:], f"{attribute} entries are positive"),
                   (current[:1], f"{attribute} has one entry per spatial axis")]
    if attribute == "kernel_shape" and isinstance(current, list):
        values += [([64] * len(current), "the kernel fits the padded input")]
    if attribute == "pads" and isinstance(current, list):
        values += [(current[:2] if len(current) > 2 else current + [0], "pads has 2 entries per spatial axis")]
    if attribute == "group":
        values += [(0, "group is positive"), (-1, "group is positive"), (3, "group divides the channels")]
    if attribute == "auto_pad":
        values += [("BOGUS", "auto_pad is NOTSET, SAME_UPPER, SAME_LOWER or VALID")]
    if attribute == "to":
        values += [(value, f"Cast to {name}: byoc has no such element type")
                   for name, value in UNSUPPORTED_ELEM_TYPES.items() if name not in ("INT4",)]
    if attribute == "mode" and op_type == "Pad":
        values += [("BOGUS", "mode is constant, reflect, edge or wrap"), ("", "mode is constant, reflect, edge or wrap")]
    if attribute == "approximate":
        values += [("fast", "approximate is 'none' or 'tanh'"), ("", "approximate is 'none' or 'tanh'")]
    if attribute == "num_outputs":
        values += [(0, "num_outputs is positive"), (3, "num_outputs equals the number of outputs")]
    if attribute == "stash_type":
        values += [(TensorProto.STRING, "stash_type is a float type")]
    return values


def valid_variants(op_type: str, attribute: str, rank: int | None, current) -> list:
    """Other values the spec allows (results compared with onnxruntime)."""
    if attribute in BOOLEAN_ATTRIBUTES and attribute not in ("training_mode", "storage_order"):
        return [1 - int(bool(current))] if current is not None else [0, 1]
    if attribute == "axis" and rank:
        low, high = AXIS_RANGES_BY_OP.get((op_type, attribute), AXIS_RANGES["axis"])(rank)
        return sorted({low, high, 0} - {current})
    if attribute == "perm" and rank:
        return [list(range(rank)), list(reversed(range(rank)))]
    if attribute == "auto_pad":
        return ["VALID", "SAME_UPPER", "SAME_LOWER"]
    if attribute == "mode" and op_type == "Pad":
        return ["reflect", "edge", "wrap"]
    if attribute == "approximate":
        return ["none", "tanh"]
    if attribute in ("alpha", "beta"):
        return [0.0, -2.5, 1e30, float("nan")]
    if attribute == "epsilon":
        return [0.0, 1.0]
    if attribute == "to":
        return [TensorProto.FLOAT16, TensorProto.INT8, TensorProto.BOOL, TensorProto.DOUBLE, TensorProto.UINT8]
    if attribute == "start" and op_type == "Shape":
        return [-1, 5, -10]
    if attribute == "end" and op_type == "Shape":
        return [-1, 0, 10]
    return []


# attribute type -> values of other types, each forbidden where the schema says this type
WRONG_TYPE_VALUES = {
    onnx.defs.OpSchema.AttrType.INT: [1.5, "one", [1, 2]],
    onnx.defs.OpSchema.AttrType.FLOAT: ["half", [0.5, 0.5]],
    onnx.defs.OpSchema.AttrType.INTS: [3, 1.5, "1,1"],
    onnx.defs.OpSchema.AttrType.FLOATS: [0.5, "a"],
    onnx.defs.OpSchema.AttrType.STRING: [7, ["a", "b"]],
    onnx.defs.OpSchema.AttrType.STRINGS: ["a", 1],
    onnx.defs.OpSchema.AttrType.TENSOR: [3, "tensor", [1.0, 2.0]],
}
