"""Running the cutlass tuning profiler (profiler/profiler_main.cu with its table, built by tuning.py):
problems in order, one JSON line each, on every visible GPU of one model at once (one profiler
process per GPU over a contiguous share of the problems), a candidate that faults costing its
problem only, and the build's progress told a line per problem."""
from __future__ import annotations

import json
import os
import shutil
import subprocess


def tuning_reporter(progress, keys: list):
    """run_profiler's on_problem for a build's progress: a line per problem timed, its
    candidates and best ([tune 7/24] <key>: ...), and what the heartbeat that follows says is
    running: the next problem, not the one just reported."""
    def report(position, count, times):
        if progress is not None:
            progress.stage(f"[tune {position + 1}/{count}] {keys[position]}: {tuning_summary(times)}")
            if position + 1 < count:
                progress.last_what = timing_now(keys, position + 1)
    return report


def timing_now(keys: list, position: int) -> str:
    """What the heartbeat says while problem `position` is being timed."""
    return f"timing [tune {position + 1}/{len(keys)}] {keys[position]}"


def tuning_summary(times: dict) -> str:
    """One problem's measurement as the build's progress says it: how many candidates, and
    the best (or that none ran)."""
    valid = {name: us for name, us in times.items() if us is not None}
    candidates = f"{len(times)} candidate{'s' if len(times) != 1 else ''}"
    if not valid:
        return f"{candidates}, none ran (the heuristic's kernel)"
    best = min(valid, key=valid.get)
    failed = len(times) - len(valid)
    return f"{candidates}{f' ({failed} failed)' if failed else ''}, best {valid[best]:.1f} us ({best})"


# The most one problem's candidates may take in the profiler (its alarm): a hung candidate
# costs that long, then the tuner goes on from the next problem.
PROBLEM_SECONDS = 120


def run_profiler(executable, count: int, on_problem=None, gpus=(None,), weights=None) -> dict:
    """{problem position: its times} from the profiler, which times problems in order, one
    JSON line each: on several GPUs at once (`gpus`: a CUDA_VISIBLE_DEVICES entry each, None
    for the process's own), each a profiler process over a contiguous share of the problems
    with about as many candidates (`weights`: each problem's count) as the others. A
    candidate that faults leaves the CUDA context unusable: the profiler then exits without
    that problem's line (or the process dies, or hangs past its time), which costs that
    problem only: its share is run again from the problem after it. `on_problem(position,
    count, times)` is called as each problem's line arrives (the lines are read as the
    profilers print them: the build's progress says which problem was timed and what it
    measured), from one thread at a time."""
    import threading
    gpus = list(gpus) or [None]
    shares = profiler_shares(count, len(gpus), weights)
    measured, lock = {}, threading.Lock()

    def report(position, times):
        with lock:
            measured[position] = times
            if on_problem is not None:
                on_problem(position, count, times)
    workers = [threading.Thread(target=_run_share, args=(executable, first, end, gpu, report), daemon=True)
               for gpu, (first, end) in zip(gpus, shares) if end > first]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return measured


def profiler_shares(count: int, parts: int, weights=None) -> list:
    """[first, end) ranges of problems 0..count-1, `parts` of them (some empty when there are
    fewer problems), contiguous and in order, each with about the same total weight (a
    problem's weight: its candidates to time; 1 each without `weights`)."""
    weights = [max(1, int(w)) for w in weights] if weights is not None else [1] * count
    total, shares, first, taken = sum(weights), [], 0, 0
    for part in range(parts):
        target = total * (part + 1) / parts
        end = first
        while end < count and (part == parts - 1 or taken + weights[end] / 2 <= target):
            taken += weights[end]
            end += 1
        shares.append((first, end))
        first = end
    return shares


def _run_share(executable, first: int, end: int, gpu, report):
    """Problems first..end-1 in profiler processes on `gpu` (a CUDA_VISIBLE_DEVICES entry,
    or None), each problem's times to `report(position, times)`."""
    import threading
    environment = None if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    while first < end:
        finished = first
        # the profiler stops itself after PROBLEM_SECONDS on one problem; this is a backstop
        process = subprocess.Popen([str(executable), str(first), str(end)], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True, errors="replace", env=environment)
        backstop = threading.Timer(max(600, (PROBLEM_SECONDS + 10) * (end - first)), process.kill)
        backstop.start()
        try:
            for line in process.stdout:
                try:
                    record = json.loads(line)
                    position, times = int(record["problem"]), record["times"]
                except (ValueError, KeyError, TypeError):
                    continue
                if first <= position < end and isinstance(times, dict):
                    report(position, times)
                    finished = max(finished, position + 1)
        finally:
            backstop.cancel()
            process.stdout.close()
            failed = process.wait() != 0
        # a run that stopped early stopped in problem `finished`: it keeps no times
        first = finished + 1 if failed or finished == first else finished


def profiling_gpus(limit: int = 0) -> list:
    """The CUDA_VISIBLE_DEVICES entries of the GPUs tuning times on at once: every visible
    GPU of the first one's model (candidates timed on another model would be compared with
    the wrong ones), at most `limit` of them (0: all); [None] (the process's own) where
    nvidia-smi cannot say."""
    if not shutil.which("nvidia-smi"):
        return [None]
    try:
        run = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return [None]
    rows = [[field.strip() for field in line.split(",", 2)] for line in run.stdout.splitlines()
            if run.returncode == 0 and line.count(",") >= 2]
    return same_model_gpus(rows, os.environ.get("CUDA_VISIBLE_DEVICES"), limit)


def same_model_gpus(rows: list, visible: str | None, limit: int = 0) -> list:
    """profiling_gpus from nvidia-smi's [index, uuid, name] rows and CUDA_VISIBLE_DEVICES
    (None: unset; its entries are indices or UUIDs, in CUDA's order): the entries of the GPUs
    of the first visible one's model; [None] where they cannot be matched to rows."""
    if visible is None:
        # by UUID: CUDA_VISIBLE_DEVICES's indices follow CUDA's order, which need not be
        # nvidia-smi's (fastest first, unless CUDA_DEVICE_ORDER=PCI_BUS_ID)
        entries = [row[1] for row in rows]
    else:
        entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    by_entry = {key: row for row in rows for key in (row[0], row[1])}
    if not entries or any(entry not in by_entry for entry in entries):
        return [None]  # a MIG instance, a GPU nvidia-smi does not list: one process, as the build's
    first_model = by_entry[entries[0]][2]
    chosen = [entry for entry in entries if by_entry[entry][2] == first_model]
    return chosen[:limit] if limit > 0 else chosen
