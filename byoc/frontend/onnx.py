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

Each supported ONNX op type has one converter in `SUPPORTED_OPS` (onnx_compute_ops.py,
onnx_shape_ops.py). Before it runs, the node
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
import sys
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ByocError, ModelError, UnsupportedOpError
from ..interpreter import byte_count, evaluate_call
from ..ir.builder import FunctionBuilder
from ..ir.expr import Call, Constant, Expr
from ..ir.module import IRModule
from ..ir.op import get_op
from ..ir.types import NUMPY_DTYPES, TensorType, dtype_of_numpy
from .onnx_model import (checked_dims, checked_input_shapes, declared_dims, describe_model,  # noqa: F401
                         dtype_of_elem_type, elem_type_name, fits_declared, input_tensor_type, load_model,
                         load_model_and_weights, node_label)
from .onnx_external_data import ExternalData
from .onnx_schema import check_input_types, check_node

# dtypes whose raw_data onnx.numpy_helper reads specially (not a plain little-endian view)
_RAW_DATA_SPECIAL = frozenset({"bfloat16", "bool"})

MIN_OPSET = 13
MAX_OPSET = onnx.defs.onnx_opset_version()

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
    proto, raw_data, external = load_model_and_weights(model)
    return _Importer(proto, checked_input_shapes(input_shapes), checked_dims(dims), raw_data, external).run()


class InitializerRecords(list):
    """The model's initializers as the build record keeps them: name, dtype, shape and the
    checksum of their bytes (byoc.codegen.host.blob_checksum, 16 hex digits). The checksums
    are summed on a thread of their own while the build goes on (a BERT-base's 440 MB take
    a few tenths of a second, NumPy letting go of the GIL): complete() waits for them."""

    def __init__(self, values: dict):
        import threading
        from ..ir.types import dtype_of_numpy
        arrays = {name: np.ascontiguousarray(value) for name, value in values.items()}
        super().__init__({"name": name, "dtype": dtype_of_numpy(array.dtype), "shape": list(array.shape)}
                         for name, array in arrays.items())
        self._summing = threading.Thread(target=self._sum, args=(list(arrays.values()),), daemon=True,
                                         name="byoc-initializer-checksums")
        self._summing.start()

    def _sum(self, arrays: list):
        from ..codegen.host import blob_checksum
        for record, array in zip(self, arrays):
            record["checksum"] = f"{blob_checksum(array.reshape(-1).view(np.uint8)):016x}"

    def complete(self) -> "InitializerRecords":
        self._summing.join()
        return self

    def ir_summary(self) -> str:
        return f"{len(self)} initializers by name (dtype, shape, checksum)"


