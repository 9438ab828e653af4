"""What partitioning by measurement (`partition: measured`) knows a candidate costs: the cost
store, the measurement of a candidate on this machine's device, and candidate_costs, the
two together as the partition stage asks for them.

A candidate is some of main's ops run by one backend (a pattern match, or the built-in
backend's ops). Its cost is measured by building those ops alone into a library with that
backend only (candidate_module: the ops on parameters, names made canonical, weights kept)
and timing the library's run on random inputs: the same pipeline, kernels and tuning a
build would use, so the number is what the candidate costs in the model. Each cost is
kept in the store under the device, byoc's code and the candidate's key (its IR text,
backend and build settings), so that a later build of any model with the same candidate
measures nothing:

    {"format": "byoc-costs", "version": 1,
     "entries": {"<device>": {"<candidate key>": {"us": 12.3, "backend": "cutlass", "ops": "matmul, add",
                                                  "date": "2026-11-28"}}}}

The store lives beside the object cache ($BYOC_CACHE_DIR/costs/costs.json, default
~/.cache/byoc/costs/costs.json). A build that cannot measure (a cuda target without a
visible GPU of its arch, or without CuPy) uses what any GPU measured for its target.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np

from .errors import ByocError, ByocWarning

FORMAT = "byoc-costs"
# Held while anything in this process times kernels on the GPU (a candidate's run, a
# tuning profiler): builds side by side must not time at once.
DEVICE_TIMING = threading.Lock()
MAX_STORE_BYTES = 64 << 20


def default_store_path() -> Path:
    from byoc.toolchain.cache import cache_root
    return cache_root() / "costs" / "costs.json"


class CostStore:
    """Measured candidate costs by device and candidate key (see the module docstring)."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else default_store_path()
        self.entries = self._read()
        self.recorded: set = set()  # (device, key) measured through this instance: what save() merges in

    def _read(self, quiet: bool = False) -> dict:
        """The file's entries; one that cannot be read is a warning (unless `quiet`: save()
        replaces it) and no entries."""
        from .json_files import read_json
        if not self.path.is_file():
            return {}
        try:
            data = read_json(self.path, max_bytes=MAX_STORE_BYTES, what="the cost store")
        except ByocError as error:
            if not quiet:
                warnings.warn(f"{error}; measuring again", ByocWarning, stacklevel=3)
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            if not quiet:
                warnings.warn(f"{self.path} is not a byoc cost store; measuring again", ByocWarning, stacklevel=3)
            return {}
        return {device: entries for device, entries in data["entries"].items() if isinstance(entries, dict)}

    def entry(self, device: str, key: str) -> dict | None:
        """The candidate's entry measured on `device`; a device ending in ":*<target>" is any
        device of that target (a build that cannot measure takes what one measured)."""
        if device.startswith("*"):
            for name, entries in self.entries.items():
                if name.endswith(device[1:]) and isinstance(entries.get(key), dict):
                    return entries[key]
            return None
        entry = self.entries.get(device, {}).get(key)
        return entry if isinstance(entry, dict) else None

    def lookup(self, device: str, key: str) -> float | None:
        entry = self.entry(device, key)
        us = entry.get("us") if entry is not None else None
        return float(us) if isinstance(us, (int, float)) and not isinstance(us, bool) and us >= 0 else None

    def failed(self, device: str, key: str) -> str | None:
        """Why measuring the candidate failed here, or None."""
        entry = self.entry(device, key)
        return str(entry["failed"]) if entry is not None and "failed" in entry else None

    def record(self, device: str, key: str, us: float, backend: str, ops: str, details: dict | None = None):
        """A measured cost; `details` (JSON values) are kept beside it (where it was measured:
        provenance(); a backend's choice that the time is of: the cudnn backend's engine)."""
        self.recorded.add((device, key))
        self.entries.setdefault(device, {})[key] = {**(details or {}), "us": round(float(us), 3), "backend": backend,
                                                    "ops": ops, "date": datetime.date.today().isoformat()}

    def record_failed(self, device: str, key: str, reason: str, backend: str, ops: str, details: dict | None = None):
        self.recorded.add((device, key))
        self.entries.setdefault(device, {})[key] = {**(details or {}), "failed": reason[:300] or "no reason given",
                                                    "backend": backend, "ops": ops,
                                                    "date": datetime.date.today().isoformat()}

    def save(self, merge: bool = True):
        """Merged into what the file holds now (another build may have written it since;
        not with `merge` off: the file becomes these entries) and written through a
        temporary file of this process; a store that cannot be written is a warning."""
        if merge:  # what this instance measured over what the file holds now (newer than what was read)
            merged = {device: dict(entries) for device, entries in self._read(quiet=True).items()}
            for device, key in self.recorded:
                merged.setdefault(device, {})[key] = self.entries[device][key]
            self.entries = merged
        from .json_files import write_json_whole
        try:
            write_json_whole(self.path, {"format": FORMAT, "version": 1, "entries": self.entries})
        except OSError as error:
            warnings.warn(f"cannot write the cost store {self.path} ({error.strerror or error}): this build's "
                          f"measurements are not kept", ByocWarning, stacklevel=2)


