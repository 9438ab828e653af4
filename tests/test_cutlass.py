"""The cutlass backend: kernels render and compile for sm_90 and sm_80 (CI, no GPU), and
every pattern matches a float32 reference on a GPU."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc.ir import FunctionBuilder
from byoc.toolchain.locate import cuda_home
from gpu_probe import gpu_present


def needs_nvcc(test):
    """Compiles CUDA with nvcc (marked nvcc: minutes on 2 cores with an empty object cache;
    `-m "not nvcc"` leaves these out); skipped where nvcc is not installed."""
    return pytest.mark.nvcc(pytest.mark.skipif(cuda_home() is None, reason="nvcc not installed")(test))


def _has_cutlass():
    try:
        import cutlass_library  # noqa: F401
        return True
    except ImportError:
        return False


needs_cutlass = pytest.mark.skipif(not _has_cutlass(), reason="nvidia-cutlass not installed")


def gpu_visible():
    return gpu_present()  # the driver's answer (tests/gpu_probe.py)


@needs_nvcc
@needs_cutlass
@pytest.mark.parametrize("sm", [90, 80])
def test_kernel_families_compile(sm, tmp_path):
    """One kernel of each family (dense with a fused epilogue, batched NT attention matmul,
    NHWC conv2d fprop: sm_90 the 3.x TMA im2col kernel with ResNet's bias + residual + relu
    epilogue, sm_80 the 2.x kernel with a stride-0 bias + relu) renders and compiles with nvcc."""
    from byoc.backends.cutlass.codegen import ENTRIES_FLAGS, cutlass_flags, kernel_compile_units
    from byoc.backends.cutlass.kernels import (ConvProblem, GemmProblem, default_kernel, kernel_flags, kernel_unit,
                                               partition_call)
    from byoc.codegen.templates import render_template
    from byoc.target import Target
    from byoc.toolchain import CompileUnit, compile_units
    target = Target("cutlass", sm=sm)
    conv = (ConvProblem(8, 56, 56, 64, 64, 3, 3, 56, 56, (1, 1), (1, 1, 1, 1), (1, 1), "float16", "relu", True, True)
            if sm == 90 else
            ConvProblem(2, 15, 17, 64, 72, 3, 3, 8, 9, (2, 2), (1, 1, 1, 1), (1, 1), "bfloat16", "relu", True, False))
    problems = [GemmProblem(1024, 3072, 768, 1, "float16", False, "gelu", True, False),
                GemmProblem(128, 128, 64, 96, "bfloat16", True, None, False, False, alpha=0.125), conv,
                GemmProblem(77, 264, 136, 1, "float16", False, None, False, True),  # dense_residual: no bias
                GemmProblem(1000, 264, 136, 1, "float16", False, "hard_swish", True, False)]
    kernels = [default_kernel(sm, problem) for problem in problems]
    if sm == 90:  # split-K (CUTLASS's stream-K scheduler in split-K mode), a 64x96 pingpong, stream-K
        from byoc.backends.cutlass.kernels import GemmKernel
        problems.append(GemmProblem(1024, 768, 3072, 1, "float16", True, None, True, True))
        kernels.append(GemmKernel(90, (128, 128, 64), (1, 1), "coop", splits=2))
        problems.append(GemmProblem(1024, 768, 768, 1, "float16", False, None, True, True))
        kernels.append(GemmKernel(90, (64, 96, 64), (1, 1), "pingpong"))
        problems.append(GemmProblem(1024, 2304, 768, 1, "float16", False, None, False, False))
        kernels.append(GemmKernel(90, (128, 128, 64), (1, 1), "coop", stream_k=True))
        problems.append(GemmProblem(1000, 768, 768, 1, "float16", False, None, True, True))
        kernels.append(GemmKernel(90, (64, 96, 64), (1, 2), "pingpong", swap_ab=True))
        # one warp group, a fixed mainloop depth, a per-row bias with no source C (void)
        problems.append(GemmProblem(1024, 2304, 768, 1, "float16", False, "relu", True, False))
        kernels.append(GemmKernel(90, (192, 96, 64), (1, 1), "ws", swap_ab=True, epilogue_tile=(64, 96),
                                  mainloop_stages=4))
        # a pointwise conv as its GEMM: relu(x [N*H*W, C] w^T + bias + residual)
        problems.append(ConvProblem(2, 15, 15, 64, 256, 1, 1, 15, 15, (1, 1), (0, 0, 0, 0), (1, 1), "float16",
                                    "relu", True, True).as_gemm())
        kernels.append(default_kernel(sm, problems[-1]))
    # an RGB stem padded to 4 channels: CUTLASS 2.x's fixed-channel iterator, on either arch
    problems.append(ConvProblem(2, 33, 33, 4, 64, 7, 7, 17, 17, (2, 2), (3, 3, 3, 3), (1, 1), "float16", "relu",
                                True, False))
    kernels.append(default_kernel(sm, problems[-1]))
    assert kernels[-1].fixed_channels and "_fixed4_" in kernels[-1].name(problems[-1])
    if sm == 80:  # ... and a narrow stem (MobileNet's 16 output channels) on a tile N of 32
        from byoc.backends.cutlass.conv_kernels import ConvKernel
        problems.append(ConvProblem(2, 37, 41, 4, 16, 3, 3, 19, 21, (2, 2), (1, 1, 1, 1), (1, 1), "float16",
                                    "hard_swish", True, False))
        kernels.append(ConvKernel(80, (128, 32, 32), warp=(32, 32, 32), stages=4, fixed_channels=True))
    kernel_units, calls = {}, []
    for index, (problem, kernel) in enumerate(zip(problems, kernels)):
        assert kernel.supports(problem) is None
        indices = {"a": 0, "b": 1}
        for operand, present in (("bias", problem.has_bias), ("residual", problem.has_residual)):
            if present:
                indices[operand] = len(indices)
        unit = kernel_unit(kernel, problem, kernel_flags(kernel, cutlass_flags(target, sm)))
        assert unit.entry.startswith(f"byoc_{kernel.name(problem)}_") and f"int {unit.entry}(" in unit.source
        kernel_units[unit.entry] = unit
        calls.append(partition_call(f"kernel_{index}", unit, kernel, problem, indices))
    entries = render_template("cutlass/entries.cc.j2", {"kernels": sorted(kernel_units), "calls": calls})
    assert "0.125f" in entries  # attention's scale, in the epilogue (alpha)
    (tmp_path / "cutlass_entries.cc").write_text(entries)
    units = kernel_compile_units(kernel_units.values(), tmp_path)
    units.append(CompileUnit(tmp_path / "cutlass_entries.cc", "cxx", ENTRIES_FLAGS, "cutlass_entries.o"))
    objects = compile_units(units, tmp_path)
    assert all(Path(o).stat().st_size > 0 for o in objects)
    # Linked as a build links them (with an empty cache, the halves in unity groups: host
    # halves in one object, each device half's object the group's cubin under its own
    # symbol), every kernel's entry finds its cubin: no weak reference is left unresolved.
    from byoc.toolchain import cuda_link_flags, link_shared
    library = link_shared(objects, tmp_path / "kernels.so", [], cuda_link_flags([]), workdir=tmp_path)
    symbols = subprocess.run(["readelf", "-sW", str(library)], capture_output=True, text=True).stdout
    cubins = {line.split()[-1]: line.split()[6] for line in symbols.splitlines() if line.endswith("_device_cubin")}
    split = [unit for unit in kernel_units.values() if unit.device_source is not None]
    assert {f"{unit.entry}_device_cubin" for unit in split} <= set(cubins)
    assert "UND" not in cubins.values(), cubins


def test_a_kernel_units_entry_is_named_after_what_it_compiles(monkeypatch):
    """The entry's hash covers the rendered text, not the template's name: an edited
    template is a new entry (a unity group's cached object may carry an older one into a
    build: one name must be one code), the same text the same entry."""
    from byoc.backends.cutlass.kernels import GemmProblem, heuristic_kernel, kernel_unit
    from byoc.codegen import templates
    problem = GemmProblem(1024, 768, 768, 1, "float16", False, None, True, True)
    kernel = heuristic_kernel(90, problem)
    before = kernel_unit(kernel, problem, ["-O3"])
    assert before.entry == kernel_unit(kernel, problem, ["-O3"]).entry
    assert before.entry.startswith(f"byoc_{kernel.name(problem)}_") and "BYOC_KERNEL_ENTRY" not in before.source
    assert f"{before.entry}_kernel" in before.device_source and kernel_unit(kernel, problem, ["-O2"]).entry != before.entry
    real_render = templates.render_template
    monkeypatch.setattr(templates, "render_template",
                        lambda name, data: real_render(name, data) + ("// edited\n" if data.get("part") == "host" else ""))
    edited = kernel_unit(kernel, problem, ["-O3"])
    assert edited.entry != before.entry and edited.device_source.replace(edited.entry, before.entry) == before.device_source


def test_heuristic_and_names():
    from byoc.backends.cutlass.kernels import GemmProblem, heuristic_kernel
    problem = GemmProblem(1024, 768, 768, 1, "float16", False, None, True, True)
    kernel = heuristic_kernel(90, problem)
    assert kernel.name(problem).startswith("cutlass_sm90_f16_") and kernel.name(problem).endswith("_nn_bias_residual")
    with pytest.raises(ValueError, match="no sm80 kernel supports"):  # sm80 takes bias or residual, not both
        heuristic_kernel(80, GemmProblem(64, 64, 64, 1, "float16", False, None, True, True))


def test_sm90_kernels_launch_with_pdl_unless_the_target_says_not():
    from byoc.backends.cutlass.codegen import cutlass_flags
    from byoc.target import Target
    gdc = "-DCUTLASS_ENABLE_GDC_FOR_SM90"
    assert gdc in cutlass_flags(Target({"kind": "cutlass", "sm": 90, "pdl": True}), 90)
    assert gdc in cutlass_flags(Target("cutlass", sm=90), 90)  # on by default
    assert gdc not in cutlass_flags(Target({"kind": "cutlass", "sm": 90, "pdl": False}), 90)
    assert gdc not in cutlass_flags(Target({"kind": "cutlass", "sm": 80, "pdl": True}), 80)


def test_operand_swapped_kernels_tile_the_output_transposed_and_are_for_tuning_only():
    from byoc.backends.cutlass.kernels import CandidateFilter, GemmKernel, GemmProblem, heuristic_kernel
    problem = GemmProblem(1024, 2304, 768, 1, "float16", False)
    swapped = GemmKernel(90, (192, 96, 64), (2, 1), "pingpong", swap_ab=True)
    # 192 of D's columns by 96 of its rows: 12 x 11 CTAs, one wave on 132 SMs
    assert swapped.output_tile() == (96, 192) and swapped.ctas(problem) == 132
    assert swapped.name(problem) == "cutlass_sm90_f16_192x96x64_2x1_pingpong_swapab_nn_plain"
    assert GemmKernel.from_json(swapped.to_json()) == swapped
    assert not heuristic_kernel(90, problem).swap_ab
    only_swapped = CandidateFilter.from_target({"tiles": ["192x96x64"]})  # the heuristic's last resort
    assert heuristic_kernel(90, problem, only_swapped) == GemmKernel(90, (192, 96, 64), (1, 1), "pingpong",
                                                                     swap_ab=True)
    assert "sm90 kernels" in GemmKernel(80, (192, 96, 64), swap_ab=True).supports(problem)


def test_mainloop_stages_name_render_and_round_trip():
    from byoc.backends.cutlass.kernels import GemmKernel, GemmProblem, kernel_from_json, kernel_template
    from byoc.codegen.templates import render_template
    problem = GemmProblem(1024, 2304, 768, 1, "float16", False)
    fixed = GemmKernel(90, (192, 96, 64), (1, 1), "ws", swap_ab=True, epilogue_tile=(64, 96), mainloop_stages=4)
    assert fixed.name(problem) == "cutlass_sm90_f16_192x96x64_1x1_ws_swapab_epi64x96_4stage_nn_plain"
    assert kernel_from_json(fixed.to_json()) == fixed
    automatic = GemmKernel(90, (192, 96, 64), (1, 1), "ws", swap_ab=True, epilogue_tile=(64, 96))
    assert "mainloop_stages" not in automatic.to_json()  # databases written before the field read the same

    def text(kernel, problem):
        return render_template(kernel_template(kernel), {**kernel.type_data(problem), "entry": "k", "part": "host"})
    assert "StageCount<4>" in text(fixed, problem) and "StageCountAutoCarveout" not in text(fixed, problem)
    assert "StageCountAutoCarveout" in text(automatic, problem)
    # no source C unless there is a residual to add
    assert "using ElementC = void;" in text(fixed, problem)
    residual = GemmProblem(1024, 768, 768, 1, "float16", False, None, False, True)
    assert "using ElementC = Element;" in text(GemmKernel(90, (128, 64, 64)), residual)
    assert "sm90 kernels" in GemmKernel(80, (128, 128, 32), mainloop_stages=4).supports(problem)


def test_tuning_times_the_cost_models_first_candidates_and_they_hold_the_measured_winners():
    """tuning_candidates (5 by default): the heuristic's kernel and the cost model's first
    four of the rest. On every GEMM problem of the shipped database whose candidates were
    (nearly) all timed on an H100, those five hold a kernel within 3% of the winner."""
    import json
    from byoc.backends.cutlass import tuning
    from byoc.backends.cutlass.kernels import CandidateFilter, GemmProblem, heuristic_kernel, usable_candidates
    from byoc.target import Target
    assert CandidateFilter.from_target(Target("cutlass", sm=90).attrs).per_problem == 5
    entries = json.loads(tuning.SHIPPED_DATABASE.read_text())["entries"]["sm90"]
    checked = 0
    for key, entry in entries.items():
        if key.startswith("conv2d") or sum(us is not None for us in entry["measured"].values()) < 10:
            continue
        dtype, m, n, k, batch, layout, epilogue = key.split(":")
        steps = epilogue.split("_")
        problem = GemmProblem(int(m[1:]), int(n[1:]), int(k[1:]), int(batch[1:]), dtype, layout == "nt",
                              next((a for a in ("gelu", "relu") if a in steps), None), "bias" in steps,
                              "residual" in steps)
        assert problem.key == key
        kept = usable_candidates(90, problem, CandidateFilter(per_problem=5))
        assert len(kept) == 5 and kept[0] == heuristic_kernel(90, problem)
        timed = [entry["measured"].get(kernel.name(problem)) for kernel in kept]
        assert min(us for us in timed if us is not None) <= 1.03 * entry["us"], (key, timed, entry["name"])
        checked += 1
    assert checked >= 8
    assert len(usable_candidates(90, problem)) > 20  # without the limit: every candidate


def test_target_narrows_candidates_and_split_k_is_for_tuning_only():
    from byoc.backends.cutlass.kernels import CandidateFilter, GemmProblem, candidates, heuristic_kernel, \
        usable_candidates
    problem = GemmProblem(1024, 768, 3072, 1, "float16", True, None, True, False)
    assert all(k.splits == 1 and not k.stream_k for k in candidates(90))  # split K only when asked
    with_split = CandidateFilter.from_target({"split_k": True})
    everything = candidates(90, with_split)
    assert {k.splits for k in everything} == {1, 2, 4, 8} and sum(k.stream_k for k in everything) == 2
    split = [k for k in everything if k.splits > 1]
    assert "_splitk2_" in split[0].name(problem)
    assert "_streamk_" in [k for k in everything if k.stream_k][0].name(problem)
    # M=1024: unsplit kernels fill the GPU, so the heuristic does not split (and never picks stream-K)
    assert heuristic_kernel(90, problem, with_split).splits == 1
    usable = usable_candidates(90, problem, with_split)
    assert usable[0] == heuristic_kernel(90, problem, with_split)  # the profiler's reference comes first
    assert any(k.splits == 8 for k in usable) and any(k.stream_k for k in usable)
    short = GemmProblem(1024, 768, 256, 1, "float16", True, None, False, False)  # 4 K tiles: split 2 only
    assert {k.splits for k in usable_candidates(90, short, with_split)} == {1, 2}
    # not even at batch 1, where unsplit tiles leave most SMs idle (measured slower there)
    bert_b1 = GemmProblem(128, 768, 768, 1, "float16", False, None, True, True)
    assert heuristic_kernel(90, bert_b1, with_split).splits == 1

    narrow = CandidateFilter.from_target({"tiles": ["128x128x64"], "clusters": ["1x1"]})
    assert {(k.tile, k.cluster) for k in candidates(90, narrow)} == {((128, 128, 64), (1, 1))}
    assert {k.stages for k in candidates(80, CandidateFilter.from_target({"stages": [4]}))} == {4}
    with pytest.raises(ValueError, match="cutlass tiles: '128x128' is not a shape like '128x128x64'"):
        CandidateFilter.from_target({"tiles": ["128x128"]})
    nothing = CandidateFilter.from_target({"tiles": ["8x8x8"]})
    with pytest.raises(ValueError, match="among the candidates the cutlass target allows"):
        heuristic_kernel(90, problem, nothing)


def test_a_problem_missing_from_the_database_takes_the_same_shapes_kernel(tmp_path):
    """Without tuning, a problem the database lacks takes the kernel remembered for the same
    operands with another epilogue (bias where the database has plain), not the heuristic;
    another shape still takes the heuristic."""
    from byoc.backends.cutlass.kernels import GemmKernel, GemmProblem, heuristic_kernel
    from byoc.backends.cutlass.tuning import TuningDatabase, choose_kernels
    plain = GemmProblem(1024, 2304, 768, 1, "float16", False, None, False, False)
    biased = GemmProblem(1024, 2304, 768, 1, "float16", False, None, True, False)
    other = GemmProblem(1024, 768, 768, 1, "float16", False, None, True, False)
    database = TuningDatabase(tmp_path / "db.json")
    remembered = GemmKernel(90, (192, 96, 64), (1, 1), "ws", swap_ab=True, mainloop_stages=4)
    assert remembered != heuristic_kernel(90, biased)
    database.record(90, plain, remembered, 7.5, {})
    chosen = choose_kernels([biased, other], 90, database, profile=False, workdir=tmp_path, compile_flags=[])
    assert chosen[biased] == remembered and chosen[other] == heuristic_kernel(90, other)


def test_tuning_says_what_it_compiles_and_how_far_it_is(tmp_path, monkeypatch):
    """A tuning run reports its phases through the build's progress (the heartbeat repeats
    the last one): which problems, how many candidate kernels, and ninja's [n/m] lines as
    the candidates compile (a build used to say 'partitioned: ...' for minutes)."""
    import byoc.toolchain
    from byoc.backends.cutlass.kernels import GemmProblem
    from byoc.backends.cutlass.tuning import TuningDatabase, choose_kernels
    from byoc.errors import BuildError
    from byoc.progress import BuildProgress
    problems = [GemmProblem(1024, 2304, 768, 1, "float16", False, None, True, False),
                GemmProblem(1024, 768, 3072, 1, "float16", False, None, True, True)]
    lines = []

    def compile_units(units, workdir, jobs=None, progress=None, stats=None):
        progress(f"[1/{len(units)}] compile {Path(units[0].source).name}")
        raise BuildError("no compiler here")  # the tuner goes on without those candidates
    monkeypatch.setattr(byoc.toolchain, "compile_units", compile_units)
    progress = BuildProgress()
    monkeypatch.setattr(progress, "_log", lines.append)
    with pytest.warns(byoc.ByocWarning, match="did not compile"):
        choose_kernels(problems, 90, TuningDatabase(tmp_path / "db.json"), profile=True, workdir=tmp_path,
                       compile_flags=[], progress=progress)
    assert re.match(r"cutlass tuning: \d+ candidate kernels for 2 problems \(float16:m1024:n2304.*\): compiling \d+ of "
                    r"their \d+ units", lines[0]), lines
    assert re.match(r"\[1/\d+\] compile ", lines[1]) and progress.last_what.startswith("compiling, 1 of "), lines


def test_the_shipped_database_comes_after_the_users_and_is_never_written(tmp_path):
    """Every entry of the database shipped in the package is a kernel byoc renders; a build
    without a tuning_db takes its kernels (no tuning run), the user's database wins where
    both know a problem, and recording writes the user's file only."""
    from byoc.backends.cutlass.kernels import GemmKernel, GemmProblem, kernel_from_json
    from byoc.backends.cutlass.tuning import SHIPPED_DATABASE, TuningDatabase, choose_kernels
    shipped = TuningDatabase(SHIPPED_DATABASE)
    assert shipped.entries["sm90"], "the package ships sm_90 kernels"
    for entry in shipped.entries["sm90"].values():
        kernel_from_json(entry["kernel"])
    key = next(key for key in sorted(shipped.entries["sm90"]) if key.startswith("float16:m"))
    dtype, m, n, k, batch, layout, epilogue = key.split(":")
    problem = GemmProblem(int(m[1:]), int(n[1:]), int(k[1:]), int(batch[1:]), dtype, layout == "nt",
                          None if epilogue in ("plain", "bias", "residual", "bias_residual") else epilogue.split("_")[-1],
                          "bias" in epilogue, "residual" in epilogue)
    assert problem.key == key
    before = SHIPPED_DATABASE.read_bytes()
    users = TuningDatabase(tmp_path / "db.json", fallback=shipped)
    from_package = choose_kernels([problem], 90, users, profile=True, workdir=tmp_path, compile_flags=[])[problem]
    assert from_package == kernel_from_json(shipped.entries["sm90"][key]["kernel"])  # found: nothing measured
    mine = GemmKernel(90, (64, 64, 64), (1, 1), "pingpong")
    users.record(90, problem, mine, 1.0, {})
    users.save()
    assert choose_kernels([problem], 90, users, profile=False, workdir=tmp_path, compile_flags=[])[problem] == mine
    assert SHIPPED_DATABASE.read_bytes() == before


