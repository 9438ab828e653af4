"""Toolchain: build.ninja (readable, rerunnable by hand), parallel compile, the object
cache, compiler and linker errors, the link, and finding nvcc and CUTLASS."""
import ctypes
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import types
import warnings

import pytest

import byoc
import byoc.toolchain.cache as cache_module
import byoc.toolchain.compiler as compiler
import byoc.toolchain.locate as locate
from byoc.target import Target
from byoc.toolchain import CompileUnit, compile_units, cutlass_include_dirs, find_ninja, find_nvcc, link_shared
from byoc.toolchain.locate import cuda_home

HAS_NVCC = cuda_home() is not None


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A cache of this test's own, so that no test sees another's objects."""
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _write_sources(directory, answer=42):
    directory.mkdir(exist_ok=True)
    (directory / "include").mkdir(exist_ok=True)
    (directory / "include" / "answer.h").write_text(f"#define ANSWER {answer}\n")
    (directory / "a.cc").write_text('#include "answer.h"\nextern "C" int answer() { return ANSWER; }\n')
    (directory / "b.cc").write_text('extern "C" int answer();\n'
                                    'extern "C" __attribute__((visibility("default"))) int twice() '
                                    '{ return 2 * answer(); }\n')
    flags = Target("cpu").cxx_flags() + [f"-I{directory / 'include'}"]
    return [CompileUnit(directory / "a.cc", "cxx", flags, "a.o"), CompileUnit(directory / "b.cc", "cxx", flags, "b.o")]


def _build(directory, units, progress=None):
    objects = compile_units(units, directory, jobs=2, progress=progress)
    return link_shared(objects, directory / "lib.so", [], [], workdir=directory)


def test_compile_link_and_load(tmp_path, cache):
    work = tmp_path / "work"
    units = _write_sources(work)
    ran = []
    library = _build(work, units, progress=ran.append)
    assert ctypes.CDLL(str(library)).twice() == 84
    assert len(ran) == 2  # ninja compiled both units
    assert len(list(cache.rglob("*.o"))) == 2

    text = (work / "build.ninja").read_text()
    assert "rule cxx_compile" in text and "rule cuda_compile" in text and "rule link_shared" in text
    assert text.count(": cxx_compile ") == 2 and text.count(": link_shared ") == 1
    assert "build obj/a.o: cxx_compile " in text and "default lib.so" in text
    # Each edge carries its whole command: run from the work directory, it repeats the step.
    link_line = next(line for line in text.splitlines() if line.strip().startswith("cmd =") and "-shared" in line)
    (work / "lib.so").unlink()
    subprocess.run(link_line.split("=", 1)[1], shell=True, cwd=work, check=True)
    assert (work / "lib.so").is_file()


def test_build_ninja_reruns_by_hand(tmp_path):
    work = tmp_path / "work"
    _build(work, _write_sources(work))
    for path in [work / "obj" / "a.o", work / "obj" / "b.o", work / "lib.so"]:
        path.unlink()
    subprocess.run([find_ninja(), "-C", str(work)], check=True, capture_output=True)
    assert ctypes.CDLL(str(work / "lib.so")).twice() == 84


def test_second_build_comes_from_the_cache(tmp_path, monkeypatch):
    _build(tmp_path / "first", _write_sources(tmp_path / "first"))

    # The same sources in another directory: every object comes from the cache, ninja
    # (and so the compiler) does not run at all.
    def no_ninja(*args, **kwargs):
        raise AssertionError("ninja ran although every object was cached")
    monkeypatch.setattr(compiler, "run_ninja", no_ninja)
    second = tmp_path / "second"
    library = _build(second, _write_sources(second))
    assert ctypes.CDLL(str(library)).twice() == 84
    assert (second / "build.ninja").read_text().count(": cxx_compile ") == 2  # still there to rerun by hand


def test_changed_header_or_flags_miss_the_cache(tmp_path):
    work = tmp_path / "work"
    units = _write_sources(work)
    _build(work, units)
    # In the same directory, with a.o already there and a.cc untouched: only the header
    # changed, which ninja alone would not notice; the cache key does.
    (work / "include" / "answer.h").write_text("#define ANSWER 7\n")
    ran = []
    library = link_shared(compile_units(units, work, progress=ran.append), work / "lib7.so", [], [], workdir=work)
    assert ctypes.CDLL(str(library)).twice() == 14
    assert len(ran) == 1  # b.cc does not include the header: cached
    # Different flags: a different object.
    for unit in units:
        unit.flags = unit.flags + ["-DUNUSED=1"]
    ran.clear()
    compile_units(units, work, progress=ran.append)
    assert len(ran) == 2


def test_build_ninja_lists_the_longest_kinds_of_compile_first(tmp_path, monkeypatch):
    """ninja starts ready edges in build.ninja's order: device-code units first, then nvcc's,
    then C++ and assembler, whatever order the units came in; the objects come back in the
    units' own order."""
    from byoc.toolchain import compiler as toolchain_compiler
    monkeypatch.setattr(toolchain_compiler, "find_nvcc", lambda: "/usr/bin/true")
    monkeypatch.setattr(toolchain_compiler, "run_ninja", lambda *args, **kwargs: (0, ""))
    monkeypatch.setattr(toolchain_compiler.cache, "fetch", lambda key, destination: destination.write_bytes(b"o") or True)
    work = tmp_path / "work"
    work.mkdir()
    units = []
    for name, language in (("a.S", "asm"), ("b.cc", "cxx"), ("c.cu", "cuda"), ("d_device.cu", "cubin")):
        (work / name).write_text("\n")
        units.append(CompileUnit(work / name, language, [], f"{name.split('.')[0]}.o"))
    objects = compile_units(units, work)
    assert [o.name for o in objects] == ["a.o", "b.o", "c.o", "d_device.o"]
    edges = re.findall(r"^build (\S+): (\w+)", (work / "build.ninja").read_text(), re.M)
    assert [rule for _, rule in edges] == ["cubin_compile", "cuda_compile", "cxx_compile", "asm_compile"]


