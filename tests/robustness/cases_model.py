"""Family 1: model mutations, through the frontend and the reference interpreter (no C build).

Bases: the fixtures (tests/fixtures/*.onnx) and a one-node model per op type byoc claims
(spec.one_node_model). Mutations, each a named function applied in the child:
  structure   drop/duplicate/rename nodes, inputs, outputs, initializers; cycles; dangling
              names; unknown op types and domains; bad opsets
  attribute   drop, wrong type, out-of-domain values (spec.forbidden_values), other valid
              values (spec.valid_variants), unknown and duplicated attributes
  input       unsupported element types; negative, zero, huge and symbolic dims; wrong
              rank; input_shapes= misuse
  initializer unsupported element types, data that does not fit its dims, external data
  bytes       random byte flips, truncation and garbage in the serialized model
  file        the model given as a path: missing, a directory, a FIFO, a symlink loop, ...
A case imports with byoc.from_onnx; accepted, it runs byoc.interpret on small seeded
inputs (the fixture's own where they fit) and compares with onnxruntime.

A case's params are a recipe (base name, mutation name, arguments), not the model's
bytes: the child rebuilds the model, so that thousands of cases on a 2 MB fixture do not
travel through the fork server's pipe.
"""
from __future__ import annotations

import math
import os
import random
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import spec
from .runner import Case, Outcome, case_dir

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURE_MODELS = {"mlp": None, "resnet_small": None, "gpt2_2l": None, "bert12_tiny": None,
                  "bert2": "shapes", "bert2_opset14": "shapes"}
MAX_RUN_ELEMENTS = 1 << 22     # inputs larger than this are not run (accepted_not_run)
FUNCTION = "robustness.cases_model:run_model"
TIMEOUT = 60.0


# ---------------------------------------------------------------------------------
# Bases
# ---------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def fixture_inputs(name: str) -> dict:
    data = np.load(FIXTURES / f"{name}.npz")
    return {key[3:]: data[key] for key in data if key.startswith("in_")}


def _ranks(model: onnx.ModelProto) -> dict:
    ranks = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - ranks are a hint for the generators only
        inferred = model
    graph = inferred.graph
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            ranks[value.name] = len(value.type.tensor_type.shape.dim)
    for tensor in graph.initializer:
        ranks[tensor.name] = len(tensor.dims)
    return ranks


@lru_cache(maxsize=None)
def base_model(name: str) -> spec.BaseModel:
    """"op:Conv" (a one-node model) or a fixture name."""
    if name.startswith("op:"):
        base = spec.one_node_model(name[3:])
        base.ranks.update(_ranks(base.proto))
        return base
    proto = onnx.load(str(FIXTURES / f"{name}.onnx"))
    shapes = {k: v.shape for k, v in fixture_inputs(name).items()} if FIXTURE_MODELS[name] else None
    return spec.BaseModel(name, proto, input_shapes=shapes, fixture=name, ranks=_ranks(proto))


def base_names() -> list[str]:
    from byoc.frontend.onnx import SUPPORTED_OPS
    return list(FIXTURE_MODELS) + [f"op:{op}" for op in sorted(SUPPORTED_OPS)]


def warm():
    """Called once in the fork server: children then share the parsed bases."""
    for name in base_names():
        base_model(name)


# ---------------------------------------------------------------------------------
# Mutations: (model copy, **args) -> ModelProto, bytes or a path (str). Applied in the child.
# ---------------------------------------------------------------------------------

def _node(model, index):
    return model.graph.node[index]


def _without_attribute(node, name):
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)


def m_none(model):
    return model


def m_set_attribute(model, node, name, value):
    _without_attribute(_node(model, node), name)
    _node(model, node).attribute.append(helper.make_attribute(name, value))
    return model


def m_drop_attribute(model, node, name):
    _without_attribute(_node(model, node), name)
    return model


def m_duplicate_attribute(model, node):
    target = _node(model, node)
    target.attribute.append(target.attribute[0])
    return model


def m_drop_node(model, node):
    del model.graph.node[node]
    return model


def m_duplicate_node(model, node):
    model.graph.node.insert(node + 1, _node(model, node))
    return model


