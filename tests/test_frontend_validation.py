"""Malformed ONNX nodes are refused with byoc errors that name the node and the attribute or
input at fault, never with a Python error of the importer's own.

The cases are generated from the ONNX schemas (`onnx.defs.get_schema`) of every op type byoc
converts (SUPPORTED_OPS), at the first opset byoc reads that defines it and at the newest:
one valid node per op type, then mutants of it:
  - each required attribute dropped;
  - each attribute of the schema given a value of another type;
  - each flag attribute (an int the docs describe as a boolean) given 2 and -1;
  - each enumerated string attribute (a string with a default) given an unknown value;
  - each axis attribute the docs bound by the rank given an axis beyond it;
  - the input and output counts one below and one above the schema's range, and each
    required input omitted (an empty name);
  - each input the docs call 1-D given as 2-D, each they call a scalar given two values;
  - each input given an element type its type constraint excludes, and inputs that share a
    type parameter (Add's A and B are both T) given two different ones.
Only the valid nodes' input values are written by hand (EXAMPLE_INPUTS): what a schema
cannot say, such as a Reshape's target shape. A byte-flip test over the fixtures checks
that a corrupted file is refused with a byoc error too.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.frontend.onnx import MAX_OPSET, MIN_OPSET, SUPPORTED_OPS
from byoc.frontend.onnx_schema import ATTRIBUTE_DOMAINS

FIXTURES = Path(__file__).parent / "fixtures"
NODE_NAME = "node_under_test"
AttrType = onnx.defs.OpSchema.AttrType
OPTIONAL = onnx.defs.OpSchema.FormalParameterOption.Optional


def f32(*shape):
    return np.ones(shape, dtype=np.float32)


def i64(*values):
    return np.array(values, dtype=np.int64)


def scalar(value, dtype):
    return np.array(value, dtype=dtype)


# Input values of a valid node, by position, where the schema's types and a (2, 3) tensor
# do not make one. Optional inputs listed here are given when testing their own checks.
_REDUCE_INPUTS = [f32(2, 3), i64(1)]
_POOL_INPUTS = [f32(1, 2, 4, 4)]
EXAMPLE_INPUTS: dict[str, list[np.ndarray]] = {
    "BatchNormalization": [f32(1, 2, 3, 3), f32(2), f32(2), f32(2), f32(2)],
    "Clip": [f32(2, 3), scalar(0, np.float32), scalar(1, np.float32)],
    "Concat": [f32(2, 3), f32(2, 3)],
    "ConstantOfShape": [i64(2, 3)],
    "Conv": [f32(1, 2, 4, 4), f32(3, 2, 2, 2), f32(3)],
    "AveragePool": _POOL_INPUTS, "MaxPool": _POOL_INPUTS,
    "GlobalAveragePool": _POOL_INPUTS, "GlobalMaxPool": _POOL_INPUTS,
    "CumSum": [f32(2, 3), scalar(0, np.int64)],
    "Dropout": [f32(2, 3), scalar(0.5, np.float32), scalar(False, np.bool_)],
    "Expand": [f32(2, 1), i64(2, 3)],
    "Gather": [f32(2, 3), i64(0, 1)],
    "GatherElements": [f32(2, 3), np.zeros((2, 3), dtype=np.int64)],
    "GatherND": [f32(2, 3), np.zeros((2, 2), dtype=np.int64)],
    "ScatterND": [f32(2, 3), np.zeros((1, 1), dtype=np.int64), f32(1, 3)],
    "ScatterElements": [f32(2, 3), np.zeros((1, 3), dtype=np.int64), f32(1, 3)],
    "InstanceNormalization": [f32(1, 2, 3), f32(2), f32(2)],
    "If": [scalar(True, np.bool_)],
    "Resize": [f32(2, 3), np.zeros(0, dtype=np.float32), np.array([1, 2], dtype=np.float32)],
    "Gemm": [f32(2, 3), f32(3, 4), f32(4)],
    "LayerNormalization": [f32(2, 3), f32(3), f32(3)],
    "RMSNormalization": [f32(2, 3), f32(3)],
    "MatMul": [f32(2, 3), f32(3, 4)],
    "Mod": [i64(4, 5), i64(3, 2)],
    "Pad": [f32(2, 3), i64(0, 1, 0, 1), scalar(0, np.float32), i64(0, 1)],
    "PRelu": [f32(2, 3), f32(3)],
    "Range": [scalar(0, np.float32), scalar(5, np.float32), scalar(1, np.float32)],
    "Reshape": [f32(2, 3), i64(3, 2)],
    "Slice": [f32(2, 3), i64(0), i64(1), i64(0), i64(1)],
    "Split": [f32(2, 4), i64(2)],
    "Squeeze": [f32(1, 3), i64(0)],
    "Unsqueeze": [f32(2, 3), i64(0)],
    "Tile": [f32(2, 3), i64(1, 2)],
    "Trilu": [f32(3, 3), scalar(0, np.int64)],
    **{op: _REDUCE_INPUTS for op in SUPPORTED_OPS if op.startswith("Reduce")},
}
# Ops whose schema makes inputs optional that a valid node still needs (Resize: one of
# scales and sizes, which its shape inference requires): op type -> inputs of a valid node.
INPUTS_A_VALID_NODE_NEEDS = {"Resize": 3}
# Values of required attributes, and of the one value attribute a Constant needs.
REQUIRED_ATTRIBUTES = {"Concat": {"axis": 0}, "Cast": {"to": TensorProto.FLOAT},
                       "MaxPool": {"kernel_shape": [2, 2]}, "AveragePool": {"kernel_shape": [2, 2]},
                       "Constant": {"value_float": 1.0},
                       "If": {branch: helper.make_graph(
                           [helper.make_node("Constant", [], [f"{branch}_out"], value_float=1.0)], branch, [],
                           [helper.make_tensor_value_info(f"{branch}_out", TensorProto.FLOAT, [])])
                           for branch in ("then_branch", "else_branch")}}
# Inputs that must be 1-D although their descriptions do not say so (the ops' type and
# shape inference requires it): (op type, input name).
ONE_D_BY_INFERENCE = {("Reshape", "shape"), ("Split", "split"),
                      *((op, "axes") for op in SUPPORTED_OPS if op.startswith("Reduce"))}
# Sizes the operator docs bound ("it can take any value greater than or equal to 0",
# strides and dilations default to 1 and count steps): attribute -> a value out of bounds.
OUT_OF_BOUNDS_SIZES = {"kernel_shape": [0, 2], "strides": [0, 1], "dilations": [-1, 1], "pads": [0, -1, 0, 0],
                       "group": 0}

# NumPy dtypes byoc imports -> the ONNX type strings of schemas' type constraints.
TYPE_STRINGS = {"float32": "tensor(float)", "float64": "tensor(double)", "float16": "tensor(float16)",
                "int64": "tensor(int64)", "int32": "tensor(int32)", "int16": "tensor(int16)",
                "int8": "tensor(int8)", "uint8": "tensor(uint8)", "bool": "tensor(bool)"}

# What the docs' words say about an attribute or an input.
FLAG_WORDS = re.compile(r"\b(whether|true|false|boolean|or not)\b|set to 1|\b0 is\b", re.IGNORECASE)
AXIS_RANGE_WORDS = re.compile(r"range (is )?\[-r(ank)?, ?r(ank)?(-1)?[\])]")
ONE_D_WORDS = re.compile(r"\b1-?D\b")
SCALAR_WORDS = re.compile(r"must be a scalar|^Scalar\.|A scalar value|\b0-D tensor")
# A value of another type for each attribute type (helper.make_attribute infers the type).
WRONG_TYPE_VALUES = {
    AttrType.INT: [1.5, "1"], AttrType.FLOAT: ["x", [1.0, 2.0]], AttrType.STRING: [1, ["a", "b"]],
    AttrType.INTS: [1, [1.5, 2.5]], AttrType.FLOATS: [1.0, "x"], AttrType.STRINGS: ["x", [1, 2]],
    AttrType.TENSOR: [1, "x"], AttrType.SPARSE_TENSOR: [1],
}


def _opsets(op_type: str) -> list[int]:
    """The first opset byoc reads that defines the op, and the newest."""
    first = next(v for v in range(MIN_OPSET, MAX_OPSET + 1) if _schema(op_type, v) is not None)
    return sorted({first, MAX_OPSET})


def _schema(op_type: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def _pick_dtype(schema, param) -> np.dtype:
    """A dtype the parameter's type constraint allows: float32, else int64, else bool."""
    allowed = next((c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == param.type_str),
                   [param.type_str])
    for type_str, dtype in (("tensor(float)", np.float32), ("tensor(int64)", np.int64), ("tensor(bool)", np.bool_)):
        if type_str in allowed:
            return np.dtype(dtype)
    raise AssertionError(f"no float, int64 or bool tensor among {allowed}")


