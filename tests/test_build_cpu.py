"""Whole models built into a .so for the cpu target, run from a fresh process after the
build directory is gone, against onnxruntime; run-time input checks; hostile names."""
import json
import os
import re
import struct
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import byoc
from byoc.runtime import load
from robustness.libraries import expand_model

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_inputs(name):
    data = np.load(FIXTURES / f"{name}.npz")
    inputs = {key[3:]: data[key] for key in data if key.startswith("in_")}
    outputs = {key[4:]: data[key] for key in data if key.startswith("out_")}
    return inputs, outputs


@pytest.fixture(scope="module")
def built_models(tmp_path_factory):
    """mlp, bert2 and resnet_small built for cpu and exported; the build dirs deleted."""
    root = tmp_path_factory.mktemp("models")
    exported = {}
    for name in ("mlp", "bert2", "resnet_small"):
        inputs, _ = fixture_inputs(name)
        workdir = root / f"build_{name}"
        library = byoc.build(FIXTURES / f"{name}.onnx", config="cpu", workdir=str(workdir),
                             input_shapes={k: v.shape for k, v in inputs.items()})
        assert (workdir / "build.ninja").exists() and (workdir / "partition_report.json").exists()
        exported[name] = library.export_library(root / "deploy" / f"{name}.so")
        shutil.rmtree(workdir)
    return exported


FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import numpy as np
    from byoc.runtime import load
    path, inputs_path, outputs_path = sys.argv[1:4]
    module = load(path)
    data = np.load(inputs_path)
    inputs = {key[3:]: data[key] for key in data if key.startswith("in_")}
    results = module.run(**inputs)
    results = results if isinstance(results, tuple) else (results,)
    np.savez(outputs_path, **{name: r for name, r in zip(module.output_names, results)})
