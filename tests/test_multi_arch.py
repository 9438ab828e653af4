"""A library for several CUDA archs (config `arch: [sm_80, sm_90]`): a program per arch,
each compiled for its arch with PTX beside the machine code, byoc's own sources (the shim,
the engines) compiled once with every arch's code; the runtime runs the variants of the
highest arch the device runs, or the one $BYOC_ARCH names. The build and link run where
nvcc is (CI); running needs a GPU."""
import json
from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc.config import load_config
from byoc.errors import ConfigError
from byoc.package import fat_unit
from byoc.toolchain import CompileUnit

FIXTURES = Path(__file__).parent / "fixtures"
MULTI = {"target": "cuda -arch=sm_90", "arch": ["sm_90", "sm_80"], "precision": "float16", "cuda_graph": True}
# every backend, as cuda_sm90 lists them (the cutlass backend's sm left to each arch), untuned
TUNED_BACKENDS = {**load_config("cuda_sm90").to_dict(), "arch": ["sm_80", "sm_90"],
                  "tuning": {"profile": False, "tuning_db": None}}


def gpu_present():
    return __import__("gpu_probe").gpu_present()


@pytest.mark.parametrize("arch, says", [
    (["sm_81"], "'sm_81' is not a CUDA arch byoc builds for"),
    (["sm_80", "sm_80"], "sm_80: the same arch listed more than once"),
    (["sm_90", "sm_90a"], "sm_90, sm_90a: the same arch listed more than once"),
    ([80], "allowed: a list of CUDA archs"),
])
def test_arch_is_a_list_of_cuda_archs(arch, says):
    with pytest.raises(ConfigError, match=says):
        load_config({"arch": arch})
    with pytest.raises(ConfigError, match="needs a cuda target"):
        load_config({"target": "cpu", "arch": ["sm_80"]})
    assert load_config({"target": "cuda", "arch": ["sm_90", "sm_80"]}).arch == ["sm_80", "sm_90"]  # lowest first
    assert load_config({"target": "cuda", "arch": "sm_80"}).to_dict()["arch"] == ["sm_80"]


def test_byocs_sources_compiled_for_two_archs_are_one_object_with_both():
    flags = ["-O3", "-DBYOC_SHIM_DTYPES=0x2"]
    sm80 = CompileUnit("shim/linalg.cu", "cuda", ["-gencode=arch=compute_80,code=[sm_80,compute_80]"] + flags,
                       "shim_sm_80_linalg.o")
    sm90 = CompileUnit("shim/linalg.cu", "cuda", ["-gencode=arch=compute_90,code=[sm_90,compute_90]"] + flags +
                       ["-DBYOC_PDL"], "shim_sm_90_linalg.o")
    merged = fat_unit(sm80, sm90)
    assert merged.output == "shim_sm_80_linalg.o" and "-DBYOC_PDL" not in merged.flags
    assert merged.flags == ["-gencode=arch=compute_80,code=[sm_80,compute_80]",
                            "-gencode=arch=compute_90,code=[sm_90,compute_90]"] + flags
    # for other dtypes (one program's shim family from the kernel library): one object for the dtypes of both
    other = CompileUnit("shim/linalg.cu", "cuda", sm90.flags[:1] + ["-O3", "-DBYOC_SHIM_DTYPES=0x6"], "x.o")
    assert fat_unit(sm80, other).flags[-2:] == ["-O3", "-DBYOC_SHIM_DTYPES=0x6"]
    every = CompileUnit("shim/linalg.cu", "cuda", sm90.flags[:1] + ["-O3"], "x.o")
    assert fat_unit(sm80, every).flags == merged.flags[:2] + ["-O3"]  # every dtype
    optimized_otherwise = CompileUnit("shim/linalg.cu", "cuda", sm90.flags[:1] + ["-O2", "-DBYOC_SHIM_DTYPES=0x2"],
                                      "z.o")
    assert fat_unit(sm80, optimized_otherwise) is None  # compiled another way, not only for another arch
    assert fat_unit(sm80, CompileUnit("shim/gather.cu", "cuda", sm90.flags, "y.o")) is None


