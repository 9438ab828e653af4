"""The CUTLASS tuning database as a user meets it: tuning results persist in the byoc
cache, each entry says where it was measured, the shipped database is used without
measuring, an entry from another GPU model is used when cross-compiling and measured again
when the user asks for tuning on this one, and `byoc tuning show|merge|export` shares them.
The measurement itself (the profiler on a GPU) is replaced by a recording stand-in."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from byoc.backends.cutlass import tuning
from byoc.backends.cutlass.kernels import GemmKernel, GemmProblem, default_kernel, usable_candidates
from byoc.backends.cutlass.tuning import (SHIPPED_DATABASE, TuningDatabase, choose_kernels, default_database_path,
                                          merge_entries, open_database)
from byoc.errors import BuildError, ByocWarning

PROBLEM = GemmProblem(320, 512, 256, 1, "float16", False, None, True, False)
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def measured(monkeypatch):
    """Stand-in for the profiler: every candidate 'measures', the second-listed fastest;
    records which problems were measured."""
    calls = []

    def fake_profile(problems, sm, workdir, compile_flags, jobs, allowed=None, kernels_of=None, progress=None,
                     **options):
        calls.extend(problems)
        results = {}
        for problem in problems:
            names = [k.name(problem) for k in usable_candidates(sm, problem, allowed)]
            results[problem] = {name: (1.0 if i == 1 else 2.0 + i) for i, name in enumerate(names)}
        return results
    monkeypatch.setattr(tuning, "_profile", fake_profile)
    monkeypatch.setattr(tuning, "measurement_provenance",
                        lambda n: {"device": H100, "cuda": "13.0", "cutlass": "4.2.0.0", "date": "2026-11-24",
                                   "candidates": n})
    return calls


def test_tuning_results_persist_in_the_cache_with_where_they_were_measured(cache, measured, tmp_path):
    database, optional = open_database(None, shipped=False)
    assert optional and database.path == default_database_path() == cache / "tuning" / "cutlass.json"
    chosen = choose_kernels([PROBLEM], 90, database, profile=True, workdir=tmp_path / "w", compile_flags=[],
                            optional_save=optional)
    assert measured == [PROBLEM]
    second = usable_candidates(90, PROBLEM)[1]
    assert chosen[PROBLEM] == second
    entry = json.loads((cache / "tuning" / "cutlass.json").read_text())["entries"]["sm90"][PROBLEM.key]
    assert entry["name"] == second.name(PROBLEM) and entry["us"] == 1.0
    assert (entry["device"], entry["cuda"], entry["cutlass"], entry["date"]) == (H100, "13.0", "4.2.0.0", "2026-11-24")
    assert entry["candidates"] == len(usable_candidates(90, PROBLEM))
    # the next build finds it: nothing measured again
    measured.clear()
    again, _ = open_database(None, shipped=False)
    assert choose_kernels([PROBLEM], 90, again, profile=True, workdir=tmp_path / "w", compile_flags=[],
                          remeasure_on=H100)[PROBLEM] == second
    assert measured == []


def test_the_shipped_database_is_used_without_measuring(cache, measured, tmp_path):
    shipped = TuningDatabase(SHIPPED_DATABASE)
    key = "float16:m128:n768:k768:l1:nn:bias_residual"
    problem = GemmProblem(128, 768, 768, 1, "float16", False, None, True, True)
    assert problem.key == key
    database, optional = open_database(None)
    chosen = choose_kernels([problem], 90, database, profile=True, workdir=tmp_path, compile_flags=[],
                            optional_save=optional)
    assert measured == [] and chosen[problem] == shipped.lookup(90, problem)
    assert shipped.entries["sm90"][key]["device"] == H100  # and it says where it was measured


def test_an_entry_from_another_gpu_is_used_cross_compiling_and_measured_again_when_asked(cache, measured, tmp_path):
    database = TuningDatabase(tmp_path / "team.json")
    foreign = GemmKernel(90, (64, 64, 64), (1, 1), "pingpong")
    database.record(90, PROBLEM, foreign, 3.0, {}, {"device": A100})
    # profile auto / false, or no GPU to measure on: the foreign entry as it is
    for profile, on in ((False, None), (True, None)):
        assert choose_kernels([PROBLEM], 90, database, profile=profile, workdir=tmp_path, compile_flags=[],
                              remeasure_on=on)[PROBLEM] == foreign
    assert measured == []
    # profile: true on an H100: measured again, and the H100's entry replaces it
    chosen = choose_kernels([PROBLEM], 90, database, profile=True, workdir=tmp_path, compile_flags=[],
                            remeasure_on=H100)
    assert measured == [PROBLEM] and chosen[PROBLEM] != foreign
    assert TuningDatabase(tmp_path / "team.json").entries["sm90"][PROBLEM.key]["device"] == H100
    # an entry measured on this GPU model, or one that does not say where: kept
    measured.clear()
    choose_kernels([PROBLEM], 90, database, profile=True, workdir=tmp_path, compile_flags=[], remeasure_on=H100)
    assert measured == []


def test_an_unusable_persistent_database_warns_and_the_build_goes_on(cache, measured, tmp_path):
    path = default_database_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.warns(ByocWarning, match="ignoring it"):
        database, optional = open_database(None, shipped=False)
    assert database.entries == {} and optional
    # a cache directory that cannot be written: the results are lost, with a warning
    path.unlink()
    path.parent.chmod(0o500)
    try:
        if os.access(path.parent, os.W_OK):  # root ignores the mode
            pytest.skip("running as root: directory permissions do not stop writes")
        with pytest.warns(ByocWarning, match="tuning results are not kept"):
            choose_kernels([PROBLEM], 90, database, profile=True, workdir=tmp_path / "w", compile_flags=[],
                           optional_save=True)
    finally:
        path.parent.chmod(0o700)


def test_a_users_database_that_cannot_be_written_is_an_error(tmp_path, measured):
    database = TuningDatabase(tmp_path / "a_file" / "db.json")
    (tmp_path / "a_file").write_text("")  # a file where the directory would be
    with pytest.raises(BuildError, match="cannot write the tuning database .*tuning_db"):
        choose_kernels([PROBLEM], 90, database, profile=True, workdir=tmp_path / "w", compile_flags=[])


def test_merge_keeps_the_faster_entry_of_one_device_and_the_later_one_across_devices(tmp_path):
    slow, fast = GemmKernel(90, (64, 64, 64), (1, 1), "pingpong"), GemmKernel(90, (128, 64, 64), (1, 1), "coop")
    first, second, third = (TuningDatabase(tmp_path / f"{n}.json") for n in ("a", "b", "c"))
    first.record(90, PROBLEM, fast, 2.0, {}, {"device": H100})
    second.record(90, PROBLEM, slow, 3.0, {}, {"device": H100})
    merged, conflicts = merge_entries([first, second])
    assert merged["sm90"][PROBLEM.key]["us"] == 2.0 and conflicts == 1
    third.record(90, PROBLEM, slow, 3.0, {}, {"device": A100})
    merged, _ = merge_entries([first, third])
    assert merged["sm90"][PROBLEM.key]["device"] == A100  # the later database's measurement


def _cli(*argv, env):
    return subprocess.run([sys.executable, "-m", "byoc", "tuning", *argv], capture_output=True, text=True, env=env)


def test_byoc_tuning_show_merge_export(cache, tmp_path):
    env = {**os.environ, "BYOC_CACHE_DIR": str(cache)}
    done = _cli("show", env=env)
    assert done.returncode == 0 and f"{SHIPPED_DATABASE}: " in done.stdout and "NVIDIA H100" in done.stdout
    done = _cli("export", "-o", str(tmp_path / "mine.json"), env=env)
    assert done.returncode == 2 and "no persistent tuning database" in done.stderr
    team = TuningDatabase(tmp_path / "team.json")
    team.record(90, PROBLEM, default_kernel(90, PROBLEM), 5.0, {}, {"device": H100, "date": "2026-11-20"})
    team.save()
    done = _cli("merge", str(tmp_path / "team.json"), env=env)  # into the persistent database
    assert done.returncode == 0, done.stderr
    assert str(default_database_path()) in done.stdout and "1 entries" in done.stdout
    done = _cli("export", "-o", str(tmp_path / "mine.json"), env=env)
    assert done.returncode == 0, done.stderr
    assert TuningDatabase(tmp_path / "mine.json").entries == TuningDatabase(tmp_path / "team.json").entries
    done = _cli("show", str(tmp_path / "mine.json"), env=env)
    assert PROBLEM.key in done.stdout and "2026-11-20" in done.stdout
    for argv, message in ((["merge"], "needs at least one DB.json"), (["show", str(tmp_path / "none.json")],
                                                                      "no such tuning database file"),
                          (["export", "x.json", "-o", "y.json"], "takes no databases")):
        done = _cli(*argv, env=env)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    (tmp_path / "bad.json").write_text("[]")
    done = _cli("show", str(tmp_path / "bad.json"), env=env)
    assert done.returncode == 2 and "is not a byoc-cutlass-tuning version 1 file" in done.stderr


def test_a_problem_no_candidate_ran_for_is_remembered_and_not_measured_at_every_build(cache, monkeypatch, tmp_path):
    """Where every candidate of a problem faulted (or hung, or disagreed with the reference),
    the database records that, with where and when: later builds on that GPU take the
    heuristic's kernel without measuring again; on another GPU, asked to tune, it is
    measured; a measured entry of another database wins over it in a merge, and byoc tuning
    show lists it."""
    calls = []

    def failing_profile(problems, sm, workdir, compile_flags, jobs, allowed=None, kernels_of=None, progress=None,
                        **options):
        calls.extend(problems)
        return {problem: {k.name(problem): None for k in usable_candidates(sm, problem, allowed)}
                for problem in problems}
    monkeypatch.setattr(tuning, "_profile", failing_profile)
    monkeypatch.setattr(tuning, "measurement_provenance",
                        lambda n: {"device": H100, "cuda": "13.0", "cutlass": "4.2.0.0", "date": "2026-11-24",
                                   "candidates": n})
    database = TuningDatabase(tmp_path / "db.json")
    heuristic = default_kernel(90, PROBLEM)
    for _ in range(2):
        chosen = choose_kernels([PROBLEM], 90, TuningDatabase(tmp_path / "db.json"), profile=True, workdir=tmp_path,
                                compile_flags=[], remeasure_on=H100)
        assert chosen[PROBLEM] == heuristic
    assert calls == [PROBLEM]  # measured once, not at every build
    # nothing timed at all (no candidate compiled, the profiler never started): not remembered
    monkeypatch.setattr(tuning, "_profile", lambda problems, *a, **k: {problem: {} for problem in problems})
    other = GemmProblem(320, 512, 128, 1, "float16", False, None, True, False)
    nothing = TuningDatabase(tmp_path / "nothing.json")
    choose_kernels([other], 90, nothing, profile=True, workdir=tmp_path, compile_flags=[], remeasure_on=H100)
    assert TuningDatabase(tmp_path / "nothing.json").entry(90, other) is None
    # a kernel measured on another GPU is kept when measuring it here fails
    monkeypatch.setattr(tuning, "_profile", failing_profile)
    team = TuningDatabase(tmp_path / "team.json")
    team.record(90, other, default_kernel(90, other), 3.0, {}, {"device": A100})
    choose_kernels([other], 90, team, profile=True, workdir=tmp_path, compile_flags=[], remeasure_on=H100)
    assert TuningDatabase(tmp_path / "team.json").entry(90, other)["device"] == A100
    entry = json.loads((tmp_path / "db.json").read_text())["entries"]["sm90"][PROBLEM.key]
    assert entry["failed"] is True and entry["device"] == H100 and "kernel" not in entry
    assert all(time is None for time in entry["measured"].values())
    database = TuningDatabase(tmp_path / "db.json")
    assert database.lookup(90, PROBLEM) is None and database.failed_on(90, PROBLEM)["date"] == "2026-11-24"
    # another GPU model, asked to tune: measured there
    choose_kernels([PROBLEM], 90, database, profile=True, workdir=tmp_path, compile_flags=[], remeasure_on=A100)
    assert calls.count(PROBLEM) == 2
    # a merge keeps a measured entry over a failed one, in either order
    good = TuningDatabase(tmp_path / "good.json")
    good.record(90, PROBLEM, heuristic, 2.0, {}, {"device": H100})
    failed = TuningDatabase(None)
    failed.record_failed(90, PROBLEM, {}, {"device": H100})
    for order in ((good, failed), (failed, good)):
        merged, _ = merge_entries(list(order))
        assert merged["sm90"][PROBLEM.key]["us"] == 2.0
    failed.path = tmp_path / "failed.json"
    failed.save()
    shown = subprocess.run([sys.executable, "-m", "byoc", "tuning", "show", str(tmp_path / "failed.json")],
                           capture_output=True, text=True, env={**os.environ, "BYOC_CACHE_DIR": str(cache)})
    assert shown.returncode == 0 and f"{PROBLEM.key}  no candidate ran" in shown.stdout, shown.stderr


def test_candidates_are_timed_on_the_epilogue_proxy(tmp_path, monkeypatch):
    """Problems that differ only in activation and residual time the same candidate units
    (their epilogue proxy: the bias kept): one set compiled for all of them; the times come
    back under each kernel's name for the problem itself, and the database says which
    epilogue was timed. time_kernels (the chosen kernel's own time) times the real one."""
    from byoc.backends.cutlass.tuning import epilogue_proxy, timed_problem
    shapes = dict(m=512, n=768, k=768, batch=1, dtype="float16", b_transposed=True, has_bias=True)
    problems = [GemmProblem(**shapes), GemmProblem(**shapes, activation="gelu"),
                GemmProblem(**shapes, has_residual=True), GemmProblem(**shapes, activation="relu", has_residual=True,
                                                                       residual_in_activation=True)]
    assert {epilogue_proxy(p).epilogue_name for p in problems} == {"bias"}
    assert epilogue_proxy(GemmProblem(512, 768, 768, 4, "float16", True)).epilogue_name == "plain"
    compiled, real_unit = [], tuning.kernel_unit

    def fake_unit(kernel, problem, flags, runtime_epilogue=False):
        compiled.append((kernel.name(problem), problem.epilogue_name))
        return real_unit(kernel, problem, flags, runtime_epilogue)
    monkeypatch.setattr(tuning, "kernel_unit", fake_unit)
    monkeypatch.setattr("byoc.toolchain.compile_units", lambda *a, **k: None)  # nothing built: nothing timed
    results = tuning._profile(problems, 90, tmp_path / "tuning", [], jobs=1, proxy=True)
    assert results == {problem: {} for problem in problems}
    assert {epilogue for _, epilogue in compiled} == {"bias"}
    assert len({name for name, _ in compiled}) == len(usable_candidates(90, problems[0]))
    compiled.clear()
    tuning._profile(problems[1:2], 90, tmp_path / "real", [], jobs=1)  # proxy off: the problem's own epilogue
    assert {epilogue for _, epilogue in compiled} == {"bias_gelu"}
    # the profiler's names (the proxy's) are mapped back to the problem's
    kernels = usable_candidates(90, problems[1])
    assert timed_problem(problems[1], kernels, True) == epilogue_proxy(problems[1])
    assert timed_problem(problems[1], kernels, False) == problems[1]


def test_the_database_says_which_epilogue_was_timed(cache, measured, tmp_path):
    problem = GemmProblem(320, 768, 768, 1, "float16", True, "gelu", True, False)
    database = TuningDatabase(tmp_path / "db.json")
    choose_kernels([problem], 90, database, profile=True, workdir=tmp_path / "w", compile_flags=[],
                   proxy_epilogue=True)
    entry = TuningDatabase(tmp_path / "db.json").entry(90, problem)
    assert entry["timed_epilogue"] == "bias" and entry["name"].endswith("bias_gelu")
    choose_kernels([problem], 90, TuningDatabase(tmp_path / "own.json"), profile=True, workdir=tmp_path / "o",
                   compile_flags=[])  # the default: its own epilogue
    assert "timed_epilogue" not in TuningDatabase(tmp_path / "own.json").entry(90, problem)


FAKE_PROFILER = """#!{python}
# Stands in for the CUTLASS profiler: problems argv[1]..argv[2]-1, one JSON line each after
# `delays[p]` seconds; problem {fault} faults (exits without its line); each line also goes
# to the log with the CUDA_VISIBLE_DEVICES it ran under.
import json, os, sys, time
first, end = int(sys.argv[1]), int(sys.argv[2])
delays = {delays}
for position in range(first, end):
    time.sleep(delays.get(position, 0.0))
    if position == {fault}:
        sys.exit(1)
    line = json.dumps({{"problem": position, "times": {{"k": float(position)}}}})
    with open({log!r}, "a") as log:
        log.write(os.environ.get("CUDA_VISIBLE_DEVICES", "-") + " " + line + chr(10))
    print(line, flush=True)
"""


def fake_profiler(tmp_path, fault=-1, delays=None):
    path = tmp_path / "profiler"
    path.write_text(FAKE_PROFILER.format(python=sys.executable, fault=fault, delays=delays or {},
                                         log=str(tmp_path / "profiler.log")))
    path.chmod(0o755)
    return path


def test_profiler_shares_are_contiguous_and_balanced_by_candidates():
    from byoc.backends.cutlass.tuning import profiler_shares
    assert profiler_shares(10, 1) == [(0, 10)]
    assert profiler_shares(10, 2) == [(0, 5), (5, 10)]
    assert sorted(end - first for first, end in profiler_shares(3, 4)) == [0, 1, 1, 1]
    # the first problems have many candidates: the first share takes fewer problems
    assert profiler_shares(6, 2, weights=[10, 10, 1, 1, 1, 1]) == [(0, 1), (1, 6)]
    for count, parts in ((24, 2), (24, 3), (7, 4), (0, 2)):
        shares = profiler_shares(count, parts, weights=list(range(1, count + 1)))
        assert len(shares) == parts and shares[0][0] == 0 and shares[-1][1] == count
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))


