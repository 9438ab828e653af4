"""byoc.refit / `byoc refit`: new weights for a built library, checked against its build
record, give the outputs of a library rebuilt with them, bit for bit; weights that do not
fit (names, dtypes, shapes, a program they would change, another program's file, a
corrupted file) are refused with the tensor named, and a module keeps running."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.refit import RefitError, read_safetensors
from byoc.runtime import ByocRuntimeError

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_inputs(name):
    data = np.load(FIXTURES / f"{name}.npz")
    return {key[3:]: data[key] for key in data if key.startswith("in_")}


def perturbed(name, path, seed=1):
    """The fixture with every float initializer of more than one element changed."""
    model = onnx.load(FIXTURES / f"{name}.onnx")
    rng = np.random.default_rng(seed)
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if array.dtype.kind == "f" and array.size > 1:
            noise = rng.standard_normal(array.shape).astype(array.dtype) * 0.05 * (np.abs(array).max() + 1e-3)
            tensor.CopyFrom(numpy_helper.from_array((array + noise).astype(array.dtype), tensor.name))
    onnx.save(model, path)
    return model


def outputs(module, inputs):
    result = module.run(**inputs)
    return result if isinstance(result, tuple) else (result,)


def same(first, second) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("name,params", [("mlp", "embedded"), ("mlp", "sidecar"), ("resnet_small", "embedded")])
def test_refit_gives_the_rebuilt_library_outputs(name, params, tmp_path):
    """resnet_small: batch norms folded into the convs (a weight of the library is made of
    several initializers)."""
    inputs = fixture_inputs(name)
    shapes = {key: value.shape for key, value in inputs.items()}
    new_model = tmp_path / "new.onnx"
    perturbed(name, new_model)
    old = byoc.build(FIXTURES / f"{name}.onnx", config="cpu", workdir=str(tmp_path / "old"), params=params,
                     input_shapes=shapes)
    new = byoc.build(new_model, config="cpu", workdir=str(tmp_path / "new"), params=params, input_shapes=shapes)
    assert old.metadata["program_id"] == new.metadata["program_id"]
    assert old.metadata["build_id"] != new.metadata["build_id"]
    old_outputs, new_outputs = outputs(old.load(), inputs), outputs(new.load(), inputs)
    assert not same(old_outputs, new_outputs)

    result = byoc.refit(old.path, new_model, output=tmp_path / "refit.safetensors")
    assert result.initializers == len(old.metadata["build"]["initializers"])
    assert 0 < len(result.changed) <= result.initializers
    assert same(outputs(byoc.load(old.path, weights_path=result.path), inputs), new_outputs)
    module = old.load()
    assert same(outputs(module, inputs), old_outputs)  # the library's own weights, untouched
    module.load_weights(result.path)
    assert same(outputs(module, inputs), new_outputs)
    # the rebuilt library takes the refit file too (one program)
    assert same(outputs(byoc.load(new.path, weights_path=result.path), inputs), new_outputs)
    if params == "sidecar":
        assert same(outputs(byoc.load(old.path, weights_path=new.sidecar), inputs), new_outputs)


def write_safetensors(path, arrays):
    """A .safetensors file of named tensors, as torch's safetensors writes them."""
    names = {"float32": "F32", "float16": "F16", "int64": "I64"}
    header, offset, blobs = {}, 0, []
    for name, array in arrays.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": names[str(array.dtype)], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_refit_from_tensors_by_name(tmp_path):
    """New values by initializer name (a dict, an .npz, a .safetensors state dict) put into
    the original model: the rebuilt library's outputs; names left out keep their values."""
    inputs = fixture_inputs("mlp")
    new_model = perturbed("mlp", tmp_path / "new.onnx")
    old = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "old"))
    want = outputs(byoc.build(tmp_path / "new.onnx", config="cpu", workdir=str(tmp_path / "new")).load(), inputs)
    tensors = {t.name: numpy_helper.to_array(t) for t in new_model.graph.initializer}
    np.savez(tmp_path / "w.npz", **tensors)
    write_safetensors(tmp_path / "w.safetensors", tensors)
    assert sorted(read_safetensors(tmp_path / "w.safetensors")) == sorted(tensors)
    for number, weights in enumerate((tensors, tmp_path / "w.npz", tmp_path / "w.safetensors")):
        result = byoc.refit(old.path, FIXTURES / "mlp.onnx", weights=weights, output=tmp_path / f"r{number}.safetensors")
        assert same(outputs(byoc.load(old.path, weights_path=result.path), inputs), want)
    first = next(iter(tensors))
    partial = byoc.refit(old.path, FIXTURES / "mlp.onnx", weights={first: tensors[first]},
                         output=tmp_path / "partial.safetensors")
    assert partial.changed == [first]


