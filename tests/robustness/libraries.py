"""The built libraries the runtime families use (built once per session), their reference
answers, and where their parts lie in the file (for the corruption family).

  mlp     tests/fixtures/mlp.onnx: x float32 [4, 64] -> y float32 [4, 32] (weights embedded)
  multi   a [8, 8] float32, b [8] float32, idx [3] int64 ->
          t = Transpose(a), u = a + b, g = Gather(a, idx): an output with a caller buffer
          that overlaps an input, and indices that arrive at run time
  sidecar mlp built with params: sidecar (mlp.so + mlp.safetensors)
  fakes   tiny C libraries that export byoc's symbols but lie (metadata that is no JSON,
          lacks keys, is NULL, ...): what a damaged or foreign file may look like
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def expand_model(elements: int):
    """One constant expanded to `elements` float32 values (node 'grow', tensor 'big'), plus
    an input: the graph's output. Sizes no machine holds, and constants the build must not fold."""
    from onnx import TensorProto, helper, numpy_helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [elements])
    nodes = [helper.make_node("Expand", ["one", "shape"], ["big"], name="grow"),
             helper.make_node("Add", ["big", "x"], ["y"])]
    initializers = [numpy_helper.from_array(np.array([elements], np.int64), "shape"),
                    numpy_helper.from_array(np.ones(1, np.float32), "one")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializers),
                             opset_imports=[helper.make_opsetid("", 17)])


def multi_model():
    from onnx import TensorProto, helper
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [8, 8]),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, [8]),
              helper.make_tensor_value_info("idx", TensorProto.INT64, [3])]
    nodes = [helper.make_node("Transpose", ["a"], ["t"], name="transpose", perm=[1, 0]),
             helper.make_node("Add", ["a", "b"], ["u"], name="add"),
             helper.make_node("Gather", ["a", "idx"], ["g"], name="gather", axis=0)]
    outputs = [helper.make_tensor_value_info("t", TensorProto.FLOAT, [8, 8]),
               helper.make_tensor_value_info("u", TensorProto.FLOAT, [8, 8]),
               helper.make_tensor_value_info("g", TensorProto.FLOAT, [3, 8])]
    return helper.make_model(helper.make_graph(nodes, "multi", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 17)])


def multi_reference(a, b, idx):
    a, b, idx = (np.asarray(v) for v in (a, b, idx))
    return [a.T.copy(), a + b, a[idx]]


def multi_inputs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((8, 8)).astype(np.float32),
            "b": rng.standard_normal(8).astype(np.float32),
            "idx": np.array([7, 0, -1], dtype=np.int64)}


def mlp_inputs() -> tuple[dict, list]:
    data = np.load(FIXTURES / "mlp.npz")
    return {"x": data["in_x"]}, [data["out_y"]]