""")


@pytest.mark.parametrize("name", ["mlp", "bert2", "resnet_small"])
def test_model_runs_in_fresh_process_and_matches_onnxruntime(built_models, name, tmp_path):
    results_path = tmp_path / "results.npz"
    # Run from another directory so nothing relative to the build or the repo is found.
    subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(built_models[name]), str(FIXTURES / f"{name}.npz"),
                    str(results_path)], check=True, cwd=tmp_path, capture_output=True, text=True)
    _, expected = fixture_inputs(name)
    results = np.load(results_path)
    assert set(results.files) == set(expected)
    for key, want in expected.items():
        got = results[key]
        assert got.shape == want.shape
        assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want)), key


@pytest.mark.parametrize("name", ["mlp", "bert2", "resnet_small"])
def test_later_runs_on_new_inputs_match_onnxruntime_and_the_first_inputs_again_give_the_first_answer(
        built_models, name):
    """A run must not depend on what an earlier one left (arena, workspace, a backend's
    state): every run on new inputs is checked, then the first inputs again. ResNet-50 with
    cuDNN's float32 convs on an H200 was right on run 1 only
    (bench/results/resnet50_default_later_runs_h200.md); this is the same check on the cpu."""
    import onnxruntime as ort
    inputs, _ = fixture_inputs(name)
    session = ort.InferenceSession(str(FIXTURES / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    module = load(built_models[name])
    rng = np.random.default_rng(1)
    runs = [inputs] + [{key: (value * rng.uniform(0.5, 1.5, value.shape)).astype(value.dtype)
                         if value.dtype.kind == "f" else value for key, value in inputs.items()} for _ in range(3)]
    first = None
    for index, feeds in enumerate(runs + [inputs]):
        results = module.run(**feeds)
        results = results if isinstance(results, tuple) else (results,)
        for got, want in zip(results, session.run(None, feeds), strict=True):
            assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want)), (name, index)
        if index == 0:
            first = [np.array(r) for r in results]
    for got, want in zip(results, first):
        np.testing.assert_array_equal(got, want)  # the first inputs again: the same answer, bit for bit


def test_library_depends_only_on_c_runtime(built_models):
    dynamic = subprocess.run(["readelf", "-d", str(built_models["bert2"])], capture_output=True, text=True).stdout
    needed = [line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line]
    allowed = ("libstdc++", "libm.", "libgcc_s", "libc.", "ld-linux")
    assert needed and all(n.startswith(allowed) for n in needed), needed


def test_a_section_past_the_end_of_the_file_is_named_before_the_loader_maps_it(tmp_path):
    """load() reads the library's section headers (all of them: a segment's size once hid
    them) and names a section whose bytes lie past the end of the file."""
    from byoc.runtime.library_file import _ElfLayout
    library = byoc.build(_tiny("relu"), config="cpu", workdir=str(tmp_path / "w"))
    with open(library.path, "rb") as file:
        layout = _ElfLayout(file)
    shoff, shnum, _ = layout.section_headers
    assert shnum > 10 and len(layout.sections) >= shnum - 2  # NULL is one; .bss takes no bytes
    index, _, _ = layout.sections[-1]
    data = bytearray(library.path.read_bytes())
    struct.pack_into("<Q", data, shoff + index * 64 + 32, len(data))  # sh_size: the whole file
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(bytes(data))
    with pytest.raises(byoc.RuntimeError, match=f"section {index} needs bytes .* beyond its {len(data)}"):
        load(damaged)


def test_needed_libraries_are_read_from_the_dynamic_section(built_models):
    """What load() preloads is read from the library's own DT_NEEDED entries (readelf's
    list); a library that needs an NVIDIA library found nowhere is refused naming it and
    the package that provides it."""
    from byoc.runtime import shared_libraries
    path = str(built_models["mlp"])
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    listed = [line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert shared_libraries.needed_libraries(path) == listed and listed
    with pytest.raises(byoc.RuntimeError, match=r"it needs libcublasLt\.so\.999, which is not on this machine's "
                                                r"library path.*install nvidia-cublas"):
        shared_libraries._preload("libcublasLt.so.999", "nvidia-cublas", path)


def test_metadata_and_exports(built_models):
    module = load(built_models["bert2"])
    metadata = module.metadata
    assert [t["name"] for t in metadata["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [t["name"] for t in metadata["outputs"]] == ["last_hidden_state", "pooler_output"]
    assert metadata["backends"] == ["builtin"] and metadata["weights"]["location"] == "embedded"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(built_models["bert2"])],
                             capture_output=True, text=True).stdout
    exported = sorted(line.split()[-1] for line in symbols.splitlines() if " T " in line)
    assert exported == ["byoc_last_error", "byoc_model_arch", "byoc_model_create", "byoc_model_create_on_device",
                        "byoc_model_destroy", "byoc_model_metadata", "byoc_model_run", "byoc_model_status"]


def test_bad_inputs_are_named_and_the_module_keeps_working(built_models):
    module = load(built_models["mlp"])
    inputs, expected = fixture_inputs("mlp")
    x = inputs["x"]
    cases = [
        ({"x": x[:, :32].copy()}, r"input 'x' \(#0\): expected shape \(4, 64\), got \(4, 32\)"),
        ({"x": x.astype(np.float64)}, r"input 'x' \(#0\): expected dtype float32, got float64"),
        ({"x": x, "y": x}, r"unknown input 'y'; the model's inputs are \['x'\]"),
        ({}, r"missing input\(s\) \['x'\]"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(byoc.RuntimeError, match=pattern):
            module.run(**kwargs)
    got = module.run(x=x)
    want = next(iter(expected.values()))
    assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want))
    # a column-major input is copied once into a row-major one (as onnxruntime takes it)
    np.testing.assert_array_equal(module.run(x=np.asfortranarray(x)), got)


HOSTILE = ['x"; system("rm -rf /"); //', "line\nbreak", "*/ #define int float /*", "#include <evil>",
           "ünïcødé名前", "a\\\"b", "??=trigraph"]


def test_hostile_names_cannot_alter_generated_code(tmp_path):
    inputs = [helper.make_tensor_value_info(HOSTILE[0], TensorProto.FLOAT, [2, 3])]
    nodes = [helper.make_node("Relu", [HOSTILE[0]], [HOSTILE[1]], name=HOSTILE[2]),
             helper.make_node("Exp", [HOSTILE[1]], [HOSTILE[4]], name=HOSTILE[3]),
             helper.make_node("Neg", [HOSTILE[4]], [HOSTILE[5]], name=HOSTILE[6])]
    outputs = [helper.make_tensor_value_info(HOSTILE[5], TensorProto.FLOAT, [2, 3])]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    library = byoc.build(model, config="cpu", workdir=str(tmp_path / "w"))
    generated = "".join(p.read_text(errors="replace") for p in (tmp_path / "w").glob("*.c*"))
    for name in HOSTILE:
        assert name not in generated
    module = library.load()
    assert module.input_names == [HOSTILE[0]] and module.output_names == [HOSTILE[5]]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(module.run(x), -np.exp(np.maximum(x, 0)), rtol=1e-6)
    with pytest.raises(byoc.RuntimeError) as info:
        module.run(np.zeros((3, 3), np.float32))
    assert HOSTILE[0] in str(info.value)  # the message still names the input as the model does


def test_sidecar_weights(tmp_path):
    inputs, expected = fixture_inputs("mlp")
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "w"), params="sidecar")
    deployed = library.export_library(tmp_path / "deploy" / "mlp.so")
    assert deployed.with_suffix(".safetensors").exists()
    sidecar_bytes = deployed.with_suffix(".safetensors").read_bytes()
    # a rebuild into the same workdir (another model: other weights) leaves the export as it was
    byoc.build(_tiny("relu"), config="cpu", workdir=str(tmp_path / "w"), params="sidecar")
    assert deployed.with_suffix(".safetensors").read_bytes() == sidecar_bytes
    embedded = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "e"))
    weights_bytes = library.metadata["weights"]["bytes"]
    assert weights_bytes > 300_000 and library.metadata["weights"]["location"] == "sidecar"
    assert deployed.stat().st_size < embedded.path.stat().st_size - 0.9 * weights_bytes
    got = load(deployed).run(**inputs)
    want = next(iter(expected.values()))
    assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want))


def test_rebuild_of_unchanged_model_hits_the_cache(tmp_path):
    inputs, _ = fixture_inputs("mlp")
    byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "first"))
    byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "second"))
    # every object comes from the cache: only the link runs (no assertion on time itself)
    log = (tmp_path / "second" / "build.ninja").read_text()
    assert "desc = compile" in log and not (tmp_path / "second" / ".ninja_log").exists()


@pytest.mark.parametrize("name", ["mlp", "bert2"])
def test_json_runtime_backend_on_cpu_matches_onnxruntime(name, tmp_path):
    inputs, expected = fixture_inputs(name)
    library = byoc.build(FIXTURES / f"{name}.onnx", config={"target": "cpu", "backends": ["cublaslt"]},
                         workdir=str(tmp_path / "w"), input_shapes={k: v.shape for k, v in inputs.items()})
    assert "cublaslt" in library.metadata["backends"]
    report = library.report.to_json()["backends"]["cublaslt"]
    assert report["partitions"] >= 1 and report["ops_covered"]["matmul"] >= 3
    results = library.load().run(**inputs)
    results = results if isinstance(results, tuple) else (results,)
    for got, want in zip(results, expected.values(), strict=True):
        assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want))


def test_json_engine_state_belongs_to_each_instance(tmp_path):
    """Two Modules of one .so with a JSON-runtime partition each own an engine: closing one
    leaves the other running (the engine was one file-static object per partition)."""
    inputs, expected = fixture_inputs("mlp")
    library = byoc.build(FIXTURES / "mlp.onnx", config={"target": "cpu", "backends": ["cublaslt", "builtin"]},
                         workdir=str(tmp_path / "w"))
    first, second = library.load(), byoc.load(library.path)
    want = list(expected.values())[0]
    for module in (first, second):
        assert np.max(np.abs(module.run(**inputs) - want)) <= 1e-3 * np.max(np.abs(want))
    first.close()
    assert np.max(np.abs(second.run(**inputs) - want)) <= 1e-3 * np.max(np.abs(want))
    third = byoc.load(library.path)
    second.close()
    assert np.max(np.abs(third.run(**inputs) - want)) <= 1e-3 * np.max(np.abs(want))


def _checksum_of_whole_words(data: bytes) -> int:
    """blob_checksum written out word by word, as byoc_blob_checksum in the runtime is."""
    mask = (1 << 64) - 1
    golden = 0x9E3779B97F4A7C15

    def mix(x):
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)
    padded = data + b"\0" * (-len(data) % 8)
    total = sum(mix(int.from_bytes(padded[i:i + 8], "little") ^ ((i // 8 * golden) & mask))
                for i in range(0, len(padded), 8)) & mask
    return mix(total ^ ((len(data) * golden) & mask))


@pytest.mark.parametrize("sizes", [[3], [8, 1], [13, 7, 1000, 5], [300, (33 << 20) + 5, 9]])
def test_the_weights_blob_is_summed_and_written_piece_by_piece_as_the_bytes_it_stands_for(sizes):
    """The weights blob keeps each constant where it is (pieces at 256-byte offsets, zeros
    between): its checksum and the bytes it writes are those of the assembled blob, which
    the runtime checks at create."""
    import io
    from byoc.codegen.host import blob_checksum
    from byoc.codegen.host_plan import WeightsBlob
    from byoc.ir.expr import Constant
    rng = np.random.default_rng(len(sizes))
    blob = WeightsBlob()
    constants = [Constant(rng.integers(0, 256, n, dtype=np.uint8), "uint8") for n in sizes]  # alive: placed by id
    offsets = [blob.place(constant) for constant in constants]
    assert all(offset % 256 == 0 for offset in offsets) and len(blob) == offsets[-1] + sizes[-1]
    written = io.BytesIO()
    blob.write_to(written)
    whole = written.getvalue()
    assert len(whole) == len(blob) and whole == bytes(blob)
    for (offset, piece), n in zip(blob.pieces, sizes):
        assert whole[offset:offset + n] == piece.tobytes()
    assert blob_checksum(blob) == blob_checksum(whole)
    if len(whole) < 1 << 20:  # the word-by-word sum is slow in Python
        assert blob_checksum(whole) == _checksum_of_whole_words(whole)


def test_a_shared_weights_blob_places_equal_constants_once_and_takes_empty_ones():
    """Shape buckets share one blob that places a constant equal to an earlier one (dtype,
    shape, bytes) at that one's offset; an empty constant of several dims places too."""
    from byoc.codegen.host_plan import WeightsBlob
    from byoc.ir.expr import Constant
    blob = WeightsBlob(share_equal=True)
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    constants = [Constant(values, "float32"), Constant(values.copy(), "float32"),
                 Constant(values.reshape(4, 3).copy(), "float32"), Constant(np.zeros((0, 3), np.float32), "float32")]
    first, same, reshaped, empty = (blob.place(constant) for constant in constants)
    assert same == first and reshaped != first and len(blob.pieces) == 3


def test_corrupted_embedded_blobs_are_refused_at_create(tmp_path):
    """A byte changed in the embedded weights, JSON graph or program table after the build
    is found by the checksum at create, not run as another model (the seal, which load()
    checks first, covers the graph and the table too)."""
    inputs, _ = fixture_inputs("mlp")
    library = byoc.build(FIXTURES / "mlp.onnx", config={"target": "cpu", "backends": ["cublaslt", "builtin"]},
                         workdir=str(tmp_path / "w"))
    data = Path(library.path).read_bytes()
    weights = byoc.runtime.embedded_weights(library.path)
    wrapper = next(path for path in (tmp_path / "w").glob("*.cc") if "kGraph" in path.read_text())
    listed = re.search(r"kGraph\[\] = \{(.*?)\};", wrapper.read_text(), re.S).group(1)
    graph = bytes(int(b) for b in listed.replace("\n", "").split(","))
    graph_start = data.index(graph)
    at_weights = data.index(weights[:64]) + len(weights) // 2
    program = (tmp_path / "w" / "program.bin").read_bytes()
    at_call = data.index(program) + len(program) - 60  # inside the last call record or a label
    for offset, message in ((at_weights, "weights embedded in the library do not match"),
                            (graph_start + 40, "embedded JSON graph does not match its checksum"),
                            (at_call, "program table is corrupted .it does not match its checksum")):
        edited = bytearray(data)
        edited[offset] ^= 0x01
        path = tmp_path / f"edited_{offset}.so"
        path.write_bytes(bytes(edited))
        # the seal over every byte but the weights', checked before dlopen; the weights are
        # the runtime's to check
        with pytest.raises(byoc.RuntimeError, match=message if offset == at_weights else
                           "do not match the seal written at the build"):
            byoc.load(path)
        # sealed again (as if loaded from C, where nothing checks the seal): create() finds it
        path.write_bytes(bytes(edited[:-byoc.runtime.SEAL_BYTES]))
        byoc.runtime.seal_library(path)
        with pytest.raises(byoc.RuntimeError, match=message):
            byoc.load(path)