def merge_cost_entries(stores: list) -> tuple:
    """The entries of `stores` together, and how many candidates two of them both hold: for
    such a candidate the later store's entry, unless it records a failure where an earlier
    one has a time (a failure may be of that machine's own making)."""
    merged, conflicts = {}, 0
    for store in stores:
        for device, entries in store.entries.items():
            into = merged.setdefault(device, {})
            for key, entry in entries.items():
                if not isinstance(entry, dict):
                    continue
                if key in into:
                    conflicts += 1
                    if "failed" in entry and "us" in into[key]:
                        continue
                into[key] = entry
    return merged, conflicts


def device_fingerprint(target) -> str:
    """What a cost is a cost on: the GPU's name and the target, or the CPU's model; a cuda
    target that cannot be measured here: "*:<target>", any GPU that measured for it."""
    if target.kind == "cuda":
        from .target import visible_gpu_name
        if not can_measure(target):
            return f"*:{target}"
        return f"cuda:{visible_gpu_name()}:{target}"
    model = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu:{model}:{os.cpu_count()} cpus"


def can_measure(target) -> bool:
    """Whether candidates can be timed here: always on the cpu, with a GPU of the target's arch on cuda."""
    if target.kind != "cuda":
        return True
    import importlib.util
    from .target import visible_gpu_arch
    return visible_gpu_arch() == target.attrs.get("arch") and importlib.util.find_spec("cupy") is not None


def candidate_module(main, nodes) -> tuple:
    """(an IRModule whose main runs main's bindings at positions `nodes` alone, the names of
    main's values it reads, in parameter order): what the candidate reads becomes
    parameters, what main uses of it outside becomes its results, every name canonical
    (p0.., v0..) so that the same ops on the same types print the same text."""
    from .ir.expr import Binding, Call, Function, Tuple, Var
    from .ir.module import IRModule
    from .transform.fuse_ops_by_pattern import _uses
    bindings = list(main.bindings)
    positions = sorted(nodes)
    inside = {bindings[i].var for i in positions}
    substitution, params, read = {}, [], []
    body = []

    def rewritten(expr):
        if isinstance(expr, Var):
            if expr not in substitution:
                param = Var(f"p{len(params)}", expr.type)
                params.append(param)
                read.append(expr.name_hint)
                substitution[expr] = param
            return substitution[expr]
        if isinstance(expr, Call):
            return Call(expr.op, [rewritten(a) for a in expr.args], expr.attrs, type_=expr.type)
        if isinstance(expr, Tuple):
            return Tuple([rewritten(f) for f in expr.fields])
        return expr  # constants, and what no candidate holds
    for number, position in enumerate(positions):
        binding = bindings[position]
        value = rewritten(binding.value)
        var = Var(f"v{number}", binding.var.type)
        substitution[binding.var] = var
        body.append(Binding(var, value))
    uses = _uses(main)
    outputs = [bindings[i].var for i in positions
               if any(u == len(bindings) or bindings[u].var not in inside for u in uses.get(bindings[i].var, []))]
    if not outputs:  # (a candidate's root is always used; a dead one measures its last value)
        outputs = [bindings[positions[-1]].var]
    results = [substitution[v] for v in outputs]
    result = results[0] if len(results) == 1 else Tuple(results)
    return IRModule({"main": Function(params, body, result, result.type)}), read


