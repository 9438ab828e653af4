"""Reading an ONNX model file before importing it: loading it with its checks (size,
protobuf, text that is not UTF-8), the element types and declared dims of its values,
the shapes and dims a user gives for its inputs, and describe_model (what `byoc inspect
MODEL.onnx` prints). onnx.py imports what this reads."""
from __future__ import annotations

from pathlib import Path

import google.protobuf.message
import numpy as np
import onnx

from ..errors import ModelError, UnsupportedOpError
from ..ir.types import NUMPY_DTYPES, TensorType, is_static_shape
from .onnx_external_data import ExternalData

# ONNX TensorProto element type -> byoc dtype
ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT16: "int16", onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool",
}


def checked_dims(dims) -> dict:
    if dims is None:
        return {}
    if not isinstance(dims, dict) or not all(isinstance(name, str) for name in dims):
        raise ModelError(f"dims is {dims!r}; expected a mapping of named dims to sizes, e.g. {{'batch': 1}}")
    for name, size in dims.items():
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ModelError(f"dims[{name!r}] = {size!r} is not a size; expected a non-negative integer")
    return {name: int(size) for name, size in dims.items()}


def describe_model(model) -> dict:
    """A model's interface and contents without importing it: opset, inputs and outputs
    (dtype, dims: ints, a named dim's name, "?" when unknown), the named dims and which
    inputs carry them, node counts per op type, the op types byoc does not import, and the
    initializers' bytes. What `byoc inspect MODEL.onnx` prints."""
    from .onnx import SUPPORTED_OPS  # filled as onnx.py imports its converters
    proto = load_model(model)
    graph = proto.graph
    initializers = {tensor.name for tensor in graph.initializer}

    def tensor_entry(value):
        tensor_type = value.type.tensor_type
        elem = tensor_type.elem_type
        dtype = ONNX_DTYPES.get(elem) or elem_type_name(elem)
        return {"name": value.name, "dtype": dtype, "dims": declared_dims(tensor_type)}

    inputs = [tensor_entry(value) for value in graph.input if value.name not in initializers]
    named: dict = {}
    for entry in inputs:
        for axis, dim in enumerate(entry["dims"] or []):
            if isinstance(dim, str):
                named.setdefault(dim, []).append(f"{entry['name']}[{axis}]")
    counts: dict = {}
    for node in graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        counts[key] = counts.get(key, 0) + 1
    weight_bytes = 0
    for tensor in graph.initializer:
        size = 1
        for dim in tensor.dims:
            size *= dim
        itemsize = np.dtype(ONNX_DTYPES[tensor.data_type]).itemsize if tensor.data_type in ONNX_DTYPES else 0
        weight_bytes += size * itemsize
    return {
        "ir_version": proto.ir_version, "producer": f"{proto.producer_name} {proto.producer_version}".strip(),
        "opsets": {(o.domain or "ai.onnx"): o.version for o in proto.opset_import},
        "inputs": inputs, "outputs": [tensor_entry(value) for value in graph.output],
        "named_dims": named, "nodes": len(graph.node), "op_types": dict(sorted(counts.items())),
        "unsupported": sorted(op for op in counts if op not in SUPPORTED_OPS),
        "initializers": len(graph.initializer), "initializer_bytes": weight_bytes,
    }


def input_tensor_type(name: str, shape: tuple, dtype: str) -> TensorType:
    try:
        return TensorType(shape, dtype)
    except TypeError as error:  # a dim or an element count beyond int64
        raise ModelError(f"input {name!r} of shape {shape}: {error}") from None


def checked_input_shapes(input_shapes) -> dict:
    """`input_shapes` as {name: tuple of ints}. Checked before use: int() would truncate a
    dim of 4.5 and iterate a string '4,64' character by character."""
    if input_shapes is None:
        return {}
    if not isinstance(input_shapes, dict):
        raise ModelError(f"input_shapes is a {type(input_shapes).__name__} ({input_shapes!r}); expected a "
                         f"mapping of input name to shape, e.g. {{'x': (4, 64)}}")
    for name, dims in input_shapes.items():
        if not is_static_shape(dims):
            raise ModelError(f"input_shapes[{name!r}] = {dims!r} is not a shape; expected a tuple of "
                             f"non-negative integers")
    return {name: tuple(int(dim) for dim in dims) for name, dims in input_shapes.items()}