def test_problems_are_timed_on_every_gpu_at_once_and_a_fault_costs_its_problem(tmp_path):
    from byoc.backends.cutlass.tuning import run_profiler
    reported = []
    measured = run_profiler(fake_profiler(tmp_path, fault=5), 8, on_problem=lambda p, n, t: reported.append(p),
                            gpus=["0", "1"], weights=[1] * 8)
    assert sorted(measured) == [0, 1, 2, 3, 4, 6, 7] and sorted(reported) == sorted(measured)
    assert all(measured[p] == {"k": float(p)} for p in measured)
    runs = [line.split(" ", 1) for line in (tmp_path / "profiler.log").read_text().splitlines()]
    by_gpu = {}
    for gpu, line in runs:
        by_gpu.setdefault(gpu, []).append(json.loads(line)["problem"])
    assert by_gpu == {"0": [0, 1, 2, 3], "1": [4, 6, 7]}  # each problem once, the fault's share went on after it
    # one process, the environment's own GPU
    (tmp_path / "profiler.log").unlink()
    assert sorted(run_profiler(fake_profiler(tmp_path), 3)) == [0, 1, 2]
    assert {line.split(" ", 1)[0] for line in (tmp_path / "profiler.log").read_text().splitlines()} == {"-"}


def test_the_gpus_tuning_times_on_are_those_of_the_first_ones_model():
    from byoc.backends.cutlass.tuning import same_model_gpus
    rows = [["0", "GPU-a", "NVIDIA H100 80GB HBM3"], ["1", "GPU-b", "NVIDIA H100 80GB HBM3"],
            ["2", "GPU-c", "NVIDIA A100-SXM4-80GB"]]
    assert same_model_gpus(rows, None) == ["GPU-a", "GPU-b"]
    assert same_model_gpus(rows, None, limit=1) == ["GPU-a"]
    assert same_model_gpus(rows, "2,0") == ["2"]
    assert same_model_gpus(rows, "GPU-b,0,2") == ["GPU-b", "0"]
    assert same_model_gpus(rows, "MIG-1234") == [None]  # what nvidia-smi does not list: the process's own
    assert same_model_gpus([], None) == [None] and same_model_gpus(rows, "") == [None]


