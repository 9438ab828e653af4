"""Families 4 and 5: threads, and a soak of many load/run/close cycles.

Concurrency: 8 threads x 8 Modules of one library, 8 threads sharing one Module (with
and without out=), a Module closed while other threads run it or their own Modules,
load/close churn, two libraries at once, and refused calls interleaved with good ones
(byoc_last_error is per thread: each refusal must carry its own message). Every output
is checked against the reference for that thread's input. On cuda: each thread has its
own stream, libraries with CUDA graphs on and off, and other threads keep CuPy busy on
the legacy default stream meanwhile.

Soak: cycles in one child, measuring the resident set (VmRSS) and the open file
descriptors after a warm-up and at the end; the growth must stay bounded.
"""
from __future__ import annotations

import os
import shutil
import threading
import time

import numpy as np

from . import libraries
from .runner import Case, Outcome, case_dir

FUNCTION = "robustness.cases_concurrency:run_concurrency"
SOAK_FUNCTION = "robustness.cases_concurrency:run_soak"


class _Library:
    """Loads, feeds and checks one library (mlp or multi) on its device."""

    def __init__(self, info: dict):
        self.info = info
        self.kind, self.device, self.tolerance = info["kind"], info["device"], info["tolerance"]
        self._references: dict[int, list] = {}

    def load(self):
        import byoc
        return byoc.load(self.info["path"], weights_path=self.info.get("sidecar"))

    def host_inputs(self, seed: int) -> dict:
        if self.kind == "multi":
            inputs = libraries.multi_inputs(seed)
        else:
            x = libraries.mlp_inputs()[0]["x"]
            inputs = {"x": (x * (1 + 0.1 * seed)).astype(np.float32)}
        return libraries.as_model_dtypes(inputs, self.info["metadata"])

    def inputs(self, seed: int, stream=None) -> dict:
        host = self.host_inputs(seed)
        if self.device != "cuda":
            return host
        import cupy
        with (stream if stream is not None else cupy.cuda.Stream.null):
            return {k: cupy.asarray(v) for k, v in host.items()}

    def reference(self, seed: int) -> list:
        if seed not in self._references:
            host = self.host_inputs(seed)
            if self.kind == "multi":
                self._references[seed] = libraries.multi_reference(**host)
            else:
                import byoc
                module = byoc.from_onnx(libraries.FIXTURES / "mlp.onnx")
                self._references[seed] = [byoc.interpret(module, **{k: v.astype(np.float32) for k, v in host.items()})]
        return self._references[seed]

    def problem(self, outputs, seed: int, stream=None) -> str:
        """'' when the outputs are the reference for input `seed`."""
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        if self.device == "cuda":
            import cupy
            if stream is not None:
                stream.synchronize()
            outputs = [cupy.asnumpy(o) for o in outputs]
        for index, (got, want) in enumerate(zip(outputs, self.reference(seed))):
            got = np.asarray(got)
            if got.shape != want.shape:
                return f"output {index}: shape {got.shape}, expected {want.shape}"
            error = float(np.max(np.abs(got.astype(np.float64) - want)))
            if not error <= self.tolerance * max(1.0, float(np.max(np.abs(want)))):
                return f"output {index} for input {seed}: max abs error {error:.3g}"
        return ""


