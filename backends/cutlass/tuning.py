"""Kernel selection for the cutlass backend: measure when a GPU is visible, remember the
winner in a tuning database, fall back to the documented heuristic otherwise.

Tuning problems (GEMMs or convs: both are measured the same way, each against the candidates
of its family, kernels.usable_candidates) = compile every candidate kernel once (one ninja
edge each, through the object cache), link them into one profiler
(profiler/profiler_main.cu and its table), run it once for all the problems, keep each problem's
fastest. With the cutlass target's `tuned_epilogue: auto` (the default), a problem whose
candidates' proxy units (below) are compiled already, in the kernel library that `byoc
kernels build` fills once per machine (byoc/kernel_library.py) or in the object cache, has
every such candidate timed on its proxy, and no candidate compiled: only the winner, with
its own epilogue, in the build; any other problem is timed as with `own`. With `own`, a
candidate is timed with its problem's own epilogue, so the winner's object is
the one timed and the build finds it in the object cache. With
`tuned_epilogue: proxy`, it is timed with the problem's epilogue proxy instead
(epilogue_proxy: the bias kept, no activation, no residual), so every problem of one dtype
and layout times the same few kernel units whatever its epilogue (BERT's four GEMMs of a
layer share one set), and the build then compiles the winner with the problem's own
epilogue, which the proxy ranks as it ranks the real kernels (an epilogue is elementwise
work on the output tile, the same for every candidate of a problem). That second wave of
compiles after timing made BERT-base's cold tuning slower on a 32-core H100 host (88-90 s
against 62 s), so it is not the default.

The database is one JSON file, shareable between machines of the same arch:

    {"format": "byoc-cutlass-tuning", "version": 1,
     "entries": {"sm90": {"<problem key>": {"kernel": {...}, "name": "...", "us": 12.3,
                                             "measured": {"<name>": us, ...},
                                             "device": "NVIDIA H100 80GB HBM3", "cuda": "13.0",
                                             "cutlass": "4.2.0.0", "date": "2026-11-24"}}}}

Each entry says where and with what it was measured (device, CUDA, CUTLASS, date; entries
from before carry none). A build looks up the user's database (the target's tuning_db, else
the persistent one under the byoc cache directory: `default_database_path()`), then the
one shipped in the package; what tuning measures goes to the user's. An entry measured on
another GPU model is used as it is (cross-compiling, or profile: auto), and measured again
when `profile: true` asks for tuning on a GPU of another name. `byoc tuning show|merge|export`
(byoc/cli/tuning.py) lists, combines and shares databases.
"""
from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

from byoc.costs import DEVICE_TIMING
from byoc.errors import BuildError, ByocWarning
from byoc.json_files import read_json, write_json_whole
from byoc.codegen.templates import render_template

from .kernels import (INCLUDE_DIR, NO_FILTER, PDL_FLAG, CandidateFilter, default_kernel, kernel_from_json,
                      kernel_unit, kernel_workspace_bytes, operand_sizes, partition_call, runtime_problem,
                      usable_candidates)

from .profiler_runs import (PROBLEM_SECONDS, profiler_shares, profiling_gpus, run_profiler,  # noqa: F401
                            same_model_gpus, timing_now, tuning_reporter, tuning_summary)

# The profiler's static driver (its table is generated per build: templates/cutlass/profiler_table.cc.j2)
PROFILER_MAIN = Path(__file__).parent / "profiler" / "profiler_main.cu"

FORMAT = "byoc-cutlass-tuning"
MAX_DATABASE_BYTES = 256 << 20  # thousands of problems take a few MB


# Kernels measured on an H100 and an H200 (sm_90) for some problems of bench/real_models.py's
# suite and bench/bench_gemm.py's (68 entries: transformers' GEMMs at batch 1 and 8 with 128
# tokens; CNN GEMMs at batch 32; the stems of ResNet-50, ConvNeXt-T and MobileNetV3; not
# ResNet-50's other convs): a build of those problems needs no tuning run. The user's
# database (the target's tuning_db) comes first; a build reads this one and never writes it. The bench/ tuning stages (gpu_session.sh
# tune/retune, tune_conv.py) grow a copy of it that is then committed here.
SHIPPED_DATABASE = Path(__file__).resolve().parent / "tuning_sm90.json"


