"""The corpus table: every tiny corpus model (tests/corpus/) and exporter built for the `cpu`
target and run against onnxruntime, as tests/test_corpus.py does, with its op count, op
types, partition summary, build seconds and error; exports the exporter could not write
are listed with the exporter's error.

    python3 bench/corpus_report.py [--out bench/results]    # CPU only; no torch needed

Writes OUT/corpus.json and OUT/corpus.md (which also points at the GPU table,
corpus_gpu.md, written by bench/corpus_gpu.py on the GPU machine).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"
TOLERANCE = 1e-4


def _row(name: str, exporter: str, export: dict, workdir: Path) -> dict:
    import onnxruntime

    import byoc
    row = {"model": name, "exporter": exporter, "opset": export.get("opset"), "nodes": export.get("nodes"),
           "op_types": export.get("op_types", {})}
    if "error" in export:
        return {**row, "status": "not exported", "failure": export["error"]}
    path = CORPUS / export["file"]
    with np.load(CORPUS / name / "inputs.npz") as data:
        inputs = {key: data[key] for key in data.files}
    step = "onnxruntime"
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        expected = session.run(None, inputs)[0]
        step = "build"
        started = time.perf_counter()
        library = byoc.build(str(path), "cpu", input_shapes={k: v.shape for k, v in inputs.items()},
                             workdir=str(workdir / f"{name}.{exporter}"))
        row["build_s"] = round(time.perf_counter() - started, 2)
        partitions: dict = {}
        for function in library.metadata.get("functions", []):
            partitions[function["backend"]] = partitions.get(function["backend"], 0) + function.get("calls", 1)
        row["partitions"] = partitions
        step = "run"
        got = np.asarray(library.load().run(**inputs), np.float64)
        scale = max(float(np.max(np.abs(expected))), 1e-30)
        row["error"] = float(np.max(np.abs(got - expected))) / scale
        row["status"] = "ok" if row["error"] <= TOLERANCE and got.shape == expected.shape else "WRONG"
    except Exception as error:  # recorded in its row
        row.update(status=f"failed at {step}", failure=f"{type(error).__name__}: {str(error)[:300]}",
                   traceback=traceback.format_exc()[-1200:])
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    rows = []
    with tempfile.TemporaryDirectory(prefix="byoc-corpus-") as workdir:
        for name, model in manifest["models"].items():
            for exporter, export in model["exports"].items():
                row = _row(name, exporter, export, Path(workdir))
                row["family"] = model["family"]
                rows.append(row)
                print(f"{name:20s} {exporter:12s} {row['status']:10s} {row.get('error', '')}", flush=True)
    import onnxruntime

    import byoc  # noqa: F401
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit, "device": f"CPU ({platform.machine()}), target cpu",
            "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
            "corpus_versions": manifest.get("versions", {}), "tolerance": TOLERANCE}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "corpus.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    ok = sum(row["status"] == "ok" for row in rows)
    exported = sum(row["status"] != "not exported" for row in rows)
    architectures = len({row["model"] for row in rows})
    versions = ", ".join(f"{k} {v}" for k, v in meta["corpus_versions"].items())
    lines = [f"# Model corpus on the cpu target (byoc {commit}, {meta['date']})", "",
             f"{architectures} architectures, {exported} exports: {ok} build and match onnxruntime "
             f"{meta['onnxruntime']} (max |byoc - ort| / max |ort| <= {TOLERANCE}, float32). Tiny "
             f"configurations from `bench/corpus_models.py`, exported by `tests/corpus/make_corpus.py` "
             f"({versions}); `torchscript` is `torch.onnx.export(..., dynamo=False, opset_version=17)` with "
             f"dynamic batch/sequence axes, `dynamo` is `torch.onnx.export(...)` with its defaults (opset 18, "
             f"weights in `.onnx.data`). `tests/test_corpus.py` checks the same in CI. At full size on the "
             f"GPU: [corpus_gpu.md](corpus_gpu.md).", "",
             "| model | family | exporter | opset | nodes | partitions (calls) | build s | error | status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        partitions = ", ".join(f"{k} {v}" for k, v in sorted(row.get("partitions", {}).items()))
        error = f"{row['error']:.1e}" if "error" in row else "-"
        status = row["status"] if "failure" not in row else f"{row['status']}: {row['failure'][:120]}"
        lines.append(f"| {row['model']} | {row['family']} | {row['exporter']} | {row.get('opset') or '-'} | "
                     f"{row.get('nodes') or '-'} | {partitions or '-'} | {row.get('build_s', '-')} | {error} | "
                     f"{status.replace('|', '/')} |")
    lines += ["", "Op types per export are in corpus.json (`op_types`)."]
    (args.out / "corpus.md").write_text("\n".join(lines) + "\n")
    return 0 if ok == exported else 1


if __name__ == "__main__":
    sys.exit(main())
