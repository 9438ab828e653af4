"""The robustness suite on an NVIDIA GPU (pytest -m gpu; skipped without one): API misuse
and corrupted libraries against cuda_sm90 builds, and concurrency with CUDA graphs on and
off while other threads keep CuPy busy on the legacy default stream.

Each case runs in a forked child of the fork server, a process that never touches CUDA
(pytest itself may have); every child creates its own CUDA context, so a case costs
about a second more than on the CPU.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from robustness import cases_api, cases_concurrency, cases_library, libraries
from robustness.runner import everything
from gpu_probe import gpu_present

CONFIGS = Path(__file__).resolve().parents[2] / "build_configs"
TOLERANCE = 2e-2        # cuda_sm90 computes in float16
TIMEOUT_FACTOR = 4      # a child creates a CUDA context (and may load cuBLASLt) first


def gpu_visible() -> bool:
    return gpu_present()  # the driver's answer (tests/gpu_probe.py)


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no GPU visible")]


def _config(cuda_graph: bool) -> dict:
    """$BYOC_ROBUSTNESS_CUDA_CONFIG (default cuda_sm90; cuda_sm90_builtin where CUTLASS's
    headers are missing) with CUDA graphs on or off."""
    name = os.environ.get("BYOC_ROBUSTNESS_CUDA_CONFIG", "cuda_sm90")
    config = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    config["cuda_graph"] = cuda_graph
    return config


@pytest.fixture(scope="session")
def cuda_libraries(tmp_path_factory):
    """mlp, multi and sidecar for cuda_sm90 (CUDA graphs on), and mlp with graphs off."""
    root = tmp_path_factory.mktemp("robustness_cuda")
    built = libraries.build_all(root, config=_config(True), device="cuda", tolerance=TOLERANCE,
                                name_suffix="_cuda")
    without_graphs = libraries.build_one(root, "mlp", config=_config(False), device="cuda", tolerance=TOLERANCE,
                                         name_suffix="_cuda_nographs")
    without_graphs["siblings"] = built["mlp"]["siblings"]
    assert built["mlp"]["metadata"].get("cuda_graph") and not without_graphs["metadata"].get("cuda_graph")
    return built, without_graphs


def _slower(cases):
    for case in cases:
        case.timeout *= TIMEOUT_FACTOR
        case.memory_limit = None  # the driver reserves large virtual address ranges
    return cases


def test_api_misuse_cuda(run_family, cuda_libraries):
    built, _ = cuda_libraries
    run_family("api misuse (cuda)", _slower(cases_api.generate(built, device="cuda")))


def test_corrupted_libraries_cuda(run_family, cuda_libraries):
    built, _ = cuda_libraries
    run_family("corrupted libraries (cuda)", _slower(cases_library.generate(built, {}, everything())))


def test_concurrency_cuda(run_family, cuda_libraries):
    built, without_graphs = cuda_libraries
    cases = cases_concurrency.generate(built, everything(), device="cuda",
                                       graph_variants={"graphs on": built["mlp"], "graphs off": without_graphs})
    run_family("concurrency and soak (cuda)", _slower(cases))
