"""The JSON runtime backend: serializer (backends/cublaslt/serialize.py) and engine
(backends/cublaslt/engine/): build the engine's CPU path with g++, create it from
serialized subgraphs, run, compare with byoc.interpret; fuzz create() with >= 1,000
malformed graphs in a subprocess; compile the CUDA path with nvcc for sm_90; on a GPU
(pytest -m gpu), run fp16 BERT-base GEMMs through cuBLASLt against float32 references.
"""
from __future__ import annotations

import ctypes
import re
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import byoc
from byoc.ir import FunctionBuilder
from byoc.ir.expr import Call, Constant, Function
from byoc.ir.types import numpy_dtype

from byoc.backends.cublaslt.serialize import serialize_function

from byoc.backends.cublaslt import ENGINE_DIR as _ENGINE_DIR, ENGINE_SOURCES as _ENGINE_NAMES
from gpu_probe import gpu_present

ENGINE_DIR = str(_ENGINE_DIR)
ENGINE_SOURCES = [os.path.join(ENGINE_DIR, name) for name in _ENGINE_NAMES]  # what a build compiles
RUNTIME_INCLUDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "byoc", "runtime")
CPU_FLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", f"-I{RUNTIME_INCLUDE}"]
WEIGHTS_ALIGNMENT = 256
DEVICE_CPU, DEVICE_CUDA = 1, 2


# ============================================================== building the engine

def _build_cpu_library(directory: str) -> str:
    path = os.path.join(directory, "libbyoc_json_engine_cpu.so")
    command = ["g++", *CPU_FLAGS, *ENGINE_SOURCES, "-o", path]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr}"
    return path


def find_cublaslt() -> tuple[str, str, str] | None:
    """(include dir, lib dir, linker flag) of cuBLASLt: the CUDA toolkit's, else the pip
    package nvidia-cublas (cu13 or cu12 layout, versioned .so only)."""
    toolkit = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if os.path.exists(os.path.join(toolkit, "include", "cublasLt.h")):
        for lib in ("lib64", os.path.join("targets", "x86_64-linux", "lib")):
            if glob.glob(os.path.join(toolkit, lib, "libcublasLt.so*")):
                return os.path.join(toolkit, "include"), os.path.join(toolkit, lib), "-lcublasLt"
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for flavor in ("cu13", "cublas"):
            include = os.path.join(root, flavor, "include")
            libs = sorted(glob.glob(os.path.join(root, flavor, "lib", "libcublasLt.so*")))
            if os.path.exists(os.path.join(include, "cublasLt.h")) and libs:
                return include, os.path.dirname(libs[0]), "-l:" + os.path.basename(libs[0])
    return None


def find_nvcc() -> str | None:
    candidate = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return candidate if os.path.exists(candidate) else shutil.which("nvcc")


def _build_cuda_library(directory: str, arch: str = "sm_90") -> str:
    nvcc, cublaslt = find_nvcc(), find_cublaslt()
    if nvcc is None or cublaslt is None:
        pytest.skip("nvcc or the cuBLASLt headers are not available")
    include, lib_dir, lib_flag = cublaslt
    cuda_object = os.path.join(directory, "engine_cuda.o")
    def host_object(source):
        return os.path.join(directory, os.path.basename(source)[:-3] + ".o")

    library = os.path.join(directory, "libbyoc_json_engine_cuda.so")
    cudart_dir = os.path.join(os.path.dirname(os.path.dirname(nvcc)), "lib64")
    commands = [
        [nvcc, "-std=c++17", f"-arch={arch}", "-O2", "-DBYOC_JSON_ENGINE_WITH_CUDA", "-Xcompiler", "-fPIC",
         f"-I{include}", "-c", os.path.join(ENGINE_DIR, "engine_cuda.cu"), "-o", cuda_object],
        *[["g++", "-std=c++17", "-O2", "-fPIC", "-DBYOC_JSON_ENGINE_WITH_CUDA", f"-I{RUNTIME_INCLUDE}", "-c",
           source, "-o", host_object(source)] for source in ENGINE_SOURCES],
        ["g++", "-shared", *map(host_object, ENGINE_SOURCES), cuda_object, "-o", library, f"-L{cudart_dir}",
         "-lcudart", f"-L{lib_dir}", lib_flag, f"-Wl,-rpath,{lib_dir}"],
    ]
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout}\n{result.stderr}"
    return library