def test_embedded_weights_follow_the_elf_image_and_a_damaged_trailer_is_refused_at_create(tmp_path):
    """Embedded weights are appended after the link (not passed through the assembler, the
    object cache and the linker): the library's bytes after its ELF image, page-aligned,
    then their trailer and the seal. A trailer that no longer says where they are (sealed
    again, as a C host that checks no seal would load it) is refused at create, naming it."""
    from byoc.runtime.library_file import WEIGHTS_ALIGNMENT, WEIGHTS_TRAILER_BYTES
    inputs, expected = fixture_inputs("mlp")
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "w"))
    weights = byoc.runtime.embedded_weights(library.path)
    assert len(weights) == library.metadata["weights"]["bytes"] > 0
    data = Path(library.path).read_bytes()
    at = len(data) - byoc.runtime.SEAL_BYTES - WEIGHTS_TRAILER_BYTES - len(weights)
    assert at % WEIGHTS_ALIGNMENT == 0 and data[at:at + len(weights)] == weights
    assert not list((tmp_path / "w").glob("weights.*"))  # nothing of them in the object cache's way
    np.testing.assert_allclose(library.load().run(**inputs), expected["y"], rtol=1e-4, atol=1e-5)
    for field, change, message in ((8, 1, r"weights trailer \(\d+ bytes at offset \d+\) does not match"),
                                   (0, 1, "does not end in byoc's weights trailer and seal")):
        edited = bytearray(data[:-byoc.runtime.SEAL_BYTES])
        edited[len(edited) - WEIGHTS_TRAILER_BYTES + field] ^= change
        path = tmp_path / f"trailer_{field}.so"
        path.write_bytes(bytes(edited))
        byoc.runtime.seal_library(path)
        with pytest.raises(byoc.RuntimeError, match="cannot map the weights embedded in .*" + message):
            byoc.load(path)
    # a trailer that has the weights begin inside the ELF image: the seal leaves none of the
    # image out (the whole file is hashed), and create refuses the trailer
    edited = bytearray(data[:-byoc.runtime.SEAL_BYTES])
    trailer_at = len(edited) - WEIGHTS_TRAILER_BYTES
    edited[trailer_at + 8:trailer_at + 24] = struct.pack("<QQ", 0, trailer_at)
    path = tmp_path / "trailer_inside.so"
    path.write_bytes(bytes(edited))
    byoc.runtime.seal_library(path)
    assert byoc.runtime.embedded_weights(path) == b""
    with pytest.raises(byoc.RuntimeError, match=r"weights trailer \(\d+ bytes at offset 0\) does not match"):
        byoc.load(path)