def test_a_header_the_units_share_is_read_once_for_their_keys(tmp_path, monkeypatch, cache):
    """The cache keys of one build's units read each source and header once (a build's
    units share most of their headers); a header changed before the next build is read
    again and changes that unit's key."""
    import pathlib
    work = tmp_path / "work"
    units = _write_sources(work)
    (work / "b.cc").write_text('#include "answer.h"\nextern "C" int answer();\n'
                               'extern "C" __attribute__((visibility("default"))) int twice() '
                               '{ return ANSWER + answer(); }\n')
    reads = []
    read_bytes = pathlib.Path.read_bytes
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda path: reads.append(path.name) or read_bytes(path))
    _build(work, units)
    assert reads.count("answer.h") == 1 and reads.count("a.cc") == 1 and reads.count("b.cc") == 1
    (work / "include" / "answer.h").write_text("#define ANSWER 5\n")
    reads.clear()
    library = link_shared(compile_units(units, work), work / "lib5.so", [], [], workdir=work)
    assert reads.count("answer.h") == 1 and ctypes.CDLL(str(library)).twice() == 10


def test_compiler_error_names_file_and_first_error(tmp_path):
    good = tmp_path / "good.cc"
    good.write_text("int good() { return 1; }\n")
    broken = tmp_path / "broken.cc"
    broken.write_text("int broken() {\n  return missing_name;\n}\n")
    units = [CompileUnit(good, "cxx", ["-O0"], "good.o"), CompileUnit(broken, "cxx", ["-O0"], "broken.o")]
    with pytest.raises(byoc.BuildError) as info:
        compile_units(units, tmp_path / "work")
    message = str(info.value)
    assert f"compiling {broken} failed" in message and str(tmp_path / "work" / "build.ninja") in message
    assert "broken.cc:2:" in message and "error" in message and "missing_name" in message
    assert "Traceback" not in message and "good.cc" not in message
    assert len(message.splitlines()) <= 12
    # The unit that compiled is cached: fixing the broken one recompiles only it.
    broken.write_text("int broken() { return 2; }\n")
    ran = []
    compile_units(units, tmp_path / "work", progress=ran.append)
    assert len(ran) == 1


def test_link_error_shows_the_undefined_symbol(tmp_path):
    source = tmp_path / "uses.cc"
    source.write_text('extern "C" int nowhere(); extern "C" int uses() { return nowhere(); }\n')
    objects = compile_units([CompileUnit(source, "cxx", ["-fPIC"], "uses.o")], tmp_path)
    # (ld.bfd quotes the name `nowhere', gold 'nowhere', lld nowhere)
    with pytest.raises(byoc.BuildError, match=r"(?s)linking .*lib\.so failed.*undefined (reference|symbol)( to)?\W+nowhere"):
        link_shared(objects, tmp_path / "lib.so", ["-Wl,--no-undefined"], [], workdir=tmp_path)


def test_commands_with_dollar_signs_survive_build_ninja(tmp_path):
    work = tmp_path / "work"
    objects = compile_units(_write_sources(work), work)
    library = link_shared(objects, work / "lib.so", ["-Wl,-rpath,$ORIGIN"], [], workdir=work)
    assert "$$ORIGIN" in (work / "build.ninja").read_text()
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    assert "[$ORIGIN]" in dynamic


def test_relinking_replaces_the_link_edge(tmp_path):
    work = tmp_path / "work"
    objects = compile_units(_write_sources(work), work)
    link_shared(objects, work / "lib.so", [], [], workdir=work)
    link_shared(objects, work / "lib.so", ["-s"], [], workdir=work)
    text = (work / "build.ninja").read_text()
    assert text.count(": link_shared ") == 1 and " -s" in text
    subprocess.run([find_ninja(), "-C", str(work), "-n"], check=True, capture_output=True)  # still valid


def test_missing_compilers_and_cutlass_are_clear_errors(monkeypatch):
    monkeypatch.setattr(locate, "cuda_home", lambda: None)
    with pytest.raises(byoc.BuildError, match="nvcc not found: install the CUDA toolkit and set CUDA_HOME"):
        find_nvcc()
    monkeypatch.setattr(locate, "_cutlass_roots", lambda: [])
    with pytest.raises(byoc.BuildError, match="pip install nvidia-cutlass"):
        cutlass_include_dirs()