class EngineLibrary:
    """ctypes view of the C API in byoc_json_engine.h."""

    def __init__(self, path: str):
        self.path = path
        lib = self.lib = ctypes.CDLL(path)
        lib.byoc_json_engine_create.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                                ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.byoc_json_engine_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_void_p]
        lib.byoc_json_engine_workspace.argtypes = [ctypes.c_void_p]
        lib.byoc_json_engine_workspace.restype = ctypes.c_size_t
        lib.byoc_json_engine_describe.argtypes = [ctypes.c_void_p]
        lib.byoc_json_engine_describe.restype = ctypes.c_char_p
        lib.byoc_json_engine_destroy.argtypes = [ctypes.c_void_p]
        lib.byoc_json_engine_last_error.restype = ctypes.c_char_p

    def create(self, text: bytes, weights_pointer: int | None, weights_bytes: int, device: int = DEVICE_CPU,
               options: str = "") -> tuple[int, object]:
        """(0, handle) or (error code, message)."""
        handle = ctypes.c_void_p()
        code = self.lib.byoc_json_engine_create(text, len(text), weights_pointer, weights_bytes, device,
                                                options.encode(), ctypes.byref(handle))
        if code != 0:
            return code, self.lib.byoc_json_engine_last_error().decode("utf-8", "replace")
        return 0, handle

    def run(self, handle, input_pointers, output_pointers, workspace_pointer, workspace_bytes, stream=None) -> None:
        inputs = (ctypes.c_void_p * max(1, len(input_pointers)))(*input_pointers)
        outputs = (ctypes.c_void_p * len(output_pointers))(*output_pointers)
        code = self.lib.byoc_json_engine_run(handle, inputs, outputs, workspace_pointer, workspace_bytes, stream)
        if code != 0:
            raise byoc.RuntimeError(self.lib.byoc_json_engine_last_error().decode())

    def workspace(self, handle) -> int:
        return self.lib.byoc_json_engine_workspace(handle)

    def describe(self, handle) -> str:
        return self.lib.byoc_json_engine_describe(handle).decode()

    def destroy(self, handle) -> None:
        self.lib.byoc_json_engine_destroy(handle)


@pytest.fixture(scope="session")
def engine_library(tmp_path_factory) -> EngineLibrary:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not available")
    return EngineLibrary(_build_cpu_library(str(tmp_path_factory.mktemp("json_engine_cpu"))))


# ============================================================== graphs and weights