def default_database_path() -> Path:
    """Where tuning results persist when the target names no tuning_db: beside the object
    cache ($BYOC_CACHE_DIR, else ~/.cache/byoc), so that a second build finds them."""
    from byoc.toolchain.cache import cache_root
    return cache_root() / "tuning" / "cutlass.json"


def measurement_provenance(candidates: int) -> dict:
    """Where and with what a measurement is made now: the GPU's name, nvcc's CUDA release,
    the CUTLASS package's version, the date, and how many candidates were timed."""
    import datetime
    import re
    from importlib import metadata
    from byoc.target import visible_gpu_name
    from byoc.toolchain.compiler import compiler_version
    from byoc.toolchain.locate import find_nvcc
    try:
        release = re.search(r"release (\d+\.\d+)", compiler_version(str(find_nvcc())))
    except Exception:  # noqa: BLE001 - no nvcc: provenance says unknown, tuning itself reports it
        release = None
    try:
        cutlass = metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        cutlass = None
    return {"device": visible_gpu_name(), "cuda": release.group(1) if release else None, "cutlass": cutlass,
            "date": datetime.date.today().isoformat(), "candidates": candidates}


class TuningDatabase:
    def __init__(self, path=None, fallback: "TuningDatabase | None" = None):
        self.path = Path(path) if path else None
        self.fallback = fallback
        self.entries: dict = {}
        self.recorded: set = set()  # (arch, problem key) this instance measured: what save() merges in
        if self.path and self.path.exists():
            data = self._read()
            if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != 1:
                raise BuildError(f"tuning database {self.path} is not a {FORMAT} version 1 file")
            self.entries = data.get("entries", {})
            if not (isinstance(self.entries, dict) and all(isinstance(v, dict) for v in self.entries.values())):
                raise BuildError(f"tuning database {self.path}: 'entries' must map an arch ('sm90') to an object "
                                 "of problem keys")

    def _read(self):
        """The file's JSON, through the guarded reader: a device, a FIFO, a file larger than
        any database, JSON nested past the stack or numbers no measurement has are refused
        (/dev/zero would be read until memory runs out, a FIFO would block forever)."""
        return read_json(self.path, "a tuning database", BuildError, max_bytes=MAX_DATABASE_BYTES)

    def lookup(self, sm: int, problem):
        """The remembered kernel (GemmKernel or ConvKernel) for `problem` (this database's,
        else its fallback's), or None."""
        entry = self.entries.get(f"sm{sm}", {}).get(problem.key)
        if not entry or (isinstance(entry, dict) and entry.get("failed")):  # measured, none ran: no kernel here
            return self.fallback.lookup(sm, problem) if self.fallback is not None else None
        if not (isinstance(entry, dict) and "kernel" in entry):
            raise BuildError(f"tuning database {self.path}: the sm{sm} entry for {problem.key} has no 'kernel' "
                             "object (tune it again, or delete the entry)")
        try:
            return kernel_from_json(entry["kernel"])
        except ValueError as error:
            raise BuildError(f"tuning database {self.path}: the sm{sm} entry for {problem.key} is not usable: {error} "
                             "(tune it again, or delete the entry)") from None

    def lookup_same_shape(self, sm: int, problem):
        """A kernel remembered for the same operands with another epilogue (`bias` where
        the database has `plain`), or None. The mainloop's shape decides a kernel's time;
        the epilogue adds a pass over the output tile, so the shape's winner is a better
        guess than the heuristic's."""
        shape = problem.key.rsplit(":", 1)[0] + ":"
        for key in sorted(self.entries.get(f"sm{sm}", {})):
            if key.startswith(shape) and key.count(":") == problem.key.count(":"):
                entry = self.entries[f"sm{sm}"][key]
                try:
                    kernel = kernel_from_json(entry["kernel"]) if isinstance(entry, dict) and "kernel" in entry else None
                except ValueError:
                    kernel = None
                if kernel is not None and kernel.supports(problem) is None:
                    return kernel
        return self.fallback.lookup_same_shape(sm, problem) if self.fallback is not None else None

    def entry(self, sm: int, problem) -> dict | None:
        """The raw entry (this database's, else its fallback's) for `problem`, or None."""
        entry = self.entries.get(f"sm{sm}", {}).get(problem.key)
        if entry:
            return entry if isinstance(entry, dict) else None
        return self.fallback.entry(sm, problem) if self.fallback is not None else None

    def failed_on(self, sm: int, problem) -> dict | None:
        """The record of a measurement of `problem` in which no candidate ran (each faulted,
        hung or disagreed with the reference), or None."""
        entry = self.entry(sm, problem)
        return entry if entry is not None and entry.get("failed") else None

    def record_failed(self, sm: int, problem, measured: dict, provenance: dict | None = None):
        """Remember that measuring `problem` here found no candidate that runs: later builds on
        this GPU take the heuristic's kernel instead of measuring it again (and again) each
        time; delete the entry (byoc tuning) to measure it once more."""
        self.recorded.add((f"sm{sm}", problem.key))
        self.entries.setdefault(f"sm{sm}", {})[problem.key] = {
            "failed": True, "measured": measured, **{k: v for k, v in (provenance or {}).items() if v is not None}}

    def record(self, sm: int, problem, kernel, microseconds: float, measured: dict, provenance: dict | None = None):
        self.recorded.add((f"sm{sm}", problem.key))
        self.entries.setdefault(f"sm{sm}", {})[problem.key] = {
            "kernel": kernel.to_json(), "name": kernel.name(problem), "us": microseconds, "measured": measured,
            **{k: v for k, v in (provenance or {}).items() if v is not None}}

    def save(self, optional: bool = False):
        """Write the entries back. `optional` (the persistent database in the byoc cache, not
        one the user named): a failure is a warning, and the build goes on."""
        if self.path is None:
            return
        if self.recorded:
            self.entries = self._merged_with_file()
        try:  # builds side by side (partition: measured builds its candidates so) each write whole files
            write_json_whole(self.path, {"format": FORMAT, "version": 1, "entries": self.entries})
        except OSError as error:
            message = f"cannot write the tuning database {self.path} ({error.strerror or error})"
            if not optional:
                raise BuildError(f"{message}; expected a writable file (the cutlass target's tuning_db)") from None
            warnings.warn(f"{message}: this build's tuning results are not kept", ByocWarning)


    def _merged_with_file(self) -> dict:
        """What the file holds now (another build may have written it since this one read it)
        with this instance's measurements over it: builds that tune at once lose nothing."""
        try:
            data = self._read() if self.path.is_file() else {}
        except BuildError:
            data = {}  # unreadable: replaced by this build's entries
        current = data.get("entries") if isinstance(data, dict) and data.get("format") == FORMAT else None
        if not isinstance(current, dict) or not all(isinstance(v, dict) for v in current.values()):
            return self.entries
        merged = {arch: dict(entries) for arch, entries in current.items()}
        for arch, entries in self.entries.items():
            for key, entry in entries.items():
                if (arch, key) in self.recorded:  # (an entry deleted from the file since stays deleted)
                    merged.setdefault(arch, {})[key] = entry
        return merged