def test_a_library_loaded_from_a_private_copy_maps_its_own_weights(tmp_path):
    """A second library built at a path this process has loaded is loaded from a private copy
    that is unlinked once the dynamic loader has it: its weights are mapped at load, so a
    model created afterwards runs with the new weights, not the first library's."""
    import onnx
    from onnx import numpy_helper
    inputs, expected = fixture_inputs("mlp")
    workdir = str(tmp_path / "w")
    first = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=workdir).load()
    model = onnx.load(FIXTURES / "mlp.onnx")
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if array.dtype.kind == "f" and array.size > 1:
            tensor.CopyFrom(numpy_helper.from_array((array * 2).astype(array.dtype), tensor.name))
    onnx.save(model, tmp_path / "doubled.onnx")
    second = byoc.build(tmp_path / "doubled.onnx", config="cpu", workdir=workdir)
    import onnxruntime as ort
    want = ort.InferenceSession(str(tmp_path / "doubled.onnx"), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    np.testing.assert_allclose(second.load().run(**inputs), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(first.run(**inputs), expected["y"], rtol=1e-4, atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doubled.onnx", "w"]  # the copy is gone


def test_a_json_graph_forged_with_its_checksum_is_checked_against_the_callers_tensors(tmp_path):
    """The JSON graph edited into another valid graph (every batch of 4 made 8) with its
    checksum and the seal recomputed: the engine would read and write twice the bytes of
    the host's buffers. The wrapper checks the graph against the function's own interface
    (from the IR, compiled in) at create and names the tensor."""
    from byoc.codegen.host import blob_checksum
    library = byoc.build(FIXTURES / "mlp.onnx", config={"target": "cpu", "backends": ["cublaslt", "builtin"]},
                         workdir=str(tmp_path / "w"))
    data = bytearray(Path(library.path).read_bytes()[:-byoc.runtime.SEAL_BYTES])
    wrapper = next(path for path in (tmp_path / "w").glob("*.cc") if "kGraph" in path.read_text())
    listed = re.search(r"kGraph\[\] = \{(.*?)\};", wrapper.read_text(), re.S).group(1)
    graph = bytes(int(b) for b in listed.replace("\n", "").split(","))
    forged = graph.replace(b'"shape":[4,', b'"shape":[8,')
    assert forged != graph and len(forged) == len(graph)
    start, checksum = data.index(graph), struct.pack("<Q", blob_checksum(graph))
    assert data.count(checksum) == 1
    data[start:start + len(graph)] = forged
    at = data.index(checksum)
    data[at:at + 8] = struct.pack("<Q", blob_checksum(forged))
    path = tmp_path / "forged.so"
    path.write_bytes(bytes(data))
    byoc.runtime.seal_library(path)
    with pytest.raises(byoc.RuntimeError, match=r"the graph's input 0 \('p0'\) is 2048 bytes; the caller passes 1024"):
        byoc.load(path)


def test_outputs_no_call_writes_are_copied_out(tmp_path):
    """An output that is an input, a constant, or a tensor already returned earlier is not
    written by any call: run() must copy it into the caller's buffer."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    constant = helper.make_tensor("c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Identity", ["r"], ["r_again"]),
             helper.make_node("Identity", ["x"], ["x_again"]),
             helper.make_node("Identity", ["c"], ["c_out"])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
               for name, shape in (("r", [2, 3]), ("r_again", [2, 3]), ("x_again", [2, 3]), ("c_out", [3]))]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializer=[constant]),
                              opset_imports=[helper.make_opsetid("", 17)])
    module = byoc.build(model, config="cpu", workdir=str(tmp_path / "w")).load()
    for seed in range(3):  # fresh inputs each time: nothing may be left from an earlier run
        x = np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32)
        r, r_again, x_again, c_out = module.run(x)
        np.testing.assert_array_equal(r, np.maximum(x, 0))
        np.testing.assert_array_equal(r_again, np.maximum(x, 0))
        np.testing.assert_array_equal(x_again, x)
        np.testing.assert_array_equal(c_out, [1.0, 2.0, 3.0])


def test_build_stats_count_compiled_and_cached_units(tmp_path, monkeypatch):
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))  # an empty object cache: a cold build
    cold = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "cold")).build_stats
    warm = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "warm")).build_stats
    assert cold["compile_units"] == warm["compile_units"] >= 3  # builtin functions, host code, metadata
    assert cold["compiled"] == cold["compile_units"] and cold["cached"] == 0
    assert warm["compiled"] == 0 and warm["cached"] == warm["compile_units"]
    assert set(cold["backends"]) == {"builtin", "host"}
    assert sum(entry["units"] for entry in cold["backends"].values()) == cold["compile_units"]
    assert cold["seconds"] >= cold["compile_seconds"] > 0
    assert json.loads((tmp_path / "warm" / "build_stats.json").read_text()) == warm
    # the slowest compiles of the cold build, each timed by ninja (none in the warm one)
    from byoc.runtime import model_runtime_sources
    sources = {unit.name for unit in (tmp_path / "cold").iterdir()} | {s.name for s in model_runtime_sources(False)}
    slowest = cold["slowest_units"]
    assert 1 <= len(slowest) <= 5 and warm["slowest_units"] == []
    assert [u["seconds"] for u in slowest] == sorted((u["seconds"] for u in slowest), reverse=True)
    assert all(u["seconds"] >= 0 for u in slowest)
    assert any(u["source"] in sources for u in slowest), slowest


def test_reshapes_are_views_not_calls(tmp_path):
    """The built-in backend's reshape functions cost no call and no copy: the host gives
    their result the input's storage (bert2: its attention reshapes)."""
    inputs, expected = fixture_inputs("bert2")
    library = byoc.build(FIXTURES / "bert2.onnx", config="cpu", workdir=str(tmp_path / "w"),
                         input_shapes={k: v.shape for k, v in inputs.items()})
    final = (tmp_path / "w" / "final.ir").read_text()
    partitioned = (tmp_path / "w" / "partitioned.ir").read_text()
    host = (tmp_path / "w" / "host.cc").read_text()
    reshape_symbols = [line.split("@")[1].split("(")[0] for line in partitioned.splitlines()
                       if line.startswith("def @builtin") and 'Composite="builtin.reshape"' in line]
    assert reshape_symbols and all(f"@{symbol}(" in final for symbol in reshape_symbols)
    assert not any(f"({symbol})" in host for symbol in reshape_symbols)  # never declared: never called
    results = library.load().run(**inputs)
    for got, want in zip(results, expected.values(), strict=True):
        assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want))


@pytest.mark.parametrize("name", ["bert2", "resnet_small", "gpt2_2l"])
@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_memory_plan_is_near_the_lower_bound_and_far_below_no_reuse(name, precision, tmp_path):
    inputs, _ = fixture_inputs(name)
    library = byoc.build(FIXTURES / f"{name}.onnx", config={"target": "cpu", "precision": precision},
                         workdir=str(tmp_path / "w"), input_shapes={k: v.shape for k, v in inputs.items()})
    plan = library.memory
    assert plan["planned_bytes"] <= 1.1 * plan["lower_bound_bytes"], plan
    assert plan["no_reuse_bytes"] >= 3 * plan["planned_bytes"], plan


# ---- run-time checks on the Python side, before anything reaches the C code ----------------

def not_byoc_library() -> str:
    """A shared object byoc did not build (one Python itself loads)."""
    import _ctypes
    return _ctypes.__file__


def test_non_native_byte_order_is_refused_with_how_to_convert(built_models):
    module = load(built_models["mlp"])
    inputs, _ = fixture_inputs("mlp")
    swapped = inputs["x"].astype(inputs["x"].dtype.newbyteorder("S"))  # same values, other byte order
    with pytest.raises(byoc.RuntimeError, match=r"input 'x': dtype .f4 is not in native byte order.*newbyteorder"):
        module.run(x=swapped)
    out = np.empty((4, 32), np.dtype(np.float32).newbyteorder("S"))
    with pytest.raises(byoc.RuntimeError, match=r"output 'y': dtype .f4 is not in native byte order"):
        module.run(x=inputs["x"], out=[out])
    np.testing.assert_array_equal(module.run(x=swapped.astype(swapped.dtype.newbyteorder("="))),
                                  module.run(x=inputs["x"]))


@pytest.mark.parametrize("dtype", ["uint16", "complex64", "object", "datetime64[s]"])
def test_unsupported_dtype_is_named_as_numpy_names_it(built_models, dtype):
    module = load(built_models["mlp"])
    x = fixture_inputs("mlp")[0]["x"].astype(dtype)
    with pytest.raises(byoc.RuntimeError, match=rf"input 'x': dtype {re.escape(dtype)} is not supported; "
                                                 r"expected float32"):
        module.run(x=x)
    with pytest.raises(byoc.RuntimeError, match=rf"output 'y': dtype {re.escape(dtype)} is not supported"):
        module.run(x=fixture_inputs("mlp")[0]["x"], out=[np.empty((4, 32), dtype)])


def test_library_not_built_by_byoc_and_a_missing_path_are_named():
    path = not_byoc_library()
    for read in (load, byoc.runtime.metadata_of):
        with pytest.raises(byoc.RuntimeError, match=rf"{re.escape(path)}: not a byoc library.*byoc's seal"):
            read(path)
        with pytest.raises(byoc.RuntimeError, match=r"expected a path to a byoc \.so, got None"):
            read(None)


def test_benchmark_needs_at_least_one_repeat(built_models):
    module = load(built_models["mlp"])
    x = fixture_inputs("mlp")[0]["x"]
    for arguments, name in (({"repeat": 0}, "repeat"), ({"repeat": -1}, "repeat"), ({"warmup": -1}, "warmup")):
        with pytest.raises(byoc.RuntimeError, match=rf"{name} must be an integer >= [01], got -?\d"):
            module.benchmark(x=x, **arguments)
        with pytest.raises(byoc.RuntimeError, match=rf"latencies\(\): {name} must be an integer >= [01]"):
            module.latencies(x=x, **arguments)
    assert module.benchmark(x=x, repeat=1, warmup=0) > 0
    times = module.latencies(x=x, repeat=3, warmup=0)
    assert len(times) == 3 and all(t > 0 for t in times)


def test_out_takes_a_list_or_one_array_and_must_be_writeable(built_models):
    module = load(built_models["mlp"])
    inputs, expected = fixture_inputs("mlp")
    want = next(iter(expected.values()))
    for out in (lambda y: [y], lambda y: (y,), lambda y: y):  # one output: a bare array works too
        y = np.empty((4, 32), np.float32)
        assert module.run(**inputs, out=out(y)) is y
        assert np.max(np.abs(y - want)) <= 1e-3 * np.max(np.abs(want))
    with pytest.raises(byoc.RuntimeError, match=r"out=: expected 1 arrays \(one per output: y\), got 2"):
        module.run(**inputs, out=[y, y])
    y.flags.writeable = False
    with pytest.raises(byoc.RuntimeError, match=r"output 'y': the out= array is read-only"):
        module.run(**inputs, out=[y])
    read_only_input = inputs["x"].copy()
    read_only_input.flags.writeable = False  # inputs are only read: that is fine
    np.testing.assert_array_equal(module.run(x=read_only_input), module.run(**inputs))


def test_out_for_several_outputs_must_be_a_list(tmp_path):
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["x"], ["n"])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3]) for name in ("r", "n")]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    module = byoc.build(model, config="cpu", workdir=str(tmp_path / "w")).load()
    x = np.ones((2, 3), np.float32)
    with pytest.raises(byoc.RuntimeError, match=r"out=: expected a list or tuple of 2 arrays "
                                                 r"\(one per output: r, n\), got ndarray"):
        module.run(x, out=np.empty((2, 3), np.float32))


def test_export_library_paths_and_weights_path_for_embedded_weights(tmp_path, built_models):
    """export_library wants a file path it can write; weights_path= for a library that
    embeds its weights replaces them, so it must be a weights file of its program (test_refit.py)."""
    from byoc.errors import BuildError
    from byoc.runtime import ByocRuntimeError
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "w"))
    (tmp_path / "a_file").write_text("")
    for path, message in ((None, "expected a file path such as 'model.so', got None"),
                          (tmp_path, "is a directory; expected a file path"),
                          (tmp_path / "a_file" / "mlp.so", "cannot write")):
        with pytest.raises(BuildError, match=message):
            library.export_library(path)
    with pytest.raises(ByocRuntimeError, match="weights file .*w.safetensors' cannot be read"):
        byoc.runtime.load(built_models["mlp"], weights_path=tmp_path / "w.safetensors")
    with pytest.raises(ByocRuntimeError, match="is not a byoc .safetensors weights file"):
        byoc.runtime.load(built_models["mlp"], weights_path=FIXTURES / "mlp.onnx")



# ---------------------------------------------------------------- work directories and IRModule input

TINY = """
def @main(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %y = OP(%x)
  return %y
}"""


def _tiny(op="relu"):
    return byoc.ir.parse(TINY.replace("OP", op))


@pytest.mark.parametrize("name", ["a,b", "a b", "a'b"])
def test_a_workdir_whose_name_has_a_comma_a_space_or_a_quote_builds(tmp_path, name):
    """The build's commands name its directory only relatively (they run in it): -Wa and -Wl
    split their arguments at commas, and the shell at spaces and quotes."""
    library = byoc.build(_tiny(), config="cpu", workdir=str(tmp_path / name / "w"))
    np.testing.assert_array_equal(library.load().run(np.array([-1, 2, -3, 4], np.float32)), [0, 2, 0, 4])