@dataclass
class NodeCase:
    """A node of `op_type` at `opset` with its input values, attributes and output count."""
    op_type: str
    opset: int
    inputs: list = field(default_factory=list)  # np.ndarray, or None for an omitted input
    attributes: dict = field(default_factory=dict)  # name -> AttributeProto
    outputs: int = 1

    @property
    def schema(self):
        return _schema(self.op_type, self.opset)

    def model(self) -> onnx.ModelProto:
        names = ["" if value is None else f"in{i}" for i, value in enumerate(self.inputs)]
        initializers = [numpy_helper.from_array(value, name) for name, value in zip(names, self.inputs)
                        if value is not None]
        outputs = [f"out{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op_type, names, outputs, name=NODE_NAME)
        node.attribute.extend(self.attributes.values())
        # no declared element type: these cases are about the node, not the graph's declarations
        infos = [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs]
        graph = helper.make_graph([node], "g", [], infos, initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])

    def with_inputs(self, count: int) -> "NodeCase":
        """The case with its first `count` inputs (from EXAMPLE_INPUTS or the schema)."""
        values = list(EXAMPLE_INPUTS.get(self.op_type, ()))
        params = self.schema.inputs
        while len(values) < count:
            param = params[min(len(values), len(params) - 1)]
            values.append(np.ones((2, 3), dtype=_pick_dtype(self.schema, param)))
        return NodeCase(self.op_type, self.opset, values[:count], dict(self.attributes), self.outputs)

    def with_attribute(self, name: str, value) -> "NodeCase":
        attributes = dict(self.attributes)
        attributes[name] = helper.make_attribute(name, value)
        return NodeCase(self.op_type, self.opset, list(self.inputs), attributes, self.outputs)

    def without_attribute(self, name: str) -> "NodeCase":
        attributes = {key: value for key, value in self.attributes.items() if key != name}
        return NodeCase(self.op_type, self.opset, list(self.inputs), attributes, self.outputs)


