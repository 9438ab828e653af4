"""Real models (transformers, torchvision) built by byoc against onnxruntime and torch, same process.

    python3 bench/real_models.py --cases bert_base:1 gpt2:1 --out DIR [--configs cuda_sm90]
        [--torch-modes eager,default,reduce-overhead,max-autotune-no-cudagraphs]
        [--merge-from DIR/real_models.json] [--workdir W] [--tiny]

A case is model:batch (models: real_model_zoo.model_spec). Every model is built from its config class
with random weights and fixed seeds (nothing is downloaded): transformers' BertModel, GPT2Model,
ViTModel, T5EncoderModel, DistilBertModel, RobertaModel, torchvision's resnet50,
mobilenet_v3_large and efficientnet_b0 (their BatchNorm statistics are first set from a few
random batches, as a trained network's would be: with the initial statistics the depthwise
nets' outputs are ~1e-10 and all fp16 numbers would be noise). Per case, in one process:

1. the model and its wrapper (one tensor out: last_hidden_state or the logits), both in
   eval(), exported float32 to ONNX with static shapes: opset 17 by torch.onnx's TorchScript
   exporter, or where that fails or is gone opset 18 by the dynamo one (--exporter).
   Transformers export with attn_implementation=eager (--export-attn): SDPA exports with an
   IsNaN guard (both exporters) and the dynamo exporter writes the padding mask with GatherND,
   ONNX ops byoc's frontend does not take (yet);
2. the reference: onnxruntime's CPUExecutionProvider on that ONNX, same inputs (and the
   float32 torch output against it, which checks the export);
3. byoc.build with each --configs config (run_models.load_config: `name:variant`), its error
   max|byoc - ort| / max|ort| (pass: <= 2e-2; byoc runs fp16), timed as a user calls it,
   module.run(**inputs) with the same torch CUDA tensors each call, and with out= preallocated
   (run_models.time_cuda: CUDA events, median of 5 rounds), and a per-kernel profile of a
   run (torch.profiler, as bench/profile_kernels.py);
4. torch fp16 on the GPU (model.half(); integer inputs stay int64; the model's default
   attention, SDPA, via --torch-attn): eager and each torch.compile mode of --torch-modes,
   timed the same way, the first call's seconds recorded as its compile time.

With --prebuild a process only exports and builds (WORKDIR/prebuilt/: the library and its
build record); a later --prebuilt run takes those and does the rest, so that a whole suite
is timed in one process (`bash bench/gpu_session.sh suite`: a cold build of five models
outlasts a 10-minute device command together with their timing).

Every step is in its own try/except: a failure is recorded in the row and the run goes on.
Results are rewritten after every measurement: --out DIR gets real_models.json,
real_models.md and real_models_profiles.txt. --merge-from keeps the earlier file's rows of
cases not run now, so that the suite can be spread over several device calls
(`bash bench/gpu_session.sh real CASES...`). Without a GPU (e.g. `--configs cpu --tiny
--torch-modes none`) it checks the exports and byoc's build of them against onnxruntime and
times byoc on the CPU.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np
import torch

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))
from profile_kernels import profile_run  # noqa: E402
from real_model_zoo import Wrapper, model_spec  # noqa: E402
from run_models import load_config, time_cuda  # noqa: E402

TOLERANCE = 2e-2
SPEED_TARGET = 1.15  # the speed issue's: byoc at least this much faster than the best torch mode
DEFAULT_CASES = ["bert_base:1", "bert_base:8", "gpt2:1", "vit_b16:8", "resnet50:32", "mobilenet_v3_large:32",
                 "t5_encoder:8"]
TORCH_MODES = ["eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs"]
START = time.perf_counter()


def log(*parts):
    print(f"[{datetime.datetime.now():%H:%M:%S} +{time.perf_counter() - START:7.1f}s]", *parts, flush=True)


def export_onnx(wrapper, inputs, path, exporters=("torchscript", "dynamo")):
    """float32 ONNX with static shapes; returns (exporter, seconds, errors of the exporters tried
    first). The model and the wrapper are in eval() before (export restores the modes it found,
    recursively). The dynamo exporter writes opset 18 (asked for 17 it converts down, and
    torch 2.13's conversion leaves Split with opset 18's num_outputs: an invalid model)."""
    wrapper.eval()
    args = tuple(inputs.values())
    start = time.perf_counter()
    errors = []
    for exporter in exporters:
        try:
            with torch.no_grad():
                if exporter == "torchscript":
                    torch.onnx.export(wrapper, args, str(path), opset_version=17, input_names=list(inputs),
                                      output_names=["output"], dynamo=False, do_constant_folding=True)
                else:
                    program = torch.onnx.export(wrapper, args, input_names=list(inputs), output_names=["output"],
                                                opset_version=18, dynamo=True)
                    program.save(str(path))
            assert not wrapper.training and not any(m.training for m in wrapper.modules()), "export left training on"
            return exporter, time.perf_counter() - start, errors
        except Exception as exc:  # the TorchScript exporter may be gone in a newer torch
            errors.append(f"{exporter}: {type(exc).__name__}: {str(exc)[:1000]}")
            log("export with", exporter, "failed:", errors[-1][:300])
    raise RuntimeError("export failed: " + " | ".join(errors))


def relative_error(got, reference) -> float:
    got = np.asarray(got, dtype=np.float32)
    scale = float(np.abs(reference).max()) or 1.0
    if got.shape != reference.shape:
        raise ValueError(f"output shape {got.shape} != reference {reference.shape}")
    return float(np.abs(got - reference).max() / scale)


def to_numpy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy()
    return np.asarray(value).astype(np.float32)


def time_cpu(fn, repeat=20, warmup=3, rounds=5, seconds=2.0):
    """Like time_cuda with perf_counter, with fewer calls for slow models (about `seconds`)."""
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    per_call = (time.perf_counter() - start) / warmup
    repeat = max(1, min(repeat, int(seconds / rounds / max(per_call, 1e-6))))
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        means.append((time.perf_counter() - start) * 1e3 / repeat)
    return statistics.median(means)


def profile_text(case, spec, entry) -> str:
    profile = entry.get("profile")
    if not profile:
        return ""
    lines = [f"# {case} {spec}", "",
             f"wall {entry.get('ms_out', entry.get('ms', 0)) * 1000:.1f} us per run (out=); kernels and copies "
             f"{profile['gpu_us_per_run']:.1f} us per run ({profile['kernels_per_run']:.0f} launches per run, "
             f"{profile['distinct_kernels']} distinct kernels). With programmatic dependent launch a kernel "
             "starts while the one before it drains and waits for it: its time includes that wait, so the "
             "kernel times overlap and their sum can exceed the wall time. Exposed: what a kernel adds to the "
             "run (its end minus the latest end before it; they add up to the run's busy time"
             + (f", {profile['busy_us_per_run']:.1f} us" if "busy_us_per_run" in profile else "")
             + "); kernels by exposed time.", "",
             "| per run | exposed us | total us | mean us | kernel |", "|---|---|---|---|---|"]
    for k in profile["top"]:
        exposed = f"{k['exposed_us']:.1f}" if "exposed_us" in k else "-"
        lines.append(f"| {k['per_run']:g} | {exposed} | {k['total_us']:.1f} | {k['mean_us']:.2f} | {k['name'][:150]} |")
    return "\n".join(lines) + "\n"


def byoc_inputs(module, inputs, device):
    """The case's inputs as the library takes them (by name, in its dtypes)."""
    result = {}
    for spec in module.metadata["inputs"]:
        tensor = inputs[spec["name"]]
        dtype = getattr(torch, spec["dtype"])
        if device == "cuda":
            result[spec["name"]] = tensor.to(device="cuda", dtype=dtype).contiguous()
        else:
            result[spec["name"]] = tensor.to(dtype=dtype).numpy()
    return result