def test_a_workdir_in_use_by_another_build_is_refused(tmp_path):
    import fcntl
    workdir = tmp_path / "w"
    workdir.mkdir()
    with open(workdir / ".byoc.lock", "a") as lock:  # what a build in progress holds
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(byoc.BuildError, match=f"workdir {re.escape(str(workdir))} is in use by another build"):
            byoc.build(_tiny(), config="cpu", workdir=str(workdir))
    library = byoc.build(_tiny(), config="cpu", workdir=str(workdir))  # released: builds
    np.testing.assert_array_equal(library.load().run(np.array([-1, 2, -3, 4], np.float32)), [0, 2, 0, 4])


def test_threads_building_into_one_workdir_one_builds_the_other_is_refused(tmp_path):
    import threading
    results, errors = {}, {}

    def build(op):
        try:
            results[op] = byoc.build(_tiny(op), config="cpu", workdir=str(tmp_path / "w"))
        except byoc.BuildError as error:
            errors[op] = error

    threads = [threading.Thread(target=build, args=(op,)) for op in ("relu", "exp")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Never both failing at the link (as before the lock): one builds; the other is refused
    # while it runs, or builds after it (then only its library is in the workdir).
    assert len(results) + len(errors) == 2 and results
    assert all("is in use by another build" in str(error) for error in errors.values())
    x = np.array([-1, 2, -3, 4], np.float32)
    loaded = 0
    for op, library in results.items():
        try:
            module = library.load()
        except byoc.BuildError as error:
            assert len(results) == 2 and "was rebuilt since this Library was made" in str(error)
            continue
        np.testing.assert_allclose(module.run(x), np.maximum(x, 0) if op == "relu" else np.exp(x), rtol=1e-6)
        loaded += 1
    assert loaded == 1


def test_a_library_whose_workdir_was_rebuilt_is_refused_not_swapped(tmp_path):
    workdir = str(tmp_path / "w")
    x = np.array([-1, 2, -3, 4], np.float32)
    first = byoc.build(_tiny("relu"), config="cpu", workdir=workdir)
    second = byoc.build(_tiny("negative"), config="cpu", workdir=workdir)
    assert first.build_id != second.build_id
    expected = (f"workdir {re.escape(workdir)} was rebuilt since this Library was made: its model.so is no longer "
                f"the one build {first.build_id} wrote; export it before building again into the same workdir")
    with pytest.raises(byoc.BuildError, match=expected):
        first.load()
    with pytest.raises(byoc.BuildError, match=expected):
        first.export_library(tmp_path / "first.so")
    assert not (tmp_path / "first.so").exists()
    np.testing.assert_array_equal(second.load().run(x), -x)
    # even the same model built again (its options may differ: weights in a sidecar, CUDA
    # graphs) leaves the first Library refused; the new one is the one to use
    again = byoc.build(_tiny("relu"), config="cpu", workdir=workdir)
    with pytest.raises(byoc.BuildError, match="was rebuilt since"):
        first.load()
    np.testing.assert_array_equal(load(again.export_library(tmp_path / "again.so")).run(x), np.maximum(x, 0))
    # a Library made by hand records no file states: it is taken as it is
    from byoc.build import Library
    by_hand = Library(path=again.path, workdir=again.workdir, metadata=again.metadata)
    np.testing.assert_array_equal(by_hand.load().run(x), np.maximum(x, 0))


def test_a_library_rebuilt_or_exported_again_at_the_same_path_loads_the_new_code(tmp_path):
    """The dynamic loader returns the library it already has for a path it has seen: a
    second build into one workdir, or a second export to one file, must still run the new
    model in the same process."""
    x = np.array([-1, 2, -3, 4], np.float32)
    workdir = str(tmp_path / "w")
    relu = byoc.build(_tiny("relu"), config="cpu", workdir=workdir)
    np.testing.assert_array_equal(relu.load().run(x), np.maximum(x, 0))
    exported = relu.export_library(tmp_path / "model.so")
    np.testing.assert_array_equal(load(exported).run(x), np.maximum(x, 0))
    assert os.stat(exported).st_ino == os.stat(relu.path).st_ino  # one file system: a link, not a copy
    exported_bytes = exported.read_bytes()
    negative = byoc.build(_tiny("negative"), config="cpu", workdir=workdir)
    assert exported.read_bytes() == exported_bytes  # the rebuild wrote a new file, not into the export
    np.testing.assert_array_equal(negative.load().run(x), -x)
    negative.export_library(tmp_path / "model.so")
    np.testing.assert_array_equal(load(exported).run(x), -x)
    assert byoc.runtime.metadata_of(exported)["build_id"] == negative.build_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.so", "w"]  # no temporary copies left


def test_a_read_only_workdir_is_a_config_error(tmp_path, monkeypatch):
    import os
    import tempfile
    workdir = tmp_path / "read_only"
    workdir.mkdir()
    workdir.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: make the probe meet what another user would
        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    try:
        with pytest.raises(byoc.ConfigError, match=f"workdir {re.escape(str(workdir))} is not writable "
                                                   r"\(Permission denied\)"):
            byoc.build(_tiny(), config="cpu", workdir=str(workdir))
    finally:
        workdir.chmod(0o755)


def test_a_failed_build_removes_its_temporary_workdir_only(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(byoc.ModelError):
        byoc.build(byoc.ir.parse(TINY.replace("@main", "@f").replace("OP", "relu")), config="cpu")
    assert list(tmp_path.iterdir()) == []
    library = byoc.build(_tiny(), config="cpu")  # a successful one stays: the Library lives there
    assert library.workdir.parent == tmp_path and library.path.exists()
    own = tmp_path / "own"
    with pytest.raises(byoc.ModelError):
        byoc.build(byoc.ir.parse(TINY.replace("@main", "@f").replace("OP", "relu")), config="cpu", workdir=str(own))
    assert own.is_dir()  # a workdir the user named is left for them to look into
    for path in tmp_path.iterdir():
        shutil.rmtree(path)
    with pytest.raises(byoc.CompileError, match="rerun"):  # a compiler error: its sources are kept to look into
        byoc.build(_tiny(), config={"target": "cpu -march=no_such_cpu"})
    kept = list(tmp_path.iterdir())
    assert len(kept) == 1 and (kept[0] / "build.ninja").exists()
    shutil.rmtree(kept[0])
    with pytest.raises(byoc.BuildError, match="not a C identifier|C library"):  # any other BuildError: removed
        byoc.build(byoc.ir.parse(EXTERN_CALL.replace("@k", "@malloc").replace("BACKEND", "builtin")), config="cpu")
    assert list(tmp_path.iterdir()) == []


EXTERN_CALL = """
def @main(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] {
  %y = @k(%x)
  return %y
}

def @k(%p: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Compiler="BACKEND"] {
  %r = relu(%p)
  return %r
}"""


@pytest.mark.parametrize("text, error, pattern", [
    (TINY.replace("@main", "@f").replace("OP", "relu"), byoc.ModelError,
     r"the module has no function @main \(it has @f\); expected @main"),
    ("def @main(%x: Tensor[(4,), float32]) -> Tensor[(4,), float32] [Extern=1];", byoc.ModelError,
     r"@main is an extern declaration \(no body\); expected @main to be a function with a body"),
    (TINY.replace("OP", "relu").replace("float32] {", 'float32] [Compiler="builtin"] {', 1), byoc.ModelError,
     r"@main has Compiler='builtin'; expected the entry function without a Compiler attribute"),
    (EXTERN_CALL.replace("BACKEND", "cutlass"), byoc.BuildError,
     r"@k \(Compiler='cutlass'\) name a backend this build does not configure; the configured backends are "
     r"builtin"),
    (EXTERN_CALL.replace("BACKEND", "nope"), byoc.BuildError,
     r"@k \(Compiler='nope'\) name a backend this build does not configure"),
    (EXTERN_CALL.replace("BACKEND", "builtin").replace("@k", "@malloc"), byoc.BuildError,
     r"@malloc \(Compiler='builtin'\): it names a function or object of the C library"),
])
def test_irmodule_input_errors_are_named(tmp_path, text, error, pattern):
    with pytest.raises(error, match=pattern):
        byoc.build(byoc.ir.parse(text), config="cpu", workdir=str(tmp_path / "w"))


def test_interpret_names_what_it_needs():
    from byoc.interpreter import InterpreterError
    for model, shown in ((None, "None"), (b"\x08\x07", "bytes"), ("m.onnx", "str 'm.onnx'")):
        with pytest.raises(InterpreterError, match=rf"interpret: expected an IRModule or a Function, got {shown}.*"
                                                   r"byoc\.interpret\(byoc\.from_onnx\(model\), \.\.\.\)"):
            byoc.interpret(model, np.zeros(4, np.float32))
    with pytest.raises(InterpreterError, match=r"entry 'nope': the module has no such function; it has main"):
        byoc.interpret(_tiny(), np.zeros(4, np.float32), entry="nope")


def test_runs_from_several_threads_take_turns_on_one_module(built_models):
    """ctypes releases the GIL during a run: without the module's lock, two threads would
    share its arena and overwrite each other's intermediates."""
    import threading
    module = byoc.runtime.load(built_models["mlp"])
    inputs, expected = fixture_inputs("mlp")
    (name, value), = inputs.items()
    rng = np.random.default_rng(0)
    cases = [rng.standard_normal(value.shape).astype(value.dtype) for _ in range(4)]
    references = [np.asarray(module.run(**{name: x})).copy() for x in cases]
    failures = []

    def worker(index):
        for _ in range(50):
            got = np.asarray(module.run(**{name: cases[index]}))
            if not np.array_equal(got, references[index]):
                failures.append(index)
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    module.close()


def test_a_temporary_workdir_goes_with_its_library_and_a_loaded_module_keeps_running():
    """Without workdir= byoc builds in a temporary directory of its own and removes it when
    the Library goes (at the latest at exit): no /tmp/byoc-build-* litter. A Module loaded
    before keeps working; an exported copy needs nothing from it; workdir= keeps the sources."""
    import gc
    library = byoc.build(str(Path(__file__).parent / "fixtures" / "mlp.onnx"), config="cpu")
    workdir = library.workdir
    assert workdir.is_dir() and not library.workdir_kept
    module = library.load()
    (spec,) = module.metadata["inputs"]
    feeds = {spec["name"]: np.linspace(-1, 1, int(np.prod(spec["shape"])), dtype=np.float32).reshape(spec["shape"])}
    before = module.run(**feeds)
    del library
    gc.collect()
    assert not workdir.exists()
    np.testing.assert_array_equal(module.run(**feeds), before)
    module.close()


@pytest.mark.parametrize("field, value, reason", [
    ("function", 99, "a call: function out of range"),
    ("result", 10**6, "a call: operand out of range"),
    ("region", None, "its counts do not match its size"),
    # operands forged with the checksum to match: each checked against the model's own tables
    ("operand offset", 1 << 40, "an operand lies outside the memory it names"),
    ("operand bytes", 1 << 40, "an operand lies outside the memory it names"),
    ("operand end", "arena end", "an operand lies outside the memory it names"),
    ("operand space", 4, "an operand lies outside the memory it names"),  # a host arena a cpu model lacks
    ("input bytes", "one more", "an operand lies outside the memory it names"),
    ("flags", 2, "a call: a host call in a program with no data on the host"),
])
def test_a_program_table_that_names_what_does_not_exist_is_refused_at_create(field, value, reason, tmp_path,
                                                                              monkeypatch):
    """The runtime checks the program table it decodes, not only its checksum: a call of a
    function or an operand that does not exist (here written by the build itself, so the
    checksum matches) is refused at create, naming the table, instead of jumping anywhere."""
    import struct
    import byoc.package
    original = byoc.package.program_table

    def corrupted(host, artifacts):
        table = bytearray(original(host, artifacts))
        num_calls, num_refs = struct.unpack_from("<2I", table, 8)
        first_call = 40 + 24 * num_refs
        refs = [struct.unpack_from("<IIQQ", table, 40 + 24 * i) for i in range(num_refs)]
        arena = next(i for i, ref in enumerate(refs) if ref[0] == 0)  # the first operand in the arena
        if field == "function":
            struct.pack_into("<i", table, first_call, value)
        elif field == "result":
            struct.pack_into("<I", table, first_call + 20, value)
        elif field == "operand offset":
            struct.pack_into("<Q", table, 40 + 24 * arena + 8, value)
        elif field == "operand bytes":
            struct.pack_into("<Q", table, 40 + 24 * arena + 16, value)
        elif field == "operand end":  # inside the arena, running one byte past its end
            arena_bytes = host.plan.arena_bytes
            struct.pack_into("<QQ", table, 40 + 24 * arena + 8, arena_bytes - refs[arena][3] + 1, refs[arena][3])
        elif field == "operand space":
            struct.pack_into("<I", table, 40 + 24 * arena, value)
        elif field == "input bytes":
            index = next(i for i, ref in enumerate(refs) if ref[0] == 2)
            struct.pack_into("<Q", table, 40 + 24 * index + 16, refs[index][3] + 1)
        elif field == "flags":
            struct.pack_into("<I", table, first_call + 8, value)
        else:
            struct.pack_into("<I", table, 16, 1)  # a region the table has no bytes for
        return bytes(table)
    monkeypatch.setattr(byoc.package, "program_table", corrupted)
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "w"))
    with pytest.raises(byoc.RuntimeError, match=f"program table is corrupted \\({reason}\\)"):
        library.load()


