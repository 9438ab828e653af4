"""The cudnn backend's plan choice at build time: each conv's cuDNN engines timed on this
GPU, the fastest kept in the cost store (byoc/costs.py) under the GPU's name, cuDNN's
version and the conv's description, so that the model's create builds that plan and no
later build measures it again.

    choose_engines(convs, target) -> [(engine global index or -1, microseconds), ...]

The same times are what a candidate of the cudnn backend costs under `partition: measured`
(known_cost): its convs' plans, all of a build's candidates timed in one process
(learn_costs), with no candidate library built.

Timing runs in a child process (`python -m byoc.backends.cudnn.plans`): a library of the
engine alone (engine/cudnn_conv.cc, byoc_cudnn_conv_time_plans) loaded there, so that a
fault in a driver or cuDNN costs the measurement, not the build. Where the build cannot
measure (no GPU of the target's arch, `plan: heuristic`) or a conv has no stored entry,
-1: the model's create takes the heuristic's first plan that builds."""
from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from byoc.errors import BuildError

# the fields of byoc_cudnn.h's ByocCudnnConv, in order
_SHAPE_FIELDS = ("dtype", "batch", "height", "width", "channels", "out_channels", "kernel_h", "kernel_w", "groups",
                 "out_h", "out_w", "strides", "pads", "dilations", "has_bias", "has_residual", "activation",
                 "engine", "workspace_limit")
MAX_PLANS = 12  # engines timed per conv: the heuristic's order puts the likely winners first
RUNS = 20


class ConvShape(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32)] + \
        [(name, ctypes.c_int64) for name in ("batch", "height", "width", "channels", "out_channels", "kernel_h",
                                             "kernel_w", "groups", "out_h", "out_w")] + \
        [("strides", ctypes.c_int64 * 2), ("pads", ctypes.c_int64 * 4), ("dilations", ctypes.c_int64 * 2),
         ("has_bias", ctypes.c_int32), ("has_residual", ctypes.c_int32), ("activation", ctypes.c_int32),
         ("engine", ctypes.c_int64), ("workspace_limit", ctypes.c_int64)]

    @classmethod
    def of(cls, conv: dict) -> "ConvShape":
        shape = cls()
        for name in _SHAPE_FIELDS:
            value = conv[name]
            if isinstance(value, list):
                getattr(shape, name)[:] = value
            else:
                setattr(shape, name, value)
        return shape


def plan_key(conv: dict, version: str) -> str:
    """The store's key of a conv's plan: cuDNN's version and every field a plan depends on."""
    fields = {name: conv[name] for name in _SHAPE_FIELDS if name != "engine"}
    return f"cudnn.conv:{version}:" + json.dumps(fields, sort_keys=True, separators=(",", ":"))


def header_version() -> str:
    """cuDNN's version by the headers the build compiles against (cudnn_version.h), e.g.
    "9.28.1": the library the build links and times."""
    from byoc.toolchain import cudnn_include_dirs
    for directory in cudnn_include_dirs():
        path = Path(directory) / "cudnn_version.h"
        if path.is_file():
            text = path.read_text(errors="replace")
            parts = [re.search(rf"#define\s+CUDNN_{name}\s+(\d+)", text) for name in ("MAJOR", "MINOR", "PATCHLEVEL")]
            if all(parts):
                return ".".join(match.group(1) for match in parts)
    return "unknown"


def _measurable_store(target):
    """(cost store, device key, cuDNN version) where this build can time plans: a GPU of
    the target's arch visible and `plan: auto`; else None."""
    from byoc.target import visible_gpu_arch, visible_gpu_name
    if target.attrs.get("plan", "auto") == "heuristic":
        return None
    gpu = visible_gpu_name()
    if gpu is None or visible_gpu_arch() != target.device.attrs.get("arch"):
        return None
    from byoc.costs import CostStore
    return CostStore(), f"cuda:{gpu}", header_version()


def stored_engines(convs: list, target, where=None) -> list:
    """(engine, microseconds) per conv as the cost store has it for the visible GPU, (-1,
    0.0) where it has none (or the build cannot measure)."""
    where = where or _measurable_store(target)
    choices = [(-1, 0.0)] * len(convs)
    if where is None:
        return choices
    store, device, version = where
    for index, conv in enumerate(convs):
        entry = store.entry(device, plan_key(conv, version)) or {}
        if isinstance(entry.get("engine"), int) and isinstance(entry.get("us"), (int, float)):
            choices[index] = (entry["engine"], float(entry["us"]))
    return choices


def failed_plans(convs: list, target) -> list:
    """Per conv, why none of cuDNN's plans ran it on the visible GPU as the cost store has
    it, or None."""
    where = _measurable_store(target)
    if where is None:
        return [None] * len(convs)
    store, device, version = where
    return [store.failed(device, plan_key(conv, version)) for conv in convs]


