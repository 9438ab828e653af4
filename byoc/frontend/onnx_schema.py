"""Checks of one ONNX node against its operator schema, before its converter runs.

`check_node(node, opset, label)` holds a node to what `onnx.defs.get_schema(op_type,
opset)` and the operator docs (onnx/docs/Operators.md) say, so that a converter can read
its inputs and attributes without guarding against a malformed model:
  - the op type exists at the model's opset;
  - the input and output counts are within the schema's ranges, and no required input is
    omitted (an empty name);
  - every attribute is one the schema knows, given once, of its declared type, and the
    required ones are present;
  - attribute values lie in the domains the operator docs give (`ATTRIBUTE_DOMAINS`):
    flags that are 0 or 1, enumerated strings, element types, positive sizes.
`check_input_types(node, schema, dtypes, label)` then holds the inputs' element types to
the schema's type constraints. Each refusal is a ModelError that names the node, the
attribute or input at fault and what was expected. Checks that need the inputs' shapes or
values (an axis within the rank, a kernel of the input's spatial rank, a 1-D shape tensor)
are the converters' and the ops' type inference's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import onnx

from ..errors import ModelError

_AttributeType = onnx.AttributeProto.AttributeType
_OPTIONAL = onnx.defs.OpSchema.FormalParameterOption.Optional
_VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Variadic


@dataclass(frozen=True)
class Domain:
    """The values an attribute may take: a predicate and the words that say it."""
    accepts: Callable[[object], bool]
    expected: str


def _one_of(*choices: str) -> Domain:
    return Domain(lambda value: value in choices, "one of " + ", ".join(repr(c) for c in choices))


def _at_least(low: int) -> Domain:
    return Domain(lambda value: value >= low, f"an integer >= {low}")


def _each_at_least(low: int) -> Domain:
    return Domain(lambda values: all(v >= low for v in values), f"integers >= {low}")


def _element_type_named(names: tuple[str, ...], what: str) -> Domain:
    codes = {onnx.TensorProto.DataType.Value(name) for name in names}
    listing = ", ".join(f"{name}={onnx.TensorProto.DataType.Value(name)}" for name in names)
    return Domain(lambda value: value in codes, f"{what} ({listing})")


_FLAG = Domain(lambda value: value in (0, 1), "0 or 1")
_ELEMENT_TYPES = tuple(name for name in onnx.TensorProto.DataType.keys() if name != "UNDEFINED")
_FLOAT_TYPES = ("FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE")

# Attribute value domains from the ONNX operator docs, for the attributes of the op types
# byoc converts. A plain key applies to every op that has an attribute of that name (it
# means the same thing in each); "Op.attribute" applies to one op type.
ATTRIBUTE_DOMAINS: dict[str, Domain] = {
    # flags: documented as booleans stored in an int, or as two enumerated values
    "keepdims": _FLAG, "noop_with_empty_axes": _FLAG, "select_last_index": _FLAG,
    "transA": _FLAG, "transB": _FLAG, "exclusive": _FLAG, "reverse": _FLAG, "upper": _FLAG,
    "ceil_mode": _FLAG, "count_include_pad": _FLAG, "allowzero": _FLAG, "fmod": _FLAG,
    "training_mode": _FLAG, "saturate": _FLAG,
    "storage_order": _FLAG,  # 0 row major, 1 column major
    # enumerated strings
    "auto_pad": _one_of("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"),
    "Pad.mode": _one_of("constant", "reflect", "edge", "wrap"),
    "Gelu.approximate": _one_of("none", "tanh"),
    "round_mode": _one_of("up", "down", "nearest"),
    # element types (TensorProto.DataType codes)
    "Cast.to": _element_type_named(_ELEMENT_TYPES, "an ONNX element type"),
    "stash_type": _element_type_named(_FLOAT_TYPES, "a floating-point ONNX element type"),
    # sizes of convolution and pooling windows (Conv, MaxPool, AveragePool)
    "group": _at_least(1), "kernel_shape": _each_at_least(1), "strides": _each_at_least(1),
    "dilations": _each_at_least(1), "pads": _each_at_least(0),
    "Split.num_outputs": _at_least(1),
}


def schema_of(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The op's schema at `opset`, or None when the default domain has no such op type."""
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def check_node(node: onnx.NodeProto, opset: int, label: str) -> onnx.defs.OpSchema:
    """Raise ModelError, naming `label` (the node), when the node does not fit its schema;
    return the schema."""
    schema = schema_of(node.op_type, opset)
    if schema is None:
        _refuse_missing_schema(node.op_type, opset, label)
    where = f"{node.op_type} at opset {opset}"
    _check_count(label, "input", list(node.input), schema.inputs, schema.min_input, schema.max_input, where)
    _check_count(label, "output", list(node.output), schema.outputs, schema.min_output, schema.max_output, where)
    for position, name in enumerate(node.input):
        if name == "":
            _check_omitted_input(label, schema, position)
    _check_attributes(node, schema, label, where)
    return schema


# byoc dtype -> the ONNX type string that schemas' type constraints list
_TYPE_STRINGS = {"float32": "tensor(float)", "float64": "tensor(double)", "float16": "tensor(float16)",
                 "bfloat16": "tensor(bfloat16)", "int64": "tensor(int64)", "int32": "tensor(int32)",
                 "int16": "tensor(int16)", "int8": "tensor(int8)", "uint8": "tensor(uint8)", "bool": "tensor(bool)"}


