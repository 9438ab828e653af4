"""ONNX -> IRModule.

`from_onnx(model, input_shapes=None)` reads a model (path, bytes or ModelProto) of the
default ONNX domain, opsets 13 up to the newest that the installed `onnx` knows, and
returns an IRModule whose "main" takes the graph inputs (initializers are not inputs:
they become Constants) and returns the graph outputs (one tensor, or a tuple).

Every value is either a NumPy array (known at import time) or an IR expression. A node
whose inputs are all known is evaluated on the spot with the ops' NumPy references, so
shape arithmetic (Shape, Gather on shapes, ConstantOfShape, Range, Expand, ...) folds away
and an exported transformer becomes a graph of compute ops only. A result of more than
MAX_FOLDED_ELEMENTS elements or MAX_FOLDED_BYTES bytes is not computed at import time: the
op is emitted instead.

Each supported ONNX op type has one converter in `SUPPORTED_OPS`. Before it runs, the node
is held to its ONNX schema (`onnx_schema.check_node`: input and output counts, attribute
names, types and value domains; then its inputs' element types), so a malformed model is
refused with a ModelError naming the node and the attribute or input at fault. A converter
that meets an attribute combination byoc does not implement raises UnsupportedOpError
naming the node and the attribute; a model with op types nobody converts fails before
conversion with ONE error listing every such type and the first node of each. Any other
error escaping a converter (an IndexError on a value it did not expect) becomes a
ModelError naming the node, with the original error chained.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import google.protobuf.message
import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ByocError, ModelError, UnsupportedOpError
from ..interpreter import byte_count, evaluate_call
from ..ir.builder import FunctionBuilder
from ..ir.expr import Call, Constant, Expr
from ..ir.module import IRModule
from ..ir.op import get_op
from ..ir.types import NUMPY_DTYPES, TensorType, dtype_of_numpy, is_float, is_static_shape
from .onnx_schema import check_input_types, check_node

MIN_OPSET = 13
MAX_OPSET = onnx.defs.onnx_opset_version()

# ONNX TensorProto element type -> byoc dtype
_ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT16: "int16", onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool",
}

# Folding evaluates shape arithmetic at import time and keeps its results as constants in
# memory (and in the built library): a result larger than this is emitted as an op instead
# (or refused where it must be known at import: a shape), rather than exhausting memory.
# Both limits hold: 2**31 int64 elements would be 16 GiB, and a few such values (a
# ConstantOfShape, then a Cast of it) would have the kernel end the process before NumPy
# could raise MemoryError.
MAX_FOLDED_ELEMENTS = 2**31
MAX_FOLDED_BYTES = 2**32

# Errors of Python's own that a converter meets on input or attribute values it does not
# expect (an index past a list's end, an int() of a string, ...): a malformed model.
_MALFORMED_MODEL_ERRORS = (LookupError, ValueError, TypeError, ArithmeticError, AttributeError)

Value = "np.ndarray | Expr"
SUPPORTED_OPS: dict[str, Callable] = {}


def converter(*op_types: str):
    """Register a converter `fn(ctx, node, inputs, attrs) -> list of values` for op types."""
    def register(fn):
        for op_type in op_types:
            SUPPORTED_OPS[op_type] = fn
        return fn
    return register


def from_onnx(model, input_shapes: dict | None = None, dims: dict | None = None) -> IRModule:
    """Import an ONNX model. Inputs with symbolic or unknown dims need static shapes (the
    error names every such input): `input_shapes` maps input names to full shapes, `dims`
    named dims to sizes, once for every input that declares them (onnxruntime's free
    dimension overrides by name: {"batch": 1, "sequence": 128}); an input in input_shapes
    takes that shape."""
    proto = _load(model)
    return _Importer(proto, _checked_input_shapes(input_shapes), _checked_dims(dims)).run()


def _checked_dims(dims) -> dict:
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
    proto = _load(model)
    graph = proto.graph
    initializers = {tensor.name for tensor in graph.initializer}

    def tensor_entry(value):
        tensor_type = value.type.tensor_type
        elem = tensor_type.elem_type
        dtype = _ONNX_DTYPES.get(elem) or _elem_type_name(elem)
        return {"name": value.name, "dtype": dtype, "dims": _declared_dims(tensor_type)}

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
        itemsize = np.dtype(_ONNX_DTYPES[tensor.data_type]).itemsize if tensor.data_type in _ONNX_DTYPES else 0
        weight_bytes += size * itemsize
    return {
        "ir_version": proto.ir_version, "producer": f"{proto.producer_name} {proto.producer_version}".strip(),
        "opsets": {(o.domain or "ai.onnx"): o.version for o in proto.opset_import},
        "inputs": inputs, "outputs": [tensor_entry(value) for value in graph.output],
        "named_dims": named, "nodes": len(graph.node), "op_types": dict(sorted(counts.items())),
        "unsupported": sorted(op for op in counts if op not in SUPPORTED_OPS),
        "initializers": len(graph.initializer), "initializer_bytes": weight_bytes,
    }


def _input_tensor_type(name: str, shape: tuple, dtype: str) -> TensorType:
    try:
        return TensorType(shape, dtype)
    except TypeError as error:  # a dim or an element count beyond int64
        raise ModelError(f"input {name!r} of shape {shape}: {error}") from None


def _checked_input_shapes(input_shapes) -> dict:
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


def _load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        bad_text = _first_invalid_text(model, "model")
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
    bad_text = _first_invalid_text(proto, "model")
    if bad_text:
        raise ModelError(f"{where} is not a valid ONNX model: {bad_text} is not valid UTF-8 text")
    return proto


def _first_invalid_text(message, path: str) -> str | None:
    """The path of the first string field (a name, an op type, ...) that is not UTF-8, or
    None. ONNX's .proto is proto2, whose parser does not check text: such a field reads as
    bytes, and a name that is bytes would fail far from here (comparing it with a str)."""
    for field, value in message.ListFields():
        if field.type not in (field.TYPE_STRING, field.TYPE_MESSAGE):
            continue  # numbers and bytes (raw_data): nothing to check, nothing to walk
        single = isinstance(value, (str, bytes)) or field.type == field.TYPE_MESSAGE and \
            isinstance(value, google.protobuf.message.Message)
        for position, item in enumerate([value] if single else value):
            where = f"{path}.{field.name}" if single else f"{path}.{field.name}[{position}]"
            if isinstance(item, bytes):
                return where
            if field.type == field.TYPE_MESSAGE:
                found = _first_invalid_text(item, where)
                if found:
                    return found
    return None


def _elem_type_name(elem_type: int):
    """FLOAT16 for 10; the number itself when ONNX has no such type."""
    return onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else elem_type


def _dtype_of_elem_type(elem_type: int, what: str) -> str:
    if elem_type == onnx.TensorProto.UNDEFINED or elem_type not in onnx.TensorProto.DataType.values():
        raise ModelError(f"{what} has element type {_elem_type_name(elem_type)}; expected an ONNX element type "
                         f"(byoc supports {', '.join(NUMPY_DTYPES)})")
    if elem_type not in _ONNX_DTYPES:
        raise UnsupportedOpError(
            f"{what} has element type {_elem_type_name(elem_type)}; byoc supports {', '.join(NUMPY_DTYPES)}")
    return _ONNX_DTYPES[elem_type]


def _declared_dims(tensor_type) -> list | None:
    """A graph input's declared dims (ints; a dim's name, or "?" when unknown), or None
    when it declares no shape."""
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim]


def _fits(declared: list, dims: tuple) -> bool:
    """Whether `dims` fit a declared shape (a named or unknown dim fits any size)."""
    return len(declared) == len(dims) and all(not isinstance(d, int) or d == g for d, g in zip(declared, dims))


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node #{index}"


class _Importer:
    def __init__(self, proto: onnx.ModelProto, input_shapes: dict, dims: dict | None = None):
        self.proto = proto
        self.graph = proto.graph
        self.input_shapes = input_shapes
        self.dims = dims or {}
        self.opset = self._check_opset()
        self.values: dict[str, object] = {}
        self.builder = FunctionBuilder("main")
        self.node_label = ""
        # Values left unfolded because they are too large to compute at import time (see
        # `call`), and those computed from them: value -> (node label, element count).
        self.unfolded: dict[Expr, tuple[str, int]] = {}

    # ---- checks before conversion ------------------------------------------------
    def _check_opset(self) -> int:
        opset = None
        for entry in self.proto.opset_import:
            if entry.domain in ("", "ai.onnx"):
                opset = entry.version
        if opset is None:
            raise ModelError("the model imports no default-domain ONNX opset")
        if opset < MIN_OPSET or opset > MAX_OPSET:
            raise ModelError(
                f"the model uses ONNX opset {opset}; byoc reads opsets {MIN_OPSET} to {MAX_OPSET} "
                f"(convert it with onnx.version_converter.convert_version)")
        return opset

    def _check_unique_names(self):
        """ONNX graphs are in SSA form: each graph input, initializer and node output names a
        value once (an initializer may share a graph input's name: it is that input's
        default). A second definition would silently replace the first."""
        defined: dict[str, str] = {}  # value name -> what defines it
        for kind, entries in (("graph input", self.graph.input), ("initializer", self.graph.initializer)):
            seen: dict[str, int] = {}
            for position, entry in enumerate(entries):
                if entry.name in seen:
                    raise ModelError(f"{kind} {entry.name!r} is listed twice ({kind}s #{seen[entry.name]} and "
                                     f"#{position}); expected unique {kind} names")
                seen[entry.name] = position
                defined.setdefault(entry.name, f"{kind} {entry.name!r}")
        for index, node in enumerate(self.graph.node):
            label = _node_label(node, index)
            for name in node.output:
                if not name:
                    continue  # an omitted optional output
                if name in defined:
                    other = "it" if defined[name] == label else defined[name]
                    raise ModelError(f"{label} writes value {name!r}, which {other} already defines; "
                                     f"expected each value to be defined once (ONNX graphs are in SSA form)")
                defined[name] = label

    def _check_supported(self):
        first_node: dict[str, str] = {}
        for index, node in enumerate(self.graph.node):
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            if key not in SUPPORTED_OPS or node.domain not in ("", "ai.onnx"):
                first_node.setdefault(key, node.name or f"#{index}")
        if first_node:
            listing = "; ".join(f"{op} (first node {name!r})" for op, name in sorted(first_node.items()))
            raise UnsupportedOpError(
                f"the model uses {len(first_node)} unsupported ONNX op type(s): {listing}. "
                f"Supported: {', '.join(sorted(SUPPORTED_OPS))}")

    # ---- conversion --------------------------------------------------------------
    def run(self) -> IRModule:
        self._check_unique_names()
        self._check_supported()
        initializer_names = {tensor.name for tensor in self.graph.initializer}
        inputs = [i.name for i in self.graph.input if i.name not in initializer_names]
        # the given shapes first: a misspelled name is the mistake to report, not the
        # dynamic dims it left unset
        unknown = set(self.input_shapes) - {i.name for i in self.graph.input}
        if unknown:
            raise ModelError(f"input_shapes names {sorted(unknown)}, which are not model inputs; "
                             f"the inputs are {inputs}")
        constant = set(self.input_shapes) - set(inputs)
        if constant:  # its shape would be ignored: the initializer's data is used
            raise ModelError(f"input_shapes names {sorted(constant)}, graph input(s) that an initializer gives "
                             f"a value byoc keeps constant; the inputs are {inputs}")
        declared_names = {d for i in self.graph.input if i.name not in initializer_names and
                          i.type.HasField("tensor_type") for d in _declared_dims(i.type.tensor_type) or ()
                          if isinstance(d, str) and d != "?"}
        unused = sorted(set(self.dims) - declared_names)
        if unused:
            raise ModelError(f"dims names {unused}, which no model input declares; the named dims are "
                             f"{sorted(declared_names) or 'none'}")
        self._check_all_inputs_static()
        initializers = {}
        for tensor in self.graph.initializer:
            self.values[tensor.name] = self._tensor_to_array(tensor, f"initializer {tensor.name!r}")
            initializers[tensor.name] = tensor
        for graph_input in self.graph.input:
            if graph_input.name in initializers:
                # an initializer listed as input: a default we keep constant
                self._check_initializer_fits_input(initializers[graph_input.name], graph_input)
                continue
            self.values[graph_input.name] = self.builder.param(graph_input.name, self._input_type(graph_input))
        for index, node in enumerate(self.graph.node):
            self._convert_node(index, node)
        results = []
        for output in self.graph.output:
            if output.name not in self.values:
                raise ModelError(f"graph output {output.name!r} is produced by no node")
            self._check_declared_output(output, self.type_of(self.values[output.name]))
            results.append(self._as_expr(self.values[output.name]))
        self.builder.ret(*results)
        mod = self.builder.module()
        # The graph's output names, for the built library's metadata (main returns a tuple).
        mod.attrs["output_names"] = [output.name for output in self.graph.output]
        return mod

    @staticmethod
    def _check_declared_output(output: onnx.ValueInfoProto, computed: TensorType):
        """A graph output's declared element type and static dims must be what the graph
        computes (as onnx.checker's full check and onnxruntime require): a caller reading
        the declaration would otherwise get another type or shape than promised."""
        if not output.type.HasField("tensor_type"):
            return
        tensor_type = output.type.tensor_type
        if tensor_type.elem_type:
            declared = _dtype_of_elem_type(tensor_type.elem_type, f"graph output {output.name!r}")
            if declared != computed.dtype:
                raise ModelError(f"graph output {output.name!r} is declared {declared}, but the graph computes "
                                 f"{computed.dtype}; expected the declared element type")
        dims = _declared_dims(tensor_type)
        if dims is not None and not _fits(dims, tuple(computed.shape)):
            raise ModelError(f"graph output {output.name!r} is declared with shape {tuple(dims)}, but the graph "
                             f"computes {tuple(computed.shape)}; expected the declared shape (a named or unknown "
                             f"dim fits any size)")

    def _tensor_to_array(self, tensor: onnx.TensorProto, what: str) -> np.ndarray:
        dtype = _dtype_of_elem_type(tensor.data_type, what)
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise ModelError(f"{what} stores its data externally; load the model with "
                             f"onnx.load(path, load_external_data=True) and pass the ModelProto")
        dims = list(tensor.dims)
        if any(dim < 0 for dim in dims):
            raise ModelError(f"{what} has dims {dims}; expected non-negative dims")
        count = math.prod(dims)
        if tensor.HasField("raw_data"):
            needed = count * NUMPY_DTYPES[dtype].itemsize
            if len(tensor.raw_data) != needed:
                raise ModelError(f"{what} ({dtype}, dims {dims}) has {len(tensor.raw_data)} bytes of raw_data; "
                                 f"its dims need {needed} ({count} elements)")
        try:
            array = numpy_helper.to_array(tensor)
        except ValueError as error:  # a typed field (float_data, int64_data, ...) of the wrong length
            raise ModelError(f"{what} ({dtype}, dims {dims}) does not hold the {count} elements its dims "
                             f"need: {error}") from None
        return np.asarray(array).astype(NUMPY_DTYPES[dtype], copy=False)

    def _check_initializer_fits_input(self, tensor: onnx.TensorProto, graph_input: onnx.ValueInfoProto):
        """An initializer that gives a graph input its value must have the input's declared
        element type and shape (a named or unknown dim fits any size)."""
        name = tensor.name
        if not graph_input.type.HasField("tensor_type"):
            return  # not a tensor: _input_type refuses such inputs, the initializer is what counts
        tensor_type = graph_input.type.tensor_type
        if tensor_type.elem_type and tensor_type.elem_type != tensor.data_type:
            declared, given = _elem_type_name(tensor_type.elem_type), _elem_type_name(tensor.data_type)
            raise ModelError(f"initializer {name!r} has element type {given}, but graph input {name!r} declares "
                             f"{declared}; expected the same element type")
        declared = _declared_dims(tensor_type)
        dims = tuple(tensor.dims)
        if declared is not None and not _fits(declared, dims):
            raise ModelError(f"initializer {name!r} has shape {dims}, but graph input {name!r} declares shape "
                             f"{tuple(declared)}; expected the initializer to fit the declared shape "
                             f"(a named or unknown dim fits any size)")

    def _check_all_inputs_static(self):
        """Every input whose shape is still open (declared dynamic, or not declared) and not
        given, in one error: each with its declared dims, then an input_shapes that would
        do (named dims at 1: replace them by the sizes wanted)."""
        initializer_names = {tensor.name for tensor in self.graph.initializer}
        open_inputs = []
        for graph_input in self.graph.input:
            name = graph_input.name
            if name in initializer_names or name in self.input_shapes or \
                    not graph_input.type.HasField("tensor_type"):
                continue
            declared = self._with_dims(_declared_dims(graph_input.type.tensor_type))
            if declared is None or any(not isinstance(d, int) for d in declared):
                open_inputs.append((name, declared))
        if not open_inputs:
            return
        described = "; ".join(f"{name} {tuple(declared) if declared is not None else '(no declared shape)'}"
                              for name, declared in open_inputs)
        example = ", ".join(f"{name!r}: ({', '.join(str(d) if isinstance(d, int) else '1' for d in declared)}"
                            f"{',' if len(declared) == 1 else ''})" if declared is not None else f"{name!r}: (...)"
                            for name, declared in open_inputs)
        named = sorted({d for _, declared in open_inputs for d in declared or () if isinstance(d, str) and d != "?"})
        by_name = f", or dims={{{', '.join(f'{d!r}: 1' for d in named)}}} for the named dims" if named else ""
        count = f"{len(open_inputs)} input{'s' if len(open_inputs) > 1 else ''}"
        raise ModelError(f"{count} with dynamic dims need a static shape: {described}; pass "
                         f"input_shapes={{{example}}}{by_name}, with the sizes wanted")

    def _with_dims(self, declared: list | None) -> list | None:
        """Declared dims with the named ones that `dims` sizes replaced by their sizes."""
        if declared is None:
            return None
        return [self.dims.get(d, d) if isinstance(d, str) else d for d in declared]

    def _input_type(self, graph_input: onnx.ValueInfoProto) -> TensorType:
        name = graph_input.name
        if not graph_input.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"input {name!r} is not a tensor; byoc supports tensor inputs only")
        tensor_type = graph_input.type.tensor_type
        dtype = _dtype_of_elem_type(tensor_type.elem_type, f"input {name!r}")
        declared = _declared_dims(tensor_type)
        negative = [d for d in declared or () if isinstance(d, int) and d < 0]
        if negative:
            raise ModelError(f"input {name!r} declares shape {tuple(declared)} with negative dim(s) {negative}; "
                             f"expected non-negative dims (or a name for a dynamic dim)")
        given = self.input_shapes.get(name)
        if given is not None:
            given = tuple(int(d) for d in given)
            if declared is not None and not _fits(declared, given):
                raise ModelError(f"input_shapes[{name!r}] = {given} does not fit the model's "
                                 f"declared shape {tuple(declared)}")
            return _input_tensor_type(name, given, dtype)
        if declared is None:
            raise ModelError(f"input {name!r} has no declared shape: pass input_shapes={{{name!r}: (...)}}")
        declared = self._with_dims(declared)
        dynamic = [d for d in declared if not isinstance(d, int)]
        if dynamic:
            raise ModelError(
                f"input {name!r} has dynamic dims {dynamic} in shape {tuple(declared)}: pass "
                f"input_shapes={{{name!r}: (...)}} with a static shape")
        return _input_tensor_type(name, tuple(declared), dtype)

    def _convert_node(self, index: int, node: onnx.NodeProto):
        self.node_label = _node_label(node, index)
        schema = check_node(node, self.opset, self.node_label)
        inputs = []
        for name in node.input:
            if name == "":
                inputs.append(None)  # an omitted optional input (check_node refuses required ones)
            elif name not in self.values:
                raise ModelError(f"{self.node_label}: input {name!r} is not produced by any earlier node "
                                 f"(the graph is not topologically sorted or is malformed)")
            else:
                inputs.append(self.values[name])
        check_input_types(node, schema, [None if v is None else self.dtype(v) for v in inputs], self.node_label)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        outputs = self._run_converter(node, inputs, attrs)
        for name, value in zip(node.output, outputs):
            if name:
                self.values[name] = value
        wanted = [n for n in node.output[len(outputs):] if n]
        if wanted:
            raise UnsupportedOpError(f"{self.node_label}: byoc does not produce its optional "
                                     f"output(s) {wanted}")

    def _run_converter(self, node: onnx.NodeProto, inputs: list, attrs: dict) -> list:
        """The node's converter, its errors named after the node. check_node has held the
        node to its schema; an error of Python's own that still escapes a converter means an
        input or attribute value the converter did not expect, so it is reported as a
        malformed model, with the original error chained (`--debug` shows where)."""
        try:
            return SUPPORTED_OPS[node.op_type](self, node, inputs, attrs)
        except ByocError as error:
            message = str(error)
            if not message.startswith(self.node_label):
                message = f"{self.node_label}: {message}"
            raise type(error)(message) from None
        except MemoryError as error:  # numpy says how much it tried to allocate
            raise ModelError(f"{self.node_label}: computing its output at import time ran out of memory "
                             f"({error or 'no size given'}); expected values that fit in memory") from error
        except _MALFORMED_MODEL_ERRORS as error:
            raise ModelError(f"{self.node_label} could not be converted; the model is malformed "
                             f"({type(error).__name__}: {error})") from error

    # ---- helpers for converters ---------------------------------------------------
    def call(self, op_name: str, *args, name: str | None = None, **attrs):
        """Apply an op: evaluated now when every argument is known (and the result is at
        most MAX_FOLDED_ELEMENTS elements and MAX_FOLDED_BYTES bytes), else emitted."""
        atoms = [self._as_expr(a) if not isinstance(a, (int, float)) else a for a in args]
        if all(isinstance(a, Constant) or isinstance(a, (int, float)) for a in atoms):
            call = Call(op_name, [a if isinstance(a, Expr) else self._scalar_like(a, atoms) for a in atoms], attrs)
            count = _element_count(call.type)
            if count <= MAX_FOLDED_ELEMENTS and byte_count(call.type) <= MAX_FOLDED_BYTES:
                try:
                    return evaluate_call(get_op(op_name), [a.data for a in call.args], call.attrs, call.type)
                except _MALFORMED_MODEL_ERRORS as error:  # e.g. a constant index out of range
                    raise ModelError(f"{self.node_label}: {error} (computing {op_name} of its constant inputs "
                                     f"at import time)") from error
            # Too large to compute here (an Expand or Tile of a constant to 2**40 elements
            # would allocate it in the importer): emit the op, so that it runs in the built
            # library, where the memory planner and the host plan's size check decide. Only a
            # value that must be known at import time (a shape, axes) needs folding; known()
            # refuses one computed from this with the size, as _check_folded_size does.
            result = self.builder.call(op_name, *atoms, name=name, **attrs)
            self.unfolded[result] = (self.node_label, count)
            return result
        result = self.builder.call(op_name, *atoms, name=name, **attrs)
        origin = next((self.unfolded[a] for a in atoms if isinstance(a, Expr) and a in self.unfolded), None)
        if origin is not None:
            self.unfolded[result] = origin
        return result

    @staticmethod
    def _scalar_like(value, atoms):
        like = next((a for a in atoms if isinstance(a, Expr)), None)
        return Constant(np.asarray(value), like.type.dtype if like is not None else None)

    def _as_expr(self, value) -> Expr:
        if isinstance(value, Expr):
            return value
        return Constant(np.asarray(value))

    def known(self, value, what: str) -> np.ndarray:
        """The value of an input that must be known at import time (a shape, axes, ...)."""
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, Constant):
            return value.data
        if isinstance(value, Expr) and value in self.unfolded:
            origin, count = self.unfolded[value]
            raise ModelError(f"{self.node_label}: input {what!r} must be known at import time, but it is "
                             f"computed from the output of {origin} ({count} elements), too large to compute "
                             f"at import time; expected at most {_FOLDING_LIMITS}")
        raise UnsupportedOpError(f"{self.node_label}: input {what!r} must be known at import time "
                                 f"(byoc compiles static shapes), but it is computed at run time")

    def known_ints(self, value, what: str, allow_scalar: bool = False) -> tuple[int, ...]:
        """A 1-D integer tensor known at import time (a shape, axes, pads, repeats, ...), as
        Python ints; with `allow_scalar` a 0-D one too, as one int."""
        array = np.asarray(self.known(value, what))
        ranks = (0, 1) if allow_scalar else (1,)
        if array.ndim not in ranks or array.dtype.kind not in "iu":
            expected = "a 1-D tensor (or a scalar)" if allow_scalar else "a 1-D tensor"
            raise ModelError(f"{self.node_label}: input {what!r} is a {array.dtype} tensor of shape "
                             f"{list(array.shape)}; expected {expected} of integers")
        return tuple(int(item) for item in array.reshape(-1))

    def known_scalar(self, value, what: str, kind: str = "numeric"):
        """A one-element tensor known at import time (a bound, a count, a fill value), as a
        Python number. `kind` "integer" requires an integer tensor."""
        array = np.asarray(self.known(value, what))
        kinds = "iu" if kind == "integer" else "iufbV"  # V: bfloat16 (ml_dtypes)
        if array.size != 1 or array.dtype.kind not in kinds:
            raise ModelError(f"{self.node_label}: input {what!r} is a {array.dtype} tensor of shape "
                             f"{list(array.shape)}; expected one {kind} value")
        return array.reshape(-1)[0].item()

    @staticmethod
    def type_of(value) -> TensorType:
        if isinstance(value, np.ndarray):
            return TensorType(value.shape, dtype_of_numpy(value.dtype))
        return value.type

    def shape(self, value) -> tuple:
        return self.type_of(value).shape

    def dtype(self, value) -> str:
        return self.type_of(value).dtype

    def unsupported(self, what: str):
        raise UnsupportedOpError(f"{self.node_label}: {what}")


# ---------------------------------------------------------------------------------
# converters
# ---------------------------------------------------------------------------------

def _simple(op_name: str, **fixed):
    def convert(ctx, node, inputs, attrs):
        return [ctx.call(op_name, *inputs, name=node.output[0], **fixed)]
    return convert


_UNARY = {
    "Abs": "abs", "Neg": "negative", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
    "Reciprocal": "reciprocal", "Erf": "erf", "Tanh": "tanh", "Sigmoid": "sigmoid",
    "Relu": "relu", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sin": "sin",
    "Cos": "cos", "Sign": "sign", "Softplus": "softplus", "Not": "logical_not",
    "HardSwish": "hard_swish",
}
_BINARY = {
    "Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide",
    "Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
    "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or",
    "Xor": "logical_xor", "Where": "where",
}
for _onnx_name, _op_name in {**_UNARY, **_BINARY}.items():
    SUPPORTED_OPS[_onnx_name] = _simple(_op_name)


@converter("Identity", "Dropout")
def _identity(ctx, node, inputs, attrs):
    if node.op_type == "Dropout" and len(inputs) > 2 and inputs[2] is not None:
        if ctx.known_scalar(inputs[2], "training_mode"):
            ctx.unsupported("training_mode=True (byoc compiles inference graphs)")
    outputs = [inputs[0]]
    if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1]:
        shape = ctx.shape(inputs[0])
        _check_folded_size(math.prod(shape), 1, f"mask of shape {list(shape)}")
        outputs.append(np.ones(shape, dtype=bool))  # the inference mask
    return outputs


@converter("LeakyRelu")
def _leaky_relu(ctx, node, inputs, attrs):
    return [ctx.call("leaky_relu", inputs[0], alpha=attrs.get("alpha", 0.01), name=node.output[0])]


@converter("Elu")
def _elu(ctx, node, inputs, attrs):
    return [ctx.call("elu", inputs[0], alpha=attrs.get("alpha", 1.0), name=node.output[0])]


@converter("HardSigmoid")
def _hard_sigmoid(ctx, node, inputs, attrs):
    return [ctx.call("hard_sigmoid", inputs[0], alpha=attrs.get("alpha", 0.2),
                     beta=attrs.get("beta", 0.5), name=node.output[0])]


@converter("Gelu")
def _gelu(ctx, node, inputs, attrs):
    approximate = attrs.get("approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate not in ("none", "tanh"):
        ctx.unsupported(f"approximate={approximate!r} (expected 'none' or 'tanh')")
    return [ctx.call("gelu", inputs[0], approximate=approximate, name=node.output[0])]


@converter("PRelu")
def _prelu(ctx, node, inputs, attrs):
    x, slope = inputs
    negative = ctx.call("less", x, np.zeros((), dtype=NUMPY_DTYPES[ctx.dtype(x)]))
    return [ctx.call("where", negative, ctx.call("multiply", x, slope), x, name=node.output[0])]


@converter("Softsign")
def _softsign(ctx, node, inputs, attrs):
    x = inputs[0]
    one = np.ones((), dtype=NUMPY_DTYPES[ctx.dtype(x)])
    return [ctx.call("divide", x, ctx.call("add", ctx.call("abs", x), one), name=node.output[0])]


@converter("Mish")
def _mish(ctx, node, inputs, attrs):
    x = inputs[0]
    return [ctx.call("multiply", x, ctx.call("tanh", ctx.call("softplus", x)), name=node.output[0])]


@converter("Pow")
def _pow(ctx, node, inputs, attrs):
    base, exponent = inputs
    if ctx.dtype(exponent) != ctx.dtype(base):
        if is_float(ctx.dtype(exponent)) and not is_float(ctx.dtype(base)):
            # an integer base with a float exponent: computed in the exponent's type and cast
            # back, as onnxruntime does (casting 0.5 to an integer exponent would give 0)
            power = ctx.call("power", ctx.call("cast", base, dtype=ctx.dtype(exponent)), exponent)
            return [ctx.call("cast", power, dtype=ctx.dtype(base), name=node.output[0])]
        exponent = ctx.call("cast", exponent, dtype=ctx.dtype(base))
    return [ctx.call("power", base, exponent, name=node.output[0])]


@converter("Mod")
def _mod(ctx, node, inputs, attrs):
    return [ctx.call("mod", *inputs, fmod=bool(attrs.get("fmod", 0)), name=node.output[0])]


@converter("Sum", "Max", "Min", "Mean")
def _variadic(ctx, node, inputs, attrs):
    op_name = {"Sum": "add", "Mean": "add", "Max": "maximum", "Min": "minimum"}[node.op_type]
    result = inputs[0]
    for other in inputs[1:]:
        result = ctx.call(op_name, result, other)
    if node.op_type == "Mean" and len(inputs) > 1:
        count = np.asarray(len(inputs), dtype=NUMPY_DTYPES[ctx.dtype(result)])
        result = ctx.call("divide", result, count)
    if len(inputs) == 1:
        result = ctx.call("identity", result)
    return [result]


@converter("Cast")
def _cast(ctx, node, inputs, attrs):
    dtype = _dtype_of_elem_type(attrs["to"], f"{ctx.node_label} target type")
    if ctx.dtype(inputs[0]) == dtype:
        return [inputs[0]]
    return [ctx.call("cast", inputs[0], dtype=dtype, name=node.output[0])]


@converter("CastLike")
def _cast_like(ctx, node, inputs, attrs):
    dtype = ctx.dtype(inputs[1])
    if ctx.dtype(inputs[0]) == dtype:
        return [inputs[0]]
    return [ctx.call("cast", inputs[0], dtype=dtype, name=node.output[0])]


@converter("Clip")
def _clip(ctx, node, inputs, attrs):
    x = inputs[0]
    low = inputs[1] if len(inputs) > 1 else None
    high = inputs[2] if len(inputs) > 2 else None
    bounds = {}
    for key, bound in (("min", low), ("max", high)):
        if bound is None:
            continue
        if isinstance(bound, np.ndarray) or isinstance(bound, Constant):
            bounds[key] = float(ctx.known_scalar(bound, key))
        else:  # a bound computed at run time: clip as maximum/minimum
            x = ctx.call("maximum" if key == "min" else "minimum", x, bound)
    if not bounds:
        return [x if x is not inputs[0] else ctx.call("identity", x)]
    return [ctx.call("clip", x, name=node.output[0], **bounds)]


# ---- reductions -------------------------------------------------------------------

def _reduce_axes(ctx, node, inputs, attrs):
    """The axes of a Reduce*/ArgMax node (attribute before opset 18, input after), or
    None for 'no reduction' (noop_with_empty_axes with empty axes)."""
    if "axes" in attrs:
        axes = tuple(attrs["axes"])
    elif len(inputs) > 1 and inputs[1] is not None:
        axes = ctx.known_ints(inputs[1], "axes")
    else:
        axes = ()
    if not axes and attrs.get("noop_with_empty_axes", 0):
        return None
    return axes


_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
           "ReduceProd": "prod"}


@converter(*_REDUCE, "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")
def _reduce(ctx, node, inputs, attrs):
    x = inputs[0]
    axes = _reduce_axes(ctx, node, inputs, attrs)
    keepdims = bool(attrs.get("keepdims", 1))
    op_type = node.op_type
    if axes is None:
        if op_type in _REDUCE:
            return [ctx.call("identity", x)]
        pre = {"ReduceSumSquare": lambda v: ctx.call("multiply", v, v),
               "ReduceL1": lambda v: ctx.call("abs", v),
               "ReduceL2": lambda v: ctx.call("abs", v),
               "ReduceLogSum": lambda v: ctx.call("log", v),
               "ReduceLogSumExp": lambda v: v}[op_type]
        return [pre(x)]
    if op_type in _REDUCE:
        if 0 in ctx.shape(x) and op_type in ("ReduceMax", "ReduceMin"):
            ctx.unsupported("reducing an empty tensor with max/min")
        if ctx.dtype(x) == "bool" and op_type in ("ReduceMax", "ReduceMin"):
            # max/min of booleans are any/all: reduce as uint8 and cast back
            as_bytes = ctx.call("cast", x, dtype="uint8")
            reduced = ctx.call(_REDUCE[op_type], as_bytes, axes=axes, keepdims=keepdims)
            return [ctx.call("cast", reduced, dtype="bool", name=node.output[0])]
        return [ctx.call(_REDUCE[op_type], x, axes=axes, keepdims=keepdims, name=node.output[0])]
    if op_type == "ReduceSumSquare":
        return [ctx.call("sum", ctx.call("multiply", x, x), axes=axes, keepdims=keepdims)]
    if op_type == "ReduceL1":
        return [ctx.call("sum", ctx.call("abs", x), axes=axes, keepdims=keepdims)]
    if op_type == "ReduceL2":
        squares = ctx.call("sum", ctx.call("multiply", x, x), axes=axes, keepdims=keepdims)
        return [ctx.call("sqrt", squares)]
    if op_type == "ReduceLogSum":
        return [ctx.call("log", ctx.call("sum", x, axes=axes, keepdims=keepdims))]
    # ReduceLogSumExp, shifted by the maximum so that large inputs do not overflow
    if not ctx.dtype(x).startswith(("float", "bfloat")):
        ctx.unsupported(f"ReduceLogSumExp of {ctx.dtype(x)}")
    peak = ctx.call("max", x, axes=axes, keepdims=True)
    total = ctx.call("sum", ctx.call("exp", ctx.call("subtract", x, peak)), axes=axes, keepdims=True)
    result = ctx.call("add", ctx.call("log", total), peak)
    if not keepdims:
        result = ctx.call("squeeze", result, axes=axes or tuple(range(len(ctx.shape(x)))))
    return [result]


@converter("ArgMax", "ArgMin")
def _arg_reduce(ctx, node, inputs, attrs):
    op_name = "argmax" if node.op_type == "ArgMax" else "argmin"
    return [ctx.call(op_name, inputs[0], axis=attrs.get("axis", 0), keepdims=bool(attrs.get("keepdims", 1)),
                     select_last_index=bool(attrs.get("select_last_index", 0)), name=node.output[0])]


@converter("Softmax", "LogSoftmax")
def _softmax(ctx, node, inputs, attrs):
    op_name = "softmax" if node.op_type == "Softmax" else "log_softmax"
    return [ctx.call(op_name, inputs[0], axis=attrs.get("axis", -1), name=node.output[0])]


# ---- normalization ------------------------------------------------------------------

@converter("LayerNormalization")
def _layer_norm(ctx, node, inputs, attrs):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    dtype = ctx.dtype(x)
    if bias is None:  # ONNX's bias is optional; byoc's layer_norm always adds one
        bias = np.zeros(ctx.shape(scale), dtype=NUMPY_DTYPES[ctx.dtype(scale)])
    scale, bias = (_cast_to(ctx, p, dtype) for p in (scale, bias))
    axis, epsilon = attrs.get("axis", -1), attrs.get("epsilon", 1e-5)
    result = ctx.call("layer_norm", x, scale, bias, axis=axis, epsilon=epsilon, name=node.output[0])
    if not any(node.output[1:]):
        return [result]
    # The optional Mean and InvStdDev outputs, in the stash type (float32 by default).
    stash = x if attrs.get("stash_type", 1) != 1 else _cast_to(ctx, x, "float32")
    rank = len(ctx.shape(x))
    axes = tuple(range(axis % rank, rank))
    mean = ctx.call("mean", stash, axes=axes, keepdims=True)
    centered = ctx.call("subtract", stash, mean)
    variance = ctx.call("mean", ctx.call("multiply", centered, centered), axes=axes, keepdims=True)
    eps = np.asarray(epsilon, dtype=NUMPY_DTYPES[ctx.dtype(stash)])
    inv_std_dev = ctx.call("rsqrt", ctx.call("add", variance, eps))
    return [result, mean, inv_std_dev]


@converter("RMSNormalization")
def _rms_norm(ctx, node, inputs, attrs):
    x, scale = inputs
    axis = attrs.get("axis", -1)
    return [ctx.call("rms_norm", x, _cast_to(ctx, scale, ctx.dtype(x)), axis=axis,
                     epsilon=attrs.get("epsilon", 1e-5), name=node.output[0])]


@converter("BatchNormalization")
def _batch_norm(ctx, node, inputs, attrs):
    if attrs.get("training_mode", 0):
        ctx.unsupported("training_mode=1 (byoc compiles inference graphs)")
    x = inputs[0]
    params = [_cast_to(ctx, p, ctx.dtype(x)) for p in inputs[1:5]]
    return [ctx.call("batch_norm", x, *params, epsilon=attrs.get("epsilon", 1e-5), name=node.output[0])]


def _cast_to(ctx, value, dtype):
    if ctx.dtype(value) == dtype:
        return value
    return ctx.call("cast", value, dtype=dtype)


# ---- linear algebra -----------------------------------------------------------------

@converter("MatMul")
def _matmul(ctx, node, inputs, attrs):
    return [ctx.call("matmul", *inputs, name=node.output[0])]


@converter("Gemm")
def _gemm(ctx, node, inputs, attrs):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if attrs.get("transA", 0):
        a = ctx.call("transpose", a, axes=(1, 0))
    if attrs.get("transB", 0):
        b = ctx.call("transpose", b, axes=(1, 0))
    dtype = NUMPY_DTYPES[ctx.dtype(a)]
    result = ctx.call("matmul", a, b)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        result = ctx.call("multiply", result, np.asarray(alpha, dtype=dtype))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.call("multiply", c, np.asarray(beta, dtype=dtype))
        result = ctx.call("add", result, c)
    return [result]


def _spatial_pads(ctx, attrs, in_spatial, kernel, strides, dilations):
    """Explicit (begins..., ends...) pads from `pads` or `auto_pad`."""
    rank = len(in_spatial)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("NOTSET", ""):
        pads = tuple(attrs.get("pads", (0,) * (2 * rank)))
        return pads
    if "pads" in attrs:  # the spec: "explicit padding ... cannot be used simultaneously with auto_pad"
        raise ModelError(f"{ctx.node_label}: both auto_pad={auto_pad!r} and pads are given; expected one of them")
    if auto_pad == "VALID":
        return (0,) * (2 * rank)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(in_spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            small, large = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
        return tuple(begins + ends)
    ctx.unsupported(f"auto_pad={auto_pad!r}")


def _check_window_attributes(attrs, rank: int):
    """kernel_shape, strides and dilations give one value per spatial axis, pads two."""
    for name, length in (("kernel_shape", rank), ("strides", rank), ("dilations", rank), ("pads", 2 * rank)):
        if name in attrs and len(attrs[name]) != length:
            raise ModelError(f"attribute {name!r} is {list(attrs[name])}; expected {length} values for an input "
                             f"of {rank} spatial axes")


def _to_2d_pads(pads):
    """ONNX (h_begin, w_begin, h_end, w_end) -> byoc (top, left, bottom, right): the same."""
    return tuple(pads)


@converter("Conv")
def _conv(ctx, node, inputs, attrs):
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    rank = len(ctx.shape(x)) - 2
    if rank not in (1, 2):
        ctx.unsupported(f"{rank}-D convolution (byoc has 1-D and 2-D)")
    _check_window_attributes(attrs, rank)
    kernel = tuple(attrs.get("kernel_shape", ctx.shape(weight)[2:]))
    if kernel != ctx.shape(weight)[2:]:
        raise ModelError(f"attribute 'kernel_shape' is {list(kernel)}, but input W has shape "
                         f"{list(ctx.shape(weight))}; expected its spatial dims")
    strides = tuple(attrs.get("strides", (1,) * rank))
    dilations = tuple(attrs.get("dilations", (1,) * rank))
    pads = _spatial_pads(ctx, attrs, ctx.shape(x)[2:], kernel, strides, dilations)
    if rank == 1:  # a 1-D convolution is a 2-D one over a height of 1
        x = ctx.call("expand_dims", x, axes=(2,))
        weight = ctx.call("expand_dims", weight, axes=(2,))
        strides, dilations = (1,) + strides, (1,) + dilations
        pads = (0, pads[0], 0, pads[1])
    result = ctx.call("conv2d", x, weight, strides=strides, pads=_to_2d_pads(pads), dilations=dilations,
                      groups=attrs.get("group", 1))
    if bias is not None:
        channels = ctx.shape(weight)[0]
        if ctx.shape(bias) != (channels,):
            raise ModelError(f"input B has shape {list(ctx.shape(bias))}; expected a 1-D bias of the {channels} "
                             f"output channels")
        result = ctx.call("add", result, ctx.call("reshape", bias, shape=(-1, 1, 1)))
    if rank == 1:
        result = ctx.call("squeeze", result, axes=(2,))
    return [result]


@converter("MaxPool", "AveragePool")
def _pool(ctx, node, inputs, attrs):
    x = inputs[0]
    rank = len(ctx.shape(x)) - 2
    if rank not in (1, 2):
        ctx.unsupported(f"{rank}-D pooling (byoc has 1-D and 2-D)")
    _check_window_attributes(attrs, rank)
    if attrs.get("storage_order", 0):
        ctx.unsupported("storage_order=1")
    kernel = tuple(attrs["kernel_shape"])
    strides = tuple(attrs.get("strides", (1,) * rank))
    dilations = tuple(attrs.get("dilations", (1,) * rank))
    pads = _spatial_pads(ctx, attrs, ctx.shape(x)[2:], kernel, strides, dilations)
    if rank == 1:
        x = ctx.call("expand_dims", x, axes=(2,))
        kernel, strides, dilations = (1,) + kernel, (1,) + strides, (1,) + dilations
        pads = (0, pads[0], 0, pads[1])
    common = dict(kernel=kernel, strides=strides, pads=pads, dilations=dilations,
                  ceil_mode=bool(attrs.get("ceil_mode", 0)))
    if node.op_type == "MaxPool":
        result = ctx.call("max_pool2d", x, **common)
    else:
        result = ctx.call("avg_pool2d", x, count_include_pad=bool(attrs.get("count_include_pad", 0)), **common)
    if rank == 1:
        result = ctx.call("squeeze", result, axes=(2,))
    return [result]


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx, node, inputs, attrs):
    x = inputs[0]
    if len(ctx.shape(x)) != 4:
        op_name = "mean" if node.op_type == "GlobalAveragePool" else "max"
        axes = tuple(range(2, len(ctx.shape(x))))
        return [ctx.call(op_name, x, axes=axes, keepdims=True)]
    op_name = "global_avg_pool2d" if node.op_type == "GlobalAveragePool" else "global_max_pool2d"
    return [ctx.call(op_name, x, name=node.output[0])]


# ---- shapes and layout --------------------------------------------------------------

@converter("Shape")
def _shape(ctx, node, inputs, attrs):
    shape = np.asarray(ctx.shape(inputs[0]), dtype=np.int64)
    start, end = attrs.get("start", 0), attrs.get("end", None)
    return [shape[start:end]]


@converter("Size")
def _size(ctx, node, inputs, attrs):
    return [np.asarray(math.prod(ctx.shape(inputs[0])), dtype=np.int64)]


_CONSTANT_NUMBERS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                     "value_ints": np.int64}


@converter("Constant")
def _constant(ctx, node, inputs, attrs):
    if len(attrs) != 1:  # the spec: exactly one of its attributes gives the value
        raise ModelError(f"attributes {sorted(attrs)} given; expected exactly one of "
                         f"{', '.join(sorted(onnx.defs.get_schema('Constant', ctx.opset, '').attributes))}")
    if "value" in attrs:
        return [ctx._tensor_to_array(attrs["value"], f"{ctx.node_label} value")]
    for key, dtype in _CONSTANT_NUMBERS.items():
        if key in attrs:
            return [np.asarray(attrs[key], dtype=dtype)]
    ctx.unsupported(f"a Constant given by {sorted(attrs)} (byoc reads value, value_float(s), value_int(s))")


@converter("ConstantOfShape")
def _constant_of_shape(ctx, node, inputs, attrs):
    shape = ctx.known_ints(inputs[0], "input")
    if any(d < 0 for d in shape):
        raise ModelError(f"input 'input' (the shape) is {list(shape)}; expected non-negative dims")
    fill = np.zeros((), dtype=np.float32)
    if "value" in attrs:
        fill = ctx._tensor_to_array(attrs["value"], f"{ctx.node_label} value")
        if fill.size != 1:
            raise ModelError(f"attribute 'value' has shape {list(fill.shape)}; expected a one-element tensor")
    _check_folded_size(math.prod(shape), fill.dtype.itemsize, f"of shape {list(shape)}")
    return [np.full(shape, fill.reshape(-1)[0], dtype=fill.dtype)]


@converter("Range")
def _range(ctx, node, inputs, attrs):
    start, limit, delta = (ctx.known(v, n) for v, n in zip(inputs, ("start", "limit", "delta")))
    first, last, step = (ctx.known_scalar(v, n) for v, n in zip(inputs, ("start", "limit", "delta")))
    if step == 0:
        raise ModelError("input 'delta' is 0; expected a non-zero step")
    if not all(math.isfinite(v) for v in (first, last, step)):
        raise ModelError(f"start={first}, limit={last}, delta={step}; expected finite numbers")
    # ONNX's element count; Python ints keep int64 bounds exact
    count = max(math.ceil((last - first) / step) if isinstance(step, float) else -((first - last) // step), 0)
    _check_folded_size(count, np.asarray(start).dtype.itemsize,
                       f"of {count} elements from start={first}, limit={last}, delta={step}")
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))  # one element each
    return [np.arange(start, limit, delta).astype(start.dtype)]


def _element_count(type_) -> int:
    """Elements of a tensor type, or of all fields of a tuple type (Python ints: exact)."""
    if isinstance(type_, TensorType):
        return math.prod(type_.shape)
    return sum(_element_count(field) for field in getattr(type_, "fields", ()))


_FOLDING_LIMITS = (f"2**{int(math.log2(MAX_FOLDED_ELEMENTS))} elements and 2**{int(math.log2(MAX_FOLDED_BYTES))} "
                   f"bytes")


def _check_folded_size(count: int, itemsize: int, what: str):
    if count > MAX_FOLDED_ELEMENTS or count * itemsize > MAX_FOLDED_BYTES:
        raise ModelError(f"its output {what} ({count * itemsize} bytes) is a constant computed at import time; "
                         f"expected at most {_FOLDING_LIMITS}")


@converter("Reshape")
def _reshape(ctx, node, inputs, attrs):
    x = inputs[0]
    target = list(ctx.known_ints(inputs[1], "shape"))
    in_shape = ctx.shape(x)
    if not attrs.get("allowzero", 0):  # 0 copies the input's dim
        copied = [i for i, d in enumerate(target) if d == 0 and i >= len(in_shape)]
        if copied:
            raise ModelError(f"input 'shape' {target} has 0 (copy the input's dim) at position(s) {copied}, "
                             f"but the input has rank {len(in_shape)}; expected 0s only within its rank")
        target = [in_shape[i] if d == 0 else d for i, d in enumerate(target)]
    elif 0 in target and -1 in target:  # the spec calls this invalid: -1 cannot be inferred
        raise ModelError(f"input 'shape' {target} has both 0 and -1 with allowzero=1; expected at most one "
                         f"of them")
    return [ctx.call("reshape", x, shape=tuple(target), name=node.output[0])]


@converter("Flatten")
def _flatten(ctx, node, inputs, attrs):
    shape = ctx.shape(inputs[0])
    axis = attrs.get("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise ModelError(f"attribute 'axis' is {axis}; expected -{len(shape)} to {len(shape)} for an input of "
                         f"rank {len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    target = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    return [ctx.call("reshape", inputs[0], shape=target, name=node.output[0])]


@converter("Transpose")
def _transpose(ctx, node, inputs, attrs):
    rank = len(ctx.shape(inputs[0]))
    perm = tuple(attrs.get("perm", tuple(reversed(range(rank)))))
    return [ctx.call("transpose", inputs[0], axes=perm, name=node.output[0])]


def _axes_from(ctx, inputs, attrs, index=1):
    if "axes" in attrs:
        return tuple(attrs["axes"])
    if len(inputs) > index and inputs[index] is not None:
        # the spec says 1-D; onnxruntime also reads a 0-D axes tensor, so byoc does
        return ctx.known_ints(inputs[index], "axes", allow_scalar=True)
    return None


@converter("Squeeze")
def _squeeze(ctx, node, inputs, attrs):
    axes = _axes_from(ctx, inputs, attrs)
    return [ctx.call("squeeze", inputs[0], axes=axes or (), name=node.output[0])]


@converter("Unsqueeze")
def _unsqueeze(ctx, node, inputs, attrs):
    axes = _axes_from(ctx, inputs, attrs)
    return [ctx.call("expand_dims", inputs[0], axes=axes, name=node.output[0])]


@converter("Expand")
def _expand(ctx, node, inputs, attrs):
    x = inputs[0]
    target = ctx.known_ints(inputs[1], "shape")
    try:
        shape = np.broadcast_shapes(ctx.shape(x), target)
    except ValueError:
        raise ModelError(f"{ctx.node_label}: cannot expand shape {ctx.shape(x)} to {target}") from None
    if tuple(shape) == ctx.shape(x):
        return [x]
    return [ctx.call("broadcast_to", x, shape=tuple(shape), name=node.output[0])]


@converter("Concat")
def _concat(ctx, node, inputs, attrs):
    # ONNX allows empty operands; they contribute nothing
    parts = [v for v in inputs if 0 not in ctx.shape(v)] or inputs[:1]
    return [ctx.call("concat", *parts, axis=attrs["axis"], name=node.output[0])]


@converter("Split")
def _split(ctx, node, inputs, attrs):
    x = inputs[0]
    rank = len(ctx.shape(x))
    axis = _checked_axis(attrs.get("axis", 0), rank)
    length = ctx.shape(x)[axis]
    count = len(node.output)
    if len(inputs) > 1 and inputs[1] is not None:
        if "num_outputs" in attrs:
            raise ModelError("both input 'split' and attribute 'num_outputs' given; expected one of them")
        sizes = ctx.known_ints(inputs[1], "split")
        if len(sizes) != count:
            raise ModelError(f"input 'split' has {len(sizes)} sizes {list(sizes)}, but the node has {count} "
                             f"outputs; expected one size per output")
    else:
        parts = attrs.get("num_outputs", count)
        if parts != count:
            raise ModelError(f"attribute 'num_outputs' is {parts}, but the node has {count} outputs; "
                             f"expected them to agree")
        chunk = -(-length // parts)  # the last chunk is smaller when it does not divide
        if chunk * (parts - 1) > length:
            raise ModelError(f"attribute 'num_outputs' is {parts}: {length} elements along axis {axis} do not "
                             f"make {parts} chunks of {chunk} with a smaller last one")
        sizes = tuple(min(chunk, length - i * chunk) for i in range(parts))
    result = ctx.call("split", x, axis=axis, sizes=sizes)
    if isinstance(result, tuple):
        return list(result)
    return [ctx.builder.get_item(result, i, name=name or None) for i, name in enumerate(node.output)]


def _checked_axis(axis: int, rank: int, attribute: str = "axis") -> int:
    """An axis attribute in -rank..rank-1, as 0..rank-1."""
    if not -rank <= axis < rank:
        raise ModelError(f"attribute {attribute!r} is {axis}; expected -{rank} to {rank - 1} for an input of "
                         f"rank {rank}")
    return axis % rank


@converter("Slice")
def _slice(ctx, node, inputs, attrs):
    x = inputs[0]
    starts, ends, axes, steps = (
        ctx.known_ints(value, name) if value is not None else ()
        for value, name in zip(inputs[1:] + [None] * (5 - len(inputs)), ("starts", "ends", "axes", "steps")))
    # clamp to int64-safe values the op can hold
    limit = np.iinfo(np.int64).max
    ends = tuple(max(min(e, limit), -limit) for e in ends)
    return [ctx.call("strided_slice", x, begin=starts, end=ends, axes=axes, strides=steps, name=node.output[0])]


@converter("Gather")
def _gather(ctx, node, inputs, attrs):
    return [ctx.call("gather", inputs[0], inputs[1], axis=attrs.get("axis", 0), name=node.output[0])]


@converter("GatherElements")
def _gather_elements(ctx, node, inputs, attrs):
    return [ctx.call("gather_elements", inputs[0], inputs[1], axis=attrs.get("axis", 0), name=node.output[0])]


@converter("Pad")
def _pad(ctx, node, inputs, attrs):
    x = inputs[0]
    rank = len(ctx.shape(x))
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "reflect", "edge"):
        ctx.unsupported(f"mode={mode!r} (byoc pads with constant, reflect or edge)")
    pads = list(ctx.known_ints(inputs[1], "pads"))
    value = 0.0
    if len(inputs) > 2 and inputs[2] is not None:
        value = float(ctx.known_scalar(inputs[2], "constant_value"))
    axes = list(range(rank))
    if len(inputs) > 3 and inputs[3] is not None:  # opset 18: pads given for some axes only
        axes = list(ctx.known_ints(inputs[3], "axes"))
        outside = [a for a in axes if not -rank <= a < rank]
        if outside:
            raise ModelError(f"input 'axes' {axes} has {outside} outside -{rank}..{rank - 1} for an input of "
                             f"rank {rank}")
        axes = [a % rank for a in axes]
        if len(set(axes)) != len(axes):
            raise ModelError(f"input 'axes' {axes} names an axis twice; expected each axis once")
    if len(pads) != 2 * len(axes):
        raise ModelError(f"input 'pads' has {len(pads)} values {pads}; expected 2 per padded axis "
                         f"({2 * len(axes)} for axes {axes})")
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        full[axis], full[rank + axis] = pads[i], pads[len(axes) + i]
    pads = full
    return [ctx.call("pad", x, pads=tuple(pads), mode=mode, value=value, name=node.output[0])]


@converter("Tile")
def _tile(ctx, node, inputs, attrs):
    repeats = ctx.known_ints(inputs[1], "repeats")
    return [ctx.call("tile", inputs[0], repeats=repeats, name=node.output[0])]


@converter("Trilu")
def _trilu(ctx, node, inputs, attrs):
    k = ctx.known_scalar(inputs[1], "k", "integer") if len(inputs) > 1 and inputs[1] is not None else 0
    return [ctx.call("trilu", inputs[0], upper=bool(attrs.get("upper", 1)), k=k, name=node.output[0])]


@converter("CumSum")
def _cumsum(ctx, node, inputs, attrs):
    axis = ctx.known_scalar(inputs[1], "axis", "integer")
    return [ctx.call("cumsum", inputs[0], axis=axis, exclusive=bool(attrs.get("exclusive", 0)),
                     reverse=bool(attrs.get("reverse", 0)), name=node.output[0])]


def supported_op_types() -> list[str]:
    return sorted(SUPPORTED_OPS)
