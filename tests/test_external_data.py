"""External data: a model whose weights lie in a file beside it (as torch's default exporter
writes every model) imports from its path, reading only inside the model's folder."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc

WEIGHT = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
BIAS = np.linspace(-1, 1, 4).astype(np.float32)


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(WEIGHT, "w"),
                                                      numpy_helper.from_array(BIAS, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save_external(folder: Path, location="model.onnx.data") -> Path:
    """The model saved as torch's exporter does: model.onnx, its tensors in `location`."""
    model = _model()
    onnx.external_data_helper.convert_model_to_external_data(model, all_tensors_to_one_file=True,
                                                             location=location, size_threshold=0)
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def _point_at(path: Path, location: str, **extra) -> Path:
    """Rewrite the saved model's tensors to name `location` (and other keys) instead."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        entries = {e.key: e.value for e in tensor.external_data}
        entries.update(location=location, **extra)
        del tensor.external_data[:]
        for key, value in entries.items():
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
    path.write_bytes(model.SerializeToString())
    return path


def _expected(x):
    return x @ WEIGHT + BIAS


def test_data_beside_the_model_is_read_from_its_folder(tmp_path):
    path = _save_external(tmp_path / "m")
    assert (tmp_path / "m" / "model.onnx.data").exists()
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for given in (path, str(path)):
        np.testing.assert_allclose(byoc.interpret(byoc.from_onnx(given), x=x), _expected(x), rtol=1e-6)


def test_data_in_a_subfolder_of_the_model_is_read(tmp_path):
    path = _save_external(tmp_path / "m", location="weights/all.bin")
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(byoc.interpret(byoc.from_onnx(path), x=x), _expected(x), rtol=1e-6)


def test_a_library_built_from_external_data_carries_its_weights(tmp_path):
    path = _save_external(tmp_path / "m")
    library = byoc.build(str(path), "cpu", workdir=str(tmp_path / "build"))
    (tmp_path / "m" / "model.onnx.data").unlink()  # the library holds the weights, not a reference
    x = np.full((2, 3), 0.5, np.float32)
    np.testing.assert_allclose(library.load().run(x=x), _expected(x), rtol=1e-6)


def test_missing_data_file_is_named(tmp_path):
    path = _save_external(tmp_path / "m")
    (tmp_path / "m" / "model.onnx.data").unlink()
    with pytest.raises(byoc.ModelError, match=r"initializer 'w'.*'model.onnx.data' cannot be opened"):
        byoc.from_onnx(path)


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../outside.bin", "C:\\w.bin"])
def test_a_location_out_of_the_folder_is_refused(tmp_path, location):
    path = _save_external(tmp_path / "m")
    (tmp_path / "outside.bin").write_bytes(WEIGHT.tobytes() + BIAS.tobytes())
    _point_at(path, location)
    with pytest.raises(byoc.ModelError, match="not a path inside the model's folder"):
        byoc.from_onnx(path)


def test_a_link_out_of_the_folder_is_refused_and_one_inside_is_read(tmp_path):
    path = _save_external(tmp_path / "m")
    data = tmp_path / "m" / "model.onnx.data"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(data.read_bytes())
    (tmp_path / "m" / "out.bin").symlink_to(outside)
    _point_at(path, "out.bin")
    with pytest.raises(byoc.ModelError, match="leads out of the model's folder"):
        byoc.from_onnx(path)
    (tmp_path / "m" / "in.bin").symlink_to(data)
    _point_at(path, "in.bin")
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(byoc.interpret(byoc.from_onnx(path), x=x), _expected(x), rtol=1e-6)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_special_file_is_refused_without_blocking(tmp_path):
    path = _save_external(tmp_path / "m")
    (tmp_path / "m" / "model.onnx.data").unlink()
    os.mkfifo(tmp_path / "m" / "model.onnx.data")
    with pytest.raises(byoc.ModelError, match="not a regular file"):
        byoc.from_onnx(path)


@pytest.mark.parametrize("extra, message", [
    ({"offset": "4096"}, "past the end of the file"),
    ({"length": "3"}, "has 3 bytes of external data"),
    ({"offset": "-4"}, "offset is '-4'; expected a non-negative integer"),
    ({"offset": "²"}, "expected a non-negative integer"),
])
def test_offsets_and_lengths_are_checked_against_the_file_and_dims(tmp_path, extra, message):
    path = _save_external(tmp_path / "m")
    _point_at(path, "model.onnx.data", **extra)
    with pytest.raises(byoc.ModelError, match=message):
        byoc.from_onnx(path)


def test_a_proto_or_bytes_without_a_folder_say_to_pass_the_path(tmp_path):
    path = _save_external(tmp_path / "m")
    model = onnx.load(str(path), load_external_data=False)
    for given in (model, path.read_bytes()):
        with pytest.raises(byoc.ModelError, match="pass the model's path"):
            byoc.from_onnx(given)
    loaded = onnx.load(str(path))  # with its data: nothing external left
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(byoc.interpret(byoc.from_onnx(loaded), x=x), _expected(x), rtol=1e-6)