def test_shape_buckets_make_one_library_that_runs_the_program_the_inputs_fit(tmp_path, monkeypatch):
    """dims with several sizes (shape buckets): one library, a program per combination of
    sizes over one set of weights (each constant once); run() takes the program whose input
    shapes the inputs have, each matching onnxruntime, and refuses a shape no bucket has,
    naming every shape it takes. The library keeps working after a refusal."""
    import onnxruntime as ort
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))  # what one build leaves, the next finds
    model = FIXTURES / "bert2.onnx"
    library = byoc.build(model, config="cpu", workdir=str(tmp_path / "w"),
                         dims={"batch": [3, 1], "sequence": [8, 16]})
    variants = library.metadata["variants"]
    assert [v["dims"] for v in variants] == [{"batch": 1, "sequence": 8}, {"batch": 1, "sequence": 16},
                                             {"batch": 3, "sequence": 8}, {"batch": 3, "sequence": 16}]
    assert variants[3]["outputs"][0]["shape"] == [3, 16, 128]
    # the first bucket's, as a static library's
    assert library.metadata["inputs"] == [{k: v for k, v in t.items() if k != "axis_dims"} for t in variants[0]["inputs"]]
    static = byoc.build(model, config="cpu", workdir=str(tmp_path / "static"), dims={"batch": 1, "sequence": 8})
    assert "variants" not in static.metadata
    # the first bucket's code is the static build's: its objects come from the cache (the
    # cache keys do not see that a bucket's sources lie in bucket0/)
    assert static.build_stats["backends"]["builtin"]["compiled"] == 0, static.build_stats
    # the weights once, not once per bucket (a few constants of the buckets' own shapes differ)
    assert library.metadata["weights"]["bytes"] < static.metadata["weights"]["bytes"] * 1.05
    assert library.metadata["memory"]["arena_bytes"] == max(v["memory"]["arena_bytes"] for v in variants)
    assert (tmp_path / "w" / "bucket3" / "final.ir").is_file()  # each bucket's sources and IR, kept
    assert "bert2.onnx" in (tmp_path / "w" / "report.html").read_text()  # titled by the model, as a static build
    host = (tmp_path / "w" / "host.cc").read_text()
    assert "// Variant 3: batch=3, sequence=16" in host and "_b3);" in host
    module = library.load()
    session = ort.InferenceSession(str(model))
    rng = np.random.default_rng(0)
    # sizes between buckets run padded into the next: batch 2 in the batch-3 buckets (every op
    # keeps the batch rows apart), sequence 5 in the sequence-8 ones (the attention mask,
    # padded with zeros, hides the padded keys)
    assert library.metadata["dims"]["batch"] == {"sizes": [1, 3], "paddable": True, "range": [1, 3]}
    assert library.metadata["dims"]["sequence"] == {"sizes": [8, 16], "paddable": True, "range": [1, 16]}
    assert variants[3]["inputs"][0]["axis_dims"] == ["batch", "sequence"]
    assert variants[3]["outputs"][0]["axis_dims"] == ["batch", "sequence", None]
    for batch, sequence in ((1, 8), (3, 16), (2, 16), (3, 8), (1, 16), (2, 8), (2, 5), (1, 1), (3, 11), (3, 16)):
        feeds = {i.name: rng.integers(0, 100 if i.name == "input_ids" else 2, (batch, sequence)).astype(np.int64)
                 for i in session.get_inputs()}
        # as a tokenizer masks a batch: each row's tokens, then its own padding (a row with no
        # token at all has no defined attention: padded or not, it is not compared)
        lengths = rng.integers(1, sequence + 1, batch)
        feeds["attention_mask"] = (np.arange(sequence) < lengths[:, None]).astype(np.int64)
        for got, want in zip(module.run(**feeds), session.run(None, feeds), strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(byoc.RuntimeError, match=r"the inputs' shapes \(input_ids \(3, 32\), .*\) fit none of the "
                                                r"shapes this model was built for: input_ids \(1, 8\), .*; "
                                                r"input_ids \(3, 16\), .*\(padded: batch from 1 to 3, sequence "
                                                r"from 1 to 16\)"):
        module.run(**{name: np.concatenate([value, value], axis=1) for name, value in feeds.items()})  # sequence 32
    with pytest.raises(byoc.RuntimeError, match=r"fit none of the shapes .*\(padded: batch from 1 to 3, sequence"):
        module.run(**{name: np.concatenate([value, value]) for name, value in feeds.items()})  # batch 6
    assert module.run(**feeds)[0].shape == (3, 16, 128)
    with pytest.raises(byoc.ConfigError, match=r"shape buckets are for ONNX models"):
        byoc.build(byoc.from_onnx(model, dims={"batch": 1, "sequence": 8}), config="cpu", dims={"batch": [1, 2]})
    with pytest.raises(byoc.ConfigError, match=r"take inputs of the same shapes .* expected sizes of dims the "
                                               r"inputs declare"):
        byoc.build(model, config="cpu", dims={"batch": [1, 2], "sequence": 8},
                   input_shapes={name: (1, 8) for name in ("input_ids", "attention_mask", "token_type_ids")})
    with pytest.raises(byoc.ConfigError, match=r"make 25 shape buckets; expected at most 16"):
        byoc.build(model, config="cpu", dims={"batch": [1, 2, 3, 4, 5], "sequence": [1, 2, 3, 4, 5]})


def test_one_library_serves_every_batch_to_32_and_a_sweep_of_sequence_lengths(tmp_path):
    """The dynamic-shape acceptance on the cpu target (the H100's runs of BERT-base and GPT-2
    are in bench/results/shape_buckets.md): a 2-layer BERT built once with buckets batch
    1, 8, 32 x sequence 16, 128 (its position table has 128 rows) runs every batch from 1 to
    32 at sequence lengths 1, 7, 64, 100 and 128, each matching onnxruntime; batch and
    sequence between buckets run padded (the attention mask hides the padded keys), and a
    size past the largest bucket is refused naming the ranges."""
    import onnxruntime as ort
    model = FIXTURES / "bert2.onnx"
    library = byoc.build(model, config="cpu", workdir=str(tmp_path / "w"),
                         dims={"batch": [1, 8, 32], "sequence": [16, 128]})
    assert {name: dim["range"] for name, dim in library.metadata["dims"].items()} == \
        {"batch": [1, 32], "sequence": [1, 128]}
    module, session = library.load(), ort.InferenceSession(str(model))
    rng = np.random.default_rng(4)
    worst = 0.0
    for sequence in (1, 7, 64, 100, 128):
        for batch in range(1, 33):
            lengths = rng.integers(1, sequence + 1, batch)  # each row's tokens, then its own padding
            feeds = {"input_ids": rng.integers(0, 1000, (batch, sequence)),
                     "attention_mask": (np.arange(sequence) < lengths[:, None]).astype(np.int64),
                     "token_type_ids": rng.integers(0, 2, (batch, sequence))}
            for got, want in zip(module.run(**feeds), session.run(None, feeds), strict=True):
                assert got.shape == want.shape, (batch, sequence)
                worst = max(worst, float(np.max(np.abs(got - want))))
    assert worst < 1e-4, worst
    too_long = {name: np.zeros((1, 129), np.int64) for name in ("input_ids", "attention_mask", "token_type_ids")}
    with pytest.raises(byoc.RuntimeError, match=r"\(padded: batch from 1 to 32, sequence from 1 to 128\)"):
        module.run(**too_long)


def test_a_tensor_offered_only_through_dlpack_chooses_its_shape_bucket(tmp_path):
    """run() chooses a bucket by the inputs' shapes: a tensor that offers only DLPack (as a
    JAX array does) is taken first, so its shape counts (a padded size included)."""
    class DLPackOnly:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    module = byoc.build(model, config="cpu", workdir=str(tmp_path / "w"), dims={"batch": [2, 4]}).load()
    import sys
    import types
    wrappers = types.ModuleType("dlpack_only_arrays")  # the caller's library: its outputs come back as its arrays
    wrappers.from_dlpack = lambda tensor: DLPackOnly(np.from_dlpack(tensor))
    DLPackOnly.__module__ = "dlpack_only_arrays"
    sys.modules["dlpack_only_arrays"] = wrappers
    try:
        for batch in (2, 3, 4):
            value = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4) - 5
            got = module.run(DLPackOnly(value))
            assert isinstance(got, DLPackOnly)
            np.testing.assert_array_equal(np.from_dlpack(got), np.maximum(value, 0))
    finally:
        del sys.modules["dlpack_only_arrays"]