def test_cutlass_headers_from_the_pip_package():
    pytest.importorskip("cutlass_library")
    include = cutlass_include_dirs()[0]
    assert (include / "cutlass" / "cutlass.h").is_file()


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_cuda_home_sees_through_an_nvcc_wrapper_script(tmp_path, monkeypatch):
    real_home = cuda_home()
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real_home / "bin" / "nvcc"} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}/usr/bin:/bin")
    assert cuda_home().resolve() == real_home.resolve()


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_nvcc_unit_for_sm90(tmp_path):
    source = tmp_path / "kernel.cu"
    source.write_text('__global__ void scale(float* x) { x[threadIdx.x] *= 2; }\n'
                      'extern "C" void launch(float* x) { scale<<<1, 32>>>(x); }\n')
    flags = Target("cuda -arch=sm_90 -use_fast_math=1").nvcc_flags()
    (obj,) = compile_units([CompileUnit(source, "cuda", flags, "kernel.o")], tmp_path / "work")
    assert obj.stat().st_size > 0
    assert ": cuda_compile " in (tmp_path / "work" / "build.ninja").read_text()
    cuobjdump = shutil.which("cuobjdump") or str(cuda_home() / "bin" / "cuobjdump")
    if os.path.exists(cuobjdump):
        listing = subprocess.run([cuobjdump, "--list-elf", str(obj)], capture_output=True, text=True).stdout
        assert "sm_90" in listing


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_a_cubin_unit_embeds_device_code_for_a_host_unit(tmp_path, cache, monkeypatch):
    """A cubin unit is device code alone: nvcc -cubin, then the assembler embeds the cubin
    in an object at <object>_cubin, which a host unit of the same library reads (and, on a
    GPU, loads with cudaLibraryLoadData). build.ninja shows both steps of the edge; the
    object comes from the cache the second time."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "scale_device.cu").write_text(
        'extern "C" __global__ void scale_kernel(float* x) { x[threadIdx.x] *= 2; }\n')
    (work / "host.cc").write_text(
        'extern "C" const unsigned char scale_device_cubin[];\n'
        'extern "C" __attribute__((visibility("default"))) int cubin_magic() {\n'
        '  return scale_device_cubin[0] == 0x7f && scale_device_cubin[1] == \'E\' && scale_device_cubin[2] == \'L\';\n'
        '}\n')
    flags = Target("cuda -arch=sm_90").nvcc_flags()
    units = [CompileUnit(work / "scale_device.cu", "cubin", flags, "scale_device.o"),
             CompileUnit(work / "host.cc", "cxx", Target("cpu").cxx_flags(), "host.o")]
    library = _build(work, units)
    assert ctypes.CDLL(str(library)).cubin_magic() == 1
    symbols = subprocess.run(["readelf", "-sW", str(work / "obj" / "scale_device.cubin")], capture_output=True,
                             text=True).stdout
    assert re.search(r"FUNC +GLOBAL .* scale_kernel$", symbols, re.M), symbols
    text = (work / "build.ninja").read_text()
    (edge,) = [line for line in text.splitlines() if "-cubin" in line]
    assert " -cubin scale_device.cu -o obj/scale_device.cubin && " in edge
    assert "-DBYOC_EMBED_SYMBOL=scale_device_cubin" in edge and "obj/scale_device.o" in edge
    stats = {}
    again = tmp_path / "again"
    again.mkdir()
    for unit in units:
        (again / unit.source.name).write_text(unit.source.read_text())
    again_units = [CompileUnit(again / unit.source.name, unit.language, unit.flags, unit.output) for unit in units]
    compile_units(again_units, again, stats=stats)
    assert stats["compiled"] == []
    # the embedding step's assembler source keys the object too: a changed one compiles it again
    embed = tmp_path / "embed_cubin.S"
    embed.write_text(compiler.EMBED_CUBIN.read_text() + "/* changed */\n")
    monkeypatch.setattr(compiler, "EMBED_CUBIN", embed)
    compile_units(again_units, again, stats=stats)
    assert stats["compiled"] == [0]
    # device code that does not compile: an error naming the file and nvcc's line, no object
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bad_device.cu").write_text('extern "C" __global__ void k(float* x) {\n  x[0] = no_such_name;\n}\n')
    with pytest.raises(byoc.BuildError) as info:
        compile_units([CompileUnit(broken / "bad_device.cu", "cubin", flags, "bad_device.o")], broken)
    assert str(broken / "bad_device.cu") in str(info.value) and "no_such_name" in str(info.value)
    assert not (broken / "obj" / "bad_device.o").exists()


# ---- unity builds ------------------------------------------------------------------------------

def test_unity_groups_take_units_of_one_key_language_suffix_and_flags_a_few_at_a_time():
    """At most eight in a group (four cubins), sizes as even as possible, whatever order the
    units come in; a unit of another key, language, source suffix or flags, or whose path
    cannot be #included, stays out; a group of one is no group."""
    from byoc.toolchain.unity import unity_groups
    flags = ["-O2"]

    def unit(name, unity="k", language="cxx", unit_flags=flags, suffix=".cc"):
        return CompileUnit(f"/src/{name}{suffix}", language, list(unit_flags), f"{name}.o", unity=unity)
    units = [unit(f"u{i:02}") for i in range(11)]  # 11 of one key: two groups, 6 and 5
    units += [unit("other_key", unity="j"), unit("no_key", unity=""), unit("other_flags", unit_flags=["-O0"]),
              unit("other_language", language="cuda"), unit("other_suffix", suffix=".cpp"),
              unit('quote"d'), unit("new\nline")]
    groups = unity_groups(list(reversed(units)))  # the units' order does not matter
    assert [[u.output for u in group] for group in groups] == [
        [f"u{i:02}.o" for i in range(6)], [f"u{i:02}.o" for i in range(6, 11)]]
    assert unity_groups(units[:1] + units[11:]) == []
    cubins = [unit(f"d{i}", language="cubin", suffix=".cu") for i in range(5)]
    assert [len(group) for group in unity_groups(cubins)] == [3, 2]


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_byoc_unity_build_0_compiles_every_unit_alone(monkeypatch, value):
    from byoc.toolchain.unity import unity_groups
    units = [CompileUnit(f"/src/{name}.cc", "cxx", [], f"{name}.o", unity="k") for name in "ab"]
    assert len(unity_groups(units)) == 1
    monkeypatch.setenv("BYOC_UNITY_BUILD", value)
    assert unity_groups(units) == []