def m_rename_output(model, node, new):
    _node(model, node).output[0] = new
    return model


def m_rename_input(model, node, position, new):
    _node(model, node).input[position] = new
    return model


def m_self_cycle(model, node):
    target = _node(model, node)
    target.input[0] = target.output[0]
    return model


def m_back_edge(model, node, source):
    """node's first input becomes the first output of a later node `source`."""
    _node(model, node).input[0] = _node(model, source).output[0]
    return model


def m_reverse_nodes(model):
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    return model


def m_set_op_type(model, node, op_type, domain=""):
    target = _node(model, node)
    target.op_type = op_type
    target.domain = domain
    return model


def m_extra_node_input(model, node):
    target = _node(model, node)
    target.input.append(target.input[0] if target.input else model.graph.input[0].name)
    return model


def m_drop_graph_input(model, index):
    del model.graph.input[index]
    return model


def m_duplicate_graph_input(model, index):
    model.graph.input.append(model.graph.input[index])
    return model


def m_drop_graph_output(model, index):
    del model.graph.output[index]
    return model


def m_add_graph_output(model, name):
    model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return model


def m_output_type(model, index, elem_type=None, dims=None):
    tensor_type = model.graph.output[index].type.tensor_type
    if elem_type is not None:
        tensor_type.elem_type = elem_type
    if dims is not None:
        del tensor_type.shape.dim[:]
        for dim in dims:
            tensor_type.shape.dim.add().dim_value = dim
    return model


def m_duplicate_graph_output(model, index):
    model.graph.output.append(model.graph.output[index])
    return model


def m_drop_initializer(model, index):
    del model.graph.initializer[index]
    return model


def m_duplicate_initializer(model, index):
    model.graph.initializer.append(model.graph.initializer[index])
    return model


def m_opset(model, version):
    del model.opset_import[:]
    if version is not None:
        model.opset_import.append(helper.make_opsetid("", version))
    return model


def m_no_nodes(model):
    del model.graph.node[:]
    return model


def _tensor_type(model, index):
    return model.graph.input[index].type.tensor_type


def m_input_elem_type(model, index, elem_type):
    _tensor_type(model, index).elem_type = elem_type
    return model


def m_input_dims(model, index, dims):
    """dims: ints, or strings for named (dim_param) dims; None: no shape at all."""
    tensor_type = _tensor_type(model, index)
    if dims is None:
        tensor_type.ClearField("shape")
        return model
    shape = onnx.TensorShapeProto()
    for dim in dims:
        entry = shape.dim.add()
        if isinstance(dim, str):
            entry.dim_param = dim
        else:
            entry.dim_value = dim
    tensor_type.shape.CopyFrom(shape)
    return model


def m_input_not_tensor(model, index):
    graph_input = model.graph.input[index]
    element = graph_input.type.tensor_type.elem_type
    graph_input.type.CopyFrom(helper.make_sequence_type_proto(helper.make_tensor_type_proto(element, None)))
    return model


def _initializer(model, index):
    return model.graph.initializer[index]


def m_initializer_data_type(model, index, data_type):
    _initializer(model, index).data_type = data_type
    return model


def m_initializer_truncate(model, index):
    tensor = _initializer(model, index)
    array = onnx.numpy_helper.to_array(tensor)
    tensor.ClearField("float_data")
    tensor.ClearField("int64_data")
    tensor.ClearField("int32_data")
    tensor.ClearField("double_data")
    tensor.raw_data = array.tobytes()[:-1] if array.nbytes else b"\x00"
    return model


def m_initializer_dims(model, index, dims):
    tensor = _initializer(model, index)
    del tensor.dims[:]
    tensor.dims.extend(dims)
    return model


def m_initializer_external(model, index):
    tensor = _initializer(model, index)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "missing_weights.bin"
    return model


def m_initializer_typed_wrong_count(model, index):
    tensor = _initializer(model, index)
    tensor.ClearField("raw_data")
    tensor.data_type = TensorProto.FLOAT
    del tensor.float_data[:]
    tensor.float_data.extend([1.0, 2.0, 3.0])
    del tensor.dims[:]
    tensor.dims.extend([2, 5])
    return model