@pytest.mark.nvcc
def test_a_library_for_two_archs_holds_a_variant_of_each(tmp_path):
    library = byoc.build(FIXTURES / "mlp.onnx", config=MULTI, workdir=str(tmp_path / "w"))
    assert library.metadata["archs"] == ["sm_80", "sm_90"]
    assert [variant["arch"] for variant in library.metadata["variants"]] == ["sm_80", "sm_90"]
    host = (tmp_path / "w" / "host.cc").read_text()
    assert "80, true," in host and "90, true," in host  # each variant's arch, with PTX
    ninja = (tmp_path / "w" / "build.ninja").read_text()
    shim = [line for line in ninja.splitlines() if "shim/cuda/linalg.cu -o" in line]
    assert len(shim) == 1 and "compute_80,code=[sm_80,compute_80]" in shim[0] and \
        "compute_90,code=[sm_90,compute_90]" in shim[0]
    assert (tmp_path / "w" / "sm_80").is_dir() and (tmp_path / "w" / "sm_90").is_dir()
    assert json.loads((tmp_path / "w" / "metadata.json").read_text())["archs"] == ["sm_80", "sm_90"]


@pytest.mark.nvcc
def test_a_library_for_one_arch_other_than_the_targets_carries_its_weights(tmp_path):
    """arch [sm_80] under an sm_90 target: one program, placed in the blob the programs of a
    library share; the library carries that blob (it once carried the program's own, empty)."""
    from byoc.runtime.library_file import embedded_weights
    library = byoc.build(FIXTURES / "mlp.onnx", config={**MULTI, "arch": ["sm_80"]}, workdir=str(tmp_path / "w"))
    assert [variant["arch"] for variant in library.metadata.get("variants", [{"arch": "sm_80"}])] == ["sm_80"]
    weights = embedded_weights(library.path)
    assert len(weights) == library.metadata["weights"]["bytes"] > 100_000  # the mlp's, in float16


@pytest.mark.nvcc
def test_cutlass_kernels_of_each_arch_compile_and_link_into_one_library(tmp_path):
    """CUTLASS's sm80 (multistage) kernels for the sm_80 program with their PTX, its sm90a
    (TMA, wgmma) kernels for the sm_90 one, one library."""
    library = byoc.build(FIXTURES / "mlp.onnx", config=TUNED_BACKENDS, workdir=str(tmp_path / "w"))
    assert library.metadata["archs"] == ["sm_80", "sm_90"]
    ninja = (tmp_path / "w" / "build.ninja").read_text()
    assert "compute_80,code=[sm_80,compute_80]" in ninja and "compute_90a,code=sm_90a" in ninja
    assert library.path.is_file()


@pytest.mark.nvcc
def test_shape_buckets_of_each_arch(tmp_path):
    """dims with two batch sizes and two archs: four programs, each bucket once per arch,
    the padding analysis the same for both."""
    library = byoc.build(FIXTURES / "gpt2_2l_dynamic.onnx", config={**MULTI, "dims": {"batch": [1, 2], "sequence": 8}},
                         workdir=str(tmp_path / "w"))
    variants = library.metadata["variants"]
    assert [(v["arch"], v["dims"]["batch"]) for v in variants] == [("sm_80", 1), ("sm_80", 2), ("sm_90", 1),
                                                                    ("sm_90", 2)]
    assert library.metadata["archs"] == ["sm_80", "sm_90"] and "batch" in library.metadata["dims"]
    assert (tmp_path / "w" / "sm_90" / "bucket1").is_dir()
    host = (tmp_path / "w" / "host.cc").read_text()
    assert host.count("80, true,") == 2 and host.count("90, true,") == 2


def _fixture(name):
    data = np.load(FIXTURES / f"{name}.npz")
    return ({k[3:]: data[k] for k in data if k.startswith("in_")},
            next(data[k] for k in data if k.startswith("out_")))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU visible")