def test_a_terminal_sees_a_line_per_tuning_problem_and_what_is_being_timed(tmp_path):
    """Under a pseudo-terminal, as a person sees a build that tunes: each problem's line as
    the profiler finishes it, and while one takes long, a heartbeat naming that problem
    (not the one before it) at most every 5 s; no line repeats unchanged for longer."""
    import pty
    import re
    import time
    profiler = fake_profiler(tmp_path, delays={2: 7.0})
    script = tmp_path / "tune.py"
    script.write_text(textwrap.dedent(f"""
        import logging, sys
        from byoc.progress import BuildProgress
        from byoc.backends.cutlass.tuning import run_profiler, timing_now, tuning_reporter
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
        keys = ["float16:m{{}}:n768:k768".format(m) for m in (128, 256, 384, 512)]
        progress = BuildProgress()
        with progress.heartbeat():
            progress.last_what = timing_now(keys, 0)
            run_profiler({str(profiler)!r}, 4, on_problem=tuning_reporter(progress, keys))
        """))
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stderr is the terminal
        os.execv(sys.executable, [sys.executable, str(script)])
    lines, buffer, deadline = [], b"", time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        lines += [(time.monotonic(), line.decode().strip()) for line in complete if line.strip()]
    os.waitpid(pid, 0)
    texts = [text for _, text in lines]
    for number in range(1, 5):
        assert any(f"[tune {number}/4]" in text and ": 1 candidate, best" in text for text in texts), texts
    heartbeats = [text for text in texts if "still working" in text]
    assert heartbeats and all("timing [tune 3/4] float16:m384" in text for text in heartbeats), texts
    # what a person reads changes at least every 5 s (plus the heartbeat's half-second tick)
    stamps = [stamp for stamp, _ in lines]
    assert max(b - a for a, b in zip(stamps, stamps[1:])) < 6.0, lines
    assert all(re.search(r"\[\s*\d+\.\d s\]", text) for text in texts)