def m_flip_bytes(model, seed, count):
    data = bytearray(model.SerializeToString())
    rng = random.Random(seed)
    for _ in range(count):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def m_truncate(model, fraction):
    data = model.SerializeToString()
    size = len(data) - 1 if fraction == "minus1" else int(len(data) * fraction)
    return data[:size]


def m_append_garbage(model, seed):
    rng = random.Random(seed)
    return model.SerializeToString() + bytes(rng.randrange(256) for _ in range(64))


def m_raw_bytes(model, kind):
    size = len(model.SerializeToString())
    return {"empty": b"", "zeros": bytes(size), "text": b"this is not an onnx model\n" * 4,
            "one": b"\x08"}[kind]


def m_file(model, kind):
    """The model (or something else) at a path in the child's private folder."""
    folder = case_dir()
    path = folder / "model.onnx"
    if kind == "missing":
        return str(folder / "missing.onnx")
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink_loop":
        os.symlink(folder / "loop_b.onnx", folder / "loop_a.onnx")
        os.symlink(folder / "loop_a.onnx", folder / "loop_b.onnx")
        return str(folder / "loop_a.onnx")
    elif kind == "dangling_symlink":
        os.symlink(folder / "nowhere.onnx", path)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("graph { node { op_type: 'Relu' } }\n")
    elif kind == "valid":
        path.write_bytes(model.SerializeToString())
    elif kind == "unicode_name":
        path = folder / "mödel \n名前.onnx"
        path.write_bytes(model.SerializeToString())
    return str(path)


MUTATIONS = {name[2:]: function for name, function in globals().items() if name.startswith("m_")}


# ---------------------------------------------------------------------------------
# In the child: rebuild, import, interpret, compare with onnxruntime
# ---------------------------------------------------------------------------------

_DEFAULT = "default"


def build_source(base: str, mutation: str, args: dict):
    proto = onnx.ModelProto()
    proto.CopyFrom(base_model(base).proto)
    return MUTATIONS[mutation](proto, **args)


def run_model(base: str, mutation: str = "none", args: dict | None = None, input_shapes=_DEFAULT,
              lenient_nonfinite: bool = False, untype_outputs: bool = False, seed: int = 0):
    import byoc
    info = base_model(base)
    try:
        source = build_source(base, mutation, args or {})
        if untype_outputs and isinstance(source, onnx.ModelProto):
            for output in source.graph.output:
                output.ClearField("type")
    except Exception as error:  # noqa: BLE001 - a bug of this suite, not of byoc
        return Outcome("raw", f"[suite] mutation {mutation}({args}) failed: {type(error).__name__}: {error}")
    shapes = info.input_shapes if input_shapes == _DEFAULT else input_shapes
    module = byoc.from_onnx(source, input_shapes=shapes)
    feeds = _inputs_for(module, fixture_inputs(info.fixture) if info.fixture else {}, seed)
    if feeds is None:
        return Outcome("accepted_not_run", "inputs too large to run here")
    got = byoc.interpret(module, **feeds)
    got = list(got) if isinstance(got, tuple) else [got]
    want, refusal = _onnxruntime(source, feeds)
    if refusal:
        return Outcome("accepted_ort_refused", refusal)
    return _compare(got, want, lenient_nonfinite)


def _inputs_for(module, given: dict, seed: int) -> dict | None:
    from byoc.ir.types import numpy_dtype
    rng = np.random.default_rng(seed)
    feeds = {}
    for param in module["main"].params:
        shape, dtype = tuple(param.type.shape), numpy_dtype(param.type.dtype)
        if math.prod(shape) > MAX_RUN_ELEMENTS:
            return None
        value = given.get(param.name_hint)
        if value is not None and value.shape == shape and value.dtype == dtype:
            feeds[param.name_hint] = value
        elif dtype == np.bool_:
            feeds[param.name_hint] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[param.name_hint] = rng.integers(0, 3, shape).astype(dtype)
        else:
            feeds[param.name_hint] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _onnxruntime(source, feeds) -> tuple[list | None, str]:
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    # The reference is the spec: onnxruntime's fused kernels (e.g. LayerNormalization over
    # several axes after a Gather) can differ from its own unoptimized kernels.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = source.SerializeToString() if isinstance(source, onnx.ModelProto) else source
    try:
        session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        return session.run(None, {k: v for k, v in feeds.items() if k in names}), ""
    except Exception as error:  # noqa: BLE001 - onnxruntime refusing is information
        return None, f"onnxruntime: {type(error).__name__}: {str(error)[:300]}"