def weights_blob(func: Function) -> tuple[np.ndarray, dict]:
    """Every Constant of `func` (nested functions included) packed into one uint8 array at
    256-byte aligned offsets, as the host codegen does; returns (blob, {id(c): offset})."""
    offsets: dict = {}
    chunks: list = []
    size = 0

    def place(constant: Constant):
        nonlocal size
        if id(constant) in offsets:
            return
        size = -(-size // WEIGHTS_ALIGNMENT) * WEIGHTS_ALIGNMENT
        offsets[id(constant)] = size
        data = np.ascontiguousarray(constant.data).view(np.uint8).reshape(-1)
        chunks.append((size, data))
        size += data.size

    def visit(function: Function):
        for binding in function.bindings:
            value = binding.value
            if isinstance(value, Function):
                visit(value)
            elif isinstance(value, Call):
                if isinstance(value.op, Function):
                    visit(value.op)
                for arg in value.args:
                    if isinstance(arg, Constant):
                        place(arg)

    visit(func)
    blob = np.zeros(max(size, 1), dtype=np.uint8)
    for offset, data in chunks:
        blob[offset:offset + data.size] = data
    return blob, offsets


def _weights(rng, shape, dtype, scale=None):
    scale = scale if scale is not None else 1.0 / np.sqrt(shape[0])
    return (rng.standard_normal(shape) * scale).astype(numpy_dtype(dtype))


def make_mlp(dtype="float32", batch=4, sizes=(32, 64, 48, 16), seed=0) -> Function:
    """matmul+bias+relu, matmul+bias+gelu (erf), matmul+bias."""
    rng = np.random.default_rng(seed)
    with FunctionBuilder("mlp") as fb:
        x = fb.param("x", (batch, sizes[0]), dtype)
        h = x
        activations = ["relu", "gelu", None]
        for layer, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
            h = fb.call("matmul", h, Constant(_weights(rng, (fan_in, fan_out), dtype)))
            h = fb.call("add", h, Constant(_weights(rng, (fan_out,), dtype, 0.1)))
            if activations[layer]:
                h = fb.call(activations[layer], h)
        return fb.ret(h)


def make_bert_ffn(dtype="float32", batch=2, seq=8, hidden=32, ffn=128, approximate="none", seed=1) -> Function:
    """BERT's feed-forward block: reshape, dense+bias+gelu, dense+bias, residual add, reshape."""
    rng = np.random.default_rng(seed)
    with FunctionBuilder("ffn") as fb:
        x = fb.param("x", (batch, seq, hidden), dtype)
        rows = fb.call("reshape", x, shape=(batch * seq, hidden))
        h = fb.call("matmul", rows, Constant(_weights(rng, (hidden, ffn), dtype)))
        h = fb.call("add", h, Constant(_weights(rng, (ffn,), dtype, 0.1)))
        h = fb.call("gelu", h, approximate=approximate)
        h = fb.call("matmul", h, Constant(_weights(rng, (ffn, hidden), dtype)))
        h = fb.call("add", Constant(_weights(rng, (1, hidden), dtype, 0.1)), h)  # bias first: still bias_add
        h = fb.call("add", h, rows)  # residual
        return fb.ret(fb.call("reshape", h, shape=(batch, seq, hidden)))


def make_attention_projection(dtype="float32", batch=2, seq=8, heads=4, head_dim=8, seed=2) -> Function:
    """q/k projections, head split (reshape + transpose), q @ k^T (batched), + mask (broadcast
    add); the value projection is a second output, also returned through a reshape."""
    rng = np.random.default_rng(seed)
    hidden = heads * head_dim
    with FunctionBuilder("attention") as fb:
        x = fb.param("x", (batch, seq, hidden), dtype)
        mask = fb.param("mask", (batch, 1, 1, seq), dtype)

        def project(name):
            h = fb.call("matmul", x, Constant(_weights(rng, (hidden, hidden), dtype)))
            h = fb.call("add", h, Constant(_weights(rng, (hidden,), dtype, 0.1)))
            return fb.call("reshape", h, shape=(batch, seq, heads, head_dim), name=name)

        q = fb.call("transpose", project("q"), axes=(0, 2, 1, 3))
        k = fb.call("transpose", project("k"), axes=(0, 2, 3, 1))
        scores = fb.call("add", fb.call("matmul", q, k), mask)
        v = project("v")
        v_heads = fb.call("transpose", v, axes=(0, 2, 1, 3))
        return fb.ret(scores, fb.call("reshape", v_heads, shape=(batch * heads, seq, head_dim)), v)


def _inputs_for(func: Function, rng) -> list:
    return [rng.standard_normal(p.type.shape).astype(numpy_dtype(p.type.dtype)) for p in func.params]


def run_cpu(library: EngineLibrary, func: Function, inputs: list, options: str = ""):
    """Serializes `func`, creates a CPU engine, runs it; returns (outputs, description)."""
    blob, offsets = weights_blob(func)
    text = serialize_function(func, offsets).encode()
    code, handle = library.create(text, blob.ctypes.data, blob.size, DEVICE_CPU, options)
    assert code == 0, handle
    try:
        results = func.result.fields if hasattr(func.result, "fields") else (func.result,)
        outputs = [np.empty(r.type.shape, dtype=numpy_dtype(r.type.dtype)) for r in results]
        workspace = np.empty(max(1, library.workspace(handle)), dtype=np.uint8)
        inputs = [np.ascontiguousarray(array) for array in inputs]
        library.run(handle, [a.ctypes.data for a in inputs], [o.ctypes.data for o in outputs],
                    workspace.ctypes.data, workspace.size)
        return outputs, library.describe(handle)
    finally:
        library.destroy(handle)


def _as_list(value):
    return list(value) if isinstance(value, tuple) else [value]


def _assert_close(actual, expected, tolerance):
    actual = np.asarray(actual, dtype=np.float32)
    expected = np.asarray(expected, dtype=np.float32)
    assert actual.shape == expected.shape
    error = np.max(np.abs(actual - expected) / (1 + np.abs(expected)))
    assert error <= tolerance, f"max relative error {error} > {tolerance}"


# ============================================================== serializer

def test_serialize_schema_and_determinism():
    func = make_bert_ffn()
    _, offsets = weights_blob(func)
    text = serialize_function(func, offsets)
    assert text == serialize_function(func, offsets)
    document = json.loads(text)
    assert document["format"] == "byoc-json-graph" and document["version"] == 1
    assert [n["kind"] for n in document["nodes"]] == [
        "reshape", "matmul", "bias_add", "gelu", "matmul", "bias_add", "add", "reshape"]
    assert [n["id"] for n in document["nodes"]] == list(range(8))
    assert document["nodes"][5]["inputs"] == ["node:4", "const:3"]  # bias moved second
    assert document["outputs"] == ["node:7"]
    assert [c["name"] for c in document["constants"]] == ["c0", "c1", "c2", "c3"]
    assert all(c["offset"] % WEIGHTS_ALIGNMENT == 0 for c in document["constants"])
    assert text == json.dumps(document, sort_keys=True, separators=(",", ":"))


def test_serialize_inlines_composite_functions():
    with FunctionBuilder("composite", attrs={"Composite": "cublaslt.matmul_bias"}) as inner:
        a = inner.param("a", (4, 8))
        w = inner.param("w", (8, 8))
        inner.ret(inner.call("relu", inner.call("matmul", a, w)))
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (4, 8))
        weight = Constant(np.eye(8, dtype=np.float32))
        y = fb.call(inner.func, x, weight, type_=inner.func.ret_type)
        func = fb.ret(fb.call("transpose", y))
    blob, offsets = weights_blob(func)
    document = json.loads(serialize_function(func, offsets))
    assert [n["kind"] for n in document["nodes"]] == ["matmul", "relu", "transpose"]
    assert document["nodes"][2]["attrs"] == {"perm": [1, 0]}