def test_one_cnn_library_serves_every_batch_to_32(tmp_path):
    """The dynamic-batch acceptance for a CNN on the cpu target (the H100's ResNet-50 runs are
    in bench/results/shape_buckets.md): the small ResNet fixture with its batch made dynamic,
    built once with buckets 1, 8, 32, runs every batch from 1 to 32 (between buckets padded:
    convolutions, pooling and the classifier keep the images apart), each matching
    onnxruntime."""
    import onnx
    import onnxruntime as ort
    model = onnx.load(str(FIXTURES / "resnet_small.onnx"))
    for value in list(model.graph.input) + list(model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "resnet_small_dynamic.onnx"
    path.write_bytes(model.SerializeToString())
    library = byoc.build(path, config="cpu", workdir=str(tmp_path / "w"), dims={"batch": "1..32"})
    assert [v["dims"]["batch"] for v in library.metadata["variants"]] == [1, 2, 4, 8, 16, 32]
    assert library.metadata["dims"]["batch"]["range"] == [1, 32]
    module, session = library.load(), ort.InferenceSession(str(path))
    rng = np.random.default_rng(5)
    for batch in range(1, 33):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        want = session.run(None, {"input": x})[0]
        got = module.run(x)
        assert got.shape == want.shape == (batch, 10)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(want))))