def _compare(got: list, want: list, lenient_nonfinite: bool):
    if len(got) != len(want):
        return Outcome("wrong", f"{len(got)} outputs; onnxruntime gives {len(want)}")
    for index, (mine, theirs) in enumerate(zip(got, want)):
        mine, theirs = np.asarray(mine), np.asarray(theirs)
        if mine.shape != theirs.shape:
            return Outcome("wrong", f"output {index}: shape {mine.shape}; onnxruntime gives {theirs.shape}")
        if mine.dtype != theirs.dtype:
            return Outcome("wrong", f"output {index}: dtype {mine.dtype}; onnxruntime gives {theirs.dtype}")
        if mine.dtype.kind in "biu":
            bad = mine != theirs
        else:
            a, b = mine.astype(np.float64), theirs.astype(np.float64)
            finite = np.isfinite(b)
            scale = max(1.0, float(np.max(np.abs(b[finite]))) if finite.any() else 1.0)
            tolerance = 1e-2 if mine.dtype in (np.float16,) or "bfloat16" in str(mine.dtype) else 1e-3
            close = np.isclose(a, b, rtol=tolerance, atol=tolerance * 1e-2 * scale, equal_nan=True)
            bad = ~close
            if lenient_nonfinite:  # flipped weight bytes: NaN/inf handling is implementation-defined
                bad &= np.isfinite(a) & np.isfinite(b)
        if np.any(bad):
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            return Outcome("wrong", f"output {index}: {int(np.sum(bad))} of {mine.size} elements differ from "
                                    f"onnxruntime, e.g. at {where}: {mine[where]!r} vs {theirs[where]!r}")
    return Outcome("correct")


# ---------------------------------------------------------------------------------
# Generators (in the pytest process): recipes + what the spec expects
# ---------------------------------------------------------------------------------

def _case(base, group, name, mutation="none", args=None, expect="any", why="", names=(), **extra) -> Case:
    """A model case. `names` are checked only where the spec forbids the mutation
    (expect="refuse"): a valid mutation may fail further down the graph, at a node that
    the message then names. The outputs' declared types are removed from valid
    mutations that change types or shapes, which would otherwise no longer match."""
    params = {"base": base, "mutation": mutation, "args": args or {}}
    if expect == "any" and group.startswith(("attribute/", "input/", "initializer/")):
        params["untype_outputs"] = True
    params.update(extra)
    return Case("model", group, f"{base}:{name}", FUNCTION, params, timeout=TIMEOUT, expect=expect, why=why,
                names=tuple(n for n in names if n) if expect == "refuse" else ())


def _label(node):
    return node.name or node.op_type


def _nodes_for_attributes(base: spec.BaseModel):
    """One-node models: the node. Fixtures: the first node of each op type."""
    seen = set()
    for index, node in enumerate(base.proto.graph.node):
        if node.op_type not in seen:
            seen.add(node.op_type)
            yield index, node


def _opset(base):
    return next(e.version for e in base.proto.opset_import if e.domain in ("", "ai.onnx"))