@pytest.mark.parametrize("case", ["softmax", "int32", "no_offset", "param_output", "partial_batch_broadcast"])
def test_serialize_refuses_what_the_engine_cannot_run(case):
    with FunctionBuilder("bad") as fb:
        dtype = "int32" if case == "int32" else "float32"
        x = fb.param("x", (4, 8), dtype)
        if case == "partial_batch_broadcast":
            fb.ret(fb.call("matmul", fb.call("reshape", x, shape=(2, 1, 2, 8)),
                           Constant(np.ones((1, 3, 8, 4), np.float32))))
        elif case == "softmax":
            fb.ret(fb.call("softmax", x, axis=-1))
        elif case == "param_output":
            fb.ret(x)
        else:
            fb.ret(fb.call("matmul", x, Constant(np.ones((8, 8), dtype=numpy_dtype(dtype)))))
    with pytest.raises(byoc.BuildError):
        serialize_function(fb.func, {} if case == "no_offset" else weights_blob(fb.func)[1])


# ============================================================== CPU engine vs interpreter

@pytest.mark.parametrize("make", [make_mlp, make_bert_ffn, make_attention_projection],
                         ids=["mlp", "bert_ffn", "attention"])
def test_cpu_engine_matches_interpreter(engine_library, make):
    func = make()
    rng = np.random.default_rng(7)
    inputs = _inputs_for(func, rng)
    outputs, description = run_cpu(engine_library, func, inputs)
    expected = _as_list(byoc.interpret(func, *inputs))
    for actual, reference in zip(outputs, expected, strict=True):
        _assert_close(actual, reference, 1e-3)


def test_cpu_engine_fuses_epilogues_and_plans_storage(engine_library):
    func = make_bert_ffn()
    rng = np.random.default_rng(3)
    _, description = run_cpu(engine_library, func, _inputs_for(func, rng))
    assert "matmul+bias+gelu fused=[1,2,3]" in description
    assert "matmul+bias+residual fused=[4,5,6]" in description
    # the final reshape is an output: its owner (the residual step) writes into it directly
    assert "step node:6 matmul+bias+residual fused=[4,5,6] reads=[node:3,const:2,const:3,node:0] -> output:0" \
        in description
    _, description = run_cpu(engine_library, make_mlp(), _inputs_for(make_mlp(), rng))
    assert "matmul+bias+relu" in description and "matmul+bias+gelu" in description


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cpu_engine_16_bit(engine_library, dtype):
    for make in (make_mlp, make_bert_ffn, make_attention_projection):
        func = make(dtype=dtype)
        rng = np.random.default_rng(11)
        inputs = _inputs_for(func, rng)
        outputs, _ = run_cpu(engine_library, func, inputs)
        # The engine rounds once per fused step, the interpreter once per op.
        for actual, reference in zip(outputs, _as_list(byoc.interpret(func, *inputs)), strict=True):
            _assert_close(actual, reference, 5e-2 if dtype == "bfloat16" else 5e-3)


def test_cpu_engine_output_aliases_and_copies(engine_library):
    with FunctionBuilder("outputs") as fb:
        x = fb.param("x", (3, 4))
        y = fb.call("relu", x)
        flat = fb.call("reshape", y, shape=(12,))
        # y twice (the second is copied), a reshape of y (an alias of the same bytes), and
        # a reshape of an input (copied: an input's bytes are not the engine's to hand out)
        func = fb.ret(y, flat, y, fb.call("gelu", flat), fb.call("reshape", x, shape=(2, 6)))
    rng = np.random.default_rng(5)
    inputs = _inputs_for(func, rng)
    outputs, description = run_cpu(engine_library, func, inputs)
    for actual, reference in zip(outputs, byoc.interpret(func, *inputs), strict=True):
        _assert_close(actual, reference, 1e-6)
    assert "copy node:" in description


def test_cpu_engine_run_checks_workspace(engine_library):
    func = make_mlp()
    blob, offsets = weights_blob(func)
    code, handle = engine_library.create(serialize_function(func, offsets).encode(), blob.ctypes.data, blob.size)
    assert code == 0
    try:
        x = np.zeros((4, 32), np.float32)
        out = np.zeros((4, 16), np.float32)
        with pytest.raises(byoc.RuntimeError, match="workspace"):
            engine_library.run(handle, [x.ctypes.data], [out.ctypes.data], None, 0)
    finally:
        engine_library.destroy(handle)


