"""The cudnn backend's plan choice at build time: each conv's cuDNN engines timed on this
GPU, the fastest kept in the cost store (byoc/costs.py) under the GPU's name, cuDNN's
version and the conv's description, so that the model's create builds that plan and no
later build measures it again.

    choose_engines(convs, target) -> [(engine global index or -1, microseconds), ...]

The same times are what a candidate of the cudnn backend costs under `partition: measured`
(known_cost): its convs' plans, all of a build's candidates timed in one process
(learn_costs), with no candidate library built.

Timing runs in a child process (`python -m byoc.backends.cudnn.plans`): a library of the
engine alone (engine/cudnn_conv.cc) loaded there, so that a fault in a driver or cuDNN
costs the measurement, not the build. Up to PREPARING_THREADS convs' plans are built at
once, in threads (one by default; BYOC_CUDNN_PLAN_THREADS asks for more); then each conv's
are timed alone, and its line written. Where the build cannot
measure (no GPU of the target's arch, `plan: heuristic`) or a conv has no stored entry,
-1: the model's create takes the heuristic's first plan that builds."""
from __future__ import annotations

import ctypes
import functools
import json
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from byoc.errors import BuildError

# the fields of byoc_cudnn.h's ByocCudnnConv, in order
_SHAPE_FIELDS = ("dtype", "batch", "height", "width", "channels", "out_channels", "kernel_h", "kernel_w", "groups",
                 "out_h", "out_w", "strides", "pads", "dilations", "has_bias", "has_residual", "activation",
                 "engine", "workspace_limit", "tf32")
MAX_PLANS = 12  # engines timed per conv: the heuristic's order puts the likely winners first
RUNS = 20


class ConvShape(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32)] + \
        [(name, ctypes.c_int64) for name in ("batch", "height", "width", "channels", "out_channels", "kernel_h",
                                             "kernel_w", "groups", "out_h", "out_w")] + \
        [("strides", ctypes.c_int64 * 2), ("pads", ctypes.c_int64 * 4), ("dilations", ctypes.c_int64 * 2),
         ("has_bias", ctypes.c_int32), ("has_residual", ctypes.c_int32), ("activation", ctypes.c_int32),
         ("engine", ctypes.c_int64), ("workspace_limit", ctypes.c_int64), ("tf32", ctypes.c_int32)]

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


# The engine's graph and its timing as the stored plans were made: a change to either
# (engine/cudnn_conv.cc) bumps it, and plans timed before are timed again.
PLAN_FORMAT = 4  # 3: plans checked before their timing (refused ones are no candidates); 4: timed fenced
# why a plan's check refused it (byoc_cudnn.h's ByocCudnnPlanVerdict)
REFUSALS = {1: "its output depends on what the output or workspace held, or on its runs before",
            2: "its output differs from the other plans'", 3: "NaN or infinity from finite operands"}


def plan_key(conv: dict, version: str) -> str:
    """The store's key of a conv's plan: the plans' format, cuDNN's version and every field
    a plan depends on."""
    # tf32 only where it changes the plans (float32, dtype 0): a float16 conv's are the same
    fields = {name: conv[name] for name in _SHAPE_FIELDS if name != "engine" and (name != "tf32" or conv["dtype"] == 0)}
    return f"cudnn.conv:v{PLAN_FORMAT}:{version}:" + json.dumps(fields, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=None)
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


# path -> (the file's mtime and size when read, the CostStore read): the lookups of a
# measured build's candidates (one known_cost a candidate) read the store once, not once each
_READ_STORES: dict = {}
_READ_LOCK = threading.Lock()


def _read_store(path):
    """The cost store at `path` as the file is now, read again only when it changed; for
    lookups only (choose_engines records into a CostStore of its own)."""
    from byoc.costs import CostStore
    try:
        stat = path.stat()
        signature = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        signature = None
    with _READ_LOCK:
        cached = _READ_STORES.get(path)
        if cached is None or signature is None or cached[0] != signature:
            cached = _READ_STORES[path] = (signature, CostStore(path))
        return cached[1]