def attribute_cases(base: spec.BaseModel):
    for index, node in _nodes_for_attributes(base):
        try:
            op_schema = onnx.defs.get_schema(node.op_type, _opset(base), "")
        except onnx.defs.SchemaError:
            continue
        rank = base.ranks.get(node.input[0]) if node.input and node.input[0] else None
        present = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        label = _label(node)
        node_names = (node.name,) if node.name else (node.op_type,)
        for name, attribute in sorted(op_schema.attributes.items()):
            current = present.get(name)
            if current is None and attribute.default_value.name:
                current = helper.get_attribute_value(attribute.default_value)
            if isinstance(current, bytes):
                current = current.decode()
            where = f"{label}.{name}"
            if name in present:
                required = attribute.required or (node.op_type == "Constant" and len(present) == 1)
                yield _case(base.name, "attribute/drop", f"{where}:drop", "drop_attribute",
                            {"node": index, "name": name}, expect="refuse" if required else "any",
                            why=f"{node.op_type} requires {name}", names=(name,) + node_names)
            if attribute.type == onnx.defs.OpSchema.AttrType.GRAPH:
                continue
            for value in spec.WRONG_TYPE_VALUES.get(attribute.type, []):
                yield _case(base.name, "attribute/wrong_type", f"{where}={value!r}", "set_attribute",
                            {"node": index, "name": name, "value": value}, expect="refuse",
                            why=f"{node.op_type}.{name} is of type {attribute.type.name}", names=(name,) + node_names)
            for value, why in spec.forbidden_values(node.op_type, name, rank, current):
                yield _case(base.name, "attribute/out_of_domain", f"{where}={value!r}", "set_attribute",
                            {"node": index, "name": name, "value": value}, expect="refuse", why=why, names=(name,) + node_names)
            for value in spec.valid_variants(node.op_type, name, rank, current):
                if name == "auto_pad" and value != "NOTSET" and "pads" in present:
                    yield _case(base.name, "attribute/out_of_domain", f"{where}={value!r} with pads", "set_attribute",
                                {"node": index, "name": name, "value": value}, expect="refuse",
                                why="auto_pad and explicit pads cannot be used together", names=(name,) + node_names)
                    continue
                yield _case(base.name, "attribute/variant", f"{where}={value!r}", "set_attribute",
                            {"node": index, "name": name, "value": value}, names=(name,) + node_names)
        yield _case(base.name, "attribute/unknown", f"{label}.bogus_attr", "set_attribute",
                    {"node": index, "name": "bogus_attr", "value": 1}, expect="refuse",
                    why="attributes are those of the op's schema", names=("bogus_attr",) + node_names)
        if node.attribute:
            yield _case(base.name, "attribute/duplicate", f"{label}.{node.attribute[0].name}:twice",
                        "duplicate_attribute", {"node": index}, expect="refuse",
                        why="an attribute is given once", names=(node.attribute[0].name,) + node_names)


