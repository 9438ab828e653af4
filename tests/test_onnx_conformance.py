"""ONNX backend conformance: the onnx package's node test cases, for the ops byoc claims.

A case is *claimed* when every node of its graph is a default-domain op type in
`SUPPORTED_OPS` and its opset is one the frontend reads and onnx.checker accepts. Each
claimed case is imported with `from_onnx`, run with `byoc.interpret`, and compared with
the expected outputs. Outcomes:
  - pass;
  - skip, "not claimed: ...": the frontend raised UnsupportedOpError (an attribute value,
    an element type such as string/float8/complex, a non-tensor input) -- byoc refuses
    such a case openly, which is allowed;
  - fail: any other exception, or a result of the wrong dtype, shape or value.

Node cases pass axes, pads, shapes, k, ... as graph inputs. When the frontend answers that
such a value must be known at import time, the case is imported again with those inputs
frozen as initializers holding the data set's values, as a user of a static-shape compiler
would do; only if that also fails is the case "not claimed".

The cases come from `tests/onnx_node_cases.py` (see there for where they are found).
`test_conformance_summary` prints the counts per op type (`pytest -s`) and guards a floor.
"""
from __future__ import annotations

import os
import sys
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import byoc
from byoc.frontend import onnx as onnx_frontend

from onnx_node_cases import last_failure, node_cases_dir

# The fewest claimed cases that must pass; raise it as the frontend grows.
PASSING_FLOOR = 920
# The cases byoc claims, as data: each must pass wherever the installed onnx has it; one
# refused (UnsupportedOpError) fails instead of skipping, so that a regression cannot hide
# as a skip. BYOC_WRITE_CONFORMANCE_CLAIMS=1 rewrites the file from the cases that pass now.
CLAIMS_FILE = Path(__file__).parent / "onnx_conformance_claims.txt"
CLAIMS = frozenset(line.strip() for line in CLAIMS_FILE.read_text().splitlines()
                   if line.strip() and not line.startswith("#")) if CLAIMS_FILE.exists() else frozenset()

DEFAULT_DOMAINS = ("", "ai.onnx")
MIN_OPSET = getattr(onnx_frontend, "MIN_OPSET", 13)
MAX_OPSET = getattr(onnx_frontend, "MAX_OPSET", onnx.defs.onnx_opset_version())

# dtype name -> (rtol, atol); dtypes not listed compare exactly (ints, bools).
TOLERANCES = {
    "float64": (1e-4, 1e-6),
    "float32": (1e-4, 1e-6),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}

# Cases whose expected outputs are themselves imprecise: case -> (rtol, atol, why).
LOOSER_TOLERANCES = {
    "test_averagepool_2d_ceil_last_window_starts_on_pad":
        (1e-3, 1e-6, "expected values are written out with 4 significant digits"),
}


# ---- finding the claimed cases -------------------------------------------------------

@dataclass(frozen=True)
class NodeCase:
    name: str
    folder: Path
    op_types: tuple[str, ...]


def _default_opset(model: onnx.ModelProto) -> int | None:
    versions = [entry.version for entry in model.opset_import if entry.domain in DEFAULT_DOMAINS]
    return max(versions) if versions else None


def _claimed(model: onnx.ModelProto) -> bool:
    if not all(node.domain in DEFAULT_DOMAINS and node.op_type in onnx_frontend.SUPPORTED_OPS
               for node in model.graph.node):
        return False
    opset = _default_opset(model)
    if opset is None or not MIN_OPSET <= opset <= MAX_OPSET:
        return False
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        return False
    return True


def _find_claimed_cases() -> tuple[list[NodeCase], str]:
    """The claimed cases, and why there are none when there are none."""
    root = node_cases_dir()
    if root is None:
        return [], f"ONNX node cases unavailable for onnx {onnx.__version__}: {last_failure()}"
    cases = []
    for folder in sorted(path for path in root.iterdir() if (path / "model.onnx").is_file()):
        model = onnx.load(folder / "model.onnx")
        if _claimed(model):
            op_types = tuple(sorted({node.op_type for node in model.graph.node}))
            cases.append(NodeCase(folder.name, folder, op_types))
    return cases, f"no case under {root} uses only ops in SUPPORTED_OPS"


CLAIMED_CASES, NO_CASES_REASON = _find_claimed_cases()
CASES_BY_NAME = {case.name: case for case in CLAIMED_CASES}
# every case the installed onnx ships, claimed or not: a claim whose op left SUPPORTED_OPS
# is no longer among CLAIMED_CASES, and must still count as lost
_ROOT = node_cases_dir()
ALL_CASE_NAMES = frozenset(path.name for path in _ROOT.iterdir()) if _ROOT is not None else frozenset()


