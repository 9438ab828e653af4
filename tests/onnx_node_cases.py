"""Where the ONNX backend node test cases (`<case>/model.onnx` + `test_data_set_*/`) live.

The `onnx` wheel does not ship `onnx/backend/test/data/node/`, and recent sdists (1.23.x)
do not either, but the wheel does ship the Python generators of those cases
(`onnx.backend.test.case.node`, seeded with `np.random.seed(0)` per case): running them
writes the same files as the onnx repository holds for that version, with no network.

`node_cases_dir()` looks, in order, at:
  1. `$BYOC_ONNX_NODE_CASES` (a folder of case folders, used as is);
  2. the installed onnx package's `backend/test/data/node/` (some versions ship it);
  3. the cache, `~/.cache/byoc/onnx-node-cases/<onnx version>/node` (or under
     `$BYOC_CACHE_DIR`, or `$XDG_CACHE_HOME/byoc`);
  4. filling the cache by running the installed onnx's case generators;
  5. filling the cache from the sdist of the installed version
     (`pip download --no-binary :all:`), for versions whose sdist ships the folder;
and returns None, with `last_failure()` saying why, when none of them works.

Run as a script to fill the cache and print the folder (CI does this once per run):
    python tests/onnx_node_cases.py
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ENV_VARIABLE = "BYOC_ONNX_NODE_CASES"
# Marks a cache folder as complete: a filling step interrupted half way leaves none.
COMPLETE_MARKER = ".complete"

_failures: list[str] = []


def onnx_version() -> str:
    import onnx
    return onnx.__version__


def cache_root() -> Path:
    if os.environ.get("BYOC_CACHE_DIR"):
        return Path(os.environ["BYOC_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "byoc"


def cache_dir(version: str | None = None) -> Path:
    """The cached `node` folder for an onnx version (it may not exist yet)."""
    return cache_root() / "onnx-node-cases" / (version or onnx_version()) / "node"


def last_failure() -> str:
    """Why the last `node_cases_dir()` call found nothing (each source tried, one line each)."""
    return "; ".join(_failures) or "no failure recorded"


def _has_cases(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("*/model.onnx"))


def node_cases_dir() -> Path | None:
    """The folder whose subfolders are the node cases of the installed onnx, or None."""
    _failures.clear()
    from_environment = os.environ.get(ENV_VARIABLE)
    if from_environment:
        if _has_cases(Path(from_environment)):
            return Path(from_environment)
        _failures.append(f"${ENV_VARIABLE}={from_environment!r} holds no <case>/model.onnx")

    try:
        import onnx
    except ImportError as error:
        _failures.append(f"onnx is not installed ({error})")
        return None
    shipped = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
    if _has_cases(shipped):
        return shipped

    cached = cache_dir(onnx.__version__)
    if (cached / COMPLETE_MARKER).is_file() and _has_cases(cached):
        return cached

    for fill in (_generate_into, _extract_sdist_into):
        try:
            if _fill_cache(cached, fill):
                return cached
        except Exception as error:  # any failure here only means "try the next source"
            _failures.append(f"{fill.__name__}: {type(error).__name__}: {error}")
    return None


def _fill_cache(cached: Path, fill) -> bool:
    """Run `fill(staging_folder)` and move the result into place atomically, so that a
    concurrent or interrupted run never sees half a cache."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent, prefix=".filling-") as staging:
        staging_node = Path(staging) / "node"
        if not fill(staging_node) or not _has_cases(staging_node):
            return False
        (staging_node / COMPLETE_MARKER).write_text(f"{fill.__name__}\n")
        if cached.exists():  # an incomplete leftover of an earlier run
            shutil.rmtree(cached)
        try:
            os.replace(staging_node, cached)
        except OSError:
            # another process filled it first: theirs is as good as ours
            if not (cached / COMPLETE_MARKER).is_file():
                raise
    return True


# ---- source 4: the installed onnx's case generators -----------------------------------