def test_a_byoc_unity_build_value_that_is_neither_on_nor_off_is_named(monkeypatch):
    from byoc.toolchain.unity import unity_groups
    units = [CompileUnit(f"/src/{name}.cc", "cxx", [], f"{name}.o", unity="k") for name in "ab"]
    monkeypatch.setenv("BYOC_UNITY_BUILD", "O")
    with pytest.raises(byoc.BuildError, match=r"BYOC_UNITY_BUILD='O': expected 1, true, on or yes"):
        unity_groups(units)
    monkeypatch.setenv("BYOC_UNITY_BUILD", " Yes ")
    assert len(unity_groups(units)) == 1


def _weak_units(directory):
    """Three cxx units written as unity members must be: weak definitions named after their
    content, so that one member's object may carry the others' code."""
    directory.mkdir(exist_ok=True)
    weak = 'extern "C" __attribute__((weak, visibility("default")))'
    (directory / "a.cc").write_text(f"{weak} int answer_v1() {{ return 42; }}\n")
    (directory / "b.cc").write_text(f'extern "C" int answer_v1();\n{weak} int twice_v1() {{ return 2 * answer_v1(); }}\n')
    (directory / "c.cc").write_text(f"{weak} int thrice_v1() {{ return 3 * 14; }}\n")
    flags = Target("cpu").cxx_flags()
    return [CompileUnit(directory / f"{name}.cc", "cxx", flags, f"{name}.o", unity="answers") for name in "abc"]


def test_a_unity_group_compiles_once_links_once_and_serves_each_member_from_the_cache(tmp_path, cache):
    """cxx units of one unity key that the cache lacks: one translation unit that #includes
    each (readable, in obj/unity/), one edge, one object linked in their place, cached under
    each member's key. The next build takes it from the cache once for all three; a build
    that needs one member alone takes the same object and links it."""
    work = tmp_path / "work"
    units = _weak_units(work)
    ran, stats = [], {}
    objects = compile_units(units, work, progress=ran.append, stats=stats)
    (unity,) = (work / "unity").glob("unity_answers_*.cc")
    assert objects == [work / "obj" / "unity" / f"{unity.stem}.o"]
    assert unity.read_text().splitlines()[-3:] == ['#include "../a.cc"', '#include "../b.cc"', '#include "../c.cc"']
    assert len(ran) == 1 and stats["compiled"] == [0, 1, 2] and list(stats["unit_seconds"]) == [unity.name]
    assert len(list(cache.rglob("*.o"))) == 3  # the group's object under each member's key
    text = (work / "build.ninja").read_text()
    assert text.count(": cxx_compile ") == 1 and f"-c unity/{unity.name} -o obj/unity/{unity.stem}.o" in text
    library = ctypes.CDLL(str(link_shared(objects, work / "lib.so", [], [], workdir=work)))
    assert library.twice_v1() == 84 and library.thrice_v1() == 42
    # again, elsewhere: every member from the cache, the one object linked once, and
    # build.ninja again with the group's edge: rerun by hand, it rebuilds all three
    again = tmp_path / "again"
    objects = compile_units(_weak_units(again), again, stats=stats)
    assert stats["compiled"] == [] and objects == [again / "obj" / "unity" / f"{unity.stem}.o"]
    assert (again / "build.ninja").read_text().count(": cxx_compile ") == 1
    link_shared(objects, again / "lib.so", [], [], workdir=again)
    shutil.rmtree(again / "obj")
    (again / "lib.so").unlink()
    subprocess.run([find_ninja(), "-C", str(again)], check=True, capture_output=True)
    assert ctypes.CDLL(str(again / "lib.so")).twice_v1() == 84
    # one member alone, and one new unit: the member's object is the group's
    alone = tmp_path / "alone"
    _, _, c = _weak_units(alone)
    (alone / "d.cc").write_text('extern "C" int thrice_v1();\n'
                                'extern "C" __attribute__((visibility("default"))) int d() { return thrice_v1() + 1; }\n')
    objects = compile_units([c, CompileUnit(alone / "d.cc", "cxx", c.flags, "d.o")], alone, stats=stats)
    assert stats["compiled"] == [1] and [o.name for o in objects] == ["c.o", "d.o"]
    library = ctypes.CDLL(str(link_shared(objects, alone / "lib.so", [], [], workdir=alone)))
    assert library.d() == 43 and library.twice_v1() == 84  # b's code came with c's object