def test_tuning_database_entry_outside_the_targets_candidates_is_not_used(tmp_path):
    from byoc.backends.cutlass.kernels import CandidateFilter, GemmKernel, GemmProblem
    from byoc.backends.cutlass.tuning import TuningDatabase, choose_kernels
    problem = GemmProblem(1024, 768, 768, 1, "float16", True, None, True, False)
    database = TuningDatabase(tmp_path / "db.json")
    remembered = GemmKernel(90, (128, 256, 64), (1, 2), "coop")
    database.record(90, problem, remembered, 10.0, {})
    database.save()
    again = TuningDatabase(tmp_path / "db.json")
    assert choose_kernels([problem], 90, again, profile=False, workdir=tmp_path, compile_flags=[])[problem] == remembered
    narrow = CandidateFilter.from_target({"tiles": ["128x128x64"]})
    chosen = choose_kernels([problem], 90, again, profile=False, workdir=tmp_path, compile_flags=[], allowed=narrow)
    assert chosen[problem].tile == (128, 128, 64)
    split = GemmKernel(90, (128, 128, 64), (1, 1), "coop", splits=4)
    assert GemmKernel.from_json(split.to_json()) == split and "splits" not in remembered.to_json()
    stream = GemmKernel(90, (128, 128, 64), (1, 1), "coop", stream_k=True)
    assert GemmKernel.from_json(stream.to_json()) == stream and "stream_k" not in remembered.to_json()


VALID_KERNEL = {"sm": 90, "tile": [128, 64, 64], "cluster": [1, 1], "schedule": "coop", "warp": [64, 64, 32],
                "stages": 3}


@pytest.mark.parametrize("kernel, says", [
    ({**VALID_KERNEL, "schedule": "bogus"}, "schedule is 'bogus', expected one of"),
    ({k: v for k, v in VALID_KERNEL.items() if k != "tile"}, "has no 'tile'"),
    ({**VALID_KERNEL, "tile": [128, 64]}, "expected three positive integers"),
    ({**VALID_KERNEL, "tile": 128}, "is malformed"),
    ({**VALID_KERNEL, "epilogue_tile": [128, "64"]}, "epilogue_tile is"),
    ({**VALID_KERNEL, "mainloop_stages": 1}, "mainloop_stages is 1, expected 0"),
    ({**VALID_KERNEL, "sm": 75}, "sm is 75, expected 80 or 90"),
    ({**VALID_KERNEL, "kind": "conv2d", "cluster": [0, 1]}, "cluster is [0, 1]"),
    ({**VALID_KERNEL, "sm": 80, "stages": 1}, "at least 2 stages"),
    ("128x64x64", "a kernel is a JSON object"),
])
def test_malformed_tuning_database_entry_is_a_clear_build_error(kernel, says, tmp_path):
    """A tuning database is shared between machines and may be edited by hand: an entry that
    is not a kernel byoc renders stops the build with the file, the problem and the flaw,
    not a traceback from deep inside code generation."""
    from byoc.backends.cutlass.kernels import GemmProblem
    from byoc.backends.cutlass.tuning import TuningDatabase
    from byoc.errors import BuildError
    problem = GemmProblem(1024, 768, 768, 1, "float16", False)
    path = tmp_path / "db.json"
    path.write_text(json.dumps({"format": "byoc-cutlass-tuning", "version": 1,
                                "entries": {"sm90": {problem.key: {"kernel": kernel, "us": 1.0}}}}))
    with pytest.raises(BuildError) as raised:
        TuningDatabase(path).lookup(90, problem)
    message = str(raised.value)
    assert str(path) in message and problem.key in message and says in message, message
    path.write_text(json.dumps({"format": "byoc-cutlass-tuning", "version": 1,
                                "entries": {"sm90": {problem.key: {**VALID_KERNEL, "us": 1.0}}}}))
    with pytest.raises(BuildError, match=re.escape(f"the sm90 entry for {problem.key} has no 'kernel' object")):
        TuningDatabase(path).lookup(90, problem)
    path.write_text(json.dumps({"format": "byoc-cutlass-tuning", "version": 1, "entries": []}))
    with pytest.raises(BuildError, match="'entries' must map"):
        TuningDatabase(path)


@pytest.mark.parametrize("content, says", [
    ("[1, 2, 3]", "is not a byoc-cutlass-tuning version 1 file"),
    ('"text"', "is not a byoc-cutlass-tuning version 1 file"),
    (b"\xff\xfe", "cannot read it as a tuning database: not valid UTF-8 JSON"),
    ("[" * 100000, "cannot read it as a tuning database: its JSON nests more than 64 levels deep"),
    ('{"format": "byoc-cutlass-tuning", "version": 1, "entries": {"sm90": {"k": {"us": 1' + "0" * 400 + '}}}}',
     "cannot read it as a tuning database: an integer of 401 digits"),
    ('{"format": "byoc-cutlass-tuning", "version": 1, "entries": {"sm90": {"k": {"us": NaN}}}}',
     "cannot read it as a tuning database: NaN is no number"),
    (None, "it is a FIFO, not a regular file"),
])
def test_tuning_database_file_of_the_wrong_kind_is_a_clear_build_error(content, says, tmp_path):
    from byoc.backends.cutlass.tuning import TuningDatabase
    from byoc.errors import BuildError
    path = tmp_path / "db.json"
    if content is None:
        os.mkfifo(path)  # read, it would block forever; /dev/zero would fill memory
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(BuildError, match=re.escape(says)):
        TuningDatabase(path)


@needs_nvcc
def test_profiler_renders_and_compiles(tmp_path):
    """The tuner's profiler: every problem's candidates timed in one process, each checked
    against the problem's first; its entry points call the kernels as a model's do. Its
    driver is static (nvcc, once into the object cache); the table of problems and
    candidates that a build generates is plain C++."""
    from byoc.backends.cutlass.kernels import INCLUDE_DIR, GemmKernel, GemmProblem, kernel_unit, partition_call
    from byoc.backends.cutlass.tuning import PROFILER_MAIN
    from byoc.codegen.templates import render_template
    from byoc.toolchain import CompileUnit, compile_units
    problems = [GemmProblem(64, 64, 64, 1, "float16", True), GemmProblem(128, 64, 64, 1, "float16", True, None, True)]
    kernels = [GemmKernel(90, (64, 64, 64), (1, 1), "pingpong"), GemmKernel(90, (128, 64, 64), (1, 1), "coop")]
    data, entries = [], set()
    for index, problem in enumerate(problems):
        calls = []
        for number, kernel in enumerate(kernels):
            unit = kernel_unit(kernel, problem, [])
            entries.add(unit.entry)
            indices = {"a": 0, "b": 1, **({"bias": 2} if problem.has_bias else {})}
            calls.append(partition_call(f"candidate_{index}_{number}", unit, kernel, problem, indices))
        data.append({"key": problem.key, "candidates": calls, "sizes": [4096, 4096, 64 if problem.has_bias else 0, 0],
                     "out_size": problem.m * 64, "slots": [0, 1, 2] if problem.has_bias else [0, 1],
                     "bfloat16": False, "workspace_bytes": 1 << 20, "fill_base": "0x3000u", "fill_mask": "0x03FFu"})
    source = tmp_path / "profiler_table.cc"
    source.write_text(render_template("cutlass/profiler_table.cc.j2", {"kernels": sorted(entries), "problems": data,
                                                                       "iterations": 20, "problem_seconds": 120}))
    text = source.read_text()
    assert text.count("static int candidate_") == 4
    assert "problems, 2, 20, 120};" in text  # a hung candidate ends the profiler after 120 s
    assert "disagrees with the reference kernel" in PROFILER_MAIN.read_text()
    objects = compile_units([CompileUnit(PROFILER_MAIN, "cuda", ["-arch=sm_90", "-O2", f"-I{INCLUDE_DIR}"],
                                         "profiler_main.o"),
                             CompileUnit(source, "cxx", ["-O1", f"-I{INCLUDE_DIR}"], "profiler_table.o")], tmp_path)
    assert all(path.stat().st_size > 0 for path in objects)


def _model(kind, m, n, k, dtype="float16", batch=()):
    rng = np.random.default_rng(0)
    with FunctionBuilder("main") as fb:
        a = fb.param("a", batch + (m, k), "float32")
        a16 = fb.call("cast", a, dtype=dtype)
        if kind.startswith("batched"):
            b = fb.param("b", batch + ((n, k) if kind.startswith("batched_nt") else (k, n)), "float32")
            b16 = fb.call("cast", b, dtype=dtype)
            if kind.startswith("batched_nt"):
                rank = len(batch) + 2
                b16 = fb.call("transpose", b16, axes=tuple(range(rank - 2)) + (rank - 1, rank - 2))
            y = fb.call("matmul", a16, b16)
            if kind.endswith("scaled"):  # attention's scores / sqrt(d): the epilogue's alpha
                y = fb.call("divide", y, np.array(8.0, dtype))
        else:
            if "reshaped" in kind:  # GPT-2's Conv1D: x.view(-1, k) @ w + b, .view(1, m, n)
                a16 = fb.call("reshape", fb.call("reshape", a16, shape=[1, m, k]), shape=[m, k])
            w = (rng.standard_normal((k, n)) * 0.1).astype(dtype)
            y = fb.call("matmul", a16, w)
            if "bias" in kind:
                y = fb.call("add", y, (rng.standard_normal(n) * 0.1).astype(dtype))
            out_shape = batch + (m, n)
            if "reshaped" in kind:
                y = fb.call("reshape", y, shape=[1, m, n])
                out_shape = (1, m, n)
            if "gelu" in kind:
                y = fb.call("gelu", y, approximate="tanh" if "tanh" in kind else "none")
            if "relu" in kind:
                y = fb.call("relu", y)
            if "hard_swish" in kind:
                y = fb.call("hard_swish", y)
            if "residual" in kind:
                r = fb.param("r", out_shape, "float32")
                y = fb.call("add", y, fb.call("cast", r, dtype=dtype))
        fb.ret(fb.call("cast", y, dtype="float32"))
    return fb.module()


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
@pytest.mark.parametrize("kind, m, n, k, batch", [
    ("dense", 1000, 264, 136, ()), ("dense_bias", 77, 512, 256, (3,)), ("dense_bias_gelu", 1024, 3072, 768, ()),
    ("dense_bias_relu", 130, 200, 64, ()), ("dense_bias_residual", 333, 768, 768, ()),
    ("batched", 128, 64, 128, (2, 12)), ("batched_nt", 128, 128, 64, (2, 12)),
    ("batched_nt_scaled", 128, 128, 64, (2, 12)), ("batched_scaled", 100, 72, 64, (3,)),
    ("dense_bias_residual", 128, 768, 768, ()), ("dense_bias_relu", 1, 1024, 1024, ()),  # batch 1
    ("dense_residual", 77, 264, 136, ()),  # no bias (T5; untrained HF biases fold away)
    # GPT-2's gelu_new, and its reshape-wrapped GEMMs (SinkReshapes brings the epilogue ops back)
    ("dense_bias_gelu_tanh", 130, 3072, 768, ()), ("reshaped_dense_bias_gelu_tanh", 77, 1000, 256, ()),
    ("reshaped_dense_bias_residual", 77, 768, 3072, ()),
    ("dense_bias_hard_swish", 1000, 264, 136, ())])  # MobileNetV3's expansions