def _stem(args, name, batch, spec=None) -> str:
    return f"{name}_b{batch}{'_tiny' if args.tiny else ''}" + (f"_{spec.replace(':', '_')}" if spec else "")


def prebuilt_paths(args, name, batch, spec):
    """Where --prebuild leaves a case's library and what its build recorded."""
    stem = Path(args.workdir) / "prebuilt" / f"{_stem(args, name, batch, spec)}_{args.exporter}"
    return stem.with_suffix(".so"), stem.with_suffix(".json")


def build_byoc(args, case, name, batch, spec, onnx_path, input_shapes) -> tuple:
    """byoc.build of one config: (the Library, what to record of the build)."""
    import byoc
    tuning_db = args.tuning_db if spec.startswith("cuda") else None
    config = load_config(spec, tuning_db, args.profile)
    if args.compile_jobs:
        config.compile_jobs = args.compile_jobs
    workdir = Path(args.workdir) / f"{_stem(args, name, batch, spec)}_{args.exporter}"
    start = time.perf_counter()
    library = byoc.build(onnx_path, config=config, workdir=str(workdir), input_shapes=input_shapes,
                         precision=args.precision)
    record = {"build_s": round(time.perf_counter() - start, 1),
              "build_stats": getattr(library, "build_stats", None) or None,
              "backends": library.metadata.get("backends"), "cuda_graph": library.metadata.get("cuda_graph"),
              "output_dtype": library.metadata["outputs"][0]["dtype"]}
    if args.compile_jobs:
        record["compile_jobs"] = args.compile_jobs
    log(case, spec, f"built in {record['build_s']} s")
    return library, record