def structure_cases(base: spec.BaseModel, rng: random.Random):
    graph = base.proto.graph
    count = len(graph.node)
    picks = sorted(set(rng.randrange(count) for _ in range(3))) if count > 1 else [0]
    produced_later = {}
    for index, node in enumerate(graph.node):
        for output in node.output:
            produced_later[output] = index
    for index in picks:
        node = graph.node[index]
        label, outputs = _label(node), [o for o in node.output if o]
        yield _case(base.name, "structure/drop_node", f"drop {label}", "drop_node", {"node": index},
                    names=tuple(outputs) + (label,))
        yield _case(base.name, "structure/duplicate_node", f"duplicate {label}", "duplicate_node",
                    {"node": index}, expect="refuse", why="each value is defined once (SSA)",
                    names=tuple(outputs) + (label,))
        if outputs:
            yield _case(base.name, "structure/rename_output", f"rename output of {label}", "rename_output",
                        {"node": index, "new": "renamed_value"}, names=(outputs[0], "renamed_value", label))
        if node.input:
            yield _case(base.name, "structure/dangling_input", f"dangling input of {label}", "rename_input",
                        {"node": index, "position": 0, "new": "ghost_value"}, expect="refuse",
                        why="every input names a defined value", names=("ghost_value",))
            yield _case(base.name, "structure/cycle", f"self cycle at {label}", "self_cycle", {"node": index},
                        expect="refuse", why="a graph is acyclic", names=(node.output[0], label))
            yield _case(base.name, "structure/extra_input", f"extra input of {label}", "extra_node_input",
                        {"node": index}, names=(label, node.op_type))
        yield _case(base.name, "structure/unknown_op", f"{label} as FooBar", "set_op_type",
                    {"node": index, "op_type": "FooBar"}, expect="refuse", why="FooBar is no ONNX op",
                    names=("FooBar",))
        yield _case(base.name, "structure/custom_domain", f"{label} in com.example", "set_op_type",
                    {"node": index, "op_type": node.op_type, "domain": "com.example"}, expect="refuse",
                    why="byoc reads the default domain only", names=("com.example", node.op_type))
    if count > 1:
        last = count - 1
        consumer = next((i for i, n in enumerate(graph.node) if n.input and n.input[0]), None)
        if consumer is not None and consumer < last:
            yield _case(base.name, "structure/cycle", "back edge", "back_edge", {"node": consumer, "source": last},
                        expect="refuse", why="a graph is acyclic / topologically sorted",
                        names=(graph.node[last].output[0], _label(graph.node[consumer])))
        yield _case(base.name, "structure/unsorted", "nodes reversed", "reverse_nodes", expect="refuse",
                    why="nodes are topologically sorted")
    for index, graph_input in enumerate(graph.input):
        yield _case(base.name, "structure/graph_input", f"drop input {graph_input.name}", "drop_graph_input",
                    {"index": index}, names=(graph_input.name,))
        yield _case(base.name, "structure/graph_input", f"duplicate input {graph_input.name}",
                    "duplicate_graph_input", {"index": index}, expect="refuse", why="graph input names are unique",
                    names=(graph_input.name,))
    for index, output in enumerate(graph.output):
        yield _case(base.name, "structure/graph_output", f"drop output {output.name}", "drop_graph_output",
                    {"index": index})
        yield _case(base.name, "structure/graph_output", f"duplicate output {output.name}",
                    "duplicate_graph_output", {"index": index}, names=(output.name,))
    for index, output in enumerate(graph.output):
        if not output.type.HasField("tensor_type"):
            continue
        declared = output.type.tensor_type
        other = TensorProto.INT8 if declared.elem_type != TensorProto.INT8 else TensorProto.FLOAT
        yield _case(base.name, "structure/output_type", f"output {output.name} declared {other}", "output_type",
                    {"index": index, "elem_type": other}, expect="refuse",
                    why="a graph output's declared type is the type its node produces", names=(output.name,))
        if declared.HasField("shape"):
            yield _case(base.name, "structure/output_type", f"output {output.name} declared rank+1", "output_type",
                        {"index": index, "dims": [7] + [d.dim_value or 1 for d in declared.shape.dim]},
                        expect="refuse", why="a graph output's declared shape is the shape its node produces",
                        names=(output.name,))
    yield _case(base.name, "structure/graph_output", "undefined output", "add_graph_output",
                {"name": "ghost_output"}, expect="refuse", why="graph outputs name defined values",
                names=("ghost_output",))
    if graph.initializer:
        index = rng.randrange(len(graph.initializer))
        name = graph.initializer[index].name
        as_input = name in {i.name for i in graph.input}
        yield _case(base.name, "structure/initializer", f"drop initializer {name}", "drop_initializer",
                    {"index": index}, expect="any" if as_input else "refuse",
                    why="every input names a defined value", names=(name,))
        yield _case(base.name, "structure/initializer", f"duplicate initializer {name}", "duplicate_initializer",
                    {"index": index}, expect="refuse", why="initializer names are unique", names=(name,))
    for version, why in ((12, "byoc reads opsets 13 and newer"), (99, "opset 99 does not exist"),
                         (None, "a model imports the default-domain opset")):
        yield _case(base.name, "structure/opset", f"opset {version}", "opset", {"version": version},
                    expect="refuse", why=why, names=("opset",))
    yield _case(base.name, "structure/no_nodes", "no nodes", "no_nodes", expect="refuse",
                why="outputs name defined values", names=tuple(o.name for o in graph.output))