def test_patterns_match_float32_reference(kind, m, n, k, batch, tmp_path):
    import cupy
    mod = _model(kind, m, n, k, batch=batch)
    library = byoc.build(mod, config={"target": "auto", "backends": [{"cutlass": {"profile": "false"}}]},
                         workdir=str(tmp_path / "w"))
    assert "cutlass" in library.metadata["backends"], library.report.to_text()
    if "hard_swish" in kind:  # in the epilogue, not a kernel of its own
        assert "HardSwish" in "".join(p.read_text() for p in (tmp_path / "w").glob("byoc_cutlass_*.cu"))
    module = library.load()
    rng = np.random.default_rng(1)
    inputs = {p.name_hint: rng.standard_normal(p.type.shape).astype(np.float32) for p in mod["main"].params}
    got = cupy.asnumpy(module.run(**{k_: cupy.asarray(v) for k_, v in inputs.items()}))
    # float32 reference: the same graph with every cast to float16 removed
    reference = byoc.interpret(mod, **inputs)
    scale = np.max(np.abs(reference))
    assert np.max(np.abs(got - reference)) <= 1e-2 * scale, kind


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
@pytest.mark.parametrize("kind, m, n, k, kernel", [
    ("dense", 1024, 2304, 768, {"tile": [128, 128, 64], "stream_k": True}),
    ("dense_bias_residual", 1000, 768, 768, {"tile": [128, 64, 64], "stream_k": True}),
    ("dense_bias_gelu", 1024, 768, 3072, {"tile": [128, 128, 64], "splits": 2}),
    # operand-swapped kernels (D^T = B^T A^T): the last row tile of 96 is partly outside M
    ("dense", 1000, 2304, 768, {"tile": [192, 96, 64], "cluster": [2, 1], "schedule": "pingpong", "swap_ab": True}),
    ("dense_bias_residual", 1000, 768, 768, {"tile": [64, 96, 64], "cluster": [1, 2], "schedule": "pingpong",
                                             "swap_ab": True}),
    ("dense_bias_gelu", 130, 200, 136, {"tile": [128, 48, 64], "swap_ab": True}),
    # epilogue sub-tiles as large as the CTA tile's N
    ("dense_bias_gelu", 1000, 2304, 768, {"tile": [192, 96, 64], "schedule": "pingpong", "swap_ab": True,
                                         "epilogue_tile": [64, 96]}),
    ("dense_bias_residual", 333, 768, 768, {"tile": [128, 64, 64], "epilogue_tile": [128, 64]}),
    # one consumer warp group, not persistent
    ("dense_bias", 1000, 2304, 768, {"tile": [192, 96, 64], "schedule": "ws", "swap_ab": True,
                                     "epilogue_tile": [64, 96]}),
    ("dense_bias_residual", 333, 768, 768, {"tile": [64, 128, 64], "schedule": "ws"}),
    ("dense", 1000, 768, 200, {"tile": [128, 64, 64], "schedule": "ws"}),
    # ... with a fixed mainloop depth (no source C: the bias is the epilogue's only input)
    ("dense_bias_gelu", 1000, 2304, 768, {"tile": [192, 96, 64], "schedule": "ws", "swap_ab": True,
                                         "epilogue_tile": [64, 96], "mainloop_stages": 4}),
    ("dense", 1000, 3072, 200, {"tile": [128, 192, 64], "schedule": "ws", "mainloop_stages": 4}),
])
def test_tuning_only_kernels_from_the_tuning_database_match_float32_reference(kind, m, n, k, kernel, tmp_path):
    """Kernels only tuning picks (stream-K, split-K, operand-swapped), forced through a
    tuning-database entry."""
    import cupy
    from byoc.backends.cutlass.kernels import GemmProblem, kernel_from_json
    from byoc.backends.cutlass.tuning import TuningDatabase
    mod = _model(kind, m, n, k)
    problem = GemmProblem(m, n, k, 1, "float16", False, "gelu" if "gelu" in kind else None, "bias" in kind,
                          "residual" in kind)
    forced = kernel_from_json({"sm": 90, "cluster": [1, 1], "schedule": "coop", "warp": [64, 64, 32], "stages": 3,
                               **kernel})
    database = TuningDatabase(tmp_path / "db.json")
    database.record(90, problem, forced, 1.0, {})
    database.save()
    library = byoc.build(mod, config={"target": "auto", "backends": [
        {"cutlass": {"profile": "false", "split_k": True, "tuning_db": str(tmp_path / "db.json")}}]},
        workdir=str(tmp_path / "w"))
    sources = "".join(p.read_text() for p in (tmp_path / "w").rglob("*.cu"))
    assert forced.name(problem) in sources, library.report.to_text()
    module = library.load()
    rng = np.random.default_rng(2)
    inputs = {p.name_hint: rng.standard_normal(p.type.shape).astype(np.float32) for p in mod["main"].params}
    reference = byoc.interpret(mod, **inputs)
    for _ in range(3):  # the workspace's reduction flags must be reset between runs
        got = cupy.asnumpy(module.run(**{k_: cupy.asarray(v) for k_, v in inputs.items()}))
        assert np.max(np.abs(got - reference)) <= 1e-2 * np.max(np.abs(reference)), forced.name(problem)


# ---------------------------------------------------------------- conv2d (NHWC)


def test_conv_heuristic_names_and_tuning_keys():
    from byoc.backends.cutlass.kernels import (ConvKernel, ConvProblem, default_kernel, kernel_from_json,
                                               kernel_template, operand_sizes, usable_candidates)
    problem = ConvProblem(8, 56, 56, 64, 64, 3, 3, 56, 56, (1, 1), (1, 1, 1, 1), (1, 1), "float16", "relu", True, True)
    kernel = default_kernel(90, problem)
    assert kernel.name(problem).startswith("cutlass_sm90_f16_fprop_")
    assert kernel.name(problem).endswith("_ws_bias_residual_relu")
    assert kernel.tile[1] == 64  # K=64 output channels: no half-empty 128-wide tiles
    assert kernel_template(kernel) == "cutlass/conv2d_sm90.cu.j2"
    assert kernel_from_json(kernel.to_json()) == kernel
    assert problem.key == "conv2d:float16:n8h56w56c64:k64r3s3:stride1x1:pad1x1x1x1:dilation1x1:bias_residual_relu"
    assert operand_sizes(problem) == [8 * 56 * 56 * 64, 64 * 9 * 64, 64, 8 * 56 * 56 * 64, 8 * 56 * 56 * 64]
    small = ConvProblem(1, 7, 7, 512, 512, 3, 3, 7, 7, (1, 1), (1, 1, 1, 1), (1, 1), "bfloat16")
    sm80 = default_kernel(80, small)
    assert sm80.name(small).startswith("cutlass_sm80_bf16_fprop_") and sm80.name(small).endswith("stage_plain")
    assert all(isinstance(k, ConvKernel) for k in usable_candidates(80, small))


def _conv_graph(data_shape, weight_shape, *, dtype="float16", data_layout="NHWC", groups=1, strides=(1, 1),
                pads=(0, 0, 0, 0), bias=True, residual=False, activation="relu"):
    rng = np.random.default_rng(0)
    kernel_layout = "OHWI" if data_layout == "NHWC" else "OIHW"
    with FunctionBuilder("main") as fb:
        x = fb.param("x", data_shape, dtype)
        w = (rng.standard_normal(weight_shape) * 0.1).astype(dtype)
        y = fb.call("conv2d", x, w, strides=strides, pads=pads, groups=groups, data_layout=data_layout,
                    kernel_layout=kernel_layout)
        channels = weight_shape[0]
        if bias:
            y = fb.call("add", y, (rng.standard_normal(channels) * 0.1).astype(dtype))
        if residual:
            y = fb.call("add", y, fb.param("r", tuple(fb.bindings[-1].var.type.shape), dtype))
        if activation:
            y = fb.call(activation, y)
        fb.ret(y)
    return fb.module()


def _partition(mod, backends=("cutlass",)):
    from byoc.backends.builtin.partition import partition_builtin
    from byoc.transform.partition import partition_for
    return partition_for(mod, list(backends), finalize=partition_builtin)


def _compilers(mod) -> list:
    return sorted(f.attrs.get("Compiler") for name, f in mod.items() if name != "main")


@pytest.mark.parametrize("case, graph, reason", [
    ("channels", dict(data_shape=(1, 9, 9, 12), weight_shape=(16, 3, 3, 12)),
     "C=12 is not a multiple of 8 (16-byte accesses of float16 along C"),
    ("out_channels", dict(data_shape=(1, 9, 9, 16), weight_shape=(20, 3, 3, 16)),
     "K=20 is not a multiple of 8 (16-byte accesses of float16 along K, the contiguous extent of the NPQK output"),
    ("groups", dict(data_shape=(1, 9, 9, 16), weight_shape=(16, 3, 3, 8), groups=2), "groups=2"),
    ("nchw", dict(data_shape=(1, 16, 9, 9), weight_shape=(16, 16, 3, 3), data_layout="NCHW", bias=False),
     "data_layout NCHW"),
    ("dtype", dict(data_shape=(1, 9, 9, 16), weight_shape=(16, 3, 3, 16), dtype="float32"), "dtype float32"),
])
def test_conv_checks_refuse_with_reasons(case, graph, reason):
    """A conv the kernels cannot take falls to the built-in backend, which runs it in either
    layout, and the partition report says why."""
    mod, report = _partition(_conv_graph(**graph))
    assert "cutlass" not in _compilers(mod), case
    assert reason in report.to_text(), report.to_text()


def test_conv_patterns_take_resnet_epilogues():
    from byoc.backends.cutlass.codegen import partition_problem
    mod, report = _partition(_conv_graph((2, 14, 14, 64), (64, 3, 3, 64), pads=(1, 1, 1, 1), residual=True))
    assert _compilers(mod) == ["cutlass"], report.to_text()
    function = next(f for name, f in mod.items() if name != "main")
    problem, indices = partition_problem(function)
    assert (problem.has_bias, problem.has_residual, problem.activation) == (True, True, "relu")
    assert (problem.out_h, problem.out_w, problem.kernel_h) == (14, 14, 3)
    assert indices == {"a": 0, "b": 1, "bias": 2, "residual": 3}
    composite = next(b.value for b in function.bindings if b.value.__class__.__name__ == "Function")
    assert composite.attrs["Composite"] == "cutlass.conv2d_bias_residual_activation"


def test_a_measured_split_k_winner_is_used_without_split_k_candidates(tmp_path):
    """split_k only widens what tuning compiles: a database entry that splits K was measured
    fastest and is used by a target without split_k; the tile filter still applies."""
    from byoc.backends.cutlass.kernels import NO_FILTER, CandidateFilter, GemmKernel, GemmProblem, candidates
    from byoc.backends.cutlass.tuning import TuningDatabase, choose_kernels
    problem = GemmProblem(128, 768, 3072, 1, "float16", False, None, True, True)
    split = GemmKernel(90, (128, 64, 64), (1, 1), "coop", splits=4)
    assert split not in candidates(90) and split in candidates(90, CandidateFilter(split_k=True))
    database = TuningDatabase(tmp_path / "db.json")
    database.record(90, problem, split, 3.0, {})
    chosen = choose_kernels([problem], 90, database, profile=False, workdir=tmp_path, compile_flags=[])
    assert chosen[problem] == split
    narrowed = CandidateFilter(tiles=((64, 64, 64),))
    chosen = choose_kernels([problem], 90, database, profile=False, workdir=tmp_path, compile_flags=[],
                            allowed=narrowed)
    assert chosen[problem].tile == (64, 64, 64) and NO_FILTER.admits(split, measured=True)


def test_pointwise_convs_are_gemms_with_the_residual_inside_the_activation():
    """A 1x1, stride-1, unpadded NHWC conv is the GEMM [N*H*W, C] x [K, C]^T with the conv's
    epilogue act(acc + bias + residual): its key spells that order, and sm90 GEMM kernels
    take it (an activation before a residual add they do not)."""
    from byoc.backends.cutlass.codegen import partition_problem
    from byoc.backends.cutlass.kernels import GemmProblem, default_kernel
    mod, report = _partition(_conv_graph((2, 15, 15, 64), (256, 1, 1, 64), residual=True))
    function = next(f for name, f in mod.items() if name != "main")
    conv, indices = partition_problem(function)
    gemm = conv.as_gemm()
    assert gemm == GemmProblem(450, 256, 64, 1, "float16", True, "relu", True, True, residual_in_activation=True)
    assert gemm.key == "float16:m450:n256:k64:l1:nt:bias_residual_relu"
    assert indices == {"a": 0, "b": 1, "bias": 2, "residual": 3}  # the GEMM's A, B, bias, C
    kernel = default_kernel(90, gemm)
    assert kernel.supports(gemm) is None and kernel.name(gemm).endswith("_nt_bias_residual_relu")
    after = GemmProblem(450, 256, 64, 1, "float16", True, "relu", True, True)  # act(...) + residual
    assert after.key.endswith(":bias_relu_residual") and kernel.supports(after) is not None
    for shape, strides, pads in [((256, 3, 3, 64), (1, 1), (1, 1, 1, 1)), ((256, 1, 1, 64), (2, 2), (0, 0, 0, 0)),
                                 ((256, 1, 1, 64), (1, 1), (1, 1, 1, 1))]:
        mod, _ = _partition(_conv_graph((2, 15, 15, 64), shape, strides=strides, pads=pads))
        function = next(f for name, f in mod.items() if name != "main")
        assert partition_problem(function)[0].as_gemm() is None, (shape, strides, pads)


def test_a_pointwise_conv_of_4_channels_stays_a_conv_that_the_fixed_channel_kernels_run(tmp_path):
    """A squeeze-and-excitation expansion as EfficientNet's (issue #39: its sm90 build failed at
    the first run, CUTLASS refusing an nt GEMM of K=4), here into K=768 (EfficientNet's 96 is
    few enough multiply-adds for the built-in direct kernel: the next test): conv 1x1 of C=4
    with a sigmoid. As a GEMM, A and B would be rows of 4 float16 (8 bytes), which no GEMM
    kernel reads: it stays a conv, and the fixed-channel conv kernels run it on either arch."""
    from byoc.backends.cutlass.codegen import partition_problem
    from byoc.backends.cutlass.kernels import (ConvProblem, GemmProblem, candidates, default_kernel, kernel_problem,
                                               usable_candidates)
    mod, report = _partition(_conv_graph((32, 1, 1, 4), (768, 1, 1, 4), activation="sigmoid"))
    assert _compilers(mod) == ["cutlass"], report.to_text()
    problem, _ = partition_problem(next(f for name, f in mod.items() if name != "main"))
    assert problem.as_gemm() is None
    for sm in (90, 80):
        runs = kernel_problem(sm, problem)
        assert isinstance(runs, ConvProblem)
        kernel = default_kernel(sm, runs)
        assert kernel.fixed_channels and kernel.supports(runs) is None
        assert all(k.fixed_channels for k in usable_candidates(sm, runs))
    # the GEMM it was: every GEMM kernel refuses it, naming the extent
    gemm = GemmProblem(32, 768, 4, 1, "float16", True, "sigmoid", True, residual_in_activation=True)
    for kernel in candidates(90) + candidates(80):
        assert kernel.supports(gemm).startswith("K=4 is not a multiple of 8 (16-byte accesses of float16 along K")
    # built for sm_90: the fixed-channel kernel, no GEMM
    _, artifacts = _lowered(_conv_graph((32, 1, 1, 4), (768, 1, 1, 4), activation="sigmoid"), tmp_path)
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    assert [name for name in cutlass.kernels.values() if "_fixed4_" in name and name.endswith("_bias_sigmoid")] == \
        list(cutlass.kernels.values())


def test_a_small_stem_of_4_channels_is_left_to_the_builtin_direct_kernel():
    """A conv of 4 input channels with at most DIRECT_STEM_MAX_MACS multiply-adds a pixel
    (MobileNet's and EfficientNet's stems, EfficientNet's squeeze-and-excitation expansion
    of 4 channels) is refused with the reason, and the built-in backend takes it with its
    epilogue as one conv2d_epilogue function (few_channels_kernel on CUDA)."""
    from byoc.backends.cutlass.patterns import DIRECT_STEM_MAX_MACS
    mod, report = _partition(_conv_graph((32, 1, 1, 4), (96, 1, 1, 4), activation="sigmoid"))
    assert _compilers(mod) == ["builtin"], report.to_text()
    assert "4 input channels and 384 multiply-adds a pixel (at most 2048): the built-in backend's direct kernel" \
        in report.to_text()
    composites = [f.attrs.get("Composite") for name, f in mod.items() if name != "main"]
    assert composites == ["builtin.conv2d_epilogue"], composites
    assert 3 * 3 * 4 * 32 <= DIRECT_STEM_MAX_MACS < 7 * 7 * 4 * 64  # EfficientNet's stem, not ResNet's


def _cutlass_problems(mod) -> list:
    from byoc.backends.cutlass.codegen import partition_problem
    return [partition_problem(f)[0] for name, f in mod.items()
            if name != "main" and f.attrs.get("Compiler") == "cutlass"]


def _assert_every_choice_runs(problem, tmp_path):
    """For each arch: a candidate runs `problem` (as that arch's kernels take it), and the
    heuristic's kernel, the tuner's candidates and the kernel chosen without a database
    support it."""
    from byoc.backends.cutlass.kernels import GemmProblem, default_kernel, kernel_problem, usable_candidates
    from byoc.backends.cutlass.tuning import TuningDatabase, choose_kernels
    for sm in (90, 80):
        if sm == 80 and isinstance(problem, GemmProblem) and problem.has_bias and problem.has_residual:
            continue  # sm80 GEMMs take a bias or a residual: such a build fails, naming why, at build time
        runs = kernel_problem(sm, problem)
        usable = usable_candidates(sm, runs)
        assert usable and all(kernel.supports(runs) is None for kernel in usable), (sm, runs.key)
        assert default_kernel(sm, runs).supports(runs) is None, (sm, runs.key)
        chosen = choose_kernels([runs], sm, TuningDatabase(tmp_path / f"sm{sm}.json"), profile=False,
                                workdir=tmp_path, compile_flags=[])
        assert chosen[runs].supports(runs) is None, (sm, runs.key)