def valid_case(op_type: str, opset: int) -> NodeCase:
    case = NodeCase(op_type, opset)
    for name, value in REQUIRED_ATTRIBUTES.get(op_type, {}).items():
        case = case.with_attribute(name, value)
    return case.with_inputs(max(case.schema.min_input, INPUTS_A_VALID_NODE_NEEDS.get(op_type, 0)))


def label_of(op_type: str) -> str:
    return f"{op_type} node '{NODE_NAME}'"


def refusal(case: NodeCase) -> str | None:
    """The message of the byoc error that refuses the case, or None when it imports."""
    try:
        byoc.from_onnx(case.model())
    except byoc.ByocError as error:
        return str(error)
    return None


def mutants(op_type: str, opset: int):
    """(what the mutant does, the mutant, words its refusal must name) for one op type."""
    base = valid_case(op_type, opset)
    schema = base.schema
    for name, attribute in schema.attributes.items():
        if attribute.required:
            yield f"drop required attribute {name}", base.without_attribute(name), name
        for value in WRONG_TYPE_VALUES.get(attribute.type, [1]):
            yield f"attribute {name} given {value!r}", base.with_attribute(name, value), name
        if attribute.type == AttrType.INT and _default(attribute) in (0, 1) and \
                FLAG_WORDS.search(attribute.description):
            for value in (2, -1):
                yield f"flag {name}={value}", base.with_attribute(name, value), name
        if attribute.type == AttrType.STRING and _default(attribute) is not None:
            yield f"{name}='bogus'", base.with_attribute(name, "bogus"), name
        if attribute.type == AttrType.INT and AXIS_RANGE_WORDS.search(attribute.description):
            rank = base.inputs[0].ndim
            yield f"{name}={rank + 3} beyond the rank", base.with_attribute(name, rank + 3), name
        if name in OUT_OF_BOUNDS_SIZES:
            value = OUT_OF_BOUNDS_SIZES[name]
            yield f"{name}={value}", base.with_attribute(name, value), name
    if schema.min_input > 0:
        yield "one input too few", base.with_inputs(schema.min_input - 1), "input"
    if schema.max_input < 2**31 - 1:
        extra = base.with_inputs(schema.max_input)
        extra.inputs.append(f32(2, 3))
        yield "one input too many", extra, "input"
    for position, param in enumerate(schema.inputs[:schema.min_input]):
        if param.option != OPTIONAL:
            omitted = base.with_inputs(schema.min_input)
            omitted.inputs[position] = None
            yield f"required input {param.name} omitted", omitted, param.name
    for outputs in (schema.min_output - 1, schema.max_output + 1):
        if 0 <= outputs < 2**31 - 1:
            yield f"{outputs} outputs", NodeCase(op_type, opset, list(base.inputs), dict(base.attributes), outputs), \
                "output"
    for position, param in enumerate(schema.inputs):
        one_d = ONE_D_WORDS.search(param.description) or (op_type, param.name) in ONE_D_BY_INFERENCE
        if not (one_d or SCALAR_WORDS.search(param.description)) or position >= schema.max_input:
            continue
        wrong = base.with_inputs(position + 1)
        value = wrong.inputs[position]
        wrong.inputs[position] = value.reshape(1, -1) if one_d else np.repeat(value.reshape(1), 2)
        yield f"input {param.name} of shape {list(wrong.inputs[position].shape)}", wrong, param.name
    yield from _type_mutants(base)