def input_cases(base: spec.BaseModel):
    graph = base.proto.graph
    initializers = {t.name for t in graph.initializer}
    for index, graph_input in enumerate(graph.input):
        name = graph_input.name
        if name in initializers or not graph_input.type.HasField("tensor_type"):
            continue
        tensor_type = graph_input.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim]
        static = [d if isinstance(d, int) else (base.input_shapes or {}).get(name, [1] * len(dims))[i]
                  for i, d in enumerate(dims)]
        for type_name, elem_type in spec.UNSUPPORTED_ELEM_TYPES.items():
            yield _case(base.name, "input/unsupported_dtype", f"{name} as {type_name}", "input_elem_type",
                        {"index": index, "elem_type": elem_type}, expect="refuse",
                        why=f"byoc has no {type_name} tensors", names=(name,))
        for elem_type in (TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL):
            if elem_type != tensor_type.elem_type:
                type_name = TensorProto.DataType.Name(elem_type)
                yield _case(base.name, "input/other_dtype", f"{name} as {type_name}", "input_elem_type",
                            {"index": index, "elem_type": elem_type}, names=(name,))
        variants = {"negative": ([-1] + static[1:], "refuse", "dims are non-negative"),
                    "zero": ([0] + static[1:], "any", ""),
                    "huge": ([2**40] + static[1:], "any", ""),
                    "int64_max": ([2**63 - 1] + static[1:], "any", ""),
                    "rank_plus_1": ([1] + static, "any", ""),
                    "rank_minus_1": (static[1:], "any", ""),
                    "named": (["N"] + static[1:], "refuse" if base.input_shapes is None else "any",
                              "a dynamic dim needs input_shapes"),
                    "no_shape": (None, "refuse" if base.input_shapes is None else "any",
                                 "an input without a shape needs input_shapes")}
        for variant, (new_dims, expect, why) in variants.items():
            if variant == "rank_minus_1" and not static:
                continue
            yield _case(base.name, "input/dims", f"{name} dims {variant}", "input_dims",
                        {"index": index, "dims": new_dims}, expect=expect, why=why, names=(name,))
        yield _case(base.name, "input/not_tensor", f"{name} as a sequence", "input_not_tensor", {"index": index},
                    expect="refuse", why="byoc takes tensor inputs", names=(name,))
        shapes = dict(base.input_shapes or {})
        misuse = {"wrong_rank": ({**shapes, name: tuple(static) + (1,)}, (name,)),
                  "negative": ({**shapes, name: (-1,) + tuple(static[1:])}, (name,)),
                  "string": ({**shapes, name: ",".join(map(str, static))}, (name,)),
                  "float_dims": ({**shapes, name: tuple(float(d) + 0.5 for d in static)}, (name,)),
                  "unknown_name": ({**shapes, "no_such_input": (1,)}, ("no_such_input",)),
                  "not_a_dict": ([tuple(static)], ("input_shapes",)),
                  "none_dims": ({**shapes, name: None}, (name,))}
        for variant, (value, names) in misuse.items():
            yield _case(base.name, "input/input_shapes", f"input_shapes {variant} for {name}", input_shapes=value,
                        expect="refuse", why="input_shapes maps input names to static shapes", names=names)
        if base.input_shapes is None and all(isinstance(d, int) for d in dims):
            yield _case(base.name, "input/input_shapes", f"input_shapes matching {name}",
                        input_shapes={name: tuple(static)})


def initializer_cases(base: spec.BaseModel, rng: random.Random):
    graph = base.proto.graph
    if not graph.initializer:
        return
    picks = sorted(set(rng.randrange(len(graph.initializer)) for _ in range(2)))
    for index in picks:
        tensor = graph.initializer[index]
        name = tensor.name
        for type_name in ("UINT16", "STRING", "COMPLEX64", "999"):
            yield _case(base.name, "initializer/unsupported_dtype", f"{name} as {type_name}",
                        "initializer_data_type", {"index": index, "data_type": spec.UNSUPPORTED_ELEM_TYPES[type_name]},
                        expect="refuse", why=f"byoc has no {type_name} tensors", names=(name,))
        yield _case(base.name, "initializer/bad_data", f"{name} truncated", "initializer_truncate", {"index": index},
                    expect="refuse", why="raw_data holds the elements its dims need", names=(name,))
        dims = list(tensor.dims)
        yield _case(base.name, "initializer/bad_data", f"{name} dims grown", "initializer_dims",
                    {"index": index, "dims": [d + 1 for d in dims] or [2]}, expect="refuse",
                    why="raw_data holds the elements its dims need", names=(name,))
        yield _case(base.name, "initializer/bad_data", f"{name} negative dim", "initializer_dims",
                    {"index": index, "dims": [-1] + dims[1:] if dims else [-1]}, expect="refuse",
                    why="dims are non-negative", names=(name,))
        yield _case(base.name, "initializer/bad_data", f"{name} external", "initializer_external", {"index": index},
                    expect="refuse", why="the external file is missing", names=(name,))
        yield _case(base.name, "initializer/bad_data", f"{name} typed field of wrong length",
                    "initializer_typed_wrong_count", {"index": index}, expect="refuse",
                    why="float_data holds the elements its dims need", names=(name,))
        if len(dims) >= 2:
            yield _case(base.name, "initializer/reshaped", f"{name} flattened", "initializer_dims",
                        {"index": index, "dims": [math.prod(dims)]})