def merge_entries(databases: list) -> tuple[dict, int]:
    """The entries of `databases` together, and how many problems two of them both hold.
    For such a problem: the faster entry where both were measured on the same device (or
    either does not say where), else the later database's (a team's newer measurement on
    its own GPU replaces an older one made elsewhere)."""
    merged, conflicts = {}, 0
    for database in databases:
        for arch, entries in database.entries.items():
            target = merged.setdefault(arch, {})
            for key, entry in entries.items():
                if not isinstance(entry, dict):
                    continue
                earlier = target.get(key)
                if earlier is not None:
                    conflicts += 1
                    if entry.get("failed") and not earlier.get("failed"):
                        continue  # a measurement that found a kernel beats one that found none
                    if earlier.get("failed") and not entry.get("failed"):
                        target[key] = entry
                        continue
                    same_device = earlier.get("device") is None or entry.get("device") is None or \
                        earlier.get("device") == entry.get("device")
                    if same_device and isinstance(earlier.get("us"), (int, float)) and \
                            isinstance(entry.get("us"), (int, float)) and earlier["us"] <= entry["us"]:
                        continue
                target[key] = entry
    return merged, conflicts


def open_database(tuning_db, shipped: bool = True) -> tuple[TuningDatabase, bool]:
    """(the database a build reads and tuning writes, whether it is the optional persistent
    one): the user's `tuning_db`, else default_database_path(); the shipped one behind it. A
    persistent database that cannot be read is ignored with a warning (it is a cache: the
    next tuning rewrites it), a user's is an error."""
    fallback = TuningDatabase(SHIPPED_DATABASE) if shipped else None
    if tuning_db:
        return TuningDatabase(tuning_db, fallback=fallback), False
    try:
        return TuningDatabase(default_database_path(), fallback=fallback), True
    except BuildError as error:
        warnings.warn(f"{error}; ignoring it (the next tuning run rewrites it)", ByocWarning)
        database = TuningDatabase(None, fallback=fallback)
        database.path = default_database_path()
        return database, True


