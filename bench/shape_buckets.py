"""Shape buckets on real models: one library with a program per batch size (config
`dims: {batch: [...]}`) against a static library of each size, same process, same GPU.

    python3 bench/shape_buckets.py --out DIR --cases bert_base:1,8,32 --sweep --between 5,20

Each case is exported once with a dynamic batch dim (and, for text models, a dynamic
sequence dim, built at 128), from bench/real_model_zoo.py (random weights, fixed seeds,
model and wrapper in eval()). For each size: both libraries checked against onnxruntime
(CPU) on the same inputs, and timed (CUDA events, torch CUDA tensors). Recorded: the build
seconds (the bucket library cold; each static library after it, its kernels then in the
object cache), the .so sizes, the weights, the arena per bucket (planned and lower bound),
and run ms of the bucket library over the static one. --sweep runs every batch from 1 to the
largest bucket in the bucket library (sizes between buckets run padded into the next one),
each checked against onnxruntime and timed; --between SIZES also builds static libraries of
those sizes between buckets, the cost of padding being the padded run over the static one.
Writes shape_buckets.json and .md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import traceback
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
from real_model_zoo import Wrapper, model_spec  # noqa: E402
from real_models import byoc_inputs, device_name, log, relative_error, to_numpy, versions  # noqa: E402
from run_models import load_config, time_cuda  # noqa: E402

TOLERANCE = 2e-2
TEXT_SEQUENCE = 128


def export_dynamic(name: str, path: Path) -> tuple:
    """The model exported with dynamic batch (and sequence) dims: (its input names, whether
    it is a text model, make_inputs(batch) -> dict of torch tensors, the wrapper)."""
    make, make_inputs, attribute = model_spec(name)
    model = make("eager", False).eval()
    generator = torch.Generator().manual_seed(0)
    example = make_inputs(1, False, generator)
    text = "input_ids" in example
    wrapper = Wrapper(model, example, attribute).eval()
    axes = {input_name: ({0: "batch", 1: "sequence"} if text else {0: "batch"}) for input_name in example}
    axes["output"] = {0: "batch", 1: "sequence"} if text else {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(wrapper, tuple(example.values()), str(path), opset_version=17, input_names=list(example),
                          output_names=["output"], dynamic_axes=axes, dynamo=False, do_constant_folding=True)
    assert not wrapper.training and not any(m.training for m in wrapper.modules()), "export left training on"

    def inputs_for(batch, sequence=None):
        inputs = make_inputs(batch, False, torch.Generator().manual_seed(batch))
        if sequence is None or not text:
            return inputs
        # the same kind of text at another length: random tokens, and (where the model's
        # example masks its last quarter) each row's last quarter masked as padding
        from real_model_zoo import _text_inputs
        masked = bool((example["attention_mask"] == 0).any()) if "attention_mask" in example else False
        return _text_inputs(batch, sequence, model.config.vocab_size, sequence // 4 if masked else 0,
                            torch.Generator().manual_seed(batch * 1000 + sequence))
    return list(example), text, inputs_for, wrapper


def build(onnx_path: Path, workdir: Path, dims: dict, args) -> dict:
    import byoc
    config = load_config("cuda_sm90", args.tuning_db, "false")
    start = time.perf_counter()
    library = byoc.build(onnx_path, config=config, workdir=str(workdir), dims=dims)
    seconds = time.perf_counter() - start
    return {"library": library, "build_s": round(seconds, 1), "so_bytes": Path(library.path).stat().st_size,
            "weights_bytes": library.metadata["weights"]["bytes"],
            "build_stats": {k: library.build_stats.get(k) for k in ("compile_units", "compiled")}}


SEQUENCE_SWEEP = [1, 7, 64, 100, 128, 300, 512]


def run_case(case: str, args, rows: list):
    """MODEL:BATCHES[:SEQUENCES], e.g. bert_base:1,8,32 or bert_base:1,32:128,512 (a text
    model's sequence buckets; else it is built at 128)."""
    name, _, sizes_text = case.partition(":")
    sizes_text, _, sequences_text = sizes_text.partition(":")
    sizes = sorted(int(size) for size in sizes_text.split(","))
    if sequences_text:
        return run_sequence_case(case, name, sizes, sorted(int(s) for s in sequences_text.split(",")), args, rows)
    row = {"case": case, "model": name, "sizes": sizes}
    rows.append(row)
    work = Path(args.workdir) / name
    work.mkdir(parents=True, exist_ok=True)
    onnx_path = work / f"{name}_dynamic.onnx"
    input_names, text, inputs_for, _ = export_dynamic(name, onnx_path)
    log(case, "exported with dynamic dims:", onnx_path)
    extra = {"sequence": TEXT_SEQUENCE} if text else {}
    buckets = build(onnx_path, work / "buckets", {"batch": sizes, **extra}, args)
    log(case, f"bucket library built in {buckets['build_s']} s ({buckets['so_bytes']} bytes)")
    row["buckets"] = {k: v for k, v in buckets.items() if k != "library"}
    row["buckets"]["memory"] = [{"dims": v["dims"], **v["memory"]} for v in buckets["library"].metadata["variants"]]
    bucket_module = buckets["library"].load()
    import onnxruntime as ort
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    row["sizes_measured"] = []
    for size in sorted(set(sizes) | set(args.between if args.sweep else [])):
        entry = {"batch": size, **({"padded": True} if size not in sizes else {})}
        row["sizes_measured"].append(entry)
        try:
            static = build(onnx_path, work / f"static_b{size}", {"batch": size, **extra}, args)
            entry["static"] = {k: v for k, v in static.items() if k != "library"}
            static_module = static["library"].load()
            inputs = inputs_for(size)
            reference = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
            for label, module in (("bucket", bucket_module), ("static", static_module)):
                feed = byoc_inputs(module, inputs, "cuda")
                got = module.run(**feed)
                error = relative_error(to_numpy(got), reference)
                out = got
                ms = time_cuda(lambda: module.run(**feed, out=out))
                entry[f"{label}_ms"] = round(ms, 4)
                entry[f"{label}_error"] = float(f"{error:.3g}")
                assert error <= TOLERANCE, f"{label} error {error:.3g} vs onnxruntime"
            entry["bucket_over_static"] = round(entry["bucket_ms"] / entry["static_ms"], 3)
            log(case, f"batch {size}: bucket {entry['bucket_ms']} ms, static {entry['static_ms']} ms "
                      f"({entry['bucket_over_static']}x), errors {entry['bucket_error']} / {entry['static_error']}")
            static_module.close()
        except Exception as error:  # noqa: BLE001 - recorded, the run goes on
            entry["error"] = f"{type(error).__name__}: {error}"
            log(case, f"batch {size} FAILED: {entry['error']}")
            if args.debug:
                traceback.print_exc()
    if args.sweep:
        row["sweep"] = sweep(case, bucket_module, session, inputs_for, sizes, row)
    bucket_module.close()


def run_sequence_case(case: str, name: str, batches: list, sequences: list, args, rows: list):
    """Buckets over batch and sequence: one library against a static library of each bucket,
    then the sequence sweep (SEQUENCE_SWEEP up to the largest bucket) at the smallest,
    a middle and the largest batch, each checked against onnxruntime and timed."""
    import onnxruntime as ort
    row = {"case": case, "model": name, "sizes": batches, "sequences": sequences}
    rows.append(row)
    work = Path(args.workdir) / name
    work.mkdir(parents=True, exist_ok=True)
    onnx_path = work / f"{name}_dynamic.onnx"
    _, text, inputs_for, _ = export_dynamic(name, onnx_path)
    assert text, f"{name}: sequence buckets are for text models"
    library = build(onnx_path, work / "buckets", {"batch": batches, "sequence": sequences}, args)
    log(case, f"bucket library built in {library['build_s']} s ({library['so_bytes']} bytes); dims "
              f"{library['library'].metadata.get('dims')}")
    row["buckets"] = {k: v for k, v in library.items() if k != "library"}
    row["buckets"]["dims"] = library["library"].metadata.get("dims")
    row["buckets"]["memory"] = [{"dims": v["dims"], **v["memory"]} for v in library["library"].metadata["variants"]]
    module = library["library"].load()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    static_ms = {}
    row["static"] = []
    for batch in batches if not args.no_static else []:
        for sequence in sequences:
            entry = {"batch": batch, "sequence": sequence}
            row["static"].append(entry)
            try:
                static = build(onnx_path, work / f"static_b{batch}_s{sequence}", {"batch": batch, "sequence": sequence},
                               args)
                entry.update({k: v for k, v in static.items() if k not in ("library", "build_stats")})
                static_module = static["library"].load()
                feed = byoc_inputs(static_module, inputs_for(batch, sequence), "cuda")
                out = static_module.run(**feed)
                entry["static_ms"] = static_ms[batch, sequence] = round(time_cuda(lambda: static_module.run(**feed, out=out)), 4)
                static_module.close()
                log(case, f"static batch {batch} sequence {sequence}: {entry['static_ms']} ms, built in "
                          f"{entry['build_s']} s")
            except Exception as error:  # noqa: BLE001 - recorded, the run goes on
                entry["error"] = f"{type(error).__name__}: {error}"
                log(case, f"static {batch}x{sequence} FAILED: {entry['error']}")
    row["sweep"] = []
    timed = {batches[0], 3, batches[-1]}
    # --full-sweep: every batch up to the largest bucket (checked; timed at the smallest, 3 and the largest)
    for batch in sorted((set(range(1, batches[-1] + 1)) if args.full_sweep else timed) & set(range(1, batches[-1] + 1))):
        for sequence in [s for s in SEQUENCE_SWEEP if s <= sequences[-1]] + \
                [s for s in sequences if s not in SEQUENCE_SWEEP]:
            entry = {"batch": batch, "sequence": sequence}
            row["sweep"].append(entry)
            try:
                entry.update(checked_run(module, session, inputs_for(batch, sequence), timed=batch in timed))
                if (batch, sequence) in static_ms and "ms" in entry:
                    entry["over_static"] = round(entry["ms"] / static_ms[batch, sequence], 3)
                log(case, f"sweep batch {batch} sequence {sequence} (bucket {entry['bucket']}): {entry.get('ms', '-')} ms, "
                          f"error {entry['error']}{', ' + str(entry['over_static']) + 'x static' if 'over_static' in entry else ''}")
            except Exception as error:  # noqa: BLE001 - recorded, the sweep goes on
                entry["error"] = f"{type(error).__name__}: {error}"
                entry["ok"] = False
                log(case, f"sweep {batch}x{sequence} FAILED: {entry['error']}")
    module.close()


def checked_run(module, session, inputs: dict, timed: bool = True) -> dict:
    """One run of the bucket library: the bucket it ran in (its dims), its error against
    onnxruntime on the same inputs, whether that is within TOLERANCE, and (timed) its ms."""
    feed = byoc_inputs(module, inputs, "cuda")
    result = {"bucket": module._variant_for(module._order_inputs([], feed))[0]["dims"]}
    reference = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    got = module.run(**feed)
    result["error"] = float(f"{relative_error(to_numpy(got), reference):.3g}")
    result["ok"] = result["error"] <= TOLERANCE
    if timed:
        result["ms"] = round(time_cuda(lambda: module.run(**feed, out=got)), 4)
    return result


def sweep(case: str, module, session, inputs_for, sizes: list, row: dict) -> list:
    """Every batch from 1 to the largest bucket through the bucket library: the bucket it
    ran in, its error against onnxruntime, its ms, and (where a static library of that size
    was built) the padded run over the static one."""
    static_ms = {e["batch"]: e.get("static_ms") for e in row["sizes_measured"]}
    bucket_ms = {e["batch"]: e.get("bucket_ms") for e in row["sizes_measured"]}
    entries = []
    for batch in range(1, max(sizes) + 1):
        entry = {"batch": batch}
        entries.append(entry)
        try:
            entry.update(checked_run(module, session, inputs_for(batch)))
            entry["bucket"] = entry["bucket"]["batch"]
            entry["over_bucket"] = round(entry["ms"] / bucket_ms[entry["bucket"]], 3) if bucket_ms.get(entry["bucket"]) \
                else None
            if static_ms.get(batch):
                entry["over_static"] = round(entry["ms"] / static_ms[batch], 3)
            log(case, f"sweep batch {batch} (bucket {entry['bucket']}): {entry['ms']} ms, error {entry['error']}"
                      f"{', ' + str(entry['over_static']) + 'x static' if 'over_static' in entry else ''}")
        except Exception as error:  # noqa: BLE001 - recorded, the sweep goes on
            entry["error"] = f"{type(error).__name__}: {error}"
            entry["ok"] = False
            log(case, f"sweep batch {batch} FAILED: {entry['error']}")
    return entries


def write(out: Path, rows: list):
    header = {"device": device_name(), "date": datetime.date.today().isoformat(), "versions": versions()}
    (out / "shape_buckets.json").write_text(json.dumps({**header, "rows": rows}, indent=2) + "\n")
    lines = [f"# Shape buckets (build config `cuda_sm90`, {header['device']}, {header['date']})", "",
             f"byoc {header['versions']['byoc_commit']}; torch {header['versions']['torch']}, transformers "
             f"{header['versions']['transformers']}. One library with a program per batch size (`dims: {{batch: "
             f"[...]}}`, text models at sequence {TEXT_SEQUENCE}) against a static library of each size, both "
             f"checked against onnxruntime (max |byoc - ort| / max |ort| <= {TOLERANCE}) and timed in one "
             f"process (CUDA events, `out=`). Build s: the bucket library with an empty object cache for its "
             f"case; each static one after it (kernels cached).", "",
             "| model | buckets | bucket library: build s, .so MB, weights MB | batch | bucket ms | static ms | "
             "bucket / static | static build s, .so MB | arena MiB (lower bound) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if row.get("sequences"):
            continue  # buckets over batch and sequence: their own table below
        lib = row.get("buckets", {})
        memory = {m["dims"]["batch"]: m for m in lib.get("memory", [])}
        for entry in row.get("sizes_measured", []):
            static = entry.get("static", {})
            plan = memory.get(entry["batch"], {}).get("plan", {})
            arena = memory.get(entry["batch"], {}).get("arena_bytes", 0) / 2**20
            lower = (plan.get("lower_bound_bytes") or 0) / 2**20
            arena_text = f"{arena:.2f} ({lower:.2f})" if entry["batch"] in memory else "- (padded into the next)"
            model = f"{row['model']} ({row['device']})" if row.get("device") else row["model"]
            lines.append(
                f"| {model} | {','.join(map(str, row['sizes']))} | {lib.get('build_s')}, "
                f"{lib.get('so_bytes', 0) / 1e6:.1f}, {lib.get('weights_bytes', 0) / 1e6:.1f} | {entry['batch']} | "
                f"{entry.get('bucket_ms', '-')} | {entry.get('static_ms', '-')} | "
                f"{entry.get('bucket_over_static', entry.get('error', '-'))} | {static.get('build_s', '-')}, "
                f"{static.get('so_bytes', 0) / 1e6:.1f} | {arena_text} |")
    notes = sorted({f"batch {e['batch']} of {row['model']}: measured at {e['measured_at']}" for row in rows
                    for e in row.get("sizes_measured", []) if e.get("measured_at")})
    lines += [""] + [f"- {note}" for note in notes] if notes else []
    for row in rows:
        if not row.get("sequences"):
            continue
        lib = row.get("buckets", {})
        ok = [e for e in row.get("sweep", []) if e.get("ok")]
        # a row measured on another GPU than the file's header names says so
        where = f" ({row['device']}, byoc {row.get('measured_at')})" if row.get("device") else ""
        lines += ["", f"## {row['model']}: buckets batch {','.join(map(str, row['sizes']))} x sequence "
                  f"{','.join(map(str, row['sequences']))} in one library{where}", "",
                  f"Built in {lib.get('build_s')} s ({lib.get('so_bytes', 0) / 1e6:.1f} MB, weights "
                  f"{lib.get('weights_bytes', 0) / 1e6:.1f} MB); dims: {json.dumps(lib.get('dims'))}. "
                  f"{len(ok)} of {len(row.get('sweep', []))} runs within {TOLERANCE} of onnxruntime. A size between "
                  f"buckets runs padded into the next (inputs padded with zeros; the attention mask hides the "
                  f"padded keys). Worst error {max((e['error'] for e in ok), default=0)}"
                  f"{'; the table lists the timed runs and any failure' if len(row.get('sweep', [])) > 60 else ''}.",
                  "", "| batch | sequence | bucket | ms | static ms (a library of that size) | over static | error |",
                  "|---|---|---|---|---|---|---|"]
        static = {(e["batch"], e["sequence"]): e for e in row.get("static", [])}
        for e in row.get("sweep", []):
            if len(row["sweep"]) > 60 and "ms" not in e and e.get("ok"):
                continue  # a full sweep: the timed rows and any failure (the count above has the rest)
            bucket = e.get("bucket") or {}
            lines.append(f"| {e['batch']} | {e['sequence']} | {bucket.get('batch', '-')}x{bucket.get('sequence', '-')} "
                         f"| {e.get('ms', '-')} | {static.get((e['batch'], e['sequence']), {}).get('static_ms', '-')} | "
                         f"{e.get('over_static', '-')} | {e.get('error')} |")
        lines += ["", "Arena per bucket, planned (lower bound) MiB: " + ", ".join(
            f"{m['dims'].get('batch')}x{m['dims'].get('sequence')} {m.get('arena_bytes', 0) / 2**20:.1f} "
            f"({(m.get('plan') or {}).get('lower_bound_bytes', 0) / 2**20:.1f})" for m in lib.get("memory", []))]
        lines += ["", "Static libraries of each bucket's size: " + ", ".join(
            f"{e['batch']}x{e['sequence']} {e.get('static_ms', e.get('error'))} ms (built in {e.get('build_s', '-')} s)"
            for e in row.get("static", []))]
    for row in rows:
        if not row.get("sweep") or row.get("sequences"):
            continue
        ok = [e for e in row["sweep"] if e.get("ok")]
        where = f" ({row['device']}, byoc {row.get('measured_at')})" if row.get("device") else ""
        lines += ["", f"## {row['model']}: every batch from 1 to {max(row['sizes'])} through the bucket library "
                  f"(buckets {','.join(map(str, row['sizes']))}){where}", "",
                  f"{len(ok)} of {len(row['sweep'])} batches within {TOLERANCE} of onnxruntime (worst error "
                  f"{max((e['error'] for e in ok), default=0)}). A batch between buckets runs padded into the next "
                  f"one: its ms over the bucket's own size's, and over a static library of its size where one "
                  f"was built (the cost of padding).", "",
                  "| batch | bucket | ms | over the bucket's size | over static | error |", "|---|---|---|---|---|---|"]
        for e in row["sweep"]:
            lines.append(f"| {e['batch']} | {e.get('bucket', '-')} | {e.get('ms', '-')} | {e.get('over_bucket', '-')} "
                         f"| {e.get('over_static', '-')} | {e.get('error')} |")
    (out / "shape_buckets.md").write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=["bert_base:1,8", "resnet50:1,32"],
                        help="model:size,size,... (the batch dim's buckets)")
    parser.add_argument("--out", default="/tmp/byoc-buckets-out")
    parser.add_argument("--workdir", default="/tmp/byoc-buckets")
    parser.add_argument("--tuning-db", default=str(BENCH.parent / "backends/cutlass/tuning_sm90.json"))
    parser.add_argument("--sweep", action="store_true", help="every batch from 1 to the largest bucket")
    parser.add_argument("--between", type=lambda text: [int(v) for v in text.split(",")], default=[],
                        help="with --sweep: static libraries of these batch sizes too (padding's cost)")
    parser.add_argument("--full-sweep", action="store_true",
                        help="sequence buckets: every batch up to the largest bucket at each sequence length")
    parser.add_argument("--no-static", action="store_true", help="sequence buckets: no static libraries")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in args.cases:
        try:
            run_case(case, args, rows)
        except Exception as error:  # noqa: BLE001 - recorded, the next case runs
            rows.append({"case": case, "error": f"{type(error).__name__}: {error}"})
            log(case, "FAILED:", rows[-1]["error"])
            if args.debug:
                traceback.print_exc()
        write(out, rows)


if __name__ == "__main__":
    main()
