"""The kernel library (byoc/kernel_library.py, `byoc kernels`): objects compiled once per
machine that the object cache finds behind itself, and tuning that times what it holds
instead of compiling candidates."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpu_probe import gpu_present

from byoc.backends.cutlass import tuning
from byoc.backends.cutlass.codegen import cutlass_flags
from byoc.backends.cutlass.kernels import (NO_FILTER, ConvProblem, GemmProblem, kernel_problem, kernel_unit,
                                           usable_candidates)
from byoc.backends.cutlass.library import library_units
from byoc.toolchain import CompileUnit, cache, compile_units
from byoc.toolchain.compiler import unit_cached


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty object cache and an empty kernel library (its default place, under the cache)."""
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BYOC_KERNEL_LIBRARY", raising=False)
    return tmp_path / "cache"


def small_unit(directory: Path, name: str = "kernel", text: str = "int byoc_library_probe() { return 7; }\n"):
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"{name}.cc"
    source.write_text(text)
    return CompileUnit(source, "cxx", ["-O1", "-fPIC"], f"{name}.o")


def test_objects_come_from_the_kernel_library_behind_an_empty_object_cache(empty_cache, tmp_path, monkeypatch):
    assert cache.kernel_library_dir() == empty_cache / "kernels"
    with cache.storing_into(cache.kernel_library_dir()):
        compile_units([small_unit(tmp_path / "a")], tmp_path / "a")
    assert list((empty_cache / "kernels").glob("??/*.o")) and not (empty_cache / "objects").exists()
    # a later build elsewhere: nothing in its object cache, the object from the library
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "other-cache"))
    monkeypatch.setenv("BYOC_KERNEL_LIBRARY", str(empty_cache / "kernels"))
    unit = small_unit(tmp_path / "b")
    assert unit_cached([unit], tmp_path / "b") == [True]
    stats = {}
    objects = compile_units([unit], tmp_path / "b", stats=stats)
    assert stats["compiled"] == [] and objects[0].is_file()
    # another text is another object: compiled, and stored in the object cache, not the library
    changed = small_unit(tmp_path / "c", text="int byoc_library_probe() { return 8; }\n")
    assert unit_cached([changed], tmp_path / "c") == [False]
    compile_units([changed], tmp_path / "c", stats=stats)
    assert stats["compiled"] == [0]
    assert len(list((empty_cache / "kernels").glob("??/*.o"))) == 1
    assert len(list((tmp_path / "other-cache" / "objects").glob("??/*.o"))) == 1


@pytest.fixture
def small_library(monkeypatch, tmp_path):
    """The cutlass backend's library hook replaced by two small C++ units and one that does
    not compile (what `byoc kernels build` does with them is the subject, not CUTLASS), and
    the built-in backend's (the CUDA shim) by none."""
    from byoc.backend import get_backend
    backend = get_backend("cutlass")
    monkeypatch.setattr(get_backend("builtin"), "kernel_library", None)

    def units(target, workdir, dtypes, epilogues):
        assert target.device.kind == "cuda" and dtypes == ("float16",) and epilogues == "proxy"
        return [small_unit(workdir, "one"), small_unit(workdir, "two", "int byoc_two() { return 2; }\n"),
                small_unit(workdir, "broken", "int byoc_broken( { return; }\n")]
    monkeypatch.setattr(backend, "kernel_library", units)