def epilogue_proxy(problem):
    """The problem a candidate is timed on: `problem` with its bias (an operand read once
    per column) but no activation and no residual, so that problems differing only there
    share their candidates' compile units."""
    import dataclasses
    changes = {"activation": None, "has_residual": False}
    if any(field.name == "residual_in_activation" for field in dataclasses.fields(problem)):
        changes["residual_in_activation"] = False
    return dataclasses.replace(problem, **changes)


def timed_problem(problem, kernels: list, proxy: bool):
    """What `kernels` are timed on for `problem`: its epilogue proxy where `proxy` and
    every one of them runs it, else the problem itself."""
    if not proxy:
        return problem
    stand_in = epilogue_proxy(problem)
    return stand_in if all(kernel.supports(stand_in) is None for kernel in kernels) else problem


def choose_kernels(problems: list, sm: int, database: TuningDatabase, *, profile: bool, workdir: Path,
                   compile_flags: list, jobs: int | None = None, allowed: CandidateFilter = NO_FILTER,
                   remeasure_on: str | None = None, optional_save: bool = False, progress=None,
                   proxy_epilogue: bool = False, gpu_limit: int = 0, tuned_epilogue: str | None = None,
                   tolerance: float = 0.0, runtime_epilogue: bool = False) -> dict:
    """problem -> kernel for every problem (GemmProblem or ConvProblem): from the
    database (when the target allows that kernel), else measured among the allowed
    candidates (when `profile`), else the database's kernel for the same shape with another
    epilogue, else the heuristic. `remeasure_on`: the visible GPU's name where the user
    asked for tuning; an entry measured on a GPU of another name is then measured again.
    `progress`: the build's BuildProgress, told each phase of tuning and ninja's [n/m] lines.
    `tuned_epilogue` (the cutlass target's; `proxy_epilogue` stands for "proxy", else
    "auto"): what each problem's candidates are timed with and which are timed (tuning_plan).
    `tolerance` (the target's tuning_tolerance): how much slower than a problem's fastest a
    kernel it takes may be where that saves the build a compile (consolidated_choice).
    `runtime_epilogue` (the target's): sm90 kernels are compiled with their epilogue taken at
    run time (kernels.runtime_problem), so a candidate timed is the object the build links.
    `gpu_limit`: the most GPUs timing runs on at once (0: every one of the first's model)."""
    chosen = {}
    to_tune = []
    import logging
    log = logging.getLogger("byoc.build")
    for problem in problems:
        known = database.lookup(sm, problem)
        entry = database.entry(sm, problem) if known is not None else None
        foreign = remeasure_on is not None and profile and entry is not None and \
            entry.get("device") not in (None, remeasure_on)
        failed = database.failed_on(sm, problem) if known is None else None
        failed_here = failed is not None and (remeasure_on is None or failed.get("device") in (None, remeasure_on))
        if known is not None and not foreign and known.supports(problem) is None and \
                allowed.admits(known, measured=True):
            chosen[problem] = known
        elif profile and not failed_here:
            to_tune.append(problem)
        else:
            if failed_here and profile:
                log.info("cutlass: no candidate for %s ran when it was measured on %s (%s): the heuristic's kernel, "
                         "not measured again (delete the entry from %s to measure it once more)", problem.key,
                         failed.get("device", "this GPU"), failed.get("date", "date unknown"),
                         database.path or "the database")
            similar = database.lookup_same_shape(sm, problem)
            chosen[problem] = similar if similar is not None and allowed.admits(similar, measured=True) else \
                default_kernel(sm, problem, allowed)
    if to_tune:
        mode = tuned_epilogue or ("proxy" if proxy_epilogue else "auto")
        compiled_units = {}  # a candidate unit's entry -> whether it is compiled: problems share most units
        plans = {problem: tuning_plan(problem, sm, allowed, compile_flags, workdir / "tuning", mode,
                                      runtime_epilogue, compiled_units)
                 for problem in to_tune}
        count = sum(len(kernels) for kernels, _, _ in plans.values())
        held = sum(held for _, _, held in plans.values())
        log.info("cutlass: tuning %d problems the databases lack (%d candidate kernels to time, %d of them compiled "
                 "already (the kernel library, the object cache); tuning_db remembers the winners)%s",
                 len(to_tune), count, held,
                 "" if held == count else "; `byoc kernels build`, once per machine, compiles every candidate so that "
                 "tuning compiles none")
        measured = _profile(to_tune, sm, workdir / "tuning", compile_flags, jobs, allowed, progress=progress,
                            gpu_limit=gpu_limit, kernels_of=lambda problem: plans[problem][0],
                            proxied=frozenset(problem for problem, (_, proxy, _) in plans.items() if proxy),
                            runtime_epilogue=runtime_epilogue)
        provenance = measurement_provenance(0)  # one GPU, one toolchain for the whole run
        timed = {problem: {name: us for name, us in measured.get(problem, {}).items() if us is not None}
                 for problem in to_tune}
        by_names = {problem: {k.name(problem): k for k in plans[problem][0]} for problem in to_tune}
        # only where the winner is compiled after timing (timed on the proxy) does sharing a
        # mainloop save a compile; a problem timed on its own epilogue takes its fastest
        picks = consolidated_choice({problem: {by_names[problem][name]: us for name, us in valid.items()}
                                     for problem, valid in timed.items() if valid and plans[problem][1]},
                                    list(chosen.items()), tolerance)
        picks.update({problem: by_names[problem][min(valid, key=valid.get)]
                      for problem, valid in timed.items() if valid and not plans[problem][1]})
        for problem in to_tune:
            times = measured.get(problem, {})
            valid = timed[problem]
            if not valid:
                chosen[problem] = default_kernel(sm, problem, allowed)
                # remembered only where candidates ran and each failed (not where none compiled
                # or the profiler never started), with every candidate allowed, and never over
                # a kernel another GPU measured
                if times and allowed == NO_FILTER and database.entries.get(f"sm{sm}", {}).get(problem.key) is None:
                    database.record_failed(sm, problem, times, {**provenance, "candidates": len(times)})
                continue
            kernels, proxy, _ = plans[problem]
            pick = picks[problem]
            chosen[problem] = pick
            stand_in = timed_problem(problem, kernels, proxy)
            fastest = min(valid.values())
            database.record(sm, problem, pick, valid[pick.name(problem)], times,
                            {**provenance, "candidates": len(times),
                             "timed_epilogue": stand_in.epilogue_name if stand_in != problem else None,
                             # timed as a runtime-epilogue unit (its bias broadcast always in)
                             "runtime_epilogue": True if runtime_epilogue and runtime_problem(pick, problem) else None,
                             # the pick is not the fastest: it shares its mainloop with other problems' kernels
                             "fastest_us": fastest if valid[pick.name(problem)] > fastest else None})
        if database.recorded:  # nothing measured: the file is left as it is (another build may have written it)
            database.save(optional=optional_save)
    return chosen