def gpt2_like_model(layers=2, width=16, heads=2, vocab=50, positions=64):
    """A small GPT-2 in ONNX with dynamic batch and sequence, as torch exports one: token and
    position embeddings (positions from Range over the sequence's size), pre-norm blocks
    with a fused QKV projection split three ways, heads reshaped from the runtime shape, a
    causal mask built from the shape (finfo.min above the diagonal), a GELU MLP."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(7)
    head = width // heads
    inits, nodes = [], []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(op, inputs, outputs=None, **attrs):
        outputs = outputs or [f"t{len(nodes)}"]
        nodes.append(helper.make_node(op, inputs, outputs, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def weight(name, *shape, scale=0.3):
        return const(name, rng.standard_normal(shape) * scale)

    def layer_norm(x, name):
        return node("LayerNormalization", [x, const(f"{name}_g", 1 + 0.1 * rng.standard_normal(width)),
                                           const(f"{name}_b", 0.1 * rng.standard_normal(width))], axis=-1)
    shape = node("Shape", ["input_ids"])
    batch = node("Gather", [shape, const("i0", [0], np.int64)], axis=0)
    sequence = node("Gather", [shape, const("i1", [1], np.int64)], axis=0)
    positions_ids = node("Range", [const("zero", 0, np.int64), node("Squeeze", [sequence, const("ax0", [0], np.int64)]),
                                   const("one", 1, np.int64)])
    h = node("Add", [node("Gather", [weight("wte", vocab, width), "input_ids"]),
                     node("Gather", [weight("wpe", positions, width), positions_ids])])
    heads_shape = node("Concat", [batch, sequence, const("hd", [heads, head], np.int64)], axis=0)
    square = node("Concat", [sequence, sequence], axis=0)
    causal = node("Mul", [node("Trilu", [node("ConstantOfShape", [square], value=numpy_helper.from_array(
        np.ones(1, np.float32))), const("above", 1, np.int64)], upper=1), const("fmin", np.finfo(np.float32).min)])
    for i in range(layers):
        qkv = node("Add", [node("MatMul", [layer_norm(h, f"ln1_{i}"), weight(f"wqkv{i}", width, 3 * width)]),
                           weight(f"bqkv{i}", 3 * width, scale=0.1)])
        q, k, v = node("Split", [qkv, const(f"thirds{i}", [width] * 3, np.int64)], [f"q{i}", f"k{i}", f"v{i}"], axis=-1)
        q, k, v = (node("Reshape", [t, heads_shape]) for t in (q, k, v))
        scores = node("Mul", [node("MatMul", [node("Transpose", [q], perm=[0, 2, 1, 3]),
                                              node("Transpose", [k], perm=[0, 2, 3, 1])]),
                              const(f"scale{i}", 1 / np.sqrt(head))])
        probs = node("Softmax", [node("Add", [scores, causal])], axis=-1)
        attended = node("Transpose", [node("MatMul", [probs, node("Transpose", [v], perm=[0, 2, 1, 3])])],
                        perm=[0, 2, 1, 3])
        merged = node("Reshape", [attended, node("Concat", [batch, sequence, const(f"w{i}", [width], np.int64)],
                                                 axis=0)])
        h = node("Add", [h, node("MatMul", [merged, weight(f"wo{i}", width, width)])])
        up = node("MatMul", [layer_norm(h, f"ln2_{i}"), weight(f"wup{i}", width, 4 * width)])
        gelu = node("Mul", [node("Mul", [up, const(f"half{i}", 0.5)]),
                            node("Add", [const(f"one{i}", 1.0), node("Erf", [node("Div", [up, const(f"r2{i}", np.sqrt(2))])])])])
        h = node("Add", [h, node("MatMul", [gelu, weight(f"wdown{i}", 4 * width, width)])])
    node("Identity", [layer_norm(h, "ln_f")], ["last_hidden_state"])
    graph = helper.make_graph(
        nodes, "gpt2_like", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def assert_one_library_serves_every_batch_to_32(path, workdir, sequences, feeds_for):
    """Build `path` once with buckets batch 1, 8, 32 x sequence 16, 64 (both dims must pad),
    then run every batch 1..32 at each of `sequences`: feeds_for(batch, sequence) -> the
    inputs, each run matching onnxruntime."""
    import onnxruntime as ort
    library = byoc.build(path, config="cpu", workdir=str(workdir), dims={"batch": [1, 8, 32], "sequence": [16, 64]})
    dims = library.metadata["dims"]
    assert dims["batch"]["paddable"] and dims["sequence"]["paddable"], dims
    module, session = library.load(), ort.InferenceSession(str(path))
    for sequence in sequences:
        for batch in range(1, 33):
            feeds = feeds_for(batch, sequence)
            np.testing.assert_allclose(module.run(**feeds), session.run(None, feeds)[0], rtol=1e-4, atol=1e-4,
                                       err_msg=f"batch {batch} sequence {sequence}")


def test_one_gpt2_like_library_serves_every_batch_to_32_and_a_sweep_of_sequence_lengths(tmp_path):
    """The dynamic-shape acceptance for a causal model on the cpu target: a small GPT-2
    (gpt2_like_model) built once with buckets batch 1, 8, 32 x sequence 16, 64 runs every
    batch 1..32 at sequence lengths 1, 7 and 64 (its position table has 64 rows), each
    matching onnxruntime: the causal mask hides every padded key from the real queries."""
    path = tmp_path / "gpt2_like.onnx"
    path.write_bytes(gpt2_like_model().SerializeToString())
    rng = np.random.default_rng(8)
    assert_one_library_serves_every_batch_to_32(
        path, tmp_path / "w", (1, 7, 64), lambda batch, sequence: {"input_ids": rng.integers(0, 50, (batch, sequence))})


def test_one_library_of_a_transformers_gpt2_export_serves_every_batch_to_32_and_a_sweep_of_sequence_lengths(tmp_path):
    """The same acceptance on GPT-2 as transformers writes it (fixtures/gpt2_2l_dynamic.onnx:
    Conv1D views [batch, sequence, hidden] as [batch * sequence, hidden] for its Gemm, so
    each batch's padded rows lie between the next batch's real ones until the view back;
    causal and padding masks from the runtime shape and the mask input): buckets batch 1, 8,
    32 x sequence 16, 64 pad both dims, and every batch 1..32 at sequence lengths 1, 7, 20
    and 64 (its position table has 64 rows) matches onnxruntime, the last row's tail masked."""
    rng = np.random.default_rng(9)

    def feeds_for(batch, sequence):
        mask = np.ones((batch, sequence), np.int64)
        mask[-1, sequence - sequence // 4:] = 0  # a query row keeps its own key
        return {"input_ids": rng.integers(0, 500, (batch, sequence)), "attention_mask": mask}
    assert_one_library_serves_every_batch_to_32(FIXTURES / "gpt2_2l_dynamic.onnx", tmp_path / "w", (1, 7, 20, 64),
                                                feeds_for)


def test_a_model_no_machine_runs_is_refused_at_build_time(tmp_path):
    """An output of 16 TiB: refused by the build, naming the tensor, before anything is
    allocated or compiled (it used to build and fail in NumPy at the first run)."""
    with pytest.raises(byoc.BuildError, match=r"tensor 'big' of shape \(4398046511104,\) \(float32\) needs "
                                              r"17592186044416 bytes \(16 TiB\), more than the 4398046511104"):
        byoc.build(expand_model(2**42), "cpu", workdir=str(tmp_path / "build"))


def test_build_time_folding_stops_at_the_importers_limit(tmp_path):
    """A constant expanded to 8 GiB is not computed by the build's FoldConstant (the limit
    the importer applies): building it takes no such memory."""
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    library = byoc.build(expand_model(2**31), "cpu", workdir=str(tmp_path / "build"))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 2**31, f"the build's peak memory grew by {grown} bytes"
    assert any(f["backend"] == "builtin" for f in library.metadata["functions"])


def test_a_module_runs_ten_thousand_times_with_the_same_answer(tmp_path):
    """Long-lived serving: the 10,000th run gives the first's answer (a counter, a leak or a
    table that fills after some thousands of calls would show here)."""
    inputs = dict(np.load(FIXTURES / "mlp.npz"))
    feeds = {key[3:]: value for key, value in inputs.items() if key.startswith("in_")}
    module = byoc.build(FIXTURES / "mlp.onnx", "cpu", workdir=str(tmp_path / "w")).load()
    first = np.array(module.run(**feeds))
    out = np.empty_like(first)
    for _ in range(10_000):
        module.run(**feeds, out=out)
    np.testing.assert_array_equal(out, first)
    np.testing.assert_array_equal(module.run(**feeds), first)


def test_device_argument_of_a_cpu_library(built_models):
    """A cpu library runs on device 0 (or None); any other device, or not a device number,
    is refused with the value named."""
    from byoc.runtime import ByocRuntimeError
    inputs, expected = fixture_inputs("mlp")
    module = byoc.load(built_models["mlp"], device=0)
    assert module.device_id == 0
    assert np.max(np.abs(module.run(**inputs) - next(iter(expected.values())))) <= 1e-3
    with pytest.raises(ByocRuntimeError, match="device 1: this model runs on the cpu; expected -1 or 0"):
        byoc.load(built_models["mlp"], device=1)
    for device in (-1, True, 1.5, "0"):
        with pytest.raises(ByocRuntimeError, match=re.escape(f"device={device!r}: expected a CUDA device number >= 0")):
            byoc.load(built_models["mlp"], device=device)