def test_the_library_holds_the_cuda_shim_and_builds_link_the_smallest_held_family_with_their_dtypes(
        empty_cache, tmp_path, monkeypatch):
    """The built-in backend's share of the library: every CUDA shim family for every dtype and
    for the float dtype sets of LIBRARY_SHIM_DTYPES (none for a cpu target), each its own
    object. A build takes a family as compiled for its own dtypes where that is cached; else
    the held one with the fewest dtypes that include its own; with none, it compiles its own."""
    from byoc.backend import get_backend
    from byoc.backends import builtin
    from byoc.target import Target, resolve_device_target
    import byoc.toolchain.compiler as compiler
    device = resolve_device_target("cuda -arch=sm_90")
    target = Target("builtin")
    target.device = device
    held_units = get_backend("builtin").kernel_library(target, tmp_path, ("float16",), "proxy")
    sources = sorted(path.name for path in (Path(builtin.__file__).parent / "shim" / "cuda").glob("*.cu"))
    assert len(held_units) == len(sources) * len(builtin.LIBRARY_SHIM_DTYPES)
    assert len({unit.output for unit in held_units}) == len(held_units)
    assert sorted(Path(u.source).name for u in held_units if not any("SHIM_DTYPES" in f for f in u.flags)) == sources
    target.device = resolve_device_target("cpu")
    assert get_backend("builtin").kernel_library(target, tmp_path, ("float16",), "proxy") == []

    def chosen_masks(used, held_masks):
        """The dtype mask of each family a build of dtypes `used` links when the cache holds
        the families compiled for `held_masks` (None: every dtype)."""
        def mask_of(unit):
            flag = next((f for f in unit.flags if "BYOC_SHIM_DTYPES" in f), None)
            return None if flag is None else int(flag.split("=")[1], 16)
        monkeypatch.setattr(compiler, "unit_cached", lambda units, workdir: [mask_of(u) in held_masks for u in units])
        own = builtin.shim_compile_units(device, {"byoc_shim_conv2d"}, used)
        chosen = builtin.library_shim_units(own, used, device, tmp_path)
        assert [Path(u.source).name for u in chosen] == [Path(u.source).name for u in own]
        return {mask_of(u) for u in chosen}

    float16, float32, int64 = "BYOC_FLOAT16", "BYOC_FLOAT32", "BYOC_INT64"
    assert chosen_masks({float16}, {0x2, 0x3, None}) == {0x2}  # its own, cached
    assert chosen_masks({float16}, {0x3, None}) == {0x3}  # float16 and float32: fewer than every dtype
    assert chosen_masks({float16}, {None, 0x1}) == {None}
    assert chosen_masks({float16}, {0x1}) == {0x2}  # none with its dtypes: its own, compiled
    assert chosen_masks({float16, int64}, {0x2, 0x3, None}) == {None}
    assert chosen_masks({float16, float32}, {0x2, 0x1}) == {0x3}