def mainloop_of(kernel, problem) -> str:
    """What kernels of one compile share (toolchain/unity.py groups their device halves): the
    kernel's name as it runs `problem`, less the epilogue."""
    return kernel.name(problem).removesuffix(f"_{problem.epilogue_name}")


def consolidated_choice(times: dict, compiled_anyway: list, tolerance: float) -> dict:
    """problem -> kernel, from `times` (problem -> {kernel: microseconds}, each problem's
    candidates that ran): each problem's fastest, except that a problem takes a kernel
    within `tolerance` (a fraction) of its fastest where that kernel's mainloop serves other
    problems too, so that the build compiles fewer distinct kernels: kernels of one
    mainloop (tile, cluster, schedule, layout) with different epilogues compile together, a
    device compile of 30-45 s each, and a conv net's cold build is bound by their count
    (ResNet-50 b32: 24 problems). Greedy set cover: first the mainloops of
    `compiled_anyway` (kernels this build takes from the databases), then the mainloop that
    is near-fastest for the most problems left (ties: the lower summed time), until every
    problem has one. With a tolerance of 0, every problem's fastest."""
    near = {}
    for problem, measured in times.items():
        fastest = min(measured.values())
        near[problem] = {}
        for kernel, us in sorted(measured.items(), key=lambda item: item[1]):
            if us <= fastest * (1.0 + tolerance):
                near[problem].setdefault(mainloop_of(kernel, problem), (kernel, us))
    free = {mainloop_of(kernel, problem) for problem, kernel in compiled_anyway}
    picks, left = {}, set(near)
    while left:
        serving = {}
        for problem in left:
            for mainloop, (_, us) in near[problem].items():
                count, total = serving.get(mainloop, (0, 0.0))
                serving[mainloop] = (count + 1, total + us)
        best = min(serving, key=lambda m: (m not in free, -serving[m][0], serving[m][1], m))
        for problem in [p for p in left if best in near[p]]:
            picks[problem] = near[problem][best][0]
            left.discard(problem)
    return picks