def test_a_failing_member_fails_its_unity_group_by_name(tmp_path, cache):
    """A unity group that does not compile: the error names its source and every member's,
    nothing of the group is cached or left behind, and units outside it still compile."""
    work = tmp_path / "work"
    units = _write_sources(work)
    (work / "bad.cc").write_text("int broken() { return no_such_name; }\n")
    members = [CompileUnit(work / "a.cc", "cxx", units[0].flags, "a.o", unity="k"),
               CompileUnit(work / "bad.cc", "cxx", units[0].flags, "bad.o", unity="k")]
    with pytest.raises(byoc.BuildError) as info:
        compile_units(members + [units[1]], work)
    message = str(info.value)
    (unity,) = (work / "unity").glob("unity_k_*.cc")
    assert f"compiling {unity} (together: {work / 'a.cc'}, {work / 'bad.cc'}) failed" in message
    assert "no_such_name" in message and f"rerun: ninja -C {work} obj/unity/{unity.stem}.o" in message
    assert not (work / "obj" / "unity" / f"{unity.stem}.o").exists()
    assert [path.name for path in cache.rglob("*.o")] != [] and (work / "obj" / "b.o").is_file()
    assert len(list(cache.rglob("*.o"))) == 1  # b.o alone


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_cubin_units_of_one_unity_key_share_one_cubin_and_keep_their_own_objects(tmp_path, cache):
    """Device halves of one key compile as one cubin, embedded in each member's own object
    under the member's own symbol; each object is cached under its member's key, so a later
    build that needs one of them alone takes it from the cache."""
    work = tmp_path / "work"
    work.mkdir()
    flags = Target("cuda -arch=sm_90").nvcc_flags()
    for name, factor in (("twice", 2), ("thrice", 3)):
        (work / f"{name}_device.cu").write_text(
            f'extern "C" __global__ void {name}_kernel(float* x) {{ x[threadIdx.x] *= {factor}; }}\n')
    units = [CompileUnit(work / f"{name}_device.cu", "cubin", flags, f"{name}_device.o", unity="scale")
             for name in ("thrice", "twice")]
    ran, stats = [], {}
    objects = compile_units(units, work, progress=ran.append, stats=stats)
    assert objects == [work / "obj" / "thrice_device.o", work / "obj" / "twice_device.o"]
    assert len(ran) == 3 and stats["compiled"] == [0, 1]  # the cubin, then the two objects
    (cubin,) = (work / "obj" / "unity").glob("unity_scale_*.cubin")
    symbols = subprocess.run(["readelf", "-sW", str(cubin)], capture_output=True, text=True).stdout
    assert re.search(r"FUNC +GLOBAL .* twice_kernel$", symbols, re.M) and "thrice_kernel" in symbols
    for obj, symbol in ((objects[0], "thrice_device_cubin"), (objects[1], "twice_device_cubin")):
        defined = subprocess.run(["nm", str(obj)], capture_output=True, text=True).stdout.split()
        assert symbol in defined and not {"thrice_device_cubin", "twice_device_cubin"} - {symbol} & set(defined)
    text = (work / "build.ninja").read_text()
    assert text.count(": cubin_compile ") == 1 and text.count(": embed_cubin ") == 2
    one = tmp_path / "one"
    one.mkdir()
    (one / "twice_device.cu").write_text((work / "twice_device.cu").read_text())
    compile_units([CompileUnit(one / "twice_device.cu", "cubin", flags, "twice_device.o", unity="scale")], one,
                  stats=stats)
    assert stats["compiled"] == []


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_nvcc_error_names_file_and_line(tmp_path):
    source = tmp_path / "broken.cu"
    source.write_text("__global__ void k(float* x) {\n  x[0] = undefined_thing;\n}\n")
    with pytest.raises(byoc.BuildError) as info:
        compile_units([CompileUnit(source, "cuda", Target("cuda").nvcc_flags(), "broken.o")], tmp_path / "work")
    message = str(info.value)
    assert str(source) in message and "undefined_thing" in message and "error" in message


# ---- failed compiles, package versions in the key, an unusable cache -------------------------

def _fake_cxx(tmp_path, monkeypatch):
    """A g++ on PATH that, while $FAKE_CXX_FAIL is set, writes half an object and fails
    (as a compiler killed mid-write, or one that fails late, does); else the real g++."""
    real = shutil.which("g++") or shutil.which("c++")
    fake = tmp_path / "fakebin" / "g++"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n'
                    'if [ -n "$FAKE_CXX_FAIL" ]; then\n'
                    '  output=""; previous=""\n'
                    '  for argument in "$@"; do\n'
                    '    [ "$previous" = "-o" ] && output="$argument"; previous="$argument"\n'
                    '  done\n'
                    '  if [ -n "$output" ]; then printf "\\177ELF half" > "$output"; fi\n'
                    '  echo "fake.cc:1:1: error: the fake compiler failed" >&2; exit 1\n'
                    'fi\n'
                    f'exec {real} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    return fake