def _type_mutants(base: NodeCase):
    schema = base.schema
    allowed = {constraint.type_param_str: constraint.allowed_type_strs for constraint in schema.type_constraints}
    first_of_type: dict[str, int] = {}
    for position, value in enumerate(base.inputs):
        param = schema.inputs[min(position, len(schema.inputs) - 1)]
        choices = allowed.get(param.type_str, [param.type_str])
        excluded = [dtype for dtype, type_str in TYPE_STRINGS.items() if type_str not in choices]
        if excluded:
            wrong = NodeCase(base.op_type, base.opset, list(base.inputs), dict(base.attributes), base.outputs)
            wrong.inputs[position] = value.astype(excluded[0])
            yield f"input {param.name} of {excluded[0]}", wrong, param.name
        if param.type_str in first_of_type:
            other = next((dtype for dtype, type_str in TYPE_STRINGS.items()
                          if type_str in choices and np.dtype(dtype) != value.dtype), None)
            if other is not None:
                mixed = NodeCase(base.op_type, base.opset, list(base.inputs), dict(base.attributes), base.outputs)
                mixed.inputs[position] = value.astype(other)
                yield f"input {param.name} of {other} beside {value.dtype}", mixed, param.name
        first_of_type.setdefault(param.type_str, position)


def _default(attribute):
    return helper.get_attribute_value(attribute.default_value) if attribute.default_value.type else None


CASES = [(op_type, opset) for op_type in sorted(SUPPORTED_OPS) for opset in _opsets(op_type)]


@pytest.mark.parametrize("op_type, opset", CASES, ids=[f"{op}-{opset}" for op, opset in CASES])
def test_malformed_nodes_are_refused_naming_the_node_and_the_fault(op_type, opset):
    base = valid_case(op_type, opset)
    assert refusal(base) is None, f"the valid {op_type} node is refused: {refusal(base)}"
    full = base.with_inputs(min(max(len(EXAMPLE_INPUTS.get(op_type, ())), base.schema.min_input),
                                base.schema.max_input))
    assert refusal(full) is None, f"the {op_type} node with its optional inputs is refused: {refusal(full)}"
    failures = []
    count = 0
    for what, mutant, named in mutants(op_type, opset):
        count += 1
        try:
            message = refusal(mutant)
        except Exception as error:  # noqa: BLE001 - what the test is about
            failures.append(f"{what}: raised {type(error).__name__}: {error}")
            continue
        if message is None:
            failures.append(f"{what}: imported without an error")
        elif label_of(op_type) not in message or named not in message:
            failures.append(f"{what}: the message does not name {label_of(op_type)!r} and {named!r}: {message}")
    assert count > 0
    assert not failures, "\n".join(failures)