def candidate_key(module, backend: str, config, target=None) -> str:
    """The store's key of a candidate: byoc's code, the CUDA toolkit and libraries of a cuda
    build (toolchain_versions of `target`, default the config's), the backend and its
    options, the precision and tf32, and the candidate's IR text (weights by type, not value)."""
    from .package import byoc_code_digest
    options = dict(config.backends).get(backend) or {}
    text = module.script(elide_data_over=16)
    settings = json.dumps([options, config.tuning, config.cuda_graph, config.tf32], sort_keys=True, default=str)
    versions = toolchain_versions(target if target is not None else config.target, backend)
    digest = hashlib.sha256(f"{byoc_code_digest()}\0{versions}\0{backend}\0{settings}\0{config.precision}\0"
                            f"{text}".encode())
    return digest.hexdigest()[:24]


def toolchain_versions(target, backend: str | None = None) -> str:
    """What a measured cost depends on besides the device and byoc's code: for a cuda target
    nvcc's release and the cuBLAS version the build compiles and links against, and cuDNN's
    for the cudnn backend's candidates (or any backend's, `backend` None); for the cpu,
    nothing more (the compiler's flags are the target's)."""
    if not str(target).startswith("cuda"):
        return ""
    from .toolchain.locate import cuda_library_versions
    return ", ".join(part for part in cuda_library_versions().split(", ")
                     if part and (backend in (None, "cudnn") or not part.startswith("cudnn ")))


def provenance(target, backend: str | None = None) -> dict:
    """What an entry records of where it was measured: byoc's code and the toolchain."""
    from .package import byoc_code_digest
    versions = toolchain_versions(target, backend)
    return {"byoc": byoc_code_digest()[:12], **({"toolchain": versions} if versions else {})}


# A measured library runs its candidate this many times a run (fewer where their outputs
# would take more than OUTPUT_BYTES): one run() from Python costs more than a small kernel
# (on the H100, a single add of 6-20 MB timed with 3 copies a run took 25-72 us, its kernel
# 2-7 us), and it is paid once for all the copies, in one CUDA graph on the GPU. The copies
# read OPERAND_BYTES or more of distinct operands a run (sets of random inputs taken in
# turn), more than the L2 cache holds, as a model's activations and weights arrive.
COPIES = 32
OUTPUT_BYTES = 2 << 30
OPERAND_BYTES = 64 << 20


def repeated(module, copies: int):
    """`module` whose main runs its body `copies` times, each copy on parameters of its own
    (so that no pass merges the copies: CombineParallelMatmul would make one wide GEMM of
    matmuls that read one input) with the weights shared, returning every copy's results:
    one run times the candidate `copies` times."""
    from .ir.expr import Binding, Call, Function, Tuple, TupleGetItem, Var
    from .ir.module import IRModule
    main = module["main"]
    results, bindings, params = [], [], []
    for copy in range(copies):
        substitution = {param: Var(f"c{copy}_{param.name_hint}", param.type) for param in main.params}
        params += list(substitution.values())

        def rewritten(expr):
            if isinstance(expr, Var):
                return substitution.get(expr, expr)
            if isinstance(expr, Call):
                return Call(expr.op, [rewritten(a) for a in expr.args], expr.attrs, type_=expr.type)
            if isinstance(expr, Tuple):
                return Tuple([rewritten(f) for f in expr.fields])
            if isinstance(expr, TupleGetItem):
                return TupleGetItem(rewritten(expr.tuple_value), expr.index)
            return expr
        for binding in main.bindings:
            var = Var(f"c{copy}_{binding.var.name_hint}", binding.var.type)
            bindings.append(Binding(var, rewritten(binding.value)))
            substitution[binding.var] = var
        result = rewritten(main.result)
        results += list(result.fields) if isinstance(result, Tuple) else [result]
    result = Tuple(results)
    return IRModule({"main": Function(params, bindings, result, result.type)})