def test_byoc_kernels_build_show_and_clear(empty_cache, small_library, capsys):
    from byoc.cli import main
    assert main(["kernels", "show"]) == 0
    assert "never built here" in capsys.readouterr().out
    assert main(["kernels", "build", "-q", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["units"] == 3 and summary["compiled"] == 2 and summary["failed"] == 1
    assert summary["where"] == str(empty_cache / "kernels") and summary["bytes"] > 0
    manifest = json.loads((empty_cache / "kernels" / "manifest.json").read_text())
    entry = manifest["builds"]["cuda_sm90:float16:proxy"]
    assert entry["compiled"] == 2 and "broken.cc" in entry["first_failure"]
    # again: what is there stays, nothing compiles twice
    assert main(["kernels", "build", "-q", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["already_there"] == 2 and again["compiled"] == 0
    assert main(["kernels", "show"]) == 0
    shown = capsys.readouterr().out
    assert "2 objects" in shown and "cuda_sm90:float16:proxy: 3 units (0 compiled, 1 failed)" in shown
    assert main(["kernels", "clear"]) == 0
    assert "2 objects deleted" in capsys.readouterr().out
    assert not list((empty_cache / "kernels").glob("??/*.o"))


def test_byoc_kernels_refuses_a_config_that_is_not_for_a_gpu(empty_cache, capsys):
    from byoc.cli import main
    assert main(["kernels", "build", "-c", "cpu"]) == 2
    error = capsys.readouterr().err
    assert "byoc: error:" in error and "not a cuda target" in error and "cuda_sm90" in error


def cuda_sm90_cutlass_flags(tmp_path):
    from byoc.config import load_config
    from byoc.pipeline import BuildContext
    from byoc.target import resolve_device_target
    config = load_config("cuda_sm90")
    context = BuildContext(config=config, target=resolve_device_target(config.target), workdir=tmp_path)
    return cutlass_flags(context.backend_targets["cutlass"], 90)


PROBLEMS = [  # BERT's GEMMs, a ResNet 3x3 conv and its pointwise conv as a GEMM, a stem, bf16
    GemmProblem(128, 3072, 768, 1, "float16", True, "gelu", True, False),
    GemmProblem(128, 768, 3072, 1, "float16", False, None, True, True),
    GemmProblem(2048, 2048, 128, 12, "float16", True),
    ConvProblem(32, 56, 56, 64, 64, 3, 3, 56, 56, (1, 1), (1, 1, 1, 1), (1, 1), "float16", "relu", True, True),
    kernel_problem(90, ConvProblem(32, 56, 56, 256, 64, 1, 1, 56, 56, (1, 1), (0, 0, 0, 0), (1, 1), "float16",
                                   "relu", True)),
    ConvProblem(32, 224, 224, 4, 64, 7, 7, 112, 112, (2, 2), (3, 3, 3, 3), (1, 1), "float16", "relu", True),
]


def test_the_library_holds_every_proxy_unit_tuning_asks_for(tmp_path):
    """The library's units and tuning's are one text with one key: for each problem, every
    candidate of the shipped config's target, on its epilogue proxy, is among the library's
    entries (float16; bfloat16 only when asked for)."""
    flags = cuda_sm90_cutlass_flags(tmp_path)
    library = {unit.entry for unit in library_units(90, flags)}
    for problem in PROBLEMS:
        every = usable_candidates(90, problem)
        stand_in = tuning.timed_problem(problem, every, True)
        assert stand_in.epilogue_name in ("plain", "bias")
        missing = [k.name(stand_in) for k in every if kernel_unit(k, stand_in, flags).entry not in library]
        assert not missing, (problem.key, missing)
    bf16 = GemmProblem(128, 768, 768, 1, "bfloat16", True, None, True)
    assert kernel_unit(usable_candidates(90, bf16)[0], bf16, flags).entry not in library
    both = {unit.entry for unit in library_units(90, flags, ("float16", "bfloat16"))}
    assert kernel_unit(usable_candidates(90, bf16)[0], bf16, flags).entry in both
    with pytest.raises(ValueError, match="float32"):
        library_units(90, flags, ("float32",))


def test_auto_times_every_candidate_the_library_holds_on_its_proxy(empty_cache, monkeypatch, tmp_path):
    problem = PROBLEMS[0]  # bias + GELU: its proxy is the bias alone
    allowed = tuning.CandidateFilter(per_problem=5)
    chosen = usable_candidates(90, problem, allowed)
    every = usable_candidates(90, problem, NO_FILTER)
    assert len(chosen) == 5 < len(every)
    # nothing compiled: the problem's own epilogue, the target's five
    kernels, proxy, held = tuning.tuning_plan(problem, 90, allowed, [], tmp_path, "auto")
    assert (kernels, proxy, held) == (chosen, False, 0)
    # the library holds every proxy unit: each candidate is timed, on the proxy, none compiled
    monkeypatch.setattr(tuning, "_compiled", lambda kernels, timed, flags, workdir, runtime=False, memo=None:
                        [timed.epilogue_name == "bias"] * len(kernels))
    kernels, proxy, held = tuning.tuning_plan(problem, 90, allowed, [], tmp_path, "auto")
    assert (kernels, proxy, held) == (every, True, len(every))
    assert tuning.tuning_plan(problem, 90, allowed, [], tmp_path, "own")[:2] == (chosen, False)
    assert tuning.tuning_plan(problem, 90, allowed, [], tmp_path, "proxy")[:2] == (chosen, True)
    # fewer held than the target's count: as without the library
    monkeypatch.setattr(tuning, "_compiled", lambda kernels, timed, flags, workdir, runtime=False, memo=None:
                        [index < 3 for index in range(len(kernels))])
    assert tuning.tuning_plan(problem, 90, allowed, [], tmp_path, "auto")[:2] == (chosen, False)


def test_planning_asks_the_cache_once_per_unit_across_the_problems_of_a_build(empty_cache, monkeypatch, tmp_path):
    """Problems of one dtype and layout time the same proxy units: with the memo a build keeps
    across its problems, each unit is written and keyed once (ResNet-50's 24 problems ask about
    128 units instead of 1,192), and the answers are the same as without it."""
    import byoc.toolchain.compiler as compiler
    asked = []
    unit_cached = compiler.unit_cached

    def counted(units, workdir):
        asked.extend(unit.output for unit in units)
        return unit_cached(units, workdir)

    monkeypatch.setattr(compiler, "unit_cached", counted)
    allowed = tuning.CandidateFilter(per_problem=5)
    problems = [GemmProblem(128, 768, 768, 1, "float16", True, "gelu", True),
                GemmProblem(512, 3072, 768, 1, "float16", True, "relu", True),
                GemmProblem(128, 768, 3072, 1, "float16", True, None, True, True)]
    alone = [tuning.tuning_plan(problem, 90, allowed, [], tmp_path, "auto") for problem in problems]
    asked_alone = len(asked)
    asked.clear()
    memo = {}
    shared = [tuning.tuning_plan(problem, 90, allowed, [], tmp_path, "auto", False, memo) for problem in problems]
    assert shared == alone
    assert len(asked) == len(set(asked)) < asked_alone
    # every candidate of the three, on its proxy and on each one's own epilogue, asked about once
    assert len(memo) * 2 == len(asked)


def test_a_build_with_the_library_times_the_proxy_and_records_it(empty_cache, monkeypatch, tmp_path):
    """choose_kernels in auto: the profiler is handed every held candidate, on the proxy, and
    the database says which epilogue was timed; the winner is the problem's own kernel."""
    problem = PROBLEMS[0]
    handed = {}

    def fake_profile(problems, sm, workdir, compile_flags, jobs, allowed=None, kernels_of=None, progress=None,
                     proxied=frozenset(), **options):
        results = {}
        for p in problems:
            kernels = kernels_of(p)
            handed[p] = (len(kernels), p in proxied)
            results[p] = {k.name(p): 10.0 - (i == 3) for i, k in enumerate(kernels)}
        return results
    monkeypatch.setattr(tuning, "_profile", fake_profile)
    monkeypatch.setattr(tuning, "_compiled",
                        lambda kernels, timed, flags, workdir, runtime=False, memo=None: [True] * len(kernels))
    database = tuning.TuningDatabase(tmp_path / "db.json")
    chosen = tuning.choose_kernels([problem], 90, database, profile=True, workdir=tmp_path / "w", compile_flags=[],
                                   allowed=tuning.CandidateFilter(per_problem=5))
    every = usable_candidates(90, problem)
    assert handed[problem] == (len(every), True)
    assert chosen[problem] == every[3]
    entry = tuning.TuningDatabase(tmp_path / "db.json").entry(90, problem)
    assert entry["timed_epilogue"] == "bias" and entry["name"].endswith("bias_gelu") and entry["candidates"] == len(every)


def test_a_library_exported_on_one_machine_is_imported_on_another(empty_cache, small_library, tmp_path, monkeypatch,
                                                                    capsys):
    """export packs the objects and the manifest; import into an empty library makes the same
    objects available (a later build fetches them), keeps what is there, and refuses an
    archive with anything else in it, or one that is not an archive, naming it and writing
    nothing."""
    import tarfile
    from byoc.cli import main
    assert main(["kernels", "build", "-q"]) == 0
    assert main(["kernels", "export", "-o", str(tmp_path / "team.tar.gz")]) == 0
    assert "2 objects" in capsys.readouterr().out
    monkeypatch.setenv("BYOC_KERNEL_LIBRARY", str(tmp_path / "elsewhere"))
    assert main(["kernels", "import", str(tmp_path / "team.tar.gz")]) == 0
    assert "2 objects added, 0 already there" in capsys.readouterr().out
    assert main(["kernels", "import", str(tmp_path / "team.tar.gz")]) == 0
    assert "0 objects added, 2 already there" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "elsewhere" / "manifest.json").read_text())
    assert manifest["builds"]["cuda_sm90:float16:proxy"]["imported_from"] == "team.tar.gz"
    unit = small_unit(tmp_path / "later", "one")
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "fresh-cache"))
    assert unit_cached([unit], tmp_path / "later") == [True]
    # an archive with something else in it: refused whole
    (tmp_path / "evil.txt").write_text("x")
    with tarfile.open(tmp_path / "evil.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "evil.txt", arcname="../../outside.o")
    monkeypatch.setenv("BYOC_KERNEL_LIBRARY", str(tmp_path / "third"))
    assert main(["kernels", "import", str(tmp_path / "evil.tar.gz")]) == 2
    error = capsys.readouterr().err
    assert "'../../outside.o' is not a kernel library object" in error and "nothing was imported" in error
    assert not (tmp_path / "third").exists() and not (tmp_path / "outside.o").exists()
    (tmp_path / "junk.tar.gz").write_bytes(b"\x1f\x8b not really")
    assert main(["kernels", "import", str(tmp_path / "junk.tar.gz")]) == 2
    assert "is not a kernel library archive" in capsys.readouterr().err
    assert main(["kernels", "export"]) == 2
    assert "-o OUT.tar.gz" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
def test_a_build_with_the_library_tunes_on_the_gpu_without_compiling_a_candidate(empty_cache, tmp_path, caplog,
                                                                                   monkeypatch):
    """The library for a target of two tiles, then a model whose GEMMs no database knows,
    tuned on the GPU: every candidate comes from the library (tuning compiles none), the
    winners are compiled with their own epilogues, and the library's outputs match the
    float32 reference. (The CUDA shim's share of the library is left out: not the subject.)"""
    import logging

    from byoc.backend import get_backend
    monkeypatch.setattr(get_backend("builtin"), "kernel_library", None)

    import cupy
    import numpy as np

    import byoc
    from byoc import kernel_library
    from byoc.ir.builder import FunctionBuilder
    cutlass = {"sm": 90, "tiles": ["64x64x64", "128x128x64"], "clusters": ["1x1"], "shipped_tuning": False,
               "profile": "true"}
    config = {"target": "cuda -arch=sm_90", "backends": [{"cutlass": cutlass}, "builtin"]}
    config_path = tmp_path / "two_tiles.yaml"
    import yaml
    config_path.write_text(yaml.safe_dump(config))
    summary = kernel_library.build_library(str(config_path))
    assert summary["failed"] == 0 and summary["compiled"] > 0, summary
    rng = np.random.default_rng(3)
    with FunctionBuilder("main") as fb:  # an MLP block no database knows: bias + GELU, then + x
        x = fb.param("x", (200, 384), "float32")
        x16 = fb.call("cast", x, dtype="float16")
        hidden = fb.call("gelu", fb.call("add", fb.call("matmul", x16, (rng.standard_normal((384, 1000)) * 0.05)
                                                        .astype("float16")),
                                         (rng.standard_normal(1000) * 0.1).astype("float16")))
        y = fb.call("add", fb.call("matmul", hidden, (rng.standard_normal((1000, 384)) * 0.05).astype("float16")), x16)
        fb.ret(fb.call("cast", y, dtype="float32"))
    module = fb.module()
    with caplog.at_level(logging.INFO, logger="byoc.build"):
        library = byoc.build(module, config=config, workdir=str(tmp_path / "w"))
    lines = [record.getMessage() for record in caplog.records]
    assert any("every unit compiled already" in line for line in lines), lines
    assert not any("compiling" in line and "candidate" in line for line in lines), lines
    feeds = {"x": rng.standard_normal((200, 384)).astype(np.float32)}
    got = cupy.asnumpy(library.load().run(x=cupy.asarray(feeds["x"])))
    want = byoc.interpret(module, **feeds)
    assert np.max(np.abs(got - want)) <= 2e-2 * np.max(np.abs(want))


def test_a_damaged_or_foreign_archive_is_refused(empty_cache, small_library, tmp_path, monkeypatch, capsys):
    import tarfile
    from byoc.cli import main
    assert main(["kernels", "build", "-q"]) == 0
    assert main(["kernels", "export", "-o", str(tmp_path / "team.tar.gz")]) == 0
    data = bytearray((tmp_path / "team.tar.gz").read_bytes())
    middle = len(data) // 2
    data[middle:middle + 50] = bytes(b ^ 0xFF for b in data[middle:middle + 50])
    (tmp_path / "damaged.tar.gz").write_bytes(bytes(data))
    monkeypatch.setenv("BYOC_KERNEL_LIBRARY", str(tmp_path / "elsewhere"))
    assert main(["kernels", "import", str(tmp_path / "damaged.tar.gz")]) == 2
    assert "damaged" in capsys.readouterr().err
    assert not list((tmp_path / "elsewhere").glob("??/*.o"))
    # named as an object, not one
    (tmp_path / "text.o").write_text("not an object")
    name = "ab/ab" + "0" * 62 + ".o"
    with tarfile.open(tmp_path / "text.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "text.o", arcname=name)
    assert main(["kernels", "import", str(tmp_path / "text.tar.gz")]) == 2
    assert "is not an ELF object" in capsys.readouterr().err
    assert not list((tmp_path / "elsewhere").glob("??/*"))
    # a directory for the archive, and a bad job count
    monkeypatch.delenv("BYOC_KERNEL_LIBRARY")
    assert main(["kernels", "export", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["kernels", "build", "-q", "-j", "0"]) == 2
    assert "jobs=0" in capsys.readouterr().err