def bytes_cases(base: spec.BaseModel, seeds: int):
    for seed in range(seeds):
        for count in (1, 8):
            yield _case(base.name, "bytes/flip", f"flip {count} seed {seed}", "flip_bytes",
                        {"seed": f"{base.name}:{seed}:{count}", "count": count}, lenient_nonfinite=True)
    for fraction in (0.1, 0.5, 0.9, "minus1"):
        yield _case(base.name, "bytes/truncate", f"truncate {fraction}", "truncate", {"fraction": fraction},
                    lenient_nonfinite=True)
    yield _case(base.name, "bytes/garbage", "append garbage", "append_garbage", {"seed": base.name},
                lenient_nonfinite=True)


def file_cases(base: spec.BaseModel):
    for kind, expect in (("missing", "refuse"), ("directory", "refuse"), ("fifo", "refuse"),
                         ("symlink_loop", "refuse"), ("dangling_symlink", "refuse"), ("empty", "refuse"),
                         ("text", "refuse"), ("valid", "any"), ("unicode_name", "any")):
        yield _case(base.name, "file/path", f"path {kind}", "file", {"kind": kind}, expect=expect,
                    why="not a readable ONNX file", names=("model.onnx", "missing.onnx", "loop_a.onnx", "mödel"))
    for kind in ("empty", "zeros", "text", "one"):
        yield _case(base.name, "file/bytes", f"bytes {kind}", "raw_bytes", {"kind": kind}, expect="refuse",
                    why="not an ONNX model")


def generate(everything: bool) -> list[Case]:
    """All model cases (everything=True, about 11,000), or the default sample: every base
    unmutated, every group represented, about 1,100 cases."""
    cases: list[Case] = []
    for name in base_names():
        base = base_model(name)
        rng = random.Random(f"model:{name}")
        # the positive control of every mutation below: the model as it is imports and matches
        cases.append(_case(name, "base", "unmutated", expect="accept"))
        cases += list(structure_cases(base, rng))
        cases += list(attribute_cases(base))
        cases += list(input_cases(base))
        cases += list(initializer_cases(base, rng))
        cases += list(bytes_cases(base, seeds=12 if everything else 4))
        if name in ("mlp", "op:Relu"):
            cases += list(file_cases(base))
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "model case names must be unique"
    if everything:
        return cases
    return sample(cases, fraction=0.08, keep=("base", "file/path", "file/bytes"), seed="model", cap=100,
                  boost={"attribute/": 0.35, "structure/output_type": 0.2, "initializer/": 0.2})


def sample(cases: list[Case], fraction: float, keep=(), seed: str = "", cap: int = 10**9,
           boost: dict | None = None) -> list[Case]:
    """A seeded sample of each group: `fraction` of it (boost: a fraction per group
    prefix), at least 3 cases and at most `cap`; groups in `keep` whole."""
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.group, []).append(case)
    chosen = set()
    for group, members in groups.items():
        if group in keep:
            chosen.update(id(c) for c in members)
            continue
        share = next((f for prefix, f in (boost or {}).items() if group.startswith(prefix)), fraction)
        rng = random.Random(f"{seed}:{group}")
        size = min(len(members), max(3, round(len(members) * share)), cap)
        chosen.update(id(c) for c in rng.sample(members, size))
    return [c for c in cases if id(c) in chosen]
