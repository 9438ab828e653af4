"""Kernel selection for the cutlass backend: measure when a GPU is visible, remember the
winner in a tuning database, fall back to the documented heuristic otherwise.

Tuning one problem = render every candidate kernel (kernels.candidates) that supports it,
compile them in parallel (one ninja edge each, through the object cache), link them with a
generated profiler (templates/cutlass/profiler.cu.j2), run it once, keep the fastest.

The database is one JSON file, shareable between machines of the same arch:

    {"format": "byoc-cutlass-tuning", "version": 1,
     "entries": {"sm90": {"<problem key>": {"kernel": {...}, "name": "...", "us": 12.3,
                                             "measured": {"<name>": us, ...}}}}}
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from byoc.errors import BuildError
from byoc.codegen.templates import render_template

from .kernels import GemmKernel, GemmProblem, candidates, heuristic_kernel

FORMAT = "byoc-cutlass-tuning"


class TuningDatabase:
    def __init__(self, path=None):
        self.path = Path(path) if path else None
        self.entries: dict = {}
        if self.path and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError) as error:
                raise BuildError(f"tuning database {self.path} is not readable JSON: {error}") from None
            if data.get("format") != FORMAT or data.get("version") != 1:
                raise BuildError(f"tuning database {self.path} is not a {FORMAT} version 1 file")
            self.entries = data.get("entries", {})

    def lookup(self, sm: int, problem: GemmProblem) -> GemmKernel | None:
        entry = self.entries.get(f"sm{sm}", {}).get(problem.key)
        return GemmKernel.from_json(entry["kernel"]) if entry else None

    def record(self, sm: int, problem: GemmProblem, kernel: GemmKernel, microseconds: float, measured: dict):
        self.entries.setdefault(f"sm{sm}", {})[problem.key] = {
            "kernel": kernel.to_json(), "name": kernel.name(problem), "us": microseconds, "measured": measured}

    def save(self):
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"format": FORMAT, "version": 1, "entries": self.entries}, indent=1, sort_keys=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(text + "\n")
        os.replace(temporary, self.path)


def choose_kernels(problems: list, sm: int, database: TuningDatabase, *, profile: bool, workdir: Path,
                   compile_flags: list, jobs: int | None = None) -> dict:
    """problem -> GemmKernel for every problem: from the database, else measured (when
    `profile`), else the heuristic."""
    chosen = {}
    to_tune = []
    for problem in problems:
        known = database.lookup(sm, problem)
        if known is not None and known.supports(problem) is None:
            chosen[problem] = known
        elif profile:
            to_tune.append(problem)
        else:
            chosen[problem] = heuristic_kernel(sm, problem)
    if to_tune:
        measured = _profile(to_tune, sm, workdir / "tuning", compile_flags, jobs)
        for problem in to_tune:
            times = measured.get(problem, {})
            valid = {name: us for name, us in times.items() if us is not None}
            if not valid:
                chosen[problem] = heuristic_kernel(sm, problem)
                continue
            by_name = {k.name(problem): k for k in candidates(sm) if k.supports(problem) is None}
            best = min(valid, key=valid.get)
            chosen[problem] = by_name[best]
            database.record(sm, problem, by_name[best], valid[best], times)
        database.save()
    return chosen


def _profile(problems: list, sm: int, workdir: Path, compile_flags: list, jobs) -> dict:
    from byoc.toolchain import CompileUnit, compile_units
    workdir.mkdir(parents=True, exist_ok=True)
    units, programs = [], []
    for index, problem in enumerate(problems):
        usable = [k for k in candidates(sm) if k.supports(problem) is None]
        entries = []
        for number, kernel in enumerate(usable):
            symbol = f"candidate_{index}_{number}"
            indices = {"a": 0, "b": 1}
            slots = [0, 1]
            if problem.has_bias:
                indices["bias"] = len(slots)
                slots.append(2)
            if problem.has_residual:
                indices["residual"] = len(slots)
                slots.append(3)
            template = "cutlass/gemm_sm90.cu.j2" if sm >= 90 else "cutlass/gemm_sm80.cu.j2"
            source = workdir / f"{kernel.name(problem)}__{index}.cu"
            source.write_text(render_template(template, kernel.template_data(problem, symbol, indices)))
            units.append(CompileUnit(source=source, language="cuda", flags=compile_flags,
                                     output=f"{source.stem}.o"))
            entries.append({"symbol": symbol, "name": kernel.name(problem)})
        m, n, k, batch = problem.m, problem.n, problem.k, problem.batch
        sizes = [m * k * batch, n * k * batch, n if problem.has_bias else 0, m * n * batch if problem.has_residual else 0]
        fp16 = problem.dtype == "float16"
        profiler = workdir / f"profiler_{index}.cu"
        profiler.write_text(render_template("cutlass/profiler.cu.j2", {
            "problem_key": problem.key, "candidates": entries, "sizes": sizes, "out_size": m * n * batch,
            "arg_slots": slots, "workspace_bytes": 64 << 20, "iterations": 20,
            "fill_base": "0x3000u" if fp16 else "0x3E00u", "fill_mask": "0x03FFu" if fp16 else "0x007Fu"}))
        units.append(CompileUnit(source=profiler, language="cuda", flags=compile_flags, output=f"profiler_{index}.o"))
        programs.append((problem, profiler, [f"{Path(e['name'])}__{index}.o" for e in entries]))
    objects = compile_units(units, workdir, jobs=jobs)
    by_name = {Path(o).name: o for o in objects}
    from byoc.toolchain.compiler import cuda_link_flags, find_nvcc
    results = {}
    for index, (problem, profiler, kernel_objects) in enumerate(programs):
        executable = workdir / f"profiler_{index}"
        command = [str(find_nvcc()), "-o", str(executable), str(by_name[f"profiler_{index}.o"])] + \
            [str(by_name[name]) for name in kernel_objects] + ["-lcudart"]
        linked = subprocess.run(command, capture_output=True, text=True)
        if linked.returncode != 0:
            raise BuildError(f"linking the cutlass profiler {executable} failed:\n{linked.stderr[-2000:]}")
        ran = subprocess.run([str(executable)], capture_output=True, text=True, timeout=600)
        try:
            results[problem] = json.loads(ran.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            results[problem] = {}
    return results