def test_a_failed_compile_leaves_no_object_in_the_cache_or_the_workdir(tmp_path, monkeypatch, cache):
    _fake_cxx(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    first = tmp_path / "first"
    units = _write_sources(first)
    with pytest.raises(byoc.BuildError) as info:
        compile_units(units, first, jobs=2)
    message = str(info.value)
    # Both sources named (the compiler wrote an object for each, yet failed), with the rerun.
    assert f"compiling {first / 'a.cc'}, {first / 'b.cc'} failed" in message
    assert f"rerun: ninja -C {first} obj/a.o obj/b.o" in message and "the fake compiler failed" in message
    assert not (first / "obj" / "a.o").exists() and not (first / "obj" / "b.o").exists()
    assert not list(cache.rglob("*.o"))

    # The same compiler, working again: another directory compiles afresh (nothing half
    # written comes from the cache), and the first directory's build.ninja rebuilds by hand.
    monkeypatch.delenv("FAKE_CXX_FAIL")
    second = tmp_path / "second"
    ran = []
    library = _build(second, _write_sources(second), progress=ran.append)
    assert len(ran) == 2 and ctypes.CDLL(str(library)).twice() == 84
    subprocess.run([find_ninja(), "-C", str(first)], check=True, capture_output=True)
    assert (first / "obj" / "a.o").stat().st_size > 100


def test_only_the_failed_edge_is_dropped(tmp_path, cache):
    good = tmp_path / "good.cc"
    good.write_text("int good() { return 1; }\n")
    broken = tmp_path / "broken.cc"
    broken.write_text("int broken() { return missing_name; }\n")
    units = [CompileUnit(good, "cxx", ["-O0"], "good.o"), CompileUnit(broken, "cxx", ["-O0"], "broken.o")]
    with pytest.raises(byoc.BuildError, match=r"compiling \S*broken\.cc failed .*rerun: ninja -C \S+ obj/broken\.o\)"):
        compile_units(units, tmp_path / "work")
    assert (tmp_path / "work" / "obj" / "good.o").is_file() and not (tmp_path / "work" / "obj" / "broken.o").exists()
    assert len(list(cache.rglob("*.o"))) == 1


def test_failed_outputs_reads_both_ninja_formats():
    output = ("FAILED: obj/a.o \ng++ -c a.cc -o obj/a.o\nerror\n"
              "FAILED: [code=1] obj/dir with space/b.o \nFAILED: [code=-9] obj/c.o\nFAILED: obj/unknown.o\n")
    assert compiler.failed_outputs(output, ["obj/a.o", "obj/dir with space/b.o", "obj/c.o", "obj/d.o"]) == \
        {"obj/a.o", "obj/dir with space/b.o", "obj/c.o"}


def test_ninja_failing_without_naming_an_edge_trusts_no_object(tmp_path, monkeypatch, cache):
    work = tmp_path / "work"
    units = _write_sources(work)

    def interrupted_ninja(workdir, targets, jobs=None, progress=None):
        for target in targets:
            (workdir / target).write_bytes(b"\x7fELF half")
        return 2, "ninja: build stopped: interrupted by user.\n"
    monkeypatch.setattr(compiler, "run_ninja", interrupted_ninja)
    with pytest.raises(byoc.BuildError, match=r"(?s)ninja failed \(exit code 2\) while compiling \S+a\.cc, \S+b\.cc "
                                              r"\(commands in .*interrupted by user"):
        compile_units(units, work)
    assert not list((work / "obj").glob("*.o")) and not list(cache.rglob("*.o"))

    monkeypatch.setattr(compiler, "run_ninja", lambda *args, **kwargs: (0, ""))
    with pytest.raises(byoc.BuildError, match=r"compiling \S+a\.cc, \S+b\.cc succeeded but wrote no object"):
        compile_units(units, work)


@pytest.fixture
def fresh_package_lookups():
    """The per-process lookups of installed packages, forgotten before and after."""
    cache_module.installed_packages_changed()
    yield
    cache_module.installed_packages_changed()


def _fake_package(site, version):
    """A pip package `fakeheaders` with include/fake.h, installed in `site`."""
    (site / "fakeheaders" / "include").mkdir(parents=True, exist_ok=True)
    (site / "fakeheaders" / "include" / "fake.h").write_text("#define FAKE_VALUE 5\n")
    info = site / "fakeheaders-1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakeheaders\nVersion: {version}\n")
    (info / "RECORD").write_text("fakeheaders/include/fake.h,,\nfakeheaders-1.dist-info/METADATA,,\n")
    return site / "fakeheaders" / "include"


def test_pip_package_versions_key_the_cache(tmp_path, monkeypatch, fresh_package_lookups):
    site = tmp_path / "site"
    include = _fake_package(site, "1.0")
    monkeypatch.syspath_prepend(str(site))
    source = tmp_path / "uses_fake.cc"
    source.write_text('#include <fake.h>\nextern "C" int fake() { return FAKE_VALUE; }\n')
    units = [CompileUnit(source, "cxx", ["-fPIC", f"-I{include}"], "uses_fake.o")]
    assert cache_module.package_versions([include]) == "fakeheaders==1.0"
    ran = []
    compile_units(units, tmp_path / "one", progress=ran.append)
    compile_units(units, tmp_path / "two", progress=ran.append)
    assert len(ran) == 1  # the second build came from the cache
    # Upgraded in place (same files, same paths): the objects are compiled again.
    _fake_package(site, "2.0")
    cache_module.installed_packages_changed()
    assert cache_module.package_versions([include]) == "fakeheaders==2.0"
    compile_units(units, tmp_path / "three", progress=ran.append)
    assert len(ran) == 2


def test_cutlass_and_nvidia_packages_and_the_compiler_key_the_cache(tmp_path, monkeypatch):
    if importlib.util.find_spec("cutlass_library") is not None:
        versions = cache_module.package_versions(cutlass_include_dirs())
        assert f"nvidia-cutlass=={importlib.metadata.version('nvidia-cutlass')}" in versions.splitlines()
    pip_cuda = locate._pip_cuda_library_dir("cublasLt.h")
    if pip_cuda is not None:
        assert "nvidia-cublas==" in cache_module.package_versions([pip_cuda[0]])
    assert cache_module.package_versions([tmp_path, "/nonexistent/include"]) == ""
    # The compiler's version is in the key too.
    source = tmp_path / "a.cc"
    source.write_text("int a() { return 1; }\n")
    unit = CompileUnit(source, "cxx", ["-O2"], "a.o")
    command = compiler._command(unit, str(source), "obj/a.o")
    key = compiler._cache_key(unit, command, tmp_path)
    monkeypatch.setattr(compiler, "compiler_version", lambda name: "g++ (a newer release) 99.1")
    assert compiler._cache_key(unit, command, tmp_path) != key