def test_builds_tuning_at_once_keep_each_others_entries(tmp_path):
    """Two builds that read the database before either measured (candidate builds side by
    side under partition: measured) each save what they measured: neither loses the other's."""
    path = tmp_path / "db.json"
    first, second = TuningDatabase(path), TuningDatabase(path)
    other = GemmProblem(640, 512, 256, 1, "float16", False, None, True, False)
    kernel = default_kernel(90, PROBLEM)
    first.record(90, PROBLEM, kernel, 10.0, {kernel.name(PROBLEM): 10.0})
    second.record(90, other, kernel, 20.0, {kernel.name(other): 20.0})
    first.save()
    second.save()
    entries = TuningDatabase(path).entries["sm90"]
    assert entries[PROBLEM.key]["us"] == 10.0 and entries[other.key]["us"] == 20.0
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_a_save_merges_only_what_this_build_measured(tmp_path):
    """An entry deleted from the file after a build read it stays deleted when that build
    saves what it measured."""
    path = tmp_path / "db.json"
    other = GemmProblem(640, 512, 256, 1, "float16", False, None, True, False)
    kernel = default_kernel(90, PROBLEM)
    seed = TuningDatabase(path)
    seed.record(90, PROBLEM, kernel, 10.0, {})
    seed.save()
    reader = TuningDatabase(path)  # reads PROBLEM's entry
    path.write_text(json.dumps({"format": "byoc-cutlass-tuning", "version": 1, "entries": {"sm90": {}}}))  # deleted
    reader.record(90, other, kernel, 20.0, {})
    reader.save()
    entries = TuningDatabase(path).entries["sm90"]
    assert other.key in entries and PROBLEM.key not in entries