@pytest.mark.parametrize("channels", [4, 6, 8, 12, 16])
@pytest.mark.parametrize("out_channels", [4, 8, 96])
@pytest.mark.parametrize("size", [1, 3])
def test_every_conv_the_patterns_take_has_a_kernel_and_every_refusal_names_the_extent(channels, out_channels, size,
                                                                                      tmp_path):
    """A property of the patterns and the kernels' rules (CUTLASS's can_implement): a conv match
    is taken only where a kernel of each arch runs it and every kernel the build would choose
    supports it; what is refused says which extent is not a multiple of 8 (or that the
    built-in backend's direct kernel runs a small conv of 4 channels)."""
    from byoc.backends.cutlass.patterns import DIRECT_STEM_MAX_MACS
    pads = (size // 2,) * 4
    for epilogue in (dict(activation="sigmoid"), dict(residual=True), dict(bias=False, activation=None)):
        mod, report = _partition(_conv_graph((2, 5, 5, channels), (out_channels, size, size, channels), pads=pads,
                                             **epilogue))
        problems = _cutlass_problems(mod)
        direct = channels == 4 and size * size * channels * out_channels <= DIRECT_STEM_MAX_MACS
        runnable = out_channels % 8 == 0 and (channels % 8 == 0 or channels == 4) and not direct
        assert len(problems) == runnable, (report.to_text(), epilogue)
        if direct and out_channels % 8 == 0:  # the built-in backend's stem kernel takes it
            assert "the built-in backend's direct kernel runs it" in report.to_text(), report.to_text()
            continue
        for problem in problems:
            _assert_every_choice_runs(problem, tmp_path)
        if not runnable:  # the reason names a misaligned extent
            misaligned = [f"C={channels}"] * (channels % 8 != 0) + [f"K={out_channels}"] * (out_channels % 8 != 0)
            assert any(f"{extent} is not a multiple of 8" in report.to_text() for extent in misaligned), \
                report.to_text()


@pytest.mark.parametrize("kind", ["dense", "dense_bias_relu", "dense_bias_residual", "batched", "batched_nt_scaled"])
@pytest.mark.parametrize("k, n", [(4, 96), (96, 4), (6, 8), (8, 12), (16, 16), (12, 24), (136, 264), (8, 8)])
def test_every_gemm_the_patterns_take_has_a_kernel_and_every_refusal_names_the_extent(kind, k, n, tmp_path):
    batch = (3,) if kind.startswith("batched") else ()
    mod, report = _partition(_model(kind, 20, n, k, batch=batch))
    problems = _cutlass_problems(mod)
    runnable = k % 8 == 0 and n % 8 == 0
    assert len(problems) == runnable, report.to_text()
    for problem in problems:
        _assert_every_choice_runs(problem, tmp_path)
    if not runnable:  # the reason names a misaligned extent
        misaligned = [f"K={k}"] * (k % 8 != 0) + [f"N={n}"] * (n % 8 != 0)
        assert any(f"{extent} is not a multiple of 8 (16-byte accesses of float16 along" in report.to_text()
                   for extent in misaligned), report.to_text()


def test_kernel_rules_mirror_cutlass_can_implement():
    """Each family's rule per operand: A's K, B's K (nt) or N (nn), D's and the residual's N;
    the conv's C (x and w) and K (y), its iterators' and TMA im2col's limits; sizes a kernel
    of another family, or the grid, cannot take."""
    from byoc.backends.cutlass.kernels import (SM80_CANDIDATES, SM90_CANDIDATES, SM90_CONV_CANDIDATES, ConvKernel,
                                               ConvProblem, GemmKernel, GemmProblem, SM80_CONV_CANDIDATES,
                                               FIXED_CHANNEL_CONV_CANDIDATES)
    sm90, sm80 = SM90_CANDIDATES[0], SM80_CANDIDATES[0]
    ws = GemmKernel(90, (128, 64, 64), (1, 1), "ws")
    for kernel in (sm90, sm80, ws):
        assert kernel.supports(GemmProblem(64, 16, 16, 1, "bfloat16", False)) is None
        assert kernel.supports(GemmProblem(64, 12, 16, 1, "float16", True)).startswith("N=12 is not a multiple")
        assert "contiguous extent of B, K x N (nn)" in kernel.supports(GemmProblem(64, 12, 16, 1, "float16", False))
        assert "contiguous extent of A" in kernel.supports(GemmProblem(64, 16, 20, 1, "float16", False))
        assert kernel.supports(GemmProblem(0, 16, 16, 1, "float16", False)) == "M=0 is not a positive 32-bit extent"
        assert kernel.supports(GemmProblem(64, 16, 16, 1, "float32", False)).startswith("dtype float32")
        assert kernel.supports(ConvProblem(1, 8, 8, 8, 8, 3, 3, 8, 8, (1, 1), (1, 1, 1, 1), (1, 1), "float16")) == \
            "a GEMM kernel runs GEMM problems, not a ConvProblem"
    # the grid's y and z: a CTA per tile (sm_80, sm_90's non-persistent ws) and per batch
    many = GemmProblem(64, 64, 64, 70000, "float16", False)
    assert "exceed the grid's 65535" in sm80.supports(many) and "exceed the grid's 65535" in ws.supports(many)
    assert sm90.supports(many) is None  # persistent: a CTA per SM
    conv = ConvProblem(1, 8, 8, 16, 16, 3, 3, 8, 8, (1, 1), (1, 1, 1, 1), (1, 1), "float16", None, True, True)
    for kernel in SM90_CONV_CANDIDATES + SM80_CONV_CANDIDATES:
        assert kernel.supports(conv) is None
        assert kernel.supports(GemmProblem(64, 16, 16, 1, "float16", False)).startswith("a conv kernel runs conv")
        assert kernel.supports(conv.__class__(**{**conv.__dict__, "out_channels": 12})).startswith("K=12 is not")
        assert kernel.supports(conv.__class__(**{**conv.__dict__, "in_channels": 4})).startswith("C=4 is not")
    for kernel in FIXED_CHANNEL_CONV_CANDIDATES:
        assert kernel.supports(conv) == "the fixed-channel iterator takes C=4, not 16"
        assert kernel.supports(conv.__class__(**{**conv.__dict__, "in_channels": 4})) is None
    big_filter = conv.__class__(**{**conv.__dict__, "kernel_h": 33, "out_h": 1, "pads": (16, 1, 16, 1)})
    assert SM90_CONV_CANDIDATES[0].supports(big_filter) is None
    assert "larger than 32" in SM80_CONV_CANDIDATES[0].supports(big_filter)
    far_pads = conv.__class__(**{**conv.__dict__, "pads": (130, 1, 130, 1), "out_h": 266})
    assert "corner range" in SM90_CONV_CANDIDATES[0].supports(far_pads)
    assert SM80_CONV_CANDIDATES[0].supports(far_pads) is None
    assert ConvKernel(90, (128, 128, 64), fixed_channels=True).supports(conv) == \
        "the fixed-channel iterator is a CUTLASS 2.x (sm 80) kernel"


@pytest.mark.parametrize("forged, says", [
    (dict(kind="conv2d", sm=90, tile=[128, 128, 64], cluster=[1, 1], warp=[64, 64, 32], stages=3),
     "C=4 is not a multiple of 8"),
    (dict(sm=90, tile=[64, 64, 64], cluster=[1, 1], schedule="pingpong", warp=[64, 64, 32], stages=3),
     "a GEMM kernel runs GEMM problems, not a ConvProblem"),
])
def test_codegen_refuses_a_chosen_kernel_that_cannot_run_its_problem(forged, says, tmp_path, monkeypatch):
    """Whatever chose it (heuristic, tuner, database), a kernel whose can_implement would
    refuse the partition's operands is a build error naming the function, the problem and
    why, never a library that fails at its first run. A database entry naming such a kernel
    is passed over."""
    from byoc.backends.cutlass import tuning
    from byoc.backends.cutlass.kernels import ConvProblem, kernel_from_json
    from byoc.errors import BuildError
    kernel = kernel_from_json(forged)
    se_block = ConvProblem(32, 1, 1, 4, 768, 1, 1, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), "float16", "sigmoid", True)
    (tmp_path / "db.json").write_text(json.dumps({"format": tuning.FORMAT, "version": 1, "entries": {
        "sm90": {se_block.key: {"kernel": forged, "us": 1.0}}}}))
    database = tuning.TuningDatabase(tmp_path / "db.json")
    assert database.lookup(90, se_block) == kernel
    chosen = tuning.choose_kernels([se_block], 90, database, profile=False, workdir=tmp_path, compile_flags=[])
    assert chosen[se_block] != kernel and chosen[se_block].supports(se_block) is None
    monkeypatch.setattr(tuning, "choose_kernels", lambda problems, *args, **kwargs: {p: kernel for p in problems})
    with pytest.raises(BuildError, match=rf"cutlass: @cutlass_\w+: the kernel chosen for "
                                         rf"{re.escape(se_block.key)}, .*, cannot run it: {says}"):
        _lowered(_conv_graph((32, 1, 1, 4), (768, 1, 1, 4), activation="sigmoid"), tmp_path / "w")


def _resnet_ir(dtype="float16", batch=1, size=16):
    """A small ResNet as the ONNX importer writes it (NCHW, batch norm folded into conv
    biases of shape (C, 1, 1)): a 3-channel stem, max pool, one basic block, a strided 1x1
    downsample, global average pool, flatten, fc."""
    rng = np.random.default_rng(0)

    def weight(out_channels, in_channels, size_):
        return (rng.standard_normal((out_channels, in_channels, size_, size_)) * 0.1).astype(dtype)

    def bias(channels):
        return (rng.standard_normal((channels, 1, 1)) * 0.1).astype(dtype)

    with FunctionBuilder("main") as fb:
        x = fb.param("x", (batch, 3, size, size), "float32")
        h = fb.call("cast", x, dtype=dtype, name="x16")
        h = fb.call("conv2d", h, weight(16, 3, 3), pads=(1, 1, 1, 1), name="stem")
        h = fb.call("relu", fb.call("add", h, bias(16), name="stem_bias"), name="stem_relu")
        h = fb.call("max_pool2d", h, kernel=(2, 2), strides=(2, 2), name="pool")
        y = fb.call("conv2d", h, weight(16, 16, 3), pads=(1, 1, 1, 1), name="conv_a")
        y = fb.call("relu", fb.call("add", y, bias(16), name="bias_a"), name="relu_a")
        y = fb.call("conv2d", y, weight(16, 16, 3), pads=(1, 1, 1, 1), name="conv_b")
        y = fb.call("add", y, bias(16), name="bias_b")
        h = fb.call("relu", fb.call("add", y, h, name="shortcut"), name="block")
        y = fb.call("conv2d", h, weight(32, 16, 1), strides=(2, 2), name="down")
        y = fb.call("add", y, bias(32), name="down_bias")
        h = fb.call("global_avg_pool2d", y, name="gap")
        h = fb.call("reshape", h, shape=(batch, 32), name="flat")
        h = fb.call("matmul", h, (rng.standard_normal((32, 8)) * 0.1).astype(dtype), name="fc")
        fb.ret(fb.call("cast", h, dtype="float32", name="out"))
    return fb.module()


RESNET_NHWC = """\
def @main(%x: Tensor[(1, 3, 16, 16), float32]) -> Tensor[(1, 8), float32] {
  %x16 = cast(%x, dtype="float16")
  %x16_nhwc = transpose(%x16, axes=[0, 2, 3, 1])
  %stem = conv2d(%x16_nhwc, meta[0], pads=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI")
  %stem_bias = add(%stem, meta[1])
  %stem_relu = relu(%stem_bias)
  %pool = max_pool2d(%stem_relu, kernel=[2, 2], strides=[2, 2], layout="NHWC")
  %conv_a = conv2d(%pool, meta[2], pads=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI")
  %bias_a = add(%conv_a, meta[3])
  %relu_a = relu(%bias_a)
  %conv_b = conv2d(%relu_a, meta[4], pads=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI")
  %bias_b = add(%conv_b, meta[5])
  %shortcut = add(%bias_b, %pool)
  %block = relu(%shortcut)
  %down = conv2d(%block, meta[6], strides=[2, 2], data_layout="NHWC", kernel_layout="OHWI")
  %down_bias = add(%down, meta[7])
  %gap = global_avg_pool2d(%down_bias, layout="NHWC")
  %gap_nchw = transpose(%gap, axes=[0, 3, 1, 2])
  %flat = reshape(%gap_nchw, shape=[1, 32])
  %fc = matmul(%flat, meta[8])
  %out = cast(%fc, dtype="float32")
  return %out
}"""


def test_the_cutlass_backend_converts_conv_layouts_before_partitioning_only_where_it_takes_convs():
    """The backend declares its pre-partition rewrite (Backend.pre_partition): NHWC conv
    chains with padded RGB stems in a cuda build with conv2d on; nothing otherwise."""
    from byoc.backend import get_backend
    from byoc.ir import assert_structural_equal
    from byoc.target import Target
    from byoc.transform.convert_conv_layout import convert_conv_layout
    from byoc.transform.pad_conv_channels import pad_conv_channels
    prepare = get_backend("cutlass").pre_partition
    before = _resnet_ir()
    assert_structural_equal(prepare(before, Target("cutlass"), "cuda"), pad_conv_channels(convert_conv_layout(before)))
    assert prepare(before, Target("cutlass"), "cpu") is before
    assert prepare(before, Target("cutlass", conv2d=False), "cuda") is before


def test_convert_conv_layout_ir_before_after():
    """ConvertConvLayout: one transpose into NHWC before the first conv, one back before the
    flatten; convs, biases (now channel vectors), relus, the residual add and both pools
    stay NHWC; weights become OHWI constants; the result is unchanged."""
    from byoc.ir.printer import print_function
    from byoc.transform.convert_conv_layout import convert_conv_layout
    before = _resnet_ir()
    after = convert_conv_layout(before)
    text = print_function(after["main"], "main")
    assert text.split("\n\nmetadata")[0] == RESNET_NHWC
    constants = [b.value.args[1] for b in after["main"].bindings if b.value.op.name in ("conv2d", "add")
                 and b.value.args[1].__class__.__name__ == "Constant"]
    assert [tuple(c.type.shape) for c in constants] == [(16, 3, 3, 3), (16,), (16, 3, 3, 16), (16,),
                                                        (16, 3, 3, 16), (16,), (32, 1, 1, 16), (32,)]
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(byoc.interpret(after, x=x), byoc.interpret(before, x=x))
    # float32 convs stay NCHW for the built-in backend: nothing to convert
    assert convert_conv_layout(_resnet_ir("float32")) is not None
    assert "NHWC" not in convert_conv_layout(_resnet_ir("float32")).script()


def _channels_last_block_ir():
    """A ConvNeXt-style block as the exporters write it: a depthwise conv (NCHW), then
    permute(0, 2, 3, 1), LayerNorm and a Linear channels-last, permute(0, 3, 1, 2) back,
    a layer scale of shape (C, 1, 1), the residual add, and a conv reading the sum."""
    rng = np.random.default_rng(2)

    def const(*shape):
        return (rng.standard_normal(shape) * 0.2).astype("float16")
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (1, 8, 6, 6), "float16")
        h = fb.call("conv2d", x, const(8, 1, 3, 3), pads=(1, 1, 1, 1), groups=8, name="dw")
        h = fb.call("transpose", h, axes=(0, 2, 3, 1), name="to_last")
        h = fb.call("layer_norm", h, const(8), const(8), axis=-1, epsilon=1e-6, name="norm")
        h = fb.call("matmul", h, const(8, 8), name="fc")
        h = fb.call("transpose", h, axes=(0, 3, 1, 2), name="to_first")
        h = fb.call("multiply", const(8, 1, 1), h, name="scale")
        h = fb.call("add", h, x, name="residual")
        w = fb.call("transpose", h, axes=(0, 1, 3, 2), name="swap_hw")
        y = fb.call("conv2d", h, const(8, 8, 1, 1), name="next")
        fb.ret(fb.call("add", y, w, name="out"))
    return fb.module()


CHANNELS_LAST_BLOCK_NHWC = """\
def @main(%x: Tensor[(1, 8, 6, 6), float16]) -> Tensor[(1, 8, 6, 6), float16] {
  %x_nhwc = transpose(%x, axes=[0, 2, 3, 1])
  %dw = conv2d(%x_nhwc, meta[0], pads=[1, 1, 1, 1], groups=8, data_layout="NHWC", kernel_layout="OHWI")
  %norm = layer_norm(%dw, const(...), const(...), epsilon=1e-06)
  %fc = matmul(%norm, meta[1])
  %scale = multiply(const(...), %fc)
  %residual = add(%scale, %x_nhwc)
  %swap_hw = transpose(%residual, axes=[0, 3, 2, 1])
  %next = conv2d(%residual, meta[2], data_layout="NHWC", kernel_layout="OHWI")
  %swap_hw_nhwc = transpose(%swap_hw, axes=[0, 2, 3, 1])
  %out = add(%next, %swap_hw_nhwc)
  %out_nchw = transpose(%out, axes=[0, 3, 1, 2])
  return %out_nchw
}"""


def test_convert_conv_layout_cancels_the_models_own_transposes():
    """ConvertConvLayout with a net that permutes to channels-last itself: the permute of
    the NHWC conv output to NHWC is the value itself, the permute back makes the Linear's
    output the NHWC form of its result, so the layer scale, the residual and the next conv
    stay NHWC with no transpose between them; another permutation of an NHWC value is one
    composed transpose. The result is unchanged."""
    from byoc.ir.printer import print_function
    from byoc.transform.convert_conv_layout import convert_conv_layout
    before = _channels_last_block_ir()
    after = convert_conv_layout(before)
    text = print_function(after["main"], "main").split("\n\nmetadata")[0]
    assert re.sub(r"const\(\[[^]]*\], float16\)", "const(...)", text) == CHANNELS_LAST_BLOCK_NHWC
    x = np.random.default_rng(3).standard_normal((1, 8, 6, 6)).astype(np.float16)
    np.testing.assert_array_equal(byoc.interpret(after, x=x), byoc.interpret(before, x=x))


def test_convert_conv_layout_reads_a_transpose_without_axes_as_reversing():
    """transpose(conv(x)) with axes=() reverses the NCHW dims: composed with the NHWC value's
    layout it is one transpose of the right permutation (it reversed the NHWC tensor)."""
    from byoc.transform.convert_conv_layout import convert_conv_layout
    rng = np.random.default_rng(4)
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (1, 4, 2, 3), "float16")
        h = fb.call("conv2d", x, (rng.standard_normal((4, 4, 1, 1)) * 0.3).astype("float16"), name="conv")
        fb.ret(fb.call("transpose", h, name="reversed"))
    before = fb.module()
    after = convert_conv_layout(before)
    x = rng.standard_normal((1, 4, 2, 3)).astype(np.float16)
    np.testing.assert_array_equal(byoc.interpret(after, x=x), byoc.interpret(before, x=x))