def _unusable_cache(kind, tmp_path, monkeypatch):
    if kind == "a file":
        path = tmp_path / "cache_file"
        path.write_text("not a directory\n")
    elif kind == "under /proc":
        path = "/proc/byoc-object-cache"
    else:  # read-only: chmod does not stop root, so the copy into it is refused instead
        path = tmp_path / "readonly"
        path.mkdir()
        path.chmod(0o555)
        if os.geteuid() == 0:
            def refused(source, destination, **kwargs):
                raise PermissionError(13, "Permission denied", str(destination))
            monkeypatch.setattr(cache_module, "shutil", types.SimpleNamespace(
                copyfile=refused, copyfileobj=shutil.copyfileobj))
    monkeypatch.setenv("BYOC_CACHE_DIR", str(path))
    return str(path)


@pytest.mark.parametrize("kind", ["a file", "under /proc", "read-only"])
def test_an_unusable_cache_directory_warns_once_and_builds(kind, tmp_path, monkeypatch):
    path = _unusable_cache(kind, tmp_path, monkeypatch)
    work = tmp_path / "work"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        library = _build(work, _write_sources(work))
        assert ctypes.CDLL(str(library)).twice() == 84
        compile_units(_write_sources(tmp_path / "again"), tmp_path / "again")
    messages = [str(w.message) for w in caught if issubclass(w.category, cache_module.CacheWarning)]
    assert len(messages) == 1, messages
    assert f"BYOC_CACHE_DIR={path}" in messages[0] and "building without it" in messages[0]
    assert re.search(r"Not a directory|No such file|Permission denied|Read-only", messages[0])


def test_builds_side_by_side_compile_a_unit_they_share_once(tmp_path, monkeypatch, cache):
    """Two builds in threads of one process (a measured partition's candidates) that need
    the same units at the same moment: each unit is compiled once, the other build waits
    for it and takes its object from the cache; both libraries work."""
    import concurrent.futures
    import threading
    launcher = tmp_path / "slow-counting-launcher"
    launches = tmp_path / "launches.txt"
    launcher.write_text(f'#!/bin/sh\necho "$@" >> {launches}\nsleep 1\nexec "$@"\n')
    launcher.chmod(0o755)
    monkeypatch.setenv("BYOC_COMPILER_LAUNCHER", str(launcher))
    units = _write_sources(tmp_path / "src")
    together = threading.Barrier(2)

    def build(name):
        together.wait()
        return _build(tmp_path / name, units)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        libraries = list(pool.map(build, ["one", "two"]))
    assert len(launches.read_text().splitlines()) == 2  # a.cc and b.cc, once each
    assert [ctypes.CDLL(str(library)).twice() for library in libraries] == [84, 84]
    assert not compiler._COMPILING  # nothing left claimed


def test_a_compiler_launcher_runs_every_compile_and_keys_nothing(tmp_path, monkeypatch, cache):
    """$BYOC_COMPILER_LAUNCHER (sccache, ccache, ...) goes in front of every compile command
    in build.ninja and runs it; objects it made are keyed as without it, so a build without
    the launcher takes them from byoc's cache. One that is not on PATH is a clear error.
    Assembler units (the metadata and program tables, by .incbin) compile without it: a
    launcher's cache does not key the files they include."""
    launcher = tmp_path / "count-launches"
    launches = tmp_path / "launches.txt"
    launcher.write_text(f'#!/bin/sh\necho "$@" >> {launches}\nexec "$@"\n')
    launcher.chmod(0o755)
    monkeypatch.setenv("BYOC_COMPILER_LAUNCHER", str(launcher))
    work = tmp_path / "with"
    library = _build(work, _write_sources(work))
    assert ctypes.CDLL(str(library)).twice() == 84
    assert len(launches.read_text().splitlines()) == 2
    assert (work / "build.ninja").read_text().count(f"cmd = {launcher} ") == 2
    blob = tmp_path / "blob"
    blob.mkdir()
    (blob / "data.bin").write_bytes(b"byoc")
    (blob / "data.S").write_text('.section .rodata\n.globl blob_data\nblob_data:\n.incbin "data.bin"\n')
    compile_units([CompileUnit(blob / "data.S", "asm", ["-Wa,-I,."], "data.o", dependencies=[blob / "data.bin"])],
                  blob)
    assert len(launches.read_text().splitlines()) == 2  # not launched
    assert f"cmd = {launcher} " not in (blob / "build.ninja").read_text()
    monkeypatch.delenv("BYOC_COMPILER_LAUNCHER")
    stats = {}
    other = tmp_path / "without"
    compile_units(_write_sources(other), other, jobs=2, stats=stats)
    assert stats["compiled"] == []  # both from the cache the launched build filled
    monkeypatch.setenv("BYOC_COMPILER_LAUNCHER", "no-such-launcher --flag")
    with pytest.raises(byoc.BuildError, match="BYOC_COMPILER_LAUNCHER names 'no-such-launcher'"):
        compile_units(_write_sources(tmp_path / "missing"), tmp_path / "missing")
    monkeypatch.setenv("BYOC_COMPILER_LAUNCHER", '"sccache')
    with pytest.raises(byoc.BuildError, match="BYOC_COMPILER_LAUNCHER '\"sccache' does not split into words"):
        compile_units(_write_sources(tmp_path / "quoted"), tmp_path / "quoted")