def test_refit_refuses_weights_that_do_not_fit(tmp_path):
    old = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "old"))
    model = onnx.load(FIXTURES / "mlp.onnx")
    first = model.graph.initializer[0]
    array = numpy_helper.to_array(first)
    out = tmp_path / "r.safetensors"
    cases = [
        ({first.name: array.astype(np.float64)}, f"weights '{first.name}' is float64 .* built for float32"),
        ({first.name: array[:1]}, re.escape(f"weights '{first.name}' is float32 [1, {array.shape[1]}]; the library was "
                                            f"built for float32 {list(array.shape)}")),
        ({"no.such.weight": array}, "weights name 'no.such.weight', which is not an initializer of the model"),
    ]
    for weights, message in cases:
        with pytest.raises(RefitError, match=message):
            byoc.refit(old.path, FIXTURES / "mlp.onnx", weights=weights, output=out)
    # a model whose initializers differ from the built one's
    reshaped = onnx.load(FIXTURES / "mlp.onnx")
    reshaped.graph.initializer[0].CopyFrom(numpy_helper.from_array(array[:, :3].copy(), first.name))
    onnx.save(reshaped, tmp_path / "reshaped.onnx")
    with pytest.raises(RefitError, match=re.escape(f"initializer '{first.name}' is float32 [{array.shape[0]}, 3] in the "
                                                   f"new model; the library was built for float32 {list(array.shape)}")):
        byoc.refit(old.path, tmp_path / "reshaped.onnx", output=out)
    renamed = onnx.load(FIXTURES / "mlp.onnx")
    renamed.graph.initializer[0].name = "renamed"
    onnx.save(renamed, tmp_path / "renamed.onnx")
    with pytest.raises(RefitError, match=f"initializer '{first.name}' of the built model is not in the new model"):
        byoc.refit(old.path, tmp_path / "renamed.onnx", output=out)
    with pytest.raises(RefitError, match="is the library itself"):
        byoc.refit(old.path, FIXTURES / "mlp.onnx", output=old.path)
    with pytest.raises(RefitError, match="expected the path of the weights file"):
        byoc.refit(old.path, FIXTURES / "mlp.onnx", output=None)
    assert not out.exists() and not list(tmp_path.glob(".*.partial"))


def scaled_model(scale: float, path):
    """y = relu(x @ w) * s with s an initializer of one element (compiled into the kernel)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    s = numpy_helper.from_array(np.array([scale], np.float32), "s")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Mul", ["r", "s"], ["y"])]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w, s])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_refit_refuses_weights_that_change_the_program(tmp_path):
    scaled_model(2.0, tmp_path / "a.onnx")
    scaled_model(3.0, tmp_path / "b.onnx")
    library = byoc.build(tmp_path / "a.onnx", config="cpu", workdir=str(tmp_path / "a"))
    with pytest.raises(RefitError, match="change the program of model.so, not only its weights .* "
                                         "initializers changed: s\\. Rebuild"):
        byoc.refit(library.path, tmp_path / "b.onnx", output=tmp_path / "r.safetensors")


def test_the_runtime_refuses_weights_files_that_do_not_fit(tmp_path):
    """Another program's weights file, a corrupted one, a truncated one: refused at create
    (load or load_weights), the module that tried still runs with its own weights."""
    inputs = fixture_inputs("mlp")
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "mlp"))
    other = byoc.build(FIXTURES / "resnet_small.onnx", config="cpu", workdir=str(tmp_path / "other"), params="sidecar",
                       input_shapes={k: v.shape for k, v in fixture_inputs("resnet_small").items()})
    perturbed("mlp", tmp_path / "new.onnx")
    refit = byoc.refit(library.path, tmp_path / "new.onnx", output=tmp_path / "r.safetensors")
    data = refit.path.read_bytes()
    corrupted, truncated = tmp_path / "corrupted.safetensors", tmp_path / "truncated.safetensors"
    corrupted.write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
    truncated.write_bytes(data[:-100])
    module = library.load()
    want = outputs(module, inputs)
    for path, message in ((other.sidecar, "belongs to another program"),
                          (corrupted, "do not match their checksum"), (truncated, "is truncated"),
                          (FIXTURES / "mlp.onnx", "is not a byoc .safetensors weights file")):
        with pytest.raises(ByocRuntimeError, match=message):
            byoc.load(library.path, weights_path=path)
        with pytest.raises(ByocRuntimeError, match=message):
            module.load_weights(path)
        assert same(outputs(module, inputs), want)


def test_refit_command(tmp_path):
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "old"))
    perturbed("mlp", tmp_path / "new.onnx")
    command = [sys.executable, "-m", "byoc", "refit", str(library.path), str(tmp_path / "new.onnx"),
               "-o", str(tmp_path / "r.safetensors")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "6 of 6 initializers changed" in done.stdout and (tmp_path / "r.safetensors").is_file()
    done = subprocess.run(command[:5] + [str(FIXTURES / "bert2.onnx")] + command[6:], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "byoc: error: initializer 'fc1.weight' of the built model" in done.stderr


def refit_blob(path) -> bytes:
    """The weights blob of a weights file (after its 8-byte length and JSON header)."""
    data = Path(path).read_bytes()
    return data[8 + int.from_bytes(data[:8], "little"):]


def test_refit_writes_the_weights_a_rebuild_embeds(tmp_path):
    """The refit file's blob is the rebuilt library's embedded weights, byte for byte, and its
    header names the program and the blob's checksum."""
    from byoc.codegen.host import blob_checksum
    perturbed("mlp", tmp_path / "new.onnx")
    old = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "old"))
    byoc.build(tmp_path / "new.onnx", config="cpu", workdir=str(tmp_path / "new"))
    result = byoc.refit(old.path, tmp_path / "new.onnx", output=tmp_path / "r.safetensors")
    blob = byoc.runtime.embedded_weights(tmp_path / "new" / "model.so")
    assert refit_blob(result.path) == blob
    data = result.path.read_bytes()
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    assert header["__metadata__"]["program_id"] == old.metadata["program_id"]
    assert header["__metadata__"]["checksum"] == str(blob_checksum(blob))
    assert header["byoc_weights"] == {"dtype": "U8", "shape": [len(blob)], "data_offsets": [0, len(blob)]}