def test_pad_conv_channels_ir_before_after():
    """PadConvChannels: the NHWC stem's image gets one zero channel (3 -> 4), its constant
    filter a zero channel too; a 12-channel conv is padded to 16; 16 channels and a conv
    with a computed filter stay; the result is unchanged."""
    from byoc.ir import parse
    from byoc.ir.structural import assert_structural_equal
    from byoc.transform.pad_conv_channels import pad_conv_channels
    rng = np.random.default_rng(0)
    w3 = rng.standard_normal((8, 3, 3, 3)).round(2).astype(np.float16)
    w12 = rng.standard_normal((16, 1, 1, 12)).round(2).astype(np.float16)

    def const(array):
        return f"const({json.dumps(array.astype(float).tolist())}, float16)"
    text = f"""
def @main(%x: Tensor[(1, 6, 6, 3), float16], %y: Tensor[(1, 6, 6, 12), float16], %w: Tensor[(8, 1, 1, 16), float16]) -> Tuple[Tensor[(1, 6, 6, 8), float16], Tensor[(1, 6, 6, 16), float16], Tensor[(1, 6, 6, 8), float16]] {{
  %a = conv2d(%x, {const(w3)}, pads=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI")
  %b = conv2d(%y, {const(w12)}, data_layout="NHWC", kernel_layout="OHWI")
  %c = conv2d(%b, %w, data_layout="NHWC", kernel_layout="OHWI")
  return (%a, %b, %c)
}}"""
    after = f"""
def @main(%x: Tensor[(1, 6, 6, 3), float16], %y: Tensor[(1, 6, 6, 12), float16], %w: Tensor[(8, 1, 1, 16), float16]) -> Tuple[Tensor[(1, 6, 6, 8), float16], Tensor[(1, 6, 6, 16), float16], Tensor[(1, 6, 6, 8), float16]] {{
  %xp = pad(%x, pads=[0, 0, 0, 0, 0, 0, 0, 1])
  %a = conv2d(%xp, {const(np.pad(w3, [(0, 0)] * 3 + [(0, 1)]))}, pads=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI")
  %yp = pad(%y, pads=[0, 0, 0, 0, 0, 0, 0, 4])
  %b = conv2d(%yp, {const(np.pad(w12, [(0, 0)] * 3 + [(0, 4)]))}, data_layout="NHWC", kernel_layout="OHWI")
  %c = conv2d(%b, %w, data_layout="NHWC", kernel_layout="OHWI")
  return (%a, %b, %c)
}}"""
    before = parse(text)
    padded = pad_conv_channels(before)
    assert_structural_equal(padded, parse(after))
    inputs = {"x": rng.standard_normal((1, 6, 6, 3)).astype(np.float16),
              "y": rng.standard_normal((1, 6, 6, 12)).astype(np.float16),
              "w": rng.standard_normal((8, 1, 1, 16)).astype(np.float16)}
    for got, want in zip(byoc.interpret(padded, **inputs), byoc.interpret(before, **inputs), strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-3, atol=2e-3)
    assert pad_conv_channels(padded) is padded  # nothing left to pad


def test_pad_conv_channels_widens_the_producer_of_a_squeeze_and_excitation_block():
    """PadConvChannels on EfficientNet's squeeze-and-excitation: the 2 squeezed channels that
    the expansion conv reads come from a 1x1 conv through bias + x * sigmoid(x), read by
    nothing else: the squeeze conv gets 6 zero filters and its bias 6 zeros (8 channels, a
    GEMM's 16-byte extent), the expansion conv 6 zero input channels, and no pad runs. Where
    the squeezed activation is also an output, the input is padded as before (to 4). The
    results are unchanged."""
    from byoc.ir import parse
    from byoc.ir.structural import assert_structural_equal
    from byoc.transform.pad_conv_channels import pad_conv_channels
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((2, 1, 1, 16)).round(2).astype(np.float16)
    b1 = rng.standard_normal(2).round(2).astype(np.float16)
    w2 = rng.standard_normal((16, 1, 1, 2)).round(2).astype(np.float16)

    def const(array):
        return f"const({json.dumps(array.astype(float).tolist())}, float16)"

    def block(w1, b1, w2, pad="", squeezed_out=False):
        channels = w1.shape[0]
        result_type = "Tensor[(1, 1, 1, 16), float16]"
        if squeezed_out:
            result_type = f"Tuple[{result_type}, Tensor[(1, 1, 1, {channels}), float16]]"
        return f"""
def @main(%x: Tensor[(1, 1, 1, 16), float16]) -> {result_type} {{
  %h = conv2d(%x, {const(w1)}, data_layout="NHWC", kernel_layout="OHWI")
  %a = add(%h, {const(b1)})
  %g = sigmoid(%a)
  %s = multiply(%a, %g){pad}
  %y = conv2d({"%y_input_padded" if pad else "%s"}, {const(w2)}, data_layout="NHWC", kernel_layout="OHWI")
  %e = sigmoid(%y)
  return {"(%e, %s)" if squeezed_out else "%e"}
}}"""
    before = parse(block(w1, b1, w2))
    widened = pad_conv_channels(before)
    assert_structural_equal(widened, parse(block(np.pad(w1, [(0, 6), (0, 0), (0, 0), (0, 0)]), np.pad(b1, [(0, 6)]),
                                                 np.pad(w2, [(0, 0)] * 3 + [(0, 6)]))))
    x = rng.standard_normal((1, 1, 1, 16)).astype(np.float16)
    np.testing.assert_array_equal(byoc.interpret(widened, x=x), byoc.interpret(before, x=x))
    assert pad_conv_channels(widened) is widened
    # the squeezed activation is an output too: its 2 channels stay, the input is padded (to 4)
    read_outside = parse(block(w1, b1, w2, squeezed_out=True))
    padded = pad_conv_channels(read_outside)
    assert_structural_equal(padded, parse(block(w1, b1, np.pad(w2, [(0, 0)] * 3 + [(0, 2)]), squeezed_out=True,
                                                pad="\n  %y_input_padded = pad(%s, pads=[0, 0, 0, 0, 0, 0, 0, 2])")))
    for got, want in zip(byoc.interpret(padded, x=x), byoc.interpret(read_outside, x=x), strict=True):
        np.testing.assert_array_equal(got, want)
    # a producer whose own input is padded (an RGB image: 3 -> 4 channels) is widened too
    with FunctionBuilder("main") as fb:
        image = fb.param("image", (1, 5, 5, 3), "float16")
        h = fb.call("conv2d", image, rng.standard_normal((2, 3, 3, 3)).astype(np.float16), pads=(1, 1, 1, 1),
                    data_layout="NHWC", kernel_layout="OHWI")
        h = fb.call("relu", h)
        fb.ret(fb.call("conv2d", h, rng.standard_normal((16, 1, 1, 2)).astype(np.float16),
                       data_layout="NHWC", kernel_layout="OHWI"))
    stem = fb.module()
    both = pad_conv_channels(stem)
    assert [(b.value.op.name, tuple(b.var.type.shape)) for b in both["main"].bindings] == [
        ("pad", (1, 5, 5, 4)), ("conv2d", (1, 5, 5, 8)), ("relu", (1, 5, 5, 8)), ("conv2d", (1, 5, 5, 16))]
    image = rng.standard_normal((1, 5, 5, 3)).astype(np.float16)
    np.testing.assert_array_equal(byoc.interpret(both, image=image), byoc.interpret(stem, image=image))


def test_resnet_partitions_convs_into_cutlass_with_boundary_transposes_only(tmp_path):
    """build()'s pipeline up to partitioning, for cuda -arch=sm_90 with the cutlass backend:
    every conv goes to cutlass (epilogues fused: bias+relu, bias+residual+relu, bias) but the
    3-channel stem, padded to 4 channels for CUTLASS by PadConvChannels, which is few enough
    multiply-adds for the built-in backend's direct kernel (with its bias and ReLU): that one
    reads the 3-channel image, so no pad is left; and the fc GEMM; the only transpose is the
    image's into NHWC (the pooled (N, 1, 1, C) goes back to NCHW as a reshape: a view)."""
    from byoc.pipeline import lower
    from byoc.config import load_config
    from byoc.ir.expr import Call
    cfg = load_config({"target": "cuda -arch=sm_90", "backends": [{"cutlass": {"conv2d": True}}]},
                      overrides={"workdir": str(tmp_path)})
    mod = lower(_resnet_ir(), cfg, until="partition", workdir=tmp_path)
    report = mod.attrs["partition_report"]
    cutlass = {name: f for name, f in mod.items() if f.attrs.get("Compiler") == "cutlass"}
    composites = sorted(b.value.attrs.get("Composite") for f in cutlass.values() for b in f.bindings
                        if b.value.__class__.__name__ == "Function")
    assert composites == ["cutlass.conv2d_bias", "cutlass.conv2d_bias_activation",
                          "cutlass.conv2d_bias_residual_activation", "cutlass.dense"], report.to_text()
    refusals = [line for line in report.to_text().splitlines() if line.startswith("  cutlass.")]
    assert refusals and all("(%stem" in line for line in refusals), report.to_text()
    assert "cutlass.conv2d_bias_activation x1: 4 input channels and 576 multiply-adds a pixel" in report.to_text()
    stem = [f.attrs.get("Composite") for name, f in mod.items() if f.attrs.get("Compiler") == "builtin"]
    assert "builtin.conv2d_epilogue" in stem, stem
    pads = [b.value.attrs["pads"] for f in mod.functions.values() for b in f.bindings
            if isinstance(b.value, Call) and getattr(b.value.op, "name", None) == "pad"]
    assert pads == []
    (stem_conv,) = [b.value for name, f in mod.items() if f.attrs.get("Composite") == "builtin.conv2d_epilogue"
                    for b in f.bindings if isinstance(b.value, Call) and b.value.op.name == "conv2d"]
    assert stem_conv.args[0].type.shape[3] == 3 and stem_conv.args[1].type.shape[3] == 3
    ops = [(b.value.op.name, b.value.attrs) for name, f in mod.items() if name != "main"
           for b in f.bindings if isinstance(b.value, Call) and hasattr(b.value.op, "category")]
    ops += [(b.value.op.name, b.value.attrs) for f in cutlass.values() for inner in f.bindings
            if inner.value.__class__.__name__ == "Function" for b in inner.value.bindings]
    transposes = [attrs["axes"] for name, attrs in ops if name == "transpose"]
    assert sorted(map(tuple, transposes)) == [(0, 2, 3, 1)]  # the pooled (1, 1, 1, 32) goes back as a reshape
    assert all(attrs["data_layout"] == "NHWC" for name, attrs in ops if name == "conv2d")
    assert all(attrs["layout"] == "NHWC" for name, attrs in ops if name in ("max_pool2d", "global_avg_pool2d"))


def _conv_model(kind, batch, channels, size, out_channels, kernel, stride, dtype="float16"):
    """An NCHW float32-in/out model as the ONNX importer writes it: cast, conv, bias (C, 1, 1),
    residual, relu; the build converts it to NHWC."""
    rng = np.random.default_rng(0)
    pad = kernel // 2
    out_size = (size + 2 * pad - kernel) // stride + 1
    with FunctionBuilder("main") as fb:
        x = fb.param("x", (batch, channels, size, size), "float32")
        y = fb.call("conv2d", fb.call("cast", x, dtype=dtype),
                    (rng.standard_normal((out_channels, channels, kernel, kernel)) * 0.1).astype(dtype),
                    strides=(stride, stride), pads=(pad,) * 4)
        if "bias" in kind:
            y = fb.call("add", y, (rng.standard_normal((out_channels, 1, 1)) * 0.1).astype(dtype))
        if "residual" in kind:
            r = fb.param("r", (batch, out_channels, out_size, out_size), "float32")
            y = fb.call("add", y, fb.call("cast", r, dtype=dtype))
        if "relu" in kind:
            y = fb.call("relu", y)
        if "hard_swish" in kind:
            y = fb.call("hard_swish", y)
        if "sigmoid" in kind:
            y = fb.call("sigmoid", y)
        fb.ret(fb.call("cast", y, dtype="float32"))
    return fb.module()


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
@pytest.mark.parametrize("kind, batch, channels, size, out_channels, kernel, stride, dtype", [
    ("conv_bias_relu", 2, 64, 15, 72, 3, 2, "float16"),  # odd sizes: M = 2*8*8, N = 72 not tile multiples
    ("conv_bias_residual_relu", 2, 64, 14, 64, 3, 1, "float16"),
    ("conv_bias", 3, 32, 28, 136, 1, 2, "float16"),  # 1x1 stride 2 (a ResNet downsample)
    ("conv", 1, 16, 9, 24, 1, 1, "float16"),  # pointwise: a GEMM
    ("conv_bias_residual_relu", 3, 64, 13, 136, 1, 1, "float16"),  # ResNet's pointwise conv3, M = 507
    ("conv_bias_residual_relu", 2, 64, 15, 64, 3, 1, "bfloat16"),
    # RGB stems: C=3 padded to 4 (the fixed-channel kernel), C=6 padded to 8 (the usual one)
    ("conv_bias_relu", 2, 3, 33, 64, 7, 2, "float16"), ("conv_bias_relu", 3, 3, 30, 24, 7, 2, "bfloat16"),
    ("conv", 2, 3, 32, 32, 16, 16, "float16"),  # a ViT patch embedding
    ("conv_bias", 2, 6, 17, 32, 3, 1, "float16"),
    # MobileNetV3's: a pointwise expansion (a GEMM) and its RGB stem (C=3, 3x3 stride 2: the built-in
    # backend's direct kernel), with hard_swish
    ("conv_bias_hard_swish", 2, 16, 15, 72, 1, 1, "float16"), ("conv_bias_hard_swish", 2, 3, 33, 16, 3, 2, "float16"),
    # EfficientNet's squeeze-and-excitation expansion: pointwise, C=4 (the direct kernel, not a GEMM)
    ("conv_bias_sigmoid", 32, 4, 1, 96, 1, 1, "float16"),
])
def test_conv_patterns_match_float32_reference(kind, batch, channels, size, out_channels, kernel, stride, dtype,
                                                tmp_path):
    import cupy
    from byoc.backends.cutlass.patterns import DIRECT_STEM_MAX_MACS
    mod = _conv_model(kind, batch, channels, size, out_channels, kernel, stride, dtype)
    library = byoc.build(mod, config={"target": "auto", "backends": [{"cutlass": {"profile": "false", "conv2d": True}}]},
                         workdir=str(tmp_path / "w"))
    # 3 channels are padded to 4; a small conv of 4 channels is the built-in direct kernel's
    direct = channels in (3, 4) and kernel * kernel * 4 * out_channels <= DIRECT_STEM_MAX_MACS
    assert ("cutlass" not in library.metadata["backends"]) == direct, library.report.to_text()
    if "hard_swish" in kind and not direct:  # in the epilogue, not a kernel of its own
        assert "HardSwish" in "".join(p.read_text() for p in (tmp_path / "w").glob("byoc_cutlass_*.cu"))
    module = library.load()
    rng = np.random.default_rng(1)
    inputs = {p.name_hint: rng.standard_normal(p.type.shape).astype(np.float32) for p in mod["main"].params}
    got = cupy.asnumpy(module.run(**{k_: cupy.asarray(v) for k_, v in inputs.items()}))
    # float32 reference: the same graph and weights (rounded to the 16-bit type) in float32
    reference = byoc.interpret(_conv_model(kind, batch, channels, size, out_channels, kernel, stride, "float32"),
                               **inputs)
    scale = np.max(np.abs(reference))
    assert np.max(np.abs(got - reference)) <= 1e-2 * scale, kind


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_whole_resnet_with_cutlass_convs_matches_onnxruntime_fixture(cuda_graph, tmp_path):
    """resnet_small (exported by torch) fp16 with every conv CUTLASS can take: it decides
    whether conv2d may become the cutlass default (see the conv2d attribute)."""
    import cupy
    data = np.load(Path(__file__).parent / "fixtures" / "resnet_small.npz")
    inputs = {k[3:]: v for k, v in data.items() if k.startswith("in_")}
    expected = [v for k, v in data.items() if k.startswith("out_")]
    config = {"target": "auto", "precision": "float16", "cuda_graph": cuda_graph,
              "backends": [{"cutlass": {"profile": "false", "conv2d": True}}]}
    library = byoc.build(Path(__file__).parent / "fixtures" / "resnet_small.onnx", config=config,
                         workdir=str(tmp_path / "w"), input_shapes={k: v.shape for k, v in inputs.items()})
    assert "cutlass" in library.metadata["backends"], library.report.to_text()
    got = library.load().run(**{k: cupy.asarray(v) for k, v in inputs.items()})
    got = got if isinstance(got, tuple) else (got,)
    for result, want in zip(got, expected, strict=True):
        result = cupy.asnumpy(result).astype(np.float32)
        assert np.max(np.abs(result - want)) <= 1e-2 * np.max(np.abs(want)), library.report.to_text()


class _FakeKernel:
    """A candidate kernel for the tuner's plumbing: its unit exports its entry and does
    nothing (`valid`: or does not compile)."""

    def __init__(self, label, valid=True):
        self.label, self.valid = label, valid

    def name(self, problem):
        return f"{self.label}_kernel"

    def type_data(self, problem):
        return {"kernel_name": self.name(problem), "valid": self.valid}

    @staticmethod
    def call_sizes(problem):
        return [problem.m, problem.n, problem.k, problem.batch]