@pytest.mark.parametrize("launcher, shown, failure", [
    ("false", "BYOC_COMPILER_LAUNCHER=false", "failed"),            # fails every command
    ("true", "BYOC_COMPILER_LAUNCHER=true", "wrote no object"),     # succeeds without compiling
    ("echo", "BYOC_COMPILER_LAUNCHER=echo", "wrote no object"),
    ("sh -c", "BYOC_COMPILER_LAUNCHER='sh -c'", "failed"),          # runs the compiler without its arguments
])
def test_a_compile_error_through_a_launcher_names_the_launcher(launcher, shown, failure, tmp_path, monkeypatch, cache):
    """A launcher that does not run the command it is given reads like a compiler error; the
    variable is set far from the build (a shell profile, CI), so the error names it."""
    monkeypatch.setenv("BYOC_COMPILER_LAUNCHER", launcher)
    with pytest.raises(byoc.CompileError, match=failure) as raised:
        compile_units(_write_sources(tmp_path), tmp_path, jobs=2)
    assert f"every compile command ran through {shown};" in str(raised.value)
    assert "unset it to compile without" in str(raised.value)
    monkeypatch.delenv("BYOC_COMPILER_LAUNCHER")  # without one, a failing compiler's error names none
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(byoc.CompileError, match="failed") as raised:
        compile_units(_write_sources(tmp_path / "plain"), tmp_path / "plain", jobs=2)
    assert "BYOC_COMPILER_LAUNCHER" not in str(raised.value)


def test_default_compile_jobs_are_bounded_by_cpus_and_available_memory(monkeypatch):
    from byoc.toolchain import ninja
    monkeypatch.setattr(ninja.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(ninja, "available_memory", lambda: 10 * ninja.MEMORY_PER_JOB + 1)
    assert ninja.default_jobs() == 10
    monkeypatch.setattr(ninja, "available_memory", lambda: 1)
    assert ninja.default_jobs() == 1
    monkeypatch.setattr(ninja, "available_memory", lambda: None)
    assert ninja.default_jobs() == 64
    monkeypatch.setattr(ninja.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(ninja, "available_memory", lambda: 100 * ninja.MEMORY_PER_JOB)
    assert ninja.default_jobs() == 2


def test_edge_seconds_reads_the_last_run_of_each_output_from_the_ninja_log(tmp_path):
    from byoc.toolchain.ninja import edge_seconds
    (tmp_path / ".ninja_log").write_text("# ninja log v7\n"
                                         "0\t1500\t1\tobj/a.o\tff\n"
                                         "10\t30010\t1\tobj/b.o\tee\n"
                                         "0\t2500\t2\tobj/a.o\tdd\n"  # a later run of a.o wins
                                         "garbage line\n")
    assert edge_seconds(tmp_path, ["obj/a.o", "obj/b.o", "obj/c.o"]) == {"obj/a.o": 2.5, "obj/b.o": 30.0}
    assert edge_seconds(tmp_path / "missing", ["obj/a.o"]) == {}


def test_a_fast_linker_that_fails_gives_way_to_the_systems(tmp_path, monkeypatch):
    """lld or gold links the library where the compiler can use one; where it fails a link
    that the system's ld makes (a compiler whose libstdc++.so is a linker script gold cannot
    read), the link is made again without it, and build.ninja's link edge says so."""
    from byoc.toolchain import compiler
    cxx = locate.find_cxx()
    # as if the probe had found a linker the link then cannot use (the memory stays in this test)
    monkeypatch.setattr(compiler, "_FAST_LINKER", {cxx: ("-fuse-ld=byoc-no-such-linker",)})
    source = tmp_path / "a.cc"
    source.write_text('extern "C" int a() { return 1; }\n')
    objects = compile_units([CompileUnit(source, "cxx", ["-fPIC"], "a.o")], tmp_path)
    library = link_shared(objects, tmp_path / "lib.so", [], [], workdir=tmp_path)
    assert library.is_file() and ctypes.CDLL(str(library)).a() == 1
    ninja = (tmp_path / "build.ninja").read_text()
    assert "build lib.so: link_shared" in ninja and "byoc-no-such-linker" not in ninja
    assert compiler.fast_linker_flags(cxx) == ()  # the next link goes straight to the system's


def test_compiled_templates_go_to_the_cache_directory_of_the_moment(tmp_path, monkeypatch):
    """Jinja's compiled templates sit beside the object cache: a process that points
    BYOC_CACHE_DIR elsewhere between renders stores them there, not in the first one."""
    from byoc.codegen import templates
    templates.template_environment.cache_clear()  # a fresh environment: templates compile again
    try:
        for name in ("first", "second"):
            monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / name))
            templates.template_environment().cache.clear()  # compiled in memory: compile from the text
            templates.render_template("cutlass/entries.cc.j2", {"kernels": [], "calls": []})
            assert list((tmp_path / name / "jinja").glob("__jinja2_*.cache")), name
    finally:
        templates.template_environment.cache_clear()