def _skip_or_fail_without_cases():
    # CI sets this: there, an empty case list is a broken set-up, not an excuse to skip.
    if os.environ.get("BYOC_REQUIRE_NODE_CASES") == "1":
        pytest.fail(NO_CASES_REASON)
    pytest.skip(NO_CASES_REASON)


# ---- running one case -----------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    status: str  # "pass" | "not claimed" | "fail"
    detail: str = ""


def _read_tensor(path: Path) -> np.ndarray:
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(tensor)


def _non_tensor_values(model: onnx.ModelProto) -> list[str]:
    """Graph inputs/outputs that are sequences, optionals or maps: byoc has tensors only."""
    return [f"{info.name} ({info.type.WhichOneof('value')})"
            for info in list(model.graph.input) + list(model.graph.output)
            if info.type.WhichOneof("value") != "tensor_type"]


def _compare(name: str, actual, expected: np.ndarray, rtol=None, atol=None) -> str | None:
    """None when `actual` matches `expected`, else what differs."""
    actual = np.asarray(actual)
    if actual.dtype != expected.dtype:
        return f"{name}: dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"{name}: shape {actual.shape}, expected {expected.shape}"
    dtype = expected.dtype.name
    if dtype not in TOLERANCES:
        if np.array_equal(actual, expected):
            return None
        mismatched = int(np.count_nonzero(actual != expected))
        return f"{name}: {mismatched} of {expected.size} {dtype} elements differ"
    default_rtol, default_atol = TOLERANCES[dtype]
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    # compare in float64 so that bfloat16/float16 arithmetic cannot hide a difference
    try:
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
    except AssertionError as error:
        return " ".join(str(error).split())[:400]
    return None


def _freeze_static_arguments(model: onnx.ModelProto, inputs: list[np.ndarray]):
    """Make the graph inputs that look like static arguments -- integer tensors (axes,
    pads, shapes, repeats, ScatterND's index tuples), bool vectors and scalars of any type
    (k, training_mode, Range's start, Pad's constant_value) -- initializers holding this data set's values, as a user
    of a static-shape compiler would; return the model and the inputs left to pass."""
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    del frozen.graph.input[:]
    remaining = []
    for info, value in zip(model.graph.input, inputs):
        if value.ndim == 0 or value.dtype.kind in "iu" or value.dtype.kind == "b" and value.ndim == 1:
            frozen.graph.initializer.append(numpy_helper.from_array(value, info.name))
        else:
            frozen.graph.input.append(info)
            remaining.append(value)
    return frozen, remaining


def _import(model, inputs, data_set_name) -> tuple[Outcome | None, object, list]:
    """from_onnx, retried with static arguments frozen when the frontend asks for values
    known at import time. Returns (an outcome when the case ends here, module, inputs)."""
    try:
        return None, byoc.from_onnx(model), inputs
    except byoc.UnsupportedOpError as error:
        if "known at import time" not in str(error):
            return Outcome("not claimed", str(error)), None, inputs
        first_error = str(error)
    except Exception:
        return Outcome("fail", "from_onnx raised " + _short_traceback()), None, inputs
    frozen, remaining = _freeze_static_arguments(model, inputs)
    try:
        return None, byoc.from_onnx(frozen), remaining
    except byoc.UnsupportedOpError as error:
        return Outcome("not claimed", f"{first_error}; with static arguments frozen: {error}"), None, inputs
    except Exception:
        return Outcome("fail", f"from_onnx raised ({data_set_name}, static arguments frozen) "
                       + _short_traceback()), None, inputs