def _fake_kernel_templates(monkeypatch, candidates):
    from byoc.backends.cutlass import kernels, tuning
    from byoc.codegen import templates
    real_render = templates.render_template

    def render(name, data):
        if name != "fake":
            return real_render(name, data)
        body = "return call->sizes[0] > 0 ? 0 : 1;" if data["valid"] else "this is not C++"
        return (f'#include "byoc_cutlass_call.h"\n// {data["kernel_name"]}\n'
                f'extern "C" int {data["entry"]}(const ByocCutlassCall* call) {{ {body} }}\n')

    monkeypatch.setattr(tuning, "usable_candidates", lambda sm, problem, allowed=None: candidates)
    monkeypatch.setattr(kernels, "kernel_template", lambda kernel: "fake")
    monkeypatch.setattr(templates, "render_template", render)


@needs_nvcc
def test_tuning_leaves_out_candidates_that_do_not_compile(tmp_path, monkeypatch):
    """A candidate kernel that fails to compile is reported and left out of the profiler;
    the others are still built and linked (the profiler's run needs a GPU: without one the
    problem simply gets no measurements)."""
    import warnings
    from byoc.backends.cutlass import tuning
    from byoc.backends.cutlass.kernels import GemmProblem
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    _fake_kernel_templates(monkeypatch, [_FakeKernel("good"), _FakeKernel("bad", valid=False)])
    problem = GemmProblem(64, 64, 64, 1, "float16", False, None, False, False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = tuning._profile([problem], 90, tmp_path, ["-arch=sm_90", "-O0"], jobs=2)
    assert any("did not compile" in str(w.message) and issubclass(w.category, byoc.ByocWarning) for w in caught)
    profiler = (tmp_path / "profiler_table.cc").read_text()
    assert "good_kernel" in profiler and "bad_kernel" not in profiler
    assert (tmp_path / "profiler").is_file()  # linked with the candidate that compiled
    assert problem in results


@needs_nvcc
def test_tuning_compiles_each_candidate_once_and_the_build_after_it_none(tmp_path, monkeypatch):
    """A candidate kernel's compile unit does not depend on the problem: it is compiled once
    for every problem it serves, linked into one profiler, and it is the very unit a build
    of those problems links (the object cache hands it over: nothing compiles again)."""
    from byoc.backends.cutlass import tuning
    from byoc.backends.cutlass.codegen import kernel_compile_units
    from byoc.backends.cutlass.kernels import GemmProblem, kernel_unit
    from byoc.toolchain import compile_units
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    candidates = [_FakeKernel("a"), _FakeKernel("b")]
    _fake_kernel_templates(monkeypatch, candidates)
    problems = [GemmProblem(m, 64, 64, 1, "float16", False, None, False, False) for m in (64, 128, 192)]
    tuning._profile(problems, 90, tmp_path / "tuning", ["-arch=sm_90", "-O0"], jobs=2)
    units = sorted(p.name for p in (tmp_path / "tuning").glob("byoc_*.cu"))
    assert len(units) == 2 and units[0].startswith("byoc_a_kernel_") and units[1].startswith("byoc_b_kernel_")
    profiler = (tmp_path / "tuning" / "profiler_table.cc").read_text()
    assert all(f"candidate_{index}_{number}" in profiler for index in range(3) for number in range(2))
    assert "static const int64_t sizes[] = {192, 64, 64, 1};" in profiler
    assert (tmp_path / "tuning" / "profiler").is_file()
    # the build that follows: the kernel it picks for each problem is one the tuner compiled
    build = {kernel_unit(candidates[1], problem, ["-arch=sm_90", "-O0"]) for problem in problems}
    assert len(build) == 1
    stats = {}
    (tmp_path / "build").mkdir()
    compile_units(kernel_compile_units(build, tmp_path / "build"), tmp_path / "build", stats=stats)
    assert stats["units"] == 1 and stats["compiled"] == []


def test_a_candidate_that_faults_costs_its_own_problem_only(tmp_path):
    """The profiler times every problem in one process; one whose candidate faults (the
    profiler exits without its line, or the process dies) is left unmeasured and the run
    goes on from the problem after it, each time."""
    from byoc.backends.cutlass.tuning import run_profiler
    runs = tmp_path / "runs.txt"
    profiler = tmp_path / "profiler"
    # problems 1 and 3 fault: the stand-in prints the lines before them and exits 3
    profiler.write_text(f"""#!{sys.executable}
import json, sys
with open({str(runs)!r}, "a") as log:
    log.write(sys.argv[1] + "\\n")
for problem in range(int(sys.argv[1]), 5):
    if problem in (1, 3):
        sys.exit(3)
    print(json.dumps({{"problem": problem, "times": {{"k": float(problem)}}}}), flush=True)
""")
    profiler.chmod(0o755)
    reported = []
    measured = run_profiler(profiler, 5, on_problem=lambda position, count, times: reported.append((position, count,
                                                                                                 times)))
    assert measured == {0: {"k": 0.0}, 2: {"k": 2.0}, 4: {"k": 4.0}}
    # each as its line arrives (the build's progress), with what it measured
    assert reported == [(0, 5, {"k": 0.0}), (2, 5, {"k": 2.0}), (4, 5, {"k": 4.0})]
    assert runs.read_text().split() == ["0", "2", "4"]  # started after each fault, never twice


def test_the_progress_of_tuning_says_each_problems_candidates_and_best():
    from byoc.backends.cutlass.tuning import tuning_summary
    assert tuning_summary({"a": 41.25, "b": 50.0, "c": None}) == "3 candidates (1 failed), best 41.2 us (a)"
    assert tuning_summary({"a": 7.0}) == "1 candidate, best 7.0 us (a)"
    assert tuning_summary({"a": None, "b": None}) == "2 candidates, none ran (the heuristic's kernel)"


def test_the_heartbeat_while_tuning_names_the_problem_being_timed(caplog):
    """Each problem timed is a line of the build's progress; the heartbeat between two lines
    names the problem being timed now (the next one), not the one just reported."""
    import logging
    from byoc.backends.cutlass.tuning import timing_now, tuning_reporter
    from byoc.progress import BuildProgress
    progress = BuildProgress()
    keys = ["gemm:m128:n768:k768", "gemm:m128:n3072:k768", "conv2d:n32h56w56c64"]
    progress.last_what = timing_now(keys, 0)
    assert progress.last_what == "timing [tune 1/3] gemm:m128:n768:k768"
    report = tuning_reporter(progress, keys)
    with caplog.at_level(logging.INFO, logger="byoc.build"):
        report(0, 3, {"k1": 41.25, "k2": 50.0})
        assert progress.last_what == "timing [tune 2/3] gemm:m128:n3072:k768"
        report(2, 3, {"k1": None})  # the profiler skipped problem 1 (a faulting candidate)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0].endswith("[tune 1/3] gemm:m128:n768:k768: 2 candidates, best 41.2 us (k1)")
    assert lines[1].endswith("[tune 3/3] conv2d:n32h56w56c64: 1 candidate, none ran (the heuristic's kernel)")
    assert progress.last_what.startswith("[tune 3/3]")  # the last: nothing is timed after it
    tuning_reporter(None, keys)(0, 3, {})  # no progress (a library call): nothing to say


def _lowered(model, workdir, **overrides):
    """(main, artifacts) of a cuda_sm90 build of `model` up to code generation (no compiler
    runs; sources, partitioned.ir and final.ir in `workdir`), the heuristic's kernels."""
    from byoc.pipeline import lower
    from byoc.config import load_config
    config = load_config("cuda_sm90", overrides={"workdir": str(workdir), "tuning": {"profile": False}, **overrides})
    mod = lower(model, config, until="plan_memory", workdir=workdir)
    return mod, mod.attrs["artifacts"]


BERT2 = str(Path(__file__).parent / "fixtures" / "bert2.onnx")


@pytest.mark.parametrize("kind", ["dense_bias_hard_swish", "conv_bias_hard_swish"])
def test_hard_swish_is_a_gemm_and_conv_epilogue(kind, tmp_path):
    """MobileNetV3's hard_swish after a (pointwise) conv or a GEMM with bias runs in the CUTLASS
    epilogue: no built-in function is left for it."""
    mod = _model(kind, 1000, 264, 136) if kind.startswith("dense") else \
        _conv_model(kind, 2, 16, 15, 72, 3, 1, "float16")
    _, artifacts = _lowered(mod, tmp_path)
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    assert any("HardSwish" in unit.source.read_text() for unit in cutlass.compile_units)
    # no built-in function computes it as well
    functions = (tmp_path / "partitioned.ir").read_text().split("\ndef @")
    assert not [f for f in functions if f.startswith("builtin_") and "hard_swish(" in f]
    assert [f for f in functions if f.startswith("cutlass_") and "hard_swish(" in f]
    assert "hard_swish" in cutlass.kernels[cutlass.symbols[0]]


def test_the_attention_tile_is_a_target_choice(tmp_path):
    """cutlass.attention_tile picks the fused attention's kernel and block shape (bert2 at
    batch 8, head dim 64: the size rule takes the flash kernel, 128 keys a block as that is
    all of them); another value is a config error."""
    from byoc.config import load_config
    from byoc.errors import ConfigError
    names = {}
    for tile in ("", "64x64", "32x128", "flash:32x64"):
        _, artifacts = _lowered(BERT2, tmp_path / (tile.replace(":", "_") or "auto"), dims={"batch": 8, "sequence": 128},
                                backends=[{"cutlass": {"sm": 90, "attention_tile": tile}}, "builtin"])
        names[tile] = [k for a in artifacts for k in a.kernels.values() if "fmha" in k or "attention" in k]
    assert names == {"": ["byoc_flash_attention_sm80_f16_64x128_d64_mask"],
                     "64x64": ["cutlass_fmha_sm80_f16_64x64_k64_mask"],
                     "32x128": ["cutlass_fmha_sm80_f16_32x128_k64_mask"],
                     "flash:32x64": ["byoc_flash_attention_sm80_f16_32x64_d64_mask"]}
    with pytest.raises(ConfigError, match="attention_tile='16x16' expected one of flash:64x64, .*, 32x128"):
        load_config("cuda_sm90", overrides={"backends": [{"cutlass": {"attention_tile": "16x16"}}]})


def test_partitions_of_one_kernel_compile_as_one_unit(tmp_path):
    """bert2: the QKV projection and the pooler are plain GEMMs of one tile, the attention
    output and the FFN's second GEMM residual GEMMs of one tile; each pair shares one kernel
    unit (its CUTLASS types once, no sizes in it), and cutlass_entries.cc has an entry point
    per partition that calls its kernel with the partition's sizes."""
    _, artifacts = _lowered(BERT2, tmp_path, dims={"batch": 1, "sequence": 128})
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    units = {unit.source.name: unit.source.read_text() for unit in cutlass.compile_units}
    kernels = {name: text for name, text in units.items()
               if name.startswith("byoc_cutlass_") and not name.endswith("_device.cu")}
    # each kernel's device half beside it: the kernel alone, compiled to a cubin
    devices = {unit.source.name: unit for unit in cutlass.compile_units if unit.source.name.endswith("_device.cu")}
    assert sorted(devices) == sorted(f"{name[:-3]}_device.cu" for name in kernels)
    assert all(unit.language == "cubin" and unit.output == f"{unit.source.name[:-3]}.o" for unit in devices.values())
    entries = units["cutlass_entries.cc"]
    calls = re.findall(r'^extern "C" int (cutlass_\w+)\(.*?return (byoc_cutlass_\w+)\(&call\);', entries, re.M | re.S)
    attention = [name[:-3] for name in units if name.endswith(".cu") and name.startswith("cutlass_")]  # one each
    assert sorted([symbol for symbol, _ in calls] + attention) == sorted(cutlass.symbols)
    served = {kernel: sum(1 for _, k in calls if k == kernel) for kernel in {k for _, k in calls}}
    assert len(kernels) == len(served) < len(calls) and sorted(served.values())[-2:] == [2, 2], served
    for name, text in kernels.items():  # the kernel's function, and no partition's name or size
        # weak: a unity group's object of several host halves may be linked for any of them
        assert f'extern "C" __attribute__((weak)) int {name[:-3]}(const ByocCutlassCall* call)' in text
        assert f'ByocEmbeddedKernel kernel({name[:-3]}_device_cubin, "{name[:-3]}_kernel")' in text
        device = devices[f"{name[:-3]}_device.cu"].source.read_text()
        assert f'extern "C" __global__ void' in device and f"{name[:-3]}_kernel(" in device
        assert "to_underlying_arguments" not in device and "byoc_cutlass_call.h" not in device
        assert not any(symbol in text for symbol in cutlass.symbols) and "128" not in text.split("namespace")[0]


def test_the_shim_families_compile_only_the_dtypes_the_generated_code_names(tmp_path):
    """bert2 in float16: the built-in code passes the shim float16 data and int64 indices;
    its shim families get kernels for those two dtypes only (BYOC_SHIM_DTYPES)."""
    from byoc.backends.builtin import shim_dtype_mask, shim_dtypes
    _, artifacts = _lowered(BERT2, tmp_path, dims={"batch": 1, "sequence": 128})
    (builtin,) = [a for a in artifacts if a.backend == "builtin"]
    generated = next(u for u in builtin.compile_units if u.source.name == "builtin.cu").source.read_text()
    assert shim_dtypes(generated) == {"BYOC_FLOAT16", "BYOC_INT64"}
    shims = [u for u in builtin.compile_units if u.output.startswith("shim_")]
    assert shims and all(f"-DBYOC_SHIM_DTYPES={shim_dtype_mask({'BYOC_FLOAT16', 'BYOC_INT64'}):#x}" in u.flags
                         for u in shims), [u.flags[-1] for u in shims]


@needs_nvcc
def test_a_kernel_serving_two_partitions_links_with_their_entry_points(tmp_path):
    """bert2's kernel units and its cutlass_entries.cc compile (nvcc, the C++ compiler): the
    entry points are defined and call the kernel functions the units define."""
    from byoc.toolchain import compile_units
    _, artifacts = _lowered(BERT2, tmp_path, dims={"batch": 1, "sequence": 128})
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    entries_unit = next(u for u in cutlass.compile_units if u.source.name == "cutlass_entries.cc")
    text = entries_unit.source.read_text()
    kernel = re.findall(r"return (byoc_cutlass_\w+)\(&call\);", text)
    shared = max(set(kernel), key=kernel.count)
    unit = next(u for u in cutlass.compile_units if u.source.name == f"{shared}.cu")
    entries_object, kernel_object = compile_units([entries_unit, unit], tmp_path)

    def defined(obj):
        return subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True).stdout
    symbols = re.findall(r'^extern "C" int (cutlass_\w+)\(', text, re.M)
    assert len(symbols) >= 4 and all(re.search(rf" T {symbol}$", defined(entries_object), re.M) for symbol in symbols)
    # weak (W): a unity group's object of several host halves may be linked for any of them
    assert re.search(rf" W {shared}$", defined(kernel_object), re.M) and kernel.count(shared) == 2


def test_a_scale_after_a_batched_matmul_becomes_the_epilogue_alpha(tmp_path):
    """scores / 8 is taken by cutlass with the matmul, and the kernel scales in its epilogue
    (partitioning and codegen only: no GPU needed)."""
    from byoc.pipeline import lower
    from byoc.config import load_config
    mod = _model("batched_nt_scaled", 128, 128, 64, batch=(2, 12))
    cfg = load_config({"target": "cuda -arch=sm_90", "backends": [{"cutlass": {"profile": "false"}}]},
                      overrides={"workdir": str(tmp_path)})
    mod = lower(mod, cfg, until="codegen", workdir=tmp_path)
    report = mod.attrs["partition_report"]
    assert report.to_json()["backends"]["cutlass"]["patterns"] == {"batched_matmul_nt_scaled": 1}, report.to_text()
    sources = [p.read_text() for p in tmp_path.glob("byoc_cutlass_*.cu") if not p.name.endswith("_device.cu")]
    assert len(sources) == 1 and "arguments.epilogue.thread.alpha = call->alpha;" in sources[0]
    assert "sizes, 0.125f, workspace" in (tmp_path / "cutlass_entries.cc").read_text()


# ---------------------------------------------------------------- fused attention