class _Threads:
    """Runs workers in threads; collects what went wrong (wrong answers, raw errors)."""

    def __init__(self):
        self.problems: list[str] = []
        self.raw: list[str] = []
        self.lock = threading.Lock()

    def wrong(self, text):
        with self.lock:
            self.problems.append(text)

    def run(self, workers, timeout=90.0):
        def guarded(worker, index):
            try:
                worker(index)
            except Exception as error:  # noqa: BLE001 - any escape is a finding
                from byoc.errors import ByocError
                with self.lock:
                    (self.problems if isinstance(error, ByocError) else self.raw).append(
                        f"thread {index}: {type(error).__name__}: {error}")
        threads = [threading.Thread(target=guarded, args=(w, i), daemon=True) for i, w in enumerate(workers)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [i for i, t in enumerate(threads) if t.is_alive()]
        if stuck:
            self.problems.append(f"threads {stuck} still running after {timeout:.0f} s (deadlock?)")

    def outcome(self):
        if self.raw:
            return Outcome("raw", f"{len(self.raw)} thread error(s), e.g. {self.raw[0]}")
        if self.problems:
            return Outcome("wrong", f"{len(self.problems)} problem(s), e.g. {self.problems[0]}")
        return Outcome("correct")


def _streams(library: _Library, count: int, shared: bool = False):
    """One stream per thread; `shared`: one for all, as threads that share a Module must
    (runs of one Module on different streams are the caller's to order: its docstring)."""
    if library.device != "cuda":
        return [None] * count
    import cupy
    if shared:
        return [cupy.cuda.Stream(non_blocking=True)] * count
    return [cupy.cuda.Stream(non_blocking=True) for _ in range(count)]


def _run(module, library, seed, stream, out=None):
    inputs = library.inputs(seed, stream)
    kwargs = {"stream": stream} if stream is not None else {}
    if out is not None:
        kwargs["out"] = out
    return module.run(**inputs, **kwargs)


def _cupy_noise(stop: threading.Event):
    """Keeps the GPU busy on the legacy default stream with CuPy work."""
    import cupy
    with cupy.cuda.Stream.null:
        a = cupy.random.standard_normal((512, 512), dtype=cupy.float32)
        while not stop.is_set():
            a = (a @ a.T) * (1.0 / 512)
            cupy.cuda.Stream.null.synchronize()


def run_concurrency(library: dict, scenario: str, threads: int = 8, runs: int = 50, noise: bool = False,
                    other: dict | None = None):
    lib = _Library(library)
    for seed in range(threads):
        lib.reference(seed)  # before the threads start (the interpreter is not what is tested)
    group = _Threads()
    stop = threading.Event()
    noise_threads = []
    if noise and lib.device == "cuda":
        noise_threads = [threading.Thread(target=_cupy_noise, args=(stop,), daemon=True) for _ in range(2)]
        for thread in noise_threads:
            thread.start()
    try:
        SCENARIOS[scenario](lib, group, threads, runs, other)
    finally:
        stop.set()
        for thread in noise_threads:
            thread.join(10)
    return group.outcome()


def _own_modules(lib, group, threads, runs, other):
    modules = [lib.load() for _ in range(threads)]
    streams = _streams(lib, threads)

    def worker(index):
        for _ in range(runs):
            problem = lib.problem(_run(modules[index], lib, index, streams[index]), index, streams[index])
            if problem:
                group.wrong(f"thread {index}: {problem}")
                return
    group.run([worker] * threads)


def _shared_module(lib, group, threads, runs, other, use_out=False):
    module = lib.load()
    streams = _streams(lib, threads, shared=True)

    def worker(index):
        out = None
        if use_out:
            first = module.run(**lib.inputs(index, streams[index]), **({"stream": streams[index]} if streams[index] else {}))
            out = list(first) if isinstance(first, tuple) else [first]
        for _ in range(runs):
            result = _run(module, lib, index, streams[index], out)
            problem = lib.problem(out if use_out else result, index, streams[index])
            if problem:
                group.wrong(f"thread {index}: {problem}")
                return
    group.run([worker] * threads)


def _close_own_while_others_run(lib, group, threads, runs, other):
    import byoc
    modules = [lib.load() for _ in range(threads)]
    streams = _streams(lib, threads)

    def worker(index):
        for run in range(runs):
            if index == 0 and run == runs // 4:
                modules[0].close()
            try:
                result = _run(modules[index], lib, index, streams[index])
            except byoc.RuntimeError:
                if index == 0 and run >= runs // 4:
                    continue  # its own module is closed: refused, as it must be
                raise
            if index == 0 and run >= runs // 4:
                group.wrong("a closed module still ran")
                return
            problem = lib.problem(result, index, streams[index])
            if problem:
                group.wrong(f"thread {index}: {problem}")
                return
    group.run([worker] * threads)


def _close_shared_while_running(lib, group, threads, runs, other):
    import byoc
    module = lib.load()
    streams = _streams(lib, threads, shared=True)
    started = threading.Barrier(threads + 1)

    def worker(index):
        started.wait()
        for _ in range(runs * 4):
            try:
                result = _run(module, lib, index, streams[index])
            except byoc.RuntimeError as error:
                if "closed" not in str(error):
                    group.wrong(f"thread {index}: refused with {error} (expected 'closed')")
                return
            problem = lib.problem(result, index, streams[index])
            if problem:
                group.wrong(f"thread {index}: {problem}")
                return

    def closer(index):
        started.wait()
        time.sleep(0.01)
        module.close()
    group.run([worker] * threads + [closer])


def _load_churn(lib, group, threads, runs, other):
    streams = _streams(lib, threads)

    def worker(index):
        for _ in range(max(1, runs // 5)):
            module = lib.load()
            problem = lib.problem(_run(module, lib, index, streams[index]), index, streams[index])
            module.close()
            if problem:
                group.wrong(f"thread {index}: {problem}")
                return
    group.run([worker] * threads)


def _two_libraries(lib, group, threads, runs, other):
    second = _Library(other)
    for seed in range(threads):
        second.reference(seed)
    modules = [(lib, lib.load()), (second, second.load())]
    streams = _streams(lib, threads, shared=True)

    def worker(index):
        which, module = modules[index % 2]
        for _ in range(runs):
            problem = which.problem(_run(module, which, index, streams[index]), index, streams[index])
            if problem:
                group.wrong(f"thread {index} ({which.kind}): {problem}")
                return
    group.run([worker] * threads)


def _errors_interleaved(lib, group, threads, runs, other):
    """Refused calls on some threads while others run: each error names its own fault."""
    import byoc
    module = lib.load()
    streams = _streams(lib, threads, shared=True)
    first = next(iter(lib.host_inputs(0)))

    def worker(index):
        for run in range(runs):
            if index % 2:
                inputs = lib.inputs(index, streams[index])
                bad = dict(inputs)
                bad[first] = inputs[first][..., :-1] if inputs[first].ndim else inputs[first]
                bad[first] = bad[first].copy()
                try:
                    module.run(**bad, **({"stream": streams[index]} if streams[index] else {}))
                    group.wrong(f"thread {index}: a wrong shape was accepted")
                    return
                except byoc.RuntimeError as error:
                    if "shape" not in str(error):
                        group.wrong(f"thread {index}: a wrong shape was refused with another error: {error}")
                        return
            else:
                problem = lib.problem(_run(module, lib, index, streams[index]), index, streams[index])
                if problem:
                    group.wrong(f"thread {index}: {problem}")
                    return
    group.run([worker] * threads)


GROUPS = {"8 threads x 8 modules": "own modules", "8 threads share one module": "shared module",
          "8 threads share one module with out=": "shared module", "one module closed while the others run": "close",
          "shared module closed while threads run it": "close", "load/run/close churn": "churn",
          "two libraries at once": "two libraries", "refusals interleaved with runs": "refusals"}

# valid concurrent use only: every run must answer right, so a library that refused every
# run (or every second module) fails these (the suite's positive controls)
VALID = ("8 threads x 8 modules", "8 threads share one module", "8 threads share one module with out=",
         "load/run/close churn", "two libraries at once")

SCENARIOS = {
    "8 threads x 8 modules": _own_modules,
    "8 threads share one module": _shared_module,
    "8 threads share one module with out=": lambda *a: _shared_module(*a, use_out=True),
    "one module closed while the others run": _close_own_while_others_run,
    "shared module closed while threads run it": _close_shared_while_running,
    "load/run/close churn": _load_churn,
    "two libraries at once": _two_libraries,
    "refusals interleaved with runs": _errors_interleaved,
}


# ---- soak ---------------------------------------------------------------------------------

def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _device_used() -> int:
    import cupy
    free, total = cupy.cuda.runtime.memGetInfo()
    return total - free


def run_soak(library: dict, scenario: str, cycles: int, warmup: int = 20, rss_limit_mib: float = 16.0):
    import byoc
    lib = _Library(library)
    lib.reference(0)
    inputs = lib.inputs(0)
    kept = {}
    first = next(iter(inputs))

    def cycle():
        if scenario == "load/run/close":
            module = lib.load()
            result = module.run(**inputs)
            module.close()
        elif scenario == "runs on one module":
            kept.setdefault("module", lib.load())
            result = kept["module"].run(**inputs)
        elif scenario == "refused runs on one module":
            kept.setdefault("module", lib.load())
            bad = dict(inputs)
            bad[first] = inputs[first][..., :-1].copy()
            try:
                kept["module"].run(**bad)
            except byoc.RuntimeError:
                return ""
            return "a wrong shape was accepted"
        elif scenario == "load/run/close of a changed file":
            # a new file at the same path each time: byoc loads it from a private copy
            # (the loader would hand back the first one); each copy must be unloaded again
            path = case_dir() / "changing.so"
            shutil.copyfile(library["path"], case_dir() / "next.so")
            os.replace(case_dir() / "next.so", path)
            module = byoc.load(path, weights_path=library.get("sidecar"))
            result = module.run(**inputs)
            module.close()
        else:
            raise AssertionError(scenario)
        return lib.problem(result, 0)

    for _ in range(warmup):
        problem = cycle()
        if problem:
            return Outcome("wrong", f"during warm-up: {problem}")
    rss, fds = _rss_kib(), _fds()
    device = _device_used() if lib.device == "cuda" else 0
    for index in range(cycles):
        problem = cycle()
        if problem:
            return Outcome("wrong", f"cycle {index}: {problem}")
    grown_mib = (_rss_kib() - rss) / 1024
    grown_fds = _fds() - fds
    grown_device = ((_device_used() - device) / 2**20) if lib.device == "cuda" else 0.0
    report = (f"{cycles} cycles of {scenario}: RSS {grown_mib:+.1f} MiB, open fds {grown_fds:+d}"
              + (f", device memory {grown_device:+.1f} MiB" if lib.device == "cuda" else ""))
    if grown_fds > 2 or grown_mib > rss_limit_mib or grown_device > 64:
        return Outcome("wrong", f"leak: {report}")
    return Outcome("correct", report)


# ---- cases ------------------------------------------------------------------------------------

def generate(libraries_by_kind: dict, everything: bool, device: str = "cpu", graph_variants: dict | None = None
             ) -> list[Case]:
    """graph_variants (cuda): {"graphs on": mlp library, "graphs off": mlp library}."""
    cases = []
    runs = 400 if everything else 100
    variants = graph_variants or {"": libraries_by_kind["mlp"]}
    memory = None if device == "cuda" else 4 << 30
    for variant, mlp in variants.items():
        suffix = f" ({variant})" if variant else ""
        for scenario in SCENARIOS:
            for kind, library in (("mlp", mlp), ("multi", libraries_by_kind.get("multi"))):
                if library is None or (kind == "multi" and scenario == "two libraries at once"):
                    continue
                if kind == "multi" and variant not in ("", "graphs on"):
                    continue
                params = {"library": library, "scenario": scenario, "runs": runs,
                          "other": libraries_by_kind.get("multi") if kind == "mlp" else None}
                expect = "accept" if scenario in VALID else "any"
                cases.append(Case("concurrency", GROUPS[scenario], f"{kind}: {scenario}{suffix}", FUNCTION,
                                  params, timeout=150.0, memory_limit=memory, expect=expect))
                if device == "cuda":
                    cases.append(Case("concurrency", "with CuPy noise", f"{kind}: {scenario}{suffix}, CuPy busy",
                                      FUNCTION, {**params, "noise": True}, timeout=150.0, memory_limit=None,
                                      expect=expect))
    cycles = {"load/run/close": 3000 if everything else 500, "runs on one module": 100000 if everything else 10000,
              "refused runs on one module": 30000 if everything else 3000,
              "load/run/close of a changed file": 600 if everything else 150}
    for kind in ("mlp", "multi", "sidecar"):
        library = libraries_by_kind.get(kind)
        if library is None:
            continue
        for scenario, count in cycles.items():
            if kind != "mlp" and scenario != "load/run/close":
                continue
            cases.append(Case("soak", "cycles", f"{kind}: {count} x {scenario}", SOAK_FUNCTION,
                              {"library": library, "scenario": scenario, "cycles": count}, timeout=300.0,
                              memory_limit=memory, exclusive=True,
                              expect="any" if scenario.startswith("refused") else "accept"))
    return cases