def build_candidate(module, backend: str, context, workdir: str, compile_jobs: int | None = None) -> tuple:
    """(the Library of `module` built with `backend` alone (the built-in backend for builtin)
    for the context's target into `workdir`, the copies of the candidate one run of it runs,
    the sets of operands they take in turn): COPIES of it a run (fewer where their outputs
    would pass OUTPUT_BYTES), on the GPU in one CUDA graph that reads the caller's tensors in
    place. Raises what the build raises. Safe beside other candidates' builds in threads of
    one process: tuning in them times on the GPU one at a time (DEVICE_TIMING)."""
    from .build import build
    from .ir.types import TupleType
    main = module["main"]
    result_type = main.ret_type
    result_bytes = sum(t.nbytes for t in (result_type.fields if isinstance(result_type, TupleType)
                                          else [result_type]))
    copies = max(1, min(COPIES, OUTPUT_BYTES // max(result_bytes, 1)))
    copy_bytes = result_bytes + sum(param.type.nbytes for param in main.params)
    operand_sets = max(1, min(copies, -(-OPERAND_BYTES // max(copy_bytes, 1))))
    library = build(repeated(module, copies), workdir=workdir, config={
        **candidate_config(backend, context), "compile_jobs": compile_jobs,
        # on the GPU one graph that reads and writes the caller's tensors: copies of the
        # inputs and outputs around each replay (cuda_graph_io: copy) would be timed with
        # the kernels, and cost a large op several times its kernel's time
        "cuda_graph": bool(context.config.cuda_graph and context.cuda), "cuda_graph_io": "update"})
    return library, copies, operand_sets


def candidate_config(backend: str, context) -> dict:
    """The config a candidate is built (or partitioned) with: the build's target, tuning, tf32
    and options of `backend` alone (none for the built-in backend), float32 (the candidate's
    types are the build's already)."""
    from .config import BUILTIN_BACKEND
    options = dict(context.config.backends).get(backend)
    return {"target": str(context.target), "precision": "float32", "tf32": context.config.tf32,
            "backends": [] if backend == BUILTIN_BACKEND else [{backend: dict(options)} if options else backend],
            "tuning": {key: value for key, value in context.config.tuning.items() if value is not None}}


def time_candidate(library, copies: int, operand_sets: int, cuda: bool, repeat: int = 20) -> float:
    """Microseconds one copy of the candidate takes in a run of its `library` (build_candidate's),
    on random inputs (`operand_sets` sets of them, copy i reading set i % operand_sets),
    with nothing else timing on the GPU."""
    with DEVICE_TIMING:
        loaded = library.load()
        try:
            inputs = candidate_inputs(loaded.metadata["inputs"], copies, operand_sets, cuda)
            milliseconds = loaded.benchmark(*inputs, repeat=repeat, warmup=3)
        finally:
            loaded.close()
    return milliseconds * 1e3 / copies


def measure_candidate(module, backend: str, context, repeat: int = 20) -> float:
    """Microseconds one run of `module` takes built with `backend` alone on the context's
    device (build_candidate, then time_candidate). Raises a ByocError where the candidate
    does not build or run."""
    with tempfile.TemporaryDirectory(prefix="byoc-candidate-") as workdir:
        return time_candidate(*build_candidate(module, backend, context, workdir), context.cuda, repeat)


# What says a failure is this machine's of the moment (memory, time, a busy device), not
# the candidate's: such a failure is not remembered.
TRANSIENT_MESSAGES = ("out of memory", "cudaerrormemoryallocation", "cuda_error_out_of_memory", "timed out",
                      "resource temporarily unavailable", "no space left on device", "device or resource busy")


def transient_failure(error: BaseException) -> bool:
    """Whether a candidate's failure is likely to pass (memory or disk exhausted, a timeout,
    a busy device) rather than the candidate's own (it does not compile, a backend refuses
    it, its kernel faults)."""
    import subprocess
    if isinstance(error, (MemoryError, TimeoutError, subprocess.TimeoutExpired, ConnectionError)):
        return True
    text = str(error).lower()
    return any(message in text for message in TRANSIENT_MESSAGES)


def candidate_build_slots(count: int, compile_jobs: int | None) -> tuple:
    """(candidate builds side by side, compile jobs each) for `count` candidates: the
    build's compile jobs (default one per CPU) shared, two a build (a candidate has about
    one heavy unit, and its host code)."""
    jobs = compile_jobs or os.cpu_count() or 1
    workers = max(1, min(count, jobs // 2))
    return workers, max(1, jobs // workers)


def candidate_inputs(tensors: list, copies: int, operand_sets: int, cuda: bool) -> list:
    """Random arrays for a repeated() candidate's inputs (`tensors`: its metadata's, copy by
    copy): the first `operand_sets` copies' of their own, each later copy's those of copy
    (its number % operand_sets): one array passed for several inputs, which only read it."""
    per_copy = len(tensors) // copies
    arrays = []
    for position, tensor in enumerate(tensors):
        copy = position // per_copy if per_copy else 0
        arrays.append(_random_input(tensor, cuda) if copy < operand_sets else
                      arrays[(copy % operand_sets) * per_copy + position % per_copy])
    return arrays


class _OnlyThreads:
    """A logging filter that keeps the records of some threads only."""

    def __init__(self, threads: set):
        self.threads = threads

    def filter(self, record) -> bool:
        return record.thread in self.threads


def _random_input(tensor: dict, cuda: bool):
    from .ir.types import numpy_dtype
    dtype = numpy_dtype(tensor["dtype"])
    rng = np.random.default_rng(0)
    if dtype.kind == "f" or tensor["dtype"] == "bfloat16":
        array = rng.standard_normal(tensor["shape"]).astype(np.float32).astype(dtype)
    else:
        array = np.zeros(tensor["shape"], dtype)
    if cuda:
        from .runtime.arrays import _cupy
        return _cupy("timing a candidate on the GPU").asarray(array)
    return array


def candidate_functions(module, backend: str, context) -> dict | None:
    """The candidate partitioned for `backend` alone as its build would be: the backend's
    functions by symbol, or None where it has no known_cost hook, the partition fails, or
    an op of the candidate goes to another backend (only a build times the whole candidate)."""
    from .backend import get_backend
    from .config import BUILTIN_BACKEND
    from .ir.expr import Call, Function
    from .pipeline import lower
    if backend == BUILTIN_BACKEND or get_backend(backend).known_cost is None:
        return None
    import logging
    logger, quiet = logging.getLogger("byoc.build"), _OnlyThreads(set())  # the candidate's stages are not the build's
    logger.addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory(prefix="byoc-candidate-") as workdir:
            partitioned = lower(module, candidate_config(backend, context), until="partition", workdir=workdir)
    except ByocError:
        return None
    finally:
        logger.removeFilter(quiet)
    functions = {name: function for name, function in partitioned.functions.items()
                 if isinstance(function, Function) and function.attrs.get("Compiler") == backend}
    main = partitioned["main"]
    if any(not (isinstance(b.value, Call) and getattr(b.value.op, "name", None) in functions)
           for b in main.bindings):
        return None
    return functions


def known_cost(module, backend: str, context) -> float | None:
    """Microseconds the candidate costs by what `backend` measured already (its known_cost:
    the cutlass tuning database on this GPU, the cudnn plans in the cost store), or None:
    the candidate partitioned for that backend alone as its build would be, every op of it
    in the backend's functions."""
    from .backend import get_backend
    functions = candidate_functions(module, backend, context)
    if functions is None:
        return None
    return get_backend(backend).known_cost(functions, context.backend_targets[backend])


def known_costs(candidates: dict, context) -> dict:
    """known_cost of each candidate (key -> (module, backend)) that its backend knows: a
    backend with a learn_costs hook first measures what all of its candidates need at once
    (cudnn: every conv's plans in one process). key -> microseconds."""
    from .backend import get_backend
    by_backend = {}
    for key, (module, backend) in candidates.items():
        functions = candidate_functions(module, backend, context)
        if functions is not None:
            by_backend.setdefault(backend, []).append((key, functions))
    known = {}
    for backend, items in by_backend.items():
        hooks, target = get_backend(backend), context.backend_targets[backend]
        if hooks.learn_costs is not None:
            hooks.learn_costs([functions for _, functions in items], target)
        for key, functions in items:
            us = hooks.known_cost(functions, target)
            if us is not None:
                known[key] = us
    return known


def candidate_costs(context):
    """MeasuredPartition's cost_of for this build: each candidate's cost from the cost store,
    else measured here (measure_candidate) and stored as it is taken, else None (no GPU of the
    target's arch to measure on); a candidate that does not build or run is remembered as
    failed, with why, and not measured again."""
    store = CostStore()
    device = device_fingerprint(context.target)
    measurable = can_measure(context.target)

    def cost_of(mod, requests):
        main = mod["main"]
        keyed, key_of, modules = {}, [], {}
        for backend, _, nodes in requests:
            if nodes not in modules:
                modules[nodes] = candidate_module(main, nodes)[0]
            key = candidate_key(modules[nodes], backend, context.config, context.target)
            keyed.setdefault(key, (modules[nodes], backend))
            key_of.append(key)
        unknown = [key for key in keyed if store.entry(device, key) is None] if measurable else []
        # what a backend measured already (the cutlass tuning database, cuDNN's plans) is not
        # built again; such costs are read afresh each build, not stored: they may get better
        known = known_costs({key: keyed[key] for key in unknown}, context)
        to_measure = [key for key in unknown if key not in known]
        if to_measure:
            _measure_all(to_measure, keyed, store, device, context)
        stored = sum(1 for key in keyed if store.lookup(device, key) is not None) - \
            sum(1 for key in to_measure if store.lookup(device, key) is not None)
        context.progress.stage(f"partition: measured: {len(keyed)} distinct candidates: {len(to_measure)} timed "
                               f"now, {len(known)} known to their backend (a tuning database, cuDNN's plans), {stored} costs "
                               f"from the cost store ({store.path})")
        return [known[key] if key in known else store.failed(device, key) or store.lookup(device, key)
                for key in key_of]
    return cost_of


def _measure_all(keys: list, keyed: dict, store: CostStore, device: str, context):
    """Each candidate of `keys` built (side by side in threads: the builds are mostly nvcc
    and ninja, processes of their own), then timed one at a time on the device, each cost
    stored as it is taken: an interrupted build keeps what it measured. A candidate that
    does not build or run, whatever it raises, is stored as failed, with why, unless the
    failure is the machine's of the moment (transient_failure): then nothing is stored."""
    import concurrent.futures
    import logging
    import threading

    def ops_of(key):
        return ", ".join(b.value.op.name for b in keyed[key][0]["main"].bindings)

    def failed(key, error):
        first_line = (str(error).strip().splitlines() or [""])[0]
        if transient_failure(error):  # this machine's state, not the candidate's: the next build tries again
            context.progress.stage(f"partition: measured: a {keyed[key][1]} candidate ({ops_of(key)}) could not be "
                                   f"measured now ({type(error).__name__}: {first_line}); the priority order there")
            return
        store.record_failed(device, key, f"{type(error).__name__}: {first_line}", keyed[key][1], ops_of(key),
                            provenance(context.target, keyed[key][1]))
        store.save()

    workers, jobs = candidate_build_slots(len(keys), context.config.compile_jobs)
    # the candidates' own builds are not the user's: their progress lines (and heartbeats)
    # are left out; this thread's say how far the measuring is
    quiet = _OnlyThreads({thread.ident for thread in threading.enumerate()})
    logger = logging.getLogger("byoc.build")
    logger.addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory(prefix="byoc-candidates-") as root, \
                concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="byoc-candidate") as pool:
            futures = {pool.submit(build_candidate, *keyed[key], context, os.path.join(root, str(number)),
                                   jobs): key for number, key in enumerate(keys)}
            built = {}
            context.progress.stage(f"partition: measured: building {len(keys)} candidates ({workers} at a time)")
            try:
                for done, future in enumerate(concurrent.futures.as_completed(futures)):
                    key = futures[future]
                    try:
                        built[key] = future.result()
                    except Exception as error:  # noqa: BLE001 - whatever stops it, the candidate is left out
                        failed(key, error)
                    context.progress.stage(f"partition: measured: built {done + 1}/{len(keys)} candidates "
                                           f"(the last: {keyed[key][1]} running {ops_of(key)})")
            except BaseException:  # an interrupt: the builds not started yet are not waited for
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            for number, key in enumerate(keys):
                if key not in built:
                    continue
                context.progress.stage(f"partition: measured: timing candidate {number + 1}/{len(keys)}: "
                                       f"{keyed[key][1]} running {ops_of(key)}")
                try:
                    store.record(device, key, time_candidate(*built.pop(key), context.cuda), keyed[key][1],
                                 ops_of(key), provenance(context.target, keyed[key][1]))
                    store.save()
                except Exception as error:  # noqa: BLE001
                    failed(key, error)
    finally:
        logger.removeFilter(quiet)