def run_byoc(args, case, name, batch, spec, onnx_path, inputs, reference, repeat, out_entry):
    import byoc
    library_path, record_path = prebuilt_paths(args, name, batch, spec)
    if args.prebuilt and library_path.exists() and record_path.exists():
        # built by an earlier --prebuild process: its record says how long that build took
        out_entry.update(json.loads(record_path.read_text()))
        log(case, spec, f"prebuilt library {library_path} (built in {out_entry['build_s']} s)")
        module = byoc.load(str(library_path))
    else:
        library, record = build_byoc(args, case, name, batch, spec, onnx_path,
                                     {k: tuple(v.shape) for k, v in inputs.items()})
        out_entry.update(record)
        module = library.load()
    device = module.device
    feeds = byoc_inputs(module, inputs, device)
    got = module.run(**feeds)
    if device == "cuda":
        torch.cuda.synchronize()
    out_entry["max_rel_error"] = relative_error(to_numpy(got), reference)
    out_entry["pass"] = out_entry["max_rel_error"] <= TOLERANCE
    log(case, spec, f"error vs onnxruntime {out_entry['max_rel_error']:.2e}")
    if device == "cuda":
        out_entry["ms"] = round(time_cuda(lambda: module.run(**feeds), repeat), 4)
        preallocated = torch.empty_like(got)
        out_entry["ms_out"] = round(time_cuda(lambda: module.run(**feeds, out=[preallocated]), repeat), 4)
        torch.cuda.synchronize()
    else:
        out_entry["ms"] = round(time_cpu(lambda: module.run(**feeds)), 4)
        preallocated = np.empty_like(got)
        out_entry["ms_out"] = round(time_cpu(lambda: module.run(**feeds, out=[preallocated])), 4)
    # the last timed run's output (with cuda_graph: a replay) must be right too
    out_entry["max_rel_error"] = max(out_entry["max_rel_error"], relative_error(to_numpy(preallocated), reference))
    out_entry["pass"] = out_entry["max_rel_error"] <= TOLERANCE
    log(case, spec, f"byoc {out_entry['ms']} ms, out= {out_entry['ms_out']} ms, "
        f"error {out_entry['max_rel_error']:.2e}")
    if device == "cuda":
        try:
            out_entry["profile"] = profile_run(lambda: module.run(**feeds, out=[preallocated]))
            log(case, spec, f"profile: {out_entry['profile']['kernels_per_run']:.0f} kernels and copies per run, "
                f"{out_entry['profile']['gpu_us_per_run']} us of GPU time per run")
            profile_dir = Path(args.profile_dir or Path(args.out) / "profiles")
            profile_dir.mkdir(parents=True, exist_ok=True)
            path = profile_dir / f"profile_{case.replace(':', '_b')}_{spec.replace(':', '_')}_{args.exporter}.txt"
            path.write_text(profile_text(_labelled(case, args.exporter), spec, out_entry))
        except Exception as exc:
            out_entry["profile_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            log(case, spec, "profile failed:", out_entry["profile_error"])
    module.close()


def run_torch_modes(args, case, wrapper, inputs, reference, repeat, row, save):
    device = torch.device(args.torch_device)
    cuda = device.type == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    timer = time_cuda if cuda else (lambda fn, repeat: time_cpu(fn))
    if args.torch_precision == "float32":
        # float32 as torch users run it on a GPU with TF32 allowed (torch.compile's advice):
        # TF32 tensor cores for matmuls, and cuDNN's convs (TF32 by default)
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
        wrapper = wrapper.to(device).float().eval()
        tensors = tuple(t.to(device) for t in inputs.values())
    else:
        wrapper = wrapper.to(device).half().eval()
        tensors = tuple(t.to(device) if not t.is_floating_point() else t.to(device).half() for t in inputs.values())
    row["torch_precision"] = "float32 (TF32)" if args.torch_precision == "float32" else "float16"
    for mode in args.torch_modes:
        entry = row["torch_fp16"].setdefault(mode, {})
        if args.budget_s and time.perf_counter() - START > args.budget_s:
            entry["error"] = f"skipped: past --budget-s {args.budget_s}"
            log(case, "torch", mode, entry["error"])
            continue
        try:
            torch._dynamo.reset()
            if mode == "eager":
                fn = wrapper
            else:
                fn = torch.compile(wrapper, mode=None if mode == "default" else mode)
            log(case, "torch", mode, "first call" + ("" if mode == "eager" else " (compiling)"))
            with torch.no_grad():
                start = time.perf_counter()
                first = fn(*tensors)
                synchronize()
                entry["compile_s" if mode != "eager" else "first_call_s"] = round(time.perf_counter() - start, 1)
                entry["max_rel_error"] = relative_error(to_numpy(first), reference)
                del first
                for _ in range(3):
                    fn(*tensors)
                entry["ms"] = round(timer(lambda: fn(*tensors), repeat), 4)
            log(case, "torch", mode, f"{entry['ms']} ms, error vs onnxruntime {entry['max_rel_error']:.2e}",
                f"compile {entry.get('compile_s', '-')} s")
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
            log(case, "torch", mode, "FAILED:", entry["error"][:500])
        finally:
            fn = None
            torch._dynamo.reset()
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        save()


def exported(args, case, name, batch, wrapper, inputs, attribute) -> tuple:
    """The case's ONNX file and the record of its export. Under --prebuilt, the export an
    earlier --prebuild process made of the same model (same seeds) is taken as it is."""
    onnx_path = Path(args.workdir) / f"{_stem(args, name, batch)}_{args.exporter}.onnx"
    record_path = onnx_path.with_suffix(".export.json")
    if args.prebuilt and onnx_path.exists() and record_path.exists():
        record = json.loads(record_path.read_text())
        log(case, f"export of the prebuild: {onnx_path} ({record['nodes']} nodes)")
        return onnx_path, record
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    params_m = round(sum(p.numel() for p in wrapper.parameters()) / 1e6, 1)
    log(case, f"export ({params_m}M parameters, inputs {[list(v.shape) for v in inputs.values()]})")
    exporters = {"auto": ("torchscript", "dynamo"), "torchscript": ("torchscript",), "dynamo": ("dynamo",)}
    exporter, seconds, export_errors = export_onnx(wrapper, inputs, onnx_path, exporters[args.exporter])
    import onnx
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    record = {"exporter": exporter, "seconds": round(seconds, 1), "attn_implementation":
              args.export_attn if attribute else None, "nodes": len(graph.node),
              "op_types": dict(Counter(n.op_type for n in graph.node).most_common()),
              "failed_exporters": export_errors}
    log(case, f"exported with {exporter} in {seconds:.1f} s: {len(graph.node)} nodes")
    record_path.write_text(json.dumps(record, indent=1))
    return onnx_path, record


def build_prebuilt(args, case, name, batch, onnx_path, inputs) -> None:
    """--prebuild: build each config and leave the library and its build record where a
    later --prebuilt run of the case finds them (prebuilt_paths)."""
    import onnx
    feed_names = [i.name for i in onnx.load(str(onnx_path), load_external_data=False).graph.input]
    for spec in args.configs:
        library, record = build_byoc(args, case, name, batch, spec, onnx_path,
                                     {k: tuple(inputs[k].shape) for k in feed_names if k in inputs})
        library_path, record_path = prebuilt_paths(args, name, batch, spec)
        library.export_library(library_path)
        record_path.write_text(json.dumps(record, indent=1))
        log(case, spec, f"prebuilt: {library_path}")


def run_case(args, case, row, save):
    name, _, batch = case.partition(":")
    batch = int(batch or 1)
    row.update({"model": name, "batch": batch})
    make, make_inputs, attribute = model_spec(name)
    torch.manual_seed(0)
    model = make(args.export_attn, args.tiny).eval()
    inputs = make_inputs(batch, args.tiny, torch.Generator().manual_seed(1))
    row["inputs"] = {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in inputs.items()}
    row["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
    wrapper = Wrapper(model, inputs, attribute).eval()
    onnx_path, row["export"] = exported(args, case, name, batch, wrapper, inputs, attribute)
    if args.prebuild:
        build_prebuilt(args, case, name, batch, onnx_path, inputs)
        return

    import onnxruntime as ort
    start = time.perf_counter()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feed_names = [i.name for i in session.get_inputs()]
    reference = session.run(None, {k: inputs[k].numpy() for k in feed_names})[0].astype(np.float32)
    del session
    with torch.no_grad():
        torch_fp32 = to_numpy(wrapper(*inputs.values()))
    row["reference"] = {"onnxruntime_s": round(time.perf_counter() - start, 1), "max_abs": float(np.abs(reference).max()),
                        "onnx_inputs": feed_names, "torch_fp32_vs_ort": relative_error(torch_fp32, reference)}
    log(case, f"onnxruntime reference {list(reference.shape)}, max |out| {row['reference']['max_abs']:.3g}, "
        f"torch fp32 vs ort {row['reference']['torch_fp32_vs_ort']:.2e}")
    unused = [k for k in inputs if k not in feed_names]
    if unused:
        row["reference"]["inputs_dropped_by_export"] = unused
    save()

    cuda = torch.cuda.is_available()
    repeat = 200 if batch == 1 else 50
    for spec in args.configs:
        entry = row["byoc"].setdefault(spec, {})
        try:
            run_byoc(args, case, name, batch, spec, onnx_path, {k: inputs[k] for k in feed_names}, reference, repeat,
                     entry)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:3000]}"
            log(case, spec, "byoc FAILED:", entry["error"][:800])
            if args.debug:
                traceback.print_exc()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        save()

    modes = [m for m in args.torch_modes]
    if modes and args.torch_device.startswith("cuda") and not cuda:
        row["torch_fp16"] = {m: {"error": "skipped: no CUDA device"} for m in modes}
        return
    if modes:
        if attribute and args.torch_attn != args.export_attn:
            try:  # the same weights, with the attention torch users get by default
                torch_model = make(args.torch_attn, args.tiny)
                torch_model.load_state_dict(model.state_dict())
                model = torch_model.eval()
            except Exception as exc:
                row["torch_attn_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
                log(case, f"torch with attn_implementation={args.torch_attn} failed, torch runs the export's:",
                    row["torch_attn_error"])
        if attribute:
            row["torch_attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        run_torch_modes(args, case, Wrapper(model, inputs, attribute).eval(), inputs, reference, repeat, row, save)


# --- results -------------------------------------------------------------------------------

def versions() -> dict:
    result = {"python": sys.version.split()[0], "torch": torch.__version__}
    for package in ("transformers", "torchvision", "onnxruntime", "onnx"):
        try:
            result[package] = __import__(package).__version__
        except Exception as exc:
            result[package] = f"unavailable ({type(exc).__name__})"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        result["byoc_commit"] = (commit + ("+dirty" if dirty else "")) if commit else None
    except Exception:
        result["byoc_commit"] = None
    # BYOC_GIT_COMMIT (the caller's `git rev-parse HEAD`) first: a working tree copied to the
    # GPU machine may carry a .git of an older commit, which would name the wrong code
    result["byoc_commit"] = os.environ.get("BYOC_GIT_COMMIT") or result["byoc_commit"] or "unknown (no .git)"
    # the code itself, for a checkout copied without .git: sha256 over byoc/, backends/, templates/
    digest = hashlib.sha256()
    for folder in ("byoc", "backends", "templates", "build_configs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
    result["byoc_source_sha256"] = digest.hexdigest()[:16]
    return result


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu (no CUDA device)"


def _cell(entry):
    if not entry:
        return "-"
    if entry.get("ms") is None:
        return "failed" if "error" in entry and not entry["error"].startswith("skipped") else "skipped"
    compile_s = entry.get("compile_s")
    return f"{entry['ms']:.3f}" + (f" ({compile_s:.0f} s)" if compile_s is not None else "")


def write_results(out: Path, header: dict, rows: list, torch_modes: list) -> None:
    result = dict(header, rows=rows)
    (out / "real_models.json").write_text(json.dumps(result, indent=2))
    modes = list(dict.fromkeys(list(torch_modes) + [m for r in rows for m in r.get("torch_fp16", {})]))
    devices = {r.get("device") for r in rows}
    v = header["versions"]
    lines = [f"# Real models ({header['device']}, {header['date']})", "",
             f"torch {v['torch']}, transformers {v['transformers']}, torchvision {v['torchvision']}, onnxruntime "
             f"{v['onnxruntime']}, onnx {v['onnx']}; byoc {v['byoc_commit']} (source {v['byoc_source_sha256']}).",
             "",
             "Random weights (fixed seeds) from the config classes; float32 ONNX (opset 17), the reference is "
             "onnxruntime CPU on it. byoc: `module.run(**inputs)` with the same torch CUDA tensors each call "
             "(out=: into a preallocated output); torch " + ("float32 with TF32 allowed" if any(r.get("torch_precision", "").startswith("float32") for r in rows) else "fp16") + " on the GPU, `ms (compile s)`. ms per run, median "
             f"of 5 rounds. Error: max |byoc - ort| / max |ort| (pass <= {TOLERANCE:g}); torch eager fp16's "
             "error beside it is what fp16 alone costs this model. Best torch / byoc > 1: byoc is faster. "
             "Kernels/run: kernel launches and copies of one byoc run (real_models_profiles.txt). Build s: a "
             "cold build (`gpu_session.sh suite` builds every case first, one after another, then one process "
             "times every case). Exporter: the torch.onnx exporter that wrote the model (TorchScript, "
             "`dynamo=False`, unless asked for dynamo or TorchScript cannot export it).", ""]
    head = ["case", "exporter"] + (["device"] if len(devices) > 1 else []) + ["byoc config", "byoc ms", "byoc out= ms"] + \
        [f"torch {m}" for m in modes] + ["best torch", "best torch / byoc", "error vs ort",
                                         "torch eager fp16 error", "build s", "kernels/run"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes, misses = [], []
    for row in rows:
        torch_entries = row.get("torch_fp16", {})
        timed = {m: e["ms"] for m, e in torch_entries.items() if e.get("ms") is not None}
        best = min(timed.items(), key=lambda kv: kv[1]) if timed else None
        configs = row.get("byoc") or {"-": {"error": row.get("error", "not run")}}
        for spec, entry in configs.items():
            ms = entry.get("ms")
            ratio = f"{best[1] / ms:.2f}" if best and ms else "-"
            error = entry.get("max_rel_error")
            error_cell = "-" if error is None else f"{error:.1e}" + ("" if error <= TOLERANCE else " FAIL")
            profile = entry.get("profile") or {}
            exporter = (row.get("export") or {}).get("exporter", "-")
            if row.get("exporter_asked", "auto") != "auto":
                exporter += f" (asked: {row['exporter_asked']})"
            cells = [row["case"] + (" (tiny)" if row.get("tiny") else ""), exporter] + \
                ([row.get("device", "?")] if len(devices) > 1 else []) + \
                [spec, f"{ms:.3f}" if ms else ("failed" if "error" in entry else "-"),
                 f"{entry['ms_out']:.3f}" if entry.get("ms_out") else "-"] + \
                [_cell(torch_entries.get(m)) for m in modes] + \
                [f"{best[1]:.3f} ({best[0]})" if best else "-", ratio, error_cell,
                 f"{torch_entries['eager']['max_rel_error']:.1e}"
                 if torch_entries.get("eager", {}).get("max_rel_error") is not None else "-",
                 f"{entry['build_s']:.0f}" if entry.get("build_s") is not None else "-",
                 f"{profile['kernels_per_run']:.0f}" if profile else "-"]
            lines.append("| " + " | ".join(cells) + " |")
            if best and ms and best[1] / ms < SPEED_TARGET and profile.get("top"):
                misses.append(_miss_note(_row_label(row), spec,
                                         best[1] / ms, profile))
            if entry.get("error") and spec != "-":
                notes.append(f"- {_row_label(row)} byoc {spec}: "
                             f"{entry['error'][:300]}")
        for mode, entry in torch_entries.items():
            if entry.get("error") and not entry["error"].startswith("skipped"):
                notes.append(f"- {_row_label(row)} torch {mode}: "
                             f"{entry['error'][:300]}")
        if row.get("error"):
            notes.append(f"- {_row_label(row)}: {row['error'][:300]}")
    if misses:
        lines += ["", f"Rows under {SPEED_TARGET}x the best torch mode, and where their GPU time goes (the "
                  "kernels taking most of a run; real_models_profiles.txt has every kernel):", ""] + misses
    if notes:
        lines += ["", "Failures:", ""] + [n.replace("\n", " ") for n in notes]
    (out / "real_models.md").write_text("\n".join(lines) + "\n")
    texts = [profile_text(_row_label(row), spec, entry)
             for row in rows for spec, entry in row.get("byoc", {}).items()]
    (out / "real_models_profiles.txt").write_text("\n".join(t for t in texts if t))


def _labelled(case: str, exporter_asked: str) -> str:
    """A case as notes and profiles name it: with the exporter asked for, where not auto
    (a table may hold a case's rows of both exporters)."""
    return case if exporter_asked == "auto" else f"{case} ({exporter_asked})"


def _row_label(row: dict) -> str:
    return _labelled(row["case"], row.get("exporter_asked", "auto"))


def _miss_note(case: str, spec: str, ratio: float, profile: dict, kernels: int = 3) -> str:
    """One line for a row under SPEED_TARGET: its top kernels a run, each with its share of
    the run: exposed time where the profile has it (what the kernel adds to the run), else
    GPU time (which includes programmatic-launch waits: shares are rough)."""
    if "busy_us_per_run" in profile:
        total, key, what = profile["busy_us_per_run"] or 1.0, "exposed_us", "exposed"
    else:
        total, key, what = profile.get("gpu_us_per_run") or sum(k["total_us"] for k in profile["top"]) or 1.0, \
            "total_us", "GPU time"
    tops = [f"`{_kernel_name(k['name'])}` x{k['per_run']:.0f}, {k[key]:.0f} us {what} ({100 * k[key] / total:.0f}%)"
            for k in profile["top"][:kernels]]
    return f"- {case} {spec}: {ratio:.2f}x; " + "; ".join(tops)


def _kernel_name(name: str) -> str:
    """A kernel's name without its argument list and namespaces, as a timeline reads it."""
    short = name.replace("(anonymous namespace)::", "").removeprefix("void ").split("(")[0].split("<")[0]
    return short.split("::")[-1].strip() or name[:60]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="model:batch (default: the suite)")
    parser.add_argument("--out", default="/tmp/byoc-real-out")
    parser.add_argument("--configs", nargs="+", default=["cuda_sm90"], help="byoc configs (name or name:variant)")
    parser.add_argument("--torch-modes", default=",".join(TORCH_MODES),
                        help="comma-separated among eager,default,reduce-overhead,max-autotune-no-cudagraphs,"
                             "max-autotune; 'none' for no torch runs")
    parser.add_argument("--merge-from", metavar="REAL_MODELS_JSON",
                        help="keep this earlier result's rows of the cases not run now")
    parser.add_argument("--workdir", default="/tmp/byoc-real")
    parser.add_argument("--tuning-db", default=str(ROOT / "backends/cutlass/tuning_sm90.json"),
                        help="CUTLASS tuning database for the cuda configs ('' for none)")
    parser.add_argument("--profile", default="false", choices=("auto", "false", "true"),
                        help="tune GEMMs missing from the database (auto/true) or take the heuristic's (false)")
    parser.add_argument("--precision", help="override the config's precision (e.g. float16 with --configs cpu)")
    parser.add_argument("--torch-precision", default="float16", choices=("float16", "float32"),
                        help="torch's runs: float16 (model.half()), or float32 with TF32 allowed (to compare with "
                             "the `default` config, which builds float32 with TF32); the JSON's rows say which "
                             "(torch_precision; the key stays torch_fp16)")
    parser.add_argument("--exporter", default="auto", choices=("auto", "torchscript", "dynamo"),
                        help="torch.onnx exporter (auto: TorchScript, dynamo where that fails or is gone)")
    parser.add_argument("--export-attn", default="eager", help="transformers attn_implementation for the export")
    parser.add_argument("--torch-attn", default="sdpa", help="transformers attn_implementation for torch's runs")
    parser.add_argument("--tiny", action="store_true", default=bool(os.environ.get("BYOC_REAL_TINY")),
                        help="2 layers, hidden 64, seq 32, 64x64 images (a CPU check of the exports and builds)")
    parser.add_argument("--budget-s", type=float,
                        help="start no case and no torch mode after this many seconds (the device's command limit)")
    parser.add_argument("--torch-device", default="cuda", help="where torch's fp16 runs go (cpu: to check the script)")
    parser.add_argument("--profile-dir", help="per-case kernel profiles (default: OUT/profiles)")
    parser.add_argument("--prebuild", action="store_true",
                        help="only export the cases and build them (WORKDIR/prebuilt/), for a later --prebuilt run: "
                             "the builds of a suite run side by side, in several processes, then one process times "
                             "every case with nothing else on the machine (bench/gpu_session.sh suite)")
    parser.add_argument("--prebuilt", action="store_true",
                        help="take the exports and libraries an earlier --prebuild left, where there are any")
    parser.add_argument("--compile-jobs", type=int, help="the build config's compile_jobs (parallel nvcc jobs)")
    parser.add_argument("--debug", action="store_true", help="print tracebacks of failures")
    parser.add_argument("--build-log", help="append the builds' progress (the byoc.build logger) to this file")
    return parser.parse_args()


def main():
    args = parse_args()
    args.torch_modes = [] if args.torch_modes in ("", "none") else [m.strip() for m in args.torch_modes.split(",")]
    args.tuning_db = args.tuning_db or None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.build_log:  # where a long build's time goes, kept if the command is cut off
        import logging
        handler = logging.FileHandler(args.build_log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logging.getLogger("byoc.build").addHandler(handler)
        logging.getLogger("byoc.build").setLevel(logging.INFO)
    header = {"device": device_name(), "date": datetime.date.today().isoformat(), "versions": versions(),
              "tolerance": TOLERANCE}
    log("device", header["device"], "versions", header["versions"])
    cases = list(dict.fromkeys(args.cases))
    rows = []
    if args.merge_from and Path(args.merge_from).exists():
        earlier = json.loads(Path(args.merge_from).read_text())
        for row in earlier.get("rows", []):
            rows.append(row)  # rows of the cases run now are replaced in place, once measured
        log(f"{len(rows)} rows in {args.merge_from}: {', '.join(r.get('case', '?') for r in rows)}")

    def save():
        if not args.prebuild:  # a prebuild measures nothing; the --prebuilt run writes the results
            write_results(out, header, rows, args.torch_modes)

    for case in cases:
        row = {"case": case, "exporter_asked": args.exporter, "device": header["device"], "date": header["date"],
               "tiny": args.tiny,
               "versions": {k: header["versions"][k] for k in ("torch", "transformers", "torchvision", "byoc_commit")},
               "byoc": {}, "torch_fp16": {}}
        if args.budget_s and time.perf_counter() - START > args.budget_s:
            log("==", case, f"skipped: past --budget-s {args.budget_s} (an earlier row of it is kept)")
            continue
        # one row per case and exporter asked for (a table may hold both exporters' rows)
        same = [i for i, r in enumerate(rows) if r.get("case") == case and bool(r.get("tiny")) == args.tiny
                and r.get("exporter_asked", "auto") == args.exporter]
        if same:  # in the earlier row's place
            rows[same[0]] = row
            rows = [r for i, r in enumerate(rows) if i not in same[1:]]
        else:
            rows.append(row)
        log("==", case)
        try:
            run_case(args, case, row, save)
        except Exception as exc:  # one case failing must not lose the others
            row["error"] = f"{type(exc).__name__}: {str(exc)[:3000]}"
            log(case, "FAILED:", row["error"][:800])
            if args.debug:
                traceback.print_exc()
        gc.collect()
        if torch.cuda.is_available():
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        save()
    save()
    if args.prebuild:
        log("done: prebuilt", ", ".join(cases))
        return
    log("done:", out / "real_models.md")
    print((out / "real_models.md").read_text(), flush=True)


if __name__ == "__main__":
    main()