def _layout(path: Path, workdir: Path | None) -> dict:
    """Offsets of the ELF tables, the metadata JSON and the weights blob in the file."""
    data = path.read_bytes()
    (e_phoff, e_shoff) = struct.unpack_from("<QQ", data, 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHHHH", data, 0x36)
    sections = {}
    names_offset = struct.unpack_from("<Q", data, e_shoff + e_shstrndx * e_shentsize + 0x18)[0]
    for index in range(e_shnum):
        base = e_shoff + index * e_shentsize
        name_index, = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        end = data.index(b"\0", names_offset + name_index)
        sections[data[names_offset + name_index:end].decode()] = (offset, size)
    metadata_start = data.find(b'{"arch"')
    metadata_end = data.index(b"\0", metadata_start)
    layout = {"size": len(data), "phoff": e_phoff, "phentsize": e_phentsize, "phnum": e_phnum,
              "shoff": e_shoff, "shentsize": e_shentsize, "shnum": e_shnum, "sections": sections,
              "metadata": (metadata_start, metadata_end - metadata_start), "weights": None}
    if workdir is not None and (workdir / "program.bin").exists():
        # the program table, and where the host code keeps its checksum (forged cases
        # rewrite both, so that the decoder's own checks are what refuses them)
        from byoc.codegen.host import blob_checksum
        table = (workdir / "program.bin").read_bytes()
        start = data.find(table)
        checksum = struct.pack("<Q", blob_checksum(table))
        if start >= 0 and data.count(checksum) == 1:
            layout["program"] = (start, len(table))
            layout["program_checksum_at"] = data.find(checksum)
    if path is not None:
        from byoc.runtime import embedded_weights
        weights = embedded_weights(path)
        start = data.find(weights[:4096]) if weights else -1
        if start >= 0:
            layout["weights"] = (start, len(weights))
    return layout


def build_one(root: Path, kind: str, config="cpu", device="cpu", tolerance=1e-3, name_suffix="") -> dict:
    """Build one library kind (mlp, multi, sidecar) and describe it for the case families."""
    import byoc
    model, params = {"mlp": (FIXTURES / "mlp.onnx", None), "multi": (multi_model(), None),
                     "sidecar": (FIXTURES / "mlp.onnx", "sidecar"), "json": (FIXTURES / "mlp.onnx", None)}[kind]
    if kind == "json":  # the mlp's GEMMs in a JSON-runtime partition (the cuBLASLt engine, on the cpu)
        config = {"target": "cpu", "backends": ["cublaslt", "builtin"]}
    workdir = root / f"build_{kind}{name_suffix}"
    library = byoc.build(model, config=config, workdir=str(workdir), params=params)
    deployed = library.export_library(root / "deploy" / f"{kind}{name_suffix}" / f"{kind}.so")
    info = {"kind": kind, "path": str(deployed), "device": device, "tolerance": tolerance,
            "layout": _layout(deployed, workdir), "metadata": library.metadata}
    if params == "sidecar":
        info["sidecar"] = str(deployed.with_suffix(".safetensors"))
    if kind == "json":
        info["layout"].update(_json_graph_layout(deployed, workdir))
    shutil.rmtree(workdir, ignore_errors=True)
    return info


def _json_graph_layout(path: Path, workdir: Path) -> dict:
    """Where the JSON graph embedded by the cublaslt wrapper lies in the file, and its
    checksum (the forged-graph cases rewrite both)."""
    import re

    from byoc.codegen.host import blob_checksum
    data = path.read_bytes()
    wrapper = next(p for p in workdir.glob("cublaslt_*.cc") if "kGraph" in p.read_text())
    listed = re.search(r"kGraph\[\] = \{(.*?)\};", wrapper.read_text(), re.S).group(1)
    graph = bytes(int(b) for b in listed.replace("\n", "").split(","))
    checksum = struct.pack("<Q", blob_checksum(graph))
    if data.count(graph) != 1 or data.count(checksum) != 1:
        return {}
    return {"graph": (data.index(graph), len(graph)), "graph_checksum_at": data.index(checksum)}


def build_all(root: Path, config="cpu", device="cpu", tolerance=1e-3, name_suffix="") -> dict:
    """Build mlp, multi and the sidecar mlp for `config`; returns {kind: library info}."""
    kinds = ("mlp", "multi", "sidecar") + (("json",) if device == "cpu" else ())
    built = {kind: build_one(root, kind, config, device, tolerance, name_suffix) for kind in kinds}
    siblings = {kind: info["path"] for kind, info in built.items()}
    for info in built.values():
        info["siblings"] = siblings
    return built


def as_model_dtypes(inputs: dict, metadata: dict) -> dict:
    """Inputs converted to the dtypes the library declares (a float16 build may take
    float16 inputs)."""
    from byoc.ir.types import numpy_dtype
    declared = {spec["name"]: spec["dtype"] for spec in metadata["inputs"]}
    return {name: np.asarray(value).astype(numpy_dtype(declared[name])) if name in declared else value
            for name, value in inputs.items()}


# ---- fake libraries ------------------------------------------------------------------

_FAKE_SOURCE = r"""
#include <stddef.h>
#include <stdlib.h>
const char* byoc_model_metadata(void) { return METADATA; }
const char* byoc_last_error(void) { return LAST_ERROR; }
#ifndef NO_CREATE
int byoc_model_create(void** model, const char* weights_path) { *model = malloc(16); return CREATE_STATUS; }
#endif
int byoc_model_run(void* model, const void* in, int n, const void* out, int m, void* stream) { return RUN_STATUS; }
void byoc_model_destroy(void* model) { free(model); }
"""


def _c_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid C string literal for ASCII text


def fake_variants(metadata: dict) -> dict:
    """name -> C macro definitions; `metadata` is a real library's, for the near-real fakes."""
    real = json.dumps(metadata, separators=(",", ":"))
    no_inputs = json.dumps({k: v for k, v in metadata.items() if k != "inputs"}, separators=(",", ":"))
    wrong_types = json.dumps({**metadata, "inputs": 5, "outputs": "y", "weights": []}, separators=(",", ":"))
    bad_shape = json.dumps({**metadata, "outputs": [{"name": "y", "dtype": "float32", "shape": [-4, 32]}]},
                           separators=(",", ":"))
    bad_dtype = json.dumps({**metadata, "outputs": [{"name": "y", "dtype": "complex64", "shape": [4, 32]}]},
                           separators=(",", ":"))
    ok = {"METADATA": _c_string(real), "LAST_ERROR": _c_string("fake error"), "CREATE_STATUS": "0",
          "RUN_STATUS": "0"}
    return {
        "metadata_not_json": {**ok, "METADATA": _c_string("this is not json")},
        "metadata_empty_object": {**ok, "METADATA": _c_string("{}")},
        "metadata_null": {**ok, "METADATA": "NULL"},
        "metadata_not_utf8": {**ok, "METADATA": '"{\\"arch\\":\\"\\xff\\xfe\\"}"'},
        "metadata_without_inputs": {**ok, "METADATA": _c_string(no_inputs)},
        "metadata_wrong_types": {**ok, "METADATA": _c_string(wrong_types)},
        "metadata_negative_shape": {**ok, "METADATA": _c_string(bad_shape)},
        "metadata_unknown_dtype": {**ok, "METADATA": _c_string(bad_dtype)},
        "no_create_symbol": {**ok, "NO_CREATE": "1"},
        "create_fails_error_null": {**ok, "CREATE_STATUS": "1", "LAST_ERROR": "NULL"},
        "create_fails_error_not_utf8": {**ok, "CREATE_STATUS": "1", "LAST_ERROR": '"\\xff\\xfe bad"'},
        "run_fails_error_null": {**ok, "RUN_STATUS": "1", "LAST_ERROR": "NULL"},
    }


def build_fakes(root: Path, metadata: dict) -> dict:
    """Compile each fake with the system C compiler; {name: path} (empty without one)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return {}
    folder = root / "fakes"
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "fake.c"
    source.write_text(_FAKE_SOURCE)
    fakes = {}
    for name, macros in fake_variants(metadata).items():
        output = folder / name / "fake.so"
        output.parent.mkdir(exist_ok=True)
        defines = [f"-D{key}={value}" for key, value in macros.items()]
        subprocess.run([compiler, "-shared", "-fPIC", "-O0", "-w", *defines, str(source), "-o", str(output)],
                       check=True, capture_output=True)
        fakes[name] = str(output)
    return fakes