@pytest.mark.parametrize("inputs, outputs, message", [
    ([4 * 32 * 4], [4 * 16 * 4], None),  # the graph's own interface
    ([4 * 32 * 4 // 2], [4 * 16 * 4], r"the graph's input 0 \('x'\) is 512 bytes; the caller passes 256"),
    ([4 * 32 * 4], [4 * 16 * 4 * 2], "the graph's output 0 is 256 bytes; the caller passes 512"),
    ([4 * 32 * 4, 64], [4 * 16 * 4], "the graph has 1 inputs and 1 outputs; the caller passes 2 and 1"),
    ([], [4 * 16 * 4], "the graph has 1 inputs and 1 outputs; the caller passes 0 and 1"),
])
def test_the_engine_checks_its_graph_against_the_callers_interface(engine_library, inputs, outputs, message):
    """A graph whose tensors differ from the buffers the host passes (a library edited after
    its build, its checksum forged too) is refused at create by the wrapper, naming the
    tensor, before a run could read or write past a buffer."""
    func = make_mlp()
    blob, offsets = weights_blob(func)
    code, handle = engine_library.create(serialize_function(func, offsets).encode(), blob.ctypes.data, blob.size)
    assert code == 0
    lib = engine_library.lib
    lib.byoc_json_engine_check_interface.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                                     ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    try:
        code = lib.byoc_json_engine_check_interface(handle, len(inputs), (ctypes.c_size_t * max(1, len(inputs)))(*inputs),
                                                    len(outputs), (ctypes.c_size_t * len(outputs))(*outputs))
        if message is None:
            assert code == 0, lib.byoc_json_engine_last_error()
        else:
            assert code == 3  # BYOC_JSON_ERROR_SCHEMA
            assert re.search(message, lib.byoc_json_engine_last_error().decode()), lib.byoc_json_engine_last_error()
    finally:
        engine_library.destroy(handle)


@pytest.mark.parametrize("options, message", [
    ("timed_selection=2", "timed_selection"), ("candidates=0", "candidates"), ("bogus=1", "unknown option"),
    ("workspace_limit", "key=value"), ("workspace_limit=-1", "workspace_limit"), ("tf32=2", "tf32=2: expected 0 or 1")])
def test_create_rejects_bad_options(engine_library, options, message):
    func = make_mlp()
    blob, offsets = weights_blob(func)
    code, error = engine_library.create(serialize_function(func, offsets).encode(), blob.ctypes.data, blob.size,
                                        DEVICE_CPU, options)
    assert code == 1 and message in error


def test_tf32_is_an_option_the_cpu_engine_takes(engine_library):
    """tf32=1 is for a GPU's float32 matmuls; the cpu engine takes it (and computes as ever)."""
    func = make_mlp()
    blob, offsets = weights_blob(func)
    code, handle = engine_library.create(serialize_function(func, offsets).encode(), blob.ctypes.data, blob.size,
                                         DEVICE_CPU, "tf32=1;workspace_limit=0")
    assert code == 0, handle
    engine_library.destroy(handle)


def test_cpu_only_build_refuses_cuda(engine_library):
    func = make_mlp()
    blob, offsets = weights_blob(func)
    code, error = engine_library.create(serialize_function(func, offsets).encode(), blob.ctypes.data, blob.size,
                                        DEVICE_CUDA)
    assert code == 4 and "without CUDA" in error


# ============================================================== fuzzing create()

def _dump(value, duplicate_path=None, path=()) -> str:
    """Compact JSON like serialize_function; the object at `duplicate_path` gets its first
    key written twice."""
    if isinstance(value, dict):
        items = [f"{json.dumps(k)}:{_dump(v, duplicate_path, path + (k,))}" for k, v in sorted(value.items())]
        if path == duplicate_path and items:
            items.append(items[0])
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v, duplicate_path, path + (i,)) for i, v in enumerate(value)) + "]"
    return json.dumps(value)