def test_valid_flag_and_enumerated_values_are_not_called_malformed():
    """The domain checks refuse only what the docs exclude: each documented value of a flag
    (0, 1) and of auto_pad imports, or byoc says it does not support it."""
    for op_type, opset in CASES:
        base = valid_case(op_type, opset)
        for name, attribute in base.schema.attributes.items():
            values = []
            if attribute.type == AttrType.INT and _default(attribute) in (0, 1) and \
                    FLAG_WORDS.search(attribute.description):
                values = [0, 1]
            if name == "auto_pad":
                values = ["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]
            for value in values:
                try:
                    byoc.from_onnx(base.with_attribute(name, value).model())
                except byoc.ModelError as error:
                    pytest.fail(f"{op_type} at opset {opset} with {name}={value!r} is called malformed: {error}")
                except byoc.ByocError:
                    pass  # unsupported (training_mode=1), or shapes that no longer fit (Gemm transB=1)


def test_attribute_domain_table_names_attributes_of_supported_ops():
    """Each ATTRIBUTE_DOMAINS key is an attribute some supported op has at some opset."""
    known = set()
    for op_type in SUPPORTED_OPS:
        for opset in range(MIN_OPSET, MAX_OPSET + 1):
            schema = _schema(op_type, opset)
            if schema is not None:
                known |= {name for name in schema.attributes} | {f"{op_type}.{name}" for name in schema.attributes}
    assert set(ATTRIBUTE_DOMAINS) <= known, set(ATTRIBUTE_DOMAINS) - known


def test_the_issue_examples_are_refused_with_the_expected_words():
    """The cases reported in the robustness issue, as a reader would look them up."""
    cases = [
        (valid_case("PRelu", 17).with_inputs(0), r"PRelu node 'node_under_test': 0 input\(s\) \[\] given; PRelu "
                                                 r"at opset 17 takes 2 \(X, slope\)"),
        (valid_case("Concat", 17).without_attribute("axis"), r"required attribute\(s\) \['axis'\] missing"),
        (valid_case("Cast", 17).without_attribute("to"), r"required attribute\(s\) \['to'\] missing"),
        (valid_case("ReduceSum", 17).with_attribute("keepdims", 2), r"attribute 'keepdims' is 2; expected 0 or 1"),
        (valid_case("ArgMax", 17).with_attribute("keepdims", 3), r"attribute 'keepdims' is 3; expected 0 or 1"),
        (valid_case("Gemm", 17).with_attribute("transA", 5), r"attribute 'transA' is 5; expected 0 or 1"),
        (valid_case("Cast", 17).with_attribute("to", 99), r"attribute 'to' is 99; expected an ONNX element type"),
        (valid_case("Concat", 17).with_attribute("axis", "0"), r"attribute 'axis' is of type STRING; expected INT"),
    ]
    reshape = valid_case("Reshape", 17)
    reshape.inputs[1] = np.array([[3, 2]], dtype=np.int64)
    cases.append((reshape, r"input 'shape' is a int64 tensor of shape \[1, 2\]; expected a 1-D tensor of integers"))
    for case, match in cases:
        with pytest.raises(byoc.ModelError, match=match):
            byoc.from_onnx(case.model())


def test_interpreter_refuses_a_value_larger_than_its_limit_before_allocating():
    """An Expand of a constant to 2**40 elements imports (it is emitted, not folded); the
    interpreter names the value and its size instead of failing in NumPy."""
    shape = numpy_helper.from_array(i64(2**40), "shape")
    one = numpy_helper.from_array(f32(1), "one")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Expand", ["one", "shape"], ["big"]), helper.make_node("Add", ["big", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [shape, one]),
                              opset_imports=[helper.make_opsetid("", 17)])
    mod = byoc.from_onnx(model)
    with pytest.raises(byoc.ByocError, match=r"%big = broadcast_to\(\.\.\.\) of type Tensor\[\(1099511627776,\), "
                                             r"float32\] needs 4398046511104 bytes \(4096 GiB\); expected at most "
                                             r"17179869184 bytes"):
        byoc.interpret(mod, x=f32(1))


def test_interpreter_names_the_value_an_op_could_not_compute():
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [4])
    indices = helper.make_tensor_value_info("indices", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([helper.make_node("Gather", ["data", "indices"], ["y"])], "g",
                                                [data, indices], [y]), opset_imports=[helper.make_opsetid("", 17)])
    mod = byoc.from_onnx(model)
    with pytest.raises(byoc.ByocError, match=r"%y = gather\(\.\.\.\) could not be computed on the given values: "
                                             r"IndexError: gather: index 9 is out of range for an axis of size 4"):
        byoc.interpret(mod, data=f32(4), indices=i64(0, 9))


def _flipped(data: bytes, rng: random.Random) -> bytes:
    """1 to 4 bits flipped, mostly in the first and last 4 KiB (the nodes and the graph's
    inputs and outputs; the middle is weights, whose flips only change values)."""
    mutant = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        region = rng.random()
        if region < 0.45:
            position = rng.randrange(min(len(data), 4096))
        elif region < 0.9:
            position = len(data) - 1 - rng.randrange(min(len(data), 4096))
        else:
            position = rng.randrange(len(data))
        mutant[position] ^= 1 << rng.randrange(8)
    return bytes(mutant)


