"""Toolchain: build.ninja, parallel compile, the object cache, compiler errors, link."""
import ctypes
import shutil

import pytest

import byoc
import byoc.target
from byoc.toolchain import CompileUnit, compile_units, link_shared
from byoc.toolchain.compiler import cuda_home


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _sources(directory):
    (directory / "answer.h").write_text("#define ANSWER 42\n")
    (directory / "a.cc").write_text('#include "answer.h"\nextern "C" int answer() { return ANSWER; }\n')
    (directory / "b.cc").write_text('extern "C" int answer();\nextern "C" __attribute__((visibility("default"))) '
                                    'int twice() { return 2 * answer(); }\n')
    flags = ["-O2", "-fPIC", "-fvisibility=hidden", f"-I{directory}"]
    return [CompileUnit(directory / "a.cc", "cxx", flags, "a.o"), CompileUnit(directory / "b.cc", "cxx", flags, "b.o")]


def test_compile_link_and_cache(tmp_path, cache):
    work = tmp_path / "work"
    work.mkdir()
    units = _sources(work)
    objects = compile_units(units, work)
    library = link_shared(objects, work / "lib.so", [], [], workdir=work)
    assert ctypes.CDLL(str(library)).twice() == 84
    ninja_text = (work / "build.ninja").read_text()
    assert ninja_text.count("desc = compile") == 2 and "desc = link" in ninja_text
    assert len(list(cache.rglob("*.o"))) == 2

    # A second build in a fresh directory takes both objects from the cache: no compiler runs.
    again = tmp_path / "again"
    again.mkdir()
    units = _sources(again)
    for unit in units:
        unit.flags = [f if not f.startswith("-I") else f"-I{again}" for f in unit.flags]
    (again / "answer.h").write_text("#define ANSWER 42\n")
    import byoc.toolchain.compiler as compiler
    calls = []
    real_run = compiler.subprocess.run
    compiler.subprocess.run = lambda *a, **k: calls.append(a) or real_run(*a, **k)
    try:
        compile_units(units, again)
    finally:
        compiler.subprocess.run = real_run
    assert calls == []  # everything came from the cache

    # Changing an included header changes the key.
    (again / "answer.h").write_text("#define ANSWER 7\n")
    objects = compile_units(units, again)
    library = link_shared(objects, again / "lib2.so", [], [])
    assert ctypes.CDLL(str(library)).twice() == 14


def test_compiler_error_names_file_and_first_error(tmp_path, cache):
    source = tmp_path / "broken.cc"
    source.write_text("int broken() { return missing_name; }\n")
    with pytest.raises(byoc.BuildError) as info:
        compile_units([CompileUnit(source, "cxx", ["-O0"], "broken.o")], tmp_path)
    message = str(info.value)
    assert "broken.cc" in message and "missing_name" in message and "error" in message


@pytest.mark.skipif(cuda_home() is None, reason="nvcc not installed")
def test_nvcc_unit_for_sm90(tmp_path, cache):
    source = tmp_path / "k.cu"
    source.write_text('__global__ void k(float* x) { x[threadIdx.x] *= 2; }\n'
                      'extern "C" void launch(float* x) { k<<<1, 32>>>(x); }\n')
    flags = byoc.target.Target("cuda -arch=sm_90").nvcc_flags()
    (obj,) = compile_units([CompileUnit(source, "cuda", flags, "k.o")], tmp_path)
    assert obj.stat().st_size > 0