def _paths(value, path=()):
    """Every (path, value) of a JSON document, the root excluded."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + (key,), item
            yield from _paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield path + (index,), item
            yield from _paths(item, path + (index,))


def _replaced(document, path, new_value):
    copy = json.loads(json.dumps(document))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new_value
    return copy


# Values of another JSON type than the field's: every field of the schema has one type.
_WRONG_TYPES = {
    str: [None, True, 1, 1.5, [], {}],
    int: [None, True, "1", 1.5, [], {}, -1, 10**18],
    list: [None, True, 1, "x", {}],
    dict: [None, True, 1, "x", []],
}


def fuzz_cases(documents: list, weights_bytes: int, rng: random.Random) -> tuple[list, list]:
    """(cases that must fail, cases that only must not crash), each a list of (label, bytes)."""
    must_fail: list = []
    may_pass: list = []

    def add(label, text):
        must_fail.append((label, text if isinstance(text, bytes) else text.encode()))

    for number, document in enumerate(documents):
        text = _dump(document).encode()
        # truncation: every cut of the first document, a sample of the others
        cuts = range(len(text)) if number == 0 else rng.sample(range(len(text)), 100)
        for cut in cuts:
            add(f"truncate@{cut}", text[:cut])
        # bytes that are invalid wherever they stand (0xFF is never UTF-8, control chars
        # are invalid in strings and outside them)
        for _ in range(150):
            position = rng.randrange(len(text))
            add(f"byte@{position}", text[:position] + bytes([rng.choice([0x00, 0x01, 0x1F, 0xFF, 0xC0, 0x80])])
                + text[position + 1:])
        # wrong types for every field
        for path, value in _paths(document):
            for wrong in _WRONG_TYPES.get(type(value), []):
                if isinstance(value, int) and path[-1] == "version" and wrong == 1:
                    continue
                add(f"type{path}={wrong!r}", _dump(_replaced(document, path, wrong)))
        # duplicate keys in every object
        for path, value in [((), document)] + list(_paths(document)):
            if isinstance(value, dict) and value:
                add(f"duplicate{path}", _dump(document, duplicate_path=path))
        for index in range(len(document["nodes"])):
            node = ("nodes", index)
            for kind in ["conv2d", "MATMUL", "", "matmul ", "softmax", "gelu_erf"]:
                add(f"kind{index}={kind}", _dump(_replaced(document, node + ("kind",), kind)))
            for ref in [f"node:{index}", f"node:{index + 1}", "node:99999", "input:99", "const:99", "node:-1",
                        "node:01", "nodes:0", "node:", "node:0x1", "input", "node:1e1", "node:4294967296"]:
                add(f"ref{index}={ref}", _dump(_replaced(document, node + ("inputs", 0), ref)))
            shape = document["nodes"][index]["shape"]
            for dim in [10**18, 2**62, 2**31, -1, 0, -(10**18), 10**30]:
                add(f"dim{index}={dim}", _dump(_replaced(document, node + ("shape", 0), dim)))
            add(f"shape{index}+1", _dump(_replaced(document, node + ("shape", len(shape) - 1), shape[-1] + 1)))
            add(f"rank9_{index}", _dump(_replaced(document, node + ("shape",), [1] * 9)))
            add(f"attrs{index}", _dump(_replaced(document, node + ("attrs",), {"perm": [0, 0]})))
            add(f"id{index}", _dump(_replaced(document, node + ("id",), index + 1)))
            add(f"dtype{index}", _dump(_replaced(document, node + ("dtype",), "float64")))
        # cycles: node i reads a later node that reads node i
        nodes = document["nodes"]
        for index in range(len(nodes) - 1):
            cyclic = _replaced(document, ("nodes", index, "inputs", 0), f"node:{index + 1}")
            cyclic["nodes"][index + 1]["inputs"][0] = f"node:{index}"
            add(f"cycle{index}", _dump(cyclic))
        for version in [0, 2, -1, "1", 1.0, None, 10**20]:
            add(f"version={version!r}", _dump(_replaced(document, ("version",), version)).replace("1e+20", "1e20"))
        for index, constant in enumerate(document["constants"]):
            path = ("constants", index)
            for offset in [weights_bytes, weights_bytes - 1, 1, 2**63 - 1, weights_bytes + 256]:
                add(f"offset{index}={offset}", _dump(_replaced(document, path + ("offset",), offset)))
            for dim in [10**18, 2**40, 0, -5]:
                add(f"const_dim{index}={dim}", _dump(_replaced(document, path + ("shape", 0), dim)))
        for index in range(len(document["inputs"])):
            for name in [b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf5\x80\x80\x80", b"\x80", b"a\x01b",
                         b"\xf4\x90\x80\x80", b"\xe0\x80\x80"]:
                marker = "@@NAME@@"
                raw = _dump(_replaced(document, ("inputs", index, "name"), marker)).encode()
                add(f"utf8_{index}={name!r}", raw.replace(marker.encode(), name))
            for escaped in ["\\ud800", "\\udc00", "\\ud800\\u0041", "\\u0000", "\\x41", "\\u12"]:
                raw = _dump(_replaced(document, ("inputs", index, "name"), "@@NAME@@"))
                add(f"escape_{index}={escaped}", raw.replace("@@NAME@@", escaped))
            add(f"duplicate_input_{index}", _dump(_replaced(document, ("inputs",),
                                                            document["inputs"] + [document["inputs"][index]])))
        for key in list(document):
            without = {k: v for k, v in document.items() if k != key}
            add(f"missing_{key}", _dump(without))
        add("unknown_key", _dump({**document, "extra": 1}))
        add("no_outputs", _dump({**document, "outputs": []}))
        add("no_nodes", _dump({**document, "nodes": [], "outputs": []}))
        add("output_input", _dump({**document, "outputs": ["input:0"]}))
        add("trailing_garbage", text + b"x")
        add("trailing_comma", text[:-1] + b",}")
        add("comment", b"/*c*/" + text)
        add("bom", b"\xef\xbb\xbf" + text)
        add("single_quotes", text.replace(b'"', b"'"))
        add("leading_zero", text.replace(b'"version":1', b'"version":01'))
        add("nan", text.replace(b'"version":1', b'"version":NaN'))
        # random bit flips may keep the document valid: they only must not crash
        for _ in range(300):
            position = rng.randrange(len(text))
            flipped = bytes([text[position] ^ (1 << rng.randrange(8))])
            may_pass.append((f"bitflip@{position}", text[:position] + flipped + text[position + 1:]))

    add("empty", b"")
    add("whitespace", b"  \n\t ")
    add("null", b"null")
    add("array", b"[]")
    add("deep_arrays", b"[" * 100000)
    add("deep_arrays_closed", b"[" * 5000 + b"]" * 5000)
    add("deep_objects", b'{"a":' * 5000 + b"1" + b"}" * 5000)
    deep_attrs = _dump(_replaced(documents[0], ("nodes", 0, "attrs"), {"perm": "@@DEEP@@"}))
    add("deep_in_attrs", deep_attrs.replace('"@@DEEP@@"', "[" * 40 + "]" * 40))
    add("huge_string", b'{"format":"' + b"a" * 100000 + b'"}')
    add("huge_number", b'{"format":1' + b"0" * 1000 + b"}")
    add("float_overflow", b'{"version":1e999}')
    add("many_values", b"[" + b"0," * 2_000_000 + b"0]")
    return must_fail, may_pass


FUZZ_RUNNER = textwrap.dedent("""
    # Runs create() on every case of a cases file; one line of results per case, flushed,
    # so that a crash shows which case it was.
    import ctypes, struct, sys
    library, cases_path, results_path, weights_bytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    lib = ctypes.CDLL(library)
    lib.byoc_json_engine_create.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.byoc_json_engine_last_error.restype = ctypes.c_char_p
    lib.byoc_json_engine_destroy.argtypes = [ctypes.c_void_p]
    weights = ctypes.create_string_buffer(weights_bytes)
    with open(cases_path, "rb") as cases, open(results_path, "w") as results:
        while True:
            header = cases.read(8)
            if not header:
                break
            text = cases.read(struct.unpack("<Q", header)[0])
            handle = ctypes.c_void_p()
            code = lib.byoc_json_engine_create(text, len(text), weights, weights_bytes, 1, b"", ctypes.byref(handle))
            message = lib.byoc_json_engine_last_error().decode("utf-8", "replace") if code else ""
            if code == 0:
                lib.byoc_json_engine_destroy(handle)
            results.write(f"{code}\\t{len(message)}\\t{message[:200]!r}\\n")
            results.flush()