@pytest.mark.parametrize("fixture, input_shapes", [
    ("mlp", None),
    ("bert2", {"input_ids": (2, 16), "attention_mask": (2, 16), "token_type_ids": (2, 16)}),
])
def test_byte_flipped_models_import_or_fail_with_a_byoc_error(fixture, input_shapes):
    data = (FIXTURES / f"{fixture}.onnx").read_bytes()
    rng = random.Random(20261124)
    outcomes = {"imported": 0, "refused": 0}
    for index in range(100):
        mutant = _flipped(data, rng)
        try:
            byoc.from_onnx(mutant, input_shapes=input_shapes)
            outcomes["imported"] += 1
        except byoc.ByocError:
            outcomes["refused"] += 1
        except Exception as error:  # noqa: BLE001 - what the test is about
            pytest.fail(f"{fixture} mutant #{index} raised {type(error).__name__}: {error}")
    assert outcomes["refused"] > 10, outcomes  # the flips do reach the graph


def test_a_python_error_escaping_a_converter_becomes_a_model_error_naming_the_node(monkeypatch):
    from byoc.frontend import onnx as onnx_frontend

    def broken(ctx, node, inputs, attrs):
        return [{}["missing"]]
    monkeypatch.setitem(onnx_frontend.SUPPORTED_OPS, "Relu", broken)
    case = valid_case("Relu", 17)
    with pytest.raises(byoc.ModelError, match=r"Relu node 'node_under_test' could not be converted; the model is "
                                              r"malformed \(KeyError: 'missing'\)") as caught:
        byoc.from_onnx(case.model())
    assert isinstance(caught.value.__cause__, KeyError)


def test_a_name_that_is_not_utf8_is_refused_where_it_is():
    data = bytearray(valid_case("Relu", 17).model().SerializeToString())
    position = data.index(NODE_NAME.encode())
    data[position] = 0xFF
    with pytest.raises(byoc.ModelError, match=r"the given bytes is not a valid ONNX model: model\.graph\.node\[0\]"
                                              r"\.name is not valid UTF-8 text"):
        byoc.from_onnx(bytes(data))


def test_a_folded_constant_is_limited_in_bytes_as_well_as_elements():
    """2**30 int64 elements are under the element limit, but 8 GiB: a ConstantOfShape of
    them is refused before NumPy fills them (the kernel, not NumPy, would end the process)."""
    case = valid_case("ConstantOfShape", 17)
    case.inputs[0] = i64(2**30)
    case = case.with_attribute("value", numpy_helper.from_array(np.array([7], dtype=np.int64)))
    with pytest.raises(byoc.ModelError, match=r"ConstantOfShape node 'node_under_test': its output of shape "
                                              r"\[1073741824\] \(8589934592 bytes\) is a constant computed at import "
                                              r"time; expected at most 2\*\*31 elements and 2\*\*32 bytes"):
        byoc.from_onnx(case.model())


def test_describe_model_answers_or_names_the_fault_for_mutated_models():
    """`byoc inspect MODEL.onnx` (describe_model) on flipped bytes, truncations and odd
    graphs: a description or a byoc error, never a raw exception."""
    import random
    from onnx import TensorProto, helper
    from byoc.frontend.onnx import describe_model
    fixtures = Path(__file__).parent / "fixtures"
    rng = random.Random(0)
    blobs = []
    for name in ("mlp", "bert2", "resnet_small"):
        data = (fixtures / f"{name}.onnx").read_bytes()
        blobs += [data[:int(len(data) * fraction)] for fraction in (0.0, 0.01, 0.5, 0.99)]
        for _ in range(25):
            flipped = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            blobs.append(bytes(flipped))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", None, 3])
    untyped = helper.make_value_info("u", helper.TypeProto())
    sequence = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    odd = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    odd.data_type = 99
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Foo", ["u"], ["v"], domain="x.y")],
                              "g", [x, untyped, sequence], [y], [odd])
    blobs.append(helper.make_model(graph).SerializeToString())
    described = 0
    for blob in blobs:
        try:
            describe_model(blob)
            described += 1
        except byoc.ByocError:
            pass
    assert described > 0  # the odd graph, at least, is described
    odd_description = describe_model(blobs[-1])
    assert odd_description["inputs"][0]["dims"] == ["batch", "?", 3]
    assert odd_description["unsupported"] == ["x.y.Foo"]