CUDA_CONFIG = {"cuda_graph": True, "precision": "float16", "tuning": {"profile": False}}


def build_cuda_pair(tmp_path):
    """bert2 for sm_90 in float16 (weights converted, as a GPU build keeps them), built from
    two sets of trained-looking weights (the fixture's LayerNorm scales are all ones, which
    the build simplifies by value: such a model's refit to other scales is refused), and the
    first refit with the second's."""
    inputs = fixture_inputs("bert2")
    shapes = {key: value.shape for key, value in inputs.items()}
    perturbed("bert2", tmp_path / "old.onnx", seed=1)
    perturbed("bert2", tmp_path / "new.onnx", seed=2)
    old = byoc.build(tmp_path / "old.onnx", target="cuda -arch=sm_90", config=CUDA_CONFIG,
                     workdir=str(tmp_path / "old"), input_shapes=shapes)
    new = byoc.build(tmp_path / "new.onnx", target="cuda -arch=sm_90", config=CUDA_CONFIG,
                     workdir=str(tmp_path / "new"), input_shapes=shapes)
    result = byoc.refit(old.path, tmp_path / "new.onnx", output=tmp_path / "r.safetensors")
    return inputs, old, new, result


@pytest.mark.nvcc
@pytest.mark.skipif(__import__("byoc.toolchain.locate", fromlist=["cuda_home"]).cuda_home() is None,
                    reason="nvcc not installed")
def test_refit_of_a_cuda_library_without_a_gpu(tmp_path):
    inputs, old, new, result = build_cuda_pair(tmp_path)
    assert old.metadata["program_id"] == new.metadata["program_id"] == result.program_id
    assert refit_blob(result.path) == byoc.runtime.embedded_weights(tmp_path / "new" / "model.so")
    assert old.metadata["build"]["config"]["target"] == "cuda -arch=sm_90"


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("gpu_probe").gpu_present(), reason="no GPU visible")
def test_refit_on_the_gpu_gives_the_rebuilt_library_outputs(tmp_path):
    import cupy
    inputs, old, new, result = build_cuda_pair(tmp_path)
    device_inputs = {key: cupy.asarray(value) for key, value in inputs.items()}

    def run(module):
        got = module.run(**device_inputs)
        return [cupy.asnumpy(array) for array in (got if isinstance(got, tuple) else (got,))]
    want = run(new.load())
    module = old.load()
    before = run(module)
    assert not same(before, want)
    assert same(run(byoc.load(old.path, weights_path=result.path)), want)
    module.load_weights(result.path)
    # run directly, then captured, then replayed: the new instance's graphs over the new weights
    assert all(same(run(module), want) for _ in range(3))