def tuning_plan(problem, sm: int, allowed: CandidateFilter, flags: list, workdir: Path, mode: str,
                runtime_epilogue: bool = False, compiled_memo: dict | None = None) -> tuple:
    """(the candidates tuning times for `problem`, whether on its epilogue proxy, how many of
    them need no compile). `mode` is the cutlass target's tuned_epilogue: own and proxy time
    usable_candidates (the target's tuning_candidates of them) with that epilogue; auto
    times every candidate whose proxy unit is compiled already (`byoc kernels build`'s
    kernel library, or the object cache) where those include the target's usable_candidates,
    the problem's own epilogue's usable_candidates otherwise. With `runtime_epilogue` no proxy is
    needed (a candidate's unit for the problem is the one for its dtype and layout): auto
    times every candidate that is compiled where those include the target's. `compiled_memo`
    (unit entry -> compiled), kept by the caller across the problems of one build, asks
    the cache once per unit: ResNet-50's 24 problems time 64 kernels' units, not 600."""
    import dataclasses
    chosen = usable_candidates(sm, problem, allowed)
    # a kernel without a runtime form (an sm80 template: the fixed-channel stems) keeps its
    # compiled epilogue, and the problem is tuned as without runtime_epilogue
    runtime = runtime_epilogue and all(runtime_problem(kernel, problem) is not None for kernel in chosen)
    if mode == "auto":
        every = usable_candidates(sm, problem, dataclasses.replace(allowed, per_problem=0))
        # what the library holds: a runtime unit serves the problem itself, else its proxy's
        stand_in = problem if runtime else timed_problem(problem, every, True)
        held = [kernel for kernel, compiled in zip(every, _compiled(every, stand_in, flags, workdir, runtime,
                                                                    compiled_memo)) if compiled]
        if held and set(chosen) <= set(held):
            return held, stand_in != problem, len(held)
        mode = "own"
    proxy = mode == "proxy" and not runtime
    return chosen, proxy, sum(_compiled(chosen, timed_problem(problem, chosen, proxy), flags, workdir, runtime,
                                        compiled_memo))