def test_tuning_takes_a_near_fastest_kernel_whose_mainloop_other_problems_share():
    """consolidated_choice: within the tolerance, problems share mainloops (fewer distinct
    kernels for the build to compile); outside it, or at 0, each problem's fastest."""
    from byoc.backends.cutlass.tuning import consolidated_choice, mainloop_of
    shapes = dict(k=768, batch=1, dtype="float16", b_transposed=True)
    a = GemmProblem(m=1024, n=768, activation="gelu", has_bias=True, **shapes)
    b = GemmProblem(m=1024, n=3072, has_bias=True, **shapes)
    c = GemmProblem(m=512, n=768, has_bias=True, has_residual=True, **shapes)
    first, second, third = usable_candidates(90, a)[:3]
    times = {a: {first: 10.0, second: 10.19, third: 12.0},
             b: {first: 20.1, second: 20.0, third: 25.0},
             c: {first: 30.0, second: 33.0, third: 29.0}}
    # 2%: a and b share `first` (b 0.5% slower than its fastest; the two near-fastest mainloops
    # serve both, `first` in less time together); c's 3% gap is kept
    picks = consolidated_choice(times, [], 0.02)
    assert picks == {a: first, b: first, c: third}
    assert consolidated_choice(times, [], 0.0) == {a: first, b: second, c: third}
    # a kernel the build compiles anyway (another problem's, from the database) comes first
    other = GemmProblem(m=64, n=768, has_bias=True, **shapes)
    picks = consolidated_choice(times, [(other, second)], 0.02)
    assert picks[a] == second and picks[b] == second and picks[c] == third
    # wide enough, every problem takes one mainloop
    assert set(consolidated_choice(times, [], 0.5).values()) == {first}
    assert mainloop_of(first, a) == mainloop_of(first, b) == mainloop_of(first, c)
    assert mainloop_of(first, a) != mainloop_of(second, a)


