"""Writes the model corpus's tiny fixtures: every architecture of bench/corpus_models.py,
exported by both torch exporters as a user would call them, with its example inputs.

    python tests/corpus/make_corpus.py [NAME ...] [--exporters dynamo]   # from the repository root; CPU, no network

For each architecture NAME, into tests/corpus/NAME/:
  - torchscript.onnx: `torch.onnx.export(..., dynamo=False, opset_version=17)` with the
    batch (and sequence) axes dynamic, as most users call it;
  - dynamo.onnx + dynamo.onnx.data: `torch.onnx.export(...)` with its defaults (the
    torch.export-based exporter: opset 18 and up, static shapes, weights in the external data
    file), less the Python stack traces it records per node (_drop_stack_traces);
  - inputs.npz: the example inputs (seeded).
and tests/corpus/manifest.json: per architecture its family, source class, inputs, and per
export its file, opset, node counts per op type, bytes and onnxruntime's max |diff| to eager
torch (or the exporter's error, when an exporter cannot export the model).

Each export runs in its own process (a failing exporter cannot take the others down) and
the same versions regenerate the same bytes; the versions used are in the manifest.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
EXPORTERS = ("torchscript", "dynamo")


def export_one(name: str, exporter: str) -> dict:
    """In a child process: export one architecture with one exporter; its manifest entry."""
    import numpy as np
    import onnx
    import onnxruntime
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import corpus_models

    torch.use_deterministic_algorithms(True)
    wrapper, inputs = corpus_models.make(name, tiny=True)
    arch = corpus_models.ARCHITECTURES[name]
    folder = HERE / name
    folder.mkdir(exist_ok=True)
    names = list(inputs)
    args = tuple(inputs.values())
    path = folder / f"{exporter}.onnx"
    for stale in (path, Path(f"{path}.data")):
        stale.unlink(missing_ok=True)
    with torch.no_grad():
        expected = wrapper(*args).numpy()
    try:
        if exporter == "torchscript":
            axes = {input_name: arch.dynamic_axes[input_name] for input_name in names
                    if input_name in arch.dynamic_axes}
            torch.onnx.export(wrapper, args, str(path), dynamo=False, opset_version=17, input_names=names,
                              output_names=["output"], dynamic_axes=axes)
        else:
            torch.onnx.export(wrapper, args, str(path), input_names=names, output_names=["output"])
            _drop_stack_traces(path)
    except Exception as error:  # the exporter's own failure: recorded, not the corpus's
        for stale in (path, Path(f"{path}.data")):
            stale.unlink(missing_ok=True)
        first = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        return {"error": f"{type(error).__name__}: {first}"}
    np.savez(folder / "inputs.npz", **{k: v.numpy() for k, v in inputs.items()})
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    model = onnx.load(str(path), load_external_data=False)
    counts: dict = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    files = sorted(p.name for p in folder.iterdir() if p.name.startswith(f"{exporter}.onnx"))
    return {"file": f"{name}/{exporter}.onnx", "files": files, "opset": opset,
            "bytes": sum((folder / f).stat().st_size for f in files),
            "nodes": len(model.graph.node), "op_types": dict(sorted(counts.items())),
            "ort_vs_torch": float(np.max(np.abs(got - expected))) if got.size else 0.0,
            "output_shape": list(got.shape)}


def _drop_stack_traces(path: Path):
    """The dynamo exporter records each node's Python stack (file names and line numbers of
    this checkout) in its metadata: dropped, so that the fixtures change only when a model
    does. The graph, its names and the other metadata stay as the exporter wrote them."""
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    for node in model.graph.node:
        kept = [entry for entry in node.metadata_props if "stack_trace" not in entry.key]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    path.write_bytes(model.SerializeToString())


def main(argv=None):
    sys.path.insert(0, str(ROOT / "bench"))
    import corpus_models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="architectures (default: all)")
    parser.add_argument("--child", nargs=2, metavar=("NAME", "EXPORTER"), help=argparse.SUPPRESS)
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--exporters", nargs="*", choices=EXPORTERS, default=list(EXPORTERS))
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(export_one(*args.child)))
        return 0
    names = args.names or list(corpus_models.ARCHITECTURES)
    manifest_path = HERE / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}}

    def run(job):
        name, exporter = job
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        child = subprocess.run([sys.executable, __file__, "--child", name, exporter], capture_output=True,
                               text=True, env=env, timeout=900)
        lines = child.stdout.strip().splitlines()
        try:
            entry = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            tail = (child.stderr.strip().splitlines() or ["no output"])[-1][:300]
            entry = {"error": f"the export process failed: {tail}"}
        print(f"{name:20s} {exporter:12s} {entry.get('error') or str(entry['nodes']) + ' nodes'}", flush=True)
        return name, exporter, entry

    jobs = [(name, exporter) for name in names for exporter in args.exporters]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run, jobs))
    for name, exporter, entry in results:
        arch = corpus_models.ARCHITECTURES[name]
        model = manifest["models"].setdefault(name, {})
        model.update({"family": arch.family, "source": arch.source,
                      "dynamic_axes": {k: {str(a): d for a, d in v.items()} for k, v in arch.dynamic_axes.items()}})
        model.setdefault("exports", {})[exporter] = entry
        if (HERE / name / "inputs.npz").exists():
            import numpy as np
            with np.load(HERE / name / "inputs.npz") as data:
                model["inputs"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in data.items()}
    import onnx
    import onnxruntime
    import torch
    import transformers
    import torchvision
    import timm
    import onnxscript
    manifest["versions"] = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                            "transformers": transformers.__version__, "timm": timm.__version__,
                            "onnx": onnx.__version__, "onnxscript": onnxscript.__version__,
                            "onnxruntime": onnxruntime.__version__, "python": sys.version.split()[0]}
    manifest["models"] = dict(sorted(manifest["models"].items()))
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