def check_input_types(node: onnx.NodeProto, schema: onnx.defs.OpSchema, dtypes: list, label: str):
    """The inputs' element types (byoc dtypes; None for an omitted input) against the
    schema's type constraints: each allowed for its parameter, and inputs that share a type
    parameter (Add's A and B are both T) of one type."""
    allowed = {constraint.type_param_str: constraint.allowed_type_strs for constraint in schema.type_constraints}
    params = schema.inputs
    bound: dict[str, tuple[str, str]] = {}  # type parameter -> (dtype, the input that fixed it)
    for position, dtype in enumerate(dtypes):
        if dtype is None or not params:
            continue
        param = params[min(position, len(params) - 1)]
        what = f"input {position} ({param.name})"
        type_string = _TYPE_STRINGS.get(dtype)
        choices = allowed.get(param.type_str, [param.type_str])
        if type_string not in choices:
            names = sorted(name[len("tensor("):-1] for name in choices if name.startswith("tensor("))
            raise ModelError(f"{label}: {what} has element type {dtype}; {node.op_type} expects one of "
                             f"{', '.join(names)}")
        if param.type_str in allowed:
            first = bound.setdefault(param.type_str, (dtype, what))
            if first[0] != dtype:
                raise ModelError(f"{label}: {what} has element type {dtype}, but {first[1]} has {first[0]}; "
                                 f"expected one element type for both ({node.op_type}'s type {param.type_str})")


def _refuse_missing_schema(op_type: str, opset: int, label: str):
    later = next((version for version in range(opset + 1, onnx.defs.onnx_opset_version() + 1)
                  if schema_of(op_type, version) is not None), None)
    if later is None:
        raise ModelError(f"{label}: ONNX has no operator {op_type!r} in the default domain")
    raise ModelError(f"{label}: ONNX defines {op_type} from opset {later}, but the model imports opset "
                     f"{opset}; expected an operator of the model's opset")


def _parameter_names(params) -> str:
    """'input, min?, max?' ('?' optional, '...' variadic), or 'none'."""
    marks = {_OPTIONAL: "?", _VARIADIC: "..."}
    return ", ".join(p.name + marks.get(p.option, "") for p in params) or "none"


def _check_count(label, kind, names, params, low, high, where):
    count = len(names)
    if low <= count <= high:
        return
    if low == high:
        expected = f"{low}"
    elif high >= 2**31 - 1:
        expected = f"at least {low}"
    else:
        expected = f"{low} to {high}"
    verb = "takes" if kind == "input" else "produces"
    raise ModelError(f"{label}: {count} {kind}(s) {names} given; {where} {verb} {expected} "
                     f"({_parameter_names(params)})")


def _check_omitted_input(label: str, schema, position: int):
    """An empty input name omits an optional input; for a required one the converter
    would meet None where it expects a value."""
    params = schema.inputs
    if not params:
        return
    param = params[min(position, len(params) - 1)]  # a variadic parameter is the last
    if param.option != _OPTIONAL:
        raise ModelError(f"{label}: required input {position} ({param.name}) is empty; expected the name "
                         f"of a value")


def _check_attributes(node: onnx.NodeProto, schema, label: str, where: str):
    """Attribute names (as onnx.checker does: a misspelt one would be ignored silently, one
    given twice would keep only its last value), types and values against the schema."""
    names = [attribute.name for attribute in node.attribute]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ModelError(f"{label}: attribute(s) {twice} given more than once; expected each once")
    allowed = schema.attributes
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise ModelError(f"{label}: unknown attribute(s) {unknown} for {where}; allowed: "
                         f"{', '.join(sorted(allowed)) or 'none'}")
    missing = [name for name, attribute in allowed.items() if attribute.required and name not in names]
    if missing:
        raise ModelError(f"{label}: required attribute(s) {missing} missing; {where} requires "
                         f"{', '.join(repr(n) for n, a in sorted(allowed.items()) if a.required)}")
    for attribute in node.attribute:
        declared = allowed[attribute.name].type
        _check_attribute_type(label, attribute, declared)
        domain = ATTRIBUTE_DOMAINS.get(f"{node.op_type}.{attribute.name}") or ATTRIBUTE_DOMAINS.get(attribute.name)
        if domain is not None:
            value = onnx.helper.get_attribute_value(attribute)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            elif isinstance(value, list) and not all(isinstance(v, int) for v in value):
                value = []  # a list of another kind: its type was checked above
            if not domain.accepts(value):
                raise ModelError(f"{label}: attribute {attribute.name!r} is {value!r}; expected {domain.expected}")


def _check_attribute_type(label: str, attribute: onnx.AttributeProto, declared):
    if attribute.ref_attr_name:
        raise ModelError(f"{label}: attribute {attribute.name!r} refers to function attribute "
                         f"{attribute.ref_attr_name!r}; expected a value (references are only valid "
                         f"inside a function body)")
    expected = _AttributeType.Name(declared.value)
    if attribute.type == declared.value:
        return
    given = _AttributeType.Name(attribute.type) if attribute.type in _AttributeType.values() else attribute.type
    raise ModelError(f"{label}: attribute {attribute.name!r} is of type {given}; expected {expected}")