def _compiled(kernels: list, problem, flags: list, workdir: Path, runtime_epilogue: bool = False,
              memo: dict | None = None) -> list:
    """Whether each kernel's unit for `problem` (both halves) is in the object cache or the
    kernel library: timing it costs no compile. `memo`: unit entry -> that answer, read and
    filled (units asked about before are not written or keyed again)."""
    from byoc.toolchain.compiler import unit_cached

    from .codegen import kernel_compile_units
    memo = {} if memo is None else memo
    workdir.mkdir(parents=True, exist_ok=True)
    units = [kernel_unit(kernel, problem, flags, runtime_epilogue) for kernel in kernels]
    new = list({unit.entry: unit for unit in units if unit.entry not in memo}.values())
    per_unit = [kernel_compile_units([unit], workdir, unity=False) for unit in new]
    cached = iter(unit_cached([part for parts in per_unit for part in parts], workdir))  # one pass, one memo
    for unit, parts in zip(new, per_unit):
        memo[unit.entry] = all([next(cached) for _ in parts])
    return [memo[unit.entry] for unit in units]


def time_kernels(chosen: dict, sm: int, workdir: Path, compile_flags: list, jobs=None) -> dict:
    """problem -> microseconds (None when it failed) of the one kernel `chosen[problem]`,
    compiled with `compile_flags` and timed as the tuner times candidates (the GEMM
    benchmark's measurement of its kernels launched another way)."""
    measured = _profile(list(chosen), sm, workdir, compile_flags, jobs, kernels_of=lambda problem: [chosen[problem]])
    return {problem: measured.get(problem, {}).get(kernel.name(problem)) for problem, kernel in chosen.items()}