def _measurable_store(target, for_lookup: bool = False):
    """(cost store, device key, cuDNN version) where this build can time plans: a GPU of
    the target's arch visible and `plan: auto`; else None."""
    from byoc.target import visible_gpu_arch, visible_gpu_name
    if target.attrs.get("plan", "auto") == "heuristic":
        return None
    gpu = visible_gpu_name()
    if gpu is None or visible_gpu_arch() != target.device.attrs.get("arch"):
        return None
    from byoc.costs import CostStore, default_store_path
    store = _read_store(default_store_path()) if for_lookup else CostStore()
    return store, f"cuda:{gpu}", header_version()


def stored_engines(convs: list, target, where=None) -> list:
    """(engine, microseconds) per conv as the cost store has it for the visible GPU, (-1,
    0.0) where it has none (or the build cannot measure)."""
    where = where or _measurable_store(target, for_lookup=True)
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
    where = _measurable_store(target, for_lookup=True)
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
        for key, measured in zip(missing, measure(list(missing.values()), target)):
            if measured is None:
                continue  # the timing process failed (warned): nothing learned, nothing stored
            timings, refused = measured
            refusals = {str(engine): REFUSALS.get(verdict, f"verdict {verdict}") for engine, verdict in refused}
            if timings:
                engine, us = min(timings, key=lambda timing: timing[1])
                store.record(device, key, us, "cudnn", f"conv2d plan: engine {engine} of {len(timings)} timed",
                             details={**provenance(target.device, "cudnn"), "engine": engine,
                                      "timed": {str(e): round(t, 3) for e, t in timings},
                                      **({"refused": refusals} if refusals else {})})
            else:
                reason = "no cuDNN plan ran" + (f" that passed its check ({len(refusals)} refused: "
                                               f"{'; '.join(f'engine {e}: {r}' for e, r in refusals.items())})"
                                               if refusals else "")
                store.record_failed(device, key, reason, "cudnn", "conv2d plan", provenance(target.device, "cudnn"))
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
    """Each conv's ([(engine, microseconds)], [(engine, verdict)]) timed in a child process:
    the plans that passed their check, timed, and those it refused (REFUSALS); no timings
    for a conv none of whose plans ran; None for a conv the child did not time (it failed there, or earlier:
    crashed, timed out), warned: the build takes the heuristic's plan for it and stores
    nothing, so the next build tries again. The child writes a line per conv as it goes, so
    what it timed before failing is kept."""
    import os
    import warnings

    import byoc
    from byoc.costs import DEVICE_TIMING
    from byoc.errors import ByocWarning
    library = probe_library(target)
    # byoc importable in the child as here (a checkout on sys.path need not be installed)
    roots = [str(Path(path).parent) for path in byoc.__path__]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(roots + [os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)}
    with tempfile.TemporaryDirectory(prefix="byoc-cudnn-plans-") as scratch:
        request, answer = Path(scratch) / "convs.json", Path(scratch) / "timings.jsonl"
        request.write_text(json.dumps([{name: conv[name] for name in _SHAPE_FIELDS} for conv in convs]))
        with DEVICE_TIMING:
            try:
                done = subprocess.run([sys.executable, "-m", __name__, str(library), str(request), str(answer)],
                                      capture_output=True, text=True, timeout=120 + 30 * len(convs), env=environment)
            except subprocess.TimeoutExpired:
                done = None
        timings = [None] * len(convs)
        for line in answer.read_text().splitlines() if answer.is_file() else []:
            try:
                index, timed, refused = json.loads(line)
                timings[index] = None if timed is None else \
                    ([(int(engine), float(us)) for engine, us in timed],
                     [(int(engine), int(verdict)) for engine, verdict in refused])
            except (ValueError, TypeError, IndexError):
                break  # a line cut short by a crash: the ones before it stand
        if done is None or done.returncode != 0 or None in timings:
            detail = "timed out" if done is None else \
                (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            untimed = sum(1 for timing in timings if timing is None)
            warnings.warn(f"timing cuDNN's plans failed for {untimed} of {len(convs)} convs ({detail}); they take "
                          f"the heuristic's plans", ByocWarning, stacklevel=2)
    return timings


# Convs whose plans are built side by side in the timing child (each in a thread of its own,
# with its own cuDNN handle), while the timing that follows runs one conv at a time, nothing
# else on the GPU or the CPU beside it. One: on an H200 (16 cores) EfficientNet-B0 b32's first
# 32 convs took 23.1 s with 16 threads and 13.6 s with one (the same engine for 28 of them,
# best times alike: bench/results/cudnn_plan_timing_h200.json), so threads are opt-in.
PREPARING_THREADS = 1


def _time_in_this_process(library: str, request: str, answer: str) -> None:
    import concurrent.futures
    import os

    from byoc.runtime.shared_libraries import preload_needed
    preload_needed(library)
    engine = ctypes.CDLL(library)  # a CDLL's calls release the GIL: the threads build plans at once
    engine.byoc_cudnn_conv_prepare_plans.argtypes = [ctypes.POINTER(ConvShape), ctypes.c_int,
                                                     ctypes.POINTER(ctypes.c_void_p)]
    engine.byoc_cudnn_conv_time_prepared.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                                     ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int32),
                                                     ctypes.POINTER(ctypes.c_int)]
    engine.byoc_cudnn_conv_release_plans.argtypes = [ctypes.c_void_p]
    engine.byoc_cudnn_last_error.restype = ctypes.c_char_p

    def last_error() -> str:  # the calling thread's
        return engine.byoc_cudnn_last_error().decode(errors="replace")

    def prepare(conv: dict) -> tuple:
        prepared = ctypes.c_void_p()
        status = engine.byoc_cudnn_conv_prepare_plans(ctypes.byref(ConvShape.of(conv)), MAX_PLANS,
                                                      ctypes.byref(prepared))
        return (prepared, None) if status == 0 else (None, last_error())

    def timed(prepared) -> tuple:
        """(([(engine, us)] of the plans that passed their check, [(engine, verdict)] of the
        others), None), or (None, why the timing failed)."""
        engines, times = (ctypes.c_int64 * MAX_PLANS)(), (ctypes.c_double * MAX_PLANS)()
        verdicts, count = (ctypes.c_int32 * MAX_PLANS)(), ctypes.c_int(0)
        try:
            status = engine.byoc_cudnn_conv_time_prepared(prepared, RUNS, engines, times, verdicts, ctypes.byref(count))
        finally:
            engine.byoc_cudnn_conv_release_plans(prepared)
        if status != 0:
            return None, last_error()
        plans = range(count.value)
        return ([(engines[i], times[i]) for i in plans if verdicts[i] == 0],
                [(engines[i], verdicts[i]) for i in plans if verdicts[i] != 0]), None

    convs = json.loads(Path(request).read_text())
    # BYOC_CUDNN_PLAN_THREADS: another count, to measure what the threads gain (bench/cudnn_plan_timing.py)
    given = os.environ.get("BYOC_CUDNN_PLAN_THREADS", "")
    wanted = int(given) if given.isdigit() and int(given) > 0 else PREPARING_THREADS
    if given and wanted == PREPARING_THREADS and given != str(PREPARING_THREADS):
        print(f"cudnn plans: BYOC_CUDNN_PLAN_THREADS={given!r} is not a positive integer; "
              f"{PREPARING_THREADS} threads", file=sys.stderr)
    threads = max(1, min(wanted, os.cpu_count() or 1, len(convs)))
    with open(answer, "w") as out, concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for first in range(0, len(convs), threads):
            chunk = list(pool.map(prepare, convs[first:first + threads]))
            for index, (prepared, error) in enumerate(chunk, start=first):
                measured = None
                if error is None:
                    measured, error = timed(prepared)
                if error is not None:  # not "no plan ran": the timing itself failed, and says why
                    print(f"cudnn plans: {error}", file=sys.stderr)
                timings, refused = measured if measured is not None else (None, [])
                out.write(json.dumps([index, timings, refused]) + "\n")
                out.flush()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: python -m byoc.backends.cudnn.plans LIBRARY CONVS.json TIMINGS.jsonl")
    try:
        _time_in_this_process(*sys.argv[1:])
    except (OSError, BuildError) as error:
        raise SystemExit(f"cudnn plans: {error}") from None