def _run_case(case: NodeCase) -> Outcome:
    model = onnx.load(case.folder / "model.onnx")
    non_tensors = _non_tensor_values(model)
    if non_tensors:
        return Outcome("not claimed", f"non-tensor graph values: {', '.join(non_tensors)}")
    initializers = {tensor.name for tensor in model.graph.initializer}
    if initializers & {info.name for info in model.graph.input}:
        return Outcome("fail", "the case lists initializers as graph inputs; this harness "
                               "does not map its input files to such inputs")
    data_sets = sorted(case.folder.glob("test_data_set_*"))
    if not data_sets:
        return Outcome("fail", "the case has no test_data_set_*")
    rtol_atol = LOOSER_TOLERANCES.get(case.name, (None, None, ""))[:2]
    for data_set in data_sets:
        inputs = [_read_tensor(data_set / f"input_{i}.pb") for i in range(len(model.graph.input))]
        expected = [_read_tensor(path) for path in sorted(data_set.glob("output_*.pb"),
                                                          key=lambda p: int(p.stem.split("_")[1]))]
        # imported per data set: static arguments frozen from one set do not fit another
        ended, mod, inputs = _import(model, inputs, data_set.name)
        if ended:
            return ended
        try:
            results = byoc.interpret(mod, *inputs)
        except Exception:
            return Outcome("fail", f"interpret raised ({data_set.name}) " + _short_traceback())
        results = list(results) if isinstance(results, tuple) else [results]
        if len(results) != len(expected):
            return Outcome("fail", f"{len(results)} outputs, expected {len(expected)}")
        for info, actual, want in zip(model.graph.output, results, expected, strict=True):
            difference = _compare(info.name, actual, want, *rtol_atol)
            if difference:
                return Outcome("fail", f"{data_set.name}: {difference}")
    return Outcome("pass")


def _short_traceback() -> str:
    """The exception, then its innermost frames: enough to find the bug, short enough to list."""
    error_type, error, trace = sys.exc_info()
    frames = "".join(traceback.format_tb(trace)[-3:]).rstrip()
    return f"{error_type.__name__}: {error}\n{frames}"


_outcomes: dict[str, Outcome] = {}


def outcome_of(case: NodeCase) -> Outcome:
    """Each case runs once per session, whether the summary or its own test asks first."""
    if case.name not in _outcomes:
        _outcomes[case.name] = _run_case(case)
    return _outcomes[case.name]


# ---- tests ----------------------------------------------------------------------------

@pytest.mark.parametrize("case_name", sorted(CASES_BY_NAME) or ["<no node cases>"])
def test_node_case(case_name):
    if not CLAIMED_CASES:
        _skip_or_fail_without_cases()
    outcome = outcome_of(CASES_BY_NAME[case_name])
    if outcome.status == "not claimed" and case_name in CLAIMS:
        pytest.fail(f"a case byoc claims (tests/onnx_conformance_claims.txt) is refused: {outcome.detail}",
                    pytrace=False)
    if outcome.status == "not claimed":
        pytest.skip(f"not claimed: {outcome.detail}")
    if outcome.status == "fail":
        pytest.fail(outcome.detail, pytrace=False)


def test_conformance_summary():
    if not CLAIMED_CASES:
        _skip_or_fail_without_cases()
    by_status: dict[str, list[str]] = defaultdict(list)
    per_op_type: dict[str, Counter] = defaultdict(Counter)
    for case in CLAIMED_CASES:
        status = outcome_of(case).status
        by_status[status].append(case.name)
        for op_type in case.op_types:
            per_op_type[op_type][status] += 1

    passing = len(by_status["pass"])
    print(f"\nONNX node conformance (onnx {onnx.__version__}, opsets {MIN_OPSET}..{MAX_OPSET}): "
          f"{len(CLAIMED_CASES)} claimed by op type, {passing} pass, "
          f"{len(by_status['not claimed'])} not claimed (UnsupportedOpError), "
          f"{len(by_status['fail'])} fail")
    width = max(map(len, per_op_type))
    print(f"  {'op type':<{width}}  pass  not-claimed  fail")
    for op_type, counts in sorted(per_op_type.items()):
        print(f"  {op_type:<{width}}  {counts['pass']:>4}  {counts['not claimed']:>11}  {counts['fail']:>4}")
    if by_status["fail"]:
        print("  failing: " + ", ".join(by_status["fail"]))
    if os.environ.get("BYOC_WRITE_CONFORMANCE_CLAIMS") == "1":
        CLAIMS_FILE.write_text(f"# ONNX node cases byoc passes (onnx {onnx.__version__}); written by "
                               f"BYOC_WRITE_CONFORMANCE_CLAIMS=1 pytest tests/test_onnx_conformance.py\n"
                               + "".join(f"{name}\n" for name in sorted(by_status["pass"])))
    lost = sorted(CLAIMS & ALL_CASE_NAMES - set(by_status["pass"]))
    assert not lost, f"{len(lost)} claimed case(s) no longer pass: {', '.join(lost[:50])}"
    assert passing >= PASSING_FLOOR, (
        f"only {passing} ONNX node cases pass; the floor is {PASSING_FLOOR}. "
        f"Failing: {', '.join(by_status['fail'][:50])}")