class _Importer:
    def __init__(self, proto: onnx.ModelProto, input_shapes: dict, dims: dict | None = None,
                 raw_data: dict | None = None, external: ExternalData | None = None):
        self.proto = proto
        # tensors stored in files beside the model (none readable where it has no folder)
        self.external = external or ExternalData(None)
        # graph.initializer[position]'s raw_data where the parse left it out (the file's bytes)
        self.raw_data = raw_data or {}
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
            label = node_label(node, index)
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
                          i.type.HasField("tensor_type") for d in declared_dims(i.type.tensor_type) or ()
                          if isinstance(d, str) and d != "?"}
        unused = sorted(set(self.dims) - declared_names)
        if unused:
            raise ModelError(f"dims names {unused}, which no model input declares; the named dims are "
                             f"{sorted(declared_names) or 'none'}")
        self._check_all_inputs_static()
        initializers = {}
        for position, tensor in enumerate(self.graph.initializer):
            self.values[tensor.name] = self._tensor_to_array(tensor, f"initializer {tensor.name!r}",
                                                             self.raw_data.get(position))
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
        # The initializers by name, for the library's build record (metadata.build_record):
        # the weights `byoc refit` may replace, and what each must stay.
        mod.attrs["initializers"] = InitializerRecords(
            {name: self.values[name] for name in dict.fromkeys(t.name for t in self.graph.initializer)})
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
            declared = dtype_of_elem_type(tensor_type.elem_type, f"graph output {output.name!r}")
            if declared != computed.dtype:
                raise ModelError(f"graph output {output.name!r} is declared {declared}, but the graph computes "
                                 f"{computed.dtype}; expected the declared element type")
        dims = declared_dims(tensor_type)
        if dims is not None and not fits_declared(dims, tuple(computed.shape)):
            raise ModelError(f"graph output {output.name!r} is declared with shape {tuple(dims)}, but the graph "
                             f"computes {tuple(computed.shape)}; expected the declared shape (a named or unknown "
                             f"dim fits any size)")

    def _tensor_to_array(self, tensor: onnx.TensorProto, what: str, raw_data=None) -> np.ndarray:
        """The tensor's value; `raw_data`: its raw_data where the parse left it out."""
        dtype = dtype_of_elem_type(tensor.data_type, what)
        dims = list(tensor.dims)
        if any(dim < 0 for dim in dims):
            raise ModelError(f"{what} has dims {dims}; expected non-negative dims")
        count = math.prod(dims)
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raw_data = self.external.read(tensor, what, count * NUMPY_DTYPES[dtype].itemsize)
            # read: numpy_helper (below, for bool and bfloat16) must not look for the file again
            # (only a model read from its path gets here; its proto is byoc's own)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
        if raw_data is not None or tensor.HasField("raw_data"):
            # Each read of raw_data copies the bytes out of the message: read it once (a
            # BERT-base's weights are 415 MB), and view it as the array.
            raw = raw_data if raw_data is not None else tensor.raw_data
            needed = count * NUMPY_DTYPES[dtype].itemsize
            if len(raw) != needed:
                raise ModelError(f"{what} ({dtype}, dims {dims}) has {len(raw)} bytes of raw_data; "
                                 f"its dims need {needed} ({count} elements)")
            if sys.byteorder == "little" and dtype not in _RAW_DATA_SPECIAL:
                return np.frombuffer(raw, dtype=NUMPY_DTYPES[dtype]).reshape(dims)
            if raw_data is not None:  # numpy_helper reads it from the message
                tensor.raw_data = bytes(raw_data)
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
            declared, given = elem_type_name(tensor_type.elem_type), elem_type_name(tensor.data_type)
            raise ModelError(f"initializer {name!r} has element type {given}, but graph input {name!r} declares "
                             f"{declared}; expected the same element type")
        declared = declared_dims(tensor_type)
        dims = tuple(tensor.dims)
        if declared is not None and not fits_declared(declared, dims):
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
            declared = self._with_dims(declared_dims(graph_input.type.tensor_type))
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
        dtype = dtype_of_elem_type(tensor_type.elem_type, f"input {name!r}")
        declared = declared_dims(tensor_type)
        negative = [d for d in declared or () if isinstance(d, int) and d < 0]
        if negative:
            raise ModelError(f"input {name!r} declares shape {tuple(declared)} with negative dim(s) {negative}; "
                             f"expected non-negative dims (or a name for a dynamic dim)")
        given = self.input_shapes.get(name)
        if given is not None:
            given = tuple(int(d) for d in given)
            if declared is not None and not fits_declared(declared, given):
                raise ModelError(f"input_shapes[{name!r}] = {given} does not fit the model's "
                                 f"declared shape {tuple(declared)}")
            return input_tensor_type(name, given, dtype)
        if declared is None:
            raise ModelError(f"input {name!r} has no declared shape: pass input_shapes={{{name!r}: (...)}}")
        declared = self._with_dims(declared)
        dynamic = [d for d in declared if not isinstance(d, int)]
        if dynamic:
            raise ModelError(
                f"input {name!r} has dynamic dims {dynamic} in shape {tuple(declared)}: pass "
                f"input_shapes={{{name!r}: (...)}} with a static shape")
        return input_tensor_type(name, tuple(declared), dtype)

    def _convert_node(self, index: int, node: onnx.NodeProto):
        self.node_label = node_label(node, index)
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
            count = element_count(call.type)
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
            # refuses one computed from this with the size, as check_folded_size does.
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

    def inline_graph(self, graph: onnx.GraphProto, what: str) -> list:
        """The outputs of a subgraph (an If's branch) converted node by node in the current
        scope: its nodes read the enclosing graph's values by name, as ONNX scoping has it."""
        label = self.node_label
        for tensor in graph.initializer:
            self.values[tensor.name] = self._tensor_to_array(tensor, f"{label}: {what} initializer {tensor.name!r}")
        for index, node in enumerate(graph.node):
            if node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
                raise UnsupportedOpError(f"{label}: its {what} uses {node_label(node, index)}, an op type byoc "
                                         f"does not support")
            self._convert_node(index, node)
        self.node_label = label
        missing = [output.name for output in graph.output if output.name not in self.values]
        if missing:
            raise ModelError(f"{label}: its {what} returns {missing}, which no node of it produces")
        return [self.values[output.name] for output in graph.output]

    def unsupported(self, what: str):
        raise UnsupportedOpError(f"{self.node_label}: {what}")


def element_count(type_) -> int:
    """Elements of a tensor type, or of all fields of a tuple type (Python ints: exact)."""
    if isinstance(type_, TensorType):
        return math.prod(type_.shape)
    return sum(element_count(field) for field in getattr(type_, "fields", ()))


_FOLDING_LIMITS = (f"2**{int(math.log2(MAX_FOLDED_ELEMENTS))} elements and 2**{int(math.log2(MAX_FOLDED_BYTES))} "
                   f"bytes")


def check_folded_size(count: int, itemsize: int, what: str):
    if count > MAX_FOLDED_ELEMENTS or count * itemsize > MAX_FOLDED_BYTES:
        raise ModelError(f"its output {what} ({count * itemsize} bytes) is a constant computed at import time; "
                         f"expected at most {_FOLDING_LIMITS}")


# The converters register themselves as they are imported (after `converter` and the helpers
# they use are defined above).
from . import onnx_compute_ops, onnx_indexed_ops, onnx_resize, onnx_shape_ops  # noqa: E402,F401


def supported_op_types() -> list[str]:
    return sorted(SUPPORTED_OPS)
