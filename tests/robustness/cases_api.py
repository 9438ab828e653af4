"""Family 2: misuse of the Python API of a built library (byoc.load, Module.run, ...).

Each scenario is a function of a `Context` (the library under test, its reference
answers, the device's array module). What it does must end in a byoc error or a correct
answer; after a refused call the Module must still answer correctly (the C ABI promises
"the model stays usable"), which `run_api` checks. Accepting a call with a dtype or a
layout that the library does not take is fine only when the answer is right.

Scenarios (api_arrays.py, api_lifecycle.py) register in api_context.SCENARIOS with the
library kinds (mlp, multi, sidecar) and devices (cpu, cuda) they apply to; `generate()`
makes one case per applicable pair. Positive controls (valid use: run, out=, two modules,
reload after close) are registered with expect="accept": refusing them fails the suite.
"""
from __future__ import annotations

from . import api_arrays, api_lifecycle
from .api_context import SCENARIOS, Context, Wrong
from .runner import Case, Outcome

SCENARIO_MODULES = (api_arrays, api_lifecycle)  # importing them registers their scenarios

FUNCTION = "robustness.cases_api:run_api"
TIMEOUT = 20.0


def run_api(library: dict, scenario: str):
    from byoc.errors import ByocError
    context = Context(library)
    function = SCENARIOS[scenario][0]
    try:
        returned = function(context)
    except Wrong as wrong:
        return Outcome("wrong", str(wrong))
    except ByocError:
        problem = context.still_usable()
        if problem:
            return Outcome("wrong", f"refused, but then {problem}")
        raise
    problem = context.still_usable()
    if problem:
        return Outcome("wrong", f"accepted, but then {problem}")
    return returned


# ---------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------

def generate(libraries_by_kind: dict, device: str = "cpu") -> list[Case]:
    cases = []
    for name, (_, kinds, devices, group, expect) in SCENARIOS.items():
        if device not in devices:
            continue
        for kind in kinds:
            library = libraries_by_kind.get(kind)
            if library is None:
                continue
            cases.append(Case("api", group, f"{kind}: {name}", FUNCTION, {"library": library, "scenario": name},
                              timeout=TIMEOUT, memory_limit=None if device == "cuda" else 4 << 30, expect=expect))
    return cases