def _profile(problems: list, sm: int, workdir: Path, compile_flags: list, jobs,
             allowed: CandidateFilter = NO_FILTER, kernels_of=None, progress=None, proxy: bool = False,
             gpu_limit: int = 0, proxied: frozenset = frozenset(), runtime_epilogue: bool = False) -> dict:
    """problem -> {candidate kernel name (as it runs the problem): microseconds, or None
    where it failed or disagreed with the problem's first candidate}: every candidate's
    kernel unit compiled once (kernels.kernel_unit; with `proxy`, of the problem's epilogue
    proxy, or for the problems in `proxied`: timed_problem), one profiler for all the problems
    (profiler/profiler_main.cu and its table), run once, on every visible GPU of one model at once
    (at most `gpu_limit`; 0: all)."""
    from byoc.toolchain import CompileUnit, compile_units

    from .codegen import kernel_compile_units
    workdir.mkdir(parents=True, exist_ok=True)
    kernel_units, programs = {}, []
    for index, problem in enumerate(problems):
        # the heuristic's kernel first: the reference the others are checked against
        usable = kernels_of(problem) if kernels_of else usable_candidates(sm, problem, allowed)
        timed_as = timed_problem(problem, usable, proxy or problem in proxied)
        indices, slots = {"a": 0, "b": 1}, [0, 1]
        if timed_as.has_bias:
            indices["bias"] = len(slots)
            slots.append(2)
        if timed_as.has_residual:
            indices["residual"] = len(slots)
            slots.append(3)
        calls = []
        for number, kernel in enumerate(usable):
            unit = kernel_unit(kernel, timed_as, compile_flags, runtime_epilogue)
            kernel_units.setdefault(unit.entry, unit)
            calls.append(partition_call(f"candidate_{index}_{number}", unit, kernel, timed_as, indices))
        programs.append((problem, timed_as, usable, calls, slots))
    # A candidate serves every problem of its types: compiled once, timed on each. One that
    # does not compile is left out (and reported), not fatal: the others are still measured,
    # and the heuristic's kernel is what the build used before tuning.
    # no unity groups: each candidate's objects on their own, so that one that does not
    # compile costs no other, and a build finds each chosen kernel's in the cache
    candidate_units = kernel_compile_units(kernel_units.values(), workdir, unity=False)
    if progress is not None:  # what the build is doing for minutes, and how far it is
        from byoc.toolchain.compiler import unit_cached
        missing = len(candidate_units) - sum(unit_cached(candidate_units, workdir))
        progress.stage(f"cutlass tuning: {len(kernel_units)} candidate kernels for {len(problems)} problems "
                       f"({', '.join(problem.key for problem in problems[:3])}{', ...' if len(problems) > 3 else ''}): "
                       + (f"compiling {missing} of their {len(candidate_units)} units" if missing else
                          "every unit compiled already (the kernel library, the object cache)"))
    try:
        compile_units(candidate_units, workdir, jobs=jobs, progress=progress.compile_line if progress else None)
    except BuildError as error:
        warnings.warn(f"cutlass tuning: some candidates did not compile and are not measured: {error}", ByocWarning)
    built = {entry for entry, unit in kernel_units.items()
             if all((workdir / "obj" / name).is_file() for name in unit.objects)}
    timed = []  # (problem, profiler data) of the problems with a candidate to time
    names = {}  # problem -> {name a candidate is timed under: its name as it runs the problem}
    for problem, timed_as, usable, calls, slots in programs:
        names[problem] = {kernel.name(timed_as): kernel.name(problem) for kernel in usable}
        kept = [call for call in calls if call["kernel"] in built]
        if not kept:
            continue
        *sizes, out_size = operand_sizes(timed_as)
        fp16 = problem.dtype == "float16"
        timed.append((problem, {
            "key": problem.key, "candidates": kept, "sizes": sizes, "out_size": out_size, "slots": slots,
            "bfloat16": problem.dtype == "bfloat16",
            "workspace_bytes": max([64 << 20] + [kernel_workspace_bytes(k, timed_as) for k in usable]),
            "fill_base": "0x3000u" if fp16 else "0x3E00u", "fill_mask": "0x03FFu" if fp16 else "0x007Fu"}))
    results = {problem: {} for problem in problems}
    if not timed:
        return results
    linked = sorted({call["kernel"] for _, data in timed for call in data["candidates"]})
    # The profiler: its static driver (nvcc, compiled once into the object cache) and this
    # build's table of problems and candidates (plain C++: a second, where the whole
    # profiler as one generated .cu took nvcc several)
    table = workdir / "profiler_table.cc"
    table.write_text(render_template("cutlass/profiler_table.cc.j2", {
        "kernels": linked, "problems": [data for _, data in timed], "iterations": 20,
        "problem_seconds": PROBLEM_SECONDS}))
    flags = [flag for flag in compile_flags if flag != PDL_FLAG] + [f"-I{INCLUDE_DIR}"]
    # The table unoptimized: it is compiled on every build that tunes, and -O0 halves that
    # compile (466 candidates: 0.8 s to 0.4 s). Its entry points fill a struct and call a
    # kernel's launcher: nanoseconds beside a launch, and the timed runs replay a CUDA graph.
    compile_units([CompileUnit(source=PROFILER_MAIN, language="cuda", flags=flags, output="profiler_main.o"),
                   CompileUnit(source=table, language="cxx", flags=["-O0", f"-I{INCLUDE_DIR}"],
                               output="profiler_table.o")], workdir, jobs=jobs)
    from byoc.toolchain.locate import find_nvcc
    executable = workdir / "profiler"
    command = [str(find_nvcc()), "-o", str(executable), str(workdir / "obj" / "profiler_main.o"),
               str(workdir / "obj" / "profiler_table.o")] + \
        [str(workdir / "obj" / name) for entry in linked for name in kernel_units[entry].objects] + ["-lcudart"]
    link = subprocess.run(command, capture_output=True, text=True)
    if link.returncode != 0:
        raise BuildError(f"linking the cutlass profiler {executable} failed:\n{link.stderr[-2000:]}")
    keys = [problem.key for problem, _ in timed]
    gpus = profiling_gpus(gpu_limit)
    if progress is not None:
        where = "the GPU" if len(gpus) == 1 else f"{len(gpus)} GPUs at once"
        progress.stage(f"cutlass tuning: timing {len(linked)} kernels on {len(timed)} problems on {where} "
                       f"(at most {PROBLEM_SECONDS} s a problem)")
        progress.last_what = timing_now(keys, 0)
    weights = [len(data["candidates"]) for _, data in timed]
    with DEVICE_TIMING:  # alone on the GPU: builds side by side (partition: measured's) time one at a time
        measured = run_profiler(executable, len(timed), on_problem=tuning_reporter(progress, keys), gpus=gpus,
                                weights=weights)
    for position, times in measured.items():
        problem = timed[position][0]
        results[problem] = {names[problem].get(name, name): us for name, us in times.items()}
    return results
