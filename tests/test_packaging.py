"""A non-editable install carries every template, config and shim source: the wheel built
from the repository holds each data file of the pipeline folders under byoc/."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"templates": "byoc/templates", "build_configs": "byoc/build_configs", "backends": "byoc/backends"}
DATA_SUFFIXES = (".j2", ".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".yaml", ".json", ".S")


def clean_copy(destination: Path) -> Path:
    """The tracked files only, as a fresh clone has them (an egg-info or build/ folder left
    by an editable install would feed setuptools files the configuration does not name)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def test_wheel_holds_every_data_file(tmp_path):
    source = clean_copy(tmp_path / "src")

    def pip_wheel(*options):
        return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *options, "-q",
                               "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True)

    # With the installed setuptools when it can build wheels (fast, offline), else the way
    # `pip install .` does: in an isolated environment with pyproject's build requirements.
    build = pip_wheel("--no-build-isolation")
    if build.returncode != 0:
        build = pip_wheel()
    assert build.returncode == 0, build.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("byoc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"{installed}/{path.relative_to(REPO / folder).as_posix()}"
                for folder, installed in FOLDERS.items()
                for path in (REPO / folder).rglob("*")
                if path.is_file() and path.suffix in DATA_SUFFIXES and "__pycache__" not in path.parts}
    assert "byoc/templates/host/model.cc.j2" in expected and "byoc/build_configs/cpu.yaml" in expected
    assert sorted(expected - names) == []