@pytest.mark.parametrize("name, config", [
    ("mlp", MULTI),
    ("bert2", TUNED_BACKENDS),
])
def test_the_device_runs_its_own_archs_kernels_and_the_older_ones_when_asked(name, config, tmp_path, monkeypatch):
    """On an sm_90 GPU the sm_90 variants run; BYOC_ARCH=sm_80 runs the sm_80 kernels (their
    PTX, compiled by the driver) on the same GPU with the same outputs within fp16's
    tolerance; an arch the library lacks is refused by name."""
    import cupy
    inputs, want = _fixture(name)
    shapes = {key: value.shape for key, value in inputs.items()}
    library = byoc.build(FIXTURES / f"{name}.onnx", config=config, workdir=str(tmp_path / "w"), input_shapes=shapes)
    device_inputs = {key: cupy.asarray(value) for key, value in inputs.items()}

    def run(module):
        got = module.run(**device_inputs)
        return cupy.asnumpy(got[0] if isinstance(got, tuple) else got).astype(np.float32)
    monkeypatch.delenv("BYOC_ARCH", raising=False)
    native = library.load()
    assert native.arch == "sm_90"
    scale = max(1.0, float(np.max(np.abs(want))))
    assert np.max(np.abs(run(native) - want)) <= 2e-2 * scale
    monkeypatch.setenv("BYOC_ARCH", "sm_80")
    older = library.load()
    assert older.arch == "sm_80"
    assert np.max(np.abs(run(older) - run(native))) <= 2e-2 * scale
    for junk in ("sm_80abc", "eighty", "sm_"):
        monkeypatch.setenv("BYOC_ARCH", junk)
        with pytest.raises(byoc.RuntimeError, match=f"BYOC_ARCH is '{junk}'; expected an arch like sm_80"):
            library.load()
    monkeypatch.setenv("BYOC_ARCH", "sm_86")
    with pytest.raises(byoc.RuntimeError, match="BYOC_ARCH asks for sm_86, but this model has sm_80 \\(and PTX\\), sm_90"):
        library.load()


HARNESS = r"""
#include <cstdio>
#include "model_runtime_internal.h"
using byoc_runtime::internal::choose_arch;
int main() {
  const int32_t archs[] = {80, 90};
  const bool ptx[] = {true, true};
  const int32_t specific[] = {80, 90};  // sm_90a: machine code only
  const bool specific_ptx[] = {true, false};
  std::printf("%d %d %d %d %d %d %d %d %d\n",
              choose_arch(archs, ptx, 2, 90, 0),       // H100: its own machine code
              choose_arch(archs, ptx, 2, 90, 80),      // BYOC_ARCH=sm_80 on it: the sm_80 PTX
              choose_arch(archs, ptx, 2, 100, 0),      // Blackwell: the newest PTX
              choose_arch(archs, ptx, 2, 86, 0),       // sm_86: sm_80's machine code (the driver runs it)
              choose_arch(archs, ptx, 2, 75, 0),       // Turing: nothing
              choose_arch(archs, ptx, 2, 90, 86),      // an arch the library lacks
              choose_arch(specific, specific_ptx, 2, 100, 0),  // sm_90a has no PTX: sm_80's
              choose_arch(specific, specific_ptx, 1, 90, 0),   // sm_80 alone on an H100: PTX
              choose_arch(specific + 1, specific_ptx + 1, 1, 100, 0));  // sm_90a alone on Blackwell
  return 0;
}
"""


def test_which_arch_a_device_runs(tmp_path):
    """The runtime's choice (choose_arch, model_runtime_internal.h) compiled on its own: the
    machine code the device runs first, else the newest PTX not above it, BYOC_ARCH's only."""
    import subprocess
    import byoc.runtime as runtime
    source = tmp_path / "harness.cc"
    source.write_text(HARNESS)
    subprocess.run(["g++", "-std=c++17", "-DBYOC_RUNTIME_CUDA=0", f"-I{runtime.INCLUDE_DIR}", str(source), "-o",
                    str(tmp_path / "harness")], check=True)
    chosen = subprocess.run([str(tmp_path / "harness")], capture_output=True, text=True, check=True).stdout.split()
    assert chosen == ["90", "80", "90", "80", "0", "0", "80", "80", "0"]


def test_byoc_build_takes_the_archs_and_names_a_wrong_one(tmp_path):
    import subprocess
    import sys
    for arch, says in (("sm_80", "arch: ['sm_80'] needs a cuda target, but target is 'cpu'"),
                       ("sm_8", "arch: 'sm_8' is not a CUDA arch byoc builds for")):
        result = subprocess.run([sys.executable, "-m", "byoc", "build", str(FIXTURES / "mlp.onnx"), "--target", "cpu",
                                 "--arch", arch, "-o", str(tmp_path / "m.so"), "-q"], capture_output=True, text=True)
        assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr, result.stderr