def test_the_database_keeps_the_fastest_time_beside_a_consolidated_pick(cache, monkeypatch, tmp_path):
    """Consolidation applies where the winners are compiled after timing (candidates timed on
    the proxy from the kernel library); problems timed on their own epilogue take their
    fastest, whose object is compiled already."""
    shapes = dict(k=768, batch=1, dtype="float16", b_transposed=True)
    a = GemmProblem(m=1024, n=768, activation="relu", has_bias=True, **shapes)
    b = GemmProblem(m=1024, n=3072, activation="gelu", has_bias=True, **shapes)
    fast, close = usable_candidates(90, a)[:2]
    speeds = {a: {fast: 10.0, close: 10.15}, b: {fast: 20.1, close: 20.0}}

    def fake_profile(problems, sm, workdir, compile_flags, jobs, allowed=None, kernels_of=None, **options):
        return {p: {k.name(p): speeds[p].get(k, 50.0) for k in kernels_of(p)} for p in problems}
    monkeypatch.setattr(tuning, "_profile", fake_profile)
    own = choose_kernels([a, b], 90, TuningDatabase(tmp_path / "own.json"), profile=True, workdir=tmp_path / "o",
                         compile_flags=[], tolerance=0.02)
    assert own[a] == fast and own[b] == close  # nothing held: each its fastest
    monkeypatch.setattr(tuning, "_compiled",
                        lambda kernels, timed, flags, workdir, runtime=False, memo=None: [True] * len(kernels))
    database = TuningDatabase(tmp_path / "db.json")
    chosen = choose_kernels([a, b], 90, database, profile=True, workdir=tmp_path / "w", compile_flags=[],
                            tolerance=0.02)
    assert chosen[a] == chosen[b] == fast
    entry = TuningDatabase(tmp_path / "db.json").entry(90, b)
    assert entry["us"] == 20.1 and entry["fastest_us"] == 20.0 and entry["timed_epilogue"] == "bias"
    assert "fastest_us" not in TuningDatabase(tmp_path / "db.json").entry(90, a)