""")


def test_fuzz_create_never_crashes(engine_library, tmp_path):
    documents, weights_bytes = [], 0
    for func in (make_mlp(), make_bert_ffn(), make_attention_projection()):
        blob, offsets = weights_blob(func)
        documents.append(json.loads(serialize_function(func, offsets)))
        weights_bytes = max(weights_bytes, blob.size)
    # The documents must be valid before mutation, with this weights size.
    weights = np.zeros(weights_bytes, np.uint8)
    for document in documents:
        code, handle = engine_library.create(_dump(document).encode(), weights.ctypes.data, weights_bytes)
        assert code == 0, handle
        engine_library.destroy(handle)

    must_fail, may_pass = fuzz_cases(documents, weights_bytes, random.Random(1234))
    assert len(must_fail) >= 1000
    cases = must_fail + may_pass
    cases_path, results_path = tmp_path / "cases.bin", tmp_path / "results.txt"
    with open(cases_path, "wb") as out:
        for _, text in cases:
            out.write(len(text).to_bytes(8, "little") + text)
    runner = tmp_path / "fuzz_runner.py"
    runner.write_text(FUZZ_RUNNER)
    try:
        process = subprocess.run([sys.executable, str(runner), engine_library.path, str(cases_path),
                                  str(results_path), str(weights_bytes)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        done = len(results_path.read_text().splitlines()) if results_path.exists() else 0
        pytest.fail(f"create() hung: case {done} ({cases[done][0]}) did not finish")
    results = results_path.read_text().splitlines() if results_path.exists() else []
    if process.returncode != 0:
        crashed = cases[len(results)][0] if len(results) < len(cases) else "?"
        pytest.fail(f"the fuzz runner died (exit {process.returncode}) at case {len(results)} ({crashed}): "
                    f"{process.stderr[-2000:]}")
    assert len(results) == len(cases)
    accepted = []
    for (label, _), line in zip(must_fail, results):
        code, length, _ = line.split("\t", 2)
        if code == "0" or length == "0":
            accepted.append(label)
    assert not accepted, f"{len(accepted)} malformed graphs were accepted or gave no message: {accepted[:20]}"
    codes = {line.split("\t")[0] for line in results[:len(must_fail)]}
    assert codes <= {"2", "3"}, codes  # parse or schema errors only
    print(f"fuzz: {len(must_fail)} malformed graphs refused, {len(may_pass)} bit flips survived")


def test_fuzz_error_messages_name_the_fault(engine_library):
    func = make_mlp()
    blob, offsets = weights_blob(func)
    document = json.loads(serialize_function(func, offsets))
    checks = [
        (_replaced(document, ("version",), 2), "version"),
        (_replaced(document, ("nodes", 0, "kind"), "conv2d"), 'unknown node kind "conv2d"'),
        (_replaced(document, ("nodes", 1, "inputs", 0), "node:1"), "not an earlier node"),
        (_replaced(document, ("nodes", 0, "shape", 0), 10**18), "larger than the limit"),
        (_replaced(document, ("constants", 0, "offset"), blob.size), "outside the weights blob"),
        (_replaced(document, ("nodes", 0, "shape", 1), 63), "declared shape [4,63] but the inputs give [4,64]"),
    ]
    for mutated, message in checks:
        code, error = engine_library.create(_dump(mutated).encode(), blob.ctypes.data, blob.size)
        assert code != 0 and message in error, error
    code, error = engine_library.create(b'{"a":1,"a":2}', None, 0)
    assert code == 2 and "duplicate key" in error


# ============================================================== CUDA: compile (CI) and run (GPU)

@pytest.mark.nvcc
def test_cuda_engine_compiles_for_sm90(tmp_path):
    if find_nvcc() is None or find_cublaslt() is None:
        pytest.skip("nvcc or cuBLASLt headers are not available")
    library = _build_cuda_library(str(tmp_path))
    readelf = shutil.which("readelf")
    if readelf:
        needed = subprocess.run([readelf, "-d", library], capture_output=True, text=True).stdout
        assert "libcublasLt" in needed and "libcudart" in needed


def _gpu_available() -> bool:
    return gpu_present()  # the driver's answer (tests/gpu_probe.py)


@pytest.fixture(scope="module")
def cuda_engine_library(tmp_path_factory):
    if not _gpu_available():
        pytest.skip("needs cupy and a visible NVIDIA GPU")
    return EngineLibrary(_build_cuda_library(str(tmp_path_factory.mktemp("json_engine_cuda"))))


def run_cuda(library: EngineLibrary, func: Function, inputs: list, options: str = ""):
    import cupy
    blob, offsets = weights_blob(func)
    device_blob = cupy.asarray(blob)
    text = serialize_function(func, offsets).encode()
    code, handle = library.create(text, device_blob.data.ptr, blob.size, DEVICE_CUDA, options)
    assert code == 0, handle
    try:
        results = func.result.fields if hasattr(func.result, "fields") else (func.result,)
        device_inputs = [cupy.asarray(a) for a in inputs]
        outputs = [cupy.empty(r.type.shape, dtype=numpy_dtype(r.type.dtype)) for r in results]
        workspace = cupy.empty(max(256, library.workspace(handle)), dtype=cupy.uint8)
        stream = cupy.cuda.get_current_stream()
        library.run(handle, [a.data.ptr for a in device_inputs], [o.data.ptr for o in outputs],
                    workspace.data.ptr, workspace.size, stream.ptr or None)
        stream.synchronize()
        return [cupy.asnumpy(o) for o in outputs], library.describe(handle)
    finally:
        library.destroy(handle)


def _bert_base_ffn(dtype):
    return make_bert_ffn(dtype=dtype, batch=8, seq=128, hidden=768, ffn=3072, seed=21)


def _bert_base_attention(dtype):
    return make_attention_projection(dtype=dtype, batch=8, seq=128, heads=12, head_dim=64, seed=22)


@pytest.mark.gpu
@pytest.mark.parametrize("options", ["", "timed_selection=1;candidates=8"], ids=["heuristic", "timed"])
@pytest.mark.parametrize("make", [_bert_base_ffn, _bert_base_attention], ids=["ffn", "attention"])
def test_cuda_engine_bert_base_fp16(cuda_engine_library, make, options):
    half = make("float16")
    rng = np.random.default_rng(31)
    inputs = [a.astype(np.float16) for a in _inputs_for(half, rng)]
    outputs, description = run_cuda(cuda_engine_library, half, inputs, options)
    # Reference: the same graph in float32 on the fp16 values (weights and inputs).
    single = _cast_function(half, "float32")
    expected = _as_list(byoc.interpret(single, *[a.astype(np.float32) for a in inputs]))
    for actual, reference in zip(outputs, expected, strict=True):
        _assert_close(actual, reference, 1e-2)
    create_ms = [line for line in description.splitlines() if line.startswith("create_ms=")]
    print(f"\n{make.__name__} [{options or 'heuristic'}] Init {create_ms[0]}\n{description}")


@pytest.mark.gpu
def test_cuda_engine_matches_cpu_engine_fp32(cuda_engine_library, engine_library):
    for make in (make_mlp, make_bert_ffn, make_attention_projection):
        func = make()
        inputs = _inputs_for(func, np.random.default_rng(41))
        cuda_outputs, _ = run_cuda(cuda_engine_library, func, inputs)
        for actual, reference in zip(cuda_outputs, _as_list(byoc.interpret(func, *inputs)), strict=True):
            _assert_close(actual, reference, 1e-3)


def _cast_function(func: Function, dtype: str) -> Function:
    """`func` with its parameters and constants in `dtype` (ops keep their attributes)."""
    from byoc.ir.expr import Binding, Tuple, Var
    mapping: dict = {}
    params = []
    for param in func.params:
        new = Var(param.name_hint, type(param.type)(param.type.shape, dtype))
        mapping[param] = new
        params.append(new)

    def atom(expr):
        if isinstance(expr, Constant):
            return Constant(expr.data.astype(numpy_dtype(dtype)))
        return mapping[expr]

    bindings = []
    for binding in func.bindings:
        call = binding.value
        new_call = Call(call.op, [atom(a) for a in call.args], call.attrs)
        var = Var(binding.var.name_hint, new_call.type)
        mapping[binding.var] = var
        bindings.append(Binding(var, new_call))
    result = func.result
    new_result = Tuple([mapping[f] for f in result.fields]) if isinstance(result, Tuple) else mapping[result]
    return Function(params, bindings, new_result)