def _attention_model(batch, seq_q, seq_k, heads, head_dim, *, fused_qkv=True, mask=None, scale=("divide", 8.0),
                     key_form="one_transpose", dtype="float16", merge_heads=True, kv_heads=None):
    """BERT's self-attention as exporters write it, on float32 inputs cast to `dtype`:
    fused_qkv: one [B, S, 3*H*D] input split into Q, K, V (seq_q == seq_k); else separate
    [B, Sq, H*D] / [B, Sk, H*D] inputs. mask: None or the shape of an additive mask input.
    key_form "sdpa": as torch's exporter writes scaled_dot_product_attention (Q and K^T each
    scaled by the square root of `scale`, K^T as a 3-D transpose between reshapes, the
    probabilities guarded: where(isnan(p), 0, p)). key_form "llama": as transformers' LLaMA
    writes it, rotary embeddings (rotate_half) applied to Q's and K's heads, and K's and
    V's `kv_heads` heads repeated to `heads` (repeat_kv: expand_dims, broadcast_to, reshape).
    key_form "mqa_sdpa": as torch's exporter writes scaled_dot_product_attention of Falcon
    and ModernBERT: rotary embeddings on Q's and K's heads (`kv_heads` of them: one is
    multi-query attention, its head broadcast by both matmuls, no repeat_kv), K^T a 3-D
    transpose between reshapes of the rotated heads, one scale of the scores, the
    probabilities guarded."""
    hidden = heads * head_dim
    kv_heads = kv_heads or heads
    kv_hidden = kv_heads * head_dim
    with FunctionBuilder("main") as fb:
        if fused_qkv:
            qkv = fb.call("cast", fb.param("qkv", (batch, seq_q, hidden + 2 * kv_hidden), "float32"), dtype=dtype)
            pieces = fb.call("split", qkv, axis=-1, sizes=[hidden, kv_hidden, kv_hidden])
            q, k, v = (fb.get_item(pieces, i) for i in range(3))
        else:
            q = fb.call("cast", fb.param("q", (batch, seq_q, hidden), "float32"), dtype=dtype)
            k = fb.call("cast", fb.param("k", (batch, seq_k, kv_hidden), "float32"), dtype=dtype)
            v = fb.call("cast", fb.param("v", (batch, seq_k, kv_hidden), "float32"), dtype=dtype)

        def heads_of(x, seq, count=heads):
            return fb.call("transpose", fb.call("reshape", x, shape=[batch, seq, count, head_dim]), axes=[0, 2, 1, 3])

        def rotary(x, seq):  # x * cos + rotate_half(x) * sin, cos and sin [1, 1, S, D] constants
            half = head_dim // 2
            angles = np.outer(np.arange(seq), 10000.0 ** (-2.0 * np.arange(half) / head_dim))
            angles = np.concatenate([angles, angles], axis=-1)[None, None]
            first = fb.call("strided_slice", x, begin=[0], end=[half], axes=[3], strides=[1])
            second = fb.call("strided_slice", x, begin=[half], end=[head_dim], axes=[3], strides=[1])
            rotated = fb.call("concat", fb.call("negative", second), first, axis=-1)
            return fb.call("add", fb.call("multiply", x, np.cos(angles).astype(dtype)),
                           fb.call("multiply", rotated, np.sin(angles).astype(dtype)))

        def repeated(x, seq):  # [B, Hkv, S, D] -> [B, H, S, D], each head read by H / Hkv query heads
            x = fb.call("broadcast_to", fb.call("expand_dims", x, axes=[2]),
                        shape=[batch, kv_heads, heads // kv_heads, seq, head_dim])
            return fb.call("reshape", x, shape=[batch, heads, seq, head_dim])

        q_heads = heads_of(q, seq_q)
        if key_form == "mqa_sdpa":
            q_heads = rotary(q_heads, seq_q)
            flat = fb.call("reshape", rotary(heads_of(k, seq_k, kv_heads), seq_k), shape=[-1, seq_k, head_dim])
            k_t = fb.call("reshape", fb.call("transpose", flat, axes=[0, 2, 1]),
                          shape=[batch, kv_heads, head_dim, seq_k])
        elif key_form == "llama":
            q_heads = rotary(q_heads, seq_q)
            k_t = fb.call("transpose", repeated(rotary(heads_of(k, seq_k, kv_heads), seq_k), seq_k), axes=[0, 1, 3, 2])
        elif key_form == "sdpa":
            root = np.array(np.sqrt(scale[1]), dtype)
            q_heads = fb.call("multiply", q_heads, root)
            flat = fb.call("transpose", fb.call("reshape", heads_of(k, seq_k), shape=[-1, seq_k, head_dim]),
                           axes=[0, 2, 1])
            k_t = fb.call("reshape", fb.call("multiply", flat, root), shape=[batch, heads, head_dim, seq_k])
        elif key_form == "one_transpose":  # HF / torch.onnx: transpose(reshape(k), [0, 2, 3, 1])
            k_t = fb.call("transpose", fb.call("reshape", k, shape=[batch, seq_k, heads, head_dim]), axes=[0, 2, 3, 1])
        else:  # k.transpose(1, 2).transpose(-1, -2) written out
            k_t = fb.call("transpose", heads_of(k, seq_k), axes=[0, 1, 3, 2])
        scores = fb.call("matmul", q_heads, k_t)
        if scale is not None and key_form != "sdpa":
            scores = fb.call(scale[0], scores, np.array(scale[1], dtype))
        if mask is not None:
            scores = fb.call("add", scores, fb.call("cast", fb.param("mask", mask, "float32"), dtype=dtype))
        probabilities = fb.call("softmax", scores, axis=-1)
        if key_form in ("sdpa", "mqa_sdpa"):
            is_nan = fb.call("not_equal", probabilities, probabilities)
            probabilities = fb.call("where", is_nan, np.array(0.0, dtype), probabilities)
        v_heads = repeated(heads_of(v, seq_k, kv_heads), seq_k) if key_form == "llama" else \
            heads_of(v, seq_k, kv_heads) if key_form == "mqa_sdpa" else heads_of(v, seq_k)
        context = fb.call("matmul", probabilities, v_heads)
        context = fb.call("transpose", context, axes=[0, 2, 1, 3])
        if merge_heads:
            context = fb.call("reshape", context, shape=[batch, seq_q, hidden])
        fb.ret(fb.call("cast", context, dtype="float32"))
    return fb.module()


def _partitioned_attention(mod, tmp_path, tile="", precision="float16"):
    from byoc.pipeline import lower
    from byoc.config import load_config
    cfg = load_config({"target": "cuda -arch=sm_90",
                       "backends": [{"cutlass": {"profile": "false", "attention_tile": tile}}],
                       "precision": precision}, overrides={"workdir": str(tmp_path)})
    mod = lower(mod, cfg, until="partition", workdir=tmp_path)
    return _Codegen(cfg, tmp_path), mod, mod.attrs["partition_report"]


class _Codegen:
    """The codegen stage for a partitioned module (byoc.pipeline.lower from that stage)."""

    def __init__(self, config, workdir):
        self.config, self.workdir = config, workdir

    def codegen(self, mod):
        from byoc.pipeline import lower
        mod = lower(mod, self.config, start="codegen", until="codegen", workdir=self.workdir)
        return mod, mod.attrs["artifacts"]


ATTENTION_MAIN = """\
def @main(%qkv: Tensor[(2, 16, 192), float32]) -> Tensor[(2, 16, 64), float32] {
  %v1 = @builtin_HASH(%qkv)
  %v18 = @cutlass_HASH(%v1)
  %v18_fp32 = @builtin_HASH(%v18)
  return %v18_fp32
}"""


def test_attention_takes_the_whole_chain_with_the_qkv_split_as_one_parameter(tmp_path):
    """cast -> split -> (reshape, transpose) x 3 -> matmul / 8 -> softmax -> matmul ->
    transpose -> reshape: one cutlass function whose only parameter is the QKV tensor;
    the builtin backend keeps the casts at the boundary (CUTLASS's example 41 kernel, by its
    tile: the size rule would take byoc's flash kernel for head dim 32)."""
    import re
    mod = _attention_model(2, 16, 16, 2, 32)
    builder, mod, report = _partitioned_attention(mod, tmp_path, "32x128")
    assert report.to_json()["backends"]["cutlass"]["patterns"] == {"attention": 1}, report.to_text()
    main = mod.script()
    main = main[main.index("def @main"):]
    main = main[:main.index("\n}") + 2]
    main = re.sub(r"@(builtin|cutlass)_[0-9a-f]+", r"@\1_HASH", main)
    assert main.strip() == ATTENTION_MAIN, main
    mod, artifacts = builder.codegen(mod)
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    assert list(cutlass.kernels.values()) == ["cutlass_fmha_sm80_f16_32x128_k64"]
    (source,) = tmp_path.glob("cutlass_*.cu")
    text = source.read_text()
    for line in ("p.query_ptr = static_cast<Element*>(const_cast<void*>(args[0])) + 0;",
                 "p.key_ptr = static_cast<Element*>(const_cast<void*>(args[0])) + 64;",
                 "p.value_ptr = static_cast<Element*>(const_cast<void*>(args[0])) + 128;",
                 "p.scale = 0.125f;", "p.q_strideM = 192;", "p.q_strideH = 32;", "p.q_strideB = 3072;",
                 "p.o_strideM = 64;"):
        assert line in text, line


def test_attention_as_torch_exports_sdpa_is_one_kernel_that_zeroes_rows_masked_whole(tmp_path):
    """torch's exporter scales Q and K^T each by sqrt(scale), writes K^T as a 3-D transpose
    between reshapes and guards the probabilities: where(isnan(p), 0, p). HoistScalarFactors
    and UnflattenBatchTranspose give the chain the attention pattern's form; the guard is
    taken with it, and the flash kernel zeroes rows with no finite score."""
    mod = _attention_model(2, 40, 40, 2, 64, fused_qkv=False, mask=(2, 1, 40, 40), key_form="sdpa",
                           scale=("multiply", 0.125))
    codegen, mod, report = _partitioned_attention(mod, tmp_path)
    assert report.to_json()["backends"]["cutlass"]["patterns"] == {"attention": 1}, report.to_text()
    _, artifacts = codegen.codegen(mod)
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    assert list(cutlass.kernels.values()) == ["byoc_flash_attention_sm80_f16_64x64_d64_mask_zero_empty_rows"]
    (source,) = tmp_path.glob("cutlass_*.cu")
    text = source.read_text()
    assert "FlashAttention<cutlass::half_t, 64, 4, 64, true, true>" in text
    assert "p.scale_log2 = 0.125f * 1.4426950408889634f;" in text


def test_grouped_query_attention_with_rotary_heads_is_one_kernel_reading_shared_heads(tmp_path):
    """LLaMA's attention as transformers writes it: Q's and K's heads rotated (rotary
    embeddings, left to the built-in backend, their results read in place as [B, H, S, D]),
    2 key/value heads repeated to 8 (repeat_kv). One flash kernel takes the chain: query
    head h reads key/value head h / 4 of the fused QKV projection's V slice and of the
    rotated K; no repeated copy is made."""
    mod = _attention_model(1, 32, 32, 8, 64, mask=(1, 1, 32, 32), key_form="llama", kv_heads=2,
                           scale=("multiply", 0.125))
    codegen, mod, report = _partitioned_attention(mod, tmp_path)
    data = report.to_json()["backends"]
    assert data["cutlass"]["patterns"] == {"attention": 1}, report.to_text()
    assert "broadcast_to" not in data["builtin"]["ops_covered"], report.to_text()
    _, artifacts = codegen.codegen(mod)
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    assert list(cutlass.kernels.values()) == ["byoc_flash_attention_sm80_f16_64x64_d64_mask_gqa4"]
    (source,) = tmp_path.glob("cutlass_*.cu")
    text = source.read_text()
    for line in ("p.kv_group = 4;", "p.q_row_stride = 64;", "p.head_stride_q = 2048;", "p.q_batch_stride = 16384;",
                 "p.k_row_stride = 64;", "p.head_stride_k = 2048;", "p.k_batch_stride = 4096;",
                 "p.v_row_stride = 768;", "p.head_stride_v = 64;", "config.gridDim = dim3(1, 8, 1);"):
        assert line in text, line


@pytest.mark.parametrize("kv_heads, kernel", [(1, "byoc_flash_attention_sm80_f16_64x64_d64_mask_zero_empty_rows_gqa8"),
                                              (8, "byoc_flash_attention_sm80_f16_64x64_d64_mask_zero_empty_rows")])
def test_attention_as_torch_exports_it_with_rotary_keys_and_one_shared_head_is_one_kernel(kv_heads, kernel, tmp_path):
    """Falcon (multi-query: one key/value head that both matmuls broadcast to every query
    head) and ModernBERT (8 heads) as torch's exporter writes their scaled_dot_product_attention:
    K^T flattens the rotated heads, which RotateHalfAsView leaves as [B, H, S, 2, D/2] halves.
    UnflattenBatchTranspose reshapes the halves back to heads and the pattern reads them in
    place; the shared head is read by every query head (a group of 8), not repeated."""
    mod = _attention_model(1, 40, 40, 8, 64, fused_qkv=False, mask=(1, 1, 40, 40), key_form="mqa_sdpa",
                           kv_heads=kv_heads, scale=("multiply", 0.125))
    codegen, mod, report = _partitioned_attention(mod, tmp_path)
    assert report.to_json()["backends"]["cutlass"]["patterns"] == {"attention": 1}, report.to_text()
    _, artifacts = codegen.codegen(mod)
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    assert list(cutlass.kernels.values()) == [kernel]
    (source,) = tmp_path.glob("cutlass_*.cu")
    text = source.read_text()
    strides = ("p.k_row_stride = 64;", "p.head_stride_k = 2560;", f"p.k_batch_stride = {kv_heads * 2560};")
    for line in strides + (f"p.kv_group = {8 // kv_heads};",):
        assert line in text, (line, text[text.index("p.k_row_stride") - 400:text.index("p.k_row_stride") + 400])


@pytest.mark.parametrize("case, kwargs, reason", [
    ("head dim", dict(head_dim=256), "head dim 256 > 128"),
    ("unaligned head dim", dict(head_dim=20), "head dim 20 not a multiple of 8"),
    ("keys-broadcast mask", dict(mask=(2, 1, 16, 1)), "broadcast along the keys"),
    ("vector scale", dict(scale=("multiply", np.linspace(0.1, 0.2, 16))), "scores multiply by a non-scalar"),
    ("guarded, head dim 40", dict(key_form="sdpa", scale=("multiply", 0.125)),
     "probabilities guarded against NaN (a row with every key masked gives zeros): only byoc's flash kernel"),
    ("unaligned mask, head dim 40", dict(seq_q=20, seq_k=20, mask=(2, 1, 20, 20)),
     "mask query stride 20 not a multiple of 8: only byoc's flash kernel reads such a mask"),
])
def test_attention_refuses_what_the_kernel_cannot_run_and_batched_matmuls_take_it(case, kwargs, reason, tmp_path):
    args = dict(batch=2, seq_q=16, seq_k=16, heads=2, head_dim=40 if "head dim 40" in case else 32, fused_qkv=False)
    args.update(kwargs)
    mod = _attention_model(args.pop("batch"), args.pop("seq_q"), args.pop("seq_k"), args.pop("heads"),
                           args.pop("head_dim"), **args)
    _, _, report = _partitioned_attention(mod, tmp_path)
    text = report.to_text()
    assert "cutlass.attention" in text and reason in text, text
    assert "attention" not in report.to_json()["backends"]["cutlass"]["patterns"]


def test_grouped_query_attention_no_flash_kernel_runs_takes_the_repeated_heads(tmp_path):
    """Grouped-query attention at head dim 40 (no flash kernel): the match that reads the
    shared key/value heads in place is refused (only byoc's flash kernel does that), and
    the pattern's next match, attention over the heads repeat_kv materialized (two
    broadcast copies on the built-in backend), is fused: one CUTLASS fused-attention kernel
    instead of two batched matmuls and a softmax."""
    mod = _attention_model(2, 16, 16, 2, 40, fused_qkv=False, key_form="llama", kv_heads=1)
    codegen, mod, report = _partitioned_attention(mod, tmp_path)
    data = report.to_json()["backends"]
    assert data["cutlass"]["patterns"] == {"attention": 1}, report.to_text()
    assert data["builtin"]["ops_covered"].get("broadcast_to") == 2, report.to_text()
    _, artifacts = codegen.codegen(mod)
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    assert [k for k in cutlass.kernels.values() if "flash" in k] == [], cutlass.kernels


@pytest.mark.parametrize("tile, lines", [
    ("", ("p.seq_q = 24;", "p.seq_k = 40;", "p.k_batch_stride = 10240;", "p.mask_batch_stride = 40;",
          "p.mask_head_stride = 0;", "p.mask_query_stride = 0;", "p.scale_log2 = 0.125f * 1.4426950408889634f;",
          "config.gridDim = dim3(1, 4, 2);", "FlashAttention<cutlass::half_t, 64, 4, 64, true>")),
    ("32x128", ("p.num_queries = 24;", "p.num_keys = 40;", "p.k_strideB = 10240;", "p.bias_strideB = 40;",
                "p.bias_strideH = 0;", "p.bias_strideM = 0;", "p.scale = 0.125f;")),
], ids=["flash", "example41"])
def test_attention_with_mask_separate_inputs_and_two_key_transposes(tile, lines, tmp_path):
    """Separate Q/K/V inputs of different lengths, K^T as two transposes, * 0.125 and a
    [B, 1, 1, Sk] mask (zero batch-broadcast strides for heads and queries), in both kernels'
    parameters: byoc's flash kernel (head dim 64: the size rule's choice) and CUTLASS's
    example 41 kernel."""
    mod = _attention_model(2, 24, 40, 4, 64, fused_qkv=False, mask=(2, 1, 1, 40), scale=("multiply", 0.125),
                           key_form="two_transposes")
    builder, mod, report = _partitioned_attention(mod, tmp_path, tile)
    assert report.to_json()["backends"]["cutlass"]["patterns"] == {"attention": 1}, report.to_text()
    builder.codegen(mod)
    (source,) = tmp_path.glob("cutlass_*.cu")
    text = source.read_text()
    for line in lines:
        assert line in text, line


def test_the_flash_kernel_needs_no_cutlass_examples(tmp_path, monkeypatch):
    """byoc's flash kernel ships its header: a CUTLASS without its examples folder still
    builds it (only the example 41 kernel asks for examples/41_fused_multi_head_attention)."""
    import byoc.toolchain
    from byoc.errors import BuildError

    def no_examples(name):
        raise BuildError(f"CUTLASS's examples/{name} not found")
    monkeypatch.setattr(byoc.toolchain, "cutlass_example_dir", no_examples)
    mod = _attention_model(2, 24, 40, 4, 64, fused_qkv=False, mask=(2, 1, 1, 40))
    builder, mod, _ = _partitioned_attention(mod, tmp_path)
    _, artifacts = builder.codegen(mod)
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    assert list(cutlass.kernels.values()) == ["byoc_flash_attention_sm80_f16_64x64_d64_mask"]
    builder, mod, _ = _partitioned_attention(_attention_model(2, 24, 40, 4, 64, fused_qkv=False, mask=(2, 1, 1, 40)),
                                             tmp_path / "example41", tile="32x128")
    with pytest.raises(BuildError, match="examples/41_fused_multi_head_attention not found"):
        builder.codegen(mod)


def test_attention_reads_heads_cast_outside_the_chain(tmp_path):
    """float32 Q, K, V inputs cast to float16 by the model itself, in a float32 build:
    SinkReshapes moves each head-split reshape above its input's cast, so the heads reach
    the chain as [B, S, H, D] values computed outside it; the attention takes them as rows
    of H*D (the builtin backend keeps reshape and cast)."""
    mod = _attention_model(3, 50, 136, 2, 64, fused_qkv=False, mask=(3, 1, 1, 136), scale=("multiply", 0.125),
                           key_form="two_transposes")
    builder, mod, report = _partitioned_attention(mod, tmp_path, precision="float32")
    assert report.to_json()["backends"]["cutlass"]["patterns"] == {"attention": 1}, report.to_text()
    (attention,) = [f for name, f in mod.items() if name.startswith("cutlass_")]
    assert sorted(tuple(p.type.shape) for p in attention.params) == [(3, 1, 1, 136), (3, 50, 2, 64), (3, 136, 2, 64),
                                                                     (3, 136, 2, 64)]
    builder.codegen(mod)
    (source,) = tmp_path.glob("cutlass_*.cu")
    text = source.read_text()
    for line in ("p.q_row_stride = 128;", "p.k_row_stride = 128;", "p.k_batch_stride = 17408;", "p.seq_k = 136;"):
        assert line in text, line


@needs_nvcc
@needs_cutlass
@pytest.mark.parametrize("sm, tile, kernel", [
    (90, "", "byoc_flash_attention_sm80_bf16_64x64_d64_mask"),
    (80, "", "byoc_flash_attention_sm80_bf16_64x64_d64_mask"),
    (90, "flash:32x64", "byoc_flash_attention_sm80_bf16_32x64_d64_mask"),
    (90, "sdpa", "byoc_flash_attention_sm80_bf16_64x64_d64_mask_zero_empty_rows"),
    (90, "32x128", "cutlass_fmha_sm80_bf16_32x128_k64_mask"),
    (80, "32x128", "cutlass_fmha_sm80_bf16_32x128_k64_mask"),
])
def test_attention_kernel_compiles(sm, tile, kernel, tmp_path):
    """Both fused attention kernels (with a mask, bfloat16) render and compile with nvcc for
    the target's arch: byoc's flash kernel with its header, CUTLASS's example 41 kernel with
    the nvidia-cutlass example headers and cuRAND's header."""
    from byoc.pipeline import lower
    from byoc.config import load_config
    from byoc.toolchain import compile_units
    form = "sdpa" if tile == "sdpa" else "one_transpose"  # the exporter's form, its probabilities guarded
    tile = "" if tile == "sdpa" else tile
    mod = _attention_model(2, 64, 64, 2, 64, fused_qkv=False, mask=(2, 1, 1, 64), dtype="bfloat16", key_form=form,
                           scale=("multiply", 0.125))
    cfg = load_config({"target": f"cuda -arch=sm_{sm}",
                       "backends": [{"cutlass": {"profile": "false", "attention_tile": tile}}],
                       "precision": "bfloat16"}, overrides={"workdir": str(tmp_path)})
    artifacts = lower(mod, cfg, until="codegen", workdir=tmp_path).attrs["artifacts"]
    (cutlass,) = [a for a in artifacts if a.backend == "cutlass"]
    assert list(cutlass.kernels.values()) == [kernel]
    objects = compile_units(cutlass.compile_units, tmp_path)
    assert all(Path(o).stat().st_size > 0 for o in objects)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
@pytest.mark.parametrize("case, shape, kwargs, tile", [
    # byoc's flash kernel (head dims 32, 64 and 128; the size rule's choice for them)
    ("bert_qkv_split", (2, 77, 77, 4, 64), dict(), ""),  # rows not a multiple of the tile
    ("mask_separate_qkv", (3, 50, 136, 2, 64), dict(fused_qkv=False, mask=(3, 1, 1, 136),
                                                    scale=("multiply", 0.125), key_form="two_transposes"), ""),
    ("full_mask_64x128", (2, 70, 200, 3, 64), dict(fused_qkv=False, mask=(2, 3, 70, 200)), "flash:64x128"),
    ("head_dim_128", (1, 200, 200, 3, 128), dict(scale=None), ""),
    ("head_dim_128_32x64", (2, 100, 72, 2, 128), dict(fused_qkv=False, mask=(2, 2, 100, 72)), "flash:32x64"),
    ("bf16_32x128", (2, 33, 136, 2, 64), dict(fused_qkv=False, mask=(2, 1, 33, 136), dtype="bfloat16"),
     "flash:32x128"),
    ("bert_base_batch8", (8, 128, 128, 12, 64), dict(), ""),  # every key in one block of 128
    ("vit_batch8", (8, 197, 197, 12, 64), dict(), ""),  # 64 keys a block
    # as torch's exporter writes scaled_dot_product_attention: rows masked whole give zeros
    ("sdpa_export_guarded", (2, 77, 96, 3, 64), dict(fused_qkv=False, mask=(2, 1, 77, 96), key_form="sdpa",
                                                     scale=("multiply", 0.125)), ""),
    ("sdpa_export_guarded_d128", (1, 50, 200, 2, 128), dict(fused_qkv=False, mask=(1, 2, 50, 200),
                                                            key_form="sdpa", scale=("multiply", 0.0884)), ""),
    # as transformers' LLaMA writes it: rotary embeddings on Q's and K's heads (computed
    # outside, read in place), 2 key/value heads each read by 4 query heads, a causal mask
    # (100 keys: mask rows of 100 elements, not 16-byte multiples; the flash kernel reads
    # the mask an element at a time)
    ("llama_gqa_rotary", (2, 100, 100, 8, 64), dict(mask=(2, 1, 100, 100), key_form="llama", kv_heads=2,
                                                    scale=("multiply", 0.125)), ""),
    ("llama_gqa_rotary_d128_separate", (1, 64, 72, 4, 128), dict(fused_qkv=False, mask=(1, 1, 64, 72),
                                                                  key_form="llama", kv_heads=1), "flash:32x64"),
    # as torch's exporter writes Falcon's multi-query attention (one key/value head the
    # matmuls broadcast) and ModernBERT's: rotated K flattened for a 3-D transpose, guarded
    ("falcon_mqa_sdpa", (2, 100, 100, 8, 64), dict(fused_qkv=False, mask=(2, 1, 100, 100), key_form="mqa_sdpa",
                                                   kv_heads=1, scale=("multiply", 0.125)), ""),
    ("modernbert_sdpa_rotary", (1, 72, 72, 4, 64), dict(fused_qkv=False, mask=(1, 1, 72, 72), key_form="mqa_sdpa",
                                                        kv_heads=4, scale=("multiply", 0.125)), ""),
    # grouped-query at head dim 40 (no flash kernel): the attention over the heads repeat_kv
    # materialized (the pattern's next match once the shared-heads one is refused)
    ("llama_gqa_d40_repeated", (2, 33, 40, 4, 40), dict(fused_qkv=False, mask=(2, 1, 33, 40), key_form="llama",
                                                         kv_heads=2), ""),
    # Swin's window attention: head dim 32, 49 keys, a relative position bias (and shift
    # mask) per window and head (rows of 49: read an element at a time)
    ("swin_window_d32", (16, 49, 49, 3, 32), dict(mask=(16, 3, 49, 49), scale=("multiply", 32 ** -0.5)), ""),
    ("d32_bf16_64x128", (2, 150, 140, 2, 32), dict(fused_qkv=False, mask=(2, 1, 1, 140), dtype="bfloat16"),
     "flash:64x128"),
    # CUTLASS's example 41 kernel: head dims the flash kernel does not take, and its tiles
    ("full_mask_bf16", (2, 64, 64, 2, 80), dict(fused_qkv=False, mask=(2, 2, 64, 64), dtype="bfloat16"), ""),
    ("example41_32x128", (8, 128, 128, 12, 64), dict(), "32x128"),
    ("example41_64x64", (2, 77, 80, 4, 64), dict(fused_qkv=False, mask=(2, 1, 1, 80)), "64x64"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_attention_matches_float32_reference(case, shape, kwargs, tile, tmp_path):
    import cupy
    mod = _attention_model(*shape, **kwargs)
    library = byoc.build(mod, config={"target": "auto",
                                      "backends": [{"cutlass": {"profile": "false", "attention_tile": tile}}]},
                         workdir=str(tmp_path / "w"))
    assert library.report.to_json()["backends"]["cutlass"]["patterns"] == {"attention": 1}, library.report.to_text()
    kernel = {"bert_base_batch8": "FlashAttention<cutlass::half_t, 64, 4, 128, false>",
              "vit_batch8": "FlashAttention<cutlass::half_t, 64, 4, 64, false>",
              "swin_window_d32": "FlashAttention<cutlass::half_t, 32, 4, 64, true>",
              "full_mask_bf16": "AttentionKernel<Element, cutlass::arch::Sm80"}.get(case)
    if kernel:  # the kernel the size rule picks
        assert kernel in "".join(p.read_text() for p in (tmp_path / "w").glob("cutlass_*.cu")), case
    module = library.load()
    rng = np.random.default_rng(1)
    inputs = {p.name_hint: rng.standard_normal(p.type.shape).astype(np.float32) for p in mod["main"].params}
    if case.startswith("sdpa") or "mqa_sdpa" in str(kwargs.get("key_form")):
        # a boolean mask as torch makes it additive: 0 or -inf; some rows all -inf
        inputs["mask"] = np.where(rng.random(inputs["mask"].shape) < 0.8, 0.0, -np.inf).astype(np.float32)
        inputs["mask"][0, :, 3, :] = -np.inf
        inputs["mask"][-1, :, -1, :] = -np.inf
    elif "mask" in inputs:  # an attention mask: 0 where attended, a large negative number where padded
        inputs["mask"] = np.where(rng.random(inputs["mask"].shape) < 0.8, 0.0, -10000.0).astype(np.float32)
        inputs["mask"][..., 0] = 0.0  # every row attends to something
    got = cupy.asnumpy(module.run(**{k: cupy.asarray(v) for k, v in inputs.items()}))
    with np.errstate(invalid="ignore"):  # the reference's softmax of a row of -inf is NaN (the guard zeroes it)
        reference = byoc.interpret(mod, **inputs)  # the same graph in float32
    assert np.isfinite(reference).all() and np.isfinite(got).all(), case
    assert np.max(np.abs(got - reference)) <= 1e-2 * np.max(np.abs(reference)), case
    if case.startswith("sdpa") or kwargs.get("key_form") == "mqa_sdpa":
        assert "_zero_empty_rows" in "".join(p.read_text() for p in (tmp_path / "w").glob("cutlass_*.cu"))
        assert not got[0, 3].any() and not got[-1, -1].any()  # the rows masked whole


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
@pytest.mark.parametrize("name", ["bert2", "bert12_tiny"])
def test_whole_bert_with_fused_attention_matches_onnxruntime_fixture(name, tmp_path):
    """The HF BERT fixtures (exported by torch; bert2 pads row 1's last 4 tokens through its
    attention mask) fp16 with cuda_sm90's backends: every layer's attention is one fused kernel."""
    import cupy
    data = np.load(Path(__file__).parent / "fixtures" / f"{name}.npz")
    inputs = {k[3:]: v for k, v in data.items() if k.startswith("in_")}
    expected = [v for k, v in data.items() if k.startswith("out_")]
    # cuda_sm90's backends without tuning (profiling every GEMM would take minutes)
    config = {"target": "auto", "precision": "float16", "cuda_graph": True,
              "backends": [{"cutlass": {"profile": "false"}}, "cublaslt", "builtin"]}
    library = byoc.build(Path(__file__).parent / "fixtures" / f"{name}.onnx", config=config,
                         workdir=str(tmp_path / "w"), input_shapes={k: v.shape for k, v in inputs.items()})
    layers = {"bert2": 2, "bert12_tiny": 12}[name]
    assert library.report.to_json()["backends"]["cutlass"]["patterns"].get("attention") == layers, \
        library.report.to_text()
    got = library.load().run(**{k: cupy.asarray(v) for k, v in inputs.items()})
    for result, want in zip(got, expected, strict=True):
        result = cupy.asnumpy(result).astype(np.float32)
        assert np.max(np.abs(result - want)) <= 1e-2 * np.max(np.abs(want)), library.report.to_text()


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")
def test_pdl_launched_gemms_in_a_cuda_graph_agree_with_direct_runs_over_fresh_inputs(tmp_path):
    """sm90 GEMMs launch with programmatic dependent launch (each may start while the kernel
    before it drains, and waits for it before touching memory): inside a CUDA graph, between
    attention and layer-norm kernels, every output equals the direct run's, bit for bit, over
    fresh inputs (a missing wait would read half-written activations)."""
    import cupy
    data = np.load(Path(__file__).parent / "fixtures" / "bert2.npz")
    inputs = {k[3:]: v for k, v in data.items() if k.startswith("in_")}
    modules = {}
    for graph in (False, True):
        config = {"target": "auto", "precision": "float16", "cuda_graph": graph,
                  "backends": [{"cutlass": {"profile": "false", "pdl": True}}, "builtin"]}
        library = byoc.build(Path(__file__).parent / "fixtures" / "bert2.onnx", config=config,
                             workdir=str(tmp_path / str(graph)), input_shapes={k: v.shape for k, v in inputs.items()})
        sources = "".join(p.read_text() for p in (tmp_path / str(graph)).rglob("*.cu"))
        assert "kLaunchWithPdl" in sources and library.report.to_json()["backends"]["cutlass"]["patterns"]
        assert "CUTLASS_ENABLE_GDC_FOR_SM90" in (tmp_path / str(graph) / "build.ninja").read_text()
        modules[graph] = library.load()
    rng = np.random.default_rng(3)
    for _ in range(30):
        fresh = {k: cupy.asarray(rng.integers(0, 2, v.shape).astype(v.dtype) if v.dtype.kind in "iu"
                                 else rng.standard_normal(v.shape).astype(v.dtype)) for k, v in inputs.items()}
        results = {}
        for graph, module in modules.items():
            got = module.run(**fresh)
            results[graph] = [cupy.asnumpy(r) for r in (got if isinstance(got, tuple) else (got,))]
        for on, off in zip(results[True], results[False], strict=True):
            np.testing.assert_array_equal(on, off)


@pytest.mark.parametrize("kind, pattern", [("reshaped_dense_bias_gelu_tanh", "dense_bias_activation"),
                                           ("reshaped_dense_bias_residual", "dense_bias_residual")])
def test_reshape_wrapped_gemms_keep_their_epilogues(kind, pattern, tmp_path):
    """GPT-2's Conv1D form (reshape, GEMM, reshape, then gelu_new or + residual): after
    SinkReshapes the epilogue op reaches the GEMM and CUTLASS fuses it (no builtin kernel)."""
    from byoc.pipeline import lower
    from byoc.config import load_config
    cfg = load_config({"target": "cuda -arch=sm_90", "backends": [{"cutlass": {"profile": "false"}}, "builtin"],
                       "precision": "float16"}, overrides={"workdir": str(tmp_path)})
    report = lower(_model(kind, 77, 1000 if "gelu" in kind else 768, 256), cfg, until="partition",
                   workdir=tmp_path).attrs["partition_report"]
    backends = report.to_json()["backends"]
    assert backends["cutlass"]["patterns"] == {pattern: 1}, report.to_text()
    assert not {"add", "gelu"} & set(backends["builtin"]["ops_covered"]), report.to_text()


@needs_nvcc
@needs_cutlass
def test_a_model_links_a_host_half_another_models_unity_group_compiled(tmp_path, monkeypatch):
    """mlp's three kernels (one tile, three epilogues) compile as unity groups; a model with
    one of them then takes that kernel's host half from the cache: the group's object, with
    the other two kernels' code, whose cubins this library lacks. It compiles neither half
    of its kernel, links as every build links (no undefined symbols allowed), and loads;
    only its own kernel's cubin is in it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    config = "cuda_sm90"  # the shipped config, as `byoc build -c cuda_sm90`
    byoc.build(Path(__file__).parent / "fixtures" / "mlp.onnx", config=config, workdir=tmp_path / "mlp")
    assert len(list((tmp_path / "mlp" / "unity").glob("unity_cutlass_sm90_host_halves_*.cu"))) == 1
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((256, 256)) * 0.05).astype(np.float32), "w")
    bias = numpy_helper.from_array((rng.standard_normal(256) * 0.05).astype(np.float32), "b")
    graph = helper.make_graph(  # mlp's fc2 and its relu alone
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])], "fc2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])], [weight, bias])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "fc2.onnx")
    library = byoc.build(tmp_path / "fc2.onnx", config=config, workdir=tmp_path / "fc2")
    stats = library.build_stats  # of the cutlass units, only the partition's entry point compiles
    assert stats["backends"]["cutlass"]["compiled"] == 1 and not (tmp_path / "fc2" / "unity").exists()
    assert not any(unit["source"].startswith("byoc_cutlass_") for unit in stats["slowest_units"]), stats
    symbols = subprocess.run(["readelf", "-sW", str(tmp_path / "fc2" / "model.so")], capture_output=True,
                             text=True).stdout
    cubins = {line.split()[-1]: line.split()[6] for line in symbols.splitlines() if line.endswith("_device_cubin")}
    defined = [name for name, section in cubins.items() if section != "UND"]
    assert len(defined) == 1 and "_bias_relu_" in defined[0] and len(cubins) == 3, cubins
    import ctypes
    ctypes.CDLL(str(tmp_path / "fc2" / "model.so"))  # the weak references resolve at load (to nothing)
