"""The model corpus (tests/corpus/, written by tests/corpus/make_corpus.py from real
transformers, torchvision and timm classes): every architecture as both torch exporters
write it, tiny, built for the `cpu` target and run against onnxruntime on the same file.

An export the exporter itself could not write is listed in the manifest with its error and
has no case here. `bench/corpus_report.py` writes the table of bench/results/corpus.md.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import byoc

CORPUS = Path(__file__).parent / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
# float32 on both sides: max |diff| / max |ref|, the issue's bound
RELATIVE_TOLERANCE = 1e-4


def _cases():
    for name, model in MANIFEST["models"].items():
        for exporter, export in model["exports"].items():
            if "error" not in export:
                yield pytest.param(name, exporter, id=f"{name}-{exporter}")


def corpus_inputs(name: str) -> dict:
    with np.load(CORPUS / name / "inputs.npz") as data:
        return {key: data[key] for key in data.files}


def onnxruntime_outputs(path: Path, inputs: dict) -> list:
    import onnxruntime
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def relative_error(got, expected) -> float:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-30)
    return float(np.max(np.abs(got - expected))) / scale if expected.size else 0.0


def test_manifest_covers_the_corpus_the_issue_asks_for():
    """At least 30 architectures, each family present, and each architecture exported by at
    least one exporter."""
    models = MANIFEST["models"]
    assert len(models) >= 30
    families = {model["family"] for model in models.values()}
    assert {"text-encoder", "decoder", "encoder-of-encoder-decoder", "vision"} <= families
    assert families & {"speech", "multimodal"}
    for name, model in models.items():
        assert any("error" not in export for export in model["exports"].values()), name


@pytest.mark.parametrize("name, exporter", list(_cases()))
def test_corpus_model_builds_and_matches_onnxruntime(name, exporter, tmp_path):
    export = MANIFEST["models"][name]["exports"][exporter]
    path = CORPUS / export["file"]
    inputs = corpus_inputs(name)
    expected = onnxruntime_outputs(path, inputs)
    library = byoc.build(str(path), "cpu", input_shapes={key: value.shape for key, value in inputs.items()},
                         workdir=str(tmp_path / "build"))
    module = library.load()
    got = module.run(**inputs)
    got = list(got.values()) if isinstance(got, dict) else (list(got) if isinstance(got, (list, tuple)) else [got])
    assert len(got) == len(expected)
    for value, reference in zip(got, expected, strict=True):
        assert np.asarray(value).shape == reference.shape
        assert relative_error(value, reference) <= RELATIVE_TOLERANCE