def test_byoc_run_takes_a_weights_file(tmp_path):
    inputs = fixture_inputs("mlp")
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "old"))
    perturbed("mlp", tmp_path / "new.onnx")
    result = byoc.refit(library.path, tmp_path / "new.onnx", output=tmp_path / "r.safetensors")
    want = byoc.load(library.path, weights_path=result.path).run(**inputs)
    np.savez(tmp_path / "inputs.npz", **inputs)
    command = [sys.executable, "-m", "byoc", "run", str(library.path), "--inputs", str(tmp_path / "inputs.npz"),
               "--repeat", "1", "--weights", str(result.path), "--save", str(tmp_path / "out.npz")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out.npz") as saved:
        assert np.array_equal(next(iter(saved.values())), want)
    done = subprocess.run(command[:4] + [str(FIXTURES / "mlp.onnx")] + command[5:], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "--weights is for a built library" in done.stderr


def test_weights_files_are_checked_whole(tmp_path):
    """A weights file with bytes after the weights, or a checksum that is not a number, is
    refused; so is one whose checksum would overflow."""
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "w"), params="sidecar")
    data = library.sidecar.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    header = data[8:header_end]
    checksum = json.loads(header)["__metadata__"]["checksum"]
    cases = {"longer": (data + b"\0" * 8, "longer than a weights file of this program"),
             "letters": (data.replace(f'"checksum":"{checksum}"'.encode(),
                                      f'"checksum":"x{checksum[1:]}"'.encode()), "has no checksum in its header")}
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(content)
        with pytest.raises(ByocRuntimeError, match=message):
            byoc.load(library.path, weights_path=path)
    assert byoc.load(library.path).run(**fixture_inputs("mlp")) is not None


def test_libraries_from_before_weights_files_are_not_given_weights_they_would_ignore(tmp_path, monkeypatch):
    """A library without a program id (built before refit) that embeds its weights would
    ignore a weights file: refused, at load and at load_weights; one with a sidecar takes
    its sidecar as before."""
    import byoc.runtime as runtime
    embedded = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "e"))
    sidecar = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "s"), params="sidecar")
    module = embedded.load()
    reader = runtime._read_metadata

    def old_metadata(lib, path):
        metadata = reader(lib, path)
        metadata.pop("program_id")
        return metadata
    monkeypatch.setattr(runtime, "_read_metadata", old_metadata)
    with pytest.raises(ByocRuntimeError, match="embeds its weights and was built before libraries took new weights"):
        byoc.load(embedded.path, weights_path=sidecar.sidecar)
    module.metadata.pop("program_id")
    with pytest.raises(ByocRuntimeError, match="embeds its weights and was built before libraries took new weights"):
        module.load_weights(sidecar.sidecar)
    assert byoc.load(sidecar.path, weights_path=sidecar.sidecar).run(**fixture_inputs("mlp")) is not None


def test_refit_inputs_that_are_not_weights_are_refused_by_name(tmp_path, monkeypatch):
    library = byoc.build(FIXTURES / "mlp.onnx", config="cpu", workdir=str(tmp_path / "w"))
    out = tmp_path / "r.safetensors"
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "one.npy").rename(tmp_path / "one.npz")
    (tmp_path / "zip.npz").write_bytes(b"PK\x03\x04 not a zip")
    huge = tmp_path / "huge.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [2 ** 62, 4], "data_offsets": [0, 0]}}).encode()
    huge.write_bytes(len(header).to_bytes(8, "little") + header)
    deep = tmp_path / "deep.safetensors"
    header = b"[" * 100000 + b"]" * 100000
    deep.write_bytes(len(header).to_bytes(8, "little") + header)
    cases = [(tmp_path / "one.npz", "is not a readable .npz of named arrays"),
             (tmp_path / "zip.npz", "is not a readable .npz of named arrays"),
             (huge, "tensor 'w': shape \\[4611686018427387904, 4\\] of F32 needs"),
             (deep, "its .safetensors header is not JSON"),
             ({"fc1.weight": object()}, "weights 'fc1.weight': expected an array of numbers"),
             ({"fc1.weight": [[1, 2], [3]]}, "weights 'fc1.weight': cannot be read as an array")]
    for weights, message in cases:
        with pytest.raises(RefitError, match=message):
            byoc.refit(library.path, FIXTURES / "mlp.onnx", weights=weights, output=out)
    with pytest.raises(RefitError, match="expected the path of the weights file"):
        byoc.refit(library.path, FIXTURES / "mlp.onnx", output=str(tmp_path / "a\0b"))
    from byoc import runtime
    metadata = runtime.metadata_of(library.path)
    metadata["build"]["initializers"][0].pop("shape")
    monkeypatch.setattr(runtime, "metadata_of", lambda path: metadata)
    with pytest.raises(RefitError, match="its metadata's build record is malformed"):
        byoc.refit(library.path, FIXTURES / "mlp.onnx", output=out)