def _generate_into(node_folder: Path) -> bool:
    # A subprocess: the generators reseed NumPy's global random state and print warnings,
    # neither of which should leak into the test session that asked for the cases.
    completed = subprocess.run(
        [sys.executable, __file__, "--generate-into", str(node_folder)],
        capture_output=True, text=True, timeout=600)
    if completed.returncode != 0:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        _failures.append(f"generating from onnx.backend.test.case.node failed: {' | '.join(tail)}")
        return False
    return True


def write_generated_cases(node_folder: Path) -> int:
    """Write every node case of `onnx.backend.test.case.node` as the onnx repo lays them
    out: `<name>/model.onnx` and `<name>/test_data_set_<i>/{input,output}_<j>.pb`."""
    import warnings

    from onnx.backend.test.case import node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow casts on purpose
        cases = [case for case in node_cases.collect_testcases() if case.kind == "node"]
    for case in cases:
        case_folder = node_folder / case.name
        case_folder.mkdir(parents=True, exist_ok=True)
        (case_folder / "model.onnx").write_bytes(case.model.SerializeToString())
        graph = case.model.graph
        for set_index, (inputs, outputs) in enumerate(case.data_sets):
            data_folder = case_folder / f"test_data_set_{set_index}"
            data_folder.mkdir(exist_ok=True)
            for kind, values, infos in (("input", inputs, graph.input), ("output", outputs, graph.output)):
                for index, (value, info) in enumerate(zip(values, infos)):
                    proto = _value_to_proto(value, info)
                    (data_folder / f"{kind}_{index}.pb").write_bytes(proto.SerializeToString())
    return len(cases)


def _value_to_proto(value, info):
    """Serialize one input/output value the way onnx's own `generate-data` does."""
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        return value
    if info.type.HasField("map_type"):
        return numpy_helper.from_dict(value, info.name)
    if info.type.HasField("sequence_type"):
        return numpy_helper.from_list(value, info.name)
    if info.type.HasField("optional_type"):
        return numpy_helper.from_optional(value, info.name)
    return numpy_helper.from_array(value, info.name)


# ---- source 5: the sdist of the installed version --------------------------------------

def _extract_sdist_into(node_folder: Path) -> bool:
    version = onnx_version()
    with tempfile.TemporaryDirectory(prefix="byoc-onnx-sdist-") as download_folder:
        completed = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"onnx=={version}", "-d", download_folder],
            capture_output=True, text=True, timeout=300)
        archives = sorted(Path(download_folder).glob("onnx-*.tar.gz"))
        if completed.returncode != 0 or not archives:
            tail = (completed.stderr or completed.stdout).strip().splitlines()[-2:]
            _failures.append(f"pip download of the onnx=={version} sdist failed: {' | '.join(tail)}")
            return False
        with tarfile.open(archives[0]) as archive:
            wanted = [member for member in archive.getmembers() if _node_relative_path(member.name)]
            if not wanted:
                _failures.append(f"the onnx=={version} sdist has no onnx/backend/test/data/node/")
                return False
            for member in wanted:
                # Re-root each member at node_folder, then let the "data" filter refuse
                # links, absolute paths and anything else that could escape it.
                member.name = _node_relative_path(member.name)
                if hasattr(tarfile, "data_filter"):
                    archive.extract(member, node_folder, filter="data")
                elif member.isdir() or member.isfile() and ".." not in member.name.split("/"):
                    archive.extract(member, node_folder)  # Python without extraction filters
    return True


def _node_relative_path(member_name: str) -> str | None:
    """'onnx-1.2.3/onnx/backend/test/data/node/test_abs/model.onnx' -> 'test_abs/model.onnx'."""
    parts = member_name.split("/")
    if len(parts) > 6 and parts[0].startswith("onnx-") and parts[1:6] == ["onnx", "backend", "test", "data", "node"]:
        return "/".join(parts[6:])
    return None


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--generate-into":
        print(f"wrote {write_generated_cases(Path(sys.argv[2]))} node cases to {sys.argv[2]}")
        sys.exit(0)
    found = node_cases_dir()
    if found is None:
        print(f"no ONNX node cases for onnx {onnx_version()}: {last_failure()}", file=sys.stderr)
        sys.exit(1)
    print(found)