def load_model(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        bad_text = first_invalid_text(model, "model")
        if bad_text:  # a ModelProto parsed by the caller from a corrupted file
            raise ModelError(f"the given ModelProto is not a valid ONNX model: {bad_text} is not valid UTF-8 text")
        return model
    if isinstance(model, (str, Path)):
        path = Path(model)
        try:
            if path.is_dir():
                raise ModelError(f"ONNX model path {str(path)!r} is a directory; expected an .onnx file")
            if not path.is_file():  # a FIFO or device would block or never end
                raise ModelError(f"ONNX model file {str(path)!r} does not exist or is not a regular file")
            data, where = path.read_bytes(), f"file {str(path)!r}"
        except (OSError, ValueError) as error:  # a name too long, no permission, a NUL byte
            raise ModelError(f"ONNX model file {str(path)!r} cannot be read: {error}") from None
    elif isinstance(model, (bytes, bytearray)):
        data, where = bytes(model), "the given bytes"
    else:
        raise ModelError(f"expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as error:  # protobuf raises DecodeError or RuntimeWarning-like errors
        raise ModelError(f"{where} is not a valid ONNX model (truncated or not ONNX): {error}") from None
    if not proto.HasField("graph") or not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{where} is not a valid ONNX model: it has no graph")
    bad_text = first_invalid_text(proto, "model")
    if bad_text:
        raise ModelError(f"{where} is not a valid ONNX model: {bad_text} is not valid UTF-8 text")
    return proto


def load_model_and_weights(model) -> tuple:
    """load_model, for an import: (the ModelProto, {position in graph.initializer: the
    bytes of that initializer's raw_data}, the ExternalData its tensors stored beside the
    model read from). A model given as a file or bytes is parsed without
    its initializers' raw_data (split_initializer_data), which the importer then views where
    it lies in the file's bytes: parsing a BERT-base with its 415 MB of weights copied them
    twice (the parser, then each read of raw_data). A ModelProto comes with an empty map.
    Only a model given by its path has a folder to read external data from."""
    folder = Path(model).parent if isinstance(model, (str, Path)) else None
    external = ExternalData(folder)
    if isinstance(model, onnx.ModelProto) or not isinstance(model, (str, Path, bytes, bytearray)):
        return load_model(model), {}, external
    if isinstance(model, (str, Path)):
        path = Path(model)
        try:
            data = path.read_bytes() if path.is_file() else None
        except (OSError, ValueError):
            data = None
        if data is None:
            return load_model(model), {}, external  # its error: missing, a directory, unreadable
    else:
        data = bytes(model)
    split = split_initializer_data(data)
    whole = data if isinstance(model, (bytes, bytearray)) else model
    if split is None:
        return load_model(whole), {}, external
    stripped, places = split
    try:
        proto = load_model(stripped)
    except ModelError:
        return load_model(whole), {}, external  # the whole file's error
    view = memoryview(data)
    return proto, {position: view[start:end] for position, (start, end) in places.items()}, external


# Field numbers of onnx.proto: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9


def _fields(data: bytes, start: int, end: int):
    """(field number, wire type, where the field starts, where its payload starts, where it
    ends) of each field of the message data[start:end]; ValueError where the bytes are not
    protobuf's wire format (a truncated or corrupted file)."""
    at = start
    while at < end:
        first = at
        key, at = _varint(data, at, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = _varint(data, at, end)
            payload = at
        elif wire == 1 or wire == 5:
            payload = at
            at += 8 if wire == 1 else 4
        elif wire == 2:
            length, payload = _varint(data, at, end)
            at = payload + length
        else:  # groups (never in ONNX) and invalid wire types
            raise ValueError(f"wire type {wire}")
        if at > end or number == 0:
            raise ValueError("a field past its message")
        yield number, wire, first, payload, at


def _varint(data: bytes, at: int, end: int) -> tuple:
    value, shift = 0, 0
    while True:
        if at >= end or shift > 63:
            raise ValueError("a truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _length_prefixed(number: int, body: bytes) -> bytes:
    """A length-delimited field: its key, its length, `body`."""
    out = bytearray()
    for value in ((number << 3) | 2, len(body)):
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out) + body


def split_initializer_data(data: bytes):
    """(the model's bytes without the raw_data of graph.initializer, {position of the
    initializer: (start, end) of its raw_data in `data`}), or None when `data` is not
    protobuf's wire format (then the whole parse says why). Only the main graph's
    initializers: subgraphs and Constant nodes keep their data (they are small)."""
    places: dict = {}
    position = 0
    try:
        model_parts = []
        for number, wire, first, payload, end in _fields(data, 0, len(data)):
            if number != _MODEL_GRAPH or wire != 2:
                model_parts.append(data[first:end])
                continue
            graph_parts = []
            for g_number, g_wire, g_first, g_payload, g_end in _fields(data, payload, end):
                if g_number != _GRAPH_INITIALIZER or g_wire != 2:
                    graph_parts.append(data[g_first:g_end])
                    continue
                tensor_parts, raw = [], None
                for t_number, t_wire, t_first, t_payload, t_end in _fields(data, g_payload, g_end):
                    if t_number == _TENSOR_RAW_DATA and t_wire == 2:
                        raw = (t_payload, t_end)  # the last one counts, as in a parse
                    else:
                        tensor_parts.append(data[t_first:t_end])
                if raw is not None:
                    places[position] = raw
                position += 1
                graph_parts.append(_length_prefixed(_GRAPH_INITIALIZER, b"".join(tensor_parts)))
            model_parts.append(_length_prefixed(_MODEL_GRAPH, b"".join(graph_parts)))
    except (ValueError, IndexError):
        return None
    return b"".join(model_parts), places


def first_invalid_text(message, path: str) -> str | None:
    """The path of the first string field (a name, an op type, ...) that is not UTF-8, or
    None. ONNX's .proto is proto2, whose parser does not check text: such a field reads as
    bytes, and a name that is bytes would fail far from here (comparing it with a str)."""
    # The descriptor's fields, not ListFields(): that would hand over every set field's
    # value, a tensor's raw_data too (a copy of every weight: 0.14 s of BERT-base's import).
    for field in message.DESCRIPTOR.fields:
        if field.type not in (field.TYPE_STRING, field.TYPE_MESSAGE):
            continue  # numbers and bytes (raw_data): nothing to check, nothing to walk
        # (protobuf 6 and later say is_repeated; earlier ones label, which 7 dropped)
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        single = not repeated
        if single and not message.HasField(field.name):
            continue
        value = getattr(message, field.name)
        for position, item in enumerate([value] if single else value):
            where = f"{path}.{field.name}" if single else f"{path}.{field.name}[{position}]"
            if isinstance(item, bytes):
                return where
            if field.type == field.TYPE_MESSAGE:
                found = first_invalid_text(item, where)
                if found:
                    return found
    return None


def elem_type_name(elem_type: int):
    """FLOAT16 for 10; the number itself when ONNX has no such type."""
    return onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else elem_type


def dtype_of_elem_type(elem_type: int, what: str) -> str:
    if elem_type == onnx.TensorProto.UNDEFINED or elem_type not in onnx.TensorProto.DataType.values():
        raise ModelError(f"{what} has element type {elem_type_name(elem_type)}; expected an ONNX element type "
                         f"(byoc supports {', '.join(NUMPY_DTYPES)})")
    if elem_type not in ONNX_DTYPES:
        raise UnsupportedOpError(
            f"{what} has element type {elem_type_name(elem_type)}; byoc supports {', '.join(NUMPY_DTYPES)}")
    return ONNX_DTYPES[elem_type]


def declared_dims(tensor_type) -> list | None:
    """A graph input's declared dims (ints; a dim's name, or "?" when unknown), or None
    when it declares no shape."""
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim]


def fits_declared(declared: list, dims: tuple) -> bool:
    """Whether `dims` fit a declared shape (a named or unknown dim fits any size)."""
    return len(declared) == len(dims) and all(not isinstance(d, int) or d == g for d, g in zip(declared, dims))


def node_label(node: onnx.NodeProto, index: int) -> str:
    return f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node #{index}"
