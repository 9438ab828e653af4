"""Whether this machine has an NVIDIA GPU, asked of the driver (nvidia-smi, then the
driver's /proc entries), never of a Python package: a probe that imported CuPy inside
`except Exception` turned a missing package into "no GPU visible", so that on a GPU
machine set up without CuPy every GPU test skipped. Here a GPU test runs wherever the
driver shows a GPU, and fails (ImportError) when a package it needs is missing; the
`test` extra brings them. CUDA_VISIBLE_DEVICES set to nothing (or -1) hides the GPUs, as it
does for CUDA itself."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path


@functools.lru_cache(maxsize=None)
def gpu_present() -> bool:
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    if shutil.which("nvidia-smi"):
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
            if listing.returncode == 0:
                return any(line.startswith("GPU ") for line in listing.stdout.splitlines())
        except (OSError, subprocess.TimeoutExpired):
            pass
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())