def choose_engines(convs: list, target) -> list:
    """(engine, microseconds) per conv: the stored or, timed now, the fastest on the visible
    GPU; (-1, 0.0) where there is none to measure on or the target says `plan: heuristic`."""
    where = _measurable_store(target)
    if not convs or where is None:
        return [(-1, 0.0)] * len(convs)
    from byoc.costs import provenance
    store, device, version = where
    missing = {}
    for conv in convs:
        key = plan_key(conv, version)
        if store.entry(device, key) is None:
            missing.setdefault(key, conv)
    if missing:
        progress = getattr(target, "progress", None)
        if progress is not None:
            progress.stage(f"timing cuDNN plans of {len(missing)} convs on {device[5:]}")
        for key, timings in zip(missing, measure(list(missing.values()), target)):
            if timings is None:
                continue  # the timing process failed (warned): nothing learned, nothing stored
            if timings:
                engine, us = min(timings, key=lambda timing: timing[1])
                store.record(device, key, us, "cudnn", f"conv2d plan: engine {engine} of {len(timings)} timed",
                             details={**provenance(target.device), "engine": engine,
                                      "timed": {str(e): round(t, 3) for e, t in timings}})
            else:
                store.record_failed(device, key, "no cuDNN plan ran", "cudnn", "conv2d plan", provenance(target.device))
        store.save()
    return stored_engines(convs, target, where)


def probe_library(target) -> Path:
    """The engine alone as a shared library (the object cache keeps its object), in the
    build's directory."""
    from byoc.toolchain import compile_units, cuda_link_flags, link_shared

    from .codegen import engine_units
    workdir = Path(target.workdir) / "cudnn_plans"
    workdir.mkdir(parents=True, exist_ok=True)
    objects = compile_units(engine_units(target), workdir)
    return link_shared(objects, workdir / "cudnn_probe.so", [], cuda_link_flags(["cudnn"]))


def measure(convs: list, target) -> list:
    """Each conv's [(engine, microseconds)] timed in a child process; [] for a conv none of
    whose plans ran; None for every conv where the child failed (the build goes on with the
    heuristic's plans, warned, and stores nothing: the next build tries again)."""
    import warnings

    from byoc.costs import DEVICE_TIMING
    from byoc.errors import ByocWarning
    library = probe_library(target)
    with tempfile.TemporaryDirectory(prefix="byoc-cudnn-plans-") as scratch:
        request, answer = Path(scratch) / "convs.json", Path(scratch) / "timings.json"
        request.write_text(json.dumps([{name: conv[name] for name in _SHAPE_FIELDS} for conv in convs]))
        with DEVICE_TIMING:
            try:
                done = subprocess.run([sys.executable, "-m", __name__, str(library), str(request), str(answer)],
                                      capture_output=True, text=True, timeout=120 + 10 * len(convs))
            except subprocess.TimeoutExpired:
                done = None
        if done is None or done.returncode != 0 or not answer.is_file():
            detail = "timed out" if done is None else (done.stderr.strip().splitlines() or ["no output"])[-1]
            warnings.warn(f"timing cuDNN's plans failed ({detail}); the model's convs take the heuristic's plans",
                          ByocWarning, stacklevel=2)
            return [None for _ in convs]
        timings = json.loads(answer.read_text())
    return [[(int(engine), float(us)) for engine, us in conv] for conv in timings]


def _time_in_this_process(library: str, request: str, answer: str) -> None:
    from byoc.runtime.shared_libraries import preload_needed
    preload_needed(library)
    engine = ctypes.CDLL(library)
    engine.byoc_cudnn_conv_time_plans.argtypes = [ctypes.POINTER(ConvShape), ctypes.c_int, ctypes.c_int,
                                                  ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double),
                                                  ctypes.POINTER(ctypes.c_int)]
    engine.byoc_cudnn_last_error.restype = ctypes.c_char_p
    results = []
    for conv in json.loads(Path(request).read_text()):
        engines, times, count = (ctypes.c_int64 * MAX_PLANS)(), (ctypes.c_double * MAX_PLANS)(), ctypes.c_int(0)
        status = engine.byoc_cudnn_conv_time_plans(ctypes.byref(ConvShape.of(conv)), MAX_PLANS, RUNS, engines, times,
                                                   ctypes.byref(count))
        if status != 0:
            print(f"cudnn plans: {engine.byoc_cudnn_last_error().decode(errors='replace')}", file=sys.stderr)
        results.append([(engines[i], times[i]) for i in range(count.value)])
    Path(answer).write_text(json.dumps(results))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: python -m byoc.backends.cudnn.plans LIBRARY CONVS.json TIMINGS.json")
    try:
        _time_in_this_process(*sys.argv[1:])
    except (OSError, BuildError) as error:
        raise SystemExit(f"cudnn plans: {error}") from None
